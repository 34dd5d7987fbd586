//! The response guard on an event stream: the stream read event by event
//! (within `max_answer_bytes` per event), each event's texts (a chat's
//! content and reasoning deltas, a completion's text, Anthropic's text and
//! thinking deltas, `/generate`'s cumulative text) fed to the lane they belong
//! to and replaced by what the lane releases; the rest of a lane goes out on
//! its last event (its `finish_reason`, `content_block_stop`, or `[DONE]`). A
//! block ends the stream with an error event, the held text never sent; the
//! findings go in a last comment.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use model_select::{GuardAction, Lane, StreamGuard};
use serde_json::{Value, json};

use super::{Findings, count, outcome, summary};
use crate::Gateway;
use crate::cache::Recorder;
use crate::pipeline::request::Route;
use crate::pools::response_guard::Armed;

mod shapes;

/// A stream's text lane: a choice's (or block's) index, its content (0), reasoning (1) or a tool
/// call's arguments (2: [`TOOL`]), and the tool call's index among the choice's (0 for the others).
type Key = (u64, u8, u64);

/// The lane field of a tool call's arguments: read for PII, not judged by the jailbreak rules
/// (as a whole answer's are).
const TOOL: u8 = 2;

/// Text lanes one stream may open (choices × 2, Anthropic blocks × 2); more ends it, failed.
const MAX_LANES: usize = 256;

/// The stream was blocked (a finding, or a text that could not be judged).
struct Stop;

/// One text lane's state.
#[derive(Default)]
struct LaneState {
    pii: Lane,
    /// Released by the PII reader, not yet judged by the jailbreak rules.
    unjudged: String,
    /// The last window's second half: judged once, held until the next window judges it again.
    tail: String,
    /// `/generate`: bytes of the worker's cumulative text seen, and the text sent.
    raw_len: usize,
    sent: String,
}

/// The guard's reading of one stream.
struct Screen {
    gw: Arc<Gateway>,
    armed: Armed,
    route: Route,
    body: Body,
    guard: StreamGuard,
    lanes: HashMap<Key, LaneState>,
    /// The last OpenAI event without its choices: the shape of a flushed lane's event.
    template: Option<Value>,
    buf: Vec<u8>,
    found: Findings,
    recorder: Option<Recorder>,
    /// The findings' comment went out.
    told: bool,
    done: bool,
}

/// `body` (an event stream on `route`) read by `armed`'s guard.
pub(super) fn screen(gw: Arc<Gateway>, armed: Armed, route: Route, body: Body, recorder: Option<Recorder>) -> Body {
    let guard = armed.stream_guard();
    let screen = Screen {
        gw,
        armed,
        route,
        body,
        guard,
        lanes: HashMap::new(),
        template: None,
        buf: Vec::new(),
        found: Findings::default(),
        recorder,
        told: false,
        done: false,
    };
    Body::from_stream(futures_util::stream::unfold(screen, |mut s| async move {
        let next = s.next().await?;
        Some((next, s))
    }))
}

impl Screen {
    fn annotating(&self) -> bool {
        self.armed.spec.action == GuardAction::Annotate
    }

