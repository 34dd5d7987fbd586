//! A client's chat request body through the router's render path: JSON → chat request →
//! template → tokens → page hashes, with the built-in model. Never a panic; a body it takes
//! is JSON serde_json reads too (but for numbers past f64, which the engines read as inf); rendering the same request twice gives the same tokens.
#![no_main]

use libfuzzer_sys::fuzz_target;
use renderer::{ChatRequest, Renderer};

fuzz_target!(|data: &[u8]| {
    let Ok(req) = ChatRequest::from_json(data) else { return };
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(data) {
        // Numbers past f64 (`2E2222`) in fields the request type skips: serde_json refuses them
        // as values, Python's json (the engines') reads them as inf, so taking them is right.
        assert!(e.to_string().contains("number out of range"), "took a body that is not JSON: {e}");
    }
    thread_local! {
        static RENDERER: Renderer = Renderer::builtin().expect("the built-in model loads");
    }
    RENDERER.with(|r| {
        let first = r.render_chat(&req);
        let second = r.render_chat(&req);
        match (first, second) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => panic!("rendering is not deterministic"),
        }
    });
});
