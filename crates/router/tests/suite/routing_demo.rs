//! The README's model-pools demo as a user runs it: the real binary with
//! `--routing-config` and `--mock-workers 1` (one simulated engine per
//! pool), every probe of `tests/routing_probes.yaml` through the preview and
//! as a real request, a reload on SIGHUP, and `check-config` on a good and a
//! bad file.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// Kills the router when the test ends, however it ends.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(path)
}

const KEY: &str = "demo-key";

/// The real binary on `file` with `--mock-workers 1` (and `extra` flags) on a free port: the
/// process, killed on drop, and its URL.
fn spawn(file: &std::path::Path, extra: &[&str]) -> (Router, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(["--routing-config", file.to_str().unwrap(), "--mock-workers", "1"])
        .args(extra)
        .args(["--host", "127.0.0.1", "--port", "0", "--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = out.next().unwrap().unwrap();
    std::thread::spawn(move || out.for_each(drop));
    let url = first.strip_prefix("sgl-router listening on ").expect("the listening line").to_string();
    (Router(child), url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_routes_every_probe_and_reloads_on_sighup() {
    let dir = std::env::temp_dir().join(format!("sgl-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routing.yaml");
    let original = std::fs::read_to_string(repo("examples/routing.yaml")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let (router, url) = spawn(&file, &["--control-plane-api-keys", KEY]);
    let http = reqwest::Client::new();
    let admin = |path: &str| http.post(format!("{url}{path}")).bearer_auth(KEY);
    // Both pools' engines found and probed.
    for _ in 0..500 {
        let r = http.get(format!("{url}/readiness")).send().await.unwrap();
        let v: Value = r.json().await.unwrap();
        if v["healthy_workers"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes: Value =
        serde_norway::from_str(&std::fs::read_to_string(repo("tests/routing_probes.yaml")).unwrap()).unwrap();
    for p in probes["probes"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let content = p["user"].as_str().unwrap().repeat(p["repeat"].as_u64().unwrap_or(1) as usize);
        // The messages before the user turn, as crates/router/tests/suite/model_pools.rs builds them.
        let mut messages = Vec::new();
        if let Some(system) = p["system"].as_str() {
            messages.push(json!({"role": "system", "content": system}));
        }
        if let Some(arguments) = p["tool_arguments"].as_str() {
            let call = json!({"id": "c1", "type": "function", "function": {"name": "send", "arguments": arguments}});
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
            messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "sent"}));
        }
        messages.push(json!({"role": "user", "content": content}));
        let mut body = json!({"max_tokens": 2, "messages": messages});
        if p["no_model"] != true {
            body["model"] = json!(p["model"].as_str().unwrap_or("auto"));
        }
        let e = &p["expect"];
        let explain: Value = admin("/v1/route/preview").json(&body).send().await.unwrap().json().await.unwrap();
        let r = http.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        let (pool, decision) = (header("x-route-pool"), header("x-route-decision"));
        if let Some(want) = e["status"].as_u64() {
            assert_eq!(u64::from(status), want, "{name}");
            continue;
        }
        assert_eq!(explain["decision"], e["decision"], "{name}: {explain}");
        assert_eq!(decision.as_deref(), e["decision"].as_str(), "{name}");
        match e["blocked"].as_u64() {
            Some(b) => assert_eq!(u64::from(status), b, "{name}"),
            None => {
                assert_eq!(status, 200, "{name}");
                assert_eq!(explain["pool"], e["pool"], "{name}: {explain}");
                assert_eq!(pool.as_deref(), e["pool"].as_str(), "{name}");
            }
        }
    }
    // SIGHUP: "matrix" becomes a math keyword.
    let ask = json!({"model": "auto", "messages": [{"role": "user", "content": "what is a matrix?"}]});
    let decision = async || -> Value {
        let v: Value = admin("/v1/route/preview").json(&ask).send().await.unwrap().json().await.unwrap();
        v["decision"].clone()
    };
    assert_eq!(decision().await, "default");
    std::fs::write(&file, original.replace("keywords: [integral,", "keywords: [matrix, integral,")).unwrap();
    let pid = router.0.id().to_string();
    // The shell's own `kill` (no procps needed).
    assert!(Command::new("sh").args(["-c", &format!("kill -HUP {pid}")]).status().unwrap().success());
    let mut reloaded = false;
    for _ in 0..300 {
        if decision().await == "hard" {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "SIGHUP reloads the routing config");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_describes_a_good_file_and_lists_a_bad_files_problems() {
    let run =
        |file: &PathBuf| Command::new(env!("CARGO_BIN_EXE_sgl-router")).arg("check-config").arg(file).output().unwrap();
    let good = run(&repo("examples/routing.yaml"));
    assert!(good.status.success());
    let text = String::from_utf8(good.stdout).unwrap();
    assert!(
        text.contains("  hard (priority 50): signals keyword:math, context:long_prompt -> pools large, small"),
        "{text}"
    );
    assert!(text.ends_with("ok\n"));
    let dir = std::env::temp_dir().join(format!("sgl-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "pools:\n  - {name: a, served_model: m}\ndecisions:\n  - {name: d, rules: {type: regex, name: nope}}\n",
    )
    .unwrap();
    let out = run(&bad);
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with(&format!("{}:4: decision `d` refers to undefined signal regex:nope\n", bad.display())),
        "{err}"
    );
    assert!(err.trim_end().ends_with("1 problem(s)"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's disaggregated-pool demo (`examples/routing-pd.yaml`, `--mock-workers 1`): one
/// simulated engine for the regular pool, a prefill and a decode engine for the disaggregated
/// one; an `auto` request the decisions send there is served by the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disaggregated_pool_demo_serves_auto_requests_by_a_pair() {
    let (_router, url) = spawn(&repo("examples/routing-pd.yaml"), &[]);
    let http = reqwest::Client::new();
    let mut healthy = Value::Null;
    for _ in 0..500 {
        let v: Value = http.get(format!("{url}/readiness")).send().await.unwrap().json().await.unwrap();
        healthy = v["healthy_workers"].clone();
        if healthy == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(healthy, 3, "the regular engine and the pair");
    let ask = |text: &str| {
        let body = json!({"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 8});
        http.post(format!("{url}/v1/chat/completions")).json(&body).send()
    };
    let resp = ask("Prove the theorem that sqrt(2) is irrational.").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-route-pool"], "large");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["model"], "qwen3-32b", "{answer}");
    let resp = ask("hello").await.unwrap();
    assert_eq!((resp.status().as_u16(), resp.headers()["x-route-pool"].to_str().unwrap()), (200, "small"));
}
