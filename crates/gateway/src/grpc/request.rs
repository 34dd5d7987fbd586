//! An OpenAI (or SGLang `/generate`) body as a `GenerateRequest`: the prompt's
//! token ids (rendered by the router, as for the index) and the sampling
//! parameters, every field set (proto3's zeros are not SGLang's defaults),
//! and what the answer needs to know of the request ([`Asked`]). Bounded: a
//! body asking for more sequences or stop strings than a router relays is
//! refused with the field named.

use engine_grpc::proto::{Constraint, GenerateRequest, SamplingParams, TokenizedInput};
use serde_json::Value;

use crate::GatewayError;
use crate::pipeline::request::Route;

/// The most sequences one request may ask for (`n`).
pub(crate) const MAX_N: u64 = 16;
/// The most stop strings, and the longest one, in bytes.
pub(crate) const MAX_STOPS: usize = 16;
pub(crate) const MAX_STOP_BYTES: usize = 256;
/// The most top logprobs per position.
pub(crate) const MAX_TOP_LOGPROBS: u64 = 20;

/// What the answer needs to know of the request.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) route: Route,
    /// The model the answer names.
    pub(crate) model: String,
    pub(crate) stream: bool,
    /// Sequences asked for.
    pub(crate) n: u32,
    /// Stop strings, cut from the answer unless `no_stop_trim`.
    pub(crate) stops: Vec<String>,
    pub(crate) no_stop_trim: bool,
    pub(crate) skip_special_tokens: bool,
    /// Streamed: a last chunk with the usage (`stream_options.include_usage`; `/generate`: always).
    pub(crate) include_usage: bool,
    /// Logprobs asked for, and how many top ones per position.
    pub(crate) logprobs: bool,
    pub(crate) top_logprobs: u32,
    /// A chat's reasoning told apart from its answer (`--reasoning-parser`).
    pub(crate) reasoning: Option<super::reasoning::Format>,
    /// A chat's offered tools, its answer read for calls (`--tool-call-parser`).
    pub(crate) tools: Option<super::tools::Offered>,
}

/// The request for the engine, and what the answer needs to know.
/// The first kind of media a request carries (a chat's image, audio or video parts, or
/// `/generate`'s `image_data`, `audio_data`, `video_data`), which a gRPC worker is not sent.
fn media(route: Route, v: &Value) -> Option<&'static str> {
    if route == Route::Generate {
        let given = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
        return [("image_data", "image"), ("audio_data", "audio"), ("video_data", "video")]
            .into_iter()
            .find_map(|(k, kind)| given(k).then_some(kind));
    }
    let messages = v.get("messages")?.as_array()?;
    messages.iter().filter_map(|m| m.get("content")?.as_array()).flatten().find_map(|part| {
        match part.get("type").and_then(Value::as_str)? {
            "image_url" | "input_image" | "image" => Some("image"),
            "input_audio" | "audio_url" => Some("audio"),
            "video_url" => Some("video"),
            _ => None,
        }
    })
}

pub(crate) fn generate(
    route: Route,
    v: &Value,
    tokens: Vec<u32>,
    (request_id, served_model): (&str, &str),
    rank: Option<u32>,
) -> Result<(GenerateRequest, Asked), GatewayError> {
    if !matches!(route, Route::Chat | Route::Completions | Route::Generate) {
        return Err(GatewayError::Unprocessable(format!("{} is not served by gRPC workers", route.path())));
    }
    if let Some(kind) = media(route, v) {
        return Err(GatewayError::Unprocessable(format!(
            "{kind} input is not sent to gRPC workers (token ids only): serve this model over HTTP"
        )));
    }
    // `/generate` keeps its parameters in `sampling_params`; the OpenAI routes at the top.
    let p = if route == Route::Generate { v.get("sampling_params").unwrap_or(&Value::Null) } else { v };
    let bad = |field: &str, why: &str| GatewayError::BadRequest(format!("`{field}` {why}"));
    let float = |k: &str, default: f32| -> Result<f32, GatewayError> {
        match p.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_f64().map(|f| f as f32).filter(|f| f.is_finite()).ok_or_else(|| bad(k, "must be a number")),
        }
    };
    let uint = |k: &str| -> Result<Option<u64>, GatewayError> {
        match p.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_u64().map(Some).ok_or_else(|| bad(k, "must be a non-negative integer")),
        }
    };
    let flag = |k: &str, default: bool| p.get(k).and_then(Value::as_bool).unwrap_or(default);
    let max_new_tokens = match route {
        Route::Chat => uint("max_completion_tokens")?.or(uint("max_tokens")?),
        Route::Completions => uint("max_tokens")?,
        _ => uint("max_new_tokens")?,
    };
    let max_new_tokens = max_new_tokens.map(|m| u32::try_from(m).map_err(|_| bad("max_tokens", "is too large")));
    let n = uint("n")?.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(bad("n", &format!("must be 1 to {MAX_N} on gRPC workers")));
    }
    let stops = stops(p.get("stop"))?;
    let stop_token_ids = match p.get("stop_token_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) if ids.len() <= 64 => ids
            .iter()
            .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("stop_token_ids", "must be token ids"))?,
        Some(_) => return Err(bad("stop_token_ids", "must be an array of at most 64 token ids")),
    };
    let top_k = match p.get("top_k") {
        None | Some(Value::Null) => -1,
        Some(x) => x.as_i64().and_then(|k| i32::try_from(k).ok()).ok_or_else(|| bad("top_k", "must be an integer"))?,
    };
    let (logprobs, top_logprobs) = logprobs(route, v)?;
    let no_stop_trim = flag("no_stop_trim", false);
    let skip_special_tokens = flag("skip_special_tokens", true);
    let params = SamplingParams {
        temperature: float("temperature", 1.0)?,
        top_p: float("top_p", 1.0)?,
        top_k,
        min_p: float("min_p", 0.0)?,
        frequency_penalty: float("frequency_penalty", 0.0)?,
        presence_penalty: float("presence_penalty", 0.0)?,
        repetition_penalty: float("repetition_penalty", 1.0)?,
        max_new_tokens: max_new_tokens.transpose()?,
        stop: stops.clone(),
        stop_token_ids,
        skip_special_tokens,
        spaces_between_special_tokens: flag("spaces_between_special_tokens", true),
        constraint: constraint(route, v, p),
        n: n as u32,
        min_new_tokens: uint(if route == Route::Generate { "min_new_tokens" } else { "min_tokens" })?
            .map_or(0, |m| u32::try_from(m).unwrap_or(u32::MAX)),
        ignore_eos: flag("ignore_eos", false),
        no_stop_trim,
        ..SamplingParams::engine_defaults()
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage =
        route == Route::Generate || v.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    let model = v.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).unwrap_or(served_model);
    let request = GenerateRequest {
        request_id: request_id.to_owned(),
        tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: tokens }),
        sampling_params: Some(params),
        return_logprob: logprobs,
        logprob_start_len: -1,
        top_logprobs_num: top_logprobs as i32,
        data_parallel_rank: rank.and_then(|r| i32::try_from(r).ok()),
        stream,
        ..Default::default()
    };
    let asked = Asked {
        route,
        model: model.to_owned(),
        stream,
        n: n as u32,
        stops,
        no_stop_trim,
        skip_special_tokens,
        include_usage,
        logprobs,
        top_logprobs,
        reasoning: None,
        tools: None,
    };
    Ok((request, asked))
}

