//! cache_aware's choices: the reference rule, the guard, the text tree, the warm-up slice,
//! the overlap decay and the selection temperature.

use super::*;
use crate::HeadHashConfig;
use router_types::WorkerId;

use crate::test_candidate as cand;

/// A real request: select, then commit.
fn pick(p: &CacheAware, cs: &[Candidate]) -> Decision {
    let req = RequestInfo { input_tokens: 8000, text: None, at_ms: 0, heads: &[] };
    let d = p.select(cs, &req).unwrap();
    p.commit(&d, cs, &req);
    d
}

#[test]
fn a_thin_worker_gets_one_hit_in_eight_and_a_warming_one_one_miss_in_four() {
    let p = CacheAware::new(CacheAwareConfig::default(), 1);
    let thin = Candidate { warmup: Warmup::Thin, ..cand(1, 0, 0) };
    // Worker 0 holds every prompt: without the slice the thin worker would never be chosen.
    let got: Vec<Reason> = (0..16).map(|_| pick(&p, &[cand(0, 6144, 0), thin]).reason).collect();
    let diverted = got.iter().filter(|r| **r == Reason::WarmupDivert).count();
    assert_eq!(diverted, 2, "{got:?}");
    assert_eq!((got[7], got[15]), (Reason::WarmupDivert, Reason::WarmupDivert));
    // One request at a time: a thin worker with one in flight gets no diversion.
    let busy = Candidate { warmup: Warmup::Thin, ..cand(1, 0, 1000) };
    assert!((0..16).all(|_| pick(&p, &[cand(0, 6144, 0), busy]).worker == WorkerId(0)));
    // Misses: every fourth to the least loaded young or thin worker.
    let p = CacheAware::new(CacheAwareConfig::default(), 1);
    let young = Candidate { warmup: Warmup::Young, ..cand(2, 0, 0) };
    let got: Vec<Decision> = (0..8).map(|_| pick(&p, &[cand(0, 0, 0), cand(1, 0, 0), young])).collect();
    let slice: Vec<usize> = (0..8).filter(|i| got[*i].reason == Reason::Warmup).collect();
    assert_eq!(slice, [3, 7]);
    assert!(slice.iter().all(|i| got[*i].worker == WorkerId(2)));
    // Off: no slice, no diversion.
    let off = CacheAwareConfig { warmup_share: 0.0, warmup_divert_every: 0, ..CacheAwareConfig::default() };
    let p = CacheAware::new(off, 1);
    assert!((0..16).all(|_| pick(&p, &[cand(0, 6144, 0), thin]).worker == WorkerId(0)));
    assert!((0..16).all(|_| pick(&p, &[cand(0, 0, 0), young]).reason == Reason::NoCacheCandidate));
}

#[test]
fn top_k_follows_the_reference_rule() {
    let c = CacheAwareConfig::default();
    assert_eq!(c.top_k(4), 4);
    assert_eq!(c.top_k(100), 8);
    assert_eq!(c.top_k(400), 20);
    assert_eq!(c.top_k(1000), 32);
}

#[test]
fn longest_hit_wins_unless_materially_more_loaded() {
    let p = CacheAware::new(CacheAwareConfig::default(), 1);
    // Worker 1 holds most of the prompt.
    let d = pick(&p, &[cand(0, 2048, 0), cand(1, 6144, 0), cand(2, 0, 0)]);
    assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::CacheHit });
    // Worker 0 is within the margin and worker 1 owes far more prefill: switch.
    let d = pick(&p, &[cand(0, 5500, 100), cand(1, 6144, 5000)]);
    assert_eq!(d, Decision { worker: WorkerId(0), reason: Reason::CacheHitLessLoaded });
    // Outside the margin: stay, however loaded.
    let d = pick(&p, &[cand(0, 2048, 0), cand(1, 6144, 50_000)]);
    assert_eq!(d.worker, WorkerId(1));
    // Gap under the absolute threshold: stay.
    let d = pick(&p, &[cand(0, 5500, 100), cand(1, 6144, 1000)]);
    assert_eq!(d.worker, WorkerId(1));
    // Guard off: stay.
    let off = CacheAware::new(CacheAwareConfig { pressure_guard: false, ..CacheAwareConfig::default() }, 1);
    assert_eq!(pick(&off, &[cand(0, 5500, 100), cand(1, 6144, 5000)]).worker, WorkerId(1));
}

