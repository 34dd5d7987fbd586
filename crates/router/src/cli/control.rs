//! The control plane's identity-provider and audit flags (Shepherd Model
//! Gateway 1.13's `--jwt-issuer`, `--jwt-audience`, `--jwt-jwks-uri`,
//! `--jwt-role-mapping`, `--control-plane-audit-enabled`): a flag group of
//! [`super::ServeArgs`], read here into the gateway's [`JwtConfig`].

use std::collections::HashMap;
use std::time::Duration;

use clap::Args;
use gateway::jwt::{JwtConfig, Role};

use crate::usage::UsageError;

/// JWT/OIDC tokens and the audit log on the control plane.
#[derive(Debug, Args)]
pub(crate) struct ControlFlags {
    /// An OIDC issuer whose RS256/ES256 tokens open the control plane when their role maps to
    /// admin (besides --control-plane-api-keys); its JWKS is found by discovery unless --jwt-jwks-uri.
    #[arg(long, env = "SGL_ROUTER_JWT_ISSUER", requires = "jwt_audience", value_name = "URL")]
    pub(crate) jwt_issuer: Option<String>,
    /// The audience the tokens must name.
    #[arg(long, env = "SGL_ROUTER_JWT_AUDIENCE", requires = "jwt_issuer", value_name = "AUD")]
    pub(crate) jwt_audience: Option<String>,
    /// The issuer's JWKS, instead of its discovery document's `jwks_uri`.
    #[arg(long, env = "SGL_ROUTER_JWT_JWKS_URI", requires = "jwt_issuer", value_name = "URL")]
    pub(crate) jwt_jwks_uri: Option<String>,
    /// `IDP_ROLE=admin|user` (repeatable): the token's `roles` claim mapped to the router's roles;
    /// a role mapped to nothing is `user`.
    #[arg(long, env = "SGL_ROUTER_JWT_ROLE_MAPPING", num_args = 0.., value_delimiter = ',', value_name = "IDP_ROLE=ROLE")]
    pub(crate) jwt_role_mapping: Vec<String>,
    /// Log every control-plane request at info, target `audit`: method, path, who (a key, or the
    /// token's subject), status, and every refusal.
    #[arg(long, env = "SGL_ROUTER_CONTROL_PLANE_AUDIT_ENABLED")]
    pub(crate) control_plane_audit_enabled: bool,
}

impl ControlFlags {
    /// The identity provider, when one is given.
    pub(crate) fn jwt(&self) -> Result<Option<JwtConfig>, UsageError> {
        let (Some(issuer), Some(audience)) = (&self.jwt_issuer, &self.jwt_audience) else {
            if !self.jwt_role_mapping.is_empty() {
                return Err(UsageError("--jwt-role-mapping needs --jwt-issuer and --jwt-audience".into()));
            }
            return Ok(None);
        };
        let url = |flag: &str, u: &str| match u.starts_with("https://") || u.starts_with("http://") {
            true => Ok(()),
            false => Err(UsageError(format!("{flag} {u}: expected an http(s) URL"))),
        };
        url("--jwt-issuer", issuer)?;
        if let Some(u) = &self.jwt_jwks_uri {
            url("--jwt-jwks-uri", u)?;
        }
        let mut role_mapping = HashMap::new();
        for m in &self.jwt_role_mapping {
            let role = match m.split_once('=').map(|(k, v)| (k.trim(), v.trim().to_ascii_lowercase())) {
                Some((k, v)) if !k.is_empty() && v == "admin" => (k, Role::Admin),
                Some((k, v)) if !k.is_empty() && v == "user" => (k, Role::User),
                _ => {
                    return Err(UsageError(format!(
                        "--jwt-role-mapping {m}: expected IDP_ROLE=admin or IDP_ROLE=user"
                    )));
                }
            };
            role_mapping.insert(role.0.to_string(), role.1);
        }
        Ok(Some(JwtConfig {
            issuer: issuer.clone(),
            audience: audience.clone(),
            jwks_uri: self.jwt_jwks_uri.clone(),
            role_claim: "roles".into(),
            role_mapping,
            leeway: Duration::from_secs(30),
            cache_ttl: Duration::from_secs(3600),
            refetch_every: gateway::jwt::REFETCH_EVERY,
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn jwt(args: &[&str]) -> Result<Option<JwtConfig>, UsageError> {
        crate::cli::Cli::try_parse_from(std::iter::once("sgl-router").chain(args.iter().copied()))
            .map_err(|e| UsageError(e.to_string()))?
            .serve
            .control
            .jwt()
    }

    #[test]
    fn an_identity_provider_needs_an_issuer_an_audience_and_known_roles() {
        let c = jwt(&[
            "--jwt-issuer",
            "https://idp.example",
            "--jwt-audience",
            "r",
            "--jwt-role-mapping",
            "G.Admin=admin",
            "G.User=User",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.role_mapping["G.Admin"], Role::Admin);
        assert_eq!(c.role_mapping["G.User"], Role::User);
        assert_eq!(c.jwks_uri, None);
        assert!(jwt(&["--jwt-issuer", "https://idp.example"]).is_err(), "no audience");
        assert!(jwt(&["--jwt-issuer", "idp.example", "--jwt-audience", "r"]).is_err(), "not a URL");
        assert!(jwt(&["--jwt-issuer", "https://i", "--jwt-audience", "r", "--jwt-role-mapping", "G=root"]).is_err());
        assert!(jwt(&["--jwt-role-mapping", "G=admin"]).is_err(), "a mapping without a provider");
        assert_eq!(jwt(&[]).unwrap(), None);
    }
}
