//! Precision and recall of the rule-based PII detector per type, measured on
//! `tests/pii/sentences.jsonl` (presidio-evaluator templates filled with
//! generated values, hard negatives with invalid values, and MT-Bench question
//! turns as PII-free text; see `tests/pii/README.md` to regenerate).
//!
//! Matching rule: the detector runs with every type on each text. A finding is
//! a true positive when it overlaps a not yet matched gold span of the same
//! type by at least half of that gold span's length (each gold span matches at
//! most one finding); other findings are false positives and unmatched gold
//! spans are false negatives. Exact span matches are counted separately for
//! information. Also reported: findings per 100 MT-Bench turns (all of them
//! false positives, since that text carries no PII).
//!
//! The floors asserted below are measured values minus a margin, so a
//! regression of the detector (or of the data) fails this test.

use std::collections::BTreeMap;
use std::ops::Range;

use model_select::{PiiDetector, PiiType};
use serde_json::Value;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/pii/sentences.jsonl");

/// Per type: (minimum precision, minimum recall). Measured on the committed
/// data (seed 42): recall 1.000 for every type; precision 1.000 except phone
/// 0.934 (invalid SSNs and card tails starting with 0 read as trunk-0 phones)
/// and credit_card 0.993 (a bad-checksum IBAN whose digit tail passes Luhn).
const FLOORS: &[(PiiType, f64, f64)] = &[
    (PiiType::Email, 0.97, 0.97),
    (PiiType::Phone, 0.90, 0.97),
    (PiiType::CreditCard, 0.96, 0.97),
    (PiiType::Iban, 0.97, 0.97),
    (PiiType::UsSsn, 0.97, 0.97),
    (PiiType::IpAddress, 0.97, 0.97),
    (PiiType::ApiKey, 0.97, 0.97),
];

/// Gold spans each type needs, so a shrunken data set cannot pass vacuously.
const MIN_GOLD: usize = 100;

/// Most findings (all false) allowed per 100 MT-Bench turns (measured: 0.00).
const MAX_MTBENCH_FP_PER_100: f64 = 1.0;

/// How many false positive / false negative examples to print per type.
const EXAMPLES: usize = 3;

#[derive(Debug, Default)]
struct Counts {
    gold: usize,
    tp: usize,
    fp: usize,
    fn_: usize,
    exact: usize,
    examples: Vec<String>,
}

impl Counts {
    fn precision(&self) -> f64 {
        ratio(self.tp, self.tp + self.fp)
    }

    fn recall(&self) -> f64 {
        ratio(self.tp, self.tp + self.fn_)
    }

    fn f1(&self) -> f64 {
        let (p, r) = (self.precision(), self.recall());
        if p + r == 0.0 { 0.0 } else { 2.0 * p * r / (p + r) }
    }
}

/// `num / den`, 1.0 when there is nothing to count.
fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 { 1.0 } else { num as f64 / den as f64 }
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> usize {
    a.end.min(b.end).saturating_sub(a.start.max(b.start))
}

/// A labelled sentence: text, gold spans and source.
struct Sample {
    text: String,
    gold: Vec<(PiiType, Range<usize>)>,
    source: String,
}

fn parse(line: &str, n: usize) -> Sample {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {n}: invalid JSON: {e}"));
    let field = |v: &Value, k: &str| v[k].as_str().unwrap_or_else(|| panic!("line {n}: no string {k:?}")).to_owned();
    let offset = |e: &Value, k: &str| {
        e[k].as_u64().and_then(|x| usize::try_from(x).ok()).unwrap_or_else(|| panic!("line {n}: bad {k:?}"))
    };
    let text = field(&v, "text");
    let entities = v["entities"].as_array().unwrap_or_else(|| panic!("line {n}: no \"entities\" array"));
    let gold = entities
        .iter()
        .map(|e| {
            let name = field(e, "type");
            let kind = PiiType::parse(&name).unwrap_or_else(|| panic!("line {n}: unknown type {name:?}"));
            let span = offset(e, "start")..offset(e, "end");
            assert!(text.get(span.clone()).is_some(), "line {n}: span {span:?} not on char boundaries");
            (kind, span)
        })
        .collect();
    Sample { text, gold, source: field(&v, "source") }
}

