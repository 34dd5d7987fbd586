//! Prometheus text-format primitives every owner registers its metrics with:
//! a fixed-bucket histogram on atomics, counters keyed by closed label sets,
//! and the `# HELP`/`# TYPE` lines. No registry: each owner renders its own.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
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
    series: Mutex<Series>,
}

/// A [`LabeledCounter`]'s series.
#[derive(Debug, Default)]
struct Series {
    /// Each series' place in `counts`, by its labels.
    labels: BTreeMap<String, usize>,
    /// Each series' value.
    counts: Vec<u64>,
    /// The series a keyed caller's key stands for (see [`LabeledCounter::inc_keyed`]).
    keyed: HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
}

/// Hashes a caller's `u64` key with one multiplication (the std hasher took about a hundred
/// instructions a request for it).
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let m = (x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = m ^ (m >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
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
            let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
            let at = series.place(&buf);
            series.counts[at] += n;
        });
    }

    /// Adds one to the series with these labels, which `key` stands for: the labels are
    /// formatted the first time a key is seen, then found by the key alone (the request path's
    /// counters: formatting them took about 500 instructions a request each). Every call with
    /// one key must give the same labels; calls by labels ([`inc`](Self::inc)) add to the same
    /// series.
    pub fn inc_keyed(&self, key: u64, labels: std::fmt::Arguments<'_>) {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let at = match series.keyed.get(&key) {
            Some(&at) => at,
            None => {
                let mut text = String::new();
                let _ = text.write_fmt(labels);
                let at = series.place(&text);
                series.keyed.insert(key, at);
                at
            }
        };
        series.counts[at] += 1;
    }

    /// The value of one series.
    pub fn get(&self, labels: &str) -> u64 {
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series.labels.get(labels).map_or(0, |&at| series.counts[at])
    }

    /// Appends every series.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        head(out, name, "counter", help);
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        for (labels, &at) in &series.labels {
            let _ = writeln!(out, "{name}{{{labels}}} {}", series.counts[at]);
        }
    }
}

impl Series {
    /// The series with these labels, made at 0 if new.
    fn place(&mut self, labels: &str) -> usize {
        if let Some(&at) = self.labels.get(labels) {
            return at;
        }
        self.counts.push(0);
        self.labels.insert(labels.to_string(), self.counts.len() - 1);
        self.counts.len() - 1
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
    fn keyed_and_labelled_calls_count_one_series() {
        let c = LabeledCounter::default();
        for status in [200u16, 200, 503] {
            c.inc_keyed(u64::from(status), format_args!("route=\"chat\",status=\"{status}\""));
        }
        c.inc(format_args!("route=\"chat\",status=\"{}\"", 200));
        c.inc_keyed(7, format_args!("route=\"generate\",status=\"200\""));
        assert_eq!(c.get("route=\"chat\",status=\"200\""), 3);
        assert_eq!(c.get("route=\"chat\",status=\"503\""), 1);
        assert_eq!(c.get("route=\"generate\",status=\"200\""), 1);
        let mut out = String::new();
        c.render(&mut out, "x", "h");
        let series: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            series,
            [
                "x{route=\"chat\",status=\"200\"} 3",
                "x{route=\"chat\",status=\"503\"} 1",
                "x{route=\"generate\",status=\"200\"} 1"
            ]
        );
    }

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
