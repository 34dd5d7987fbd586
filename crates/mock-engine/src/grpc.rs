//! The engine's gRPC service (`--grpc-listen`): SGLang's scheduler service as
//! Shepherd Model Gateway defines it (`engine_grpc`), or vLLM's engine service
//! (`--grpc-service vllm`: its messages converted to the same engine), over
//! the same cache, timing model and KV events as the HTTP API. A caller sends
//! token ids and sampling parameters and gets token ids back, streamed or whole.

use std::sync::Arc;
use std::time::Duration;

use engine_grpc::proto::vllm;
use engine_grpc::proto::{
    AbortRequest, AbortResponse, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk, Generated,
    GetLoadsResponse, GetModelInfoResponse, GetServerInfoResponse, HealthCheckResponse, MatchedStop, OutputLogProbs,
    SchedulerLoad, SubscribeKvEventsRequest,
};
use engine_grpc::{Method, Service};
use grpc_wire::wkt::{Struct, Value};
use grpc_wire::{Handler, Messages, Replies, Started, Status};
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, RequestFault};
use crate::reply::{Release, Script};

/// Longest a caller may take to send its one request message.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most sequences one request may ask for (`n`).
const MAX_N: u32 = 16;

/// The scheduler service over one engine.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub(crate) engine: Arc<Engine>,
    /// The text every answer is made of, as token ids (its first `max_new_tokens`).
    pub(crate) output: Vec<u32>,
    /// The engine stops: open subscriptions end.
    cancel: CancellationToken,
    /// The requests generating, by id: `Abort` cancels one.
    running: std::sync::Mutex<std::collections::HashMap<String, CancellationToken>>,
    /// The service it serves (the other's methods are unknown to it).
    service: Service,
}

/// Takes a request out of the running set however its call ends.
struct Running<'a>(&'a Scheduler, String);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

impl Scheduler {
    pub(crate) fn new(engine: Arc<Engine>, cancel: CancellationToken) -> Self {
        let text: String = engine.config().reply_text.clone().unwrap_or_else(|| Script::default().text(512));
        let output = engine.renderer().tokenizer().encode(&text, false).unwrap_or_default();
        let service = engine.config().grpc_service;
        Self { engine, output, cancel, running: Default::default(), service }
    }
}

/// Serves the scheduler service on `listener` until `cancel`.
pub(crate) fn spawn(listener: tokio::net::TcpListener, scheduler: Arc<Scheduler>, cancel: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                () = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "gRPC accept failed");
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (scheduler, stop) = (scheduler.clone(), cancel.clone());
            tokio::spawn(grpc_wire::serve_connection(tcp, scheduler, grpc_wire::Limits::default(), async move {
                stop.cancelled().await
            }));
        }
    });
}

impl Handler for Scheduler {
    fn call(self: Arc<Self>, p: &str, mut calls: Messages, replies: Replies) -> Option<Started> {
        let e = self.engine.clone();
        // The standard health service, as the servicers register it: serving, the server as a
        // whole ("") and the engine's service.
        if p == grpc_wire::health::CHECK_PATH {
            return Some(Box::pin(async move {
                use grpc_wire::health::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
                let asked: HealthCheckRequest = match read(&mut calls).await {
                    Ok(a) => a,
                    Err(status) => return status,
                };
                if !asked.service.is_empty() && asked.service != self.service.name() {
                    return Status::new(5, format!("unknown service {}", asked.service));
                }
                answer(&replies, &HealthCheckResponse { status: ServingStatus::Serving as i32 }).await
            }));
        }
        // The other service's methods are unknown here (UNIMPLEMENTED), as on a real engine.
        let (_, method) = Service::method_of(p).filter(|(service, _)| *service == self.service)?;
        let vllm = self.service == Service::Vllm;
        let started: Started = match method {
            Method::Generate => Box::pin(async move {
                // vLLM's KV-transfer parameters (a disaggregated leg's) beside SGLang's shape.
                let asked = match vllm {
                    true => read::<vllm::GenerateRequest>(&mut calls)
                        .await
                        .map(|r| (r.to_sglang(), r.kv_transfer_params_json)),
                    false => read(&mut calls).await.map(|r| (r, None)),
                };
                match asked {
                    Ok((asked, kv)) => self.generate(asked, kv, &replies).await,
                    Err(status) => status,
                }
            }),
            Method::HealthCheck => Box::pin(async move {
                let healthy = HealthCheckResponse { healthy: true, message: String::new() };
                answer(&replies, &healthy).await
            }),
            Method::Abort => Box::pin(async move {
                let ids = match vllm {
                    true => read::<vllm::AbortRequest>(&mut calls).await.map(|a| a.request_ids),
                    false => read::<AbortRequest>(&mut calls).await.map(|a| vec![a.request_id]),
                };
                let ids = match ids {
                    Ok(ids) => ids,
                    Err(status) => return status,
                };
                let mut found = false;
                for id in &ids {
                    let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
                    found |= running.inspect(CancellationToken::cancel).is_some();
                    found |= e.pd().is_some_and(|pd| pd.abort(Some(id), false) > 0);
                }
                match vllm {
                    true => answer(&replies, &vllm::AbortResponse {}).await,
                    false => answer(&replies, &AbortResponse { success: found, message: String::new() }).await,
                }
            }),
            Method::SubscribeKvEvents => Box::pin(async move {
                let asked: SubscribeKvEventsRequest = match read(&mut calls).await {
                    Ok(a) => a,
                    Err(status) => return status,
                };
                tokio::select! {
                    status = subscribe_kv_events(&e, asked, &replies) => status,
                    () = self.cancel.cancelled() => Status::new(Status::UNAVAILABLE, "the engine stopped"),
                }
            }),
            Method::GetModelInfo => Box::pin(async move {
                match vllm {
                    true => answer(&replies, &vllm::GetModelInfoResponse::from_sglang(model_info(&e))).await,
                    false => answer(&replies, &model_info(&e)).await,
                }
            }),
            Method::GetServerInfo => Box::pin(async move {
                match vllm {
                    true => answer(&replies, &vllm_server_info(&e)).await,
                    false => answer(&replies, &server_info(&e)).await,
                }
            }),
            Method::GetLoads => Box::pin(async move { answer(&replies, &loads(&e)).await }),
            Method::GetTokenizer => Box::pin(async move { tokenizer(&e, &replies).await }),
            Method::FlushCache => return None,
        };
        Some(started)
    }
}

