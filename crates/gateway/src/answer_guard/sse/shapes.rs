//! The guard's reading of each route's event shape: a chat or completion
//! chunk's choices (their texts and tool calls), an Anthropic event, a
//! `/generate` chunk, each text through its lane ([`Screen::feed`]).

use serde_json::{Value, json};

use super::{Screen, Stop, TOOL, set};
use crate::pipeline::request::Route;

impl Screen {
    /// A chat or completion chunk: each choice's texts through their lanes.
    pub(super) async fn openai(&mut self, v: &mut Value) -> Result<Vec<u8>, Stop> {
        let strip = !self.annotating();
        let fields: &[(&str, u8)] = if self.route == Route::Completions {
            &[("/text", 0)]
        } else {
            &[("/delta/content", 0), ("/delta/reasoning_content", 1)]
        };
        let Some(Value::Array(choices)) = v.get_mut("choices") else { return Ok(Vec::new()) };
        let mut choices = std::mem::take(choices);
        for (pos, c) in choices.iter_mut().enumerate() {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
            if strip && let Some(c) = c.as_object_mut() {
                c.remove("logprobs");
            }
            let finished = c.get("finish_reason").is_some_and(|f| !f.is_null());
            for &(pointer, field) in fields {
                let text = c.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
                if text.is_none() && !finished {
                    continue;
                }
                let out = self.feed((index, field, 0), text.as_deref().unwrap_or(""), finished).await?;
                if text.is_some() || !out.is_empty() {
                    set(c, pointer, out);
                }
            }
            self.tool_calls(c, index, finished).await?;
        }
        v["choices"] = Value::Array(choices);
        let mut template = v.clone();
        if let Some(t) = template.as_object_mut() {
            t.remove("choices");
            t.remove("usage");
        }
        self.template = Some(template);
        Ok(Vec::new())
    }

    /// A chat chunk's tool calls (`delta.tool_calls[].function.arguments`), each call's
    /// arguments through a lane of their own; at the choice's end, the rest of each of them as
    /// calls of this chunk's delta.
    async fn tool_calls(&mut self, c: &mut Value, index: u64, finished: bool) -> Result<(), Stop> {
        if self.route != Route::Chat {
            return Ok(());
        }
        let mut calls = match c.pointer_mut("/delta/tool_calls") {
            Some(Value::Array(calls)) => std::mem::take(calls),
            _ => Vec::new(),
        };
        for (pos, call) in calls.iter_mut().enumerate() {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
            if let Some(text) = call.pointer("/function/arguments").and_then(Value::as_str).map(str::to_owned) {
                let out = self.feed((index, TOOL, n), &text, false).await?;
                set(call, "/function/arguments", out);
            }
        }
        if finished {
            let mut open: Vec<u64> =
                self.lanes.keys().filter(|(i, f, _)| *i == index && *f == TOOL).map(|k| k.2).collect();
            open.sort_unstable();
            for n in open {
                let rest = self.feed((index, TOOL, n), "", true).await?;
                if !rest.is_empty() && !self.annotating() {
                    calls.push(json!({"index": n, "function": {"arguments": rest}}));
                }
            }
        }
        if !calls.is_empty() {
            set(c, "/delta/tool_calls", String::new());
            c["delta"]["tool_calls"] = Value::Array(calls);
        }
        Ok(())
    }

    /// An Anthropic event: a text, thinking or tool input (`input_json_delta`) delta through
    /// its block's lane; a block's stop preceded by its lane's rest.
    pub(super) async fn anthropic(&mut self, v: &mut Value) -> Result<Vec<u8>, Stop> {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match v.get("type").and_then(Value::as_str) {
            Some("content_block_delta") => {
                for (pointer, field) in [("/delta/text", 0u8), ("/delta/thinking", 1), ("/delta/partial_json", TOOL)] {
                    if let Some(text) = v.pointer(pointer).and_then(Value::as_str).map(str::to_owned) {
                        let out = self.feed((index, field, 0), &text, false).await?;
                        set(v, pointer, out);
                    }
                }
                Ok(Vec::new())
            }
            Some("content_block_stop") => {
                let mut before = Vec::new();
                for field in [0u8, 1, TOOL] {
                    if self.lanes.contains_key(&(index, field, 0)) {
                        let rest = self.feed((index, field, 0), "", true).await?;
                        if !rest.is_empty() && !self.annotating() {
                            before.extend(self.flushed_event((index, field, 0), rest));
                        }
                    }
                }
                Ok(before)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// A `/generate` chunk: its cumulative text's new part through the lane; the text sent is
    /// what the lane released so far.
    pub(super) async fn generate(&mut self, v: &mut Value) -> Result<Vec<u8>, Stop> {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let Some(text) = v.get("text").and_then(Value::as_str).map(str::to_owned) else { return Ok(Vec::new()) };
        let finished = v.pointer("/meta_info/finish_reason").is_some_and(|f| !f.is_null());
        let seen = self.lanes.get(&(index, 0, 0)).map_or(0, |l| l.raw_len);
        let new = if text.len() >= seen && text.is_char_boundary(seen) { &text[seen..] } else { text.as_str() };
        let out = self.feed((index, 0, 0), new, finished).await?;
        let lane = self.lanes.entry((index, 0, 0)).or_default();
        lane.raw_len = text.len();
        lane.sent.push_str(&out);
        v["text"] = Value::String(lane.sent.clone());
        if !self.annotating()
            && let Some(meta) = v.get_mut("meta_info").and_then(Value::as_object_mut)
        {
            crate::answer_guard::strip_meta_logprobs(meta);
        }
        Ok(Vec::new())
    }
}
