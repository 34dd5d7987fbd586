//! A client of one engine's service (SGLang's scheduler or vLLM's engine,
//! found at the first call: [`Service`]): one HTTP/2 connection, made when
//! first needed and again after it broke; every call bounded by a deadline and
//! every answer by a size. Callers speak SGLang's messages; a vLLM engine's
//! are converted here. Owns the connection and what it learned of the service.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use grpc_wire::{Channel, Messages, Status};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use crate::proto::vllm;
use crate::proto::{
    AbortRequest, AbortResponse, GenerateRequest, GenerateResponse, GetLoadsRequest, GetLoadsResponse,
    GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, GetTokenizerChunk,
    GetTokenizerRequest, HealthCheckRequest, HealthCheckResponse, KvEventBatch, SubscribeKvEventsRequest,
};
use crate::{Method, Service};

/// The largest answer message taken from an engine (a whole sequence's ids and logprobs fit).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The largest tokenizer archive taken from an engine (`GetTokenizer`): today's models'
/// tokenizer files are a few MiB compressed (the largest `tokenizer.json`, some 30 MiB, compress
/// several times).
pub const MAX_TOKENIZER_BYTES: usize = 256 << 20;

/// A tokenizer archive's SHA-256, lowercase hex: the fingerprint `GetTokenizer`'s last chunk carries.
pub fn fingerprint(archive: &[u8]) -> String {
    Sha256::digest(archive).iter().map(|b| format!("{b:02x}")).collect()
}

/// A tokenizer archive as `GetTokenizer` streams it (smg-grpc-servicer's `tokenizer_chunks`):
/// chunks of 64 KiB in order, the last with the archive's [`fingerprint`]; none for an empty one.
pub fn tokenizer_chunks(archive: &[u8]) -> impl Iterator<Item = GetTokenizerChunk> + '_ {
    let (digest, last) = (fingerprint(archive), archive.len().div_ceil(TOKENIZER_CHUNK_BYTES));
    archive.chunks(TOKENIZER_CHUNK_BYTES).enumerate().map(move |(i, data)| GetTokenizerChunk {
        data: data.to_vec(),
        sha256: if i + 1 == last { digest.clone() } else { String::new() },
    })
}

/// `GetTokenizer`'s chunk size.
const TOKENIZER_CHUNK_BYTES: usize = 64 << 10;

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// No connection could be made: nothing reached the engine.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    /// The connection broke during the call.
    #[error("the connection to {0} broke: {1}")]
    Transport(String, String),
    /// The engine ended the call with this status.
    #[error("{0}")]
    Status(Status),
    /// No answer within the deadline.
    #[error("no answer from {0} within {1:?}")]
    Deadline(String, Duration),
    /// The call ended without the answer it owed.
    #[error("{0} ended the call without an answer")]
    NoAnswer(String),
    /// The answer broke the protocol (too large, a fingerprint that does not match).
    #[error("{0} answered wrongly: {1}")]
    Malformed(String, String),
}

impl EngineError {
    /// Nothing of the call reached the engine: it may be sent elsewhere.
    pub fn before_sending(&self) -> bool {
        matches!(self, Self::Connect(..))
    }
}

/// One engine's scheduler service at `host:port`.
#[derive(Debug)]
pub struct Engine {
    authority: String,
    connect_timeout: Duration,
    channel: Mutex<Option<Channel>>,
    /// The service it serves: 0 not known yet, else `Service as u8 + 1`.
    service: AtomicU8,
}

/// A streaming call's answers, in order, then the call's status: a `Generate` call's
/// ([`Generation`]), a `SubscribeKvEvents` subscription's ([`KvEvents`]).
#[derive(Debug)]
pub struct Answers<M> {
    answers: Messages,
    head: http::HeaderMap,
    authority: String,
    kind: std::marker::PhantomData<M>,
}

/// A `Generate` call's answers, as SGLang's messages whichever service sent them.
#[derive(Debug)]
pub enum Generation {
    /// From SGLang's scheduler.
    Sglang(Answers<GenerateResponse>),
    /// From vLLM's engine, for the request of this id (vLLM's answers carry none), and the
    /// `kv_transfer_params_json` its completion handed over (a disaggregated prefill's).
    Vllm(Answers<vllm::GenerateResponse>, String, Option<String>),
}