#[test]
fn no_hit_above_the_floor_falls_back_to_load() {
    let p = CacheAware::new(CacheAwareConfig::default(), 7);
    let cs = [cand(0, 1000, 9000), cand(1, 0, 0)];
    for _ in 0..50 {
        let d = pick(&p, &cs);
        assert_eq!(
            d,
            Decision { worker: WorkerId(1), reason: Reason::NoCacheCandidate },
            "two candidates: always the lighter"
        );
    }
    assert_eq!(p.select(&[], &RequestInfo::default()), Err(PolicyError::NoCandidates));
}

fn unfollowed(worker: u32, owed: u64) -> Candidate {
    Candidate { followed: false, ..cand(worker, 0, owed) }
}

fn send(p: &CacheAware, cs: &[Candidate], text: &str, tokens: u64) -> Decision {
    let req = RequestInfo { input_tokens: tokens, text: Some(text), at_ms: 0, heads: &[] };
    let d = p.select(cs, &req).unwrap();
    p.commit(&d, cs, &req);
    d
}

#[test]
fn unfollowed_workers_are_judged_by_the_text_they_were_sent() {
    let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
    assert!(p.needs_text());
    let cs = [unfollowed(0, 0), unfollowed(1, 0)];
    let first = send(&p, &cs, "the long shared system prompt, then question one", 4000);
    assert_eq!(first.reason, Reason::NoCacheCandidate, "nothing learned yet");
    // The same prefix goes where it went, whatever the order of the candidates.
    for cs in [[unfollowed(0, 0), unfollowed(1, 0)], [unfollowed(1, 0), unfollowed(0, 0)]] {
        let d = send(&p, &cs, "the long shared system prompt, then question two", 4000);
        assert_eq!(d, Decision { worker: first.worker, reason: Reason::TextTreeHit });
    }
    // A match under the threshold is no hit.
    let d = p
        .select(
            &cs,
            &RequestInfo { input_tokens: 4000, text: Some("th and something else entirely"), at_ms: 0, heads: &[] },
        )
        .unwrap();
    assert_eq!(d.reason, Reason::NoCacheCandidate);
    // Forgotten with the worker.
    p.remove_worker(first.worker);
    let d = p
        .select(
            &cs,
            &RequestInfo { input_tokens: 4000, text: Some("the long shared system prompt"), at_ms: 0, heads: &[] },
        )
        .unwrap();
    assert_eq!(d.reason, Reason::NoCacheCandidate);
}

#[test]
fn exact_hits_and_estimates_are_ranked_together() {
    let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
    let text = "a prompt of one hundred characters, give or take: shared by every request of this conversation";
    // Teach the tree that worker 1 (unfollowed) holds the whole text.
    let only_1 = [unfollowed(1, 0)];
    send(&p, &only_1, text, 8000);
    // Worker 0 (followed) holds 2,000 of 8,000 tokens; worker 1 is estimated at about all of them.
    let d = p.select(
        &[cand(0, 2000, 0), unfollowed(1, 0)],
        &RequestInfo { input_tokens: 8000, text: Some(text), at_ms: 0, heads: &[] },
    );
    assert_eq!(d.unwrap(), Decision { worker: WorkerId(1), reason: Reason::TextTreeHit });
    // A followed worker holding more wins over the estimate.
    let longer = format!("{text} and more");
    let d = p.select(
        &[cand(0, 8000, 0), unfollowed(1, 0)],
        &RequestInfo { input_tokens: 8000, text: Some(&longer), at_ms: 0, heads: &[] },
    );
    assert_eq!(d.unwrap(), Decision { worker: WorkerId(0), reason: Reason::CacheHit });
    // The tree does not learn what goes to followed workers.
    let other = "another conversation entirely, sent to the followed worker only";
    send(&p, &[cand(0, 0, 0)], other, 8000);
    let d = p.select(
        &[unfollowed(1, 0), unfollowed(2, 0)],
        &RequestInfo { input_tokens: 8000, text: Some(other), at_ms: 0, heads: &[] },
    );
    assert_eq!(d.unwrap().reason, Reason::NoCacheCandidate);
    // Without a tree, unfollowed workers never hit.
    let plain = CacheAware::new(CacheAwareConfig::default(), 3);
    assert!(!plain.needs_text());
    let d = plain.select(&only_1, &RequestInfo { input_tokens: 8000, text: Some(text), at_ms: 0, heads: &[] }).unwrap();
    assert_eq!(d.reason, Reason::NoCacheCandidate);
}

