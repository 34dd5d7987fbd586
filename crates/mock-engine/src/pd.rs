//! The simulated engine's disaggregated roles (`--role prefill|decode`,
//! `--flavor sglang|vllm`): what a router's PD dispatch depends on, checked
//! the way the engines check it (`../shared/docs/pd.md` §4), with a real
//! rendezvous over TCP.
//!
//! ```text
//!            SGLang: one body to both, concurrently            vLLM (NIXL pull): prefill, then decode
//! router ─► prefill: registers bootstrap_room, waits ◄─┐     router ─► prefill (max_tokens 1): KV kept,
//!      └──► decode: connects bootstrap_host:port ──────┘           answers kv_transfer_params
//!           meets the room, gets the KV, then decodes            ─► decode: pulls from remote_host:port
//! ```
//!
//! The prefill role runs a bootstrap listener. SGLang flavour: a prefill
//! request without a room is a 400, a room already in flight a 400; it
//! answers (one token) only after its decode peer met it on the listener
//! with the same room and prompt, within `bootstrap_timeout` (else 500), on
//! the data-parallel rank SGLang would use (`routed_dp_rank`, else
//! `room % dp_size`; a `routed_dp_rank` that contradicts the room without
//! decode's `disagg_prefill_dp_rank` fails, as SGLang's transfer does). The
//! decode role connects to the body's `bootstrap_host:bootstrap_port`
//! (nothing there: a fast 500), meets the room, and only then generates.
//! vLLM flavour: prefill requires `kv_transfer_params.do_remote_decode`,
//! `max_tokens == 1` and `stream == false`, and answers the params of the
//! blocks it kept; decode pulls them from the prefill named in its params,
//! and without complete params (or when the pull fails) prefills locally,
//! silently, as vLLM does: counted in `local_prefill_fallbacks`.
//! Either leg's HTTP client going away drops its side of the rendezvous,
//! so the peer fails at once; `POST /abort_request {"rid"}` aborts by id.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// What the engine does in a disaggregated deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PdRole {
    /// Prefill and decode (SGLang `disaggregation_mode: null`).
    #[default]
    Regular,
    /// Prefill only, with a bootstrap listener.
    Prefill,
    /// Decode only (no radix cache: publishes no KV events).
    Decode,
}

/// Which engine's disaggregation contract it follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Flavor {
    /// One body to both workers, met by `bootstrap_room`.
    #[default]
    Sglang,
    /// Two stages linked by `kv_transfer_params` (NIXL pull).
    Vllm,
}

/// What the PD roles saw; tests assert on these.
#[derive(Debug, Default)]
pub struct PdCounters {
    /// Rooms (SGLang) or transfers (vLLM) that met and completed.
    pub rendezvous: AtomicU64,
    /// Requests refused for a missing or malformed `bootstrap_room` (400).
    pub missing_room: AtomicU64,
    /// Prefill requests refused because their room was already in flight (400).
    pub duplicate_room: AtomicU64,
    /// Transfers failed on the data-parallel rule (the rank decode expected is not prefill's).
    pub dp_mismatch: AtomicU64,
    /// Legs whose peer never came within the bootstrap timeout.
    pub bootstrap_timeouts: AtomicU64,
    /// Rooms met by a peer with another prompt.
    pub prompt_mismatch: AtomicU64,
    /// Decode legs that found nothing at `bootstrap_host:bootstrap_port`.
    pub bootstrap_unreachable: AtomicU64,
    /// Legs whose peer went away (its connection closed) before the transfer ended.
    pub peer_lost: AtomicU64,
    /// Requests aborted by `/abort_request`.
    pub aborted: AtomicU64,
    /// Legs that ended before their rendezvous did: aborted, or their client went away.
    pub cancelled: AtomicU64,
    /// vLLM prefill requests refused for their shape (not `do_remote_decode`, `max_tokens != 1`, streamed).
    pub bad_prefill_shape: AtomicU64,
    /// vLLM decode requests that prefilled locally (missing or incomplete params, or a failed pull).
    pub local_prefill_fallbacks: AtomicU64,
    /// vLLM decode requests whose `X-Request-Id` differs from the one prefill served.
    pub request_id_mismatch: AtomicU64,
}

