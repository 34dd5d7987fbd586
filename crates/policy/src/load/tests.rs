//! The expected-wait model and the load policies over it.

use super::*;
use crate::{Load, Reported, Warmup};

fn cand(worker: u32, in_flight: u32, report: Option<Reported>, kv_usage: Option<u16>) -> Candidate {
    Candidate {
        worker: WorkerId(worker),
        load: Load { in_flight, uncached_tokens: 0 },
        matched_tokens: 0,
        followed: true,
        warmup: Warmup::Warm,
        kv_usage,
        report,
    }
}

fn queued(tokens: u64, throughput: u32) -> Option<Reported> {
    Some(Reported { queued_tokens: tokens, throughput, ..Default::default() })
}

/// A real request: select, then commit.
fn send(p: &dyn Policy, cs: &[Candidate]) -> Result<u32, PolicyError> {
    let req = RequestInfo::default();
    let d = p.select(cs, &req)?;
    p.commit(&d, cs, &req);
    Ok(d.worker.0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn the_score_is_the_drain_time_plus_the_kv_barrier() {
    let wait = ExpectedWait { kv_pressure_weight: 0.2, ..Default::default() };
    // 800 queued and 200 sent since the report, at 500 tokens a second, half the KV used:
    // 2 s of work and 0.2 * 0.5 / 0.5 of pressure.
    let a = cand(
        1,
        0,
        Some(Reported { queued_tokens: 800, throughput: 500, sent_tokens: 200, ..Default::default() }),
        Some(500),
    );
    // A queue reported as requests only counts at the mean prompt; an uncounted request sent too.
    let b = cand(
        2,
        0,
        Some(Reported { waiting: 2, sent: 1, sent_unknown: 1, throughput: 1024, ..Default::default() }),
        None,
    );
    // No throughput reported: the default (2000).
    let c = cand(3, 0, queued(4000, 0), Some(0));
    // A full cache: the barrier is large but finite.
    let d = cand(4, 0, queued(0, 1000), Some(1000));
    let s = wait.scores(&[&a, &b, &c, &d]);
    assert!(close(s[0], 2.2), "{s:?}");
    assert!(close(s[1], 3.0), "{s:?}");
    assert!(close(s[2], 2.0), "{s:?}");
    assert!(s[3].is_finite() && close(s[3], 0.2 * 0.999 / 0.001), "{s:?}");
    let p = LeastLoad::new(wait);
    assert_eq!(send(&p, &[a, b, c]), Ok(3));
}

#[test]
fn least_load_follows_the_engines_reports_not_the_routers_count() {
    // Worker 1 has more of this router's requests in flight, but its engine's queue is
    // shorter and it drains faster.
    let cs = [cand(1, 9, queued(1_000, 2_000), Some(100)), cand(2, 1, queued(20_000, 2_000), Some(100))];
    let p = LeastLoad::default();
    assert_eq!(send(&p, &cs), Ok(1));
    // The engines' KV usage: nearly full, the faster queue loses.
    let cs = [cand(1, 0, queued(1_000, 2_000), Some(995)), cand(2, 0, queued(2_000, 2_000), Some(100))];
    assert_eq!(send(&p, &cs), Ok(2));
}

#[test]
fn a_worker_without_a_report_scores_as_the_best_reporter_plus_its_own_requests() {
    let wait = ExpectedWait::default();
    let light = cand(1, 0, queued(1_000, 1_000), None);
    let deep = cand(2, 0, queued(9_000, 1_000), None);
    let dark = cand(3, 0, None, None);
    let s = wait.scores(&[&light, &deep, &dark]);
    // It ties with the best reporter: never idle, never starved.
    assert!(close(s[2], s[0]), "{s:?}");
    // Its own requests in flight count at the mean prompt and the reporters' mean throughput.
    let busy = cand(3, 2, None, None);
    let s = wait.scores(&[&light, &deep, &busy]);
    assert!(close(s[2], 1.0 + 2.0 * 1024.0 / 1000.0), "{s:?}");
    // Ties go to each tied worker in turn; the deep queue never.
    let p = LeastLoad::new(wait);
    let mut seen = [0usize; 4];
    for _ in 0..60 {
        seen[send(&p, &[light, deep, dark]).unwrap() as usize] += 1;
    }
    assert_eq!(seen[2], 0, "{seen:?}");
    assert!(seen[1] >= 20 && seen[3] >= 20, "{seen:?}");
}

#[test]
fn with_no_report_at_all_the_fewest_requests_then_tokens_owed_win() {
    let owed = |w, in_flight, tokens| Candidate {
        load: Load { in_flight, uncached_tokens: tokens },
        ..cand(w, 0, None, None)
    };
    let p = LeastLoad::default();
    assert_eq!(send(&p, &[owed(1, 3, 0), owed(2, 1, 500), owed(3, 1, 100)]), Ok(3));
    assert_eq!(send(&p, &[owed(1, 3, 0), owed(2, 1, 100), owed(3, 1, 500)]), Ok(2));
}

#[test]
fn the_waiting_cap_leaves_out_full_queues_and_counts_what_was_sent_since() {
    let cap = |n| LeastLoad::new(ExpectedWait { max_waiting_requests: n, ..Default::default() });
    let waiting = |w, n, sent, tokens| {
        cand(
            w,
            0,
            Some(Reported { waiting: n, sent, queued_tokens: tokens, throughput: 1000, ..Default::default() }),
            None,
        )
    };
    // 1 would win (its queue is lighter), but it reports 64 waiting, at the cap of 48.
    assert_eq!(send(&cap(48), &[waiting(1, 64, 0, 10), waiting(2, 0, 0, 1_000_000)]), Ok(2));
    // The requests sent since the report count: 1 reports 1 and was sent 1, at the cap of 2.
    assert_eq!(send(&cap(2), &[waiting(1, 1, 1, 10), waiting(2, 0, 0, 1_000_000)]), Ok(2));
    // A worker without a report is never capped (no evidence).
    assert_eq!(send(&cap(1), &[waiting(1, 5, 0, 0), cand(2, 3, None, None)]), Ok(2));
    // Every one at the cap: no choice.
    assert_eq!(send(&cap(48), &[waiting(1, 48, 0, 0), waiting(2, 50, 0, 0)]), Err(PolicyError::AllAtWaitingCap));
    // 0: no cap.
    assert_eq!(send(&cap(0), &[waiting(1, 1_000, 0, 10), waiting(2, 0, 0, 1_000_000)]), Ok(1));
}

#[test]
fn power_of_two_compares_by_its_metric() {
    // Worker 1: few of this router's requests, a deep reported queue; worker 2 the opposite.
    let cs = [cand(1, 0, queued(50_000, 1_000), None), cand(2, 5, queued(100, 1_000), None)];
    let by = |metric| PowerOfTwo::new(7, metric, ExpectedWait::default());
    for _ in 0..5 {
        assert_eq!(send(&by(LoadMetric::ExpectedWait), &cs), Ok(2));
        assert_eq!(send(&by(LoadMetric::Requests), &cs), Ok(1));
    }
    // least_requests: the fewest requests of the workers that report, never the one that does not.
    let cs = [cand(1, 4, queued(0, 0), None), cand(2, 2, queued(0, 0), None), cand(3, 0, None, None)];
    let p = by(LoadMetric::LeastRequests);
    for _ in 0..5 {
        assert_eq!(send(&p, &cs), Ok(2));
    }
    // With no reports at all, over every worker.
    let cs = [cand(1, 4, None, None), cand(2, 2, None, None), cand(3, 0, None, None)];
    assert_eq!(send(&p, &cs), Ok(3));
}

#[test]
fn parameters_are_checked_as_smg_checks_them() {
    assert!(ExpectedWait::default().check().is_ok());
    for bad in [
        ExpectedWait { kv_pressure_weight: -0.1, ..Default::default() },
        ExpectedWait { kv_pressure_weight: f64::NAN, ..Default::default() },
        ExpectedWait { default_throughput: 0.0, ..Default::default() },
        ExpectedWait { default_throughput: f64::INFINITY, ..Default::default() },
        ExpectedWait { mean_prefill_tokens: 0, ..Default::default() },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
}
