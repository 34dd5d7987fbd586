//! `sgl-router hash` and `sgl-router render` as a user runs them: the real
//! binary, stdin and files, stdout JSON, one-line errors and exit codes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sgl-router");
    // The tool may exit before reading stdin (a bad flag, a missing directory): a broken pipe is fine.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "writing stdin: {e}");
    }
    child.wait_with_output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    assert!(out.status.success(), "exit {:?}, stderr {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// A failure is one line on stderr, no panic, a non-zero exit.
fn assert_clean_error(out: &Output, needle: &str) {
    assert!(!out.status.success(), "expected failure, got {:?}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line expected: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err:?}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty());
}

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

/// A scratch directory, removed when the value is dropped (a failed test's too).
fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("sgl-router-cli-{name}-")).tempdir().unwrap()
}

#[test]
fn hash_prints_the_reference_values() {
    assert_eq!(
        stdout_json(&run(&["hash", "--page-size", "4"], "[1,2,3,4,5,6,7,8]")),
        json!([-3488128144981237669i64, 5674439469042975057i64])
    );
    assert_eq!(
        stdout_json(&run(&["hash", "--page-size", "2"], "[0, 1, 2, 3, 4]")),
        json!([120731552294108698i64, -5785398976907936554i64, -1760925733444217280i64])
    );
    assert_eq!(stdout_json(&run(&["hash", "--page-size", "16"], "[]")), json!([]));
}

#[test]
fn hash_reads_a_file_and_takes_bigram_and_salt() {
    let scratch = temp_dir("hash");
    let dir = scratch.path();
    let file = dir.join("tokens.json");
    std::fs::write(&file, "[5, 6, 7, 8, 9]").unwrap();
    let f = file.to_str().unwrap();
    let plain = stdout_json(&run(&["hash", "--page-size", "2", "--tokens-file", f], ""));
    assert_eq!(plain.as_array().unwrap().len(), 3);
    let bigram = stdout_json(&run(&["hash", "--page-size", "2", "--bigram", "--tokens-file", f], ""));
    assert_eq!(bigram.as_array().unwrap().len(), 2, "5 raw tokens are 4 bigram positions");
    let salted = stdout_json(&run(&["hash", "--page-size", "2", "--cache-salt", "t", "--tokens-file", f], ""));
    assert_ne!(salted, plain);
    let empty_salt = stdout_json(&run(&["hash", "--page-size", "2", "--cache-salt", "", "--tokens-file", f], ""));
    assert_eq!(empty_salt, plain, "an empty salt is no salt, as in SGLang");
}