/// How the PD side of an engine is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdConfig {
    /// Its role.
    pub role: PdRole,
    /// Its flavour.
    pub flavor: Flavor,
    /// Prefill: the bootstrap port to bind (0: any free port). Decode: the port
    /// used when a request's `bootstrap_port` is null (SGLang's default 8998 when 0).
    pub bootstrap_port: u16,
    /// Longest a leg waits for its peer (SGLang: 300 s; shorter here).
    pub bootstrap_timeout: Duration,
    /// vLLM prefill: NixlPushConnector (answers `transfer_mode: push`; its decode peers
    /// register by request id, needing no block ids) instead of the pull connector.
    pub push: bool,
    /// vLLM: the MooncakeConnector. The prefill's bootstrap port also answers `GET /query`
    /// (its engine id per data-parallel rank); a prefill request needs the router's
    /// `transfer_id` and answers no params; decode pulls by that id from `remote_bootstrap_addr`.
    pub mooncake: bool,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            role: PdRole::Regular,
            flavor: Flavor::Sglang,
            bootstrap_port: 0,
            bootstrap_timeout: Duration::from_secs(30),
            push: false,
            mooncake: false,
        }
    }
}

/// Decode's greeting on the bootstrap connection (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    /// SGLang: the room.
    #[serde(default)]
    room: Option<u64>,
    /// The digest of the prompt decode holds.
    digest: u64,
    /// SGLang: decode's `disagg_prefill_dp_rank`.
    #[serde(default)]
    prefill_dp_rank: Option<u64>,
    /// vLLM: prefill's request id and engine id, and the blocks to pull.
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    engine_id: Option<String>,
    #[serde(default)]
    block_ids: Option<Vec<u64>>,
}

/// A decode peer waiting on the listener for its prefill.
struct Peer {
    hello: Hello,
    conn: BufReader<TcpStream>,
}

/// Who arrived first for a room.
enum Slot {
    /// The prefill leg, waiting for its decode peer.
    Prefill(oneshot::Sender<Peer>),
    /// The decode peer, waiting for its prefill.
    Decode(Peer),
}

/// What a vLLM prefill kept for its decode.
#[derive(Debug, Clone)]
struct Kept {
    request_id: String,
    digest: u64,
    block_ids: Vec<u64>,
}

/// Most requests a vLLM prefill remembers having served.
const MAX_KEPT: usize = 4096;
/// Longest a decode leg waits to connect to its prefill's bootstrap listener.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// SGLang's default bootstrap port, used by a decode leg whose request has none.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// The PD side of one engine.
pub struct Pd {
    /// Its setup.
    pub config: PdConfig,
    /// The prefill role's bootstrap listener.
    bootstrap: Option<SocketAddr>,
    /// The engine id vLLM's params name it by.
    pub engine_id: String,
    rooms: Mutex<HashMap<u64, Slot>>,
    /// Rooms of prefill requests in flight (SGLang refuses a second one).
    live_rooms: Mutex<HashSet<u64>>,
    kept: Mutex<VecDeque<Kept>>,
    /// Woken when a prefill keeps blocks (push-mode decode peers may be waiting for them).
    kept_changed: tokio::sync::Notify,
    rids: Mutex<HashMap<String, CancellationToken>>,
    /// What it saw.
    pub counters: PdCounters,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("config", &self.config).field("bootstrap", &self.bootstrap).finish()
    }
}

/// Why a leg failed: its HTTP status and message.
pub(crate) type LegError = (u16, String);

// === impl Pd ===

impl Pd {
    /// Sets up the PD side; a prefill binds its bootstrap listener and serves it until `cancel`.
    pub(crate) async fn start(config: PdConfig, cancel: CancellationToken) -> anyhow::Result<Arc<Self>> {
        let listener = match config.role {
            PdRole::Prefill => Some(TcpListener::bind(("127.0.0.1", config.bootstrap_port)).await?),
            _ => None,
        };
        let pd = Arc::new(Self {
            bootstrap: listener.as_ref().and_then(|l| l.local_addr().ok()),
            engine_id: format!("mock-engine-{:016x}", crate::digest(&[std::process::id(), now_nanos()])),
            config,
            rooms: Mutex::new(HashMap::new()),
            live_rooms: Mutex::new(HashSet::new()),
            kept: Mutex::new(VecDeque::new()),
            kept_changed: tokio::sync::Notify::new(),
            rids: Mutex::new(HashMap::new()),
            counters: PdCounters::default(),
        });
        if let Some(listener) = listener {
            tokio::spawn(accept_loop(pd.clone(), listener, cancel));
        }
        Ok(pd)
    }