#[test]
fn a_grossly_imbalanced_fleet_goes_to_its_least_loaded_worker() {
    let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
    let busy = Candidate { load: crate::Load { in_flight: 100, uncached_tokens: 0 }, ..cand(0, 8000, 0) };
    let idle = Candidate { load: crate::Load { in_flight: 10, uncached_tokens: 0 }, ..cand(1, 0, 0) };
    let d =
        p.select(&[busy, idle], &RequestInfo { input_tokens: 8000, text: Some("x"), at_ms: 0, heads: &[] }).unwrap();
    assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::Imbalanced });
    // Within the bounds the hit wins.
    let near = Candidate { load: crate::Load { in_flight: 50, uncached_tokens: 0 }, ..cand(1, 0, 0) };
    let d =
        p.select(&[busy, near], &RequestInfo { input_tokens: 8000, text: Some("x"), at_ms: 0, heads: &[] }).unwrap();
    assert_eq!(d.reason, Reason::CacheHit);
}

#[test]
fn the_overlap_decay_ranks_a_backlogged_hit_below_a_shorter_idle_one() {
    // Worker 0 holds more of the prompt but owes two prompts' worth of prefill more than
    // worker 1 (too little matched for the guard's margin to consider worker 1).
    let cs = [cand(0, 8000, 16_000), cand(1, 6000, 0)];
    let plain = CacheAware::new(CacheAwareConfig::default(), 1);
    assert_eq!(pick(&plain, &cs), Decision { worker: WorkerId(0), reason: Reason::CacheHit });
    // 8000 / (1 + 1 × 16000/8000) = 2667 against 6000: worker 1.
    let decayed = CacheAware::new(CacheAwareConfig { overlap_decay: 1.0, ..Default::default() }, 1);
    assert_eq!(pick(&decayed, &cs), Decision { worker: WorkerId(1), reason: Reason::CacheHit });
    // A small decay leaves the order: 8000 / (1 + 0.1 × 2) = 6667 against 6000.
    let light = CacheAware::new(CacheAwareConfig { overlap_decay: 0.1, ..Default::default() }, 1);
    assert_eq!(pick(&light, &cs).worker, WorkerId(0));
    // Equal backlogs: no decay at all, whatever the factor (x counts above the least owed).
    let even = [cand(0, 8000, 16_000), cand(1, 6000, 16_000)];
    assert_eq!(pick(&decayed, &even).worker, WorkerId(0));
}

/// Shares of each worker over `n` committed picks.
fn shares(p: &CacheAware, cs: &[Candidate], n: usize) -> Vec<f64> {
    let mut counts = vec![0usize; cs.len()];
    for _ in 0..n {
        let d = pick(p, cs);
        assert_eq!(d.reason, Reason::CacheHitSampled);
        counts[d.worker.0 as usize] += 1;
    }
    counts.iter().map(|c| *c as f64 / n as f64).collect()
}

#[test]
fn a_selection_temperature_draws_hits_by_the_softmax_of_their_normalized_scores() {
    let cs = [cand(0, 8000, 0), cand(1, 6000, 0), cand(2, 2000, 0)];
    // Temperature 0: the best, every time, and no draw taken.
    let best = CacheAware::new(CacheAwareConfig::default(), 7);
    assert!((0..50).all(|_| pick(&best, &cs) == Decision { worker: WorkerId(0), reason: Reason::CacheHit }));
    assert_eq!(best.rng.peek().unit(), CacheAware::new(CacheAwareConfig::default(), 7).rng.peek().unit());
    // Temperature 1: normalized scores 1, 2/3, 0, so weights e^0, e^-1/3, e^-1.
    let p = CacheAware::new(CacheAwareConfig { selection_temperature: 1.0, ..Default::default() }, 7);
    let w = [1.0, (-1.0f64 / 3.0).exp(), (-1.0f64).exp()];
    let expected: Vec<f64> = w.iter().map(|x| x / w.iter().sum::<f64>()).collect();
    let got = shares(&p, &cs, 4000);
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() < 0.03, "shares {got:?}, softmax {expected:?}");
    }
    // A low temperature is nearly the argmax; a high one nearly uniform.
    let cold = CacheAware::new(CacheAwareConfig { selection_temperature: 0.05, ..Default::default() }, 7);
    assert!(shares(&cold, &cs, 1000)[0] > 0.99);
    let hot = CacheAware::new(CacheAwareConfig { selection_temperature: 100.0, ..Default::default() }, 7);
    assert!(shares(&hot, &cs, 3000).iter().all(|s| (s - 1.0 / 3.0).abs() < 0.04));
}

