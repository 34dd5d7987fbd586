//! The router's metric exposition: Prometheus text of the KV-event side and
//! the index. The histogram type is the gateway's.

pub use gateway::metrics::Histogram;

/// Prometheus text exposition of the KV-event side and the index.
pub mod prometheus {
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};

    use kv_events::EventMetrics;
    use kv_index::IndexStats;

    use gateway::metrics::{escape as esc, head};

    use crate::events::FleetMetrics;
    use crate::pump::PumpMetrics;

    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn counter(out: &mut String, name: &str, help: &str, series: &[(&str, u64)]) {
        head(out, name, "counter", help);
        for (labels, v) in series {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    }

    /// Appends every KV-event and index metric.
    pub fn render_kv_events(out: &mut String, e: &EventMetrics, p: &PumpMetrics, f: &FleetMetrics, index: &IndexStats) {
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
            ],
        );
        counter(out, "router_kv_events_resets_total", "Publisher restarts detected.", &[("", get(&e.resets))]);
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
            "router_kv_events_duplicate_batches_total",
            "Batches at or before the applied seq, dropped.",
            &[("", get(&p.duplicates))],
        );
        counter(
            out,
            "router_kv_events_hash_mismatches_total",
            "SGLang stored blocks whose engine hash differs from the router's (wrong page size, tokenizer or namespace).",
            &[("", get(&p.hash_mismatches))],
        );
        counter(
            out,
            "router_kv_events_refused_workers_total",
            "Workers not followed, by reason.",
            &[
                ("{reason=\"block_size\"}", get(&f.refused_block_size)),
                ("{reason=\"discovery\"}", get(&f.discovery_failures)),
            ],
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
}