    /// The prefill role's bootstrap port.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap.map(|a| a.port())
    }

    /// Registers `rid` for `/abort_request`; the token fires on an abort.
    pub(crate) fn register_rid(self: &Arc<Self>, rid: Option<String>) -> RidGuard {
        let token = CancellationToken::new();
        if let Some(rid) = &rid {
            lock(&self.rids).insert(rid.clone(), token.clone());
        }
        RidGuard { pd: self.clone(), rid, token, done: std::sync::atomic::AtomicBool::new(false) }
    }

    /// `/abort_request`: aborts the request `rid` (or all with `abort_all`); how many were.
    pub fn abort(&self, rid: Option<&str>, all: bool) -> usize {
        let rids = lock(&self.rids);
        let hit: Vec<&CancellationToken> =
            rids.iter().filter(|(r, _)| all || Some(r.as_str()) == rid).map(|(_, t)| t).collect();
        for t in &hit {
            t.cancel();
        }
        self.counters.aborted.fetch_add(hit.len() as u64, Ordering::Relaxed);
        hit.len()
    }

    /// Claims a prefill room; `None` if it is in flight already.
    pub(crate) fn claim_room(self: &Arc<Self>, room: u64) -> Option<RoomGuard> {
        if !lock(&self.live_rooms).insert(room) {
            self.counters.duplicate_room.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(RoomGuard { pd: self.clone(), room })
    }

    /// The SGLang prefill side of a room: waits for the decode peer, checks
    /// its prompt and rank, then runs `prefill` and tells the peer the KV is there.
    pub(crate) async fn meet_as_prefill<F, T>(
        &self,
        room: u64,
        digest: u64,
        rank: usize,
        routed: Option<usize>,
        dp_size: usize,
        prefill: F,
    ) -> Result<T, LegError>
    where
        F: std::future::Future<Output = (T, usize)>,
    {
        let waiting = {
            let mut rooms = lock(&self.rooms);
            match rooms.remove(&room) {
                Some(Slot::Decode(peer)) => Ok(peer),
                Some(other) => {
                    rooms.insert(room, other);
                    return Err((400, format!("bootstrap_room {room} is already in flight")));
                }
                None => {
                    let (tx, rx) = oneshot::channel();
                    rooms.insert(room, Slot::Prefill(tx));
                    Err(rx)
                }
            }
        };
        let mut peer = match waiting {
            Ok(peer) => peer,
            Err(rx) => match tokio::time::timeout(self.config.bootstrap_timeout, rx).await {
                Ok(Ok(peer)) => peer,
                _ => {
                    let mut rooms = lock(&self.rooms);
                    if matches!(rooms.get(&room), Some(Slot::Prefill(_))) {
                        rooms.remove(&room);
                    }
                    self.counters.bootstrap_timeouts.fetch_add(1, Ordering::Relaxed);
                    return Err((
                        500,
                        format!("no decode peer for bootstrap_room {room} within the bootstrap timeout"),
                    ));
                }
            },
        };
        if peer.hello.digest != digest {
            self.counters.prompt_mismatch.fetch_add(1, Ordering::Relaxed);
            return refuse(&mut peer, format!("bootstrap_room {room}: decode holds another prompt")).await;
        }
        // SGLang's transfer: decode fetches from `disagg_prefill_dp_rank`, else from `room % dp_size`;
        // a `routed_dp_rank` off the room is an error unless decode was told the rank.
        let expected = peer.hello.prefill_dp_rank.map_or(room % dp_size as u64, |r| r) as usize;
        let off_room = routed.is_some_and(|r| r as u64 != room % dp_size as u64);
        if expected != rank || (off_room && peer.hello.prefill_dp_rank.is_none()) {
            self.counters.dp_mismatch.fetch_add(1, Ordering::Relaxed);
            return refuse(
                &mut peer,
                format!(
                    "bootstrap_room {room}: decode expects prefill dp rank {expected}, the prefill ran on rank {rank}"
                ),
            )
            .await;
        }
        let (out, cached) = prefill.await;
        let ok = format!("{}\n", json!({"ok": true, "cached_tokens": cached}));
        // Counted before the decode peer hears it: the peer may answer its client (and a test
        // read the count) before this task runs again. Taken back if the peer is gone.
        self.counters.rendezvous.fetch_add(1, Ordering::Relaxed);
        if peer.conn.get_mut().write_all(ok.as_bytes()).await.is_err() {
            self.counters.rendezvous.fetch_sub(1, Ordering::Relaxed);
            self.counters.peer_lost.fetch_add(1, Ordering::Relaxed);
            return Err((500, format!("bootstrap_room {room}: the decode peer left")));
        }
        Ok(out)
    }

    /// Remembers what a vLLM prefill kept for its decode; returns the block ids.
    pub(crate) fn keep(&self, request_id: &str, digest: u64, pages: usize) -> Vec<u64> {
        let block_ids: Vec<u64> = (0..pages.max(1) as u64).map(|i| digest.wrapping_add(i) & 0xffff_ffff).collect();
        let mut kept = lock(&self.kept);
        if kept.len() >= MAX_KEPT {
            kept.pop_front();
        }
        kept.push_back(Kept { request_id: request_id.to_string(), digest, block_ids: block_ids.clone() });
        drop(kept);
        self.kept_changed.notify_waiters();
        block_ids
    }

    /// Hands what a prefill kept to its decode peer: by the exact request id
    /// and blocks (pull), or by the base request id (push: the peer knows no blocks).
    fn take_kept(&self, hello: &Hello) -> Result<(), String> {
        let mut kept = lock(&self.kept);
        let push = hello.block_ids.is_none();
        let found = kept.iter().position(|k| match (push, hello.request_id.as_deref()) {
            (false, Some(id)) => k.request_id == id,
            (true, Some(id)) => base_id(&k.request_id) == base_id(id),
            (_, None) => false,
        });
        let Some(i) = found else {
            return Err(format!("no prefill of request {:?} is kept here", hello.request_id));
        };
        let k = &kept[i];
        if hello.engine_id.as_deref() != Some(self.engine_id.as_str()) {
            return Err(format!("engine id {:?} is not this engine's", hello.engine_id));
        }
        if (!push && Some(&k.block_ids) != hello.block_ids.as_ref()) || k.digest != hello.digest {
            return Err("the blocks or the prompt differ from what prefill kept".into());
        }
        kept.remove(i);
        Ok(())
    }

    /// A push-mode peer waits (up to the bootstrap timeout) for its prefill to keep the blocks.
    async fn take_kept_waiting(&self, hello: &Hello) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.config.bootstrap_timeout;
        loop {
            let changed = self.kept_changed.notified();
            match self.take_kept(hello) {
                Ok(()) => return Ok(()),
                Err(e) if hello.block_ids.is_some() || tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    let _ = tokio::time::timeout_at(deadline, changed).await;
                }
            }
        }
    }
}

