//! Images in a chat, as a vLLM engine serving a Qwen2-VL or Qwen2.5-VL model sees them: owns the
//! model's image settings (`preprocessor_config.json`), the placeholder count of an image
//! (transformers' `smart_resize`, from the image's header), the expansion of the rendered
//! prompt's `<|image_pad|>` tokens, the items' identities ([`identity`]) and the request's page
//! hashes with each block's multimodal keys, as vLLM's events key the blocks.
//!
//! Images are read from `data:` URLs (PNG, JPEG, GIF, WebP); one by another URL (which the
//! router does not fetch), in another encoding, or with processor options, is [`Identity::Unknown`]:
//! the request is credited with the blocks before it only.

pub mod header;
pub mod identity;

use std::path::Path;

use base64::Engine as _;
use router_types::BlockHash;
use router_types::opaque::{OpaqueKeys, Part};
use serde_json::{Map, Value as Json};

pub use identity::{Identity, ImageHash};

use crate::hash::{PageDigest, PageHasher, keyed_digest};

/// Most tokens a prompt is expanded to (no model's context is longer): an image whose
/// placeholders would take the prompt past it is not expanded, so a request naming many large
/// images in a few header bytes each cannot make the router allocate without bound.
pub const MAX_EXPANDED_TOKENS: usize = 1 << 20;

/// The model's image settings (Qwen2-VL's image processor; transformers' defaults for what the
/// file leaves out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionConfig {
    /// The token the chat template puts once per image (`<|image_pad|>`).
    pub image_pad: u32,
    /// Pixels a patch is wide.
    pub patch_size: u32,
    /// Patches merged into one token, per side.
    pub merge_size: u32,
    /// Fewest pixels an image is resized to.
    pub min_pixels: u64,
    /// Most pixels an image is resized to.
    pub max_pixels: u64,
}

/// One image of a rendered prompt: where its placeholders are and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmItem {
    /// Its first placeholder's position in the prompt.
    pub offset: usize,
    /// Its placeholders (0 when not known: the prompt was not expanded from it on).
    pub length: usize,
    /// Its identity.
    pub identity: Identity,
}

// === impl VisionConfig ===

impl VisionConfig {
    /// The settings in `dir/preprocessor_config.json` for a Qwen2-VL or Qwen2.5-VL processor,
    /// with `image_pad` the tokenizer's `<|image_pad|>`; `None` for any other model (its images
    /// are not expanded: requests with images are credited up to the first one).
    pub fn load(dir: &Path, image_pad: Option<u32>) -> Option<Self> {
        let doc: Map<String, Json> =
            serde_json::from_slice(&std::fs::read(dir.join("preprocessor_config.json")).ok()?).ok()?;
        Self::from_preprocessor(&doc, image_pad?)
    }

    /// [`VisionConfig::load`] from the file's contents.
    pub fn from_preprocessor(doc: &Map<String, Json>, image_pad: u32) -> Option<Self> {
        let text = |k: &str| doc.get(k).and_then(Json::as_str);
        let qwen2 = match text("processor_class") {
            Some(p) => matches!(p, "Qwen2VLProcessor" | "Qwen2_5_VLProcessor"),
            None => text("image_processor_type").is_some_and(|t| t.starts_with("Qwen2VLImageProcessor")),
        };
        if !qwen2 {
            return None;
        }
        let num = |k: &str| doc.get(k).and_then(Json::as_u64);
        let size = |k: &str| doc.get("size").and_then(|s| s.get(k)).and_then(Json::as_u64);
        // transformers: `min_pixels` / `max_pixels` override `size`.
        let config = Self {
            image_pad,
            patch_size: u32::try_from(num("patch_size").unwrap_or(14)).ok()?,
            merge_size: u32::try_from(num("merge_size").unwrap_or(2)).ok()?,
            min_pixels: num("min_pixels").or_else(|| size("shortest_edge")).unwrap_or(56 * 56),
            max_pixels: num("max_pixels").or_else(|| size("longest_edge")).unwrap_or(28 * 28 * 1280),
        };
        (config.patch_size > 0 && config.merge_size > 0).then_some(config)
    }

