//! Shepherd Model Gateway 1.13's `smg launch` options this router does not
//! implement, known so an `smg` command line never fails with "unexpected
//! argument": each is parsed with `smg`'s arity, hidden from `--help`, and
//! judged at start. Given with `smg`'s own default it is accepted with a
//! warning that it changes nothing here; given otherwise it is refused with
//! the reason and what to use instead (`docs/configuration.md`, the SMG
//! table). The options it implements or maps live with the flags they map to.

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::usage::UsageError;

const GRPC: &str = "encode workers, EPD and ZMQ workers are not built: workers speak HTTP, or gRPC (grpc://, SGLang's scheduler service)";
const MM: &str = "media is relayed to the engine untouched here: the engine fetches and preprocesses it (the router computes vLLM's image identifiers and placeholders for Qwen2-VL models to match cached blocks, docs/configuration.md, \"Images\")";
const MESH: &str = "no HA mesh here: replicas catch up with --index-peers and share placements, loads, cached answers, route feedback and tenant limits through `--shared-state` (a Valkey or Redis server)";
const STORAGE: &str = "the Responses and Conversations APIs and their storage are not served by this router";
const PLUGIN: &str = "MCP tools and WASM plugins are not served by this router";
const RL: &str = "the RL control plane (/v1/rl) is not served by this router";
const PARSER: &str = "one parser set here: gRPC workers' answers are read with --reasoning-parser and --tool-call-parser, an HTTP worker's engine parses its own";
const K8S: &str = "use --service-discovery with --selector: file discovery, model ids from pod metadata and vLLM connector annotations are not built";
const PDADM: &str =
    "no prefill admission queue: PD requests are admitted by --max-concurrent-requests and --queue-size";
const JOBQ: &str = "workers are added and removed at once here (no control-plane job queue)";
const PREFIXHASH: &str = "the prefix_hash policy is not here: use --policy cache_aware (or approx_tree)";
const SEL: &str = "cache_aware has the one selection policy here (with --overlap-decay and --selection-temperature)";
const BUCKET: &str = "the bucket policy is not here";
const STICKY: &str = "no sticky-session map: send the x-smg-routing-key header (its worker by rendezvous hashing) or use --routing-config";
const DPMIN: &str = "use --dp-aware: ranks are balanced by their owed prefill";
const BUFFER: &str =
    "every proxied request is read whole (bounded by --max-payload-size) so it can be parsed and retried";
const ALIAS: &str = "give a --routing-config pool the alias as its model name";
const JEMALLOC: &str = "the router is not built with jemalloc";
const BG: &str = "the Responses API's background mode is not served";
const AUTOLOAD: &str = "same: tokenizers are only ever loaded from --tokenizer-path, never fetched";

/// How many values an option takes, as `smg` parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// None (`store_true`).
    Flag,
    /// One.
    Value,
    /// One or more (`nargs="+"`).
    List,
    /// Any number (`nargs="*"`).
    Any,
}
use Kind::{Any, Flag, List, Value};

/// One `smg launch` option not implemented here.
#[derive(Debug)]
pub(crate) struct SmgOnly {
    /// Its name (without `--`), also its id.
    long: &'static str,
    /// Its other spellings.
    aliases: &'static [&'static str],
    kind: Kind,
    /// `smg`'s default, as typed on a command line (`None`: none, or a flag).
    default: Option<&'static str>,
    /// Why it is not implemented, and what to use instead.
    why: &'static str,
}

const fn o(
    long: &'static str,
    aliases: &'static [&'static str],
    kind: Kind,
    default: Option<&'static str>,
    why: &'static str,
) -> SmgOnly {
    SmgOnly { long, aliases, kind, default, why }
}