/// Tells a decode peer its transfer failed, and why; the prefill leg fails too.
async fn refuse<T>(peer: &mut Peer, why: String) -> Result<T, LegError> {
    let line = format!("{}\n", json!({"ok": false, "error": why}));
    let _ = peer.conn.get_mut().write_all(line.as_bytes()).await;
    Err((500, why))
}

/// Keeps a request id abortable while its request runs.
pub(crate) struct RidGuard {
    pd: Arc<Pd>,
    rid: Option<String>,
    /// Fires on `/abort_request`.
    pub(crate) token: CancellationToken,
    done: std::sync::atomic::AtomicBool,
}

impl RidGuard {
    /// The leg's rendezvous is over (met or failed on its own).
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

impl Drop for RidGuard {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Relaxed) {
            self.pd.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(rid) = &self.rid {
            lock(&self.pd.rids).remove(rid);
        }
    }
}

/// A prefill room in flight, released when its request ends however it ends.
pub(crate) struct RoomGuard {
    pd: Arc<Pd>,
    room: u64,
}

impl Drop for RoomGuard {
    fn drop(&mut self) {
        lock(&self.pd.live_rooms).remove(&self.room);
        let mut rooms = lock(&self.pd.rooms);
        if matches!(rooms.get(&self.room), Some(Slot::Prefill(_))) {
            rooms.remove(&self.room);
        }
    }
}