impl Generation {
    /// The next answer; `None` once the engine ended the call with OK.
    pub async fn next(&mut self) -> Result<Option<GenerateResponse>, EngineError> {
        match self {
            Generation::Sglang(answers) => answers.next().await,
            Generation::Vllm(answers, id, kv) => {
                let m = answers.next().await?;
                if let Some(vllm::Generated::Complete(c)) = m.as_ref().and_then(|m| m.response.as_ref())
                    && c.kv_transfer_params_json.is_some()
                {
                    kv.clone_from(&c.kv_transfer_params_json);
                }
                Ok(m.map(|m| m.to_sglang(id)))
            }
        }
    }

    /// The KV-transfer parameters (a JSON object) a vLLM engine's completion handed over: a
    /// disaggregated prefill's handoff to its decode worker; `None` before or without one.
    pub fn kv_transfer_params(&self) -> Option<&str> {
        match self {
            Generation::Vllm(_, _, kv) => kv.as_deref(),
            Generation::Sglang(_) => None,
        }
    }
}
/// A `SubscribeKvEvents` stream's batches (a subscription never ends with OK of its own).
pub type KvEvents = Answers<KvEventBatch>;

impl<M: prost::Message + Default> Answers<M> {
    fn new(head: http::HeaderMap, answers: Messages, authority: &str) -> Self {
        Self { answers, head, authority: authority.to_owned(), kind: std::marker::PhantomData }
    }

    /// The next answer; `None` once the engine ended the call with OK.
    pub async fn next(&mut self) -> Result<Option<M>, EngineError> {
        match self.answers.next::<M>().await {
            Ok(Some(m)) => Ok(Some(m)),
            Ok(None) => match self.answers.status().or_else(|| Status::from_headers(&self.head)) {
                Some(s) if s.code == Status::OK => Ok(None),
                Some(s) => Err(EngineError::Status(s)),
                None => Err(EngineError::Transport(self.authority.clone(), "the call ended without a status".into())),
            },
            Err(s) if s.code == Status::CANCELLED => Err(EngineError::Transport(self.authority.clone(), s.message)),
            Err(s) => Err(EngineError::Status(s)),
        }
    }
}

impl Engine {
    /// The engine at `authority` (`host:port`); nothing is connected until the first call.
    pub fn new(authority: impl Into<String>, connect_timeout: Duration) -> Self {
        Self { authority: authority.into(), connect_timeout, channel: Mutex::new(None), service: AtomicU8::new(0) }
    }

    /// The engine at `authority`, known to serve `service` (nothing asked to find out).
    pub fn serving(authority: impl Into<String>, connect_timeout: Duration, service: Service) -> Self {
        let engine = Self::new(authority, connect_timeout);
        engine.service.store(service as u8 + 1, Ordering::Relaxed);
        engine
    }

    /// The service it serves, if known yet.
    pub fn known_service(&self) -> Option<Service> {
        match self.service.load(Ordering::Relaxed) {
            1 => Some(Service::Sglang),
            2 => Some(Service::Vllm),
            _ => None,
        }
    }

    /// The service it serves: found once, by a `HealthCheck` of SGLang's scheduler and, if
    /// the engine does not know that service (`UNIMPLEMENTED`), of vLLM's engine. Until an
    /// engine answers one, SGLang's is assumed (and asked again next time). An engine that
    /// cannot be reached, or breaks the call, is that call's error: not asked twice.
    async fn service(&self, deadline: Duration) -> Result<Service, EngineError> {
        if let Some(known) = self.known_service() {
            return Ok(known);
        }
        let asked = |service: Service| {
            self.unary_on::<_, HealthCheckResponse>(service.path(Method::HealthCheck), &HealthCheckRequest {}, deadline)
        };
        let found = match asked(Service::Sglang).await {
            Ok(_) => Some(Service::Sglang),
            Err(EngineError::Status(s)) if s.code == Status::UNIMPLEMENTED => {
                asked(Service::Vllm).await.ok().map(|_| Service::Vllm)
            }
            // Nothing of the caller's call was sent: it may go elsewhere, as a refused connection.
            Err(e @ (EngineError::Connect(..) | EngineError::Transport(..) | EngineError::Deadline(..))) => {
                let why = format!("asking which service it serves: {e}");
                return Err(EngineError::Connect(self.authority.clone(), why));
            }
            Err(_) => None,
        };
        if let Some(service) = found {
            self.service.store(service as u8 + 1, Ordering::Relaxed);
        }
        Ok(found.unwrap_or(Service::Sglang))
    }

