//! The engine's own count of the prompt tokens it found cached, read from its answer as the
//! answer passes (`usage.prompt_tokens_details.cached_tokens` on the OpenAI routes, SGLang's
//! `meta_info.cached_tokens` on `/generate`), against what the router predicted from the KV
//! index when it chose the worker; and the routing regret of each decision.
//!
//! The field is found by its key with the quote before it, which cannot occur inside a JSON
//! string (a quote there is escaped), so a prompt or an answer that mentions it is not read.
//! A stream's last report wins (its usage chunk comes last).

use std::sync::atomic::{AtomicU64, Ordering};

use router_types::metrics::{Histogram, LabeledCounter, head};

const KEY: &[u8] = b"\"cached_tokens\":";
/// The key's searcher, built once (building one took a measurable share of a relayed
/// answer's CPU when each chunk built its own).
static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
/// Bytes kept from one chunk for the next: the key and a number split between two chunks.
const CARRY: usize = 48;
/// The most digits read (a count past this is not a token count).
const MAX_DIGITS: usize = 12;

/// Reads the last `cached_tokens` an answer reports.
#[derive(Debug, Default)]
pub(crate) struct CachedScan {
    /// The end of the previous chunk (a key or number may straddle two chunks).
    carry: Vec<u8>,
    /// The last count read.
    last: Option<u64>,
}

impl CachedScan {
    /// Reads the next chunk of the answer.
    pub(crate) fn push(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        // The carry and the chunk's head searched together (a key or a number that straddles
        // them), then the chunk in place.
        let seam = self.carry.len();
        if seam > 0 {
            self.carry.extend_from_slice(&data[..data.len().min(CARRY)]);
            let joined = std::mem::take(&mut self.carry);
            self.scan(&joined, seam);
            self.carry = joined;
        }
        self.scan(data, 0);
        // The carry becomes the stream's last CARRY bytes.
        if seam == 0 || data.len() >= CARRY {
            self.carry.clear();
            self.carry.extend_from_slice(&data[data.len() - data.len().min(CARRY)..]);
        } else if self.carry.len() > CARRY {
            self.carry.drain(..self.carry.len() - CARRY);
        }
    }

    /// Reads every key in `buf` whose number ends at or after `seam` (one that ended before
    /// it was read with the previous chunk) and not at the buffer's end (it may go on).
    fn scan(&mut self, buf: &[u8], seam: usize) {
        for at in FINDER.find_iter(buf) {
            let number = at + KEY.len();
            let rest = &buf[number..];
            let start = rest.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(rest.len());
            let digits = rest[start..].iter().take_while(|b| b.is_ascii_digit()).count();
            let end = number + start + digits;
            if digits == 0 || digits > MAX_DIGITS || end == buf.len() || end < seam {
                continue;
            }
            let n = rest[start..start + digits].iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            self.last = Some(n);
        }
    }

    /// The last count the answer reported, if it reported one.
    pub(crate) fn reported(&self) -> Option<u64> {
        self.last
    }
}

/// Regret buckets, in blocks: none, a few pages, a long prefix.
const REGRET_BUCKETS: [f64; 10] = [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0, 8192.0];

/// What is counted of the decisions' regret and the engines' reported cache hits.
#[derive(Debug)]
pub struct CacheMetrics {
    /// Per decision, blocks the best eligible worker held more than the chosen one.
    pub regret_blocks: Histogram,
    /// Prompt tokens lost, by cause.
    pub regret_tokens: LabeledCounter,
    /// Prompt tokens the best eligible worker held, summed over decisions.
    pub reachable_tokens: AtomicU64,
    /// Prompt tokens the chosen worker held, summed over decisions.
    pub chosen_tokens: AtomicU64,
    /// Over answers that reported their cached tokens: the router's prediction and the report.
    pub predicted: AtomicU64,
    pub observed: AtomicU64,
    /// Answers that reported cached tokens, and those that did not.
    pub reported: AtomicU64,
    pub unreported: AtomicU64,
}

impl Default for CacheMetrics {
    fn default() -> Self {
        CacheMetrics {
            regret_blocks: Histogram::new(&REGRET_BUCKETS),
            regret_tokens: LabeledCounter::default(),
            reachable_tokens: AtomicU64::new(0),
            chosen_tokens: AtomicU64::new(0),
            predicted: AtomicU64::new(0),
            observed: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            unreported: AtomicU64::new(0),
        }
    }
}

