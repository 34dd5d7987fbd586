//! The list/watch protocol against the mock API server over real TCP:
//! selectors, chunked lists, watches from a version and from now, label
//! changes, deletion, bookmarks, `timeoutSeconds`, `drop_watches`, and the
//! 410 `ERROR` event after a compaction.

mod common;

use std::time::Duration;

use common::{DEADLINE, Next, assert_status, get_json, names, spawn, summary, watch};
use mock_k8s::{MockApiConfig, Pod};

fn pair(kind: &str, name: &str) -> (String, String) {
    (kind.to_owned(), name.to_owned())
}

#[tokio::test]
async fn lists_select_with_every_operator_and_sort_by_namespace_then_name() {
    let server = spawn(MockApiConfig::default()).await;
    server.upsert_pod(Pod::running("prod", "w2", "10.0.0.2").label("app", "sglang").label("role", "decode"));
    server.upsert_pod(Pod::running("prod", "w1", "10.0.0.1").label("app", "sglang").label("role", "prefill"));
    server.upsert_pod(Pod::running("dev", "w3", "10.0.0.3").label("app", "vllm"));
    server.upsert_pod(Pod::new("dev", "w4"));
    let select = |selector: &'static str| {
        let server = &server;
        async move {
            let list = get_json(server, &format!("/api/v1/pods?labelSelector={selector}"), 200).await;
            names(&list)
        }
    };
    assert_eq!(select("").await, ["w3", "w4", "w1", "w2"]);
    assert_eq!(select("app%3Dsglang").await, ["w1", "w2"]);
    assert_eq!(select("app%3D%3Dsglang").await, ["w1", "w2"]);
    assert_eq!(select("app!%3Dsglang").await, ["w3", "w4"]);
    assert_eq!(select("role").await, ["w1", "w2"]);
    assert_eq!(select("!role").await, ["w3", "w4"]);
    assert_eq!(select("app%20in%20(vllm,%20sglang)").await, ["w3", "w1", "w2"]);
    assert_eq!(select("role%20notin%20(decode)").await, ["w3", "w4", "w1"]);
    assert_eq!(select("app%3Dsglang,role%20in%20(prefill)").await, ["w1"]);
    assert_eq!(select("app%3Dnone").await, Vec::<String>::new());

    let query = "labelSelector=app&fieldSelector=status.phase%3DRunning";
    let list = get_json(&server, &format!("/api/v1/namespaces/prod/pods?{query}"), 200).await;
    assert_eq!(names(&list), ["w1", "w2"]);
    assert_eq!((list["kind"].as_str(), list["apiVersion"].as_str()), (Some("PodList"), Some("v1")));
    assert_eq!(list["metadata"]["resourceVersion"], server.resource_version().to_string());
    assert!(list["metadata"].get("continue").is_none());
    let item = &list["items"][0];
    assert!(item.get("kind").is_none() && item.get("apiVersion").is_none(), "list items carry no type: {item}");
    assert_eq!(item["metadata"]["namespace"], "prod");
    assert_eq!(item["status"]["podIP"], "10.0.0.1");
    assert!(item["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert_eq!(server.lists(), 11);
}

#[tokio::test]
async fn limit_and_continue_page_through_one_snapshot() {
    let server = spawn(MockApiConfig::default()).await;
    for n in 1..=5 {
        server.upsert_pod(Pod::running("ns", format!("p{n}"), format!("10.0.0.{n}")));
    }
    let first = get_json(&server, "/api/v1/namespaces/ns/pods?limit=2", 200).await;
    assert_eq!(names(&first), ["p1", "p2"]);
    let rv = first["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    assert_eq!(first["metadata"]["remainingItemCount"], 3);
    let token = first["metadata"]["continue"].as_str().expect("a continue token").to_owned();

    // Changes after the first page do not show in the later ones.
    server.delete_pod("ns", "p3");
    server.set_ready("ns", "p4", false);
    server.upsert_pod(Pod::new("ns", "p6"));
    let second = get_json(&server, &format!("/api/v1/namespaces/ns/pods?limit=2&continue={token}"), 200).await;
    assert_eq!(names(&second), ["p3", "p4"]);
    assert_eq!(second["metadata"]["resourceVersion"], rv.as_str());
    assert_eq!(second["items"][1]["status"]["conditions"][1]["status"], "True", "p4 as it was");
    let token = second["metadata"]["continue"].as_str().unwrap().to_owned();
    let last = get_json(&server, &format!("/api/v1/namespaces/ns/pods?limit=2&continue={token}"), 200).await;
    assert_eq!(names(&last), ["p5"]);
    assert!(last["metadata"].get("continue").is_none());
    let now = get_json(&server, "/api/v1/namespaces/ns/pods", 200).await;
    assert_eq!(names(&now), ["p1", "p2", "p4", "p5", "p6"]);

    // Past a compaction the snapshot is gone: 410 Expired; a fresh list works.
    server.compact();
    let expired = get_json(&server, &format!("/api/v1/namespaces/ns/pods?limit=2&continue={token}"), 410).await;
    assert_status(&expired, 410, "Expired");
    let bad = get_json(&server, "/api/v1/namespaces/ns/pods?limit=2&continue=garbage!", 400).await;
    assert_status(&bad, 400, "BadRequest");
    assert_eq!(names(&get_json(&server, "/api/v1/pods?limit=10", 200).await).len(), 5);

    // A selector pages too, without remainingItemCount.
    let page = get_json(&server, "/api/v1/pods?limit=1&labelSelector=!nothing", 200).await;
    assert!(page["metadata"]["continue"].is_string() && page["metadata"].get("remainingItemCount").is_none());
}

#[tokio::test]
async fn a_watch_from_a_version_gets_every_later_change_then_live_ones() {
    let server = spawn(MockApiConfig::default()).await;
    let rv = server.upsert_pod(Pod::running("ns", "a", "10.0.0.1"));
    server.upsert_pod(Pod::running("ns", "b", "10.0.0.2"));
    server.set_ready("ns", "a", false);
    server.delete_pod("ns", "b");
    let mut w = watch(&server, &format!("/api/v1/namespaces/ns/pods?watch=1&resourceVersion={rv}")).await;
    let headers = w.response.headers();
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["transfer-encoding"], "chunked");
    let added = w.event().await;
    assert_eq!(summary(&added), pair("ADDED", "b"));
    assert_eq!((added.1["kind"].as_str(), added.1["apiVersion"].as_str()), (Some("Pod"), Some("v1")));
    let modified = w.event().await;
    assert_eq!(summary(&modified), pair("MODIFIED", "a"));
    assert_eq!(modified.1["status"]["conditions"][1]["status"], "False");
    let deleted = w.event().await;
    assert_eq!(summary(&deleted), pair("DELETED", "b"));
    assert_eq!(deleted.1["status"]["podIP"], "10.0.0.2", "the last state");
    assert_eq!(deleted.1["metadata"]["resourceVersion"], server.resource_version().to_string());

    let c = server.upsert_pod(Pod::new("ns", "c"));
    let live = w.event().await;
    assert_eq!(summary(&live), pair("ADDED", "c"));
    assert_eq!(live.1["metadata"]["resourceVersion"], c.to_string());
    // Resource versions only grow.
    let rvs: Vec<u64> = [&added, &modified, &deleted, &live]
        .iter()
        .map(|(_, o)| o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
}

#[tokio::test]
async fn a_watch_from_zero_or_no_version_starts_with_the_current_pods() {
    let server = spawn(MockApiConfig::default()).await;
    server.upsert_pod(Pod::running("ns", "b", "10.0.0.2"));
    server.upsert_pod(Pod::running("ns", "a", "10.0.0.1"));
    server.upsert_pod(Pod::running("other", "z", "10.0.0.3"));
    for query in ["watch=1&resourceVersion=0", "watch=true"] {
        let mut w = watch(&server, &format!("/api/v1/namespaces/ns/pods?{query}")).await;
        assert_eq!(summary(&w.event().await), pair("ADDED", "a"));
        assert_eq!(summary(&w.event().await), pair("ADDED", "b"));
        assert!(server.wait_for_watches(1, DEADLINE).await);
        server.set_phase("ns", "a", "Failed");
        let (kind, object) = w.event().await;
        assert_eq!((kind.as_str(), object["status"]["phase"].as_str()), ("MODIFIED", Some("Failed")));
        server.set_phase("ns", "a", "Running");
        drop(w);
        assert!(server.wait_for_watches(0, DEADLINE).await, "a closed watch is unregistered");
    }
    // All namespaces.
    let mut w = watch(&server, "/api/v1/pods?watch=1").await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(summary(&w.event().await).1);
    }
    assert_eq!(seen, ["a", "b", "z"]);
}

#[tokio::test]
async fn label_changes_and_deletion_as_a_selecting_watcher_sees_them() {
    let server = spawn(MockApiConfig::default()).await;
    server.upsert_pod(Pod::running("ns", "a", "10.0.0.1").label("app", "sglang"));
    server.upsert_pod(Pod::running("ns", "b", "10.0.0.2").label("app", "other"));
    server.upsert_pod(Pod::running("elsewhere", "c", "10.0.0.3").label("app", "sglang"));
    let rv = server.resource_version();
    let query = format!("watch=1&labelSelector=app%3Dsglang&resourceVersion={rv}");
    let mut w = watch(&server, &format!("/api/v1/namespaces/ns/pods?{query}")).await;
    server.set_labels("ns", "a", [("app", "none")]);
    let gone = w.event().await;
    assert_eq!(summary(&gone), pair("DELETED", "a"));
    assert_eq!(gone.1["metadata"]["labels"]["app"], "sglang", "the state it last matched in");
    server.set_labels("ns", "b", [("app", "sglang")]);
    assert_eq!(summary(&w.event().await), pair("ADDED", "b"));
    server.update_pod("elsewhere", "c", |p| p.label("x", "y"));
    server.update_pod("ns", "a", |p| p.ready(false));
    server.start_deleting("ns", "b");
    let (kind, object) = w.event().await;
    assert_eq!(kind, "MODIFIED", "neither the other namespace nor a non-matching pod shows");
    assert!(object["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(server.pod("ns", "b").map(|p| p.name().to_owned()).as_deref(), Some("b"), "still there");
    server.delete_pod("ns", "b");
    let (kind, object) = w.event().await;
    assert_eq!(kind, "DELETED");
    assert!(object["metadata"]["deletionTimestamp"].is_string(), "its last state");
    assert!(w.next_within(Duration::from_millis(200)).await.is_none(), "nothing else");
}

#[tokio::test]
async fn bookmarks_carry_the_current_version_when_allowed() {
    let config = MockApiConfig { bookmark_interval: Duration::from_millis(100), ..MockApiConfig::default() };
    let server = spawn(config).await;
    let mut w = watch(&server, "/api/v1/pods?watch=1&allowWatchBookmarks=true").await;
    let (kind, object) = w.event().await;
    assert_eq!(kind, "BOOKMARK");
    assert_eq!(
        object,
        serde_json::json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": server.resource_version().to_string()}})
    );
    let rv = server.upsert_pod(Pod::new("ns", "a"));
    assert_eq!(summary(&w.event().await), pair("ADDED", "a"));
    let (kind, object) = w.event().await;
    assert_eq!(
        (kind.as_str(), object["metadata"]["resourceVersion"].as_str()),
        ("BOOKMARK", Some(rv.to_string().as_str()))
    );

    // A filtered-out change still advances the bookmarks of a selecting watcher.
    let mut w = watch(&server, "/api/v1/pods?watch=1&allowWatchBookmarks=1&labelSelector=app&resourceVersion=0").await;
    let rv = server.upsert_pod(Pod::new("ns", "b"));
    loop {
        let (kind, object) = w.event().await;
        assert_eq!(kind, "BOOKMARK");
        if object["metadata"]["resourceVersion"] == rv.to_string() {
            break;
        }
    }
    // Without allowWatchBookmarks, none.
    let mut w = watch(&server, "/api/v1/pods?watch=1&resourceVersion=0").await;
    assert_eq!(summary(&w.event().await), pair("ADDED", "a"));
    assert_eq!(summary(&w.event().await), pair("ADDED", "b"));
    assert!(w.next_within(Duration::from_millis(350)).await.is_none());

    // sendInitialEvents: the current state, then a bookmark marking its end.
    let query =
        "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=";
    let mut w = watch(&server, &format!("/api/v1/pods?{query}")).await;
    assert_eq!(summary(&w.event().await), pair("ADDED", "a"));
    assert_eq!(summary(&w.event().await), pair("ADDED", "b"));
    let (kind, object) = w.event().await;
    assert_eq!(kind, "BOOKMARK");
    assert_eq!(object["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream_cleanly() {
    let server = spawn(MockApiConfig::default()).await;
    server.upsert_pod(Pod::new("ns", "a"));
    let started = tokio::time::Instant::now();
    let mut w = watch(&server, "/api/v1/pods?watch=1&timeoutSeconds=1").await;
    assert_eq!(summary(&w.event().await), pair("ADDED", "a"));
    assert!(matches!(w.next().await, Next::End));
    assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    assert!(server.wait_for_watches(0, DEADLINE).await);
}

#[tokio::test]
async fn drop_watches_cuts_every_stream_without_a_final_event() {
    let server = spawn(MockApiConfig::default()).await;
    server.upsert_pod(Pod::new("ns", "a"));
    let rv = server.resource_version();
    let mut one = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={rv}")).await;
    let mut two = watch(&server, "/api/v1/namespaces/ns/pods?watch=1&allowWatchBookmarks=true").await;
    assert_eq!(summary(&two.event().await), pair("ADDED", "a"));
    assert!(server.wait_for_watches(2, DEADLINE).await);
    server.drop_watches();
    for w in [&mut one, &mut two] {
        assert!(matches!(w.next().await, Next::Cut), "cut, not ended");
    }
    assert!(server.wait_for_watches(0, DEADLINE).await);
    // The client resumes from its last version and misses nothing.
    server.upsert_pod(Pod::new("ns", "b"));
    let mut again = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={rv}")).await;
    assert_eq!(summary(&again.event().await), pair("ADDED", "b"));
}

#[tokio::test]
async fn a_compacted_version_gets_one_410_error_event_in_a_200_stream() {
    let server = spawn(MockApiConfig::default()).await;
    let old = server.upsert_pod(Pod::new("ns", "a"));
    server.upsert_pod(Pod::new("ns", "b"));
    server.compact();
    let current = server.resource_version();
    let mut w = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={old}")).await;
    let (kind, object) = w.event().await;
    assert_eq!(kind, "ERROR");
    assert_status(&object, 410, "Expired");
    assert_eq!(object["metadata"], serde_json::json!({}));
    assert_eq!(object["message"], format!("too old resource version: {old} ({current})"));
    assert!(matches!(w.next().await, Next::End), "the stream ends after the error");
    // The list still works, and a watch from its version too.
    let list = get_json(&server, "/api/v1/pods", 200).await;
    assert_eq!(names(&list), ["a", "b"]);
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let mut w = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={rv}")).await;
    server.delete_pod("ns", "a");
    assert_eq!(summary(&w.event().await), pair("DELETED", "a"));
}

#[tokio::test]
async fn the_history_is_bounded() {
    let server = spawn(MockApiConfig { history_limit: 2, ..MockApiConfig::default() }).await;
    let first = server.upsert_pod(Pod::new("ns", "a"));
    let second = server.upsert_pod(Pod::new("ns", "b"));
    server.upsert_pod(Pod::new("ns", "c"));
    let mut w = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={}", first.0 - 1)).await;
    assert_eq!(w.event().await.0, "ERROR");
    let mut w = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={first}")).await;
    assert_eq!(summary(&w.event().await), pair("ADDED", "b"));
    assert_eq!(summary(&w.event().await), pair("ADDED", "c"));
    let mut w = watch(&server, &format!("/api/v1/pods?watch=1&resourceVersion={second}")).await;
    assert_eq!(summary(&w.event().await), pair("ADDED", "c"));
}