/// `stop`: a string or an array of strings, bounded.
fn stops(stop: Option<&Value>) -> Result<Vec<String>, GatewayError> {
    let bad = || {
        GatewayError::BadRequest(format!(
            "`stop` must be a string or an array of at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_BYTES} bytes"
        ))
    };
    let all: Vec<String> = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.len() <= MAX_STOPS => {
            items.iter().map(|s| s.as_str().map(str::to_owned)).collect::<Option<_>>().ok_or_else(bad)?
        }
        Some(_) => return Err(bad()),
    };
    if all.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
        return Err(bad());
    }
    Ok(all)
}

/// Whether logprobs are asked for, and how many top ones (chat: `logprobs` and `top_logprobs`;
/// completions: `logprobs: N`; `/generate`: `return_logprob`, `top_logprobs_num`).
fn logprobs(route: Route, v: &Value) -> Result<(bool, u32), GatewayError> {
    let (on, top) = match route {
        Route::Chat => (v.get("logprobs").and_then(Value::as_bool).unwrap_or(false), v.get("top_logprobs")),
        Route::Completions => (v.get("logprobs").is_some_and(|l| !l.is_null()), v.get("logprobs")),
        _ => (v.get("return_logprob").and_then(Value::as_bool).unwrap_or(false), v.get("top_logprobs_num")),
    };
    let top = match top {
        None | Some(Value::Null) => 0,
        Some(t) => t.as_u64().filter(|t| *t <= MAX_TOP_LOGPROBS).ok_or_else(|| {
            GatewayError::BadRequest(format!("top logprobs must be an integer of at most {MAX_TOP_LOGPROBS}"))
        })?,
    };
    Ok((on, top as u32))
}

/// Structured generation: a JSON schema (`response_format`), SGLang's `regex` and `ebnf`.
fn constraint(route: Route, v: &Value, p: &Value) -> Option<Constraint> {
    if let Some(schema) = v.pointer("/response_format/json_schema/schema").filter(|_| route != Route::Generate) {
        return Some(Constraint::JsonSchema(schema.to_string()));
    }
    if v.pointer("/response_format/type").and_then(Value::as_str) == Some("json_object") {
        return Some(Constraint::JsonSchema(r#"{"type": "object"}"#.into()));
    }
    let text = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_owned);
    match (text("regex"), text("ebnf"), p.get("json_schema")) {
        (Some(r), _, _) => Some(Constraint::Regex(r)),
        (_, Some(e), _) => Some(Constraint::EbnfGrammar(e)),
        (_, _, Some(Value::String(s))) => Some(Constraint::JsonSchema(s.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn media_is_refused_not_dropped() {
        let chat =
            |part: Value| json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]});
        let image = chat(json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}));
        assert_eq!(media(Route::Chat, &image), Some("image"));
        assert_eq!(media(Route::Chat, &chat(json!({"type": "input_audio", "input_audio": {}}))), Some("audio"));
        assert_eq!(media(Route::Chat, &chat(json!({"type": "text", "text": "no media"}))), None);
        assert_eq!(media(Route::Chat, &json!({"messages": [{"role": "user", "content": "plain"}]})), None);
        assert_eq!(media(Route::Generate, &json!({"input_ids": [1], "image_data": "x"})), Some("image"));
        assert_eq!(media(Route::Generate, &json!({"input_ids": [1], "image_data": null})), None);
        let refused = generate(Route::Chat, &image, vec![1, 2], ("r", "m"), None).unwrap_err();
        assert!(matches!(&refused, GatewayError::Unprocessable(m) if m.contains("image input")), "{refused}");
        assert!(
            generate(Route::Chat, &chat(json!({"type": "text", "text": "x"})), vec![1, 2], ("r", "m"), None).is_ok()
        );
    }
}
