//! A `Generate` call's answers made into the client's: OpenAI's chat and
//! completion objects (whole, or SSE chunks as tokens come) and SGLang's
//! `/generate` answer, one [`Answer`] per request holding each sequence's
//! state. Every engine message is checked (its request id, its sequence
//! index) before anything is made of it.

use std::sync::Arc;

use engine_grpc::proto::{GenerateResponse, Generated, MatchedStop};
use renderer::Renderer;
use serde_json::{Value, json};

use super::reasoning::Stream as ReasoningStream;
use super::request::Asked;
use super::sequence::{Finish, Sequence, TokenLogprob};
use super::tools::Stream as ToolStream;
use crate::pipeline::request::Route;

/// Why an engine's message cannot be made into an answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadMessage {
    #[error("the engine answered for request {0:?}, not this one")]
    OtherRequest(String),
    #[error("the engine answered for sequence {0} of {1}")]
    NoSuchSequence(u32, u32),
    #[error("the engine sent an empty answer")]
    Empty,
    #[error("the engine sent token id {0}, outside the vocabulary ({1})")]
    BadToken(u32, usize),
}

/// One request's answer in the making.
pub(crate) struct Answer {
    renderer: Arc<Renderer>,
    pub(crate) asked: Asked,
    request_id: String,
    /// The answer's id (`chatcmpl-...`, `cmpl-...`).
    id: String,
    created: u64,
    pub(crate) seqs: Vec<Sequence>,
    /// Each sequence's reasoning split, streamed (with `--reasoning-parser`).
    reasoning: Vec<ReasoningStream>,
    /// Each sequence's calls, streamed (with `--tool-call-parser` and offered tools), and how
    /// many went out.
    tools: Vec<(ToolStream, usize)>,
    prompt_tokens: u32,
    cached_tokens: u32,
    /// A streamed event's text up to its choice's index.
    head: String,
}

impl Answer {
    pub(crate) fn new(renderer: Arc<Renderer>, asked: Asked, request_id: &str) -> Self {
        let prefix = if asked.route == Route::Chat { "chatcmpl-" } else { "cmpl-" };
        let id = if request_id.starts_with(prefix) { request_id.to_owned() } else { format!("{prefix}{request_id}") };
        let seqs = (0..asked.n).map(|_| Sequence::new(asked.skip_special_tokens)).collect();
        let reasoning =
            asked.reasoning.map_or_else(Vec::new, |f| (0..asked.n).map(|_| ReasoningStream::new(f)).collect());
        let tools = asked
            .tools
            .as_ref()
            .map_or_else(Vec::new, |t| (0..asked.n).map(|_| (ToolStream::new(t.clone()), 0)).collect());
        let object = if asked.route == Route::Chat { "chat.completion.chunk" } else { "text_completion" };
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let head = format!(
            r#"{{"id":{},"object":"{object}","created":{created},"model":{},"choices":[{{"index":"#,
            serde_json::to_string(&id).unwrap_or_default(),
            serde_json::to_string(&asked.model).unwrap_or_default()
        );
        Self {
            renderer,
            asked,
            request_id: request_id.to_owned(),
            id,
            created,
            seqs,
            reasoning,
            tools,
            head,
            prompt_tokens: 0,
            cached_tokens: 0,
        }
    }

    /// Every sequence has finished.
    pub(crate) fn done(&self) -> bool {
        self.seqs.iter().all(|s| s.finish.is_some())
    }