/// The SGLang decode side of a room: connect to the prefill's bootstrap
/// listener, greet, wait until the KV is there; the prompt tokens the prefill had cached.
pub(crate) async fn meet_as_decode(
    pd: &Pd,
    host: &str,
    port: u16,
    room: u64,
    digest: u64,
    prefill_dp_rank: Option<u64>,
) -> Result<usize, LegError> {
    let hello = Hello { room: Some(room), digest, prefill_dp_rank, request_id: None, engine_id: None, block_ids: None };
    let reply = exchange(pd, host, port, &hello, pd.config.bootstrap_timeout).await?;
    match reply.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(reply.get("cached_tokens").and_then(Value::as_u64).unwrap_or(0) as usize),
        _ => Err((500, reply.get("error").and_then(Value::as_str).unwrap_or("transfer failed").to_string())),
    }
}

/// The vLLM decode side: pull the blocks `params` name from their prefill.
/// `Err` is why the pull could not happen (the caller prefills locally);
/// `Ok` the prompt tokens the prefill had cached.
pub(crate) async fn pull(pd: &Pd, params: &Value, digest: u64, own_id: Option<&str>) -> Result<usize, String> {
    let text = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_string);
    if let Some(addr) = text("remote_bootstrap_addr") {
        // Mooncake: the blocks the prefill kept under the router's transfer id.
        let complete = params.get("do_remote_prefill").and_then(Value::as_bool) == Some(true)
            && text("remote_engine_id").is_some()
            && text("transfer_id").is_some();
        let hostport = addr.strip_prefix("http://").map(|a| a.trim_end_matches('/').to_string());
        let (Some(hostport), true) = (hostport, complete) else {
            return Err(format!("incomplete Mooncake kv_transfer_params: {params}"));
        };
        let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport.as_str(), "0"));
        let hello = Hello {
            room: None,
            digest,
            prefill_dp_rank: None,
            request_id: text("transfer_id"),
            engine_id: text("remote_engine_id"),
            block_ids: None,
        };
        let port = port.parse::<u16>().unwrap_or(0);
        let reply = exchange(pd, host, port, &hello, pd.config.bootstrap_timeout).await.map_err(|(_, e)| e)?;
        return match reply.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(0),
            _ => Err(reply.get("error").and_then(Value::as_str).unwrap_or("pull failed").to_string()),
        };
    }
    let push = params.get("transfer_mode").and_then(Value::as_str) == Some("push")
        && params.get("remote_block_ids").is_none_or(Value::is_null);
    if push {
        // NixlPush: the prefill's identity only; it pushes the blocks of the request with our id.
        let identity = params.get("do_remote_prefill").and_then(Value::as_bool) == Some(true)
            && text("remote_engine_id").is_some()
            && text("remote_host").is_some()
            && params.get("remote_port").and_then(Value::as_u64).is_some()
            && params.get("tp_size").and_then(Value::as_u64).is_some();
        if !identity {
            return Err(format!("incomplete push kv_transfer_params: {params}"));
        }
        let hello = Hello {
            room: None,
            digest,
            prefill_dp_rank: None,
            request_id: own_id.map(str::to_string),
            engine_id: text("remote_engine_id"),
            block_ids: None,
        };
        let host = text("remote_host").unwrap_or_default();
        let port = params["remote_port"].as_u64().and_then(|p| u16::try_from(p).ok()).unwrap_or(0);
        let reply = exchange(pd, &host, port, &hello, pd.config.bootstrap_timeout).await.map_err(|(_, e)| e)?;
        return match reply.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(0),
            _ => Err(reply.get("error").and_then(Value::as_str).unwrap_or("push failed").to_string()),
        };
    }
    let complete = params.get("do_remote_prefill").and_then(Value::as_bool) == Some(true)
        && text("remote_engine_id").is_some()
        && text("remote_request_id").is_some()
        && text("remote_host").is_some()
        && params.get("remote_port").and_then(Value::as_u64).is_some()
        && params.get("remote_block_ids").is_some_and(Value::is_array);
    if !complete {
        return Err(format!("incomplete kv_transfer_params: {params}"));
    }
    let block_ids = params["remote_block_ids"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect());
    let hello = Hello {
        room: None,
        digest,
        prefill_dp_rank: None,
        request_id: text("remote_request_id"),
        engine_id: text("remote_engine_id"),
        block_ids,
    };
    let host = text("remote_host").unwrap_or_default();
    let port = params["remote_port"].as_u64().and_then(|p| u16::try_from(p).ok()).unwrap_or(0);
    let reply = exchange(pd, &host, port, &hello, pd.config.bootstrap_timeout).await.map_err(|(_, e)| e)?;
    match reply.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(params.get("remote_prefill_cached_tokens").and_then(Value::as_u64).unwrap_or(0) as usize),
        _ => Err(reply.get("error").and_then(Value::as_str).unwrap_or("pull failed").to_string()),
    }
}

