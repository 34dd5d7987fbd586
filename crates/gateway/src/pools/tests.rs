//! The select phase's glue over a gateway without sockets: which pool a request gets, by the
//! pool's id whatever the order the gateway holds its pools in.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Asked, Routing, forced, route};
use crate::GatewayError;
use crate::pipeline::request::Route;
use crate::testing::{routed, routed_with_windows};

/// Two pools; an `integral` goes to `large` with a header change, anything else to `small`.
const CONFIG: &str = r#"
version: 1
auto_model_names: [auto]
pools:
  - {name: small, served_model: small-model, policy: round_robin}
  - {name: large, served_model: large-model, policy: round_robin}
signals:
  keywords:
    - {name: math, keywords: [integral]}
decisions:
  - {name: hard, priority: 50, rules: {type: keyword, name: math}, pools: [large],
     plugins: [{type: header_mutation, set: {x-tier: gold}}]}
  - {name: default, pools: [small]}
"#;

/// The gateway holds its pools in the other order than the config: only ids can match them.
const POOLS: [(&str, &str); 2] = [("large", "large-model"), ("small", "small-model")];
const WORKERS: [(&str, &str); 2] = [("http://127.0.0.1:1", "large"), ("http://127.0.0.1:2", "small")];

fn chat(model: Option<&str>, text: &str) -> Value {
    let mut v = json!({"messages": [{"role": "user", "content": text}]});
    if let Some(m) = model {
        v["model"] = json!(m);
    }
    v
}

/// Routes `v` under the gateway's routing config, as a request with no headers would be.
fn select(gw: &crate::Gateway, routing: &Routing, v: &mut Value) -> Result<super::Routed, GatewayError> {
    let renders = planner::Renders::default();
    let workers = gw.fleet.snapshot();
    let ask = Asked {
        debug: false,
        headers: &[],
        session: None,
        embeddings: None,
        cache_bypass: false,
        probe: false,
        caller: None,
        renders: &renders,
        planner: gw.planner(&workers),
    };
    route(gw, routing, Route::Chat, v, &ask, None)
}

#[tokio::test]
async fn auto_and_named_requests_get_their_pool_by_id_whatever_the_gateways_order() {
    let gw = routed(CONFIG, &POOLS, &WORKERS).await;
    let routing = gw.routing().unwrap();
    let mut hard = chat(Some("auto"), "an integral, please");
    let r = select(&gw, &routing, &mut hard).unwrap();
    assert_eq!((r.pool.id.0.as_str(), r.decision.as_str()), ("large", "hard"));
    assert!(r.rewritten && hard["model"] == "large-model", "the body names the pool's model: {hard}");
    assert!(r.edits.as_ref().is_some_and(|e| e.set.iter().any(|(n, v)| n == "x-tier" && v == "gold")));
    let mut easy = chat(Some("auto"), "hello");
    let r = select(&gw, &routing, &mut easy).unwrap();
    assert_eq!((r.pool.id.0.as_str(), r.decision.as_str()), ("small", "default"));
    assert!(r.edits.is_none(), "the default decision changes no header");
    // A request naming a pool's model goes there, unchanged.
    let mut named = chat(Some("large-model"), "hello");
    let r = select(&gw, &routing, &mut named).unwrap();
    assert_eq!((r.pool.id.0.as_str(), r.decision.as_str(), r.rewritten), ("large", super::EXPLICIT, false));
}

#[tokio::test]
async fn no_model_goes_to_the_default_pool_and_an_unknown_one_is_refused() {
    let gw = routed(CONFIG, &POOLS, &WORKERS).await;
    let routing = gw.routing().unwrap();
    let r = select(&gw, &routing, &mut chat(None, "an integral")).unwrap();
    assert_eq!((r.pool.id.0.as_str(), r.decision.as_str()), ("small", super::NO_MODEL));
    assert_eq!(gw.default_pool().id.0, "small", "the config's first pool, not the gateway's");
    match select(&gw, &routing, &mut chat(Some("nope"), "x")) {
        Err(GatewayError::UnknownModel(m)) => assert_eq!(m, "nope"),
        other => panic!("refused as an unknown model: {other:?}"),
    }
}

#[tokio::test]
async fn a_forced_attempt_goes_to_its_pool_under_its_decisions_header_changes() {
    let gw = routed(CONFIG, &POOLS, &WORKERS).await;
    let routing = gw.routing().unwrap();
    let large = routing.pools.iter().find(|p| p.id.0 == "large").unwrap().clone();
    let mut v = chat(Some("small-model"), "hello");
    let r = forced(&gw, &routing, &mut v, (large.clone(), "hard"), None);
    assert!(Arc::ptr_eq(&r.pool, &large));
    assert_eq!(v["model"], "large-model");
    assert!(r.edits.is_some(), "the decision's header changes apply to the forced attempt");
}

