//! Chaos against ground truth. Simulated engines publish their KV events over
//! real ZMQ sockets (SGLang's wire format, small replay buffers); a seeded
//! random schedule of faults (publisher restarts and crashes, dropped and
//! corrupted batches, gaps past the replay buffer, cache flushes, slow events,
//! a worker removed and added back, the router restarted, the replay socket
//! down, the router's pump stalled under a burst so that every subscriber
//! waits on a full channel) is interleaved with
//! traffic through the router. After every round, at a quiescent point, the
//! router's index (its snapshot, as a peer replica gets it) is compared block
//! for block with what each engine's cache really holds:
//!
//! - a block the router holds that the engine does not (stale) is a failure,
//!   whatever happened;
//! - a block the engine holds that the router does not (missing) is a failure
//!   unless the protocol could not tell the router: the stream's history was
//!   lost past the replay buffer (a gap, a late subscription), which the router
//!   must then have detected and counted.
//!
//! `CHAOS_SEEDS` (default 3) seeds from `CHAOS_SEED_BASE` (default 1) of
//! `CHAOS_ROUNDS` rounds (default 12) each; the table of what was run and
//! found is printed to stderr. `benches/chaos.sh` runs many more.
//! `CHAOS_VERBOSE=1` prints each round's fault, `CHAOS_LOG=<filter>` the
//! router's logs.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use common::app::{Running, chat, config, engine_config, start};
use kv_events::EventMetrics;
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use router_types::WorkerUrl;
use sgl_router::app::PolicyConfig;

/// Batches each simulated publisher keeps for replay: small, so that gaps
/// past it and late subscriptions happen within a round.
const REPLAY_STEPS: usize = 16;
const ENGINES: usize = 3;

/// The faults a round may start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// No fault: traffic only.
    Calm,
    /// The publisher restarts in place (seq back to 0, cache emptied).
    Restart,
    /// The engine crashes: PUB socket closed, back later from seq 0 (the
    /// subscriber reconnects), batches of the traffic meanwhile published once
    /// it is back; `graceful` sends END_SEQ first.
    Crash { graceful: bool },
    /// A few live batches lost (the replay buffer still holds them).
    Drop,
    /// More live batches lost than the replay buffer holds.
    Overflow,
    /// A live batch corrupted on the way (the replay copy is intact).
    Corrupt,
    /// `/flush_cache` on the engine (AllBlocksCleared).
    Flush,
    /// Events delayed 40 ms each during the traffic.
    Slow,
    /// The worker removed from the router and added back.
    Readd,
    /// The router restarted (a new process with an empty index).
    RouterRestart,
    /// The publisher's replay socket closed for 0.3 to 1.5 s (the router's
    /// replay timeout is 0.5 s) while a few live batches are lost.
    ReplayDown,
    /// The router's pump stalled while the engines publish more batches than
    /// the subscribers' channel holds: every subscriber waits on a full channel.
    SlowSubscriber,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Calm => "none",
            Fault::Restart => "publisher restart",
            Fault::Crash { graceful: false } => "engine crash",
            Fault::Crash { graceful: true } => "engine crash after END_SEQ",
            Fault::Drop => "batches dropped (replayable)",
            Fault::Overflow => "gap past the replay buffer",
            Fault::Corrupt => "corrupted batch",
            Fault::Flush => "cache flush",
            Fault::Slow => "slow events",
            Fault::Readd => "worker removed and re-added",
            Fault::RouterRestart => "router restart",
            Fault::ReplayDown => "replay socket down, batches dropped",
            Fault::SlowSubscriber => "slow subscriber under a full channel",
        }
    }

    fn pick(rng: &mut Rng) -> Fault {
        match rng.below(23) {
            0..=1 => Fault::Calm,
            2..=3 => Fault::Restart,
            4..=5 => Fault::Crash { graceful: false },
            6 => Fault::Crash { graceful: true },
            7..=9 => Fault::Drop,
            10..=11 => Fault::Overflow,
            12..=13 => Fault::Corrupt,
            14 => Fault::Flush,
            15..=16 => Fault::Slow,
            17..=18 => Fault::Readd,
            19 => Fault::RouterRestart,
            20..=21 => Fault::ReplayDown,
            _ => Fault::SlowSubscriber,
        }
    }
}

