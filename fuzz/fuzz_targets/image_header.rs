//! An image's bytes through the router's vision path: the header reader (PNG, JPEG, GIF, WebP:
//! sizes, colour modes, EXIF orientation), vLLM's identifier, and the placeholder expansion of
//! a chat carrying the image as a data URL. Never a panic; a size read is never zero; the
//! expansion keeps the prompt's other tokens in order and gives the image exactly its
//! placeholder count, or leaves the prompt as it was when the size is not known.
#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use renderer::vision::{Identity, ImageHash, VisionConfig, header};

fuzz_target!(|data: &[u8]| {
    let read = header::read(data);
    if let Some(h) = read {
        assert!(h.width > 0 && h.height > 0);
        let _ = ImageHash::new(data, h.plain_rgb).identifier("m");
    }
    let vision = VisionConfig { image_pad: 9, patch_size: 14, merge_size: 2, min_pixels: 3136, max_pixels: 12_845_056 };
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(data));
    let message = serde_json::json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]});
    let messages = vec![message.as_object().expect("an object").clone()];
    let mut tokens = vec![1, 9, 2];
    let items = vision.expand(&messages, false, &mut tokens);
    assert_eq!(items.len(), 1);
    match read.and_then(|h| vision.placeholders(h.width, h.height)) {
        Some(count) => {
            assert_eq!((items[0].offset, items[0].length), (1, count));
            assert!(matches!(items[0].identity, Identity::Image(_)));
            assert_eq!(tokens.len(), count + 2);
            assert_eq!((tokens[0], tokens[count + 1]), (1, 2));
        }
        None => {
            assert_eq!(tokens, [1, 9, 2]);
            assert_eq!(items[0].identity, Identity::Unknown);
        }
    }
});