#[test]
fn a_config_naming_a_pool_the_gateway_lacks_is_refused() {
    let selector = model_select::Selector::new(model_select::parse_yaml(CONFIG).unwrap()).unwrap();
    let renderer = Arc::new(renderer::Renderer::builtin().unwrap());
    let only = super::Pool::new(
        router_types::PoolId("small".into()),
        "small-model".into(),
        Arc::new(policy::RoundRobin::default()),
        renderer,
        None,
        64,
    );
    let err = Routing::new(selector, &[Arc::new(only)]).unwrap_err();
    assert!(err.contains("large"), "{err}");
}

/// `fit_context` on a pool with a 160-token window (the built-in vocabulary: a token a byte).
const FIT: &str = r#"
version: 1
auto_model_names: [auto]
pools:
  - {name: small, served_model: small-model, policy: round_robin, context_window: 160}
decisions:
  - {name: fit, pools: [small], plugins: [{type: fit_context}]}
"#;

/// A chat of a system prompt, `turns` user/assistant exchanges and a last user turn.
fn long_chat(turns: usize, last: &str) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for i in 0..turns {
        messages.push(json!({"role": "user", "content": format!("question number {i} about the weather")}));
        messages.push(json!({"role": "assistant", "content": format!("answer number {i}: sunny")}));
    }
    messages.push(json!({"role": "user", "content": last}));
    json!({"model": "auto", "max_tokens": 8, "messages": messages})
}

#[tokio::test]
async fn fit_context_drops_the_oldest_turns_until_the_chat_fits_its_pools_window() {
    let gw = routed_with_windows(FIT, &[("small", "small-model", Some(160))], &[("http://127.0.0.1:1", "small")]).await;
    let routing = gw.routing().unwrap();
    let workers = gw.fleet.snapshot();
    let tokens = |v: &Value| {
        let pool = &gw.pools[0];
        gw.planner(&workers).render(&pool.renderer, Route::Chat, v, true).unwrap().tokens.len() as u64 + 8
    };
    // It fits: nothing dropped, the body as it came.
    let mut short = long_chat(0, "hi");
    let routed = select(&gw, &routing, &mut short).unwrap();
    assert_eq!(routed.context_dropped, None);
    assert_eq!(short["messages"].as_array().unwrap().len(), 2);
    // Too long: the oldest exchanges go, the system prompt and the last turn stay.
    let mut long = long_chat(6, "and tomorrow?");
    assert!(tokens(&long) > 160);
    let routed = select(&gw, &routing, &mut long).unwrap();
    let dropped = routed.context_dropped.expect("cut");
    let kept = long["messages"].as_array().unwrap();
    assert_eq!(kept.len(), 14 - dropped);
    assert_eq!(kept[0]["role"], "system");
    assert_eq!(kept[1]["role"], "user", "the first turn kept is a user's");
    assert_eq!(kept.last().unwrap()["content"], "and tomorrow?");
    assert!(tokens(&long) <= 160, "it fits now");
    assert!(routed.rewritten, "sent re-encoded");
    // The fewest: with one exchange more it would not have fitted.
    let mut one_more = long_chat(6, "and tomorrow?");
    one_more["messages"].as_array_mut().unwrap().drain(1..1 + dropped - 2);
    assert!(tokens(&one_more) > 160, "dropping {} would not do", dropped - 2);
    let headers = super::RouteHeaders::of(&routed).0;
    assert!(headers.iter().any(|(n, v)| *n == "x-route-context-dropped" && v == &dropped.to_string()[..]));
    // Just over the window by less than its first question: dropping that question alone would
    // fit, but its answer would be left without it; the whole exchange goes.
    let over = (0..400)
        .map(|k| {
            let mut v = long_chat(1, "ok?");
            v["messages"][1]["content"] = json!("q".repeat(k));
            v["messages"][2]["content"] = json!("fine");
            v
        })
        .find(|v| tokens(v) > 160)
        .expect("some length is just over");
    let mut just_over = over.clone();
    let routed = select(&gw, &routing, &mut just_over).unwrap();
    assert_eq!(routed.context_dropped, Some(2), "{just_over}");
    assert_eq!(just_over["messages"][1]["role"], "user");
    // Not even the last turn alone fits: refused, not sent.
    let mut hopeless = long_chat(2, &"x".repeat(400));
    let Err(refused) = select(&gw, &routing, &mut hopeless) else { panic!("refused") };
    assert!(matches!(&refused, GatewayError::BadRequest(m) if m.contains("context window of 160")), "{refused:?}");
}

#[test]
fn fit_context_needs_a_pool_with_a_window() {
    let yaml = FIT.replace(", context_window: 160", "");
    let Err(problems) = model_select::parse_yaml(&yaml) else { panic!("refused") };
    let said = format!("{problems:?}");
    assert!(said.contains("decision `fit`: fit_context: none of its pools has a context_window"), "{said}");
}
