//! Small metric primitives for the router's own counters: a fixed-bucket
//! histogram on atomics. Exposition in Prometheus text arrives with the gateway.

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