/// The call's one request message, within [`READ_TIMEOUT`].
async fn read<M: prost::Message + Default>(calls: &mut Messages) -> Result<M, Status> {
    match tokio::time::timeout(READ_TIMEOUT, calls.next::<M>()).await {
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err(Status::new(Status::INVALID_ARGUMENT, "no request message")),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(Status::new(Status::DEADLINE_EXCEEDED, "no request message in time")),
    }
}

/// `GetTokenizer`, as smg-grpc-servicer answers it: the model directory's tokenizer files as one
/// deflated zip in chunks of 64 KiB, the last carrying the archive's SHA-256 (hex);
/// `FAILED_PRECONDITION` when the engine was started without a model directory.
async fn tokenizer(e: &Engine, replies: &Replies) -> Status {
    let Some(dir) = e.config().tokenizer_dir.clone() else {
        return Status::new(Status::FAILED_PRECONDITION, "Tokenizer path is not configured on this server.");
    };
    let archive = match tokio::task::spawn_blocking(move || renderer::bundle::pack(&dir)).await {
        Ok(Ok(a)) => a,
        Ok(Err(err)) => return Status::new(Status::INTERNAL, err.to_string()),
        Err(err) => return Status::new(Status::INTERNAL, err.to_string()),
    };
    for chunk in engine_grpc::tokenizer_chunks(&archive) {
        if replies.send(&chunk).await.is_err() {
            return Status::new(Status::CANCELLED, "the caller left");
        }
    }
    Status::ok()
}

/// A unary call's answer, and its status.
async fn answer<M: prost::Message>(replies: &Replies, m: &M) -> Status {
    match replies.send(m).await {
        Ok(()) => Status::ok(),
        Err(_) => Status::new(Status::CANCELLED, "the caller left"),
    }
}

impl Scheduler {
    /// One `Generate` call: the prompt admitted (cache, prefill, KV events), then
    /// `max_new_tokens` tokens for each of its `n` sequences, a chunk per decode
    /// step when streamed, then each sequence's `GenerateComplete`.
    /// Sends an answer in the caller's service's messages.
    /// `handoff`: a vLLM prefill's KV-transfer parameters, on its completion.
    async fn send(&self, replies: &Replies, m: GenerateResponse, handoff: Option<&str>) -> Result<(), ()> {
        let sent = match self.service {
            Service::Sglang => replies.send(&m).await,
            Service::Vllm => {
                let mut m = vllm::GenerateResponse::from_sglang(m);
                if let Some(vllm::Generated::Complete(c)) = m.response.as_mut() {
                    c.kv_transfer_params_json = handoff.map(str::to_owned);
                }
                replies.send(&m).await
            }
        };
        sent.map_err(|_| ())
    }

