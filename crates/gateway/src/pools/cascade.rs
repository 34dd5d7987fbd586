//! The `cascade` plugin: a whole (not streamed) chat or completion goes to
//! the pool the decision chose with logprobs asked for; its answer is kept
//! when the mean token logprob reaches the plugin's threshold, else the same
//! request goes to the plugin's `to` pool, whose answer the client gets. Owns
//! what is asked of the first pool, the judging, and what is given back
//! (logprobs the client did not ask for are taken out again). The reading of
//! the first answer, on the request path, is `judge`'s.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderValue;
use serde_json::Value;

use super::Pool;
use crate::pipeline::request::Route;

/// The response header saying what the cascade did.
pub(crate) const CASCADE_HEADER: &str = "x-route-cascade";

/// A decision's `cascade` plugin, compiled: its `to` pool resolved.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The pool it escalates to.
    pub(crate) to: Arc<Pool>,
    threshold: f64,
    max_bytes: usize,
}

impl Spec {
    /// `d`'s cascade, if it has one (the config was validated: its `to` pool is one of `pools`).
    pub(crate) fn of(d: &model_select::DecisionConfig, pools: &[Arc<Pool>]) -> Option<Spec> {
        d.plugins.iter().find_map(|p| match p {
            model_select::PluginConfig::Cascade(c) => Some(Spec {
                to: pools.iter().find(|p| p.id.0 == c.to)?.clone(),
                threshold: c.min_mean_logprob,
                max_bytes: c.max_answer_bytes,
            }),
            _ => None,
        })
    }

    /// The plan of one request under `decision`, its first answer issued `route_id`.
    pub(crate) fn plan(&self, decision: &str, added_logprobs: bool, route_id: Option<u64>) -> Plan {
        let Spec { to, threshold, max_bytes } = self.clone();
        Plan { to, threshold, max_bytes, added_logprobs, decision: decision.to_owned(), route_id }
    }
}

/// A request the cascade judges: where it escalates to and by what threshold.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The pool that answers when the first is unsure.
    pub(crate) to: Arc<Pool>,
    /// Under this mean token logprob the first answer is not kept.
    pub(crate) threshold: f64,
    /// A larger first answer (by its `content-length`) is passed on unjudged.
    pub(crate) max_bytes: usize,
    /// The router asked for the logprobs: they are taken out of what the client gets.
    pub(crate) added_logprobs: bool,
    /// The decision (for the counts and the escalated request's route).
    pub(crate) decision: String,
    /// The first answer's route id: forgotten when the answer is (escalated), as the client
    /// never sees it.
    pub(crate) route_id: Option<u64>,
}

/// What the cascade did with an answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    /// Sure enough: the first pool's answer is the client's.
    Kept(f64),
    /// No logprobs in the answer (the engine gave none): kept.
    NoLogprobs,
    /// Unsure: the `to` pool answers.
    Escalated(f64),
}

/// Asks the first pool for logprobs (a chat's `logprobs: true`, a completion's
/// `logprobs: 1`) unless the client did; true when the router added them.
pub(crate) fn ask_logprobs(route: Route, v: &mut Value) -> bool {
    let Some(fields) = v.as_object_mut() else { return false };
    match route {
        Route::Chat if fields.get("logprobs").and_then(Value::as_bool) != Some(true) => {
            fields.insert("logprobs".into(), Value::Bool(true));
            true
        }
        Route::Completions if !fields.get("logprobs").is_some_and(Value::is_u64) => {
            fields.insert("logprobs".into(), Value::from(1));
            true
        }
        _ => false,
    }
}

/// The mean token logprob of a whole answer, over every choice (`None`: it holds none).
pub(crate) fn mean_logprob(route: Route, answer: &Value) -> Option<f64> {
    let choices = answer.get("choices")?.as_array()?;
    let mut values = Vec::new();
    for c in choices {
        let lp = c.get("logprobs");
        match route {
            Route::Chat => {
                let content = lp.and_then(|l| l.get("content")).and_then(Value::as_array);
                values.extend(content.into_iter().flatten().filter_map(|t| t.get("logprob")?.as_f64()));
            }
            Route::Completions => {
                let tokens = lp.and_then(|l| l.get("token_logprobs")).and_then(Value::as_array);
                values.extend(tokens.into_iter().flatten().filter_map(Value::as_f64));
            }
            _ => return None,
        }
    }
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Judges a whole answer's body against `plan`.
pub(crate) fn judge(plan: &Plan, route: Route, answer: &Value) -> Verdict {
    match mean_logprob(route, answer) {
        None => Verdict::NoLogprobs,
        Some(m) if m < plan.threshold => Verdict::Escalated(m),
        Some(m) => Verdict::Kept(m),
    }
}

/// The body the client gets for a kept answer: as it came, or without the logprobs the router added.
pub(crate) fn kept_body(plan: &Plan, mut answer: Value, raw: Bytes) -> Bytes {
    if !plan.added_logprobs {
        return raw;
    }
    if let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) {
        for c in choices {
            if let Some(c) = c.as_object_mut() {
                c.insert("logprobs".into(), Value::Null);
            }
        }
    }
    serde_json::to_vec(&answer).map(Bytes::from).unwrap_or(raw)
}