    /// Its `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The connection, made now if there is none or it broke.
    async fn channel(&self) -> Result<Channel, EngineError> {
        let mut held = self.channel.lock().await;
        if let Some(c) = held.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let connect = tokio::time::timeout(self.connect_timeout, Channel::connect_to(&self.authority));
        let c = match connect.await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(EngineError::Connect(self.authority.clone(), e.to_string())),
            Err(_) => return Err(EngineError::Connect(self.authority.clone(), "timed out".into())),
        };
        *held = Some(c.clone());
        Ok(c)
    }

    /// Starts a call of `path` with `message`; answers up to [`MAX_ANSWER_BYTES`] each.
    async fn start<M: prost::Message>(
        &self,
        path: &str,
        message: &M,
    ) -> Result<(http::HeaderMap, Messages), EngineError> {
        let mut channel = self.channel().await?;
        channel.unary(path, message, MAX_ANSWER_BYTES).await.map_err(|e| {
            // Refused before the stream opened (the connection was gone): nothing was sent.
            let message = e.to_string();
            if e.is_closed() || e.is_canceled() {
                EngineError::Connect(self.authority.clone(), message)
            } else {
                EngineError::Transport(self.authority.clone(), message)
            }
        })
    }

    /// A unary call of `path`: its one answer within `deadline`.
    async fn unary_on<Q: prost::Message, A: prost::Message + Default>(
        &self,
        path: &str,
        message: &Q,
        deadline: Duration,
    ) -> Result<A, EngineError> {
        let call = async {
            let (head, mut answers) = self.start(path, message).await?;
            if let Some(s) = Status::from_headers(&head).filter(|s| s.code != Status::OK) {
                return Err(EngineError::Status(s));
            }
            match answers.next::<A>().await {
                Ok(Some(a)) => Ok(a),
                Ok(None) => Err(match answers.status().filter(|s| s.code != Status::OK) {
                    Some(s) => EngineError::Status(s),
                    None => EngineError::NoAnswer(self.authority.clone()),
                }),
                Err(s) => Err(EngineError::Status(s)),
            }
        };
        tokio::time::timeout(deadline, call)
            .await
            .unwrap_or(Err(EngineError::Deadline(self.authority.clone(), deadline)))
    }

    /// A unary call of `method` on the engine's service (the same message on both).
    async fn unary<Q: prost::Message, A: prost::Message + Default>(
        &self,
        method: Method,
        message: &Q,
        deadline: Duration,
    ) -> Result<A, EngineError> {
        let service = self.service(deadline).await?;
        self.unary_on(service.path(method), message, deadline).await
    }

    /// `HealthCheck`.
    pub async fn health(&self, deadline: Duration) -> Result<HealthCheckResponse, EngineError> {
        self.unary(Method::HealthCheck, &HealthCheckRequest {}, deadline).await
    }

    /// A unary call of `method` whose answer is SGLang's message, or vLLM's made SGLang's by
    /// `convert`.
    async fn unary_converted<Q, A, V>(
        &self,
        (method, message): (Method, &Q),
        deadline: Duration,
        convert: impl FnOnce(V) -> A,
    ) -> Result<A, EngineError>
    where
        Q: prost::Message,
        A: prost::Message + Default,
        V: prost::Message + Default,
    {
        match self.service(deadline).await? {
            Service::Sglang => self.unary(method, message, deadline).await,
            Service::Vllm => Ok(convert(self.unary(method, message, deadline).await?)),
        }
    }

    /// `GetModelInfo` (vLLM's as SGLang's).
    pub async fn model_info(&self, deadline: Duration) -> Result<GetModelInfoResponse, EngineError> {
        let call = (Method::GetModelInfo, &GetModelInfoRequest {});
        self.unary_converted(call, deadline, vllm::GetModelInfoResponse::to_sglang).await
    }

    /// `GetServerInfo` (vLLM's as SGLang's: its block size as `page_size`, its data-parallel
    /// size as `dp_size`).
    pub async fn server_info(&self, deadline: Duration) -> Result<GetServerInfoResponse, EngineError> {
        let call = (Method::GetServerInfo, &GetServerInfoRequest {});
        self.unary_converted(call, deadline, vllm::GetServerInfoResponse::to_sglang).await
    }

    /// `GetLoads` (every rank, the core section).
    pub async fn loads(&self, deadline: Duration) -> Result<GetLoadsResponse, EngineError> {
        self.unary(Method::GetLoads, &GetLoadsRequest::default(), deadline).await
    }

    /// `Abort` of `request_id` (vLLM's takes ids and answers nothing: `success` then says
    /// only that it was heard).
    pub async fn abort(
        &self,
        request_id: &str,
        reason: &str,
        deadline: Duration,
    ) -> Result<AbortResponse, EngineError> {
        match self.service(deadline).await? {
            Service::Sglang => {
                let asked = AbortRequest { request_id: request_id.into(), reason: reason.into() };
                self.unary(Method::Abort, &asked, deadline).await
            }
            Service::Vllm => {
                let asked = vllm::AbortRequest { request_ids: vec![request_id.into()] };
                let _: vllm::AbortResponse = self.unary(Method::Abort, &asked, deadline).await?;
                Ok(AbortResponse { success: true, message: String::new() })
            }
        }
    }

    /// `Generate`: the call started (its head answered within `deadline`), its answers to read
    /// (a vLLM engine's asked and read in its own messages).
    pub async fn generate(&self, request: &GenerateRequest, deadline: Duration) -> Result<Generation, EngineError> {
        self.generate_with(request, None, deadline).await
    }

    /// [`Engine::generate`] with vLLM's `kv_transfer_params_json` (a JSON object, passed
    /// verbatim to the engine's KV connector: a disaggregated leg's); SGLang's scheduler
    /// service has no such field (`Malformed`, nothing sent).
    pub async fn generate_with(
        &self,
        request: &GenerateRequest,
        kv_transfer_params: Option<&str>,
        deadline: Duration,
    ) -> Result<Generation, EngineError> {
        let service = self.service(deadline).await?;
        let path = service.path(Method::Generate);
        let started = match service {
            Service::Sglang if kv_transfer_params.is_some() => {
                return Err(self.malformed("kv_transfer_params for SGLang's scheduler service, which has none"));
            }
            Service::Sglang => tokio::time::timeout(deadline, self.start(path, request)).await,
            Service::Vllm => {
                let mut asked = vllm::GenerateRequest::from_sglang(request);
                asked.kv_transfer_params_json = kv_transfer_params.map(str::to_owned);
                tokio::time::timeout(deadline, self.start(path, &asked)).await
            }
        };
        let (head, answers) = started.unwrap_or(Err(EngineError::Deadline(self.authority.clone(), deadline)))?;
        Ok(match service {
            Service::Sglang => Generation::Sglang(Answers::new(head, answers, &self.authority)),
            Service::Vllm => {
                Generation::Vllm(Answers::new(head, answers, &self.authority), request.request_id.clone(), None)
            }
        })
    }

    /// `GetTokenizer`: the tokenizer's files as one zip archive, whole within `deadline`, at most
    /// `limit` bytes, and checked against the SHA-256 fingerprint its last chunk carries (the
    /// archive and its fingerprint, lowercase hex).
    pub async fn tokenizer(&self, limit: usize, deadline: Duration) -> Result<(Vec<u8>, String), EngineError> {
        let call = async {
            let path = self.service(deadline).await?.path(Method::GetTokenizer);
            let (head, answers) = self.start(path, &GetTokenizerRequest {}).await?;
            let mut chunks = Answers::<GetTokenizerChunk>::new(head, answers, &self.authority);
            let (mut archive, mut carried) = (Vec::new(), String::new());
            while let Some(chunk) = chunks.next().await? {
                if !carried.is_empty() {
                    return Err(self.malformed("a chunk after the one with the fingerprint"));
                }
                if archive.len() + chunk.data.len() > limit {
                    return Err(self.malformed(&format!("an archive over {limit} bytes")));
                }
                archive.extend_from_slice(&chunk.data);
                carried = chunk.sha256;
            }
            if archive.is_empty() {
                return Err(self.malformed("no archive"));
            }
            let digest = fingerprint(&archive);
            if !carried.eq_ignore_ascii_case(&digest) {
                return Err(self.malformed(&format!("the archive's SHA-256 is {digest}, its fingerprint {carried:?}")));
            }
            Ok((archive, digest))
        };
        tokio::time::timeout(deadline, call)
            .await
            .unwrap_or(Err(EngineError::Deadline(self.authority.clone(), deadline)))
    }

    fn malformed(&self, what: &str) -> EngineError {
        EngineError::Malformed(self.authority.clone(), what.to_owned())
    }

    /// `SubscribeKvEvents` from `start` (0: the current state): the batches as they come.
    pub async fn subscribe_kv_events(&self, start: u64, deadline: Duration) -> Result<KvEvents, EngineError> {
        let asked = SubscribeKvEventsRequest { start_sequence_number: start, load_records_before_first_batch: true };
        let path = self.service(deadline).await?.path(Method::SubscribeKvEvents);
        let started = tokio::time::timeout(deadline, self.start(path, &asked)).await;
        let (head, answers) = started.unwrap_or(Err(EngineError::Deadline(self.authority.clone(), deadline)))?;
        Ok(Answers::new(head, answers, &self.authority))
    }
}
