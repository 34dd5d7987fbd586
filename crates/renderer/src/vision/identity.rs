//! vLLM's identifier of an image (`MultiModalHasher.hash_kwargs`, blake3, its default): the
//! image's original bytes with the RGB conversion's settings when vLLM converted it, and the
//! engine's model id, each chunk framed by its length and each value tagged by its kind.
//!
//! ```text
//! hash_kwargs(model_id=M, image=I), keys sorted:
//!   framed("image") LEAF  framed("image") LEAF framed(bytes)                   plain RGB
//!                         framed("image") MAP 2 framed("io_config") MAP 2
//!                             framed("image_mode") LEAF framed("RGB")
//!                             framed("rgba_background_color") SEQ 3 (LEAF framed(i64le 255))×3
//!                           framed("data") LEAF framed(bytes)                   converted
//!   framed("model_id") LEAF framed(M)
//! framed(x) = u64le(len x) ‖ x;  LEAF 0x03, SEQ 0x01 u64le(n), MAP 0x02 u64le(n)
//! ```

const TAG_SEQUENCE: u8 = 0x01;
const TAG_MAPPING: u8 = 0x02;
const TAG_LEAF: u8 = 0x03;
/// vLLM's background for an image with transparency (`rgba_background_color`'s default).
const BACKGROUND: [i64; 3] = [255, 255, 255];

/// Who a multimodal item is to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The client's `uuid` for the item: vLLM's identifier as given.
    Given(String),
    /// vLLM's hash of the image, finished with the engine's model id ([`ImageHash::identifier`]).
    Image(Box<ImageHash>),
    /// Not known here (an image by URL, an encoding the router does not read, processor
    /// options): no block from the item's first on is credited.
    Unknown,
}

/// vLLM's hasher over one image, up to the model id.
#[derive(Clone)]
pub struct ImageHash(blake3::Hasher);

impl Identity {
    /// The names of the kinds of identity, by [`Identity::kind`] (`router_prompt_images_total`'s
    /// `identity` label).
    pub const KINDS: [&'static str; 3] = ["computed", "given", "unknown"];

    /// Its kind, an index of [`Identity::KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            Identity::Image(_) => 0,
            Identity::Given(_) => 1,
            Identity::Unknown => 2,
        }
    }

    /// The identifier vLLM gives the item on an engine serving `model_id` (`--model`).
    pub fn identifier(&self, model_id: &str) -> Option<String> {
        match self {
            Identity::Given(uuid) => Some(uuid.clone()),
            Identity::Image(h) => Some(h.identifier(model_id)),
            Identity::Unknown => None,
        }
    }
}

// === impl ImageHash ===

impl ImageHash {
    /// The hash of an image's original `bytes`; `plain_rgb`: vLLM kept the image as loaded
    /// (else it converted it to RGB and hashes the conversion's settings too).
    pub fn new(bytes: &[u8], plain_rgb: bool) -> Self {
        let mut h = blake3::Hasher::new();
        framed(&mut h, b"image");
        h.update(&[TAG_LEAF]);
        framed(&mut h, b"image");
        if plain_rgb {
            h.update(&[TAG_LEAF]);
        } else {
            container(&mut h, TAG_MAPPING, 2);
            framed(&mut h, b"io_config");
            container(&mut h, TAG_MAPPING, 2);
            framed(&mut h, b"image_mode");
            h.update(&[TAG_LEAF]);
            framed(&mut h, b"RGB");
            framed(&mut h, b"rgba_background_color");
            container(&mut h, TAG_SEQUENCE, BACKGROUND.len());
            for c in BACKGROUND {
                h.update(&[TAG_LEAF]);
                framed(&mut h, &c.to_le_bytes());
            }
            framed(&mut h, b"data");
            h.update(&[TAG_LEAF]);
        }
        framed(&mut h, bytes);
        Self(h)
    }

    /// vLLM's identifier (hex) on an engine serving `model_id`.
    pub fn identifier(&self, model_id: &str) -> String {
        let mut h = self.0.clone();
        framed(&mut h, b"model_id");
        h.update(&[TAG_LEAF]);
        framed(&mut h, model_id.as_bytes());
        h.finalize().to_hex().to_string()
    }
}

impl PartialEq for ImageHash {
    fn eq(&self, other: &Self) -> bool {
        self.0.finalize() == other.0.finalize()
    }
}

impl Eq for ImageHash {}

impl std::fmt::Debug for ImageHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageHash({})", self.0.finalize().to_hex())
    }
}

fn framed(h: &mut blake3::Hasher, chunk: &[u8]) {
    h.update(&(chunk.len() as u64).to_le_bytes());
    h.update(chunk);
}

fn container(h: &mut blake3::Hasher, tag: u8, len: usize) {
    h.update(&[tag]);
    h.update(&(len as u64).to_le_bytes());
}
