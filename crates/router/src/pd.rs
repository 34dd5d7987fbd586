//! The disaggregation flags (`--pd-disaggregation`, `--vllm-pd-disaggregation`,
//! `--prefill URL [BOOTSTRAP_PORT|none]`, `--decode URL`, the per-leg
//! policies, `--mock-workers NpMd`) into the app's [`PdSetup`].

use gateway::pd::PdMode;
use router_types::{Bootstrap, WorkerUrl};
use sgl_router::app::{PdSetup, PolicyConfig};

use crate::cli::{PolicyName, ServeArgs};
use crate::usage::UsageError;

/// The disaggregation the flags ask for, if any.
pub(crate) fn setup(a: &ServeArgs, policy: impl Fn(PolicyName) -> PolicyConfig) -> Result<Option<PdSetup>, UsageError> {
    let f = &a.pd;
    let usage = |m: String| Err(UsageError(m));
    let mode = match (f.pd_disaggregation, f.vllm_pd_disaggregation, a.mock_workers.decode) {
        (_, true, _) => PdMode::Vllm,
        (true, _, _) | (_, _, Some(_)) => PdMode::Sglang,
        _ => {
            if !f.prefill.is_empty() || !f.decode.is_empty() {
                return usage(
                    "--prefill/--decode need --pd-disaggregation (SGLang) or --vllm-pd-disaggregation".into(),
                );
            }
            if f.prefill_policy.is_some() || f.decode_policy.is_some() {
                return usage(
                    "--prefill-policy/--decode-policy need --pd-disaggregation or --vllm-pd-disaggregation".into(),
                );
            }
            return Ok(None);
        }
    };
    match (mode, f.kv_connector.as_deref()) {
        (PdMode::Sglang, Some(c)) => {
            return usage(format!("--kv-connector {c} is vLLM's: give --vllm-pd-disaggregation"));
        }
        (PdMode::Vllm, Some("moriio")) => {
            return usage("--kv-connector moriio: only nixl and mooncake are supported so far".into());
        }
        _ => {}
    }
    let skip_prefill = gateway::pd::SkipPrefill {
        uncached_below: f.pd_skip_prefill_uncached_tokens,
        cached_fraction: f.pd_skip_prefill_cached_fraction,
    };
    if !(0.0..=1.0).contains(&skip_prefill.cached_fraction) {
        return usage(format!("--pd-skip-prefill-cached-fraction {}: a share in 0..=1", skip_prefill.cached_fraction));
    }
    if skip_prefill.enabled() && mode == PdMode::Sglang {
        return usage(
            "--pd-skip-prefill-*: SGLang's decode-mode servers cannot prefill a request themselves \
             (sgl-project/sglang#14284); only vLLM's (--vllm-pd-disaggregation) can"
                .into(),
        );
    }
    let connector = match f.kv_connector.as_deref() {
        Some("mooncake") => gateway::pd::KvConnector::Mooncake,
        _ => gateway::pd::KvConnector::Nixl,
    };
    let mut prefill: Vec<(WorkerUrl, Bootstrap)> = Vec::new();
    for (url, port) in group_prefill(&f.prefill)? {
        let url = gateway::check_worker_url(url.trim()).map_err(|e| UsageError(format!("--prefill: {e}")))?;
        let bootstrap = match port {
            None => Bootstrap::Discover,
            Some(p) if p.eq_ignore_ascii_case("none") => Bootstrap::Null,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Bootstrap::Port(n),
                _ => return usage(format!("--prefill {url} {p}: the bootstrap port is a number in 1..=65535 or none")),
            },
        };
        if prefill.iter().any(|(u, _)| *u == url) {
            continue;
        }
        prefill.push((url, bootstrap));
    }
    let mut decode: Vec<WorkerUrl> = Vec::new();
    for u in f.decode.iter().filter(|u| !u.trim().is_empty()) {
        let url = gateway::check_worker_url(u.trim()).map_err(|e| UsageError(format!("--decode: {e}")))?;
        if prefill.iter().any(|(p, _)| *p == url) {
            return usage(format!("{url} is given as both --prefill and --decode"));
        }
        if !decode.contains(&url) {
            decode.push(url);
        }
    }
    gateway::check_pd_protocols(prefill.iter().map(|(u, _)| u), &decode).map_err(UsageError)?;
    let (mock_prefill, mock_decode) = match a.mock_workers.decode {
        Some(d) => (a.mock_workers.n, d),
        None => (a.mock_workers.n, a.mock_workers.n),
    };
    // Pods found by --prefill-selector and --decode-selector join later.
    let discovered = a.discovery.service_discovery;
    if !discovered && (prefill.len() + mock_prefill == 0 || decode.len() + mock_decode == 0) {
        return usage(
            "disaggregation needs at least one --prefill and one --decode worker (or --mock-workers 1p1d)".into(),
        );
    }
    Ok(Some(PdSetup {
        mode,
        prefill,
        decode,
        prefill_policy: policy(f.prefill_policy.unwrap_or(a.policy)),
        decode_policy: policy(f.decode_policy.unwrap_or(a.policy)),
        mock_prefill,
        mock_decode,
        connector,
        skip_prefill,
    }))
}

/// `--prefill` values as (URL, bootstrap port) pairs: each URL (it has a
/// scheme) starts one, a port or `none` right after it is its port.
fn group_prefill(values: &[String]) -> Result<Vec<(&str, Option<&str>)>, UsageError> {
    let mut out: Vec<(&str, Option<&str>)> = Vec::new();
    for v in values.iter().map(|v| v.trim()) {
        match out.last_mut() {
            _ if v.contains("://") => out.push((v, None)),
            Some((_, port @ None)) => *port = Some(v),
            _ => return Err(UsageError(format!("--prefill {v}: a worker URL first, then its bootstrap port or none"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_values_group_by_url() {
        let v: Vec<String> = ["http://a:1", "8998", "http://b:2", "http://c:3", "none"].map(String::from).to_vec();
        let g = group_prefill(&v).unwrap();
        assert_eq!(g, vec![("http://a:1", Some("8998")), ("http://b:2", None), ("http://c:3", Some("none"))]);
        assert!(group_prefill(&["8998".to_string()]).is_err());
        assert!(group_prefill(&["http://a:1", "1", "2"].map(String::from)).is_err());
    }

    /// A disaggregated pool of gRPC workers, or of HTTP workers; never one of each.
    #[test]
    fn a_pools_legs_speak_one_protocol() {
        let u = |s: &str| WorkerUrl::parse(s).unwrap();
        let (gp, gd, hd) = (u("grpc://p:1"), u("grpc://d:1"), u("http://d:1"));
        assert!(gateway::check_pd_protocols([&gp], [&gd]).is_ok());
        assert!(gateway::check_pd_protocols([&u("http://p:1")], [&hd]).is_ok());
        let mixed = gateway::check_pd_protocols([&gp], [&gd, &hd]).unwrap_err();
        assert!(mixed.contains("grpc://p:1") && mixed.contains("http://d:1"), "{mixed}");
    }
}
