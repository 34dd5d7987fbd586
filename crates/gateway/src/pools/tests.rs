//! The select phase's glue over a gateway without sockets: which pool a request gets, by the
//! pool's id whatever the order the gateway holds its pools in.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Asked, Routing, forced, route};
use crate::GatewayError;
use crate::pipeline::request::Route;
use crate::testing::routed;

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
