//! HF `tokenizers` with exact segment splitting, a segment cache and a fast
//! byte-level BPE path.
//!
//! HF tokenizers first split the text on added tokens that match the raw text
//! (`normalized: false`), then normalize each piece, split it on the added
//! tokens marked `normalized`, pre-tokenize and encode each piece on its own.
//! So the ids of a text are the concatenation of the ids of its pieces, and
//! the piece between two added tokens (a system prompt, an earlier turn) can
//! be cached by its text. We split where the tokenizer would (the same
//! leftmost-longest automaton over the same tokens, in the same two phases)
//! and only at tokens without `lstrip`/`rstrip`/`single_word`, whose
//! boundaries are exact; the second phase only when the normalizer is the
//! identity, so that raw and normalized text agree. A tokenizer whose
//! pre-tokenizer depends on a piece's position (Metaspace
//! `prepend_scheme: first`) is never split.
//!
//! Pieces are encoded by [`crate::fast_bpe`] when it supports the tokenizer,
//! else by `tokenizers` itself. `encode_uncached` is always `tokenizers` alone:
//! the reference every test compares against.

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::{AhoCorasick, MatchKind};
use lru::LruCache;

use crate::RenderError;
use crate::fast_bpe::{DEFAULT_WORD_CACHE_BYTES, FastBpe, Normalizer};

/// Default bound on the number of cached segments.
pub const DEFAULT_SEGMENT_CACHE_ENTRIES: usize = 16_384;
/// Default bound on the bytes held by the segment cache (each segment's text, its ids and
/// [`SEGMENT_ENTRY_BYTES`]).
pub const DEFAULT_SEGMENT_CACHE_BYTES: usize = 64 << 20;
/// What a cached segment costs beyond its text and ids: its LRU node, the two allocations'
/// headers.
pub const SEGMENT_ENTRY_BYTES: usize = 96;

/// The bounds of a tokenizer's two caches (the router's `--tokenizer-cache-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBounds {
    /// Segments (text between added tokens) the segment cache holds; 0 disables it.
    pub segment_entries: usize,
    /// Bytes the segment cache holds: text, ids and [`SEGMENT_ENTRY_BYTES`] per segment.
    pub segment_bytes: usize,
    /// Bytes the fast path's word cache holds (word, ids and an entry's overhead); 0 disables it.
    pub word_bytes: usize,
}

impl Default for CacheBounds {
    fn default() -> Self {
        Self {
            segment_entries: DEFAULT_SEGMENT_CACHE_ENTRIES,
            segment_bytes: DEFAULT_SEGMENT_CACHE_BYTES,
            word_bytes: DEFAULT_WORD_CACHE_BYTES,
        }
    }
}

/// A tokenizer plus what makes it fast: exact splitting, a segment cache, a fast BPE path.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    splitter: Option<Splitter>,
    fast: Option<FastBpe>,
    /// A byte-level tokenizer's ids as bytes, for detokenizing a token at a time: made when
    /// first asked (only a gRPC worker's answers are detokenized here).
    pieces: std::sync::OnceLock<Option<crate::detok::pieces::BytePieces>>,
    cache: Option<Mutex<SegmentCache>>,
    vocab_size: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Hit and miss counts of the segment cache, and what the caches hold now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Segments served from the cache.
    pub hits: u64,
    /// Segments tokenized.
    pub misses: u64,
    /// Segments the segment cache holds now.
    pub segment_entries: usize,
    /// Bytes the segment cache holds now, as its bound counts them (text, ids, entries).
    pub segment_bytes: usize,
    /// Bytes the fast path's word cache holds now (its budget's measure: word, ids and an
    /// entry's overhead).
    pub word_bytes: usize,
}

/// Finds the added tokens the tokenizer splits on before anything else.
#[derive(Debug)]
struct Splitter {
    /// Phase 1: tokens matched on the raw text.
    raw: Phase,
    /// Phase 2: tokens matched after normalization (identity normalizer only).
    normalized: Option<Phase>,
    /// True if every added token is covered by an exact split, so a piece
    /// between split points holds no added token at all.
    complete: bool,
}