/// Every such option, in `smg launch`'s order.
const OPTIONS: &[SmgOnly] = &[
    o("encode-policy", &[], Value, None, GRPC),
    o("prefix-token-count", &[], Value, Some("256"), PREFIXHASH),
    o("prefix-hash-load-factor", &[], Value, Some("1.25"), PREFIXHASH),
    o("prefix-hash-balance-abs-threshold", &[], Value, Some("10"), PREFIXHASH),
    o("selection-policy", &[], Value, Some("cache-aware-default"), SEL),
    o("bucket-adjust-interval-secs", &[], Value, Some("5"), BUCKET),
    o("max-idle-secs", &["sticky-key-idle-secs"], Value, Some("14400"), STICKY),
    o("assignment-mode", &[], Value, None, STICKY),
    o("max-buffered-request-bytes", &[], Value, Some("1048576"), BUFFER),
    o("pd-admission-wait-secs", &[], Value, Some("30"), PDADM),
    o("routing-key-override", &["sticky-sessions"], Flag, None, STICKY),
    o("dp-minimum-tokens-scheduler", &[], Flag, None, DPMIN),
    o("enable-rl", &[], Flag, None, RL),
    o("rl-control-timeout-secs", &[], Value, Some("600"), RL),
    o("rl-fanout-concurrency", &[], Value, Some("32"), RL),
    o("epd-disaggregation", &[], Flag, None, GRPC),
    o("encode", &[], List, None, GRPC),
    o("prefill-max-inflight-requests-per-worker", &[], Value, Some("-1"), PDADM),
    o("prefill-queue-size", &[], Value, None, PDADM),
    o("prefill-queue-timeout-secs", &[], Value, None, PDADM),
    o("job-queue-capacity", &[], Value, Some("1000"), JOBQ),
    o("job-queue-concurrency", &[], Value, Some("200"), JOBQ),
    o("multimodal-tensor-transport", &[], Value, None, MM),
    o("multimodal-shm-min-bytes", &[], Value, None, MM),
    o("multimodal-max-inflight-bytes", &[], Value, None, MM),
    o("mm-per-request-image-limit", &[], Value, None, MM),
    o("mm-processing", &[], Value, None, MM),
    o("mm-pixel-cache-mb", &[], Value, None, MM),
    o("mm-pixel-rdma", &[], Flag, None, MM),
    o("mm-allowed-media-domains", &[], Value, None, MM),
    o("mm-allow-private-media-hosts", &[], Flag, None, MM),
    o("rdma-listen-ip", &[], Value, None, MM),
    o("rdma-slot-ttl-s", &[], Value, None, MM),
    o("log-mm-timing", &[], Flag, None, MM),
    o("discovery-provider", &[], Value, None, K8S),
    o("discovery-file", &[], Value, None, K8S),
    o("discovery-check-interval-secs", &[], Value, None, K8S),
    o("kv-connector-annotation", &[], Value, Some("smg.ai/kv-connector"), K8S),
    o("kv-engine-id-annotation", &[], Value, Some("smg.ai/kv-engine-id"), K8S),
    o("encode-selector", &[], List, None, GRPC),
    o("router-selector", &[], List, None, MESH),
    o("model-id-from", &[], Value, None, K8S),
    o("model-alias", &[], Value, None, ALIAS),
    o("jemalloc-prof-dir", &[], Value, None, JEMALLOC),
    o("storage-context-headers", &[], Any, None, STORAGE),
    o("max-background-responses", &[], Value, Some("1024"), BG),
    o("disable-tokenizer-autoload", &[], Flag, None, AUTOLOAD),
    o("parser", &[], Value, Some("legacy"), PARSER),
    o("mcp-config-path", &[], Value, None, PLUGIN),
    o("zmq-engine-count", &[], Value, None, GRPC),
    o("enable-wasm", &[], Flag, None, PLUGIN),
    o("storage-hook-wasm-path", &[], Value, None, PLUGIN),
    o("history-backend", &[], Value, Some("memory"), STORAGE),
    o("history-memory-max-responses", &[], Value, Some("10000"), STORAGE),
    o("history-memory-max-items", &[], Value, Some("100000"), STORAGE),
    o("history-memory-retention-secs", &[], Value, Some("86400"), STORAGE),
    o("oracle-wallet-path", &[], Value, None, STORAGE),
    o("oracle-tns-alias", &[], Value, None, STORAGE),
    o("oracle-connect-descriptor", &[], Value, None, STORAGE),
    o("oracle-username", &[], Value, None, STORAGE),
    o("oracle-password", &[], Value, None, STORAGE),
    o("oracle-external-auth", &[], Flag, None, STORAGE),
    o("oracle-pool-min", &[], Value, Some("1"), STORAGE),
    o("oracle-pool-max", &[], Value, Some("16"), STORAGE),
    o("oracle-pool-timeout-secs", &[], Value, Some("30"), STORAGE),
    o("postgres-db-url", &[], Value, None, STORAGE),
    o("postgres-pool-max", &[], Value, Some("16"), STORAGE),
    o("postgres-op-timeout-secs", &[], Value, Some("5"), STORAGE),
    o("redis-url", &[], Value, None, STORAGE),
    o("redis-pool-max", &[], Value, Some("16"), STORAGE),
    o("redis-retention-days", &[], Value, Some("30"), STORAGE),
    o("redis-op-timeout-secs", &[], Value, Some("5"), STORAGE),
    o("schema-config", &[], Value, None, STORAGE),
    o("enable-mesh", &[], Flag, None, MESH),
    o("mesh-server-name", &[], Value, None, MESH),
    o("mesh-host", &[], Value, Some("0.0.0.0"), MESH),
    o("mesh-advertise-host", &[], Value, None, MESH),
    o("mesh-port", &[], Value, Some("39527"), MESH),
    o("mesh-peer-urls", &[], Any, None, MESH),
    o("mesh-tls-ca-cert", &[], Value, None, MESH),
    o("mesh-tls-cert", &[], Value, None, MESH),
    o("mesh-tls-key", &[], Value, None, MESH),
];

