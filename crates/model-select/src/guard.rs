//! The `response_guard` plugin's reading of an answer that comes in pieces (a
//! stream's tokens): PII found in each text lane (a choice's content, its
//! reasoning, an Anthropic block) over a bounded look-behind, so a value
//! split over many tokens is found whole; text is released only once it is
//! that far behind the newest (or the lane ends), never in the middle of a
//! finding, and redacted with placeholders numbered over the whole answer.
//! No I/O: the gateway feeds it the texts and writes what it releases.

use crate::pii::{PiiDetector, PiiType};
use crate::redact::{Placeholders, Redactions};

/// One answer's guard: its types, its look-behind and its placeholders.
#[derive(Debug, Clone)]
pub struct StreamGuard {
    types: Vec<PiiType>,
    look_behind: usize,
    redact: bool,
    numbers: Placeholders,
}

/// One text lane of an answer: what is held back, and the released text just before it (the
/// context the patterns see, never released twice).
#[derive(Debug, Clone, Default)]
pub struct Lane {
    held: String,
    before: String,
}

impl StreamGuard {
    /// Looks for `types` (none: PII is not looked for), holding `look_behind` bytes of each lane
    /// back; released text is redacted when `redact`, else released as it came.
    pub fn new(types: Vec<PiiType>, look_behind: usize, redact: bool) -> Self {
        StreamGuard { types, look_behind: look_behind.max(1), redact, numbers: Placeholders::default() }
    }

    /// `text` comes on `lane`: returns what may go out now.
    pub fn push(&mut self, detector: &PiiDetector, lane: &mut Lane, text: &str) -> String {
        lane.held.push_str(text);
        self.release(detector, lane, false)
    }

    /// `lane` ended: returns the rest of it.
    pub fn finish(&mut self, detector: &PiiDetector, lane: &mut Lane) -> String {
        self.release(detector, lane, true)
    }

    /// Values found so far (in released text), by type.
    pub fn found(&self) -> Redactions {
        self.numbers.redactions()
    }

    fn release(&mut self, detector: &PiiDetector, lane: &mut Lane, end: bool) -> String {
        if self.types.is_empty() {
            return std::mem::take(&mut lane.held);
        }
        let context = lane.before.len();
        let mut scan = std::mem::take(&mut lane.before);
        scan.push_str(&lane.held);
        let findings = detector.detect(&scan, &self.types);
        let mut cut = if end { scan.len() } else { floor(&scan, scan.len().saturating_sub(self.look_behind)) };
        cut = cut.max(context);
        // Never in the middle of a finding: it waits whole (findings do not overlap).
        if let Some(f) = findings.iter().find(|f| f.span.start < cut && f.span.end > cut && f.span.start >= context) {
            cut = f.span.start;
        }
        let mut out = String::with_capacity(cut - context);
        let mut at = context;
        // Findings that start in the context were judged when it was released.
        for f in findings.iter().filter(|f| f.span.start >= context && f.span.end <= cut) {
            let placeholder = self.numbers.of(f.kind, &scan[f.span.clone()]);
            if self.redact {
                out.push_str(&scan[at..f.span.start]);
                out.push_str(&placeholder);
                at = f.span.end;
            }
        }
        out.push_str(&scan[at..cut]);
        lane.held = scan[cut..].to_owned();
        let keep = floor(&scan, cut.saturating_sub(self.look_behind));
        scan.truncate(cut);
        lane.before = scan.split_off(keep);
        out
    }
}

/// The char boundary at or before `at`.
fn floor(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<PiiType> {
        PiiType::ALL.to_vec()
    }

    /// `text` pushed in pieces of `size` bytes (on char boundaries), then finished: the whole
    /// output and the released pieces.
    fn streamed(guard: &mut StreamGuard, text: &str, size: usize) -> (String, Vec<String>) {
        let d = PiiDetector::new();
        let mut lane = Lane::default();
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + size).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(guard.push(&d, &mut lane, &text[at..end]));
            assert!(lane.held.len() <= 64 + size + 40, "the look-behind bounds what is held");
            at = end;
        }
        pieces.push(guard.finish(&d, &mut lane));
        (pieces.concat(), pieces)
    }

    #[test]
    fn values_split_over_tokens_are_redacted_whole_with_one_placeholder_per_value() {
        let text = "Write to jane.doe@example.com or call +1 415 555 0100. Again: jane.doe@example.com, \
                    and the card 4111 1111 1111 1111 is on file. That is all there is to it, thanks.";
        for size in [1, 2, 3, 5, 8, 200] {
            let mut g = StreamGuard::new(all(), 64, true);
            let (out, _) = streamed(&mut g, text, size);
            assert_eq!(
                out,
                "Write to [EMAIL_1] or call [PHONE_1]. Again: [EMAIL_1], and the card [CREDIT_CARD_1] is on file. \
                 That is all there is to it, thanks.",
                "pieces of {size}"
            );
            let found = g.found().counts;
            assert_eq!(found, [(PiiType::Email, 2), (PiiType::Phone, 1), (PiiType::CreditCard, 1)], "pieces of {size}");
        }
    }

    #[test]
    fn without_redaction_text_passes_unchanged_and_findings_are_counted() {
        let text = "mail a@example.org now, ".repeat(3) + "done";
        let mut g = StreamGuard::new(all(), 32, false);
        let (out, _) = streamed(&mut g, &text, 3);
        assert_eq!(out, text);
        assert_eq!(g.found().counts, [(PiiType::Email, 3)]);
    }

    #[test]
    fn text_goes_out_once_it_is_the_look_behind_behind_and_all_of_it_at_the_end() {
        let text = "word ".repeat(40);
        let mut g = StreamGuard::new(all(), 20, true);
        let (out, pieces) = streamed(&mut g, &text, 5);
        assert_eq!(out, text);
        // Nothing before 20 bytes came; then every 5-byte piece releases 5 bytes.
        assert!(pieces[..4].iter().all(String::is_empty), "{pieces:?}");
        assert_eq!(pieces[4], "word ");
        assert_eq!(pieces.last().unwrap().len(), 20, "the end releases what was held");
        // Without types nothing is held.
        let mut g = StreamGuard::new(Vec::new(), 20, true);
        let (_, pieces) = streamed(&mut g, "a@b.io and more", 2);
        assert_eq!(pieces[0], "a@");
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries_only() {
        let text = "é".repeat(50) + " — call +44 20 7946 0958 — " + &"日本".repeat(30);
        for size in [1, 2, 7] {
            let mut g = StreamGuard::new(all(), 16, true);
            let (out, _) = streamed(&mut g, &text, size);
            assert_eq!(out, "é".repeat(50) + " — call [PHONE_1] — " + &"日本".repeat(30), "pieces of {size}");
        }
    }

    #[test]
    fn only_the_types_asked_for_count() {
        let mut g = StreamGuard::new(vec![PiiType::Phone], 64, true);
        let (out, _) = streamed(&mut g, "a@example.org, +1 415 555 0100", 4);
        assert_eq!(out, "a@example.org, [PHONE_1]");
    }
}
