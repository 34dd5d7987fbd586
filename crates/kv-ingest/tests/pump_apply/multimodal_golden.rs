//! Images in vLLM's block hashes against vLLM's own code: the batches a vLLM 0.33 block pool
//! published for chats with images (`tests/fixtures/kv_multimodal/gen_mm_golden.py`: its
//! `MultiModalHasher`, `cache_full_blocks` and `_gen_mm_extra_hash_keys`, transformers' Qwen2-VL
//! processor), decoded and applied by the real pump; every probe chat, rendered and chained as the
//! request path chains it (the image placeholders expanded, each block's items folded with their
//! identifiers), matches exactly the blocks vLLM's prefix cache would reuse: another image of the
//! same size (the same token ids) is not credited past the image.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use kv_index::MatchOptions;
use renderer::vision::{VisionConfig, identifiers, keyed_block_hashes};
use renderer::{ChatRequest, HashMode, PageHasher, Renderer};
use serde_json::Value;

use super::{get, vllm_applied};

const FIXTURE: &str = include_str!("../../../../tests/fixtures/kv_multimodal/mm_golden.json");

#[test]
fn a_chat_with_images_matches_the_blocks_vllm_would_reuse() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let model = doc["model_id"].as_str().unwrap();
    let page = NonZeroUsize::new(doc["block_size"].as_u64().unwrap() as usize).unwrap();
    let (index, _pump, metrics, _) = vllm_applied(page.get(), doc["payloads_hex"].as_array().unwrap(), "images");
    assert_eq!(get(&metrics.stored), doc["chats"].as_array().unwrap().len() as u64);
    assert_eq!(get(&metrics.hash_mismatches), 0, "vLLM's hashes of blocks with images are checked alike");
    assert!(get(&metrics.hashes_checked) > 20, "{} checked", get(&metrics.hashes_checked));

    let fixtures = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"));
    let dir = fixtures.join("kv_multimodal");
    let r = Renderer::from_dir(&fixtures.join("tokenizers/qwen3"), Some(&dir.join("qwen2_vl_template.jinja"))).unwrap();
    let vision = VisionConfig::load(&dir, r.tokenizer().token_to_id("<|image_pad|>"));
    let r = r.with_vision(vision);
    let hasher = PageHasher::new(page, HashMode::Unigram);
    let mut text = String::new();
    for probe in doc["probes"].as_array().unwrap() {
        let name = probe["name"].as_str().unwrap();
        text.clear();
        text.push_str(&serde_json::json!({"messages": probe["messages"]}).to_string());
        for image in doc["images"].as_array().unwrap() {
            let url = format!("\"data:image/png;base64,{}\"", image["b64"].as_str().unwrap());
            text = text.replace(&format!("\"@{}\"", image["name"].as_str().unwrap()), &url);
        }
        let req = ChatRequest::from_value(&serde_json::from_str(&text).unwrap()).unwrap();
        let rendered = r.render_chat(&req).unwrap();
        let chain =
            keyed_block_hashes(&hasher, &rendered.token_ids, None, &rendered.mm, &identifiers(&rendered.mm, model));
        let depth = index.prefix_depths(&chain, &MatchOptions::default()).first().map_or(0, |m| m.blocks);
        assert_eq!(u64::from(depth), probe["hit_blocks"].as_u64().unwrap(), "{name}");
        // The chain without the images' keys (the router as it was) is never credited past them.
        let plain = hasher.block_hashes(&rendered.token_ids, None).unwrap();
        let plain_depth = index.prefix_depths(&plain, &MatchOptions::default()).first().map_or(0, |m| m.blocks);
        let first_image_block = rendered.mm.first().map_or(usize::MAX, |i| i.offset / page.get()) as u32;
        assert!(plain_depth <= first_image_block.min(depth), "{name}: {plain_depth}");
    }
    let hit =
        |n: &str| doc["probes"].as_array().unwrap().iter().find(|p| p["name"] == n).unwrap()["hit_blocks"].as_u64();
    assert!(hit("same") > Some(20) && hit("other image, same size") < Some(3), "the fixture tells images apart");
}
