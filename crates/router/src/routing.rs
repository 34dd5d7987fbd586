//! `--routing-config FILE` and `sgl-router check-config FILE`: reads a
//! routing config (model-select validates it, with lines), checks what only
//! the binary knows (policy names, worker URLs), and turns it into the pools
//! the app builds; `check-config` prints what the file means.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use gateway::pd::{KvConnector, PdMode};
use model_select::{Config, Disaggregation, PluginConfig, Problem};
use router_types::{Bootstrap, WorkerUrl};

use crate::cli::PolicyName;

/// A routing config, checked, with each pool's policy and workers parsed.
#[derive(Debug, Clone)]
pub(crate) struct RoutingFile {
    /// The config (model-select compiles it into the selector).
    pub(crate) config: Config,
    /// Its pools, in the config's order.
    pub(crate) pools: Vec<FilePool>,
}

/// One pool as the app builds it.
#[derive(Debug, Clone)]
pub(crate) struct FilePool {
    /// The pool's name.
    pub(crate) name: String,
    /// The model its engines serve.
    pub(crate) served_model: String,
    /// Its workers.
    pub(crate) workers: Vec<WorkerUrl>,
    /// Its policy (`--policy` when the pool names none).
    pub(crate) policy: PolicyName,
    /// Its model directory (`--tokenizer-path` when it names none).
    pub(crate) tokenizer_path: Option<PathBuf>,
    /// Its chat template (`--chat-template` when it names none).
    pub(crate) chat_template: Option<PathBuf>,
    /// Its context window.
    pub(crate) context_window: Option<u64>,
    /// Its prefill/decode disaggregation (`disaggregation:`), when it has one.
    pub(crate) pd: Option<FilePd>,
}

/// A disaggregated pool's legs.
#[derive(Debug, Clone)]
pub(crate) struct FilePd {
    /// Whose contract its workers follow.
    pub(crate) mode: Disaggregation,
    /// Its prefill workers and their bootstrap ports.
    pub(crate) prefill: Vec<(WorkerUrl, Bootstrap)>,
    /// Its decode workers.
    pub(crate) decode: Vec<WorkerUrl>,
    /// Chooses its decode worker (the pool's policy when it names none).
    pub(crate) decode_policy: PolicyName,
}

// === impl FilePd ===

impl FilePd {
    /// The gateway's mode and vLLM connector for its contract.
    pub(crate) fn contract(&self) -> (PdMode, KvConnector) {
        match self.mode {
            Disaggregation::Sglang => (PdMode::Sglang, KvConnector::Nixl),
            Disaggregation::Vllm => (PdMode::Vllm, KvConnector::Nixl),
            Disaggregation::Mooncake => (PdMode::Vllm, KvConnector::Mooncake),
        }
    }
}

// === impl FilePool ===

impl FilePool {
    /// Every worker URL it lists: its workers, or its prefill and decode workers.
    pub(crate) fn urls(&self) -> impl Iterator<Item = &WorkerUrl> {
        let pd = self.pd.iter().flat_map(|pd| pd.prefill.iter().map(|(u, _)| u).chain(&pd.decode));
        self.workers.iter().chain(pd)
    }
}

/// Reads and checks `path`; every problem is one line `FILE:LINE: message`.
pub(crate) fn load(path: &Path, default_policy: PolicyName) -> Result<RoutingFile, Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{}: cannot read it: {e}", path.display())])?;
    load_text(&text, &path.display().to_string(), default_policy)
}

