//! The `direct_pd` baseline of the PD overhead benchmark: a client that drives
//! both legs of a disaggregated request itself, as the router's PD dispatch
//! does, with no router between. SGLang: one body plus `bootstrap_host`,
//! `bootstrap_port` (the prefill's, from its `/server_info`) and a fresh
//! `bootstrap_room` to both workers at once, the decode's answer read whole
//! (and the prefill's). vLLM (NIXL pull): the prefill with `max_tokens` 1 and
//! `kv_transfer_params.do_remote_decode`, then the decode with the params the
//! prefill answered. What a PD request through the router costs more than
//! this is the router's own cost; what this costs more than one engine is the
//! second engine and the rendezvous.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Whose contract the two workers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    Sglang,
    Vllm,
}

/// A prefill and a decode worker, driven directly.
#[derive(Debug, Clone)]
pub(crate) struct DirectPd {
    flavor: Flavor,
    prefill: String,
    decode: String,
    /// The prefill's bootstrap port (SGLang).
    bootstrap_port: Value,
}

impl DirectPd {
    /// From `FLAVOR:PREFILL_URL|DECODE_URL` (flavor `sglang` or `vllm`); an SGLang prefill's
    /// bootstrap port is read from its `/server_info`.
    pub(crate) async fn parse(spec: &str) -> Result<Self> {
        let (flavor, urls) = spec.split_once(':').context("--direct-pd wants FLAVOR:PREFILL_URL|DECODE_URL")?;
        let flavor = match flavor {
            "sglang" => Flavor::Sglang,
            "vllm" => Flavor::Vllm,
            other => bail!("--direct-pd flavor {other}: sglang or vllm"),
        };
        let (prefill, decode) = urls.split_once('|').context("--direct-pd wants PREFILL_URL|DECODE_URL")?;
        let (prefill, decode) = (prefill.trim_end_matches('/').to_string(), decode.trim_end_matches('/').to_string());
        let mut bootstrap_port = Value::Null;
        if flavor == Flavor::Sglang {
            let info = reqwest::get(format!("{prefill}/server_info")).await?.bytes().await?;
            let info: Value = serde_json::from_slice(&info).context("the prefill's /server_info")?;
            bootstrap_port = info.get("disaggregation_bootstrap_port").cloned().unwrap_or(Value::Null);
        }
        Ok(DirectPd { flavor, prefill, decode, bootstrap_port })
    }

    /// One request's legs, built before the clock starts (what the client sends is not part of
    /// what is measured, as a router's client sends only bytes): SGLang's one body with a fresh
    /// `room`, or vLLM's prefill body and the decode's template.
    pub(crate) fn prepare(&self, v: &Value, room: u64) -> Legs {
        let mut first = v.clone();
        if let Some(o) = first.as_object_mut() {
            match self.flavor {
                Flavor::Sglang => {
                    o.insert("bootstrap_host".into(), json!("127.0.0.1"));
                    o.insert("bootstrap_port".into(), self.bootstrap_port.clone());
                    o.insert("bootstrap_room".into(), json!(room));
                }
                Flavor::Vllm => {
                    o.insert("max_tokens".into(), json!(1));
                    o.insert("stream".into(), json!(false));
                    o.insert(
                        "kv_transfer_params".into(),
                        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
                    );
                }
            }
        }
        let first = serde_json::to_vec(&first).unwrap_or_default();
        Legs { first, decode: (self.flavor == Flavor::Vllm).then(|| v.clone()) }
    }

    /// Sends one request's `legs`; whether both answered 2xx, read whole.
    pub(crate) async fn one(&self, client: &reqwest::Client, legs: &Legs) -> bool {
        let post = |url: &str, body: Vec<u8>| {
            client
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let whole = |r: reqwest::Result<reqwest::Response>| async move {
            match r {
                Ok(r) if r.status().is_success() => r.bytes().await.ok(),
                _ => None,
            }
        };
        match &legs.decode {
            // SGLang: the same body to both, at once.
            None => {
                let (p, d) =
                    tokio::join!(async { whole(post(&self.prefill, legs.first.clone()).await).await }, async {
                        whole(post(&self.decode, legs.first.clone()).await).await
                    });
                p.is_some() && d.is_some()
            }
            // vLLM: prefill, then decode with the params it answered (built here: they come now).
            Some(v) => {
                let Some(answer) = whole(post(&self.prefill, legs.first.clone()).await).await else { return false };
                let Some(params) =
                    serde_json::from_slice::<Value>(&answer).ok().and_then(|a| a.get("kv_transfer_params").cloned())
                else {
                    return false;
                };
                let mut second = v.clone();
                if let Some(o) = second.as_object_mut() {
                    o.insert("kv_transfer_params".into(), params);
                }
                whole(post(&self.decode, serde_json::to_vec(&second).unwrap_or_default()).await).await.is_some()
            }
        }
    }
}

/// One request's legs, ready to send.
#[derive(Debug, Clone)]
pub(crate) struct Legs {
    /// SGLang's body for both legs, or vLLM's prefill body.
    first: Vec<u8>,
    /// vLLM: the client's body, the decode leg's template (`None` for SGLang).
    decode: Option<Value>,
}