impl CacheMetrics {
    /// One decision's regret.
    pub(crate) fn decided(&self, r: &planner::Regret) {
        self.regret_blocks.observe(r.blocks() as f64);
        self.reachable_tokens.fetch_add(r.tokens(r.reachable), Ordering::Relaxed);
        self.chosen_tokens.fetch_add(r.tokens(r.chosen), Ordering::Relaxed);
        if r.blocks() == 0 {
            return;
        }
        for (cause, blocks) in r.blocks_by_cause() {
            if blocks > 0 {
                let tokens = r.tokens(blocks);
                self.regret_tokens.add(format_args!("cause=\"{}\"", cause.label()), tokens);
            }
        }
    }

    /// An answer ended whole: what its worker reported cached, against `predicted`.
    pub(crate) fn answered(&self, predicted: u64, reported: Option<u64>) {
        let Some(observed) = reported else {
            self.unreported.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.reported.fetch_add(1, Ordering::Relaxed);
        self.predicted.fetch_add(predicted, Ordering::Relaxed);
        self.observed.fetch_add(observed, Ordering::Relaxed);
    }

    /// Its series in the Prometheus text format.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.regret_blocks.render(
            out,
            "router_routing_regret_blocks",
            "Per decision, KV blocks of the prompt the best eligible worker held more than the chosen one.",
        );
        self.regret_tokens.render(
            out,
            "router_routing_regret_tokens_total",
            "Prompt tokens a better placement would have found cached, by what they were lost to \
             (load_balance, guard: a liveness veto or the warm-up slice, policy).",
        );
        head(
            out,
            "router_routing_prefix_tokens_total",
            "counter",
            "Prompt tokens held by the best eligible worker (reachable) and by the chosen one (chosen).",
        );
        let _ =
            writeln!(out, "router_routing_prefix_tokens_total{{held=\"reachable\"}} {}", load(&self.reachable_tokens));
        let _ = writeln!(out, "router_routing_prefix_tokens_total{{held=\"chosen\"}} {}", load(&self.chosen_tokens));
        head(
            out,
            "router_cached_tokens_total",
            "counter",
            "Over answers whose worker reported its cached prompt tokens: the router's prediction \
             (predicted) and the report (observed).",
        );
        let _ = writeln!(out, "router_cached_tokens_total{{source=\"predicted\"}} {}", load(&self.predicted));
        let _ = writeln!(out, "router_cached_tokens_total{{source=\"observed\"}} {}", load(&self.observed));
        head(
            out,
            "router_cached_tokens_answers_total",
            "counter",
            "Whole answers by whether their worker reported its cached prompt tokens.",
        );
        let _ = writeln!(out, "router_cached_tokens_answers_total{{reported=\"true\"}} {}", load(&self.reported));
        let _ = writeln!(out, "router_cached_tokens_answers_total{{reported=\"false\"}} {}", load(&self.unreported));
    }
}

#[cfg(test)]
mod tests {
    use super::CachedScan;

    fn scan(chunks: &[&[u8]]) -> Option<u64> {
        let mut s = CachedScan::default();
        for c in chunks {
            s.push(c);
        }
        s.reported()
    }

    #[test]
    fn the_last_report_is_read_across_chunk_boundaries() {
        let whole = br#"{"usage":{"prompt_tokens":900,"prompt_tokens_details":{"cached_tokens": 832}}}"#;
        assert_eq!(scan(&[whole]), Some(832));
        // Every split point: the key or the number straddling two chunks.
        for at in 1..whole.len() {
            assert_eq!(scan(&[&whole[..at], &whole[at..]]), Some(832), "split at {at}");
        }
        // One byte at a time (the carry spans many chunks).
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(scan(&bytes), Some(832));
        // A stream: the last usage chunk wins; SGLang's /generate field.
        let sse: &[&[u8]] =
            &[b"data: {\"usage\":{\"cached_tokens\":1}}\n\n", b"data: {\"meta_info\":{\"cached_tokens\":64}}\n\n"];
        assert_eq!(scan(sse), Some(64));
    }

    #[test]
    fn a_mention_in_text_or_a_missing_report_reads_nothing() {
        assert_eq!(scan(&[br#"{"content":"say \"cached_tokens\": 5"}"#]), None, "inside a string the quote is escaped");
        assert_eq!(scan(&[br#"{"usage":{"prompt_tokens_details":null}}"#]), None);
        assert_eq!(scan(&[br#"{"cached_tokens":null}"#]), None);
        assert_eq!(scan(&[br#"{"cached_tokens":99999999999999999999}"#]), None, "not a token count");
        assert_eq!(scan(&[b"{\"cached_tokens\":12"]), None, "the number may go on");
    }
}