/// One greeting and its one-line answer on a bootstrap connection.
async fn exchange(pd: &Pd, host: &str, port: u16, hello: &Hello, wait: Duration) -> Result<Value, LegError> {
    let c = &pd.counters;
    let conn = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port))).await {
        Ok(Ok(conn)) => conn,
        _ => {
            c.bootstrap_unreachable.fetch_add(1, Ordering::Relaxed);
            return Err((500, format!("no bootstrap server at {host}:{port}")));
        }
    };
    let mut conn = BufReader::new(conn);
    let line = format!("{}\n", serde_json::to_string(hello).unwrap_or_default());
    if conn.get_mut().write_all(line.as_bytes()).await.is_err() {
        c.peer_lost.fetch_add(1, Ordering::Relaxed);
        return Err((500, "the bootstrap connection broke".into()));
    }
    let mut answer = String::new();
    match tokio::time::timeout(wait, conn.read_line(&mut answer)).await {
        Ok(Ok(n)) if n > 0 => serde_json::from_str(&answer).map_err(|e| (500, format!("bad bootstrap answer: {e}"))),
        Ok(_) => {
            c.peer_lost.fetch_add(1, Ordering::Relaxed);
            Err((500, format!("the prefill peer at {host}:{port} left before the transfer")))
        }
        Err(_) => {
            c.bootstrap_timeouts.fetch_add(1, Ordering::Relaxed);
            Err((500, format!("no KV from {host}:{port} within the bootstrap timeout")))
        }
    }
}

/// The prefill role's bootstrap listener: each connection greets once.
async fn accept_loop(pd: Arc<Pd>, listener: TcpListener, cancel: CancellationToken) {
    loop {
        let conn = tokio::select! {
            () = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((conn, _)) => conn,
                Err(_) => continue,
            },
        };
        tokio::spawn(greeted(pd.clone(), conn));
    }
}

