//! The priority scheduler's and the tenants' flags (Shepherd Model Gateway
//! 1.13's `--priority-scheduler-*`, `--trust-tenant-header`,
//! `--tenant-header-name`, `--tenant-api-key`): a flag group of
//! [`super::ServeArgs`], read here into the gateway's typed configuration
//! (the scheduler's YAML file included).

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Args;
use gateway::pipeline::scheduler::{Class, ClassConfig, SchedulerConfig, Tenants};
use gateway::pipeline::tenant_limits::{Limits, TenantLimitsConfig};

use crate::usage::UsageError;

/// Priorities and tenants.
#[derive(Debug, Args)]
pub(crate) struct SchedulerFlags {
    /// Admit requests by priority class (`x-smg-priority`: system, interactive, default, bulk):
    /// reserved slots per class, one queue per class, starvation guard, preemption of queued
    /// lower classes. Off: one queue (--queue-size) for all.
    #[arg(long, env = "SGL_ROUTER_PRIORITY_SCHEDULER_ENABLED")]
    pub(crate) priority_scheduler_enabled: bool,
    /// The highest class of a tenant the config does not name (and of a request without a tenant).
    #[arg(long, env = "SGL_ROUTER_PRIORITY_SCHEDULER_DEFAULT_MAX_CLASS", default_value = "default", value_name = "CLASS", value_parser = ["system", "interactive", "default", "bulk"])]
    pub(crate) priority_scheduler_default_max_class: String,
    /// The scheduler's YAML file: `classes: {CLASS: {reserved_floor, reserved_per_slot,
    /// queue_size, queue_timeout_secs, starvation_threshold_secs, can_preempt}}` over SMG's
    /// defaults, and `tenant_policies: {TENANT: {max_class}}`. A file that does not parse stops the start.
    #[arg(long, env = "SGL_ROUTER_PRIORITY_SCHEDULER_CONFIG", value_name = "FILE")]
    pub(crate) priority_scheduler_config: Option<PathBuf>,
    /// Accepted for SMG's command lines: the scheduler's metrics are per class, never per tenant.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub(crate) priority_scheduler_tenant_metric_top_n: u32,
    /// Take a request's tenant from --tenant-header-name (set by a trusted front); otherwise only
    /// a --tenant-api-key names it.
    #[arg(long, env = "SGL_ROUTER_TRUST_TENANT_HEADER")]
    pub(crate) trust_tenant_header: bool,
    /// The trusted tenant header.
    #[arg(long, env = "SGL_ROUTER_TENANT_HEADER_NAME", default_value = "x-smg-tenant-id", value_name = "HEADER")]
    pub(crate) tenant_header_name: String,
    /// A tenant's data-plane key, `TENANT:KEY` (repeatable): a client presenting KEY is that tenant.
    /// The keys are client keys besides --client-api-keys (or --api-key).
    #[arg(long, env = "SGL_ROUTER_TENANT_API_KEY", hide_env_values = true, num_args = 1, action = clap::ArgAction::Append, value_name = "TENANT:KEY")]
    pub(crate) tenant_api_key: Vec<String>,
    /// Per-tenant rate limits in requests and prompt tokens per minute (--tenant-rate-limit-config).
    #[arg(long, env = "SGL_ROUTER_TENANT_RATE_LIMIT_ENABLED", requires = "tenant_rate_limit_config")]
    pub(crate) tenant_rate_limit_enabled: bool,
    /// The rate limits' YAML file, SMG's shape: `default_policy: {tokens_per_minute,
    /// requests_per_minute}` and `tenants: [{tenant_key: auth:ID | header:ID | anonymous, ...}]`.
    #[arg(long, env = "SGL_ROUTER_TENANT_RATE_LIMIT_CONFIG", value_name = "FILE")]
    pub(crate) tenant_rate_limit_config: Option<PathBuf>,
}

