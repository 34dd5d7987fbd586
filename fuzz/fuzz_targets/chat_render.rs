//! A client's chat request body through the router's render path: JSON → chat request →
//! template → tokens → page hashes, with the built-in model. Never a panic; a body it takes
//! is JSON serde_json reads too; rendering the same request twice gives the same tokens.
#![no_main]

use libfuzzer_sys::fuzz_target;
use renderer::{ChatRequest, Renderer};

fuzz_target!(|data: &[u8]| {
    let Ok(req) = ChatRequest::from_json(data) else { return };
    assert!(serde_json::from_slice::<serde_json::Value>(data).is_ok(), "took a body that is not JSON");
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
