//! SGLang 0.5.23's and vLLM 0.33.0's own `ZmqEventPublisher`s (driven by
//! `tests/kv_events/publisher.py`) feeding the real subscriber, pump and index:
//! a late join, chained and multi-block stores, a batch kept off the live
//! stream (repaired by replay), a removal, a publisher restart (seq back to 0),
//! and a clear. The index must end in exactly the expected state.
//!
//! Needs the venv of `tests/kv_events/setup_venv.sh`: its python is taken from
//! `SGL_ROUTER_KV_PYTHON` (set by `.ci/run`, then required) or the default
//! `/tmp/sgl-router-kv-venv/bin/python` (skipped with a message if absent).

use crate::common;
use common::eventually;

use std::io::{BufRead, BufReader, Write};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use kv_events::{EventMetrics, StreamEndpoints, SubscriberConfig, spawn_subscriber};
use kv_index::{IndexConfig, KvIndex, MatchOptions, SystemClock};
use kv_ingest::{Pump, PumpMetrics, StreamHashing};
use renderer::{HashMode, PageHasher};
use router_types::{BlockHash, DpRank, WorkerKey, WorkerUrl};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PAGE: usize = 4;
const WORKER: &str = "http://engine:30000";

fn python() -> Option<PathBuf> {
    common::venv_python("real engine publishers")
}

use crate::common::free_port;

/// The driver process; killed on drop.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    fn start(py: &PathBuf, engine: &str, port: u16, replay: u16) -> (Self, Value) {
        let script = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/kv_events/publisher.py"));
        let mut child = Command::new(py)
            .arg(script)
            .args(["--engine", engine])
            .args(["--endpoint", &format!("tcp://127.0.0.1:{port}")])
            .args(["--replay-endpoint", &format!("tcp://127.0.0.1:{replay}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn publisher.py");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut driver = Driver { child, stdin, stdout };
        let ready = driver.read();
        assert_eq!(ready["ready"], true, "driver not ready: {ready}");
        (driver, ready)
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("driver output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("driver said {line:?}: {e}"))
    }

    fn cmd(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let ack = self.read();
        assert_eq!(ack["ok"], true, "{c} -> {ack}");
        ack
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"cmd": "quit"}));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The engine's hash of block `i` of prompt `p`: SGLang publishes the router
/// hash itself; vLLM an opaque unsigned value (indexed by content anyway).
fn engine_hash(engine: &str, hashes: &[BlockHash], i: usize, p: u64) -> Value {
    if engine == "sglang" { json!({"i64": hashes[i].0}) } else { json!({"u64": u64::MAX - p * 1000 - i as u64}) }
}

struct Prompt {
    id: u64,
    tokens: Vec<u32>,
    hashes: Vec<BlockHash>,
}

impl Prompt {
    fn new(id: u64, blocks: usize) -> Self {
        let tokens: Vec<u32> = (0..blocks * PAGE).map(|i| (id * 10_000 + i as u64) as u32).collect();
        let hashes =
            PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram).block_hashes(&tokens, None).unwrap();
        Self { id, tokens, hashes }
    }

    /// `BlockStored` of blocks `from..to`, under block `from - 1`.
    fn store(&self, engine: &str, from: usize, to: usize) -> Value {
        json!({
            "type": "BlockStored",
            "block_hashes": (from..to).map(|i| engine_hash(engine, &self.hashes, i, self.id)).collect::<Vec<_>>(),
            "parent": from.checked_sub(1).map(|p| engine_hash(engine, &self.hashes, p, self.id)),
            "token_ids": self.tokens[from * PAGE..to * PAGE],
            "bigram": false,
            "block_size": PAGE,
            "medium": "GPU",
        })
    }

    fn remove(&self, engine: &str, blocks: &[usize]) -> Value {
        json!({"type": "BlockRemoved", "block_hashes": blocks.iter().map(|i| engine_hash(engine, &self.hashes, *i, self.id)).collect::<Vec<_>>(), "medium": "GPU"})
    }
}

fn publish(d: &mut Driver, events: Vec<Value>) -> Value {
    d.cmd(json!({"cmd": "publish", "events": events, "dp_rank": null}))
}

/// The router's side of one stream: the real subscriber, pump and index.
struct Follower {
    index: Arc<KvIndex>,
    events: Arc<EventMetrics>,
    pump_metrics: Arc<PumpMetrics>,
    _stop: tokio_util::sync::DropGuard,
}

impl Follower {
    fn start(engine: &str, port: u16, replay: u16) -> Self {
        let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
        let pump_metrics = Arc::new(PumpMetrics::default());
        let events = Arc::new(EventMetrics::default());
        let mut pump = Pump::new(index.clone(), pump_metrics.clone());
        let key = WorkerKey::new(WorkerUrl::new(WORKER), DpRank(0));
        let hashing = StreamHashing {
            page_size: NonZeroUsize::new(PAGE).unwrap(),
            mode: HashMode::Unigram,
            engine_hash_is_router_hash: engine == "sglang",
        };
        pump.add_stream(key.clone(), hashing).unwrap();
        let cancel = CancellationToken::new();
        let _stop = cancel.clone().drop_guard();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(pump.run(rx, cancel.clone()));
        let stream = StreamEndpoints {
            key,
            endpoint: format!("tcp://127.0.0.1:{port}"),
            replay_endpoint: Some(format!("tcp://127.0.0.1:{replay}")),
            topic: String::new(),
        };
        spawn_subscriber(stream, SubscriberConfig::default(), tx, events.clone(), cancel.clone());
        Follower { index, events, pump_metrics, _stop }
    }