    async fn generate(&self, asked: GenerateRequest, kv: Option<String>, replies: &Replies) -> Status {
        let e = &self.engine;
        let tokens = asked.tokenized.as_ref().map(|t| t.input_ids.as_slice()).unwrap_or_default();
        if tokens.is_empty() {
            return Status::new(Status::INVALID_ARGUMENT, "no input_ids");
        }
        let vocab = e.renderer().prompt_vocab_size();
        if let Some(bad) = tokens.iter().find(|t| **t as usize >= vocab) {
            return Status::new(Status::INVALID_ARGUMENT, format!("token id {bad} is out of the vocabulary ({vocab})"));
        }
        match e.take_fault(asked.stream) {
            Some(RequestFault::Fail(status)) => {
                return Status::new(Status::UNAVAILABLE, format!("injected failure ({status})"));
            }
            Some(RequestFault::Hang) => std::future::pending::<()>().await,
            Some(RequestFault::Hold) => e.hold().await,
            Some(RequestFault::DieMidStream) | None => {}
        }
        let aborted = CancellationToken::new();
        let _running = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.insert(asked.request_id.clone(), aborted.clone());
            Running(self, asked.request_id.clone())
        };
        let params = asked.sampling_params.clone().unwrap_or_default();
        let n = params.n.clamp(1, MAX_N) as usize;
        let max = params.max_new_tokens.map_or(e.config().default_max_tokens, |m| m as usize);
        let rank = asked.data_parallel_rank.and_then(|r| usize::try_from(r).ok());
        // A disaggregated role meets its peer first; its prefill leg answers one token.
        let (guard, max, _room, handoff) = match e.pd() {
            Some(pd) => match crate::grpc_pd::admit(e, pd, &asked, kv.as_deref(), tokens).await {
                Ok(leg) => (leg.release, if leg.prefill { 1 } else { max }, leg.room, leg.handoff),
                Err(status) => return status,
            },
            None => (Release { engine: e.clone(), admission: e.admit(tokens, rank).await }, max, None, None),
        };
        let (prompt, cached) = (guard.admission.prompt_tokens as u32, guard.admission.cached_tokens as u32);
        let die = asked.stream && e.take_fault_mid_stream_pending();
        let logprob = e.token_logprob() as f32;
        let mut out: Vec<u32> = Vec::with_capacity(max);
        let mut matched = None;
        for i in 0..max {
            tokio::select! {
                () = e.decode_step() => {}
                () = aborted.cancelled() => {
                    e.cancelled_streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Status::new(Status::CANCELLED, "aborted");
                }
            }
            let t = self.output[i % self.output.len().max(1)];
            out.push(t);
            if !params.ignore_eos && params.stop_token_ids.contains(&t) {
                matched = Some(MatchedStop::TokenId(t));
            }
            if asked.stream {
                for index in 0..n as u32 {
                    let chunk = GenerateStreamChunk {
                        token_ids: vec![t],
                        prompt_tokens: prompt,
                        completion_tokens: out.len() as u32,
                        cached_tokens: cached,
                        output_logprobs: asked.return_logprob.then(|| logprobs(&[t], logprob)),
                        index,
                        ..Default::default()
                    };
                    let m = GenerateResponse {
                        request_id: asked.request_id.clone(),
                        response: Some(Generated::Chunk(chunk)),
                    };
                    if self.send(replies, m, None).await.is_err() {
                        e.cancelled_streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Status::new(Status::CANCELLED, "the caller left");
                    }
                }
                if die {
                    return Status::new(Status::INTERNAL, "injected: engine died mid-stream");
                }
            }
            if matched.is_some() {
                break;
            }
        }
        let finish_reason = if matched.is_some() { "stop" } else { "length" };
        for index in 0..n as u32 {
            let complete = GenerateComplete {
                // Streamed: the last chunk's tokens (SGLang's servicer sends the last output's); whole: all.
                output_ids: if asked.stream { out.last().copied().into_iter().collect() } else { out.clone() },
                finish_reason: finish_reason.into(),
                prompt_tokens: prompt,
                completion_tokens: out.len() as u32,
                cached_tokens: cached,
                output_logprobs: (asked.return_logprob && !asked.stream).then(|| logprobs(&out, logprob)),
                matched_stop: matched.clone(),
                index,
                ..Default::default()
            };
            let m = GenerateResponse {
                request_id: asked.request_id.clone(),
                response: Some(Generated::Complete(complete)),
            };
            if self.send(replies, m, handoff.as_deref()).await.is_err() {
                return Status::new(Status::CANCELLED, "the caller left");
            }
        }
        drop(guard);
        Status::ok()
    }
}

