//! A request's prompt as a renderer makes it (tokens when read, and text):
//! [`Renders`], one memo per request, so the signals, each candidate pool's
//! window, stickiness and the plan read one render per renderer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use renderer::vision::MmItem;
use renderer::{ChatRequest, Prompt, RenderError, Renderer};
use serde_json::Value;

use crate::{Planner, Pool, Route};

/// What requests' renders made, for `/metrics`.
#[derive(Debug, Default)]
pub struct PromptCounts {
    /// Prompts rendered and tokenized (`router_prompt_renders_total`).
    pub renders: AtomicU64,
    /// Images of rendered chats by the kind of their identity (`Identity::KINDS`:
    /// `router_prompt_images_total`).
    pub images: [AtomicU64; renderer::vision::Identity::KINDS.len()],
}

/// A prompt as a renderer made it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Its tokens (empty when not needed), each image's placeholders expanded.
    pub tokens: Vec<u32>,
    /// Its text (`None`: given as tokens).
    pub text: Option<String>,
    /// Its images (a vision model's chat), in order.
    pub mm: Vec<MmItem>,
}

/// A request's prompt rendered at most once per renderer (template and tokenizer): the
/// signals, each candidate pool's window, stickiness and the plan read the same render.
/// Forgotten when a plugin rewrites the prompt. One per request, used on one thread.
#[derive(Debug, Default)]
pub struct Renders(std::cell::RefCell<Vec<(Arc<Renderer>, Rendered)>>);

impl Renders {
    /// The request's tokens and text by `renderer`, rendered now if not before.
    pub fn tokens(
        &self,
        p: Planner<'_>,
        renderer: &Arc<Renderer>,
        route: Route,
        v: &Value,
    ) -> Result<Rendered, RenderError> {
        if let Some((_, r)) = self.0.borrow().iter().find(|(k, _)| Arc::ptr_eq(k, renderer)) {
            return Ok(r.clone());
        }
        let r = p.render(renderer, route, v, true)?;
        self.0.borrow_mut().push((renderer.clone(), r.clone()));
        Ok(r)
    }

    /// What `renderer` rendered already, if it did, moved out: for the request's last reader.
    pub fn take(&self, renderer: &Arc<Renderer>) -> Option<Rendered> {
        self.get(renderer, true)
    }

    /// What `renderer` rendered already, if it did; moved out for the `last` reader (no copy).
    pub(crate) fn get(&self, renderer: &Arc<Renderer>, last: bool) -> Option<Rendered> {
        let mut memo = self.0.borrow_mut();
        let i = memo.iter().position(|(k, _)| Arc::ptr_eq(k, renderer))?;
        Some(if last { memo.swap_remove(i).1 } else { memo[i].1.clone() })
    }

    /// The prompt changed (a plugin rewrote it): every render is stale.
    pub fn forget(&self) {
        self.0.borrow_mut().clear();
    }
}

impl Planner<'_> {
    /// Tokens and text of the request, by `pool`'s renderer (the tokens only when the index
    /// or the pool's policy reads them).
    pub fn prompt(&self, pool: &Pool, route: Route, v: &Value) -> Result<Rendered, RenderError> {
        let need_tokens = self.index.is_some() || pool.policy.needs_tokens();
        self.render(&pool.renderer, route, v, need_tokens)
    }

    /// Tokens (when `need_tokens`) and text of the request, by `renderer`; counted
    /// (`router_prompt_renders_total`).
    pub fn render(
        &self,
        renderer: &Renderer,
        route: Route,
        v: &Value,
        need_tokens: bool,
    ) -> Result<Rendered, RenderError> {
        self.counts.renders.fetch_add(1, Ordering::Relaxed);
        let vocab = renderer.prompt_vocab_size();
        match route {
            Route::Chat | Route::Messages => {
                // Anthropic's request as the engine converts it: the chat it renders.
                let converted;
                let v = if route == Route::Messages {
                    converted = renderer.anthropic_chat(v)?;
                    &converted
                } else {
                    v
                };
                let req = ChatRequest::from_value(v)?;
                if need_tokens {
                    let r = renderer.render_chat(&req)?;
                    for item in &r.mm {
                        self.counts.images[item.identity.kind()].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Rendered { tokens: r.token_ids, text: Some(r.text), mm: r.mm })
                } else {
                    Ok(Rendered { text: Some(renderer.render_text(&req)?), ..Rendered::default() })
                }
            }
            // Never asked: these routes' bodies are not rendered.
            Route::Embeddings | Route::Rerank | Route::Classify | Route::CountTokens => Ok(Rendered::default()),
            Route::Completions | Route::Generate => {
                let p = if route == Route::Completions {
                    Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)?
                } else {
                    Prompt::from_generate(v, vocab)?
                };
                let text = match &p {
                    Prompt::Text(t) => Some(t.clone()),
                    Prompt::Tokens(_) => None,
                };
                let tokens = if need_tokens { renderer.prompt_tokens(&p)? } else { Vec::new() };
                Ok(Rendered { tokens, text, mm: Vec::new() })
            }
        }
    }
}