/// Checks `text` (YAML or JSON) read from `shown`; every problem is one line `SHOWN:LINE: message`.
pub(crate) fn load_text(text: &str, shown: &str, default_policy: PolicyName) -> Result<RoutingFile, Vec<String>> {
    let at = |line: Option<usize>| match line {
        Some(l) => format!("{shown}:{l}"),
        None => shown.to_owned(),
    };
    let config = model_select::parse_yaml(text).map_err(|problems| {
        problems.iter().map(|p: &Problem| format!("{}: {}", at(p.line), p.message)).collect::<Vec<_>>()
    })?;
    let mut problems = Vec::new();
    let mut pools = Vec::with_capacity(config.pools.len());
    for p in &config.pools {
        let line = text.lines().position(|l| l.contains(&format!("name: {}", p.name))).map(|i| i + 1);
        let mut policy_named = |name: Option<&str>, fallback: PolicyName| match name {
            None => fallback,
            Some(name) => match <PolicyName as clap::ValueEnum>::from_str(name, false) {
                Ok(policy) => policy,
                Err(_) => {
                    problems.push(format!("{}: pool `{}`: unknown policy `{name}`", at(line), p.name));
                    fallback
                }
            },
        };
        let policy = policy_named(p.policy.as_deref(), default_policy);
        let decode_policy = policy_named(p.decode_policy.as_deref(), policy);
        let mut urls = |list: &mut Vec<WorkerUrl>, w: &str| match gateway::check_worker_url(w.trim()) {
            Ok(url) if !list.contains(&url) => {
                list.push(url);
                true
            }
            Ok(_) => false,
            Err(e) => {
                problems.push(format!("{}: pool `{}`: worker {w:?}: {e}", at(line), p.name));
                false
            }
        };
        let mut workers = Vec::new();
        for w in &p.workers {
            urls(&mut workers, w);
        }
        let pd = p.disaggregation.map(|mode| {
            let (mut prefill_urls, mut decode) = (Vec::new(), Vec::new());
            let mut prefill = Vec::new();
            for w in &p.prefill {
                if urls(&mut prefill_urls, w.url()) {
                    let bootstrap = w.bootstrap_port().map_or(Bootstrap::Discover, Bootstrap::Port);
                    prefill.push((prefill_urls[prefill_urls.len() - 1].clone(), bootstrap));
                }
            }
            for w in &p.decode {
                urls(&mut decode, w);
            }
            FilePd { mode, prefill, decode, decode_policy }
        });
        // A disaggregated pool's legs speak one protocol.
        if let Some(Err(e)) =
            pd.as_ref().map(|pd| gateway::check_pd_protocols(pd.prefill.iter().map(|(u, _)| u), &pd.decode))
        {
            problems.push(format!("{}: pool `{}`: {e}", at(line), p.name));
        }
        pools.push(FilePool {
            name: p.name.clone(),
            served_model: p.served_model.clone(),
            workers,
            policy,
            tokenizer_path: p.tokenizer_path.as_ref().map(PathBuf::from),
            chat_template: p.chat_template.as_ref().map(PathBuf::from),
            context_window: p.context_window,
            pd,
        });
    }
    // A URL is one worker: it cannot serve two pools, or two legs.
    for (i, p) in pools.iter().enumerate() {
        if let Some(pd) = &p.pd
            && let Some(w) = pd.decode.iter().find(|d| pd.prefill.iter().any(|(u, _)| u == *d))
        {
            problems.push(format!("{}: pool `{}`: worker {w} is both a prefill and a decode worker", at(None), p.name));
        }
        for w in p.urls() {
            if let Some(other) = pools[..i].iter().find(|o| o.urls().any(|u| u == w)) {
                problems.push(format!("{}: worker {w} is listed in pools `{}` and `{}`", at(None), other.name, p.name));
            }
        }
    }
    if problems.is_empty() { Ok(RoutingFile { config, pools }) } else { Err(problems) }
}

/// `sgl-router check-config FILE`: the file's meaning, or its problems.
pub(crate) fn check_config(path: &Path) -> anyhow::Result<()> {
    let setup = match load(path, PolicyName::RoundRobin) {
        Ok(setup) => setup,
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            bail!("{}: {} problem(s)", path.display(), problems.len());
        }
    };
    print!("{}", describe(&setup));
    Ok(())
}