    /// The placeholders of an image `width` by `height` pixels: its grid after
    /// `smart_resize`, over `merge_size²`; `None` when the processor refuses it (an aspect
    /// ratio above 200).
    pub fn placeholders(&self, width: u32, height: u32) -> Option<usize> {
        let factor = u64::from(self.patch_size) * u64::from(self.merge_size);
        let (h, w) = smart_resize(u64::from(height), u64::from(width), factor, self.min_pixels, self.max_pixels)?;
        let patch = u64::from(self.patch_size);
        let merge = u64::from(self.merge_size);
        usize::try_from((h / patch).checked_mul(w / patch)? / (merge * merge)).ok()
    }

    /// Expands `tokens` (a chat rendered with one `image_pad` per image) as vLLM does, each
    /// image's pad repeated as many times as the processor says, and returns the images.
    /// `messages` are the request's, whose image parts come in the order of the pads;
    /// `options`: the request carries processor or media options (identities not known).
    pub fn expand(&self, messages: &[Map<String, Json>], options: bool, tokens: &mut Vec<u32>) -> Vec<MmItem> {
        let parts: Vec<&Map<String, Json>> = messages
            .iter()
            .filter_map(|m| m.get("content")?.as_array())
            .flatten()
            .filter_map(Json::as_object)
            .filter(|p| matches!(p.get("type").and_then(Json::as_str), Some("image_url" | "input_image")))
            .collect();
        if parts.is_empty() {
            return Vec::new();
        }
        let pads = tokens.iter().filter(|t| **t == self.image_pad).count();
        if pads != parts.len() {
            // Not the prompt the engine makes: nothing from the first pad on is credited.
            let offset = tokens.iter().position(|t| *t == self.image_pad).unwrap_or(0);
            return vec![MmItem { offset, length: 0, identity: Identity::Unknown }];
        }
        let mut items = Vec::with_capacity(parts.len());
        let mut out = Vec::with_capacity(tokens.len());
        let mut next = parts.iter();
        let mut known = true;
        let mut room = MAX_EXPANDED_TOKENS.saturating_sub(tokens.len());
        for &t in tokens.iter() {
            if t != self.image_pad {
                out.push(t);
                continue;
            }
            let Some(&part) = next.next() else { break };
            let image = known.then(|| self.image(part, options)).flatten().filter(|(n, _)| *n <= room);
            match image {
                Some((length, identity)) => {
                    room -= length.saturating_sub(1);
                    items.push(MmItem { offset: out.len(), length, identity });
                    out.extend(std::iter::repeat_n(t, length));
                }
                None => {
                    // Its size is not known: neither is any position after it.
                    known = false;
                    items.push(MmItem { offset: out.len(), length: 0, identity: Identity::Unknown });
                    out.push(t);
                }
            }
        }
        *tokens = out;
        items
    }

    /// One image part's placeholder count and identity; `None` when its size is not known.
    fn image(&self, part: &Map<String, Json>, options: bool) -> Option<(usize, Identity)> {
        let url = match part.get("image_url") {
            Some(Json::Object(o)) => o.get("url").and_then(Json::as_str),
            Some(Json::String(s)) => Some(s.as_str()),
            _ => None,
        }?;
        let bytes = data_url(url)?;
        let header = header::read(&bytes)?;
        let length = self.placeholders(header.width, header.height)?;
        let identity = match part.get("uuid") {
            _ if options => Identity::Unknown,
            Some(Json::String(uuid)) => Identity::Given(uuid.clone()),
            Some(Json::Number(n)) => Identity::Given(n.to_string()),
            _ => Identity::Image(Box::new(ImageHash::new(&bytes, header.plain_rgb))),
        };
        Some((length, identity))
    }
}

