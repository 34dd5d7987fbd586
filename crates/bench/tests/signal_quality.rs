//! The embedding signals' quality on MT-Bench and bastioncorpus, checked
//! against the TF-IDF baseline (`sgl-router-bench signal-quality --check`):
//! with the `embed` feature only (the real model, in CI's release step, where
//! `tools/embed_eval/fetch.sh` has set SGL_ROUTER_EMBED_MODEL, SGL_ROUTER_MTBENCH
//! and SGL_ROUTER_BASTION). A test so that CI builds it in the same release
//! invocation as the other embedding tests (one build of the shared crates).

#[cfg(feature = "embed")]
#[test]
fn the_embedding_signals_beat_the_tf_idf_baseline() {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-router-bench"))
        .args(["signal-quality", "--check"])
        .status()
        .expect("sgl-router-bench runs");
    assert!(status.success(), "signal-quality --check failed: {status}");
}