async fn greeted(pd: Arc<Pd>, conn: TcpStream) {
    let mut conn = BufReader::new(conn);
    let mut line = String::new();
    let read = tokio::time::timeout(pd.config.bootstrap_timeout, conn.read_line(&mut line)).await;
    let Ok(Ok(n)) = read else { return };
    if line.starts_with("GET ") {
        return query(&pd, conn, &line).await;
    }
    let Ok(hello) = serde_json::from_str::<Hello>(&line[..n.min(line.len())]) else { return };
    match hello.room {
        // vLLM: the blocks are there or not, at once.
        None => {
            let answer = match pd.take_kept_waiting(&hello).await {
                Ok(()) => {
                    pd.counters.rendezvous.fetch_add(1, Ordering::Relaxed);
                    json!({"ok": true})
                }
                Err(e) => json!({"ok": false, "error": e}),
            };
            let _ = conn.get_mut().write_all(format!("{answer}\n").as_bytes()).await;
        }
        Some(room) => {
            let peer = Peer { hello, conn };
            let mut rooms = lock(&pd.rooms);
            match rooms.remove(&room) {
                Some(Slot::Prefill(tx)) => {
                    // A prefill gone meanwhile drops the peer: its connection closes.
                    let _ = tx.send(peer);
                }
                Some(Slot::Decode(first)) => {
                    // A second decode for one room: the first keeps it, this one is closed.
                    rooms.insert(room, Slot::Decode(first));
                }
                None => {
                    rooms.insert(room, Slot::Decode(peer));
                    drop(rooms);
                    // Forgotten (its connection closed) if no prefill comes in time.
                    let (pd, wait) = (pd.clone(), pd.config.bootstrap_timeout);
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        let mut rooms = lock(&pd.rooms);
                        if matches!(rooms.get(&room), Some(Slot::Decode(_))) {
                            rooms.remove(&room);
                            pd.counters.bootstrap_timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            }
        }
    }
}

/// vLLM Mooncake's bootstrap server: `GET /query` answers the engine id of
/// each data-parallel rank (one HTTP/1.1 answer, then the connection closes).
async fn query(pd: &Pd, mut conn: BufReader<TcpStream>, request_line: &str) {
    // The rest of the head, bounded in lines and time.
    let head = async {
        let mut header = String::new();
        for _ in 0..64 {
            header.clear();
            match conn.read_line(&mut header).await {
                Ok(n) if n > 2 => continue,
                _ => break,
            }
        }
    };
    if tokio::time::timeout(pd.config.bootstrap_timeout, head).await.is_err() {
        return;
    }
    let (status, body) = if pd.config.mooncake && request_line.split_whitespace().nth(1) == Some("/query") {
        let addr = pd.bootstrap.map(|a| a.to_string()).unwrap_or_default();
        ("200 OK", json!({"0": {"engine_id": pd.engine_id, "worker_addr": {"0": {"0": addr}}}}).to_string())
    } else {
        ("404 Not Found", json!({"error": "not found"}).to_string())
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.get_mut().write_all(answer.as_bytes()).await;
}

/// The prompt items of a request: one, or a batch (`/generate` with a `text`
/// list or `input_ids` list of lists; completions with a `prompt` list of prompts).
pub(crate) fn batch(v: &Value, field: &str) -> Option<usize> {
    let list = v.get(field)?.as_array()?;
    let nested = list.first().is_some_and(|x| x.is_array() || x.is_string());
    (nested || (field == "text" && !list.is_empty())).then_some(list.len())
}

/// The rooms of a request with `items` prompts (`None` without a batch): one integer, or a list of one per item.
pub(crate) fn rooms(v: &Value, items: Option<usize>) -> Result<Vec<u64>, String> {
    let room = v.get("bootstrap_room");
    let rooms = match (room, items) {
        (Some(Value::Number(n)), None) => n.as_u64().map(|r| vec![r]),
        (Some(Value::Array(list)), Some(n)) if list.len() == n => list.iter().map(Value::as_u64).collect(),
        _ => None,
    };
    let rooms = rooms.ok_or_else(|| match (room, items) {
        (None | Some(Value::Null), _) => "bootstrap_room is required in disaggregated mode".to_string(),
        (_, Some(n)) => format!("a batch of {n} needs a list of {n} bootstrap rooms"),
        _ => "bootstrap_room must be an integer".to_string(),
    })?;
    if rooms.iter().any(|r| *r > i64::MAX as u64) {
        return Err("bootstrap_room must be in [0, 2^63 - 1]".into());
    }
    Ok(rooms)
}

/// The value of a per-item field: the item's entry of a list, or the one value.
pub(crate) fn per_item(v: &Value, field: &str, i: usize) -> Option<Value> {
    match v.get(field)? {
        Value::Array(list) => list.get(i).cloned(),
        one => Some(one.clone()),
    }
}

fn now_nanos() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An internal request id without vLLM's random 8-hex suffix (`get_base_request_id`).
pub(crate) fn base_id(id: &str) -> String {
    match id.rsplit_once('-') {
        Some((base, tail)) if tail.len() == 8 && tail.bytes().all(|b| b.is_ascii_hexdigit()) => base.to_string(),
        _ => id.to_string(),
    }
}
