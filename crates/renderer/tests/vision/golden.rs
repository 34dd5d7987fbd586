//! Images against vLLM 0.33's and transformers' own code
//! (`tests/fixtures/kv_multimodal/mm_golden.json`, made by `gen_mm_golden.py` beside it): every
//! image's size, conversion, placeholder count and identifier, and every chat's prompt with its
//! images expanded, as a vLLM engine serving a Qwen2.5-VL model makes them.

use std::path::PathBuf;

use base64::Engine as _;
use renderer::vision::{Identity, ImageHash, VisionConfig, header};
use renderer::{ChatRequest, Renderer};
use serde_json::Value;

const FIXTURE: &str = include_str!("../../../../tests/fixtures/kv_multimodal/mm_golden.json");

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

/// The qwen3 fixture tokenizer (it has Qwen-VL's vision tokens), the Qwen2-VL template and
/// image settings of the fixture.
fn vl_renderer() -> Renderer {
    let dir = fixtures().join("kv_multimodal");
    let r =
        Renderer::from_dir(&fixtures().join("tokenizers/qwen3"), Some(&dir.join("qwen2_vl_template.jinja"))).unwrap();
    let pad = r.tokenizer().token_to_id("<|image_pad|>");
    let vision = VisionConfig::load(&dir, pad);
    assert!(vision.is_some(), "the fixture's preprocessor_config.json is read");
    r.with_vision(vision)
}

/// `messages` with each `@name` URL replaced by the image's data URL.
fn with_images(doc: &Value, messages: &Value) -> Value {
    let mut text = messages.to_string();
    for image in doc["images"].as_array().unwrap() {
        let name = image["name"].as_str().unwrap();
        let url = format!("data:image/png;base64,{}", image["b64"].as_str().unwrap());
        text = text.replace(&format!("\"@{name}\""), &format!("\"{url}\""));
    }
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn every_image_is_sized_converted_and_identified_as_vllm_does() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let model = doc["model_id"].as_str().unwrap();
    let vision = *vl_renderer().vision().unwrap();
    let images = doc["images"].as_array().unwrap();
    assert!(images.len() >= 15);
    for image in images {
        let name = image["name"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(image["b64"].as_str().unwrap()).unwrap();
        let h = header::read(&bytes).unwrap_or_else(|| panic!("{name}: header not read"));
        assert_eq!(
            (h.width as u64, h.height as u64),
            (image["width"].as_u64().unwrap(), image["height"].as_u64().unwrap()),
            "{name}: size"
        );
        assert_eq!(h.plain_rgb, !image["converted"].as_bool().unwrap(), "{name}: converted");
        assert_eq!(
            vision.placeholders(h.width, h.height).map(|n| n as u64),
            image["placeholders"].as_u64(),
            "{name}: placeholders"
        );
        assert_eq!(
            ImageHash::new(&bytes, h.plain_rgb).identifier(model),
            image["identifier"].as_str().unwrap(),
            "{name}: identifier"
        );
    }
}

#[test]
fn every_chat_renders_to_the_prompt_and_items_vllm_makes() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let model = doc["model_id"].as_str().unwrap();
    let r = vl_renderer();
    let plain = Renderer::from_dir(
        &fixtures().join("tokenizers/qwen3"),
        Some(&fixtures().join("kv_multimodal/qwen2_vl_template.jinja")),
    )
    .unwrap();
    for chat in doc["chats"].as_array().unwrap() {
        let name = chat["name"].as_str().unwrap();
        let body = serde_json::json!({"messages": with_images(&doc, &chat["messages"])});
        let req = ChatRequest::from_value(&body).unwrap();
        let rendered = r.render_chat(&req).unwrap();
        assert_eq!(rendered.token_ids, ids(&chat["token_ids"]), "{name}: tokens");
        let items = chat["items"].as_array().unwrap();
        assert_eq!(rendered.mm.len(), items.len(), "{name}: items");
        for (got, want) in rendered.mm.iter().zip(items) {
            assert_eq!(got.offset as u64, want["offset"].as_u64().unwrap(), "{name}: offset");
            assert_eq!(got.length as u64, want["length"].as_u64().unwrap(), "{name}: length");
            assert_eq!(got.identity.identifier(model).as_deref(), want["identifier"].as_str(), "{name}: identifier");
        }
        // Without the image settings the prompt is the template's, one pad per image.
        let unexpanded = plain.render_chat(&req).unwrap();
        assert_eq!(unexpanded.token_ids, ids(&chat["rendered_ids"]), "{name}: the template's prompt");
        assert!(unexpanded.mm.is_empty());
        if name == "uuid" {
            assert!(matches!(rendered.mm[0].identity, Identity::Given(_)), "the client's uuid is the identifier");
        }
    }
}

/// Hostile bytes: every fixture image's header cut at every length and with each of its first
/// bytes changed is read or refused, never a panic, and a size read is never zero.
#[test]
fn damaged_headers_are_refused_not_trusted() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let mut read = 0;
    for image in doc["images"].as_array().unwrap() {
        let bytes = base64::engine::general_purpose::STANDARD.decode(image["b64"].as_str().unwrap()).unwrap();
        let head = &bytes[..bytes.len().min(256)];
        for cut in 0..head.len() {
            read += usize::from(header::read(&head[..cut]).is_some());
        }
        for at in 0..head.len().min(64) {
            for v in [0x00, 0x01, 0x7F, 0xFF] {
                let mut damaged = bytes.clone();
                damaged[at] = v;
                if let Some(h) = header::read(&damaged) {
                    assert!(h.width > 0 && h.height > 0);
                }
            }
        }
    }
    assert!(read > 0, "some cut headers still hold the size");
}

/// Anthropic's Messages API: an image block (a base64 source) becomes the image part vLLM
/// converts it to, and is expanded and identified alike.
#[test]
fn an_anthropic_image_block_is_the_same_image_to_the_engine() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let model = doc["model_id"].as_str().unwrap();
    let image = doc["images"].as_array().unwrap().iter().find(|i| i["name"] == "png-rgb").unwrap();
    let r = vl_renderer().with_backend(renderer::anthropic::Backend::Vllm);
    let body = serde_json::json!({
        "model": "m", "max_tokens": 8,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image["b64"]}},
            {"type": "text", "text": "What is in this picture?"},
        ]}],
    });
    let chat = r.anthropic_chat(&body).unwrap();
    let rendered = r.render_chat(&ChatRequest::from_value(&chat).unwrap()).unwrap();
    assert_eq!(rendered.mm.len(), 1);
    assert_eq!(rendered.mm[0].length as u64, image["placeholders"].as_u64().unwrap());
    assert_eq!(rendered.mm[0].identity.identifier(model).as_deref(), image["identifier"].as_str());
}