    /// The next bytes for the client; `None` once the stream ended.
    async fn next(&mut self) -> Option<Result<Bytes, crate::relay::BoxError>> {
        loop {
            if self.done {
                return None;
            }
            let frame = match self.body.frame().await {
                None => {
                    self.done = true;
                    let out = match self.flush_all().await {
                        Ok(mut out) => {
                            out.extend(self.tell());
                            count(&self.armed, outcome(&self.armed, &self.found), &self.found);
                            out
                        }
                        Err(Stop) => self.stopped(),
                    };
                    return self.emit(out, true);
                }
                Some(Err(e)) => {
                    self.done = true;
                    self.recorder = None;
                    return Some(Err(e.into()));
                }
                Some(Ok(frame)) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            self.buf.extend_from_slice(&data);
            let mut out = Vec::new();
            while let Some((end, skip)) = event_end(&self.buf) {
                let raw: Vec<u8> = self.buf.drain(..end + skip).collect();
                match self.event(&raw[..end]).await {
                    Ok(bytes) => out.extend(bytes),
                    Err(Stop) => {
                        out.extend(self.stopped());
                        self.done = true;
                        return self.emit(out, false);
                    }
                }
            }
            if self.buf.len() > self.armed.spec.max_answer_bytes {
                self.found.failed = true;
                out.extend(self.stopped());
                self.done = true;
            }
            if !out.is_empty() {
                return self.emit(out, false);
            }
        }
    }

    /// `out` to the client (recorded for a response cache; kept when `whole`).
    fn emit(&mut self, out: Vec<u8>, whole: bool) -> Option<Result<Bytes, crate::relay::BoxError>> {
        if let Some(r) = self.recorder.as_mut()
            && !r.push(&out)
        {
            self.recorder = None;
        }
        if whole && let Some(r) = self.recorder.take() {
            r.ended();
        }
        (!out.is_empty()).then(|| Ok(Bytes::from(out)))
    }

    /// The stream is blocked: counted, nothing kept, and its last event.
    fn stopped(&mut self) -> Vec<u8> {
        self.recorder = None;
        let label = if self.found.failed { "failed" } else { "blocked" };
        count(&self.armed, label, &self.found);
        let spec = &self.armed.spec;
        crate::relay::ending_event(self.route, (spec.status, super::BLOCKED), &spec.message).to_vec()
    }

    /// The findings' comment, once, when there are any.
    fn tell(&mut self) -> Vec<u8> {
        let any = self.found.pii.total() > 0 || self.found.jailbreak.is_some() || self.found.failed;
        if self.told || !any {
            return Vec::new();
        }
        self.told = true;
        format!(": {}: {}\n\n", super::GUARD_HEADER, summary(&self.found)).into_bytes()
    }

    /// One event (without its blank line): what goes out for it.
    async fn event(&mut self, raw: &[u8]) -> Result<Vec<u8>, Stop> {
        let pass = || [raw, b"\n\n"].concat();
        let Ok(text) = std::str::from_utf8(raw) else { return Ok(pass()) };
        let mut name = None;
        let mut data: Option<String> = None;
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim());
            } else if let Some(d) = line.strip_prefix("data:") {
                let d = d.strip_prefix(' ').unwrap_or(d);
                data = Some(data.map_or_else(
                    || d.to_owned(),
                    |mut all| {
                        all.push('\n');
                        all.push_str(d);
                        all
                    },
                ));
            }
        }
        let Some(data) = data else { return Ok(pass()) };
        if data.trim() == "[DONE]" {
            let mut out = self.flush_all().await?;
            self.stop_on_pii()?;
            out.extend(self.tell());
            out.extend(pass());
            return Ok(out);
        }
        let Ok(mut v) = serde_json::from_str::<Value>(&data) else { return Ok(pass()) };
        if v.get("error").is_some() {
            return Ok(pass());
        }
        let before = match self.route {
            Route::Chat | Route::Completions => self.openai(&mut v).await?,
            Route::Messages => self.anthropic(&mut v).await?,
            Route::Generate => self.generate(&mut v).await?,
            _ => Vec::new(),
        };
        self.stop_on_pii()?;
        if self.annotating() {
            return Ok(pass());
        }
        let mut out = before;
        if let Some(name) = name {
            out.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
        Ok(out)
    }

    fn stop_on_pii(&self) -> Result<(), Stop> {
        if self.armed.spec.action == GuardAction::Block && self.guard.found().total() > 0 {
            return Err(Stop);
        }
        Ok(())
    }

    /// `text` on lane `key`: what goes out now.
    async fn feed(&mut self, key: Key, text: &str, end: bool) -> Result<String, Stop> {
        // A worker's choice indices are its to name: their lanes are bounded, not its memory.
        if self.lanes.len() >= MAX_LANES && !self.lanes.contains_key(&key) {
            tracing::warn!(decision = %self.armed.spec.decision, "response guard: a stream with too many texts");
            self.found.failed = true;
            return Err(Stop);
        }
        let mut lane = self.lanes.remove(&key).unwrap_or_default();
        let detector = self.armed.detector();
        let mut released = self.guard.push(detector, &mut lane.pii, text);
        if end {
            released.push_str(&self.guard.finish(detector, &mut lane.pii));
        }
        self.found.pii = self.guard.found();
        let out = if key.1 == TOOL { Ok(released) } else { self.judge(&mut lane, released, end).await };
        self.lanes.insert(key, lane);
        out
    }

    /// `released` judged by the jailbreak rules once a window of it is in (or the lane ended).
    async fn judge(&mut self, lane: &mut LaneState, released: String, end: bool) -> Result<String, Stop> {
        let window = self.armed.spec.window;
        if !self.armed.spec.judges() {
            return Ok(released);
        }
        lane.unjudged.push_str(&released);
        let ready = (end && !lane.unjudged.is_empty()) || lane.tail.len() + lane.unjudged.len() >= window;
        if !ready {
            return Ok(String::new());
        }
        let text = format!("{}{}", lane.tail, lane.unjudged);
        match self.armed.jailbreak(&self.gw, &text).await {
            Ok(None) => {}
            Ok(Some(rule)) => {
                self.found.jailbreak = Some(rule);
                if !self.annotating() {
                    return Err(Stop);
                }
            }
            Err(e) => {
                tracing::warn!(decision = %self.armed.spec.decision, error = %e, "response guard: a stream could not be judged");
                self.found.failed = true;
                if !self.annotating() {
                    return Err(Stop);
                }
            }
        }
        lane.unjudged.clear();
        if end {
            lane.tail.clear();
            return Ok(text);
        }
        // The window's second half is judged again, as the next window's first: only then does
        // it go out (an attack across two windows is seen whole in one).
        let mut keep = text.len().saturating_sub(window / 2);
        while !text.is_char_boundary(keep) {
            keep += 1;
        }
        lane.tail = text[keep..].to_owned();
        Ok(text[..keep].to_owned())
    }

    /// Every lane's rest, as events of the route's shape.
    async fn flush_all(&mut self) -> Result<Vec<u8>, Stop> {
        let mut keys: Vec<Key> = self.lanes.keys().copied().collect();
        keys.sort_unstable();
        let mut out = Vec::new();
        for key in keys {
            let rest = self.feed(key, "", true).await?;
            if rest.is_empty() || self.annotating() {
                continue;
            }
            out.extend(self.flushed_event(key, rest));
        }
        Ok(out)
    }

    /// An event carrying lane `key`'s `rest`.
    fn flushed_event(&mut self, (index, field, call): Key, rest: String) -> Vec<u8> {
        let event = match self.route {
            Route::Messages => {
                let delta = match field {
                    0 => json!({"type": "text_delta", "text": rest}),
                    TOOL => json!({"type": "input_json_delta", "partial_json": rest}),
                    _ => json!({"type": "thinking_delta", "thinking": rest}),
                };
                let v = json!({"type": "content_block_delta", "index": index, "delta": delta});
                return format!("event: content_block_delta\ndata: {v}\n\n").into_bytes();
            }
            Route::Generate => {
                let lane = self.lanes.entry((index, field, call)).or_default();
                lane.sent.push_str(&rest);
                json!({"text": lane.sent, "index": index})
            }
            _ => {
                let mut v = self.template.clone().unwrap_or_else(|| json!({}));
                let choice = if self.route == Route::Completions {
                    json!({"index": index, "text": rest, "finish_reason": null})
                } else if field == TOOL {
                    let calls = json!([{"index": call, "function": {"arguments": rest}}]);
                    json!({"index": index, "delta": {"tool_calls": calls}, "finish_reason": null})
                } else {
                    let name = if field == 0 { "content" } else { "reasoning_content" };
                    json!({"index": index, "delta": {name: rest}, "finish_reason": null})
                };
                v["choices"] = json!([choice]);
                v
            }
        };
        format!("data: {event}\n\n").into_bytes()
    }
}