fn snippet(text: &str, span: &Range<usize>) -> String {
    let flat = |s: &str| s.replace('\n', "⏎");
    let before = text[..span.start].chars().rev().take(30).collect::<String>().chars().rev().collect::<String>();
    let after: String = text[span.end..].chars().take(20).collect();
    format!("…{}[[{}]]{}…", flat(&before), flat(&text[span.clone()]), flat(&after))
}

#[test]
fn pii_detector_meets_precision_and_recall_floors() {
    let data = std::fs::read_to_string(DATA).expect("read tests/pii/sentences.jsonl (see tests/pii/README.md)");
    let samples: Vec<Sample> =
        data.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| parse(l, i + 1)).collect();
    assert!(samples.len() >= 300, "only {} sentences in {DATA}", samples.len());

    let detector = PiiDetector::new();
    let mut counts: BTreeMap<PiiType, Counts> = PiiType::ALL.into_iter().map(|t| (t, Counts::default())).collect();
    let (mut mtbench_turns, mut mtbench_findings) = (0usize, 0usize);
    let mut by_source: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &samples {
        let family = if s.source.contains("-template-") { s.source.split("-template-").next() } else { None };
        *by_source.entry(family.unwrap_or(&s.source)).or_default() += 1;
        let found = detector.detect(&s.text, &PiiType::ALL);
        if s.source == "mtbench" {
            mtbench_turns += 1;
            mtbench_findings += found.len();
        }
        let mut matched = vec![false; s.gold.len()];
        for f in &found {
            let c = counts.get_mut(&f.kind).expect("every type counted");
            let hit = s
                .gold
                .iter()
                .enumerate()
                .find(|(i, (kind, g))| !matched[*i] && *kind == f.kind && 2 * overlap(g, &f.span) >= g.len());
            match hit {
                Some((i, (_, g))) => {
                    matched[i] = true;
                    c.tp += 1;
                    c.exact += usize::from(*g == f.span);
                }
                None => {
                    c.fp += 1;
                    if c.examples.len() < 2 * EXAMPLES {
                        c.examples.push(format!("FP ({}) {}", s.source, snippet(&s.text, &f.span)));
                    }
                }
            }
        }
        for (i, (kind, g)) in s.gold.iter().enumerate() {
            let c = counts.get_mut(kind).expect("every type counted");
            c.gold += 1;
            if !matched[i] {
                c.fn_ += 1;
                if c.examples.iter().filter(|e| e.starts_with("FN")).count() < EXAMPLES {
                    c.examples.push(format!("FN ({}) {}", s.source, snippet(&s.text, g)));
                }
            }
        }
    }
    let fp_per_100 = 100.0 * mtbench_findings as f64 / mtbench_turns.max(1) as f64;

    println!("\nPII detector on {} sentences {by_source:?}\n", samples.len());
    println!("| type | gold | TP | FP | FN | exact span | precision | recall | F1 |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (kind, c) in &counts {
        println!(
            "| {kind} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} |",
            c.gold,
            c.tp,
            c.fp,
            c.fn_,
            c.exact,
            c.precision(),
            c.recall(),
            c.f1()
        );
    }
    println!("\nMT-Bench: {mtbench_findings} findings on {mtbench_turns} turns = {fp_per_100:.2} FP per 100 turns\n");
    for (kind, c) in &counts {
        for e in &c.examples {
            println!("{kind}: {e}");
        }
    }

    let mut failures = Vec::new();
    for &(kind, min_p, min_r) in FLOORS {
        let c = &counts[&kind];
        if c.gold < MIN_GOLD {
            failures.push(format!("{kind}: only {} gold spans (need {MIN_GOLD})", c.gold));
        }
        if c.precision() < min_p || c.recall() < min_r {
            failures.push(format!(
                "{kind}: precision {:.3} (floor {min_p}), recall {:.3} (floor {min_r})",
                c.precision(),
                c.recall()
            ));
        }
    }
    if fp_per_100 > MAX_MTBENCH_FP_PER_100 {
        failures.push(format!("MT-Bench: {fp_per_100:.2} FP per 100 turns (max {MAX_MTBENCH_FP_PER_100})"));
    }
    assert!(failures.is_empty(), "PII eval below floors:\n{}", failures.join("\n"));
}