    /// Takes one engine message; returns the SSE events it makes (streamed), else nothing.
    pub(crate) fn take(&mut self, m: GenerateResponse) -> Result<String, BadMessage> {
        if !m.request_id.is_empty() && m.request_id != self.request_id {
            return Err(BadMessage::OtherRequest(m.request_id.chars().take(64).collect()));
        }
        let n = self.asked.n;
        let index = match &m.response {
            Some(Generated::Chunk(c)) => c.index,
            Some(Generated::Complete(c)) => c.index,
            None => return Err(BadMessage::Empty),
        };
        let Some(seq) = self.seqs.get_mut(index as usize) else { return Err(BadMessage::NoSuchSequence(index, n)) };
        let tok = self.renderer.tokenizer();
        let vocab = tok.vocab_size();
        let ids = match &m.response {
            Some(Generated::Chunk(c)) => &c.token_ids,
            Some(Generated::Complete(c)) => &c.output_ids,
            None => return Err(BadMessage::Empty),
        };
        if let Some(bad) = ids.iter().find(|id| **id as usize >= vocab) {
            return Err(BadMessage::BadToken(*bad, vocab));
        }
        let stops = (self.asked.stops.as_slice(), self.asked.no_stop_trim);
        let before = seq.logprobs.len();
        let piece = match &m.response {
            Some(Generated::Chunk(c)) => {
                (self.prompt_tokens, self.cached_tokens) = (c.prompt_tokens, c.cached_tokens);
                seq.push(tok, &c.token_ids, c.output_logprobs.as_ref(), stops)
            }
            Some(Generated::Complete(c)) => {
                (self.prompt_tokens, self.cached_tokens) = (c.prompt_tokens, c.cached_tokens);
                // Streamed, the chunks carried every token already; whole, the completion does.
                let mut out = String::new();
                if !self.asked.stream {
                    out = seq.push(tok, &c.output_ids, c.output_logprobs.as_ref(), stops);
                }
                out.push_str(&seq.complete(tok, c, stops));
                out
            }
            None => String::new(),
        };
        if !self.asked.stream {
            return Ok(String::new());
        }
        let new_logprobs = seq.logprobs.split_off(before);
        Ok(self.chunk(index as usize, &piece, &new_logprobs))
    }

