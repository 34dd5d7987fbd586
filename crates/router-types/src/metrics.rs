//! Prometheus text-format primitives every owner registers its metrics with:
//! a fixed-bucket histogram on atomics, counters keyed by closed label sets,
//! and the `# HELP`/`# TYPE` lines. No registry: each owner renders its own.

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
        self.add(labels, 1);
    }

    /// Adds `n` to the series with these labels (as [`inc`](Self::inc)).
    pub fn add(&self, labels: std::fmt::Arguments<'_>, n: u64) {
        thread_local! {
            static BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            let _ = buf.write_fmt(labels);
            let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
            match values.get_mut(buf.as_str()) {
                Some(v) => *v += n,
                None => {
                    values.insert(buf.clone(), n);
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
