//! The gateway's metrics and the Prometheus text format: a fixed-bucket
//! histogram on atomics, counters keyed by closed label sets, and the
//! rendering of everything the gateway owns.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A cumulative histogram with fixed upper bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// One count per bound, plus +Inf.
    counts: Vec<AtomicU64>,
    /// Sum of observations, in micro-units (avoids a float atomic).
    sum_micros: AtomicU64,
}

/// Counters by a label value from a closed set.
#[derive(Debug, Default)]
pub struct LabeledCounter {
    values: Mutex<BTreeMap<String, u64>>,
}

/// Latency buckets: a proxied request takes milliseconds (fast engines) to minutes (long generations).
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];
/// Matched-token buckets: powers of two up to 128 k tokens of prompt.
pub const TOKEN_BUCKETS: [f64; 10] = [0.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];

/// What the gateway counts.
#[derive(Debug)]
pub struct GatewayMetrics {
    /// Requests by `route` and `status`.
    pub requests: LabeledCounter,
    /// Decisions by `reason` (the policy is fixed per router).
    pub decisions: LabeledCounter,
    /// Requests retried on another worker after a connect failure.
    pub retries: AtomicU64,
    /// Whole-request latency.
    pub latency: Histogram,
    /// Time to the first response byte from the worker.
    pub ttfb: Histogram,
    /// Prompt tokens the chosen worker already held.
    pub matched_tokens: Histogram,
}

// === impl Histogram ===

impl Histogram {
    /// A histogram with these (ascending) upper bounds.
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one value.
    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((v * 1e6) as u64, Ordering::Relaxed);
    }

    /// Total observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Cumulative counts per bound (the last is +Inf) and the sum.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64) {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        (out, self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6)
    }

    /// Appends this histogram in Prometheus text format.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        head(out, name, "histogram", help);
        let (buckets, sum) = self.snapshot();
        let mut total = 0;
        for (bound, count) in buckets {
            let le = if bound.is_infinite() { "+Inf".to_string() } else { format!("{bound}") };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {count}");
            total = count;
        }
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {total}");
    }
}

// === impl LabeledCounter ===

impl LabeledCounter {
    /// Adds one to the series with these labels (`k="v",...`, formatted into a
    /// per-thread buffer: a series seen before costs no allocation).
    pub fn inc(&self, labels: std::fmt::Arguments<'_>) {
        thread_local! {
            static BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            let _ = buf.write_fmt(labels);
            let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
            match values.get_mut(buf.as_str()) {
                Some(v) => *v += 1,
                None => {
                    values.insert(buf.clone(), 1);
                }
            }
        });
    }

    /// The value of one series.
    pub fn get(&self, labels: &str) -> u64 {
        self.values.lock().unwrap_or_else(|p| p.into_inner()).get(labels).copied().unwrap_or(0)
    }

    /// Appends every series.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        head(out, name, "counter", help);
        for (labels, v) in self.values.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

/// `# HELP` and `# TYPE` lines.
pub fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped as the text format requires.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

// === impl GatewayMetrics ===

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self {
            requests: LabeledCounter::default(),
            decisions: LabeledCounter::default(),
            retries: AtomicU64::new(0),
            latency: Histogram::new(&LATENCY_BUCKETS),
            ttfb: Histogram::new(&LATENCY_BUCKETS),
            matched_tokens: Histogram::new(&TOKEN_BUCKETS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_buckets() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.5, 7.0] {
            h.observe(v);
        }
        let (buckets, sum) = h.snapshot();
        assert_eq!(buckets, vec![(0.1, 1), (1.0, 3), (f64::INFINITY, 4)]);
        assert!((sum - 8.05).abs() < 1e-6);
        assert_eq!(h.count(), 4);
    }
}
