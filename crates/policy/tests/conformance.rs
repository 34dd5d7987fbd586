//! The `Policy` contract, run against every implementation on one seeded
//! script of requests (tiny alphabets and loads force shared prefixes and
//! ties; candidates are random subsets of the fleet in random order):
//!
//! - `select` is pure: a twin that also selects every request several times,
//!   and answers an explain request it never commits in between, makes the
//!   same decisions as a policy that only selects and commits;
//! - `commit` is what moves the state: a twin that never commits decides
//!   differently somewhere on the script;
//! - decisions name one of the candidates; no candidates is an error.

use policy::{
    ApproxTreeConfig, ApproxTreePolicy, CacheAware, CacheAwareConfig, Candidate, Decision, ExpectedWait, LeastLoad,
    Load, LoadMetric, MinTtft, MinTtftConfig, Policy, PolicyError, PowerOfTwo, Random, Reported, RequestInfo,
    RoundRobin,
};
use router_types::WorkerId;

struct Rng(u64);

/// One request of the script.
struct Step {
    candidates: Vec<Candidate>,
    text: String,
}

// === impl Rng ===

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

// === impl Step ===

impl Step {
    fn request(&self) -> RequestInfo<'_> {
        RequestInfo { input_tokens: 4096, text: Some(&self.text), at_ms: 0, heads: &[] }
    }
}

/// `len` requests over a fleet of ids 1..=6 plus, later, 20..=21 (ids are never reused).
fn script(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = Rng(seed);
    (0..len)
        .map(|i| {
            let fleet: Vec<u32> = if i < len / 2 { (1..=6).collect() } else { vec![2, 3, 5, 20, 21] };
            let mut candidates: Vec<Candidate> = Vec::new();
            for &w in &fleet {
                if rng.below(4) != 0 {
                    // Half of them with a standing load report (the load policies' expected wait).
                    let report = (rng.below(2) == 0).then(|| Reported {
                        queued_tokens: 1000 * rng.below(3) as u64,
                        waiting: rng.below(3) as u32,
                        throughput: [0, 1000, 3000][rng.below(3)],
                        sent: rng.below(3) as u32,
                        sent_tokens: 500 * rng.below(2) as u64,
                        sent_unknown: rng.below(2) as u32,
                    });
                    candidates.push(Candidate {
                        worker: WorkerId(w),
                        load: Load { in_flight: rng.below(3) as u32, uncached_tokens: 1000 * rng.below(3) as u64 },
                        matched_tokens: [0, 512, 2048, 4096][rng.below(4)],
                        followed: rng.below(2) == 0,
                        warmup: Default::default(),
                        kv_usage: report.map(|_| [0, 500, 990][rng.below(3)]),
                        report,
                    });
                }
            }
            if candidates.is_empty() {
                candidates.push(Candidate {
                    worker: WorkerId(fleet[0]),
                    load: Load::default(),
                    matched_tokens: 0,
                    followed: false,
                    warmup: Default::default(),
                    kv_usage: None,
                    report: None,
                });
            }
            for k in (1..candidates.len()).rev() {
                candidates.swap(k, rng.below(k + 1));
            }
            let text = (0..4 + rng.below(8)).map(|_| ['a', 'b'][rng.below(2)]).collect();
            Step { candidates, text }
        })
        .collect()
}

/// Sends every request of `steps`: select, then commit.
fn sent(p: &dyn Policy, steps: &[Step]) -> Vec<Decision> {
    steps
        .iter()
        .map(|s| {
            let d = p.select(&s.candidates, &s.request()).unwrap();
            p.commit(&d, &s.candidates, &s.request());
            d
        })
        .collect()
}

fn conforms(make: fn() -> Box<dyn Policy>) {
    let name = make().name();
    let steps = script(0x5eed, 400);
    let explain = script(0xe4b1, steps.len());
    let expected = sent(&*make(), &steps);

    let probed = make();
    for (i, (s, e)) in steps.iter().zip(&explain).enumerate() {
        // `/debug/route` on another request, never sent.
        probed.select(&e.candidates, &e.request()).unwrap();
        let d = probed.select(&s.candidates, &s.request()).unwrap();
        for _ in 0..3 {
            assert_eq!(probed.select(&s.candidates, &s.request()).unwrap(), d, "{name} step {i}: select moved state");
        }
        assert_eq!(d, expected[i], "{name} step {i}: selects that were not sent changed a decision");
        assert!(s.candidates.iter().any(|c| c.worker == d.worker), "{name} step {i}: {d:?} is no candidate");
        probed.commit(&d, &s.candidates, &s.request());
    }

    let frozen = make();
    let unsent: Vec<Decision> = steps.iter().map(|s| frozen.select(&s.candidates, &s.request()).unwrap()).collect();
    assert_ne!(unsent, expected, "{name}: commit moved no state");

    let p = make();
    assert_eq!(p.select(&[], &RequestInfo::default()), Err(PolicyError::NoCandidates), "{name}");
    p.remove_worker(WorkerId(3));
    assert_eq!(sent(&*p, &steps[..10]).len(), 10, "{name}: works after a worker left");
}

#[test]
fn round_robin_conforms() {
    conforms(|| Box::new(RoundRobin::default()));
}

#[test]
fn random_conforms() {
    conforms(|| Box::new(Random::new(11)));
}

#[test]
fn power_of_two_conforms() {
    conforms(|| Box::new(PowerOfTwo::new(12, LoadMetric::ExpectedWait, ExpectedWait::default())));
    conforms(|| Box::new(PowerOfTwo::new(12, LoadMetric::Requests, ExpectedWait::default())));
    conforms(|| Box::new(PowerOfTwo::new(12, LoadMetric::LeastRequests, ExpectedWait::default())));
}

#[test]
fn manual_conforms() {
    conforms(|| Box::new(policy::Manual::new(21)));
}

#[test]
fn least_load_conforms() {
    conforms(|| Box::new(LeastLoad::default()));
    conforms(|| {
        Box::new(LeastLoad::new(ExpectedWait {
            kv_pressure_weight: 1.0,
            default_throughput: 500.0,
            mean_prefill_tokens: 64,
            max_waiting_requests: 0,
        }))
    });
}

#[test]
fn cache_aware_conforms() {
    conforms(|| Box::new(CacheAware::new(CacheAwareConfig::default(), 13)));
    conforms(|| Box::new(CacheAware::new(CacheAwareConfig::default(), 13).with_text_tree(ApproxTreeConfig::default())));
}

#[test]
fn min_ttft_conforms() {
    conforms(|| Box::new(MinTtft::new(MinTtftConfig::default())));
}

#[test]
fn approx_tree_conforms() {
    conforms(|| Box::new(ApproxTreePolicy::new(ApproxTreeConfig::default())));
}