#[test]
fn a_drawn_hit_moves_the_stream_only_when_committed() {
    let p = CacheAware::new(CacheAwareConfig { selection_temperature: 1.0, ..Default::default() }, 3);
    let cs = [cand(0, 8000, 0), cand(1, 7000, 0), cand(2, 6000, 0)];
    let req = RequestInfo { input_tokens: 8000, text: None, at_ms: 0, heads: &[] };
    let first = p.select(&cs, &req).unwrap();
    assert!((0..20).all(|_| p.select(&cs, &req).unwrap() == first), "uncommitted selects draw the same");
    // One hit alone is taken without a draw; the guard's move to a lighter worker is not drawn either.
    assert_eq!(p.select(&cs[..1], &req).unwrap().reason, Reason::CacheHit);
    let loaded = [cand(0, 8000, 20_000), cand(1, 7500, 0)];
    assert_eq!(p.select(&loaded, &req).unwrap().reason, Reason::CacheHitLessLoaded);
}

/// A candidate whose engine reports `usage` thousandths of its KV cache in use.
fn using(worker: u32, matched: u64, owed: u64, usage: u16) -> Candidate {
    Candidate { kv_usage: Some(usage), ..cand(worker, matched, owed) }
}

#[test]
fn a_kv_usage_spread_over_the_threshold_sends_the_request_to_the_shortest_queue() {
    let spread = |t: f64| CacheAware::new(CacheAwareConfig { balance_token_usage: t, ..Default::default() }, 1);
    // Worker 0 holds the prompt but its cache is nearly full; worker 1's queue is the shortest.
    let cs = [using(0, 8000, 3000, 900), using(1, 0, 1000, 100), using(2, 0, 2000, 500)];
    assert_eq!(pick(&spread(0.5), &cs), Decision { worker: WorkerId(1), reason: Reason::Imbalanced });
    // A spread of 0.8 is not over 0.8; 1.0 is off.
    for t in [0.8, 1.0] {
        assert_eq!(pick(&spread(t), &cs), Decision { worker: WorkerId(0), reason: Reason::CacheHit }, "{t}");
    }
    // Equal queues: the colder engine.
    let tied = [using(0, 8000, 0, 900), using(1, 0, 0, 100)];
    assert_eq!(pick(&spread(0.5), &tied), Decision { worker: WorkerId(1), reason: Reason::Imbalanced });
    // Engines with no report take no part: one report is no spread.
    let unreported = [using(0, 8000, 3000, 900), cand(1, 0, 1000)];
    assert_eq!(pick(&spread(0.1), &unreported).reason, Reason::CacheHit);
}

#[test]
fn the_hottest_engine_over_the_ceiling_is_left_out_of_the_choice() {
    let ceiling = |u: f64| CacheAware::new(CacheAwareConfig { overload_token_usage: u, ..Default::default() }, 1);
    // Its longer hit yields to the other hit.
    let cs = [using(0, 8000, 0, 950), using(1, 4096, 0, 400), using(2, 0, 0, 100)];
    assert_eq!(pick(&ceiling(0.9), &cs), Decision { worker: WorkerId(1), reason: Reason::CacheHit });
    assert_eq!(pick(&ceiling(0.96), &cs), Decision { worker: WorkerId(0), reason: Reason::CacheHit });
    assert_eq!(pick(&ceiling(1.0), &cs), Decision { worker: WorkerId(0), reason: Reason::CacheHit });
    // The only hit is the hot engine: a miss among the others, never the hot one.
    let p = ceiling(0.9);
    let only = [using(0, 8000, 0, 950), using(1, 0, 0, 920), using(2, 0, 0, 100)];
    for _ in 0..16 {
        let d = pick(&p, &only);
        assert_eq!(d.reason, Reason::NoCacheCandidate);
        assert_ne!(d.worker, WorkerId(0));
    }
    // Alone, it still serves.
    assert_eq!(pick(&p, &only[..1]).worker, WorkerId(0));
}

