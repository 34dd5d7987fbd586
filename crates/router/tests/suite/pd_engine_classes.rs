//! The bodies the router sends in disaggregation, checked by the engines'
//! own code: the router runs in front of simulated prefill and decode
//! engines, every leg they receive is collected, and
//! `tests/pd/check_bodies.py` parses them with SGLang's and vLLM's real
//! request classes, runs SGLang's DP-rank rules and vLLM's NIXL schedulers
//! on them (see `tests/pd/README.md`).
//!
//! Needs the venv of `tests/kv_events/setup_venv.sh`: its python is taken
//! from `SGL_ROUTER_KV_PYTHON` (set by `.ci/run`, then required) or the
//! default `/tmp/sgl-router-kv-venv/bin/python` (skipped with a message if absent).

use crate::common;

use std::io::Write;
use std::path::PathBuf;

use common::app::{chat, post, start};
use gateway::pd::PdMode;
use mock_engine::{Flavor, MockEngine, PdRole};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

/// The legs `prefill` and `decode` received, as the checker reads them.
fn legs(prefill: &MockEngine, decode: &MockEngine, path_of: impl Fn(&Value) -> &'static str) -> Vec<Value> {
    let mut out = Vec::new();
    for (leg, m) in [("prefill", prefill), ("decode", decode)] {
        for l in m.engine().legs() {
            out.push(json!({"path": path_of(&l.body), "leg": leg, "request_id": l.request_id, "body": l.body}));
        }
    }
    out
}

/// Which route a body came on (the simulated engines record bodies, not paths).
fn path_of(body: &Value) -> &'static str {
    if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else if body.get("prompt").is_some() {
        "/v1/completions"
    } else {
        "/generate"
    }
}

async fn engine(role: PdRole, flavor: Flavor, dp_size: usize) -> MockEngine {
    MockEngine::spawn(common::pd::role_config(role, flavor, dp_size)).await.unwrap()
}

async fn router(mode: PdMode, p: &MockEngine, d: &MockEngine) -> common::app::Running {
    let (p, d) = (std::slice::from_ref(p), std::slice::from_ref(d));
    start(common::pd::pd_config(mode, p, d, PolicyConfig::cache_aware(), PolicyConfig::power_of_two())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_own_classes_accept_what_the_router_sends() {
    let Some(python) = common::venv_python("the engines' request classes") else { return };
    // SGLang, with a data-parallel prefill, on every route and a batch of each kind.
    let (p, d) = (engine(PdRole::Prefill, Flavor::Sglang, 2).await, engine(PdRole::Decode, Flavor::Sglang, 1).await);
    let r = router(PdMode::Sglang, &p, &d).await;
    let sglang_bodies = [
        ("/generate", json!({"text": "a single prompt", "sampling_params": {"max_new_tokens": 3}})),
        ("/generate", json!({"text": ["first of a batch", "second"], "sampling_params": {"max_new_tokens": 2}})),
        ("/generate", json!({"input_ids": [[104, 105], [106, 107, 108]], "sampling_params": {"max_new_tokens": 2}})),
        ("/generate", json!({"text": "my own rid", "rid": "client-rid-1", "return_logprob": true})),
        ("/v1/chat/completions", chat("You are terse.", "hello")),
        ("/v1/chat/completions", {
            let mut c = chat("You are terse.", "stream it");
            c["stream"] = json!(true);
            c
        }),
        ("/v1/completions", json!({"model": "default", "prompt": "Once upon", "max_tokens": 3})),
        ("/v1/completions", json!({"model": "default", "prompt": ["one", "two"], "max_tokens": 2})),
    ];
    for (path, body) in &sglang_bodies {
        assert_eq!(post(&format!("{}{path}", r.url), body).await.status(), 200, "{path} {body}");
    }
    let sglang = legs(&p, &d, path_of);
    // vLLM (NIXL), chat and completions, streamed and not.
    let (vp, vd) = (engine(PdRole::Prefill, Flavor::Vllm, 1).await, engine(PdRole::Decode, Flavor::Vllm, 1).await);
    let r = router(PdMode::Vllm, &vp, &vd).await;
    let vllm_bodies = [
        (
            "/v1/chat/completions",
            json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 4, "min_tokens": 2}),
        ),
    ];
    for (path, body) in &vllm_bodies {
        assert_eq!(post(&format!("{}{path}", r.url), body).await.status(), 200, "{path} {body}");
    }
    // The checker wants each vLLM pair as prefill then decode.
    let (vpl, vdl) = (vp.engine().legs(), vd.engine().legs());
    assert_eq!(vpl.len(), vdl.len());
    let vllm: Vec<Value> = vpl
        .iter()
        .zip(&vdl)
        .flat_map(|(p, d)| {
            [("prefill", p), ("decode", d)].map(
                |(leg, l)| json!({"path": path_of(&l.body), "leg": leg, "request_id": l.request_id, "body": l.body}),
            )
        })
        .collect();
    let bodies = json!({"sglang_prefill_dp_size": 2, "sglang": sglang, "vllm": vllm});
    let dir = std::env::temp_dir().join(format!("sgl-router-pd-bodies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bodies.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&bodies).unwrap()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/pd/check_bodies.py");
    let out = std::process::Command::new(&python).arg(&script).arg(&file).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the engines' classes refused the router's bodies:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("passed"), "{report}");
    let _ = writeln!(std::io::stderr(), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