    /// Blocks of `p`'s prefix the index holds.
    fn depth(&self, p: &Prompt) -> u32 {
        self.index.prefix_depths(&p.hashes, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    }
}

async fn scenario(engine: &str) {
    let Some(py) = python() else { return };
    let (port, replay) = (free_port(), free_port());
    let (mut d, ready) = Driver::start(&py, engine, port, replay);
    eprintln!("{engine}: {ready}");
    let (a, b, c) = (Prompt::new(1, 8), Prompt::new(2, 3), Prompt::new(3, 2));

    // Published before anyone subscribes: only the replay can deliver them.
    publish(&mut d, vec![a.store(engine, 0, 3)]);
    publish(&mut d, vec![a.store(engine, 3, 5)]);

    let f = Follower::start(engine, port, replay);
    let (index, events, pump_metrics) = (f.index.clone(), f.events.clone(), f.pump_metrics.clone());
    let depth = |p: &Prompt| -> u32 {
        index.prefix_depths(&p.hashes, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    };
    eventually("late join caught up", async || depth(&a) == 5).await;

    // A batch kept off the live stream, then a live one: the gap is repaired.
    d.cmd(json!({"cmd": "drop_next"}));
    publish(&mut d, vec![a.store(engine, 5, 7)]);
    publish(&mut d, vec![b.store(engine, 0, 3), a.remove(engine, &[6])]);
    // Depth 6 needs block 5, which only the dropped batch carried.
    eventually("gap repaired, removal applied", async || depth(&a) == 6 && depth(&b) == 3).await;

    // The publisher restarts: seq back to 0, everything it had is forgotten.
    d.cmd(json!({"cmd": "restart"}));
    publish(&mut d, vec![c.store(engine, 0, 2)]);
    eventually("restart reset the stream", async || depth(&c) == 2 && depth(&a) == 0 && depth(&b) == 0).await;
    // Seen by the seq going back, or by the reconnect's replay of seq 0 with other bytes.
    assert!(EventMetrics::get(&events.resets) + EventMetrics::get(&events.rewritten_resets) >= 1);

    publish(&mut d, vec![json!({"type": "AllBlocksCleared"}), c.store(engine, 0, 1)]);
    eventually("cleared then one block", async || depth(&c) == 1).await;

    let stats = index.stats();
    eprintln!(
        "{engine}: batches {} resets {} replays repaired {} / failed {}; index {stats:?}",
        EventMetrics::get(&events.batches),
        EventMetrics::get(&events.resets),
        EventMetrics::get(&events.replay_repaired),
        EventMetrics::get(&events.replay_failed)
    );
    assert_eq!((stats.nodes, stats.holdings), (1, 1), "exactly one block left: {stats:?}");
    assert_eq!(EventMetrics::get(&pump_metrics.hash_mismatches), 0, "router hashes equal the engine's");
    assert_eq!(EventMetrics::get(&pump_metrics.orphan_stores), 0);
    assert_eq!(EventMetrics::get(&events.decode_errors), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_publisher_drives_the_index() {
    scenario("sglang").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_publisher_drives_the_index() {
    scenario("vllm").await;
}

/// Found by a randomized run against SGLang's real publisher: the engine restarts after its
/// old publisher sent only seq 0; the new publisher's seq 0 never reaches the router live,
/// its seq 1 does. By the seq numbers alone that is the next batch in order. The reconnect
/// replay shows otherwise: the publisher's seq 0 is not the batch the router applied as 0.
async fn restart_that_the_seqs_cannot_show(engine: &str) {
    let Some(py) = python() else { return };
    let (port, replay) = (free_port(), free_port());
    let (mut d, _) = Driver::start(&py, engine, port, replay);
    let f = Follower::start(engine, port, replay);
    let (old, lost, live) = (Prompt::new(1, 3), Prompt::new(2, 4), Prompt::new(3, 2));
    publish(&mut d, vec![old.store(engine, 0, 3)]);
    eventually("seq 0 applied", async || f.depth(&old) == 3).await;

    d.cmd(json!({"cmd": "restart"}));
    d.cmd(json!({"cmd": "drop_next"}));
    publish(&mut d, vec![lost.store(engine, 0, 4)]); // the new seq 0: in the replay buffer only
    publish(&mut d, vec![live.store(engine, 0, 2)]); // the new seq 1
    eventually("the restart is seen: the old blocks go, the new seq 0 is applied", async || {
        (f.depth(&old), f.depth(&lost), f.depth(&live)) == (0, 4, 2)
    })
    .await;
    assert!(EventMetrics::get(&f.events.rewritten_resets) >= 1, "seen by the replay's bytes");
    assert_eq!(EventMetrics::get(&f.pump_metrics.orphan_stores), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_restart_the_seqs_cannot_show() {
    restart_that_the_seqs_cannot_show("sglang").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_restart_the_seqs_cannot_show() {
    restart_that_the_seqs_cannot_show("vllm").await;
}
