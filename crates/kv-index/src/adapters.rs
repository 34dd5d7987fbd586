//! The LoRA adapter names the engines' events have mentioned, so the request
//! side can tell an adapter named in a request's `model` field (vLLM's way)
//! from a plain model name without guessing.

use std::collections::HashSet;
use std::sync::RwLock;

/// Most adapter names remembered (a bound against a publisher gone wrong).
pub(crate) const MAX_ADAPTERS: usize = 4096;

/// Adapter names seen in `BlockStored` events.
#[derive(Debug, Default)]
pub(crate) struct Adapters {
    names: RwLock<HashSet<String>>,
}

impl Adapters {
    /// Remembers `name`; the common case (known already) takes a read lock only.
    pub(crate) fn note(&self, name: &str) {
        if self.contains(name) {
            return;
        }
        let mut names = self.names.write().unwrap_or_else(|p| p.into_inner());
        if names.len() < MAX_ADAPTERS {
            names.insert(name.to_owned());
        }
    }

    /// Whether an event named `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.names.read().unwrap_or_else(|p| p.into_inner()).contains(name)
    }
}