/// The request for the `to` pool: the one the first pool got, without the logprobs the router added.
pub(crate) fn escalated_body(plan: &Plan, sent: &Bytes) -> Bytes {
    if !plan.added_logprobs {
        return sent.clone();
    }
    match serde_json::from_slice::<Value>(sent) {
        Ok(mut v) => {
            if let Some(fields) = v.as_object_mut() {
                fields.remove("logprobs");
            }
            serde_json::to_vec(&v).map(Bytes::from).unwrap_or_else(|_| sent.clone())
        }
        Err(_) => sent.clone(),
    }
}

impl Verdict {
    /// The outcome's label in `router_cascade_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Verdict::Kept(_) => "kept",
            Verdict::NoLogprobs => "no_logprobs",
            Verdict::Escalated(_) => "escalated",
        }
    }

    /// The `x-route-cascade` value.
    pub(crate) fn header(self) -> HeaderValue {
        let text = match self {
            Verdict::Kept(m) => format!("kept;mean_logprob={m:.3}"),
            Verdict::NoLogprobs => "kept;no_logprobs".to_owned(),
            Verdict::Escalated(m) => format!("escalated;mean_logprob={m:.3}"),
        };
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("kept"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn plan(added: bool) -> Plan {
        let (policy, renderer) =
            (Arc::new(policy::RoundRobin::default()), Arc::new(renderer::Renderer::builtin().unwrap()));
        let to = Arc::new(Pool::new(router_types::PoolId("large".into()), "m".into(), policy, renderer, None, 64));
        Plan { to, threshold: -1.0, max_bytes: 1 << 20, added_logprobs: added, decision: "d".into(), route_id: None }
    }

    #[test]
    fn logprobs_are_asked_for_unless_the_client_did() {
        let mut chat = json!({"messages": []});
        assert!(ask_logprobs(Route::Chat, &mut chat) && chat["logprobs"] == true);
        let mut asked = json!({"messages": [], "logprobs": true});
        assert!(!ask_logprobs(Route::Chat, &mut asked));
        let mut completion = json!({"prompt": "x"});
        assert!(ask_logprobs(Route::Completions, &mut completion) && completion["logprobs"] == 1);
        assert!(!ask_logprobs(Route::Generate, &mut json!({"text": "x"})));
    }

    #[test]
    fn the_mean_over_every_token_decides() {
        let chat = |lps: &[f64]| {
            let content: Vec<Value> = lps.iter().map(|l| json!({"token": "a", "logprob": l})).collect();
            json!({"choices": [{"message": {"content": "a"}, "logprobs": {"content": content}}]})
        };
        assert_eq!(mean_logprob(Route::Chat, &chat(&[-0.5, -1.5])), Some(-1.0));
        assert_eq!(judge(&plan(true), Route::Chat, &chat(&[-0.5, -1.0])), Verdict::Kept(-0.75));
        assert_eq!(judge(&plan(true), Route::Chat, &chat(&[-2.0, -1.0])), Verdict::Escalated(-1.5));
        assert_eq!(judge(&plan(true), Route::Chat, &json!({"choices": [{"message": {}}]})), Verdict::NoLogprobs);
        let completion = json!({"choices": [{"text": "ab", "logprobs": {"token_logprobs": [-0.2, null, -0.4]}}]});
        assert!((mean_logprob(Route::Completions, &completion).unwrap() + 0.3).abs() < 1e-12);
    }

    #[test]
    fn added_logprobs_are_taken_out_of_both_directions() {
        let answer = json!({"choices": [{"message": {"content": "a"}, "logprobs": {"content": []}}]});
        let raw = Bytes::from(answer.to_string());
        let out: Value = serde_json::from_slice(&kept_body(&plan(true), answer.clone(), raw.clone())).unwrap();
        assert_eq!(out["choices"][0]["logprobs"], Value::Null);
        assert_eq!(kept_body(&plan(false), answer, raw.clone()), raw, "the client asked: as it came");
        let sent = Bytes::from(json!({"model": "m", "logprobs": true}).to_string());
        let again: Value = serde_json::from_slice(&escalated_body(&plan(true), &sent)).unwrap();
        assert!(again.get("logprobs").is_none());
        assert_eq!(escalated_body(&plan(false), &sent), sent);
    }
}