#[derive(Debug)]
struct Phase {
    automaton: AhoCorasick,
    /// Per pattern: its id if a split there is exact, `None` if not.
    exact_ids: Vec<Option<u32>>,
}

#[derive(Debug)]
struct SegmentCache {
    map: LruCache<Box<str>, Arc<[u32]>, ahash::RandomState>,
    bytes: usize,
    max_bytes: usize,
    /// Digests of segments encoded once and not kept (TinyLFU's doorkeeper): a
    /// segment is kept the second time it is encoded, so text seen once (a
    /// prompt's unique part) never takes the room of text that comes back (a
    /// system prompt, a chat's earlier turns). Cleared when it holds as many
    /// digests as the cache has entries. A digest that collides only admits
    /// a segment early: hits are keyed by the whole text.
    seen: std::collections::HashSet<u64, ahash::RandomState>,
    seen_max: usize,
}

// === impl TextTokenizer ===

impl TextTokenizer {
    /// Loads `tokenizer.json` with the default caches.
    pub fn from_file(path: &Path) -> Result<Self, RenderError> {
        Self::from_file_with(path, CacheBounds::default())
    }

    /// Loads `tokenizer.json` with caches of the given bounds.
    pub fn from_file_with(path: &Path, bounds: CacheBounds) -> Result<Self, RenderError> {
        let bytes = std::fs::read(path).map_err(|e| RenderError::load(path, e))?;
        Self::from_bytes_with(&bytes, bounds).map_err(|e| match e {
            RenderError::Tokenizer(m) => RenderError::load(path, m),
            other => other,
        })
    }

    /// Parses a `tokenizer.json` document with the default caches.
    pub fn from_bytes(json: &[u8]) -> Result<Self, RenderError> {
        Self::from_bytes_with(json, CacheBounds::default())
    }

