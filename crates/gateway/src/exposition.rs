//! The gateway's own series in the Prometheus text format: requests,
//! errors, queue and budget, PD, the routing config's counters, the
//! response caches, the page-hash memos, the policies' trees and the
//! tokenizers' caches. The control plane's `/metrics` puts them together
//! with the fleet's and the process's.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::Gateway;
use crate::metrics::head;

impl Gateway {
    /// Appends the gateway's own series to `out` (the fleet renders its own,
    /// [`crate::metrics::render_process`] the process's).
    pub fn render_metrics(&self, out: &mut String) {
        let gw = self;
        let m = &gw.metrics;
        m.requests.render(out, "router_http_requests_total", "Requests by route and status.");
        m.answers_cut.render(
            out,
            "router_http_answers_cut_total",
            "Answers that broke off after their head went out (the worker failed or fell silent mid-answer), by route.",
        );
        m.decisions.render(out, "router_policy_decisions_total", "Routing decisions by policy and reason.");
        m.grpc_failures.render(
            out,
            "router_grpc_failures_total",
            "gRPC workers' calls that failed, by kind: unreachable, status, broken, deadline, bad_message.",
        );
        m.epp_streams.render(
            out,
            "router_epp_streams_total",
            "The endpoint picker's ext_proc streams by outcome (picked, answered in the gateway's stead, error).",
        );
        m.errors.render(
            out,
            "router_http_errors_total",
            "Requests that failed before a worker's answer, by side (client, upstream, internal) and error type.",
        );
        head(
            out,
            "router_http_retries_total",
            "counter",
            "Attempts sent again (--retry-*): after a worker could not be reached or answered 408, 429 or 5xx.",
        );
        out.push_str(&format!("router_http_retries_total {}\n", m.retries.load(Ordering::Relaxed)));
        head(
            out,
            "router_http_queue_rejected_total",
            "counter",
            "Requests refused while waiting for a slot, by cause.",
        );
        out.push_str(&format!(
        "router_http_queue_rejected_total{{cause=\"full\"}} {}\nrouter_http_queue_rejected_total{{cause=\"timeout\"}} {}\nrouter_http_queue_rejected_total{{cause=\"waiting_cap\"}} {}\n",
        m.queue_full.load(Ordering::Relaxed),
        m.queue_timeouts.load(Ordering::Relaxed),
        m.cap_timeouts.load(Ordering::Relaxed)
    ));
        head(out, "router_http_queue_waiting", "gauge", "Requests waiting for a slot now.");
        out.push_str(&format!("router_http_queue_waiting {}\n", gw.queue.waiting.load(Ordering::Relaxed)));
        let cap = "Requests waiting now for a worker's reported queue under --least-load-max-waiting-requests.";
        head(out, "router_http_waiting_cap_waiting", "gauge", cap);
        out.push_str(&format!("router_http_waiting_cap_waiting {}\n", m.cap_waiting.load(Ordering::Relaxed)));
        m.queue_wait.render(out, "router_http_queue_wait_seconds", "How long queued requests waited for a slot.");
        if let Some(sched) = &gw.scheduler {
            render_scheduler(out, sched);
        }
        head(
            out,
            "router_http_over_budget_total",
            "counter",
            "Requests refused (429) because the memory of requests in progress was at its budget.",
        );
        out.push_str(&format!("router_http_over_budget_total {}\n", m.over_budget.load(Ordering::Relaxed)));
        if let Some(shared) = &gw.shared {
            shared.render_metrics(out);
        }
        if let Some(limiter) = &gw.tenant_limiter {
            head(
                out,
                "router_tenant_rate_limited_total",
                "counter",
                "Requests refused (429) over their tenant's rate limit.",
            );
            out.push_str(&format!(
                "router_tenant_rate_limited_total {}\n",
                m.tenant_rate_limited.load(Ordering::Relaxed)
            ));
            head(out, "router_tenant_rate_limit_tenants", "gauge", "Tenants with rate-limit buckets now.");
            out.push_str(&format!("router_tenant_rate_limit_tenants {}\n", limiter.tenants()));
        }
        head(
            out,
            "router_prompt_renders_total",
            "counter",
            "Prompts rendered and tokenized (at most once per request and renderer).",
        );
        out.push_str(&format!("router_prompt_renders_total {}\n", m.prompts.renders.load(Ordering::Relaxed)));
        head(
            out,
            "router_prompt_images_total",
            "counter",
            "Images in rendered chats, by identity: computed (vLLM's identifier), given (the client's uuid), unknown (the prompt is credited up to it).",
        );
        for (identity, n) in renderer::vision::Identity::KINDS.iter().zip(&m.prompts.images) {
            out.push_str(&format!(
                "router_prompt_images_total{{identity=\"{identity}\"}} {}\n",
                n.load(Ordering::Relaxed)
            ));
        }
        head(
            out,
            "router_accept_errors_total",
            "counter",
            "Failed accepts on the client listener (out of file descriptors and the like); each backs off 10 ms to 1 s.",
        );
        out.push_str(&format!("router_accept_errors_total {}\n", m.accept_errors.load(Ordering::Relaxed)));
        head(out, "router_http_request_memory_bytes", "gauge", "Memory reserved by the requests in progress.");
        out.push_str(&format!("router_http_request_memory_bytes {}\n", gw.budget.used()));
        m.latency.render(out, "router_http_request_duration_seconds", "Whole-request latency, streaming included.");
        m.ttfb.render(out, "router_http_time_to_first_byte_seconds", "Time until the worker's response headers.");
        m.matched_tokens.render(out, "router_policy_matched_tokens", "Prompt tokens the chosen worker already held.");
        m.cached.render(out);
        if let Some(t) = &gw.config.tracer {
            head(
                out,
                "router_trace_spans_total",
                "counter",
                "Request spans by outcome (--enable-trace): exported, dropped (the queue full), failed (the export failed).",
            );
            let c = &t.counters;
            for (outcome, n) in [("exported", &c.exported), ("dropped", &c.dropped), ("failed", &c.failed)] {
                out.push_str(&format!(
                    "router_trace_spans_total{{outcome=\"{outcome}\"}} {}\n",
                    n.load(Ordering::Relaxed)
                ));
            }
        }
        if gw.disaggregated() {
            m.pd_decisions.render(
                out,
                "router_pd_decisions_total",
                "Disaggregated decisions by leg, policy and reason.",
            );
            m.pd_legs.render(out, "router_pd_legs_total", "Disaggregated requests' legs by leg and outcome.");
            m.pd_paths.render(
                out,
                "router_pd_paths_total",
                "Disaggregated attempts by path: disaggregated (both legs) or decode_alone (the prefill leg skipped).",
            );
            m.pd_aborts.render(
                out,
                "router_pd_aborts_total",
                "Legs aborted (connection closed, /abort_request) because the other leg failed, by the leg aborted.",
            );
            m.pd_heads.render(
                out,
                "router_pd_heads_seconds",
                "Time from a disaggregated dispatch until both legs answered their heads.",
            );
        }
        if let (Some(slot), Some(r)) = (&gw.routing, gw.routing()) {
            slot.reloads.render(
                out,
                "router_model_reloads_total",
                "Routing config reloads by outcome (ok, invalid, unreadable).",
            );
            let m = &r.metrics;
            m.requests.render(
                out,
                "router_model_requests_total",
                "Requests by the pool that served them and the decision.",
            );
            m.blocks.render(
                out,
                "router_model_blocks_total",
                "Requests a decision's block plugin answered, by decision.",
            );
            m.redactions.render(
                out,
                "router_model_redactions_total",
                "Values pii_redact replaced with placeholders, by type.",
            );
            m.sessions.render(
            out,
            "router_model_sessions_total",
            "Auto-routed conversations by what stickiness did: new, same pool, stayed (kept by its cached prefix), switched.",
        );
            head(out, "router_model_sessions", "gauge", "Conversations remembered for stickiness now.");
            out.push_str(&format!("router_model_sessions {}\n", r.sessions.len()));
            m.signal_seconds.render(
                out,
                "router_model_signal_seconds",
                "Time computing signals and choosing the decision, per auto-routed request.",
            );
            m.cache_lookups.render(
            out,
            "router_response_cache_lookups_total",
            "Response-cache lookups by decision and outcome (hit_exact, hit_semantic, miss, skip_sampling, skip_choices, skip_bypass).",
        );
            m.cache_stores.render(
                out,
                "router_response_cache_stores_total",
                "Complete answers stored in a response cache, by decision.",
            );
            m.cascades.render(
            out,
            "router_cascade_total",
            "Requests a cascade plugin judged or let pass, by decision and outcome (kept, escalated, no_logprobs, skip_stream, skip_route, too_large, failed).",
        );
            m.guarded.render(
                out,
                "router_response_guard_total",
                "2xx answers a response_guard plugin read, by decision and outcome (clean, annotated, redacted, blocked, too_large, failed).",
            );
            m.guard_findings.render(
                out,
                "router_response_guard_findings_total",
                "What a response_guard plugin found in answers, by decision and finding (a PII type, or jailbreak:<rule>).",
            );
            let learning = slot.learning();
            learning.counts.render(
            out,
            "router_route_feedback_total",
            "Feedback by kind (verdict, preference) and outcome (accepted, unknown_route, already_judged, invalid, rate_limited, over_weight).",
        );
            head(out, "router_route_ids", "gauge", "Route ids (x-route-id) remembered for feedback now.");
            out.push_str(&format!("router_route_ids {}\n", learning.routes_held()));
            head(out, "router_route_feedback_arms", "gauge", "(decision, pool) pairs with feedback evidence now.");
            out.push_str(&format!("router_route_feedback_arms {}\n", learning.arms_held()));
            if r.caches_answers() {
                head(out, "router_response_cache_entries", "gauge", "Answers a response cache holds now, by decision.");
                for (d, store) in r.selector.config().decisions.iter().zip(&r.caches) {
                    if let Some(store) = store {
                        let name = crate::metrics::escape(&d.name);
                        out.push_str(&format!(
                            "router_response_cache_entries{{decision=\"{name}\"}} {}\n",
                            store.len()
                        ));
                    }
                }
            }
            if let Some(pool) = slot.embedder() {
                crate::pools::render_embedding(pool, out);
            }
        }
        let (hashed, reused) = gw
            .pools
            .iter()
            .map(|p| p.chain_memo.stats())
            .fold((0, 0), |(h, r), s| (h + s.pages_hashed, r + s.pages_reused));
        head(
            out,
            "router_page_hashes_total",
            "counter",
            "Request pages hashed (SHA-256) or reused from the chain memo.",
        );
        out.push_str(&format!("router_page_hashes_total{{source=\"hashed\"}} {hashed}\n"));
        out.push_str(&format!("router_page_hashes_total{{source=\"memo\"}} {reused}\n"));
        head(out, "router_page_hash_memo_pages", "gauge", "Page digests the page-hash memos hold now.");
        let memo: usize = gw.pools.iter().map(|p| p.chain_memo.len()).sum();
        out.push_str(&format!("router_page_hash_memo_pages {memo}\n"));
        head(
            out,
            "router_policy_tree_bytes",
            "gauge",
            "Bytes the policies' text trees hold now (their text and their nodes), by pool; bounded by --approx-max-tree-bytes each.",
        );
        for p in &gw.pools {
            let pool = crate::metrics::escape(&p.id.0);
            let decode = p.pd.as_ref().map_or(0, |pd| pd.decode_policy.held_bytes());
            out.push_str(&format!("router_policy_tree_bytes{{pool=\"{pool}\"}} {}\n", p.policy.held_bytes() + decode));
        }
        // Each renderer once (pools may share the router's).
        let mut renderers: Vec<&Arc<renderer::Renderer>> = Vec::new();
        for p in &gw.pools {
            if !renderers.iter().any(|r| Arc::ptr_eq(r, &p.renderer)) {
                renderers.push(&p.renderer);
            }
        }
        let stats: Vec<renderer::CacheStats> = renderers.iter().map(|r| r.tokenizer().cache_stats()).collect();
        head(
            out,
            "router_tokenizer_cache_bytes",
            "gauge",
            "Bytes the tokenizers' caches hold now, by cache (segment: text bytes; word: the fast path's words with ids and overhead).",
        );
        out.push_str(&format!(
            "router_tokenizer_cache_bytes{{cache=\"segment\"}} {}\n",
            stats.iter().map(|s| s.segment_bytes).sum::<usize>()
        ));
        out.push_str(&format!(
            "router_tokenizer_cache_bytes{{cache=\"word\"}} {}\n",
            stats.iter().map(|s| s.word_bytes).sum::<usize>()
        ));
        head(out, "router_tokenizer_cache_segments", "gauge", "Segments the tokenizers' segment caches hold now.");
        out.push_str(&format!(
            "router_tokenizer_cache_segments {}\n",
            stats.iter().map(|s| s.segment_entries).sum::<usize>()
        ));
    }
}

