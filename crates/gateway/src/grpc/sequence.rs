//! One generated sequence as it comes back from the engine: its token ids
//! detokenized as they come ([`renderer::detok::Incremental`]), the stop
//! strings found across pieces and cut (the stop text never goes out unless
//! `no_stop_trim`), its logprobs, and how it finished.

use engine_grpc::proto::{GenerateComplete, MatchedStop, OutputLogProbs};
use renderer::TextTokenizer;
use renderer::detok::Incremental;

/// How a sequence ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Finish {
    /// A stop string (the router's or the engine's), a stop token or the end of sequence.
    Stop(Option<MatchedStop>),
    /// `max_tokens` reached.
    Length,
    /// The engine aborted it.
    Abort,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Finish::Stop(_) => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
        }
    }
}

/// One token's logprob and the top alternatives at its position.
#[derive(Debug, Clone)]
pub(crate) struct TokenLogprob {
    pub(crate) id: u32,
    pub(crate) logprob: f32,
    pub(crate) top: Vec<(u32, f32)>,
}

/// A sequence's state.
#[derive(Debug)]
pub(crate) struct Sequence {
    detok: Incremental,
    /// Text detokenized but held back: it may be the start of a stop string.
    held: String,
    /// The text given out.
    out: String,
    /// Its tokens so far (completion tokens).
    pub(crate) tokens: u32,
    pub(crate) finish: Option<Finish>,
    /// Whether its first piece went out (a chat's first delta carries the role).
    pub(crate) started: bool,
    /// The logprobs not yet given out.
    pub(crate) logprobs: Vec<TokenLogprob>,
}

impl Sequence {
    pub(crate) fn new(skip_special_tokens: bool) -> Self {
        Self {
            detok: Incremental::new(skip_special_tokens),
            held: String::new(),
            out: String::new(),
            tokens: 0,
            finish: None,
            started: false,
            logprobs: Vec::new(),
        }
    }

    /// Its token ids so far.
    pub(crate) fn ids(&self) -> &[u32] {
        self.detok.ids()
    }

    /// The text given out so far.
    pub(crate) fn text(&self) -> &str {
        &self.out
    }

    /// Adds generated `ids` (with their logprobs, when asked); returns the text that may go out.
    /// After a stop string, nothing more is taken.
    pub(crate) fn push(
        &mut self,
        tok: &TextTokenizer,
        ids: &[u32],
        logprobs: Option<&OutputLogProbs>,
        (stops, no_stop_trim): (&[String], bool),
    ) -> String {
        if self.finish.is_some() {
            return String::new();
        }
        self.tokens += ids.len() as u32;
        if let Some(lp) = logprobs {
            self.logprobs.extend(token_logprobs(lp));
        }
        let piece = self.detok.push(tok, ids).unwrap_or_default();
        let out = self.cut(&piece, stops, no_stop_trim, false);
        self.out.push_str(&out);
        out
    }

    /// The engine ended the sequence: the text held back, and how it finished (a stop string
    /// found here first wins over the engine's reason).
    pub(crate) fn complete(
        &mut self,
        tok: &TextTokenizer,
        c: &GenerateComplete,
        (stops, no_stop_trim): (&[String], bool),
    ) -> String {
        if self.finish.is_some() {
            return String::new();
        }
        let rest = self.detok.finish(tok).ok().flatten().unwrap_or_default();
        let out = self.cut(&rest, stops, no_stop_trim, true);
        self.out.push_str(&out);
        if self.finish.is_none() {
            self.finish = Some(match c.finish_reason.as_str() {
                "length" => Finish::Length,
                "abort" => Finish::Abort,
                _ => Finish::Stop(c.matched_stop.clone()),
            });
            self.tokens = self.tokens.max(c.completion_tokens);
        }
        out
    }

    /// `piece` appended to what is held; returns what may go out: up to a stop string found
    /// (and the stop itself with `no_stop_trim`), else all but the tail a stop string could
    /// still begin with (all of it at the `end`).
    fn cut(&mut self, piece: &str, stops: &[String], no_stop_trim: bool, end: bool) -> String {
        self.held.push_str(piece);
        let found = stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = found {
            let upto = if no_stop_trim { at + stop.len() } else { at };
            let out = self.held[..upto].to_owned();
            self.held.clear();
            self.finish = Some(Finish::Stop(Some(MatchedStop::Text(stop.clone()))));
            return out;
        }
        let keep = if end { 0 } else { stops.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0) };
        let mut from = self.held.len().saturating_sub(keep);
        while !self.held.is_char_boundary(from) {
            from -= 1;
        }
        let rest = self.held.split_off(from);
        std::mem::replace(&mut self.held, rest)
    }
}

/// The logprobs of an answer's tokens, with the top alternatives at each position.
fn token_logprobs(lp: &OutputLogProbs) -> impl Iterator<Item = TokenLogprob> + '_ {
    lp.token_ids.iter().zip(&lp.token_logprobs).enumerate().map(|(i, (id, logprob))| TokenLogprob {
        id: *id,
        logprob: *logprob,
        top: lp
            .top_logprobs
            .get(i)
            .map(|t| t.token_ids.iter().copied().zip(t.values.iter().copied()).collect())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> TextTokenizer {
        let json = renderer::builtin_tokenizer_json();
        TextTokenizer::from_bytes(json.as_bytes()).unwrap()
    }

    /// Feeds `text` one token at a time, then completes: what went out, and how it finished.
    fn run(text: &str, stops: &[&str], no_stop_trim: bool) -> (String, Option<Finish>) {
        let tok = tok();
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut seq = Sequence::new(true);
        let mut out = String::new();
        for id in tok.encode(text, false).unwrap() {
            out.push_str(&seq.push(&tok, &[id], None, (&stops, no_stop_trim)));
        }
        let c = GenerateComplete { finish_reason: "length".into(), ..Default::default() };
        out.push_str(&seq.complete(&tok, &c, (&stops, no_stop_trim)));
        (out, seq.finish)
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_cut_and_never_leaks() {
        let (out, finish) = run("the cache is warm and routing works.", &["routing"], false);
        assert_eq!(out, "the cache is warm and ");
        assert_eq!(finish, Some(Finish::Stop(Some(MatchedStop::Text("routing".into())))));
        // The earliest of several wins; kept with no_stop_trim.
        let (out, _) = run("the cache is warm and routing works.", &["works", "warm"], true);
        assert_eq!(out, "the cache is warm");
    }

    #[test]
    fn without_a_stop_everything_goes_out_and_the_engine_says_how_it_ended() {
        let (out, finish) = run("héllo wörld 🚀", &["zzz"], false);
        assert_eq!(out, "héllo wörld 🚀");
        assert_eq!(finish, Some(Finish::Length));
        // A text that ends with the start of a stop string: held, then given out at the end.
        let (out, _) = run("the cache is wa", &["warm"], false);
        assert_eq!(out, "the cache is wa");
    }
}
