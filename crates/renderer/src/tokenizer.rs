//! HF `tokenizers` with an exact segment cache.
//!
//! HF tokenizers first split the text on added tokens that match the raw text
//! (`normalized: false`), then normalize, pre-tokenize and encode each piece
//! on its own. So the ids of a text are the concatenation of the ids of its
//! pieces, and the piece between two added tokens (a system prompt, an earlier
//! turn) can be cached by its text. We split where the tokenizer would (same
//! leftmost-longest automaton over the same tokens) and only at tokens without
//! `lstrip`/`rstrip`/`single_word`, whose boundaries are exact. A tokenizer
//! whose pre-tokenizer depends on a piece's position (Metaspace
//! `prepend_scheme: first`) is never split.
//!
//! Owns: loading, encoding (cached and not), decoding, vocabulary checks.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::{AhoCorasick, MatchKind};
use lru::LruCache;

use crate::RenderError;

/// Default bound on the number of cached segments.
pub const DEFAULT_SEGMENT_CACHE_ENTRIES: usize = 16_384;
/// Default bound on the text bytes held by the segment cache.
pub const DEFAULT_SEGMENT_CACHE_BYTES: usize = 64 << 20;

/// A tokenizer plus the segment cache that makes repeated prefixes nearly free.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    splitter: Option<Splitter>,
    cache: Mutex<SegmentCache>,
    vocab_size: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Hit and miss counts of the segment cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Segments served from the cache.
    pub hits: u64,
    /// Segments tokenized.
    pub misses: u64,
}

/// Finds the added tokens the tokenizer splits on before anything else.
#[derive(Debug)]
struct Splitter {
    automaton: AhoCorasick,
    /// Per pattern: its id if a split there is exact, `None` if not.
    exact_ids: Vec<Option<u32>>,
}

#[derive(Debug)]
struct SegmentCache {
    map: LruCache<Box<str>, Arc<[u32]>>,
    bytes: usize,
    max_bytes: usize,
}

// === impl TextTokenizer ===

impl TextTokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, RenderError> {
        let bytes = std::fs::read(path).map_err(|e| RenderError::load(path, e))?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            RenderError::Tokenizer(m) => RenderError::load(path, m),
            other => other,
        })
    }

    /// Parses a `tokenizer.json` document.
    pub fn from_bytes(json: &[u8]) -> Result<Self, RenderError> {
        let mut inner = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        // transformers applies truncation and padding itself, never the backend's defaults.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        Ok(Self::with_tokenizer(
            inner,
            DEFAULT_SEGMENT_CACHE_ENTRIES,
            DEFAULT_SEGMENT_CACHE_BYTES,
        ))
    }

    /// Wraps a tokenizer with a segment cache of the given bounds (0 entries disables it).
    pub fn with_tokenizer(
        inner: tokenizers::Tokenizer,
        max_entries: usize,
        max_bytes: usize,
    ) -> Self {
        let vocab_size = inner.get_vocab_size(true);
        let splitter = match NonZeroUsize::new(max_entries) {
            Some(_) => Splitter::new(&inner),
            None => None,
        };
        let cap = NonZeroUsize::new(max_entries).unwrap_or(NonZeroUsize::MIN);
        Self {
            inner,
            splitter,
            cache: Mutex::new(SegmentCache {
                map: LruCache::new(cap),
                bytes: 0,
                max_bytes,
            }),
            vocab_size,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Vocabulary size including added tokens: valid ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token's text, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// True when repeated segments are served from the cache.
    pub fn segment_cache_enabled(&self) -> bool {
        self.splitter.is_some()
    }

    /// Hit and miss counts so far.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Encodes `text`; with `add_special_tokens = false` (rendered chats) pieces
    /// between added tokens come from the cache when seen before.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, RenderError> {
        match (&self.splitter, add_special_tokens) {
            (Some(splitter), false) => self.encode_segmented(splitter, text),
            _ => self.encode_uncached(text, add_special_tokens),
        }
    }

    /// Encodes with the tokenizer alone, no cache: the reference path.
    pub fn encode_uncached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, RenderError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Turns ids back into text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, RenderError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))
    }

    fn encode_segmented(&self, splitter: &Splitter, text: &str) -> Result<Vec<u32>, RenderError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        let mut start = 0;
        for m in splitter.automaton.find_iter(text) {
            let Some(id) = splitter.exact_ids[m.pattern().as_usize()] else {
                continue;
            };
            self.push_segment(&text[start..m.start()], &mut ids)?;
            ids.push(id);
            start = m.end();
        }
        self.push_segment(&text[start..], &mut ids)?;
        Ok(ids)
    }

    fn push_segment(&self, segment: &str, ids: &mut Vec<u32>) -> Result<(), RenderError> {
        if segment.is_empty() {
            return Ok(());
        }
        if let Some(hit) = self.lock_cache().map.get(segment).cloned() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            ids.extend_from_slice(&hit);
            return Ok(());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let encoded: Arc<[u32]> = self.encode_uncached(segment, false)?.into();
        ids.extend_from_slice(&encoded);
        self.lock_cache().insert(segment, encoded);
        Ok(())
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, SegmentCache> {
        // A panic while holding the lock cannot leave the LRU inconsistent for readers.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// === impl Splitter ===

impl Splitter {
    /// `None` when no exact split exists for this tokenizer.
    fn new(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if position_dependent(tokenizer) {
            return None;
        }
        let mut patterns = Vec::new();
        let mut exact_ids = Vec::new();
        let mut added: Vec<(u32, tokenizers::AddedToken)> =
            tokenizer.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        for (id, tok) in added {
            if tok.normalized || tok.content.is_empty() {
                continue;
            }
            let exact = !(tok.lstrip || tok.rstrip || tok.single_word);
            // The tokenizer maps each content to one id; use the same one.
            let id = tokenizer.token_to_id(&tok.content).unwrap_or(id);
            patterns.push(tok.content);
            exact_ids.push(exact.then_some(id));
        }
        if !exact_ids.iter().any(Option::is_some) {
            return None;
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok()?;
        Some(Self {
            automaton,
            exact_ids,
        })
    }
}

/// True if encoding a piece depends on where it sits in the text.
fn position_dependent(tokenizer: &tokenizers::Tokenizer) -> bool {
    let Some(pre) = tokenizer.get_pre_tokenizer() else {
        return false;
    };
    match serde_json::to_string(pre) {
        Ok(json) => json.contains("\"prepend_scheme\":\"first\""),
        Err(_) => true,
    }
}

// === impl SegmentCache ===

impl SegmentCache {
    fn insert(&mut self, segment: &str, ids: Arc<[u32]>) {
        if segment.len() > self.max_bytes / 4 {
            return; // one giant segment must not flush everything else
        }
        if let Some((old_key, _)) = self.map.push(segment.into(), ids) {
            if &*old_key != segment {
                self.bytes -= old_key.len();
            } else {
                return;
            }
        }
        self.bytes += segment.len();
        while self.bytes > self.max_bytes {
            match self.map.pop_lru() {
                Some((k, _)) => self.bytes -= k.len(),
                None => break,
            }
        }
    }
}