/// The priority scheduler's series, by class.
fn render_scheduler(out: &mut String, sched: &crate::pipeline::scheduler::Scheduler) {
    use crate::pipeline::scheduler::Class;
    let (in_flight, waiting) = sched.occupancy();
    let reserved = sched.reserved();
    let gauges: [(&str, &str, [usize; 4]); 3] = [
        ("router_scheduler_in_flight", "Requests in flight by priority class.", in_flight),
        ("router_scheduler_waiting", "Requests waiting by priority class.", waiting),
        ("router_scheduler_reserved_slots", "Slots each priority class reserves for itself and above.", reserved),
    ];
    for (name, help, values) in gauges {
        head(out, name, "gauge", help);
        for c in Class::ALL {
            out.push_str(&format!("{name}{{class=\"{}\"}} {}\n", c.as_str(), values[c as usize]));
        }
    }
    type Read = fn(&crate::pipeline::scheduler::ClassCounters) -> u64;
    let counters: [(&str, &str, Read); 4] = [
        ("router_scheduler_admitted_total", "Requests admitted by priority class.", |c| {
            c.admitted.load(Ordering::Relaxed)
        }),
        ("router_scheduler_preempted_total", "Queued requests preempted by a higher class, by their class.", |c| {
            c.preempted.load(Ordering::Relaxed)
        }),
        ("router_scheduler_queue_full_total", "Requests refused with their class's queue full.", |c| {
            c.queue_full.load(Ordering::Relaxed)
        }),
        ("router_scheduler_queue_timeouts_total", "Requests that waited their class's whole timeout.", |c| {
            c.timeouts.load(Ordering::Relaxed)
        }),
    ];
    for (name, help, get) in counters {
        head(out, name, "counter", help);
        for c in Class::ALL {
            out.push_str(&format!("{name}{{class=\"{}\"}} {}\n", c.as_str(), get(&sched.counters[c as usize])));
        }
    }
}