    /// Parses a `tokenizer.json` document with caches of the given bounds.
    pub fn from_bytes_with(json: &[u8], bounds: CacheBounds) -> Result<Self, RenderError> {
        let mut inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        // transformers applies truncation and padding itself, never the backend's defaults.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        let vocab_size = inner.get_vocab_size(true);
        let fast = FastBpe::new(&inner, bounds.word_bytes);
        let identity =
            fast.as_ref().is_some_and(|f| f.normalizer() == Normalizer::Identity) || inner.get_normalizer().is_none();
        let splitter = Splitter::new(&inner, identity);
        // The fast path must never see an added token: only behind a complete splitter,
        // or when the tokenizer has no added tokens at all.
        let fast = match &splitter {
            Some(s) if s.complete => fast,
            None if inner.get_added_tokens_decoder().is_empty() => fast,
            _ => None,
        };
        if fast.is_some() {
            // The fast path caches words in front of the model, within a byte budget; the
            // model's own cache (10,000 words of up to 256 characters, some 6 KiB each at
            // worst) would only hold the same words again.
            let mut model = inner.get_model().clone();
            model.resize_cache(0);
            inner.with_model(model);
        }
        let max_bytes = bounds.segment_bytes;
        let cache = NonZeroUsize::new(bounds.segment_entries).map(|cap| Mutex::new(SegmentCache::new(cap, max_bytes)));
        let pieces = std::sync::OnceLock::new();
        Ok(Self {
            inner,
            splitter,
            fast,
            pieces,
            cache,
            vocab_size,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Vocabulary size including added tokens: valid ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token's text, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// True when rendered text is split at added tokens and repeated segments are cached.
    pub fn segment_cache_enabled(&self) -> bool {
        self.splitter.is_some() && self.cache.is_some()
    }

    /// True when pieces are encoded by the fast byte-level BPE path.
    pub fn fast_path_enabled(&self) -> bool {
        self.fast.is_some()
    }

    /// Hit and miss counts so far.
    pub fn cache_stats(&self) -> CacheStats {
        let (segment_entries, segment_bytes) = self.cache.as_ref().map_or((0, 0), |c| {
            let c = lock(c);
            (c.map.len(), c.bytes)
        });
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            segment_entries,
            segment_bytes,
            word_bytes: self.fast.as_ref().map_or(0, FastBpe::cached_bytes),
        }
    }

    /// Encodes `text`. With `add_special_tokens = false` (rendered chats) the
    /// text is split at added tokens, pieces seen before come from the cache,
    /// and new pieces take the fast path when it applies.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, RenderError> {
        if add_special_tokens {
            return self.encode_uncached(text, true);
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        match &self.splitter {
            Some(splitter) => {
                let mut on_piece = |piece: Piece<'_>| match piece {
                    Piece::Token(id) => {
                        ids.push(id);
                        Ok(())
                    }
                    Piece::Text(segment) => self.push_segment(segment, &mut ids),
                };
                splitter.split(text, &mut on_piece)?;
            }
            None => self.encode_piece(text, &mut ids)?,
        }
        Ok(ids)
    }

    /// Encodes with the `tokenizers` pipeline alone: the reference path.
    pub fn encode_uncached(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, RenderError> {
        let enc =
            self.inner.encode_fast(text, add_special_tokens).map_err(|e| RenderError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// A byte-level tokenizer's ids as the bytes `decode` joins (`None`: another decoder).
    pub(crate) fn byte_pieces(&self) -> Option<&crate::detok::pieces::BytePieces> {
        self.pieces.get_or_init(|| crate::detok::pieces::BytePieces::of(&self.inner)).as_ref()
    }

    /// Turns ids back into text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, RenderError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| RenderError::Tokenizer(e.to_string()))
    }

    fn encode_piece(&self, piece: &str, ids: &mut Vec<u32>) -> Result<(), RenderError> {
        match &self.fast {
            Some(fast) => fast.encode(self.inner.get_model(), piece, ids),
            None => {
                ids.extend_from_slice(&self.encode_uncached(piece, false)?);
                Ok(())
            }
        }
    }

    fn push_segment(&self, segment: &str, ids: &mut Vec<u32>) -> Result<(), RenderError> {
        if segment.is_empty() {
            return Ok(());
        }
        let Some(cache) = &self.cache else {
            return self.encode_piece(segment, ids);
        };
        if let Some(hit) = lock(cache).map.get(segment).cloned() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            ids.extend_from_slice(&hit);
            return Ok(());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let start = ids.len();
        self.encode_piece(segment, ids)?;
        // Kept from its second miss on (the doorkeeper), admitted and inserted under one lock.
        let mut cache = lock(cache);
        if cache.admit(segment) {
            cache.insert(segment, ids[start..].into());
        }
        Ok(())
    }
}

fn lock(cache: &Mutex<SegmentCache>) -> std::sync::MutexGuard<'_, SegmentCache> {
    // A panic while holding the lock cannot leave the LRU inconsistent for readers.
    cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One piece of split text.
enum Piece<'a> {
    Text(&'a str),
    Token(u32),
}

// === impl Splitter ===

impl Splitter {
    /// `None` when no exact split exists for this tokenizer.
    fn new(tokenizer: &tokenizers::Tokenizer, identity_normalizer: bool) -> Option<Self> {
        if position_dependent(tokenizer) {
            return None;
        }
        let mut added: Vec<(u32, tokenizers::AddedToken)> = tokenizer.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        // Returns the phase for tokens of one kind, and whether all of them split exactly.
        let phase = |normalized: bool| {
            let mut patterns = Vec::new();
            let mut exact_ids = Vec::new();
            let mut all_exact = true;
            for (id, tok) in added.iter().filter(|(_, t)| t.normalized == normalized && !t.content.is_empty()) {
                let exact = !(tok.lstrip || tok.rstrip || tok.single_word);
                all_exact &= exact;
                // The tokenizer maps each content to one id; use the same one.
                let id = tokenizer.token_to_id(&tok.content).unwrap_or(*id);
                patterns.push(tok.content.clone());
                exact_ids.push(exact.then_some(id));
            }
            (Phase::new(patterns, exact_ids), all_exact)
        };
        let (raw, raw_exact) = phase(false);
        let (normalized, normalized_exact) = phase(true);
        let has_normalized = normalized.as_ref().is_some_and(|p| !p.exact_ids.is_empty());
        // Phase 2 at raw-text level is exact only if the normalizer changes nothing
        // and phase 1 has no stripping token whose piece boundaries we would blur.
        let normalized = if identity_normalizer && raw_exact && has_normalized { normalized } else { None };
        let complete = raw_exact && (!has_normalized || (normalized.is_some() && normalized_exact));
        let raw = raw?;
        if raw.exact_ids.iter().chain(normalized.iter().flat_map(|p| p.exact_ids.iter())).all(Option::is_none) {
            return None;
        }
        Some(Self { raw, normalized, complete })
    }

    /// Calls `each` for every text segment and exact added token, in order.
    fn split<'t>(
        &self,
        text: &'t str,
        each: &mut dyn FnMut(Piece<'t>) -> Result<(), RenderError>,
    ) -> Result<(), RenderError> {
        let inner =
            |segment: &'t str, each: &mut dyn FnMut(Piece<'t>) -> Result<(), RenderError>| match &self.normalized {
                Some(phase) => phase.split(segment, &mut |p| each(p)),
                None if segment.is_empty() => Ok(()),
                None => each(Piece::Text(segment)),
            };
        let mut start = 0;
        for m in self.raw.automaton.find_iter(text) {
            let Some(id) = self.raw.exact_ids[m.pattern().as_usize()] else {
                continue;
            };
            inner(&text[start..m.start()], each)?;
            each(Piece::Token(id))?;
            start = m.end();
        }
        inner(&text[start..], each)
    }
}

// === impl Phase ===

impl Phase {
    fn new(patterns: Vec<String>, exact_ids: Vec<Option<u32>>) -> Option<Self> {
        let automaton = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&patterns).ok()?;
        Some(Self { automaton, exact_ids })
    }

    fn split<'t>(
        &self,
        text: &'t str,
        each: &mut dyn FnMut(Piece<'t>) -> Result<(), RenderError>,
    ) -> Result<(), RenderError> {
        let mut start = 0;
        for m in self.automaton.find_iter(text) {
            let Some(id) = self.exact_ids[m.pattern().as_usize()] else {
                continue;
            };
            if start < m.start() {
                each(Piece::Text(&text[start..m.start()]))?;
            }
            each(Piece::Token(id))?;
            start = m.end();
        }
        if start < text.len() {
            each(Piece::Text(&text[start..]))?;
        }
        Ok(())
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
    fn new(entries: NonZeroUsize, max_bytes: usize) -> Self {
        let seen_max = entries.get();
        Self {
            map: LruCache::with_hasher(entries, ahash::RandomState::new()),
            bytes: 0,
            max_bytes,
            seen: std::collections::HashSet::with_hasher(ahash::RandomState::new()),
            seen_max,
        }
    }

    /// Whether a segment that missed is kept: the second time it is encoded (see `seen`).
    fn admit(&mut self, segment: &str) -> bool {
        let digest = self.seen.hasher().hash_one(segment);
        if self.seen.remove(&digest) {
            return true;
        }
        if self.seen.len() >= self.seen_max {
            self.seen.clear();
        }
        self.seen.insert(digest);
        false
    }

    /// What an entry costs as the bound counts it: its text, its ids and its overhead (with a
    /// byte-level vocabulary the ids are four times the text).
    fn cost(segment: &str, ids: &[u32]) -> usize {
        segment.len() + std::mem::size_of_val(ids) + SEGMENT_ENTRY_BYTES
    }

    fn insert(&mut self, segment: &str, ids: Arc<[u32]>) {
        let cost = Self::cost(segment, &ids);
        if cost > self.max_bytes / 4 {
            return; // one giant segment must not flush everything else
        }
        if let Some((old_key, old_ids)) = self.map.push(segment.into(), ids) {
            self.bytes -= Self::cost(&old_key, &old_ids);
        }
        self.bytes += cost;
        while self.bytes > self.max_bytes {
            match self.map.pop_lru() {
                Some((k, v)) => self.bytes -= Self::cost(&k, &v),
                None => break,
            }
        }
    }
}
