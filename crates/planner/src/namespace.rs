//! Which namespace a request's block chain starts in: its LoRA adapter and
//! `cache_salt`, read the way the engines read them, so the router's hashes
//! meet the ones the pump computed from the engines' events.
//!
//! The adapter, in SGLang's order of precedence: `model` as
//! `base-model:adapter` (a served model name that itself contains `:` is kept
//! whole), else the `lora_path` field; and, vLLM's way, a `model` that is no
//! served model but an adapter name some engine's events have carried.

use kv_index::KvIndex;
use serde_json::Value;

/// A request's namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace<'a> {
    /// The LoRA adapter's name.
    pub adapter: Option<&'a str>,
    /// The `cache_salt`.
    pub salt: Option<&'a str>,
}

/// Reads the namespace of request body `v`; `served` lists the served model
/// names (configured and reported by workers), asked only when the `model`
/// field could name an adapter, so the common request pays nothing for it.
pub fn of_request<'a>(v: &'a Value, served: impl Fn() -> Vec<String>, index: Option<&KvIndex>) -> Namespace<'a> {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty());
    let known = |m: &str| index.is_some_and(|i| i.knows_adapter(m));
    let model = text("model").filter(|m| m.contains(':') || known(m));
    let served = model.map(|_| served()).unwrap_or_default();
    let model = model.filter(|m| !served.iter().any(|s| s == m));
    let from_model = model.filter(|m| m.contains(':')).and_then(|m| {
        let rest = served.iter().find_map(|s| m.strip_prefix(s.as_str()).and_then(|r| r.strip_prefix(':')));
        rest.or_else(|| m.split_once(':').map(|(_, a)| a)).map(str::trim).filter(|a| !a.is_empty())
    });
    let adapter = from_model.or_else(|| text("lora_path")).or_else(|| model.filter(|m| !m.contains(':')));
    Namespace { adapter, salt: v.get("cache_salt").and_then(Value::as_str) }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kv_index::{IndexConfig, ManualClock};
    use serde_json::json;

    use super::*;

    fn adapter(v: Value, index: Option<&KvIndex>) -> Option<String> {
        let served = || vec!["qwen".to_owned(), "s3://bucket/model:v2".to_owned()];
        of_request(&v, served, index).adapter.map(str::to_owned)
    }

    #[test]
    fn adapters_are_read_as_the_engines_read_them() {
        let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
        assert_eq!(adapter(json!({"model": "qwen"}), None), None);
        assert_eq!(adapter(json!({"model": "qwen:sql"}), None).as_deref(), Some("sql"));
        assert_eq!(adapter(json!({"model": "other:sql "}), None).as_deref(), Some("sql"));
        assert_eq!(adapter(json!({"model": "s3://bucket/model:v2"}), None), None, "a served name with ':'");
        assert_eq!(adapter(json!({"model": "s3://bucket/model:v2:sql"}), None).as_deref(), Some("sql"));
        assert_eq!(adapter(json!({"model": "qwen:"}), None), None);
        // The model's adapter wins over lora_path, which applies otherwise.
        assert_eq!(adapter(json!({"model": "qwen:a", "lora_path": "b"}), None).as_deref(), Some("a"));
        assert_eq!(adapter(json!({"model": "qwen", "lora_path": "b"}), None).as_deref(), Some("b"));
        assert_eq!(adapter(json!({"text": "hi", "lora_path": ""}), None), None);
        // vLLM names the adapter as the model: only an adapter the events have named counts,
        // so a client's arbitrary model name never splits the cache.
        assert_eq!(adapter(json!({"model": "sql-adapter"}), Some(&index)), None);
        index.note_adapter("sql-adapter");
        assert_eq!(adapter(json!({"model": "sql-adapter"}), Some(&index)).as_deref(), Some("sql-adapter"));
        assert_eq!(adapter(json!({"model": "gpt-4"}), Some(&index)), None);
        let v = json!({"model": "qwen", "cache_salt": "t1"});
        assert_eq!(of_request(&v, Vec::new, None).salt, Some("t1"));
    }
}