impl SmgOnly {
    fn arg(&self) -> Arg {
        let arg = Arg::new(self.long).long(self.long).aliases(self.aliases.iter().copied()).hide(true);
        match self.kind {
            Flag => arg.action(ArgAction::SetTrue),
            Value => arg.action(ArgAction::Set).num_args(1).value_name("V"),
            List => arg.action(ArgAction::Append).num_args(1..).value_name("V"),
            Any => arg.action(ArgAction::Append).num_args(0..).value_name("V"),
        }
    }

    /// Whether `value` is `smg`'s default (numbers compared as numbers).
    fn is_default(&self, value: &str) -> bool {
        let Some(d) = self.default else { return false };
        match (d.parse::<f64>(), value.parse::<f64>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => d == value,
        }
    }

    /// `same`, accepted whatever its value (its semantics hold here already).
    fn is_same(&self) -> bool {
        self.why == AUTOLOAD
    }
}

/// The `smg launch` options given that this router does not implement.
#[derive(Debug, Default)]
pub(crate) struct SmgOnlyFlags {
    /// Each one given, with its values joined by spaces (empty for a flag).
    given: Vec<(&'static SmgOnly, String)>,
}

impl SmgOnlyFlags {
    /// Refuses the options given with another value than `smg`'s default; the
    /// notes to log for those accepted (they change nothing here).
    pub(crate) fn check(&self) -> Result<Vec<String>, UsageError> {
        let mut notes = Vec::new();
        for (o, value) in &self.given {
            let shown = if value.is_empty() { format!("--{}", o.long) } else { format!("--{} {value}", o.long) };
            if o.is_same() {
                notes.push(format!("{shown}: {}", o.why));
            } else if o.kind != Flag && o.is_default(value) {
                notes.push(format!("{shown}: accepted (SMG's default), changes nothing here: {}", o.why));
            } else {
                return Err(UsageError(format!("{shown}: not supported by this router: {}", o.why)));
            }
        }
        Ok(notes)
    }
}

impl clap::FromArgMatches for SmgOnlyFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for o in OPTIONS {
            if o.kind == Flag {
                if m.get_flag(o.long) {
                    given.push((o, String::new()));
                }
            } else if let Some(values) = m.get_many::<String>(o.long) {
                given.push((o, values.map(String::as_str).collect::<Vec<_>>().join(" ")));
            } else if o.kind == Any
                && m.contains_id(o.long)
                && m.value_source(o.long) == Some(clap::parser::ValueSource::CommandLine)
            {
                given.push((o, String::new()));
            }
        }
        Ok(Self { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for SmgOnlyFlags {
    fn augment_args(cmd: Command) -> Command {
        OPTIONS.iter().fold(cmd, |cmd, o| cmd.arg(o.arg()))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// The serve command line parsed from `args` (after the program name).
    fn parse(args: &[&str]) -> Result<Vec<String>, String> {
        let cli = crate::cli::Cli::try_parse_from(std::iter::once("sgl-router").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.serve.smg_only.check().map_err(|e| e.0)
    }

    #[test]
    fn an_option_given_with_smgs_default_is_accepted_and_any_other_value_refused_with_its_reason() {
        let notes = parse(&["--history-backend", "memory", "--max-buffered-request-bytes", "1048576"]).unwrap();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("changes nothing here"), "{notes:?}");
        let refused = parse(&["--history-backend", "redis"]).unwrap_err();
        assert!(
            refused.contains("--history-backend redis: not supported by this router") && refused.contains("Responses"),
            "{refused}"
        );
        let flag = parse(&["--enable-rl"]).unwrap_err();
        assert!(flag.contains("/v1/rl"), "{flag}");
        let list = parse(&["--mesh-peer-urls", "a:1", "b:2"]).unwrap_err();
        assert!(list.contains("--mesh-peer-urls a:1 b:2"), "{list}");
        assert!(
            parse(&["--sticky-key-idle-secs", "1"]).unwrap_err().contains("--max-idle-secs 1"),
            "an alias is its option"
        );
        assert_eq!(parse(&["--disable-tokenizer-autoload"]).unwrap().len(), 1, "same semantics: accepted");
        assert_eq!(parse(&[]).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn every_option_not_implemented_is_in_the_configuration_docs_with_its_reason() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
        let docs = std::fs::read_to_string(path).unwrap();
        for o in super::OPTIONS {
            let row = docs.lines().find(|l| l.contains(&format!("`--{}`", o.long)) && l.contains(o.why));
            assert!(row.is_some(), "--{}: no row of docs/configuration.md names it with its reason", o.long);
        }
    }
}