/// One subscription: the retained history, then the live batches, until the caller leaves.
/// As the smg servicer's relay: a cursor other than zero is refused (`OUT_OF_RANGE`:
/// resubscribe from zero), and a subscriber that fell behind is ended (`DATA_LOSS`).
async fn subscribe_kv_events(e: &Engine, asked: SubscribeKvEventsRequest, replies: &Replies) -> Status {
    let Some(events) = &e.grpc_events else {
        return Status::new(Status::UNIMPLEMENTED, "KV cache events have no publisher to relay");
    };
    if asked.start_sequence_number != 0 {
        return Status::new(11, "KV event cursors are per subscription; resubscribe with zero");
    }
    let (history, mut live) = events.subscribe();
    for batch in history {
        if replies.send(batch.as_ref()).await.is_err() {
            return Status::new(Status::CANCELLED, "the caller left");
        }
    }
    loop {
        match live.recv().await {
            Ok(batch) => {
                if replies.send(batch.as_ref()).await.is_err() {
                    return Status::new(Status::CANCELLED, "the caller left");
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                return Status::new(15, format!("the subscriber fell {n} batches behind"));
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return Status::ok(),
        }
    }
}

fn logprobs(ids: &[u32], logprob: f32) -> OutputLogProbs {
    OutputLogProbs { token_logprobs: vec![logprob; ids.len()], token_ids: ids.to_vec(), top_logprobs: Vec::new() }
}

fn model_info(e: &Engine) -> GetModelInfoResponse {
    let c = e.config();
    GetModelInfoResponse {
        model_path: c.model_id.clone(),
        tokenizer_path: c.model_id.clone(),
        is_generation: true,
        served_model_name: c.model_id.clone(),
        max_context_length: i32::try_from(c.capacity_tokens).unwrap_or(i32::MAX),
        vocab_size: i32::try_from(e.renderer().prompt_vocab_size()).unwrap_or(i32::MAX),
        model_type: "mock".into(),
        max_req_input_len: i32::try_from(c.capacity_tokens).unwrap_or(i32::MAX),
        architectures: vec!["MockForCausalLM".into()],
        ..Default::default()
    }
}

/// vLLM's server info: its block size and data-parallel size.
fn vllm_server_info(e: &Engine) -> vllm::GetServerInfoResponse {
    let c = e.config();
    vllm::GetServerInfoResponse {
        active_requests: e.loads().iter().map(|l| l.num_running_reqs as u32).sum(),
        server_type: "vllm-grpc".into(),
        data_parallel_size: i32::try_from(c.dp_size).unwrap_or(1),
        block_size: i32::try_from(c.page_size).unwrap_or(0),
        max_num_seqs: 256,
        ..Default::default()
    }
}

fn server_info(e: &Engine) -> GetServerInfoResponse {
    let c = e.config();
    let mode = match e.pd().map(|pd| pd.config.role) {
        Some(crate::PdRole::Prefill) => "prefill",
        Some(crate::PdRole::Decode) => "decode",
        _ => "null",
    };
    let mut args = Struct::default();
    for (k, v) in [
        ("model_path", Value::string(&c.model_id)),
        ("served_model_name", Value::string(&c.model_id)),
        ("page_size", Value::number(c.page_size as f64)),
        ("dp_size", Value::number(c.dp_size as f64)),
        ("tp_size", Value::number(1.0)),
        ("disaggregation_mode", Value::string(mode)),
        ("context_length", Value::number(c.capacity_tokens as f64)),
    ] {
        args.fields.insert(k.into(), v);
    }
    // A prefill's bootstrap listener, where its decode peers meet it (as SGLang's server args say).
    if let Some(port) = e.pd().and_then(|pd| pd.bootstrap_port()) {
        args.fields.insert("disaggregation_bootstrap_port".into(), Value::number(f64::from(port)));
    }
    GetServerInfoResponse {
        server_args: Some(args),
        active_requests: e.loads().iter().map(|l| l.num_running_reqs as i32).sum(),
        sglang_version: "0.5.10-mock".into(),
        server_type: "grpc".into(),
        max_total_num_tokens: i32::try_from(c.capacity_tokens).unwrap_or(i32::MAX),
        ..Default::default()
    }
}

fn loads(e: &Engine) -> GetLoadsResponse {
    let c = e.config();
    let loads: Vec<SchedulerLoad> = e
        .loads()
        .into_iter()
        .map(|l| SchedulerLoad {
            dp_rank: l.dp_rank as i32,
            num_running_reqs: l.num_running_reqs as i32,
            num_waiting_reqs: l.num_waiting_reqs as i32,
            num_total_reqs: (l.num_running_reqs + l.num_waiting_reqs) as i32,
            max_total_num_tokens: i32::try_from(c.capacity_tokens).unwrap_or(i32::MAX),
            token_usage: l.token_usage,
            num_waiting_uncached_tokens: i32::try_from(l.num_waiting_uncached_tokens).unwrap_or(i32::MAX),
            gen_throughput: l.gen_throughput,
            ..Default::default()
        })
        .collect();
    GetLoadsResponse { version: "0.5.10-mock".into(), dp_rank_count: loads.len() as i32, loads, ..Default::default() }
}