/// splitmix64: a seeded schedule, the same on every machine.
struct Rng(router_types::SplitMix);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    fn words(&mut self, n: usize) -> String {
        const WORDS: &[&str] = &[
            "cache", "route", "engine", "token", "prefix", "page", "block", "replica", "model", "query", "answer",
            "system", "policy", "worker", "stream", "event", "batch", "index",
        ];
        (0..n).map(|_| WORDS[self.below(WORDS.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
    }
}

/// What one round's check found, by the fault that started it.
#[derive(Debug, Default, Clone)]
struct Tally {
    rounds: usize,
    stale: usize,
    missing: usize,
    /// Missing where the history was lost past the replay buffer: expected.
    lost: usize,
    compared: usize,
}

/// One seed's run.
struct Run {
    seed: u64,
    rng: Rng,
    engines: Vec<MockEngine>,
    router: Option<Running>,
    /// Per engine: blocks it held when its stream's history was lost past
    /// the replay buffer (since its cache was last emptied): the router may
    /// miss these (never hold stale ones). Blocks stored later must be known.
    excused: Vec<HashSet<u64>>,
    /// Per engine: history lost in this round's traffic (a gap past the replay
    /// buffer): everything it holds at the round's end is excused.
    lost_in_round: Vec<bool>,
    by_fault: BTreeMap<Fault, Tally>,
    /// Resets counted by routers stopped in this run.
    resets_before: [u64; 4],
    requests: usize,
    round: usize,
    unique: u64,
    systems: Vec<String>,
}

impl Run {
    async fn new(seed: u64) -> Run {
        let mut engines = Vec::new();
        for _ in 0..ENGINES {
            let cfg = MockEngineConfig { capacity_tokens: 2048, replay_buffer_steps: REPLAY_STEPS, ..engine_config() };
            engines.push(MockEngine::spawn(cfg).await.unwrap());
        }
        let mut rng = Rng(router_types::SplitMix::new(seed));
        let systems = (0..4).map(|_| rng.words(40)).collect();
        let mut run = Run {
            seed,
            rng,
            engines,
            router: None,
            excused: vec![HashSet::new(); ENGINES],
            lost_in_round: vec![false; ENGINES],
            by_fault: BTreeMap::new(),
            resets_before: [0; 4],
            requests: 0,
            round: 0,
            unique: 0,
            systems,
        };
        run.start_router().await;
        run
    }

    async fn start_router(&mut self) {
        let ws: Vec<&MockEngine> = self.engines.iter().collect();
        let r = start(config(&ws, PolicyConfig::cache_aware(), true)).await;
        self.router = Some(r);
        self.connected().await;
    }

    /// Waits until the router's subscriber of every engine is connected.
    async fn connected(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let fleet = &self.router().gateway.fleet;
        while fleet.all().len() < ENGINES || fleet.all().iter().any(|w| fleet.connected_streams(w) != Some(1)) {
            assert!(Instant::now() < deadline, "seed {}: the router never subscribed to every engine", self.seed);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn router(&self) -> &Running {
        self.router.as_ref().unwrap()
    }

    fn metrics(&self) -> &EventMetrics {
        self.router().gateway.fleet.event_metrics().unwrap()
    }

    /// Gap, restart (seq or END_SEQ), restart seen on replay, bad batch resets so far in this run.
    fn resets(&self) -> [u64; 4] {
        let m = self.metrics();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let now = [get(&m.gap_resets), get(&m.resets), get(&m.rewritten_resets), get(&m.bad_batch_resets)];
        std::array::from_fn(|i| now[i] + self.resets_before[i])
    }

    fn prompt(&mut self) -> serde_json::Value {
        let system = self.systems[self.rng.below(self.systems.len() as u64) as usize].clone();
        let n = 3 + self.rng.below(30) as usize;
        let user = self.rng.words(n);
        chat(&system, &user)
    }

    /// A prompt no engine has seen: its batch is certain to store pages.
    fn fresh(&mut self) -> serde_json::Value {
        self.unique += 1;
        chat(&format!("seed {} fresh {}", self.seed, self.unique), &self.rng.words(12))
    }

    /// `n` requests through the router, four at a time; every one must succeed.
    async fn traffic(&mut self, n: usize) {
        let url = format!("{}/v1/chat/completions", self.router().url);
        let client = reqwest::Client::new();
        let bodies: Vec<_> = (0..n).map(|_| self.prompt()).collect();
        for group in bodies.chunks(4) {
            let mut sent = tokio::task::JoinSet::new();
            for b in group {
                sent.spawn(client.post(&url).json(b).timeout(Duration::from_secs(10)).send());
            }
            while let Some(answer) = sent.join_next().await {
                let status = answer.unwrap().expect("the router answers").status();
                assert_eq!(status, 200, "seed {}: a request failed under chaos", self.seed);
            }
        }
        self.requests += n;
    }

    /// One request straight to engine `e` (not through the router).
    async fn direct(&mut self, e: usize) {
        let body = self.fresh();
        let url = format!("{}/v1/chat/completions", self.engines[e].url());
        let status = reqwest::Client::new().post(url).json(&body).send().await.unwrap().status();
        assert_eq!(status, 200);
    }

    /// Applies `fault` to engine `e` (or the router) and runs the round's traffic.
    async fn round(&mut self, fault: Fault, e: usize) {
        let n = 4 + self.rng.below(12) as usize;
        let engine = self.engines[e].engine().clone();
        match fault {
            Fault::Calm => self.traffic(n).await,
            Fault::Restart => {
                engine.set_faults(Faults { restart_publisher: true, ..Faults::default() }).await;
                self.excused[e].clear();
                self.traffic(n).await;
            }
            Fault::Crash { graceful } => {
                let reconnects = self.metrics().reconnects.load(std::sync::atomic::Ordering::Relaxed);
                let down = Duration::from_millis(20 + self.rng.below(200));
                let crash = tokio::spawn(async move { engine.crash_publishers(down, graceful).await });
                self.excused[e].clear();
                // Traffic while it is down: published once it is back.
                self.traffic(n).await;
                crash.await.unwrap();
                // Quiescent only once the router has reconnected (and so caught up): its seq may
                // equal the new publisher's by chance.
                let deadline = Instant::now() + Duration::from_secs(20);
                while self.metrics().reconnects.load(std::sync::atomic::Ordering::Relaxed) == reconnects {
                    assert!(Instant::now() < deadline, "seed {}: the router never reconnected", self.seed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Fault::Drop => {
                let k = 1 + self.rng.below(REPLAY_STEPS as u64 / 2) as usize;
                engine.publishers()[0].drop_next(k);
                self.traffic(n).await;
            }
            Fault::Overflow => {
                engine.publishers()[0].drop_next(REPLAY_STEPS + 2);
                // Its stores and removals in the gap are gone: the router can only start the stream over.
                self.lost_in_round[e] = true;
                self.traffic(n).await;
            }
            Fault::Corrupt => {
                engine.publishers()[0].corrupt_next(1);
                self.traffic(n).await;
            }
            Fault::Flush => {
                self.traffic(n / 2).await;
                engine.flush_cache().await;
                self.excused[e].clear();
                self.traffic(n / 2).await;
            }
            Fault::Slow => {
                engine.set_faults(Faults { event_delay_ms: 40, ..Faults::default() }).await;
                self.traffic(n).await;
                engine.set_faults(Faults { event_delay_ms: 0, ..Faults::default() }).await;
            }
            Fault::Readd => {
                let url = self.engines[e].url();
                let admin = common::app::admin_client();
                let base = self.router().url.clone();
                let gone = admin.delete(format!("{base}/workers/{url}")).send().await.unwrap();
                assert_eq!(gone.status(), 200);
                self.traffic(n / 2).await;
                let back = admin.post(format!("{base}/workers")).json(&serde_json::json!({"url": url})).send();
                assert!(back.await.unwrap().status().is_success());
                self.connected().await;
                // The new subscription learns only what the publisher still holds.
                if self.published(e).await > REPLAY_STEPS as u64 {
                    self.excuse(e);
                }
                self.traffic(n / 2).await;
            }
            Fault::ReplayDown => {
                let publisher = engine.publishers()[0].clone();
                let down = Duration::from_millis(300 + self.rng.below(1200));
                let back = tokio::spawn(async move { publisher.replay_down(down).await });
                tokio::time::sleep(Duration::from_millis(20)).await;
                // Lost live, then revealed by the next live batch while the replay socket is down.
                let k = 1 + self.rng.below(REPLAY_STEPS as u64 / 2) as usize;
                engine.publishers()[0].drop_next(k);
                for _ in 0..=k {
                    self.direct(e).await;
                }
                self.traffic(n).await;
                back.await.unwrap().expect("the replay socket comes back");
            }
            Fault::SlowSubscriber => {
                let metrics = self.router().gateway.fleet.event_metrics().unwrap().clone();
                let waits = || metrics.channel_full_waits.load(std::sync::atomic::Ordering::Relaxed);
                let before = waits();
                let release = self.router().gateway.fleet.stall_pump().await.expect("following events");
                self.burst(fleet::PUMP_CHANNEL_CAPACITY + 300).await;
                let deadline = Instant::now() + Duration::from_secs(20);
                while waits() == before {
                    assert!(Instant::now() < deadline, "seed {}: the subscribers' channel never filled", self.seed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                drop(release);
                self.traffic(n).await;
            }
            Fault::RouterRestart => {
                // The new router counts from 0: carry what this one counted.
                self.resets_before = self.resets();
                let old = self.router.take().unwrap();
                let _ = old.stop.send(());
                old.gateway.fleet.stopped().await;
                // Traffic while the router is down: straight to the engines.
                self.burst(n).await;
                for i in 0..ENGINES {
                    if self.published(i).await > REPLAY_STEPS as u64 {
                        self.excuse(i);
                    }
                }
                self.start_router().await;
            }
        }
    }

    /// The batches engine `e`'s publisher has sent since it started, once
    /// its event queue is empty (a batch still queued would push the oldest
    /// out of the replay buffer after this is read).
    async fn published(&self, e: usize) -> u64 {
        let engine = self.engines[e].engine();
        let deadline = Instant::now() + Duration::from_secs(20);
        while engine.queued_events() > 0 {
            assert!(Instant::now() < deadline, "seed {}: engine {e}'s events were never published", self.seed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        engine.publishers()[0].next_seq()
    }

    /// The router may miss what engine `e` holds now.
    fn excuse(&mut self, e: usize) {
        self.excused[e].extend(self.engines[e].engine().cached_tree()[0].keys().map(|h| h.0 as u64));
    }

    /// `n` requests straight to the engines (not through the router), spread over them, eight at a time.
    async fn burst(&mut self, n: usize) {
        let client = reqwest::Client::new();
        let bodies: Vec<_> = (0..n).map(|_| self.fresh()).collect();
        for (g, group) in bodies.chunks(8).enumerate() {
            let mut sent = tokio::task::JoinSet::new();
            for (i, b) in group.iter().enumerate() {
                let url = format!("{}/v1/chat/completions", self.engines[(g * 8 + i) % ENGINES].url());
                sent.spawn(client.post(url).json(b).timeout(Duration::from_secs(10)).send());
            }
            while let Some(answer) = sent.join_next().await {
                assert_eq!(answer.unwrap().expect("the engine answers").status(), 200);
            }
        }
    }

    /// Lets every dropped batch be spent and every stream see a live batch
    /// after it, then waits until the router has applied each publisher's
    /// last batch.
    async fn quiesce(&mut self) {
        for e in 0..ENGINES {
            let mut n = 0;
            while self.engines[e].engine().publishers()[0].pending_drops() > 0 {
                self.direct(e).await;
                n += 1;
                assert!(n < 200, "drops never spent");
            }
            self.direct(e).await;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // Published first, then applied.
            if self.engines.iter().any(|w| w.engine().queued_events() > 0) {
                assert!(Instant::now() < deadline, "seed {}: the engines' events were never published", self.seed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let snapshot = self.snapshot().await;
            let behind: Vec<_> = (0..ENGINES)
                .filter(|&e| {
                    let next = self.engines[e].engine().publishers()[0].next_seq();
                    let seq = snapshot.get(&e).map(|(seq, _)| *seq);
                    next > 0 && seq != Some(next - 1)
                })
                .collect();
            if behind.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "seed {}: the router never caught up with engines {behind:?}",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Per engine: the seq the router's index reflects, and the blocks it holds.
    async fn snapshot(&self) -> BTreeMap<usize, (u64, HashSet<u64>)> {
        let taken = self.router().gateway.fleet.snapshot_index(1 << 22, Duration::from_secs(5)).await.unwrap();
        let mut out = BTreeMap::new();
        for s in taken.snapshot.streams {
            let Some(e) = self.engines.iter().position(|w| WorkerUrl::parse(&w.url()).unwrap() == s.key.worker) else {
                continue;
            };
            let held = s.blocks.iter().filter(|b| b.tiers != 0).filter_map(|b| b.engine).collect();
            out.insert(e, (s.seq, held));
        }
        out
    }

    /// Compares the index with the engines' caches; counts into `fault`'s tally.
    async fn check(&mut self, fault: Fault) {
        let snapshot = self.snapshot().await;
        for e in 0..ENGINES {
            if std::mem::take(&mut self.lost_in_round[e]) {
                self.excuse(e);
            }
        }
        let empty = HashSet::new();
        let mut found = Vec::new();
        for (e, w) in self.engines.iter().enumerate() {
            let tree: HashMap<u64, Option<u64>> = w
                .engine()
                .cached_tree()
                .swap_remove(0)
                .into_iter()
                .map(|(h, p)| (h.0 as u64, p.map(|p| p.0 as u64)))
                .collect();
            let truth: HashSet<u64> = tree.keys().copied().collect();
            // The simulator's own events must tell exactly what it holds.
            assert_eq!(
                w.engine().told_blocks()[0],
                truth,
                "seed {}: the simulated engine's events are wrong",
                self.seed
            );
            let held = snapshot.get(&e).map_or(&empty, |(_, h)| h);
            let excused = &mut self.excused[e];
            excused.retain(|h| truth.contains(h));
            // A block lost with the history, or continuing one (its store was an orphan to the router).
            let lost_with_history = |mut h: u64| loop {
                if excused.contains(&h) {
                    return true;
                }
                match tree.get(&h).copied().flatten() {
                    Some(p) => h = p,
                    None => return false,
                }
            };
            let stale = held.difference(&truth).count();
            let (lost, missing) = truth
                .difference(held)
                .fold((0, 0), |(l, m), &h| if lost_with_history(h) { (l + 1, m) } else { (l, m + 1) });
            found.push((e, truth.len(), stale, missing, lost));
        }
        let tally = self.by_fault.entry(fault).or_default();
        tally.rounds += 1;
        for (e, held, stale, missing, lost) in found {
            tally.compared += held;
            tally.stale += stale;
            tally.missing += missing;
            tally.lost += lost;
            if stale + missing > 0 {
                let _ = writeln!(
                    std::io::stderr(),
                    "seed {} round {} ({}): engine {e} stale {stale} missing {missing} of {held} held (router seq {:?}, publisher next {})",
                    self.seed,
                    self.round,
                    fault.name(),
                    snapshot.get(&e).map(|(s, _)| *s),
                    self.engines[e].engine().publishers()[0].next_seq(),
                );
            }
        }
    }
}

/// Runs one seed; returns its tallies, resets by cause and requests.
async fn run_seed(seed: u64, rounds: usize) -> (BTreeMap<Fault, Tally>, [u64; 4], usize) {
    let mut run = Run::new(seed).await;
    for _ in 0..rounds {
        let fault = Fault::pick(&mut run.rng);
        let e = run.rng.below(ENGINES as u64) as usize;
        run.round += 1;
        if std::env::var_os("CHAOS_VERBOSE").is_some() {
            let _ = writeln!(std::io::stderr(), "seed {seed} round {}: {} on engine {e}", run.round, fault.name());
        }
        let before = run.resets();
        let missed_before = run.metrics().history_missed_batches.load(std::sync::atomic::Ordering::Relaxed);
        let held_state = run.snapshot().await.get(&e).is_some_and(|(_, held)| !held.is_empty());
        run.round(fault, e).await;
        run.quiesce().await;
        let missed = run.metrics().history_missed_batches.load(std::sync::atomic::Ordering::Relaxed) > missed_before;
        let after = run.resets();
        if after[0] > before[0] || after[3] > before[3] || missed {
            // A gap the replay could not fill (its socket down or backing off after a failure, or
            // the batches lost while the subscribers waited past the replay buffer), or a bad batch
            // it could not replace, was detected: the streams reset, or that never saw a restarted
            // publisher's first batches (counted as missed history), may miss what their engines
            // held, never hold stale blocks.
            match fault {
                Fault::SlowSubscriber => run.lost_in_round = vec![true; ENGINES],
                _ => run.lost_in_round[e] = true,
            }
        }
        run.check(fault).await;
        if fault == Fault::Overflow && held_state {
            // The router could not recover the gap: it must have reset the stream and counted it.
            assert!(run.resets()[0] > before[0], "seed {seed}: a gap past the replay buffer was not counted");
        }
    }
    let resets = run.resets();
    if let Some(r) = run.router.take() {
        let _ = r.stop.send(());
    }
    (run.by_fault, resets, run.requests)
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_equals_the_engines_caches_through_random_faults() {
    if let Ok(filter) = std::env::var("CHAOS_LOG") {
        // e.g. CHAOS_LOG=kv_events=debug,kv_ingest=debug
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    let (seeds, base, rounds) = (env("CHAOS_SEEDS", 3), env("CHAOS_SEED_BASE", 1), env("CHAOS_ROUNDS", 12) as usize);
    let started = Instant::now();
    let mut total: BTreeMap<Fault, Tally> = BTreeMap::new();
    let mut resets = [0u64; 4];
    let mut requests = 0;
    for seed in base..base + seeds {
        let (by_fault, r, n) = run_seed(seed, rounds).await;
        for (f, t) in by_fault {
            let sum = total.entry(f).or_default();
            sum.rounds += t.rounds;
            sum.stale += t.stale;
            sum.missing += t.missing;
            sum.lost += t.lost;
            sum.compared += t.compared;
        }
        for (a, b) in resets.iter_mut().zip(r) {
            *a += b;
        }
        requests += n;
    }
    let mut out = String::new();
    out += &format!(
        "\nchaos: seeds {base}..{} x {rounds} rounds, {requests} requests through the router, {:.1} s\n\n",
        base + seeds,
        started.elapsed().as_secs_f64()
    );
    out +=
        "| fault that started the round | rounds | blocks compared | stale | missing | missing after lost history |\n";
    out += "|---|---:|---:|---:|---:|---:|\n";
    for (f, t) in &total {
        out +=
            &format!("| {} | {} | {} | {} | {} | {} |\n", f.name(), t.rounds, t.compared, t.stale, t.missing, t.lost);
    }
    out += &format!(
        "\nresets counted: gap {}, restart (seq or END_SEQ) {}, restart seen on replay {}, bad batch {}\n",
        resets[0], resets[1], resets[2], resets[3]
    );
    let _ = std::io::stderr().write_all(out.as_bytes());
    let stale: usize = total.values().map(|t| t.stale).sum();
    let missing: usize = total.values().map(|t| t.missing).sum();
    assert_eq!((stale, missing), (0, 0), "the index diverged from the engines' caches:{out}");
}
