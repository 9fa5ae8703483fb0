//! The `check-config` subcommand: loads a config file with its environment overrides, checks
//! it as the server would at start-up (the keys file, the upstreams' and admin's environment
//! variables included), and prints the effective configuration with its secrets masked.

use std::path::Path;

use crate::config::{Config, ConfigError, ValidConfig};
use crate::env_overrides::PREFIX;

/// Why a configuration cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamSetupError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthSetupError),
}

/// Checks `path` (or the defaults) under the environment `vars` and returns the report to
/// print: where it came from, the overrides applied, what the environment must provide, and
/// the effective configuration.
pub fn check(
    path: Option<&Path>,
    vars: &[(String, String)],
) -> Result<(ValidConfig, String), CheckError> {
    let config = Config::load_with_env(path, vars.iter().cloned())?.validate()?;
    let env = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    crate::upstream::Upstreams::new(&config.upstreams, env)?;
    crate::auth::Auth::new(&config, env)?;
    let mut out = String::new();
    let source = path.map_or("<defaults>".to_string(), |p| p.display().to_string());
    out.push_str(&format!("# {source}: valid\n"));
    let overrides: Vec<&str> = vars
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with(PREFIX) && k.contains("__"))
        .collect();
    if !overrides.is_empty() {
        out.push_str(&format!(
            "# environment overrides: {}\n",
            overrides.join(", ")
        ));
    }
    for u in &config.upstreams {
        if let Some(var) = &u.api_key_env {
            out.push_str(&format!("# upstream {}: key from ${var} (set)\n", u.name));
        }
    }
    let names: Vec<&str> = config.keys.iter().map(|k| k.name.as_str()).collect();
    out.push_str(&format!(
        "# proxy keys in the config: {} [{}]{}{}\n",
        names.len(),
        names.join(", "),
        config
            .auth
            .keys_file
            .as_ref()
            .map_or(String::new(), |f| format!(", keys file {}", f.display())),
        if config.auth.open_relay {
            "; open_relay = true (anyone who reaches the proxy spends the upstream keys)"
        } else {
            ""
        }
    ));
    let masked = masked(&config);
    out.push_str(&format!("{masked:#?}\n"));
    Ok((config, out))
}

/// A copy of the configuration safe to print: passwords in Redis URLs and the key hashes are
/// masked (keys themselves are never in the config; the environment variables are named, not
/// read out).
fn masked(config: &ValidConfig) -> Config {
    let mut c = config.clone().into_inner();
    c.store.redis_url = mask_url(&c.store.redis_url);
    for node in &mut c.store.redis_cluster_nodes {
        *node = mask_url(node);
    }
    for key in &mut c.keys {
        key.sha256 = format!("{}…", key.sha256.get(..8).unwrap_or_default());
    }
    c
}

/// `scheme://user:password@host…` with the password (or a lone user, which Redis takes as the
/// password) replaced by `***`.
fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{scheme}://{user}:***@{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(mask_url("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(mask_url("redis://u:pw@h"), "redis://u:***@h");
        assert_eq!(mask_url("redis://h:6379"), "redis://h:6379");
    }

    #[test]
    fn the_report_masks_and_names_the_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[store]\nbackend = \"memory\"\nredis_url = \"redis://:hunter2@h:6379\"\n",
        )
        .unwrap();
        let vars = vec![("CONTEXT_PROXY_CONTEXT__MODE".to_string(), "off".to_string())];
        let (config, report) = check(Some(&path), &vars).unwrap();
        assert_eq!(config.context.mode, crate::context::Mode::Off);
        assert!(report.contains("CONTEXT_PROXY_CONTEXT__MODE"), "{report}");
        assert!(!report.contains("hunter2"), "{report}");
        assert!(report.contains("mode: Off"), "{report}");
    }

    #[test]
    fn a_missing_upstream_key_variable_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[auth]\nopen_relay = true\n[upstream]\napi_key_env = \"CP_CHECK_NO_SUCH_VAR\"\n",
        )
        .unwrap();
        let err = check(Some(&path), &[]).unwrap_err().to_string();
        assert!(err.contains("CP_CHECK_NO_SUCH_VAR"), "{err}");
    }
}