/// The rate limits' YAML shape (SMG's).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    default_policy: PolicySpec,
    #[serde(default)]
    tenants: Vec<PolicySpec>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    #[serde(default)]
    tenant_key: Option<String>,
    tokens_per_minute: u32,
    requests_per_minute: u32,
    #[serde(default)]
    model_rules: Vec<serde_json::Value>,
}

/// The YAML file's shape (SMG's).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerYaml {
    #[serde(default)]
    classes: HashMap<Class, ClassConfig>,
    #[serde(default)]
    tenant_policies: HashMap<String, TenantPolicy>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantPolicy {
    max_class: Class,
}

/// Most tenants a scheduler file may name.
const MAX_TENANT_POLICIES: usize = 10_000;

impl SchedulerFlags {
    /// The scheduler's configuration, when it is on.
    pub(crate) fn scheduler(&self) -> Result<Option<SchedulerConfig>, UsageError> {
        if !self.priority_scheduler_enabled {
            if self.priority_scheduler_config.is_some() {
                return Err(UsageError("--priority-scheduler-config needs --priority-scheduler-enabled".into()));
            }
            return Ok(None);
        }
        let mut config = SchedulerConfig {
            default_max_class: Class::parse(self.priority_scheduler_default_max_class.as_bytes()),
            ..SchedulerConfig::default()
        };
        let Some(path) = &self.priority_scheduler_config else { return Ok(Some(config)) };
        let flag = |e: String| UsageError(format!("--priority-scheduler-config {}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| flag(e.to_string()))?;
        let yaml: SchedulerYaml = serde_norway::from_str(&text).map_err(|e| flag(e.to_string()))?;
        if yaml.tenant_policies.len() > MAX_TENANT_POLICIES {
            return Err(flag(format!("more than {MAX_TENANT_POLICIES} tenant policies")));
        }
        for (class, c) in yaml.classes {
            if c.queue_timeout_secs == 0 || c.starvation_threshold_secs == 0 {
                return Err(flag(format!(
                    "class {}: queue_timeout_secs and starvation_threshold_secs must be > 0",
                    class.as_str()
                )));
            }
            if !(c.reserved_per_slot.is_finite() && c.reserved_per_slot >= 0.0) {
                return Err(flag(format!("class {}: reserved_per_slot must be finite and >= 0", class.as_str())));
            }
            config.classes[class as usize] = c;
        }
        config.tenant_max_class = yaml.tenant_policies.into_iter().map(|(t, p)| (t, p.max_class)).collect();
        Ok(Some(config))
    }

    /// Who a request's tenant is.
    pub(crate) fn tenants(&self) -> Result<Tenants, UsageError> {
        let mut by_key = HashMap::new();
        for entry in &self.tenant_api_key {
            let Some((tenant, key)) = entry.split_once(':').filter(|(t, k)| !t.is_empty() && !k.is_empty()) else {
                return Err(UsageError("--tenant-api-key: expected TENANT:KEY".into()));
            };
            by_key.insert(format!("Bearer {key}").into_bytes(), tenant.to_string());
        }
        let header = self.tenant_header_name.trim().to_ascii_lowercase();
        if self.trust_tenant_header && axum::http::HeaderName::from_bytes(header.as_bytes()).is_err() {
            return Err(UsageError(format!("--tenant-header-name {header}: not a header name")));
        }
        Ok(Tenants { trusted_header: self.trust_tenant_header.then_some(header), by_key })
    }

    /// The per-tenant rate limits, when on.
    pub(crate) fn tenant_limits(&self) -> Result<Option<TenantLimitsConfig>, UsageError> {
        let (true, Some(path)) = (self.tenant_rate_limit_enabled, &self.tenant_rate_limit_config) else {
            return Ok(None);
        };
        let flag = |e: String| UsageError(format!("--tenant-rate-limit-config {}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| flag(e.to_string()))?;
        let yaml: RateLimitYaml = serde_norway::from_str(&text).map_err(|e| flag(e.to_string()))?;
        let limits = |p: &PolicySpec, label: &str| {
            if p.tokens_per_minute == 0 || p.requests_per_minute == 0 {
                return Err(flag(format!("{label}: tokens_per_minute and requests_per_minute must be > 0")));
            }
            if !p.model_rules.is_empty() {
                return Err(flag(format!("{label}: per-model rules (model_rules) are not built here")));
            }
            Ok(Limits { requests_per_minute: p.requests_per_minute, tokens_per_minute: p.tokens_per_minute })
        };
        if yaml.default_policy.tenant_key.is_some() {
            return Err(flag("default_policy must not set tenant_key".into()));
        }
        let default = limits(&yaml.default_policy, "default_policy")?;
        if yaml.tenants.len() > MAX_TENANT_POLICIES {
            return Err(flag(format!("more than {MAX_TENANT_POLICIES} tenants")));
        }
        let mut tenants = HashMap::new();
        for (i, p) in yaml.tenants.iter().enumerate() {
            let Some(key) = p.tenant_key.clone() else { return Err(flag(format!("tenants[{i}] has no tenant_key"))) };
            let canonical = key == "anonymous"
                || key.strip_prefix("auth:").is_some_and(|t| !t.is_empty())
                || key.strip_prefix("header:").is_some_and(|t| !t.is_empty());
            if !canonical {
                return Err(flag(format!(
                    "tenant_key {key}: expected auth:ID, header:ID or anonymous (ip: keys are not built)"
                )));
            }
            if key.starts_with("header:") && !self.trust_tenant_header {
                return Err(flag(format!("tenant_key {key} needs --trust-tenant-header: it could never match")));
            }
            if tenants.insert(key.clone(), limits(p, &key)?).is_some() {
                return Err(flag(format!("tenant_key {key} twice")));
            }
        }
        Ok(Some(TenantLimitsConfig { default, tenants }))
    }

    /// The tenants' keys, as client keys.
    pub(crate) fn tenant_keys(&self) -> impl Iterator<Item = String> + '_ {
        self.tenant_api_key.iter().filter_map(|e| e.split_once(':').map(|(_, k)| k.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn flags(args: &[&str]) -> SchedulerFlags {
        crate::cli::Cli::try_parse_from(std::iter::once("sgl-router").chain(args.iter().copied()))
            .unwrap()
            .serve
            .scheduler
    }

    #[test]
    fn the_scheduler_file_overrides_smgs_defaults_and_names_tenants_and_a_bad_one_stops_the_start() {
        let dir = std::env::temp_dir().join(format!("sgl-router-sched-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        std::fs::write(
            &good,
            "classes:\n  bulk: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 10, starvation_threshold_secs: 20, can_preempt: false}\ntenant_policies:\n  ops: {max_class: system}\n",
        )
        .unwrap();
        let path = good.to_str().unwrap();
        let c =
            flags(&["--priority-scheduler-enabled", "--priority-scheduler-config", path]).scheduler().unwrap().unwrap();
        assert_eq!(c.classes[Class::Bulk as usize].queue_size, 8);
        assert_eq!(c.classes[Class::Interactive as usize], ClassConfig::default_for(Class::Interactive));
        assert_eq!(c.tenant_max_class["ops"], Class::System);
        assert_eq!(c.default_max_class, Class::Default);
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "classes:\n  bulk: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 0, starvation_threshold_secs: 20, can_preempt: false}\n").unwrap();
        let e =
            flags(&["--priority-scheduler-enabled", "--priority-scheduler-config", bad.to_str().unwrap()]).scheduler();
        assert!(e.unwrap_err().0.contains("queue_timeout_secs"));
        std::fs::write(&bad, "classes:\n  urgent: {}\n").unwrap();
        assert!(
            flags(&["--priority-scheduler-enabled", "--priority-scheduler-config", bad.to_str().unwrap()])
                .scheduler()
                .is_err()
        );
        assert!(flags(&["--priority-scheduler-config", path]).scheduler().is_err(), "a file without the scheduler");
        assert_eq!(flags(&[]).scheduler().unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The tenant's name `t` finds.
    fn name<'a>(t: &'a Tenants, header: Option<&'a [u8]>, authorization: Option<&[u8]>) -> Option<&'a str> {
        t.tenant(header, authorization).map(gateway::pipeline::scheduler::Tenant::name)
    }

    #[test]
    fn tenants_come_from_their_keys_or_a_trusted_header() {
        let t = flags(&["--tenant-api-key", "ops:k1", "--tenant-api-key", "batch:k2"]).tenants().unwrap();
        assert_eq!(name(&t, None, Some(b"Bearer k1")), Some("ops"));
        assert_eq!(name(&t, Some(b"spoofed"), Some(b"Bearer k2")), Some("batch"), "the header is not trusted");
        assert_eq!(name(&t, None, Some(b"Bearer other")), None);
        let t = flags(&["--trust-tenant-header", "--tenant-header-name", "X-Team"]).tenants().unwrap();
        assert_eq!(t.trusted_header.as_deref(), Some("x-team"));
        assert_eq!(name(&t, Some(b" blue "), None), Some("blue"));
        assert_eq!(name(&t, Some(&[b'a'; 200]), None), None, "too long: no tenant");
        assert!(flags(&["--tenant-api-key", "nokey"]).tenants().is_err());
    }

    #[test]
    fn the_rate_limit_file_takes_smgs_shape_and_refuses_what_could_never_match() {
        let dir = std::env::temp_dir().join(format!("sgl-router-rl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limits.yaml");
        let parse = |yaml: &str, trust: bool| {
            std::fs::write(&file, yaml).unwrap();
            let path = file.to_str().unwrap();
            let mut args = vec!["--tenant-rate-limit-enabled", "--tenant-rate-limit-config", path];
            if trust {
                args.push("--trust-tenant-header");
            }
            flags(&args).tenant_limits()
        };
        let good = "default_policy: {tokens_per_minute: 1000, requests_per_minute: 10}\ntenants:\n  - {tenant_key: auth:ops, tokens_per_minute: 5000, requests_per_minute: 100}\n  - {tenant_key: anonymous, tokens_per_minute: 10, requests_per_minute: 1}\n";
        let c = parse(good, false).unwrap().unwrap();
        assert_eq!(c.default, Limits { requests_per_minute: 10, tokens_per_minute: 1000 });
        assert_eq!(c.tenants["auth:ops"].requests_per_minute, 100);
        assert_eq!(c.tenants["anonymous"].tokens_per_minute, 10);
        let header = "default_policy: {tokens_per_minute: 1, requests_per_minute: 1}\ntenants:\n  - {tenant_key: header:blue, tokens_per_minute: 1, requests_per_minute: 1}\n";
        assert!(parse(header, false).unwrap_err().0.contains("--trust-tenant-header"));
        assert!(parse(header, true).is_ok());
        for bad in [
            "default_policy: {tokens_per_minute: 0, requests_per_minute: 1}\n",
            "default_policy: {tenant_key: auth:x, tokens_per_minute: 1, requests_per_minute: 1}\n",
            "default_policy: {tokens_per_minute: 1, requests_per_minute: 1}\ntenants:\n  - {tenant_key: ip:10.0.0.1, tokens_per_minute: 1, requests_per_minute: 1}\n",
            "default_policy: {tokens_per_minute: 1, requests_per_minute: 1, model_rules: [{rule_id: a}]}\n",
            "default_policy: {tokens_per_minute: 1, requests_per_minute: 1, burst: 3}\n",
        ] {
            assert!(parse(bad, true).is_err(), "{bad}");
        }
        assert_eq!(flags(&[]).tenant_limits().unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
