//! The tokio runtimes the router serves on, watched: each registered
//! runtime (the main one, every serving thread's, the probes' and the
//! endpoint picker's) with an event-loop canary, and its workers' busy time
//! and parks read at scrape time (Shepherd Model Gateway 1.13's
//! `smg_tokio_*` gauges, as `router_runtime_*` and `router_event_loop_*`).
//!
//! The canary is a task that sleeps 100 ms and measures how late it wakes: a
//! runtime whose thread is held (a blocking call, a long computation on the
//! serving thread) wakes it late, and a wake more than 5 ms late counts as a
//! stall. Nothing is counted on the request path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::metrics::{escape, head};

/// The canary's sleep: 100 ms (SMG's is 10 ms, on its one runtime; with a runtime per
/// serving thread here, an idle router wakes about 10 times a second per runtime, not 100).
pub const CANARY_PERIOD: Duration = Duration::from_millis(100);
/// A canary wake later than this is a stall.
pub const STALL: Duration = Duration::from_millis(5);

/// The watched runtimes.
#[derive(Debug, Default)]
pub struct Runtimes {
    watched: Mutex<Vec<Arc<Watched>>>,
}

/// One runtime, while it is registered.
#[derive(Debug)]
struct Watched {
    name: String,
    handle: Handle,
    canary: Canary,
    /// Each worker's busy time at the last scrape, and when that was.
    last: Mutex<(Instant, Vec<Duration>)>,
}

/// What the canary saw.
#[derive(Debug, Default)]
struct Canary {
    /// How late its last wake was, in nanoseconds.
    delay_ns: AtomicU64,
    /// Wakes later than [`STALL`].
    stalls: AtomicU64,
    /// Wakes so far.
    ticks: AtomicU64,
}