    /// The SSE event for sequence `i`'s new `piece` (none when there is nothing to say).
    fn chunk(&mut self, i: usize, piece: &str, logprobs: &[TokenLogprob]) -> String {
        let finished = self.seqs[i].finish.is_some();
        // A chat's piece split into reasoning and content (with `--reasoning-parser`).
        let (thought, piece) = match self.reasoning.get_mut(i) {
            Some(r) => {
                let (mut thought, mut content) = r.push(piece);
                if finished {
                    let (t, c) = r.finish();
                    thought.push_str(&t);
                    content.push_str(&c);
                }
                (thought, content)
            }
            None => (String::new(), piece.to_owned()),
        };
        // The content read for tool calls (with offered tools).
        let (piece, calls) = match self.tools.get_mut(i) {
            Some((t, sent)) => {
                let (mut content, mut calls) = t.push(&piece);
                if finished {
                    let (rest, more) = t.finish();
                    content.push_str(&rest);
                    calls.extend(more);
                }
                let first = *sent;
                *sent += calls.len();
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let mut call = c.json(&self.request_id, first + k);
                        call["index"] = json!(first + k);
                        call
                    })
                    .collect();
                (content, calls)
            }
            None => (piece, Vec::new()),
        };
        let calling = self.tools.get(i).is_some_and(|(t, _)| t.calling());
        let piece = piece.as_str();
        let seq = &mut self.seqs[i];
        let finish = seq.finish.as_ref().map(|f| finish_reason(f, calling));
        if piece.is_empty() && thought.is_empty() && calls.is_empty() && finish.is_none() && logprobs.is_empty() {
            return String::new();
        }
        let first = !seq.started;
        seq.started = true;
        // The event written as text around its head (its id, object, creation time and model,
        // made once): one per token, so no JSON tree is built for it.
        let string = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let finish = finish.map_or_else(|| "null".to_owned(), string);
        let chunk = match self.asked.route {
            Route::Chat => {
                let mut delta = String::with_capacity(piece.len() + 48);
                if first {
                    delta.push_str(r#""role":"assistant","#);
                }
                delta.push_str(r#""content":"#);
                delta.push_str(&string(piece));
                if !thought.is_empty() {
                    delta.push_str(r#","reasoning_content":"#);
                    delta.push_str(&string(&thought));
                }
                if !calls.is_empty() {
                    delta.push_str(r#","tool_calls":"#);
                    delta.push_str(&Value::Array(calls).to_string());
                }
                let lp = (self.asked.logprobs && !logprobs.is_empty()).then(|| self.chat_logprobs(logprobs));
                let lp = lp.map_or_else(|| "null".to_owned(), |v| v.to_string());
                let head = self.head.as_str();
                format!(r#"{head}{i},"delta":{{{delta}}},"logprobs":{lp},"finish_reason":{finish}}}]}}"#)
            }
            Route::Completions => {
                let lp = (self.asked.logprobs && !logprobs.is_empty()).then(|| self.completion_logprobs(logprobs, 0));
                let lp = lp.map_or_else(|| "null".to_owned(), |v| v.to_string());
                let (head, text) = (self.head.as_str(), string(piece));
                format!(r#"{head}{i},"text":{text},"logprobs":{lp},"finish_reason":{finish}}}]}}"#)
            }
            _ => {
                // SGLang's stream: the text so far, each time.
                let seq = &self.seqs[i];
                let mut out = self.generate_object(i);
                out["text"] = json!(format!("{}{piece}", seq_text_before(seq, piece)));
                out.to_string()
            }
        };
        format!("data: {chunk}\n\n")
    }

    /// The last events of a stream: the usage (when asked), then `[DONE]`.
    pub(crate) fn end_of_stream(&self) -> String {
        let usage = match self.asked.route {
            Route::Chat | Route::Completions if self.asked.include_usage => {
                let object = if self.asked.route == Route::Chat { "chat.completion.chunk" } else { "text_completion" };
                let chunk = json!({"id": self.id, "object": object, "created": self.created, "model": self.asked.model,
                                   "choices": [], "usage": self.usage()});
                format!("data: {chunk}\n\n")
            }
            _ => String::new(),
        };
        format!("{usage}data: [DONE]\n\n")
    }

    /// The whole answer.
    pub(crate) fn whole(&self) -> Value {
        match self.asked.route {
            Route::Chat => {
                let choices: Vec<Value> = self
                    .seqs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let lp = self.asked.logprobs.then(|| self.chat_logprobs(&s.logprobs));
                        let (thought, content) = match self.asked.reasoning.map(|f| f.split(s.text())) {
                            Some((thought, content)) => (thought, content),
                            None => (None, text(s)),
                        };
                        let (content, calls) = match &self.asked.tools {
                            Some(offered) => super::tools::parse(&content, offered),
                            None => (content, Vec::new()),
                        };
                        let mut message = json!({"role": "assistant", "content": content});
                        if self.asked.reasoning.is_some() {
                            message["reasoning_content"] = json!(thought);
                        }
                        if !calls.is_empty() {
                            let calls: Vec<Value> =
                                calls.iter().enumerate().map(|(k, c)| c.json(&self.request_id, k)).collect();
                            message["tool_calls"] = Value::Array(calls);
                            if message["content"] == "" {
                                message["content"] = Value::Null;
                            }
                        }
                        let calling = message.get("tool_calls").is_some();
                        json!({"index": i, "message": message, "logprobs": lp,
                           "finish_reason": s.finish.as_ref().map(|f| finish_reason(f, calling)), "matched_stop": matched(s)})
                    })
                    .collect();
                json!({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.asked.model,
                       "choices": choices, "usage": self.usage()})
            }
            Route::Completions => {
                let choices: Vec<Value> = self
                    .seqs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let lp = self.asked.logprobs.then(|| self.completion_logprobs(&s.logprobs, 0));
                        json!({"index": i, "text": text(s), "logprobs": lp,
                           "finish_reason": s.finish.as_ref().map(Finish::reason), "matched_stop": matched(s)})
                    })
                    .collect();
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.asked.model,
                       "choices": choices, "usage": self.usage()})
            }
            _ if self.seqs.len() == 1 => self.generate_object(0),
            _ => Value::Array((0..self.seqs.len()).map(|i| self.generate_object(i)).collect()),
        }
    }

    /// SGLang's `/generate` object of sequence `i`.
    fn generate_object(&self, i: usize) -> Value {
        let s = &self.seqs[i];
        let finish = s.finish.as_ref().map(|f| match matched(s) {
            Value::Null => json!({"type": f.reason()}),
            m => json!({"type": f.reason(), "matched": m}),
        });
        json!({"text": text(s), "output_ids": s.ids(), "index": i,
               "meta_info": {"id": self.request_id, "finish_reason": finish, "prompt_tokens": self.prompt_tokens,
                             "completion_tokens": s.tokens, "cached_tokens": self.cached_tokens}})
    }

    /// OpenAI's usage, with the prompt tokens the engine had cached.
    pub(crate) fn usage(&self) -> Value {
        let completion: u64 = self.seqs.iter().map(|s| u64::from(s.tokens)).sum();
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
               "total_tokens": u64::from(self.prompt_tokens) + completion,
               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}})
    }

    /// A token's text (lossy for a byte of a character split across tokens).
    fn token_text(&self, id: u32) -> String {
        self.renderer.tokenizer().decode(&[id], false).unwrap_or_default()
    }

    fn chat_logprobs(&self, lps: &[TokenLogprob]) -> Value {
        let entry = |id: u32, logprob: f32| {
            let t = self.token_text(id);
            json!({"token": t, "logprob": logprob, "bytes": t.as_bytes()})
        };
        let content: Vec<Value> = lps
            .iter()
            .map(|lp| {
                let mut e = entry(lp.id, lp.logprob);
                e["top_logprobs"] = Value::Array(lp.top.iter().map(|(id, l)| entry(*id, *l)).collect());
                e
            })
            .collect();
        json!({"content": content})
    }

    fn completion_logprobs(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        let tokens: Vec<String> = lps.iter().map(|lp| self.token_text(lp.id)).collect();
        let mut at = offset;
        let offsets: Vec<usize> = tokens
            .iter()
            .map(|t| {
                let here = at;
                at += t.len();
                here
            })
            .collect();
        let top: Option<Vec<Value>> = (self.asked.top_logprobs > 0).then(|| {
            lps.iter()
                .map(|lp| {
                    let m: serde_json::Map<String, Value> =
                        lp.top.iter().map(|(id, l)| (self.token_text(*id), json!(l))).collect();
                    Value::Object(m)
                })
                .collect()
        });
        json!({"tokens": tokens, "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
               "top_logprobs": top, "text_offset": offsets})
    }
}

/// OpenAI's `finish_reason`: `tool_calls` for an answer that stopped on its calls.
fn finish_reason(f: &Finish, calling: bool) -> &'static str {
    match f {
        Finish::Stop(_) if calling => "tool_calls",
        f => f.reason(),
    }
}

/// The text a sequence gave out.
fn text(s: &Sequence) -> String {
    s.text().to_owned()
}

/// The text a sequence gave out before `piece` (the latest).
fn seq_text_before<'a>(s: &'a Sequence, piece: &str) -> &'a str {
    let t = s.text();
    &t[..t.len() - piece.len().min(t.len())]
}

/// SGLang's `matched_stop`: the stop string or token id that ended it, if one did.
fn matched(s: &Sequence) -> Value {
    match &s.finish {
        Some(Finish::Stop(Some(MatchedStop::Text(t)))) => json!(t),
        Some(Finish::Stop(Some(MatchedStop::TokenId(id)))) => json!(id),
        _ => Value::Null,
    }
}