#[test]
fn hash_rejects_bad_input_cleanly() {
    assert_clean_error(&run(&["hash", "--page-size", "4"], "[1, 2,"), "not valid JSON");
    assert_clean_error(&run(&["hash", "--page-size", "4"], r#"{"a": 1}"#), "JSON array");
    assert_clean_error(&run(&["hash", "--page-size", "4"], "[1, -2]"), "position 1");
    assert_clean_error(&run(&["hash", "--page-size", "4"], "[9223372036854775808]"), "position 0");
    assert_clean_error(&run(&["hash", "--page-size", "4"], "[1.5]"), "position 0");
    assert_clean_error(&run(&["hash", "--page-size", "4", "--tokens-file", "/nonexistent/t.json"], ""), "cannot read");
    let usage = run(&["hash", "--page-size", "0"], "[]");
    assert_eq!(usage.status.code(), Some(64), "usage errors exit 64");
}

#[test]
fn render_matches_the_golden_case_and_hashes_its_tokens() {
    let fx: Value = serde_json::from_slice(&std::fs::read(fixtures().join("chat/qwen3.json")).unwrap()).unwrap();
    let case = fx["cases"].as_array().unwrap().iter().find(|c| c["name"] == "multi_turn").expect("multi_turn case");
    let dir = fixtures().join("tokenizers/qwen3");
    let out = stdout_json(&run(
        &["render", "--tokenizer", dir.to_str().unwrap(), "--page-size", "16"],
        &case["request"].to_string(),
    ));
    assert_eq!(out["text"], case["text"]);
    assert_eq!(out["token_ids"], case["token_ids"]);
    let hashes = stdout_json(&run(&["hash", "--page-size", "16"], &out["token_ids"].to_string()));
    assert_eq!(out["block_hashes"], hashes);
    // Without --page-size there are no hashes.
    let out = stdout_json(&run(&["render", "--tokenizer", dir.to_str().unwrap()], &case["request"].to_string()));
    assert!(out.get("block_hashes").is_none());
}

#[test]
fn render_with_an_explicit_template_file() {
    let scratch = temp_dir("render");
    let dir = scratch.path();
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}").unwrap();
    let tok_dir = fixtures().join("tokenizers/qwen3");
    let request = dir.join("req.json");
    std::fs::write(&request, r#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
    let out = stdout_json(&run(
        &[
            "render",
            "--tokenizer",
            tok_dir.to_str().unwrap(),
            "--chat-template",
            dir.join("t.jinja").to_str().unwrap(),
            "--request",
            request.to_str().unwrap(),
        ],
        "",
    ));
    assert_eq!(out["text"], "[user:hi]");
}

#[test]
fn render_rejects_bad_input_cleanly() {
    let qwen = fixtures().join("tokenizers/qwen3");
    let q = qwen.to_str().unwrap();
    assert_clean_error(&run(&["render", "--tokenizer", q], "{oops"), "invalid request");
    assert_clean_error(&run(&["render", "--tokenizer", q], r#"{"messages": "x"}"#), "invalid request");
    assert_clean_error(&run(&["render", "--tokenizer", "/nonexistent"], "{}"), "cannot load");
    // A tokenizer directory without any chat template.
    let scratch = temp_dir("bare");
    let bare = scratch.path();
    std::fs::copy(qwen.join("tokenizer.json"), bare.join("tokenizer.json")).unwrap();
    assert_clean_error(
        &run(&["render", "--tokenizer", bare.to_str().unwrap()], r#"{"messages": [{"role": "user", "content": "x"}]}"#),
        "no chat template",
    );
    // A template that raises names its message and line.
    let scratch = temp_dir("raise");
    let dir = scratch.path();
    std::fs::write(dir.join("t.jinja"), "a\n{{ raise_exception('only user roles') }}").unwrap();
    assert_clean_error(
        &run(
            &["render", "--tokenizer", q, "--chat-template", dir.join("t.jinja").to_str().unwrap()],
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
        ),
        "only user roles (template line 2)",
    );
}

#[test]
fn the_router_refuses_bad_flags_with_one_line_and_status_64() {
    for (args, needle) in [
        (&["--worker-urls", "ftp://w:30000"][..], "not an http://, https:// or grpc:// URL"),
        (&["--worker-urls", "w:30000"][..], "not an http://, https:// or grpc:// URL"),
        (&["--worker-urls", "grpc://w"][..], "a grpc:// worker URL needs its port"),
        (
            &["--pd-disaggregation", "--prefill", "grpc://p:1", "--decode", "http://d:1"][..],
            "a disaggregated pool's workers speak one protocol, gRPC or HTTP",
        ),
        (
            &[
                "--worker-urls",
                "http://w:1",
                "--tls-cert-path",
                "/nonexistent.pem",
                "--tls-key-path",
                "/nonexistent.key",
            ][..],
            "--tls-cert-path",
        ),
        (&["--worker-urls", "http://w:1", "--ca-cert-paths", "/nonexistent-ca.pem"][..], "/nonexistent-ca.pem"),
        (
            &["--worker-urls", "http://w:1", "--cache-threshold", "0.5"][..],
            "tunes the text tree of approx_tree and cache_aware",
        ),
        (&["--worker-urls", "http://w:1", "--retry-jitter-factor", "2"][..], "--retry-jitter-factor"),
        (&["--worker-urls", "http://w:1", "--health-check-endpoint", "health"][..], "--health-check-endpoint"),
        (&["--worker-urls", "http://w:1", "--prometheus-duration-buckets", "1", "0.5"][..], "increasing order"),
        (&["--worker-urls", "http://w:1", "--log-level", "loud"][..], "--log-level loud"),
        (&["--worker-urls", "http://w:1", "--ttft-hit-weight", "2"][..], "tunes the min_ttft policy"),
        (&["--worker-urls", "http://w:1", "--selection-temperature", "1"][..], "tunes the cache_aware policy"),
        (
            &["--worker-urls", "http://w:1", "--policy", "cache_aware", "--overlap-decay=-1"][..],
            "--overlap-decay -1: a finite number, 0 or more",
        ),
        // SMG's head-hash index: cache_aware's, with boundaries it reads.
        (&["--worker-urls", "http://w:1", "--cache-index", "hash"][..], "tunes the cache_aware policy"),
        (
            &["--worker-urls", "http://w:1", "--policy", "cache_aware", "--cache-boundaries", "64"][..],
            "read by --cache-index hash only",
        ),
        (
            &[
                "--worker-urls",
                "http://w:1",
                "--policy",
                "cache_aware",
                "--cache-index",
                "hash",
                "--cache-boundaries",
                "0,8",
            ][..],
            "a token position of at least 1",
        ),
        // Disaggregation's flags.
        (&["--prefill", "http://p:1", "--decode", "http://d:1"][..], "need --pd-disaggregation"),
        (&["--pd-disaggregation", "--prefill", "http://p:1"][..], "at least one --prefill and one --decode"),
        (&["--pd-disaggregation", "--prefill", "http://p:1", "99999", "--decode", "http://d:1"][..], "bootstrap port"),
        (&["--pd-disaggregation", "--prefill", "8998", "--decode", "http://d:1"][..], "a worker URL first"),
        (
            &["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://p:1"][..],
            "both --prefill and --decode",
        ),
        (
            &[
                "--pd-disaggregation",
                "--worker-urls",
                "http://w:1",
                "--prefill",
                "http://p:1",
                "--decode",
                "http://d:1",
            ][..],
            "give the workers as --prefill URL and --decode URL",
        ),
        (
            &[
                "--vllm-pd-disaggregation",
                "--prefill",
                "http://p:1",
                "--decode",
                "http://d:1",
                "--kv-connector",
                "moriio",
            ][..],
            "only nixl and mooncake",
        ),
        (
            &["--pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://d:1", "--kv-connector", "nixl"][..],
            "is vLLM's",
        ),
        (
            &[
                "--pd-disaggregation",
                "--prefill",
                "http://p:1",
                "--decode",
                "http://d:1",
                "--pd-skip-prefill-uncached-tokens",
                "256",
            ][..],
            "cannot prefill a request themselves",
        ),
        (
            &[
                "--vllm-pd-disaggregation",
                "--prefill",
                "http://p:1",
                "--decode",
                "http://d:1",
                "--pd-skip-prefill-cached-fraction",
                "1.5",
            ][..],
            "a share in 0..=1",
        ),
    ] {
        let out = run(args, "");
        assert_clean_error(&out, needle);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
    }
    // A value clap refuses: its own message, the same status.
    let out = run(&["--mock-workers", "2x3"], "");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("prefill and decode counts (2p2d)"));
}
