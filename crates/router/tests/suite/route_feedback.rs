//! Learning from feedback end to end (`tests/routing/feedback.yaml`): every
//! routed answer carries an `x-route-id`; `POST /v1/route/feedback` takes a
//! verdict for it once (data-plane keys, a small body; preferences are
//! checked in `gateway::pools::feedback`'s unit tests); a
//! `bandit` decision moves to the pool the verdicts favour; what was learned
//! is saved at shutdown and read again at start.

use crate::common;

use common::app::{ADMIN_KEY, admin_get, config, metric, pools, start};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

const CLIENT_KEY: &str = "client-key";

fn ask() -> Value {
    json!({"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
}

/// One chat through the router: the pool that answered and the answer's route id.
async fn chat(http: &reqwest::Client, url: &str) -> (String, String) {
    let r = http.post(format!("{url}/v1/chat/completions")).bearer_auth(CLIENT_KEY).json(&ask()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let header = |n: &str| r.headers().get(n).unwrap_or_else(|| panic!("no {n}")).to_str().unwrap().to_owned();
    (header("x-route-pool"), header("x-route-id"))
}

async fn feedback(http: &reqwest::Client, url: &str, body: &Value, key: Option<&str>) -> (StatusCode, Value) {
    let mut r = http.post(format!("{url}/v1/route/feedback")).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.send().await.unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_teach_the_bandit_and_survive_a_restart() {
    let dir = std::env::temp_dir().join(format!("sgl-route-feedback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("feedback.json");
    let _ = std::fs::remove_file(&state);
    let (routing, _engines) = pools("tests/routing/feedback.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing.clone());
    app.client_keys = vec![CLIENT_KEY.into()];
    app.feedback.state_file = Some(state.clone());
    let router = start(app.clone()).await;
    let (url, http) = (router.url.clone(), reqwest::Client::new());

    // The answers of a good large pool and a bad small one, judged by the client.
    let (mut large, mut judged) = (0, std::collections::BTreeSet::new());
    for _ in 0..60 {
        let (pool, id) = chat(&http, &url).await;
        let verdict = if pool == "large" { "good" } else { "bad" };
        large += usize::from(pool == "large");
        judged.insert(pool.clone());
        let (status, out) = feedback(&http, &url, &json!({"route_id": id, "verdict": verdict}), Some(CLIENT_KEY)).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!((out["decision"].as_str(), out["pool"].as_str()), (Some("chat"), Some(pool.as_str())));
    }
    assert!(large > 30, "the bandit moved to the large pool while learning: {large} of 60");
    let mut after = 0;
    for _ in 0..40 {
        after += usize::from(chat(&http, &url).await.0 == "large");
    }
    assert!(after >= 36, "{after} of 40 to the large pool once learned");

    // Refusals: no key, unknown id, judged twice, a bad body, a large body, a pair of one pool.
    let (pool, id) = chat(&http, &url).await;
    judged.insert(pool);
    let good = json!({"route_id": id, "verdict": "good"});
    assert_eq!(feedback(&http, &url, &good, None).await.0, 401);
    assert_eq!(feedback(&http, &url, &good, Some(CLIENT_KEY)).await.0, 200);
    assert_eq!(feedback(&http, &url, &good, Some(CLIENT_KEY)).await.0, 422, "judged once");
    let unknown = json!({"route_id": "00000000000000aa", "verdict": "good"});
    assert_eq!(feedback(&http, &url, &unknown, Some(CLIENT_KEY)).await.0, 404);
    assert_eq!(feedback(&http, &url, &json!({"route_id": id}), Some(CLIENT_KEY)).await.0, 400);
    let big = json!({"route_id": "x".repeat(5000), "verdict": "good"});
    assert_eq!(feedback(&http, &url, &big, Some(CLIENT_KEY)).await.0, 413);
    let a = chat(&http, &url).await.1;
    let (status, out) = feedback(&http, &url, &json!({"winner": a, "loser": a}), Some(CLIENT_KEY)).await;
    assert_eq!(status, 422, "a preference compares two answers: {out}");
    let accepted = "router_route_feedback_total{kind=\"verdict\",outcome=\"accepted\"}";
    assert_eq!(metric(&url, accepted).await, 61.0);
    assert_eq!(metric(&url, "router_route_feedback_total{kind=\"verdict\",outcome=\"already_judged\"}").await, 1.0);
    // An arm is held once a pool of it is judged: Thompson sampling may have sent all 60 to the
    // large pool (rarely: both start at Beta(6, 6)), and then the small one has no arm.
    assert_eq!(metric(&url, "router_route_feedback_arms").await, judged.len() as f64);
    let outcomes: Value = admin_get(&format!("{url}/v1/route/outcomes")).await.json().await.unwrap();
    let arms = &outcomes["outcomes"]["arms"]["chat"];
    let alpha = |pool: &str| arms[pool]["alpha"].as_f64();
    // The prior of quality 0.5 at strength 10 is alpha 1 + 0.5 × 10 = 6 for an arm never judged.
    assert!(alpha("large").unwrap() > alpha("small").unwrap_or(6.0), "{outcomes}");
    let _ = ADMIN_KEY;

    // Saved at shutdown, read at the next start: the new router routes as the old one learned.
    router.stop.send(()).unwrap();
    for _ in 0..100 {
        if state.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let saved: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(saved["arms"], outcomes["outcomes"]["arms"], "the file holds what was learned");
    let again = start(app).await;
    let mut large = 0;
    for _ in 0..40 {
        large += usize::from(chat(&http, &again.url).await.0 == "large");
    }
    assert!(large >= 36, "{large} of 40 to the large pool after the restart");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One client's verdicts move an arm a bounded number of times (`--route-feedback-caller-weight`):
/// past it 429 `feedback_limited`, counted, nothing moved; another client's still count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_weight_in_an_arm_is_bounded() {
    let (routing, _engines) = pools("tests/routing/feedback.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    app.client_keys = vec![CLIENT_KEY.into(), "other-key".into()];
    app.feedback.caller_weight = 3;
    let router = start(app).await;
    let (url, http) = (router.url.clone(), reqwest::Client::new());
    let mut statuses = std::collections::BTreeMap::<(String, u16), usize>::new();
    let mut refusal = Value::Null;
    for _ in 0..12 {
        let (pool, id) = chat(&http, &url).await;
        let (status, out) = feedback(&http, &url, &json!({"route_id": id, "verdict": "good"}), Some(CLIENT_KEY)).await;
        if status == 429 {
            refusal = out;
        }
        *statuses.entry((pool, status.as_u16())).or_default() += 1;
    }
    // Per pool (the round-robin bandit spreads the twelve), the first three verdicts count.
    let pools: std::collections::BTreeSet<&String> = statuses.keys().map(|(p, _)| p).collect();
    for pool in pools {
        let n = |status: u16| statuses.get(&(pool.clone(), status)).copied().unwrap_or(0);
        assert_eq!(n(200), (n(200) + n(429)).min(3), "{pool}: {statuses:?}");
    }
    assert_eq!(statuses.keys().filter(|(_, s)| *s != 200 && *s != 429).count(), 0, "{statuses:?}");
    assert_eq!(refusal["error"]["type"], "feedback_limited", "{refusal}");
    let over = "router_route_feedback_total{kind=\"verdict\",outcome=\"over_weight\"}";
    let accepted = "router_route_feedback_total{kind=\"verdict\",outcome=\"accepted\"}";
    let refused: usize = statuses.iter().filter(|((_, s), _)| *s == 429).map(|(_, n)| n).sum();
    assert_eq!(metric(&url, over).await, refused as f64);
    assert_eq!(metric(&url, accepted).await, (12 - refused) as f64);
    // Another client's verdict on the same arm still counts.
    let r = http.post(format!("{url}/v1/chat/completions")).bearer_auth("other-key").json(&ask()).send().await.unwrap();
    let id = r.headers()["x-route-id"].to_str().unwrap().to_owned();
    let (status, out) = feedback(&http, &url, &json!({"route_id": id, "verdict": "good"}), Some("other-key")).await;
    assert_eq!(status, 200, "{out}");
}