/// The bytes of a base64 `data:` URL (vLLM's `load_base64`: strict standard alphabet).
fn data_url(url: &str) -> Option<Vec<u8>> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    if !meta.ends_with(";base64") {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

/// transformers' `smart_resize` (Qwen2-VL): both sides a multiple of `factor`, the area within
/// `[min_pixels, max_pixels]`, the aspect ratio kept as closely as may be. Python's `round`
/// rounds halves to even.
pub fn smart_resize(height: u64, width: u64, factor: u64, min_pixels: u64, max_pixels: u64) -> Option<(u64, u64)> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 || h.max(w) / h.min(w) > 200.0 {
        return None;
    }
    let mut h_bar = ((h / f).round_ties_even() as u64).saturating_mul(factor);
    let mut w_bar = ((w / f).round_ties_even() as u64).saturating_mul(factor);
    if h_bar.saturating_mul(w_bar) > max_pixels {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = factor.max(((h / beta / f).floor() as u64).saturating_mul(factor));
        w_bar = factor.max(((w / beta / f).floor() as u64).saturating_mul(factor));
    } else if h_bar.saturating_mul(w_bar) < min_pixels {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = ((h * beta / f).ceil() as u64).saturating_mul(factor);
        w_bar = ((w * beta / f).ceil() as u64).saturating_mul(factor);
    }
    Some((h_bar, w_bar))
}

/// The canonical extra keys (`router_types::opaque`) of the page `[start, end)`: each item it
/// holds a placeholder of, as `(identifier, offset of the item from the page's start)`, as
/// vLLM's `_gen_mm_extra_hash_keys` keys a block and its events publish the keys. `items` (in
/// prompt order) with their identifiers `ids`: `Some(None)` when the page holds none, `None`
/// when it holds one whose identifier is not known.
pub fn page_keys(items: &[MmItem], ids: &[Option<String>], start: usize, end: usize) -> Option<Option<Box<[u8]>>> {
    let mut keys = OpaqueKeys::default();
    for (item, id) in items.iter().zip(ids).take_while(|(i, _)| i.offset < end) {
        if item.offset + item.length.max(1) <= start {
            continue;
        }
        let offset = item.offset as i128 - start as i128;
        keys.tuple(&[Part::Str(id.as_deref()?), Part::Int(offset)]);
    }
    Some(keys.finish())
}

/// The identifier of each of `items` on an engine serving `model_id` (`None`: not known).
pub fn identifiers(items: &[MmItem], model_id: &str) -> Vec<Option<String>> {
    items.iter().map(|i| i.identity.identifier(model_id)).collect()
}

/// The block hashes of `tokens` chained from `prior` by `hasher`, each page holding an item's
/// placeholders folded with its keys ([`page_keys`], [`keyed_digest`]) as the router folds a
/// vLLM block's published keys; it ends before the first page holding an item whose
/// identifier is not known. `ids`: the items' [`identifiers`].
pub fn keyed_block_hashes(
    hasher: &PageHasher,
    tokens: &[u32],
    prior: Option<&PageDigest>,
    items: &[MmItem],
    ids: &[Option<String>],
) -> Vec<BlockHash> {
    let size = hasher.page_size();
    let mut out = Vec::with_capacity(hasher.page_count(tokens.len()));
    let mut state = prior.copied();
    // The first item not wholly before the page.
    let mut first = 0;
    for page in 0..hasher.page_count(tokens.len()) {
        let (start, end) = (page * size, ((page + 1) * size).min(tokens.len()));
        while items.get(first).is_some_and(|i| i.offset + i.length.max(1) <= start) {
            first += 1;
        }
        let Some(keys) = page_keys(&items[first..], &ids[first..], start, end) else { break };
        // u32 ids are never out of range: hashing them cannot fail.
        let Ok(mut digest) = hasher.page_digest(tokens, page, state.as_ref()) else { break };
        if let Some(keys) = keys {
            digest = keyed_digest(&digest, &keys);
        }
        out.push(BlockHash::from_digest(&digest));
        state = Some(digest);
    }
    out
}

#[cfg(test)]
mod tests;