/// What a valid config means, as `check-config` prints it.
fn describe(setup: &RoutingFile) -> String {
    let c = &setup.config;
    let mut out = String::new();
    let default = c.default_pool_name().unwrap_or_default();
    let _ = writeln!(out, "auto model names: {}", c.auto_model_names.join(", "));
    let _ = writeln!(out, "pools ({}; default {default}):", setup.pools.len());
    for (p, raw) in setup.pools.iter().zip(&c.pools) {
        let policy = raw.policy.as_deref().unwrap_or("--policy");
        let window = p.context_window.map_or_else(|| "-".to_owned(), |w| w.to_string());
        let workers = match &p.pd {
            None => format!("{} worker(s)", p.workers.len()),
            Some(pd) => format!(
                "disaggregated ({}): {} prefill, {} decode worker(s), decode policy {}",
                pd.mode.as_str(),
                pd.prefill.len(),
                pd.decode.len(),
                raw.decode_policy.as_deref().unwrap_or(policy)
            ),
        };
        let _ = writeln!(
            out,
            "  {}: serves {}, policy {policy}, {workers}, context window {window}",
            p.name, p.served_model
        );
    }
    let needed = model_select::needed_signals(&c.decisions, c.strategy);
    let strategy = match c.strategy {
        model_select::Strategy::Priority => "priority",
        model_select::Strategy::Confidence => "confidence",
    };
    let _ = writeln!(out, "decisions ({}, strategy {strategy}):", c.decisions.len());
    for d in &c.decisions {
        let mut signals: Vec<String> = d.signal_refs().iter().map(ToString::to_string).collect();
        signals.dedup();
        let signals = if d.is_catch_all() { "none (catch-all)".to_owned() } else { signals.join(", ") };
        let rank = match d.tier {
            Some(t) => format!("tier {t}, priority {}", d.priority),
            None => format!("priority {}", d.priority),
        };
        let block = d.plugins.iter().find_map(|p| match p {
            PluginConfig::Block { status, .. } => Some(*status),
            _ => None,
        });
        let target = match block {
            Some(status) => format!("block {status}"),
            None if d.pools.is_empty() => format!("pools {default} (default)"),
            None => format!("pools {}", d.pools.join(", ")),
        };
        let algorithm = d.algorithm.as_ref().map_or("static", |a| a.kind.as_str());
        let plugins: Vec<&str> = d.plugins.iter().map(PluginConfig::kind).collect();
        let plugins = if plugins.is_empty() { String::new() } else { format!("; plugins {}", plugins.join(", ")) };
        let reachable = d.signal_refs().iter().all(|s| needed.contains(s));
        let unreachable = if reachable { "" } else { "; UNREACHABLE: a catch-all always ranks above it" };
        let _ = writeln!(
            out,
            "  {} ({rank}): signals {signals} -> {target}, algorithm {algorithm}{plugins}{unreachable}",
            d.name
        );
    }
    let s = &c.signals;
    let defined = s
        .keywords
        .iter()
        .map(|r| format!("keyword:{}", r.name))
        .chain(s.regex.iter().map(|r| format!("regex:{}", r.name)))
        .chain(s.pii.iter().map(|r| format!("pii:{}", r.name)))
        .chain(s.context.iter().map(|r| format!("context:{}", r.name)))
        .chain(s.language.iter().map(|r| format!("language:{}", r.name)))
        .chain(s.conversation.iter().map(|r| format!("conversation:{}", r.name)))
        .chain(s.headers.iter().map(|r| format!("header:{}", r.name)))
        .chain(s.load.iter().map(|r| format!("load:{}", r.name)));
    let unused: Vec<String> = defined.filter(|d| !needed.iter().any(|n| &n.to_string() == d)).collect();
    if !unused.is_empty() {
        let _ = writeln!(out, "signals no reachable decision reads (never computed): {}", unused.join(", "));
    }
    out.push_str("ok\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/routing.yaml"))
    }

    #[test]
    fn the_example_is_described_decision_by_decision() {
        let setup = load(&example(), PolicyName::RoundRobin).unwrap();
        assert_eq!(setup.pools[0].policy, PolicyName::CacheAware);
        let text = describe(&setup);
        assert!(
            text.contains("  small: serves qwen3-8b, policy cache_aware, 0 worker(s), context window 32768\n"),
            "{text}"
        );
        assert!(
            text.contains("  refuse_injection (priority 100): signals keyword:injection -> block 403, algorithm static; plugins block\n"),
            "{text}"
        );
        assert!(
            text.contains("  hard (priority 50): signals keyword:math, context:long_prompt -> pools large, small"),
            "{text}"
        );
        assert!(text.contains("  default (priority 0): signals none (catch-all) -> pools small, large"), "{text}");
        assert!(text.ends_with("ok\n"));
    }

    #[test]
    fn problems_name_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("sgl-routing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.yaml");
        std::fs::write(
            &bad,
            "pools:\n  - name: a\n    served_model: m\n    policy: fastest\n    workers: [http://h:1, 'not a url']\n",
        )
        .unwrap();
        let problems = load(&bad, PolicyName::RoundRobin).unwrap_err();
        let f = bad.display();
        assert_eq!(problems[0], format!("{f}:2: pool `a`: unknown policy `fastest`"));
        assert!(problems[1].starts_with(&format!("{f}:2: pool `a`: worker \"not a url\"")), "{}", problems[1]);
        std::fs::write(&bad, "pools:\n  - name: a\n    served_model: m\ndecisions:\n  - {name: d, pools: [b]}\n")
            .unwrap();
        assert_eq!(
            load(&bad, PolicyName::RoundRobin).unwrap_err(),
            [format!("{f}:5: decision `d`: no pool is named `b`")]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