/// A per-runtime series: its name, type, help, and how to read it.
type Series = (&'static str, &'static str, &'static str, fn(&Watched) -> f64);

/// Registered until dropped: the runtime leaves the registry (and its canary
/// stops) with it.
#[derive(Debug)]
#[must_use = "the runtime is watched until this is dropped"]
pub struct Watch {
    runtimes: Arc<Runtimes>,
    watched: Arc<Watched>,
    canary: tokio::task::AbortHandle,
}

// === impl Runtimes ===

impl Runtimes {
    /// Watches the runtime this is called on as `name` (a name already
    /// watched is left as it is: `None`). Must be called within a runtime.
    pub fn watch(self: &Arc<Self>, name: &str) -> Option<Watch> {
        let handle = Handle::current();
        let mut watched = self.lock();
        if watched.iter().any(|w| w.name == name) {
            return None;
        }
        let busy = busy_times(&handle);
        let w = Arc::new(Watched {
            name: name.to_string(),
            handle: handle.clone(),
            canary: Canary::default(),
            last: Mutex::new((Instant::now(), busy)),
        });
        watched.push(w.clone());
        let canary = handle.spawn(run_canary(w.clone())).abort_handle();
        Some(Watch { runtimes: self.clone(), watched: w, canary })
    }

    /// Appends the runtimes' series to `out`: alive tasks over all of them,
    /// and per runtime its workers, global queue, canary, and per worker its
    /// busy share since the last scrape and its parks.
    pub fn render(&self, out: &mut String) {
        let watched = self.lock().clone();
        if watched.is_empty() {
            return;
        }
        let alive: usize = watched.iter().map(|w| w.handle.metrics().num_alive_tasks()).sum();
        head(out, "router_runtime_alive_tasks", "gauge", "Tokio tasks alive now over the router's runtimes.");
        let _ = writeln!(out, "router_runtime_alive_tasks {alive}");
        let per_runtime: [Series; 5] = [
            ("router_runtime_workers", "gauge", "Worker threads of each runtime.", |w| {
                w.handle.metrics().num_workers() as f64
            }),
            ("router_runtime_global_queue_depth", "gauge", "Tasks waiting in each runtime's global queue.", |w| {
                w.handle.metrics().global_queue_depth() as f64
            }),
            (
                "router_event_loop_delay_seconds",
                "gauge",
                "How late each runtime's canary woke from its last 100 ms sleep.",
                |w| w.canary.delay_ns.load(Ordering::Relaxed) as f64 / 1e9,
            ),
            ("router_event_loop_stalls_total", "counter", "Canary wakes more than 5 ms late, by runtime.", |w| {
                w.canary.stalls.load(Ordering::Relaxed) as f64
            }),
            ("router_event_loop_wakes_total", "counter", "Canary wakes, by runtime.", |w| {
                w.canary.ticks.load(Ordering::Relaxed) as f64
            }),
        ];
        for (name, kind, help, value) in per_runtime {
            head(out, name, kind, help);
            for w in &watched {
                let _ = writeln!(out, "{name}{{runtime=\"{}\"}} {}", escape(&w.name), value(w));
            }
        }
        head(
            out,
            "router_runtime_worker_busy_ratio",
            "gauge",
            "Share of the time since the last scrape each worker thread was busy.",
        );
        for w in &watched {
            let now = (Instant::now(), busy_times(&w.handle));
            let (then, before) = std::mem::replace(&mut *w.last.lock().unwrap_or_else(|p| p.into_inner()), now.clone());
            let wall = now.0.duration_since(then).as_secs_f64().max(1e-9);
            for (i, busy) in now.1.iter().enumerate() {
                let was = before.get(i).copied().unwrap_or_default();
                let ratio = (busy.saturating_sub(was).as_secs_f64() / wall).min(1.0);
                let _ = writeln!(
                    out,
                    "router_runtime_worker_busy_ratio{{runtime=\"{}\",worker=\"{i}\"}} {ratio:.4}",
                    escape(&w.name)
                );
            }
        }
        head(out, "router_runtime_worker_parks_total", "counter", "Times each worker thread parked (went idle).");
        for w in &watched {
            let m = w.handle.metrics();
            for i in 0..m.num_workers() {
                let _ = writeln!(
                    out,
                    "router_runtime_worker_parks_total{{runtime=\"{}\",worker=\"{i}\"}} {}",
                    escape(&w.name),
                    m.worker_park_count(i)
                );
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Watched>>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Each worker's busy time so far.
fn busy_times(handle: &Handle) -> Vec<Duration> {
    let m = handle.metrics();
    (0..m.num_workers()).map(|i| m.worker_total_busy_duration(i)).collect()
}

/// Sleeps [`CANARY_PERIOD`] again and again, recording how late each wake is.
async fn run_canary(w: Arc<Watched>) {
    loop {
        let start = Instant::now();
        tokio::time::sleep(CANARY_PERIOD).await;
        let late = start.elapsed().saturating_sub(CANARY_PERIOD);
        let c = &w.canary;
        c.delay_ns.store(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        if late > STALL {
            c.stalls.fetch_add(1, Ordering::Relaxed);
        }
        c.ticks.fetch_add(1, Ordering::Relaxed);
    }
}

// === impl Watch ===

impl Drop for Watch {
    fn drop(&mut self) {
        self.canary.abort();
        self.runtimes.lock().retain(|w| !Arc::ptr_eq(w, &self.watched));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `series` (name and labels) in `page`.
    fn value(page: &str, series: &str) -> Option<f64> {
        page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_held_runtime_thread_counts_as_a_stall_and_its_series_are_rendered() {
        let runtimes = Arc::new(Runtimes::default());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let watch = runtimes.watch("serve-0").expect("a new name");
            assert!(runtimes.watch("serve-0").is_none(), "one entry per name");
            let ticks = || watch.watched.canary.ticks.load(Ordering::Relaxed);
            // The canary runs: its first wake, within a deadline.
            let deadline = Instant::now() + Duration::from_secs(10);
            while ticks() == 0 {
                assert!(Instant::now() < deadline, "the canary never woke");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let stalls = watch.watched.canary.stalls.load(Ordering::Relaxed);
            // The thread held for longer than the canary sleeps: its next wake is late by more than 5 ms.
            let before = ticks();
            std::thread::sleep(CANARY_PERIOD + Duration::from_millis(50));
            while ticks() == before {
                assert!(Instant::now() < deadline, "the canary never woke again");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(watch.watched.canary.stalls.load(Ordering::Relaxed) > stalls, "the held thread is a stall");
            let mut page = String::new();
            runtimes.render(&mut page);
            assert_eq!(value(&page, "router_runtime_workers{runtime=\"serve-0\"}"), Some(1.0), "{page}");
            assert!(value(&page, "router_event_loop_stalls_total{runtime=\"serve-0\"}") >= Some(1.0), "{page}");
            assert!(value(&page, "router_event_loop_delay_seconds{runtime=\"serve-0\"}").is_some(), "{page}");
            let busy = value(&page, "router_runtime_worker_busy_ratio{runtime=\"serve-0\",worker=\"0\"}").unwrap();
            assert!((0.0..=1.0).contains(&busy), "{page}");
            assert!(value(&page, "router_runtime_worker_parks_total{runtime=\"serve-0\",worker=\"0\"}").is_some());
            assert!(value(&page, "router_runtime_alive_tasks") >= Some(1.0), "the canary at least: {page}");
            drop(watch);
            let mut page = String::new();
            runtimes.render(&mut page);
            assert!(page.is_empty(), "a dropped watch leaves the registry: {page}");
        });
    }
}
