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

    /// Sends one chat request `v` over both legs; whether both answered 2xx, read whole.
    pub(crate) async fn one(&self, client: &reqwest::Client, v: &Value, room: u64) -> bool {
        let post = |url: &str, body: &Value| {
            let body = serde_json::to_vec(body).unwrap_or_default();
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
        match self.flavor {
            Flavor::Sglang => {
                let mut body = v.clone();
                if let Some(o) = body.as_object_mut() {
                    o.insert("bootstrap_host".into(), json!("127.0.0.1"));
                    o.insert("bootstrap_port".into(), self.bootstrap_port.clone());
                    o.insert("bootstrap_room".into(), json!(room));
                }
                let (p, d) = tokio::join!(async { whole(post(&self.prefill, &body).await).await }, async {
                    whole(post(&self.decode, &body).await).await
                });
                p.is_some() && d.is_some()
            }
            Flavor::Vllm => {
                let mut first = v.clone();
                if let Some(o) = first.as_object_mut() {
                    o.insert("max_tokens".into(), json!(1));
                    o.insert("stream".into(), json!(false));
                    o.insert(
                        "kv_transfer_params".into(),
                        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
                    );
                }
                let Some(answer) = whole(post(&self.prefill, &first).await).await else { return false };
                let Some(params) =
                    serde_json::from_slice::<Value>(&answer).ok().and_then(|a| a.get("kv_transfer_params").cloned())
                else {
                    return false;
                };
                let mut second = v.clone();
                if let Some(o) = second.as_object_mut() {
                    o.insert("kv_transfer_params".into(), params);
                }
                whole(post(&self.decode, &second).await).await.is_some()
            }
        }
    }
}