/// Sets the string at `pointer` (`/a/b`) in `v`, making the objects on the way.
fn set(v: &mut Value, pointer: &str, text: String) {
    let mut at = v;
    let mut parts = pointer.trim_start_matches('/').split('/').peekable();
    while let Some(part) = parts.next() {
        if !at.is_object() {
            *at = json!({});
        }
        let map = at.as_object_mut().expect("an object");
        if parts.peek().is_none() {
            map.insert(part.to_owned(), Value::String(text));
            return;
        }
        at = map.entry(part.to_owned()).or_insert_with(|| json!({}));
    }
}

/// Where the first event in `buf` ends, and the length of the blank line that ends it.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::{event_end, set};
    use serde_json::json;

    #[test]
    fn events_end_at_a_blank_line_of_either_kind() {
        assert_eq!(event_end(b"data: a\n\ndata: b"), Some((7, 2)));
        assert_eq!(event_end(b"data: a\r\n\r\n"), Some((7, 4)));
        assert_eq!(event_end(b"data: a\n"), None);
    }

    #[test]
    fn a_text_is_set_at_its_pointer_making_the_way() {
        let mut v = json!({"index": 0, "finish_reason": "stop"});
        set(&mut v, "/delta/content", "x".into());
        assert_eq!(v, json!({"index": 0, "finish_reason": "stop", "delta": {"content": "x"}}));
    }
}
