//! `--routing-config FILE` and `sgl-router check-config FILE`: reads a
//! routing config (model-select validates it, with lines), checks what only
//! the binary knows (policy names, worker URLs), and turns it into the pools
//! the app builds; `check-config` prints what the file means.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use model_select::{Config, PluginConfig, Problem};
use router_types::WorkerUrl;

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
}

/// Reads and checks `path`; every problem is one line `FILE:LINE: message`.
pub(crate) fn load(path: &Path, default_policy: PolicyName) -> Result<RoutingFile, Vec<String>> {
    let at = |line: Option<usize>| match line {
        Some(l) => format!("{}:{l}", path.display()),
        None => path.display().to_string(),
    };
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{}: cannot read it: {e}", path.display())])?;
    let config = model_select::parse_yaml(&text).map_err(|problems| {
        problems.iter().map(|p: &Problem| format!("{}: {}", at(p.line), p.message)).collect::<Vec<_>>()
    })?;
    let mut problems = Vec::new();
    let mut pools = Vec::with_capacity(config.pools.len());
    for p in &config.pools {
        let line = text.lines().position(|l| l.contains(&format!("name: {}", p.name))).map(|i| i + 1);
        let policy = match p.policy.as_deref() {
            None => default_policy,
            Some(name) => match <PolicyName as clap::ValueEnum>::from_str(name, false) {
                Ok(policy) => policy,
                Err(_) => {
                    problems.push(format!("{}: pool `{}`: unknown policy `{name}`", at(line), p.name));
                    default_policy
                }
            },
        };
        let mut workers = Vec::new();
        for w in &p.workers {
            match gateway::check_worker_url(w.trim()) {
                Ok(url) if !workers.contains(&url) => workers.push(url),
                Ok(_) => {}
                Err(e) => problems.push(format!("{}: pool `{}`: worker {w:?}: {e}", at(line), p.name)),
            }
        }
        pools.push(FilePool {
            name: p.name.clone(),
            served_model: p.served_model.clone(),
            workers,
            policy,
            tokenizer_path: p.tokenizer_path.as_ref().map(PathBuf::from),
            chat_template: p.chat_template.as_ref().map(PathBuf::from),
            context_window: p.context_window,
        });
    }
    // A URL is one worker: it cannot serve two pools.
    for (i, p) in pools.iter().enumerate() {
        for w in &p.workers {
            if let Some(other) = pools[..i].iter().find(|o| o.workers.contains(w)) {
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
        let _ = writeln!(
            out,
            "  {}: serves {}, policy {policy}, {} worker(s), context window {window}",
            p.name,
            p.served_model,
            p.workers.len()
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
