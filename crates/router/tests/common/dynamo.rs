//! NVIDIA Dynamo 1.6.1's simulated engine (`python -m dynamo.mocker`, publishing vLLM-format
//! KV events over ZMQ with replay) behind its own OpenAI frontend (`python -m dynamo.frontend`,
//! round robin over the one engine), from the venv of `tests/dynamo/setup_venv.sh`: file
//! discovery, a TCP request plane, a ZMQ event plane; no etcd, no NATS, no GPU.
#![allow(dead_code)] // not every test binary uses all of it

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The python of the Dynamo venv: `SGL_ROUTER_DYNAMO_PYTHON` (set by `.ci/run`, then required),
/// else `/tmp/sgl-router-dynamo-venv/bin/python`; `None` (with a line saying `what` is skipped).
pub(crate) fn python(what: &str) -> Option<PathBuf> {
    use std::io::Write;
    if let Ok(p) = std::env::var("SGL_ROUTER_DYNAMO_PYTHON") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "SGL_ROUTER_DYNAMO_PYTHON={} does not exist", p.display());
        return Some(p);
    }
    let default = PathBuf::from("/tmp/sgl-router-dynamo-venv/bin/python");
    if default.exists() {
        return Some(default);
    }
    assert!(std::env::var("SGL_ROUTER_KV_PYTHON").is_err(), "in CI the Dynamo venv must be there (.ci/run makes it)");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} need the venv of tests/dynamo/setup_venv.sh \
         (set SGL_ROUTER_DYNAMO_PYTHON or create /tmp/sgl-router-dynamo-venv)"
    );
    None
}

/// A port free now on 127.0.0.1 (Dynamo's mocker binds the ports it is given).
use super::free_port;

/// One mocker behind one frontend, killed when dropped.
pub(crate) struct Dynamo {
    children: Vec<Child>,
    dir: PathBuf,
    /// The frontend, `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// The mocker's KV-event PUB and replay ROUTER endpoints.
    pub(crate) events: String,
    pub(crate) replay: String,
    /// The model directory both serve (the Qwen3 tokenizer and chat template).
    pub(crate) model_dir: PathBuf,
    /// The served model name.
    pub(crate) model: &'static str,
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Dynamo {
    /// Starts the mocker (16-token pages) and the frontend; returns once the frontend lists the
    /// model (a cold Python start takes seconds: up to 90 s allowed).
    pub(crate) async fn start(python: &Path) -> Dynamo {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sgl-router-dynamo-{}-{n}", std::process::id()));
        let model_dir = dir.join("model");
        std::fs::create_dir_all(&model_dir).unwrap();
        let tokenizer = super::app::repo("tests/fixtures/tokenizers/qwen3");
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(tokenizer.join(f), model_dir.join(f)).unwrap();
        }
        // The frontend reads the model's config for its context length and end token.
        std::fs::write(
            model_dir.join("config.json"),
            r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "max_position_embeddings": 32768,
                "vocab_size": 151936, "eos_token_id": 151645, "bos_token_id": 151643}"#,
        )
        .unwrap();
        let (http, events, replay) = (free_port(), free_port(), free_port());
        let store = dir.join("discovery");
        let namespace = format!("sglrouter{}x{n}", std::process::id());
        let env = |c: &mut Command| {
            c.env("DYN_FILE_KV", &store)
                .env("DYN_DISCOVERY_BACKEND", "file")
                .env("DYN_REQUEST_PLANE", "tcp")
                .env("DYN_EVENT_PLANE", "zmq")
                .env("DYN_HTTP_HOST", "127.0.0.1")
                .env("DYN_TCP_RPC_HOST", "127.0.0.1")
                .env("DYN_SYSTEM_HOST", "127.0.0.1")
                .env("DYN_LOG", "error")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
        };
        let mut mocker = Command::new(python);
        mocker.args(["-m", "dynamo.mocker", "--model-path"]).arg(&model_dir).args([
            "--model-name",
            "qwen",
            "--endpoint",
            &format!("dyn://{namespace}.backend.generate"),
            "--block-size",
            "16",
            "--speedup-ratio",
            "100",
            "--zmq-kv-events-ports",
            &events.to_string(),
            "--zmq-replay-ports",
            &replay.to_string(),
        ]);
        env(&mut mocker);
        let mut frontend = Command::new(python);
        frontend.args(["-m", "dynamo.frontend", "--http-port", &http.to_string(), "--namespace", &namespace]);
        frontend.args(["--router-mode", "round-robin"]);
        env(&mut frontend);
        let children =
            vec![mocker.spawn().expect("dynamo.mocker starts"), frontend.spawn().expect("dynamo.frontend starts")];
        let dynamo = Dynamo {
            children,
            dir,
            url: format!("http://127.0.0.1:{http}"),
            events: format!("tcp://127.0.0.1:{events}"),
            replay: format!("tcp://127.0.0.1:{replay}"),
            model_dir,
            model: "qwen",
        };
        let client = reqwest::Client::new();
        let models = format!("{}/v1/models", dynamo.url);
        for _ in 0..900 {
            let listed = match client.get(&models).timeout(Duration::from_secs(2)).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if listed.contains("\"qwen\"") {
                return dynamo;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("Dynamo's frontend did not list the mocker's model within 90 s");
    }
}
