//! Generated token ids back into text as they come ([`Incremental`]): each
//! new id yields the text it completes, and the pieces of a whole sequence
//! concatenate to the tokenizer's `decode` of all of it. A piece is held
//! back while the text ends in a character not complete yet (a multi-byte
//! character split across byte-fallback tokens decodes to U+FFFD until its
//! last byte comes). A byte-level tokenizer's ids are appended as their bytes
//! ([`pieces`]); any other's are decoded in a window of context.

pub(crate) mod pieces;

use crate::{RenderError, TextTokenizer};

/// Tokens of context decoded before the new ones: enough for a decoder that
/// looks back (a leading space, a byte sequence), few enough to stay cheap.
const CONTEXT: usize = 6;
/// The window grows to this many tokens before it moves up: while it stays put, the text
/// before the new ids is the last decode's, so each id costs one decode, not two.
const WINDOW: usize = 24;

/// One sequence's detokenization state.
#[derive(Debug, Clone)]
pub struct Incremental {
    ids: Vec<u32>,
    /// Where the context decoded before the new text starts.
    prefix: usize,
    /// The ids whose text was given out end here.
    read: usize,
    /// The text given out so far.
    text: String,
    skip_special_tokens: bool,
    /// The decode of `ids[prefix..read]`, when known.
    before: Option<String>,
    /// A byte-level tokenizer's bytes not decided yet (an incomplete character).
    pending: Vec<u8>,
    /// Decode windows even for a byte-level tokenizer (the reference path, for tests).
    windowed: bool,
}

impl Incremental {
    /// A sequence with no ids yet; special tokens left out of the text when `skip_special_tokens`.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            ids: Vec::new(),
            prefix: 0,
            read: 0,
            text: String::new(),
            skip_special_tokens,
            before: None,
            pending: Vec::new(),
            windowed: false,
        }
    }

    /// The same, decoding windows of ids whatever the tokenizer (the reference path).
    pub fn windowed(skip_special_tokens: bool) -> Self {
        Self { windowed: true, ..Self::new(skip_special_tokens) }
    }

    /// The ids so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The text given out so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds `ids` and returns the text they complete (empty while a character is incomplete).
    pub fn push(&mut self, tok: &TextTokenizer, ids: &[u32]) -> Result<String, RenderError> {
        self.ids.extend_from_slice(ids);
        if let Some(table) = tok.byte_pieces().filter(|_| !self.windowed) {
            for id in ids {
                self.pending.extend_from_slice(table.get(*id, self.skip_special_tokens));
            }
            let piece = pieces::take_decided(&mut self.pending);
            self.read = self.ids.len();
            self.text.push_str(&piece);
            return Ok(piece);
        }
        let before = match self.before.take() {
            Some(b) => b,
            None => tok.decode(&self.ids[self.prefix..self.read], self.skip_special_tokens)?,
        };
        let now = tok.decode(&self.ids[self.prefix..], self.skip_special_tokens)?;
        if now.len() <= before.len() || now.ends_with('\u{FFFD}') || !now.starts_with(&before) {
            self.before = Some(before);
            return Ok(String::new());
        }
        let piece = now[before.len()..].to_owned();
        self.read = self.ids.len();
        if self.read - self.prefix > WINDOW {
            // The window moves up: the text before the next ids is decoded afresh then.
            self.prefix = self.read - CONTEXT;
        } else {
            self.before = Some(now);
        }
        self.text.push_str(&piece);
        Ok(piece)
    }

    /// The text still held back once the sequence has ended: with what was given out, the
    /// `decode` of the whole sequence. `None` when what was given out is not a prefix of it
    /// (a decoder whose text of a piece depends on what follows): nothing more can be said.
    pub fn finish(&mut self, tok: &TextTokenizer) -> Result<Option<String>, RenderError> {
        if tok.byte_pieces().is_some() && !self.windowed {
            // What is held is an incomplete character: `decode` reads it as U+FFFD.
            let rest = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            self.read = self.ids.len();
            self.text.push_str(&rest);
            return Ok(Some(rest));
        }
        let all = tok.decode(&self.ids, self.skip_special_tokens)?;
        self.read = self.ids.len();
        self.before = None;
        let Some(rest) = all.strip_prefix(self.text.as_str()).map(str::to_owned) else { return Ok(None) };
        self.text = all;
        Ok(Some(rest))
    }
}

#[cfg(test)]
mod tests;
