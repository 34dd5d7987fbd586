//! Routing regret and the engines' reported cache hits in `/metrics` and the decision trace:
//! a cache-blind policy that sends a prompt away from the worker holding its prefix loses
//! the prefix to the policy; cache_aware loses nothing; the router's prediction of the
//! cached tokens matches what the simulated engines report.

use crate::common;
use common::app::{Running, admin_post, chat, config, engine_config, metric, post, start};
use common::eventually as until;

use mock_engine::MockEngine;
use serde_json::Value;
use sgl_router::app::PolicyConfig;

async fn debug(r: &Running, body: &Value) -> Value {
    admin_post(&format!("{}/debug/route", r.url), body).await.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_away_from_the_prefix_counts_its_regret_and_the_prediction_meets_the_report() {
    let (a, b) = (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let system = "Regret is what a better placement would have found cached. ".repeat(30);
    // Worker a holds the prefix (warmed directly).
    assert_eq!(post(&format!("{}/v1/chat/completions", a.url()), &chat(&system, "warm")).await.status(), 200);
    for (policy, lost) in [(PolicyConfig::RoundRobin, true), (PolicyConfig::cache_aware(), false)] {
        let name = format!("{policy:?}");
        let r = start(config(&[&a, &b], policy, true)).await;
        until("the index learned a's prefix", async || {
            debug(&r, &chat(&system, "q")).await["regret"]["reachable_blocks"].as_u64() > Some(20)
        })
        .await;
        // Two requests: round robin sends one of them to b, which holds nothing.
        for i in 0..2 {
            let answer = post(&format!("{}/v1/chat/completions", r.url), &chat(&system, &format!("q{i}"))).await;
            assert_eq!(answer.status(), 200);
            let _ = answer.bytes().await.unwrap();
        }
        let reachable = metric(&r.url, "router_routing_prefix_tokens_total{held=\"reachable\"}").await;
        let chosen = metric(&r.url, "router_routing_prefix_tokens_total{held=\"chosen\"}").await;
        assert!(reachable >= 2.0 * 320.0, "{name}: both decisions could reach a's prefix ({reachable})");
        if lost {
            let policy_loss = metric(&r.url, "router_routing_regret_tokens_total{cause=\"policy\"}").await;
            assert!(policy_loss >= 320.0, "{name}: the request sent to b lost a's prefix ({policy_loss})");
            assert_eq!(reachable - chosen, policy_loss, "{name}: all of it lost to the policy");
        } else {
            let text = common::app::admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
            assert!(!text.contains("router_routing_regret_tokens_total{"), "{name}: nothing lost:\n{text}");
            assert_eq!(reachable, chosen, "{name}");
        }
        // Both answers reported their cached tokens; the index predicted them to the token.
        assert_eq!(metric(&r.url, "router_cached_tokens_answers_total{reported=\"true\"}").await, 2.0, "{name}");
        let predicted = metric(&r.url, "router_cached_tokens_total{source=\"predicted\"}").await;
        let observed = metric(&r.url, "router_cached_tokens_total{source=\"observed\"}").await;
        assert!(observed >= 320.0, "{name}: a's cache was used ({observed})");
        assert_eq!(predicted, observed, "{name}: the prediction meets the engines' report");
        let _ = r.stop.send(());
    }
}
