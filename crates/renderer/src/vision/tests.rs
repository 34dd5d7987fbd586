use serde_json::json;

use super::*;
use crate::HashMode;

const PAD: u32 = 9;

fn qwen() -> VisionConfig {
    VisionConfig { image_pad: PAD, patch_size: 14, merge_size: 2, min_pixels: 3136, max_pixels: 12_845_056 }
}

/// A PNG header (no pixel data: the router never reads one).
fn png(width: u32, height: u32, colour: u8) -> Vec<u8> {
    let mut d = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    d.extend(width.to_be_bytes());
    d.extend(height.to_be_bytes());
    d.extend([8, colour, 0, 0, 0, 0, 0, 0, 0]);
    d.extend(b"\0\0\0\0IEND\0\0\0\0");
    d
}

fn data_url_of(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn messages(parts: serde_json::Value) -> Vec<Map<String, Json>> {
    vec![json!({"role": "user", "content": parts}).as_object().unwrap().clone()]
}

#[test]
fn smart_resize_rounds_halves_to_even_and_keeps_the_bounds() {
    // 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 to 2 (Python's round), 98 / 28 = 3.5 to 4.
    assert_eq!(smart_resize(42 * 2, 98 * 2, 28, 0, u64::MAX), Some((84, 196)));
    assert_eq!(smart_resize(42, 70, 28, 0, u64::MAX), Some((56, 56)));
    assert_eq!(smart_resize(480, 640, 28, 3136, 12_845_056), Some((476, 644)));
    // Too small: scaled up to at least min_pixels; too large: down to at most max_pixels.
    let (h, w) = smart_resize(40, 50, 28, 3136, 12_845_056).unwrap();
    assert!(h * w >= 3136 && h % 28 == 0 && w % 28 == 0);
    let (h, w) = smart_resize(3600, 3600, 28, 3136, 12_845_056).unwrap();
    assert!(h * w <= 12_845_056 && h % 28 == 0);
    assert_eq!(smart_resize(10, 2500, 28, 3136, 12_845_056), None, "aspect ratio above 200");
    assert_eq!(smart_resize(0, 20, 28, 3136, 12_845_056), None);
    assert_eq!(qwen().placeholders(640, 480), Some(391));
}

#[test]
fn each_pad_becomes_its_images_placeholders_in_order() {
    let small = png(56, 56, 2);
    let wide = png(640, 480, 6);
    let msgs = messages(json!([
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": data_url_of(&small)}},
        {"type": "image_url", "image_url": {"url": data_url_of(&wide)}, "uuid": "mine"},
    ]));
    let mut tokens = vec![1, PAD, 2, PAD, 3];
    let items = qwen().expand(&msgs, false, &mut tokens);
    assert_eq!(items.len(), 2);
    assert_eq!((items[0].offset, items[0].length), (1, 4));
    assert_eq!((items[1].offset, items[1].length), (6, 391));
    assert_eq!(tokens.len(), 3 + 4 + 391);
    assert_eq!(&tokens[..6], &[1, PAD, PAD, PAD, PAD, 2]);
    assert_eq!(tokens[tokens.len() - 1], 3);
    assert_eq!(items[1].identity, Identity::Given("mine".into()));
    // Another image of the same size is another item; options make both unknown.
    let Identity::Image(h) = &items[0].identity else { panic!("hashed") };
    assert_ne!(Identity::Image(h.clone()), Identity::Image(Box::new(ImageHash::new(&png(56, 56, 6), false))));
    let mut again = vec![1, PAD, 2, PAD, 3];
    let unknown = qwen().expand(&msgs, true, &mut again);
    assert!(unknown.iter().all(|i| i.identity == Identity::Unknown));
    assert_eq!(again, tokens, "options leave the placeholders as they are");
}

#[test]
fn an_image_whose_size_is_not_known_stops_the_expansion() {
    let msgs = messages(json!([
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": data_url_of(&png(56, 56, 2))}},
    ]));
    let mut tokens = vec![1, PAD, PAD, 2];
    let items = qwen().expand(&msgs, false, &mut tokens);
    assert_eq!(tokens, vec![1, PAD, PAD, 2]);
    assert_eq!(
        items.iter().map(|i| (i.offset, &i.identity)).collect::<Vec<_>>(),
        [(1, &Identity::Unknown), (2, &Identity::Unknown)]
    );
    // Pads the images do not account for (a template that dropped one, a pad in the text).
    let mut tokens = vec![1, PAD, 2];
    let two = messages(json!([
        {"type": "image_url", "image_url": {"url": data_url_of(&png(56, 56, 2))}},
        {"type": "image_url", "image_url": {"url": data_url_of(&png(56, 56, 2))}},
    ]));
    assert_eq!(
        qwen().expand(&two, false, &mut tokens),
        vec![MmItem { offset: 1, length: 0, identity: Identity::Unknown }]
    );
}

/// The keyed chain of `items` on an engine serving model "m".
fn keyed(hasher: &PageHasher, tokens: &[u32], items: &[MmItem]) -> Vec<router_types::BlockHash> {
    keyed_block_hashes(hasher, tokens, None, items, &identifiers(items, "m"))
}

#[test]
fn the_keyed_chain_folds_each_block_s_items_and_stops_at_an_unknown_one() {
    let hasher = PageHasher::new(std::num::NonZeroUsize::new(4).unwrap(), HashMode::Unigram);
    let tokens: Vec<u32> = (0..16).collect();
    let plain = hasher.block_hashes(&tokens, None).unwrap();
    assert_eq!(keyed(&hasher, &tokens, &[]), plain);
    let item = |offset, length, id: &str| MmItem { offset, length, identity: Identity::Given(id.into()) };
    // An item over positions 5..11: blocks 1 and 2 carry it (offsets 1 and -3); block 0 does not.
    let a = keyed(&hasher, &tokens, &[item(5, 6, "a")]);
    assert_eq!(a[0], plain[0]);
    assert!(a[1..].iter().zip(&plain[1..]).all(|(x, y)| x != y));
    assert_ne!(a, keyed(&hasher, &tokens, &[item(5, 6, "b")]));
    assert_ne!(a[1], keyed(&hasher, &tokens, &[item(6, 5, "a")])[1]);
    assert_eq!(
        page_keys(&[item(5, 6, "a")], &[Some("a".into())], 4, 8).unwrap().as_deref(),
        {
            let mut k = OpaqueKeys::default();
            k.tuple(&[Part::Str("a"), Part::Int(1)]);
            k.finish()
        }
        .as_deref()
    );
    let unknown = MmItem { offset: 9, length: 2, identity: Identity::Unknown };
    assert_eq!(keyed(&hasher, &tokens, &[item(5, 2, "a"), unknown]).len(), 2);
}

#[test]
fn only_qwen2_vl_processors_are_read() {
    let doc = |v: serde_json::Value| v.as_object().unwrap().clone();
    let q = VisionConfig::from_preprocessor(
        &doc(json!({"processor_class": "Qwen2_5_VLProcessor", "min_pixels": 100, "size": {"shortest_edge": 5, "longest_edge": 7}})),
        PAD,
    )
    .unwrap();
    assert_eq!((q.min_pixels, q.max_pixels, q.patch_size, q.merge_size), (100, 7, 14, 2));
    assert!(VisionConfig::from_preprocessor(&doc(json!({"processor_class": "Qwen3VLProcessor"})), PAD).is_none());
    assert!(
        VisionConfig::from_preprocessor(&doc(json!({"image_processor_type": "CLIPImageProcessor"})), PAD).is_none()
    );
    assert!(
        VisionConfig::from_preprocessor(&doc(json!({"image_processor_type": "Qwen2VLImageProcessorFast"})), PAD)
            .is_some()
    );
}

#[test]
fn many_large_images_in_a_few_bytes_each_do_not_expand_without_bound() {
    // Each header claims 3,600 by 3,600 pixels (16,384 placeholders); 100 of them would be 1.6 M.
    let big = data_url_of(&png(3600, 3600, 2));
    let parts: Vec<serde_json::Value> =
        (0..100).map(|_| json!({"type": "image_url", "image_url": {"url": big.clone()}})).collect();
    let msgs = messages(serde_json::Value::Array(parts));
    let mut tokens = vec![PAD; 100];
    let items = qwen().expand(&msgs, false, &mut tokens);
    assert!(tokens.len() <= MAX_EXPANDED_TOKENS, "{} tokens", tokens.len());
    let expanded = items.iter().take_while(|i| i.identity != Identity::Unknown).count();
    assert_eq!(expanded, MAX_EXPANDED_TOKENS / 16_384 - 1, "as many as fit, the rest not expanded");
    assert!(items[expanded..].iter().all(|i| i.identity == Identity::Unknown && i.length == 0));
    // Sizes past what a u64 product holds are refused or bounded, never an overflow.
    assert_eq!(qwen().placeholders(u32::MAX, u32::MAX), Some(16_384));
    assert!(smart_resize(u64::from(u32::MAX), u64::from(u32::MAX), 28, 0, u64::MAX).is_some());
}