/// `--cache-index hash`: unfollowed workers judged by the placements of the request's heads.
#[test]
fn unfollowed_workers_are_judged_by_their_heads_placements_with_the_head_map() {
    let config = HeadHashConfig { boundaries: vec![16, 64], ttl_ms: 1_000, max_bytes: 1 << 20 };
    let exact_floor = CacheAwareConfig { min_matched_tokens: 16, ..CacheAwareConfig::default() };
    let p = CacheAware::new(exact_floor, 3).with_head_hashes(config);
    assert!(p.needs_tokens() && !p.needs_text());
    let conversation: Vec<u32> = (0..100).collect();
    let send = |cs: &[Candidate], tokens: &[u32], at_ms: u64| {
        let heads = p.heads(tokens);
        let req = RequestInfo { input_tokens: tokens.len() as u64, text: None, at_ms, heads: &heads };
        let d = p.select(cs, &req).unwrap();
        p.commit(&d, cs, &req);
        (d, p.select(cs, &req).unwrap())
    };
    let cs = [unfollowed(0, 0), unfollowed(1, 0)];
    let (first, _) = send(&cs, &conversation, 0);
    assert_eq!(first.reason, Reason::NoCacheCandidate, "nothing placed yet");
    // The next turn shares the first 64 tokens: where the first went, whatever the order.
    let mut next = conversation.clone();
    next.extend(500..600);
    for cs in [[unfollowed(0, 0), unfollowed(1, 0)], [unfollowed(1, 0), unfollowed(0, 0)]] {
        let (d, _) = send(&cs, &next, 100);
        assert_eq!(d, Decision { worker: first.worker, reason: Reason::HeadHashHit });
    }
    // A prompt sharing only its first 16 tokens: still a hit, at the shallower head.
    let mut branch: Vec<u32> = conversation[..16].to_vec();
    branch.extend(900..1000);
    assert_eq!(send(&cs, &branch, 200).0.reason, Reason::HeadHashHit);
    // Shorter than every boundary: no head, load-balanced.
    assert_eq!(send(&cs, &conversation[..10], 300).0.reason, Reason::NoCacheCandidate);
    // A followed worker's exact hit on more of the prompt outranks the 64-token estimate.
    let exact = cand(2, 96, 0);
    let (d, _) = send(&[unfollowed(0, 0), unfollowed(1, 0), exact], &next, 400);
    assert_eq!(d, Decision { worker: WorkerId(2), reason: Reason::CacheHit });
    // Past the TTL (last placed at 200 for the 16-token head, 100 for the 64-token one): no hit.
    let heads = p.heads(&next);
    let late = RequestInfo { input_tokens: 200, text: None, at_ms: 1_300, heads: &heads };
    assert_eq!(p.select(&cs, &late).unwrap().reason, Reason::NoCacheCandidate);
    // Forgotten with the worker.
    let fresh = RequestInfo { at_ms: 250, ..late };
    assert_eq!(p.select(&cs, &fresh).unwrap().reason, Reason::HeadHashHit);
    assert!(p.held_bytes() > 0);
    p.remove_worker(first.worker);
    assert_eq!(p.select(&cs, &fresh).unwrap().reason, Reason::NoCacheCandidate);
}

/// A head placed on several workers (SMG keeps three): the least loaded holder takes it.
#[test]
fn the_least_loaded_holder_of_a_head_takes_it() {
    let config = HeadHashConfig { boundaries: vec![16], ttl_ms: 0, max_bytes: 1 << 20 };
    let p = CacheAware::new(CacheAwareConfig::default(), 3).with_head_hashes(config);
    let prompt: Vec<u32> = (0..40).collect();
    let heads = p.heads(&prompt);
    let req = RequestInfo { input_tokens: 40, text: None, at_ms: 1, heads: &heads };
    // Worker 0 and 1 were each sent the head; 2 was not.
    for w in [0, 1] {
        let cs = [unfollowed(0, 0), unfollowed(1, 0), unfollowed(2, 0)];
        p.commit(&Decision { worker: WorkerId(w), reason: Reason::NoCacheCandidate }, &cs, &req);
    }
    for (busy, idle) in [(0, 1), (1, 0)] {
        let cs = [unfollowed(busy, 5_000), unfollowed(idle, 100), unfollowed(2, 0)];
        assert_eq!(p.select(&cs, &req).unwrap(), Decision { worker: WorkerId(idle), reason: Reason::HeadHashHit });
    }
}
