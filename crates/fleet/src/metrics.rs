//! The fleet's metrics in Prometheus text: every worker's state and load,
//! the KV-event subscribers, the pump and the index.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use kv_events::EventMetrics;
use kv_index::IndexStats;
use kv_ingest::PumpMetrics;
use router_types::metrics::{escape as esc, head};

use crate::liveness::{RankReport, Veto};
use crate::{Fleet, FleetMetrics, State, Worker};

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// One metric: its head, then a line per (labels, value).
fn series<V: std::fmt::Display>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    rows: impl IntoIterator<Item = (String, V)>,
) {
    head(out, name, kind, help);
    for (labels, v) in rows {
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    }
}

fn counter(out: &mut String, name: &str, help: &str, series: &[(&str, u64)]) {
    head(out, name, "counter", help);
    for (labels, v) in series {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

// === impl Fleet ===

impl Fleet {
    /// Appends every metric the fleet owns.
    pub fn render_metrics(&self, out: &mut String) {
        let workers = self.all();
        let per_worker = |out: &mut String, name: &str, help: &str, value: &dyn Fn(&Worker) -> u64| {
            head(out, name, "gauge", help);
            for w in &workers {
                let _ = writeln!(out, "{name}{{worker=\"{}\"}} {}", esc(w.url.as_str()), value(w));
            }
        };
        per_worker(out, "router_worker_in_flight", "Requests in flight per worker.", &|w| {
            u64::from(w.load().in_flight)
        });
        per_worker(
            out,
            "router_worker_reported_queued_tokens",
            "Uncached prompt tokens the worker last reported queued (SGLang /v1/loads; 0 when unknown).",
            &|w| w.reported_uncached_tokens(),
        );
        per_worker(out, "router_worker_healthy", "1 while the worker is in rotation.", &|w| u64::from(w.is_routable()));
        per_worker(
            out,
            "router_worker_circuit_state",
            "The worker's circuit breaker: 0 closed, 1 open (out of rotation), 2 half-open (on trial).",
            &|w| w.breaker_state().code(),
        );
        head(out, "router_worker_circuit_opened_total", "counter", "Times the worker's circuit breaker opened.");
        for w in &workers {
            let _ = writeln!(
                out,
                "router_worker_circuit_opened_total{{worker=\"{}\"}} {}",
                esc(w.url.as_str()),
                w.breaker_opened()
            );
        }
        let cfg = &self.config.liveness;
        let url = |w: &Worker| esc(w.url.as_str()).to_string();
        let by_veto = |value: &dyn Fn(usize, &Worker, Veto) -> u64| {
            let rows = workers.iter().enumerate().flat_map(|(i, w)| Veto::ALL.map(|v| (i, w, v)));
            let label = |w: &Worker, v: Veto| format!("worker=\"{}\",veto=\"{}\"", url(w), v.as_str());
            rows.map(|(i, w, v)| (label(w, v), value(i, w, v))).collect::<Vec<_>>()
        };
        let vetoes_now: Vec<_> = workers.iter().map(|w| w.veto(cfg)).collect();
        let vetoed = "1 while a liveness veto leaves the worker out of new routing decisions, by veto.";
        series(out, "router_worker_vetoed", "gauge", vetoed, by_veto(&|i, _, v| u64::from(vetoes_now[i] == Some(v))));
        let total = "Routing decisions that left the worker out, by liveness veto.";
        series(out, "router_worker_vetoes_total", "counter", total, by_veto(&|_, w, v| w.liveness.vetoed(v)));
        per_worker(
            out,
            "router_worker_reported_waiting_requests",
            "Requests the worker last reported queued over its ranks (SGLang /v1/loads; 0 when unknown).",
            &|w| u64::from(w.liveness.waiting()),
        );
        per_worker(
            out,
            "router_worker_reported_gen_throughput",
            "Tokens a second the worker last reported generating over its ranks (gen_throughput; 0 when unknown).",
            &|w| u64::from(w.since_poll.get().throughput),
        );
        per_worker(
            out,
            "router_worker_sent_since_report",
            "Requests this router sent the worker since its last load report (least_load's and power_of_two's expected wait adds them).",
            &|w| u64::from(w.since_poll.get().requests),
        );
        let usage = workers.iter().map(|w| (format!("worker=\"{}\"", url(w)), w.liveness.token_usage()));
        let help = "Mean KV-cache token usage the worker last reported (0 when unknown).";
        series(out, "router_worker_reported_token_usage", "gauge", help, usage);
        per_worker(
            out,
            "router_worker_warming",
            "cache_aware's warm-up slice: 0 warm, 1 young (new in rotation), 2 thin (its cache far under the median).",
            &|w| match w.warmup() {
                router_types::Warmup::Warm => 0,
                router_types::Warmup::Young => 1,
                router_types::Warmup::Thin => 2,
            },
        );
        let reports: Vec<_> = workers.iter().map(|w| (url(w), w.liveness.rank_reports())).collect();
        type Read = fn(&RankReport) -> f64;
        let engine: [(&str, &str, Read); 3] = [
            (
                "router_engine_running_requests",
                "Requests the engine last reported running, by worker and dp rank (SGLang /v1/loads).",
                |r| r.running as f64,
            ),
            (
                "router_engine_waiting_requests",
                "Requests the engine last reported queued, by worker and dp rank.",
                |r| r.waiting as f64,
            ),
            (
                "router_engine_token_usage",
                "KV-cache token usage the engine last reported, by worker and dp rank.",
                |r| r.token_usage,
            ),
        ];
        for (name, help, value) in engine {
            let rows = reports.iter().flat_map(|(url, ranks)| {
                ranks.iter().map(move |r| (format!("worker=\"{url}\",dp_rank=\"{}\"", r.dp_rank), value(r)))
            });
            series(out, name, "gauge", help, rows);
        }
        head(out, "router_workers", "gauge", "Workers by state.");
        for state in State::ALL {
            let n = workers.iter().filter(|w| w.state() == state).count();
            let _ = writeln!(out, "router_workers{{state=\"{}\"}} {n}", state.as_str());
        }
        counter(
            out,
            "router_workers_removed_total",
            "Workers removed from the fleet.",
            &[("", get(&self.metrics.removed))],
        );
        head(out, "router_kv_events_streams", "gauge", "(worker, dp rank) streams subscribed.");
        // Derived from the live workers' registered streams: one truth, no counter to keep in step.
        let streams: usize =
            self.snapshot().iter().map(|w| w.streams.lock().unwrap_or_else(|p| p.into_inner()).len()).sum();
        let _ = writeln!(out, "router_kv_events_streams {streams}");
        if let Some(ev) = &self.events {
            render_events(out, &ev.events, &ev.pump, &self.metrics, &ev.index.stats());
            render_history(out, &ev.events, &self.metrics);
        }
        render_discovery(out, &self.metrics.discovery);
    }
}

/// What each stream's history was, and the peer snapshots taken and served.
fn render_history(out: &mut String, e: &EventMetrics, f: &FleetMetrics) {
    counter(
        out,
        "router_kv_events_history_missed_batches_total",
        "Batches of the streams' history never seen: published before this router subscribed and no longer held by the publishers (per stream: GET /workers, kv_history).",
        &[("", get(&e.history_missed_batches))],
    );
    counter(
        out,
        "router_kv_snapshot_streams_total",
        "Streams started from a peer replica's index snapshot, by outcome: resumed (the first batch after the snapshot's seq followed on from it), or reset (the publisher no longer held what followed it, or restarted). A stream with no batch since counts in neither.",
        &[("{outcome=\"resumed\"}", get(&e.snapshot_resumed)), ("{outcome=\"reset\"}", get(&e.snapshot_resets))],
    );
    counter(
        out,
        "router_kv_snapshots_served_total",
        "Index snapshots served to peer replicas (GET /index/snapshot), by outcome.",
        &[("{outcome=\"ok\"}", get(&f.snapshots_served)), ("{outcome=\"unavailable\"}", get(&f.snapshots_refused))],
    );
}

/// Kubernetes discovery's counters.
fn render_discovery(out: &mut String, d: &crate::k8s::DiscoveryMetrics) {
    let o = &d.objects;
    if get(&o.lists) + get(&o.failures) > 0 {
        counter(
            out,
            "router_k8s_objects_total",
            "Custom objects followed (InferencePool, InferenceObjective, RoutingConfig): lists done, watch events applied, failures (each backs off).",
            &[
                ("{what=\"lists\"}", get(&o.lists)),
                ("{what=\"events\"}", get(&o.events)),
                ("{what=\"failures\"}", get(&o.failures)),
            ],
        );
    }
    let lists = get(&d.lists);
    if lists == 0 && get(&d.failures) == 0 {
        return; // discovery off
    }
    counter(out, "router_discovery_lists_total", "Pod lists done.", &[("", lists)]);
    counter(out, "router_discovery_watches_total", "Pod watches opened.", &[("", get(&d.watches))]);
    counter(
        out,
        "router_discovery_expired_total",
        "Watches whose resource version expired (410): a fresh list followed.",
        &[("", get(&d.expired))],
    );
    counter(
        out,
        "router_discovery_failures_total",
        "Lists and watches that failed (connection, status, unreadable answer); each backs off.",
        &[("", get(&d.failures))],
    );
    counter(out, "router_discovery_events_total", "Watch events read.", &[("", get(&d.events))]);
    counter(
        out,
        "router_discovery_workers_total",
        "Workers discovery added and removed.",
        &[("{change=\"added\"}", get(&d.added)), ("{change=\"removed\"}", get(&d.removed))],
    );
    counter(
        out,
        "router_discovery_pods_skipped_total",
        "Pods matching a selector that cannot be workers (a bad bootstrap-port annotation, an unknown pool, over the bound).",
        &[("", get(&d.skipped))],
    );
    head(out, "router_discovery_workers", "gauge", "Workers discovery holds now.");
    let _ = writeln!(out, "router_discovery_workers {}", get(&d.workers));
}

/// Appends every KV-event and index metric.
fn render_events(out: &mut String, e: &EventMetrics, p: &PumpMetrics, f: &FleetMetrics, index: &IndexStats) {
    counter(out, "router_kv_events_batches_total", "Batches received and decoded.", &[("", get(&e.batches))]);
    counter(
        out,
        "router_kv_events_decode_errors_total",
        "Batches that failed to decode, by kind.",
        &[
            ("{kind=\"truncated\"}", get(&e.decode_truncated)),
            ("{kind=\"malformed\"}", get(&e.decode_malformed)),
            ("{kind=\"too_long\"}", get(&e.decode_too_long)),
        ],
    );
    counter(
        out,
        "router_kv_events_unknown_events_total",
        "Events of unknown type or medium, skipped.",
        &[("", get(&e.unknown_events))],
    );
    counter(
        out,
        "router_kv_events_malformed_frames_total",
        "Live messages without 3 frames or an 8-byte seq.",
        &[("", get(&e.malformed_frames))],
    );
    counter(
        out,
        "router_kv_events_replays_total",
        "Gap replays by outcome.",
        &[
            ("{outcome=\"repaired\"}", get(&e.replay_repaired)),
            ("{outcome=\"incomplete\"}", get(&e.replay_incomplete)),
            ("{outcome=\"failed\"}", get(&e.replay_failed)),
            ("{outcome=\"timed_out\"}", get(&e.replay_timeouts)),
            ("{outcome=\"over_limit\"}", get(&e.replay_over_limit)),
            ("{outcome=\"skipped\"}", get(&e.replay_skipped)),
        ],
    );
    counter(
        out,
        "router_kv_events_resets_total",
        "Streams reset (their index state dropped), by cause: a publisher restart (seq back, END_SEQ), a restart only a reconnect's replay showed (a batch at an applied seq with other bytes), a gap replay could not fill, a batch no copy of which decodes.",
        &[
            ("{cause=\"restart\"}", get(&e.resets)),
            ("{cause=\"restart_replay\"}", get(&e.rewritten_resets)),
            ("{cause=\"gap\"}", get(&e.gap_resets)),
            ("{cause=\"bad_batch\"}", get(&e.bad_batch_resets)),
        ],
    );
    counter(
        out,
        "router_kv_events_undecodable_batches_total",
        "Live batches that did not decode (each then replayed once, or its stream reset).",
        &[("", get(&e.undecodable_batches))],
    );
    counter(
        out,
        "router_kv_events_bad_batches_total",
        "Undecodable batches by outcome: a replayed copy decoded, or the stream was reset.",
        &[("{outcome=\"replayed\"}", get(&e.bad_batches_replayed)), ("{outcome=\"reset\"}", get(&e.bad_batch_resets))],
    );
    counter(
        out,
        "router_kv_events_live_held_total",
        "Live batches held while a replay ran.",
        &[("", get(&e.live_held))],
    );
    counter(
        out,
        "router_kv_events_live_dropped_total",
        "Live batches dropped while a replay ran (the hold was full; repaired as a gap later).",
        &[("", get(&e.live_dropped))],
    );
    counter(
        out,
        "router_kv_events_channel_full_waits_total",
        "Times a subscriber waited for the pump.",
        &[("", get(&e.channel_full_waits))],
    );
    counter(
        out,
        "router_kv_events_connect_failures_total",
        "Failed connection attempts.",
        &[("", get(&e.connect_failures))],
    );
    counter(
        out,
        "router_kv_events_reconnects_total",
        "Connections to a publisher made again after it dropped, each followed by a catch-up replay.",
        &[("", get(&e.reconnects))],
    );
    counter(
        out,
        "router_kv_events_applied_total",
        "Events applied to the index, by kind.",
        &[
            ("{kind=\"stored\"}", get(&p.stored)),
            ("{kind=\"removed\"}", get(&p.removed)),
            ("{kind=\"cleared\"}", get(&p.cleared)),
        ],
    );
    counter(
        out,
        "router_kv_events_skipped_stores_total",
        "Stores not applied, by reason.",
        &[
            ("{reason=\"orphan\"}", get(&p.orphan_stores)),
            ("{reason=\"malformed\"}", get(&p.malformed_stores)),
            ("{reason=\"rejected\"}", get(&p.rejected_stores)),
        ],
    );
    counter(
        out,
        "router_kv_events_unknown_stream_batches_total",
        "Batches of streams the pump does not know (a removed worker's last ones).",
        &[("", get(&p.unknown_streams))],
    );
    counter(
        out,
        "router_kv_events_duplicate_batches_total",
        "Batches at or before the applied seq, dropped.",
        &[("", get(&p.duplicates))],
    );
    counter(
        out,
        "router_kv_events_hash_mismatches_total",
        "Stored blocks whose published hash differs from the router's (SGLang) or from vLLM's own of the published tokens and keys (vLLM): wrong page size, tokenizer, namespace or key.",
        &[("", get(&p.hash_mismatches))],
    );
    counter(
        out,
        "router_kv_events_vllm_hashes_checked_total",
        "vLLM stored blocks whose published hash was checked against vLLM's own (default sha256) of their tokens and keys.",
        &[("", get(&p.hashes_checked))],
    );
    counter(
        out,
        "router_kv_events_vllm_unchecked_streams_total",
        "vLLM streams whose hashes are not vLLM's default sha256 ones (another algorithm or a PYTHONHASHSEED): not checked.",
        &[("", get(&p.hash_unchecked_streams))],
    );
    counter(
        out,
        "router_kv_events_refused_workers_total",
        "Workers whose events are not followed because their page size differs from their pool's.",
        &[("{reason=\"block_size\"}", get(&f.refused_block_size))],
    );
    counter(
        out,
        "router_kv_events_discovery_failures_total",
        "Attempts to find a worker's publishers that failed (each retried with backoff).",
        &[("", get(&f.discovery_failures))],
    );
    counter(
        out,
        "router_kv_events_rediscoveries_total",
        "Followed workers back after being down whose publishers had moved (new KV-event ports): followed anew.",
        &[("", get(&f.rediscoveries))],
    );
    p.lag_seconds.render(out, "router_kv_events_lag_seconds", "Publish-to-apply delay of batches.");
    head(out, "router_kv_events_connected", "gauge", "1 while the subscriber of a (worker, dp rank) is connected.");
    for (key, up) in e.connected() {
        let _ = writeln!(
            out,
            "router_kv_events_connected{{worker=\"{}\",dp_rank=\"{}\"}} {}",
            esc(key.worker.as_str()),
            key.rank,
            u8::from(up)
        );
    }
    head(out, "router_index_nodes", "gauge", "Blocks in the index.");
    let _ = writeln!(out, "router_index_nodes {}", index.nodes);
    head(out, "router_index_holdings", "gauge", "(block, stream) pairs in the index.");
    let _ = writeln!(out, "router_index_holdings {}", index.holdings);
    head(out, "router_index_memory_bytes", "gauge", "Bytes allocated by the index.");
    let _ = writeln!(out, "router_index_memory_bytes {}", index.memory_bytes);
    counter(
        out,
        "router_index_evicted_nodes_total",
        "Blocks evicted to keep the index bounded.",
        &[("", index.evicted_nodes)],
    );
    head(out, "router_index_pending_credits", "gauge", "Pending-prefix credits held.");
    let _ = writeln!(out, "router_index_pending_credits {}", index.pending);
}
