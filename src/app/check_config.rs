//! The `check-config` subcommand: loads a config file with its environment overrides, checks
//! it as the server would at start-up (the keys file, the upstreams' and admin's environment
//! variables included), and prints the effective configuration with its secrets masked, as
//! TOML that can be used as a config file: every key with its value, defaults filled in.

use std::path::Path;

use crate::app::config::{Config, ConfigError, ValidConfig};
use crate::app::env_overrides::PREFIX;

/// Why a configuration cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamSetupError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthSetupError),
    #[error("cannot print the configuration as TOML: {0}")]
    Print(String),
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
    crate::auth::Auth::new(&config.auth, &config.keys, config.upstream_keys(), env)?;
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
        "# proxy keys in the config: {}{}{}\n",
        if names.is_empty() {
            "none".to_string()
        } else {
            format!("{} ({})", names.len(), names.join(", "))
        },
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
    for warning in config.warnings() {
        out.push_str(&format!("# warning: {warning}\n"));
    }
    out.push_str(HEADER);
    out.push_str(&to_toml(&masked(&config))?);
    Ok((config, out))
}

/// Printed above the configuration.
const HEADER: &str = "\
# The effective configuration: every key with its value, defaults filled in ([upstream] is
# shown as the [[upstreams]] entry it stands for). An optional key that is not shown is unset.
# Secrets are masked: key hashes (sha256 = \"<first 8 digits>…\") and Redis passwords (***);
# API keys and the admin token are never in the file, only the names of their variables.

";

/// `config` as TOML, in the order of the config's sections; the one map of the config
/// (`[context.model_windows]`, hashed) sorted by key, so that the output is the same on every run.
pub fn to_toml(config: &Config) -> Result<String, CheckError> {
    let mut value = serde_json::to_value(config).map_err(|e| CheckError::Print(e.to_string()))?;
    if let Some(windows) = value
        .get_mut("context")
        .and_then(|c| c.get_mut("model_windows"))
        .and_then(serde_json::Value::as_object_mut)
    {
        windows.sort_keys();
    }
    // No `keys = []` above the first section: no [[keys]] entry says the same.
    if let Some(map) = value.as_object_mut() {
        if map
            .get("keys")
            .is_some_and(|k| k.as_array().is_some_and(Vec::is_empty))
        {
            map.remove("keys");
        }
    }
    let table = toml_value(value).unwrap_or_else(|| toml::Value::Table(Default::default()));
    toml::to_string_pretty(&table).map_err(|e| CheckError::Print(e.to_string()))
}

/// `value` as TOML, keys in the same order; `None` for an unset key (`null`, which TOML cannot
/// hold), left out. Numbers go by value, as TOML integers or floats.
fn toml_value(value: serde_json::Value) -> Option<toml::Value> {
    use serde_json::Value as J;
    Some(match value {
        J::Null => return None,
        J::Bool(b) => toml::Value::Boolean(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        J::String(s) => toml::Value::String(s),
        J::Array(items) => toml::Value::Array(items.into_iter().filter_map(toml_value).collect()),
        J::Object(map) => toml::Value::Table(
            map.into_iter()
                .filter_map(|(k, v)| Some((k, toml_value(v)?)))
                .collect(),
        ),
    })
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
        assert!(report.contains("mode = \"off\""), "{report}");
    }

    /// The body of a report: the TOML after the comment lines.
    fn printed(report: &str) -> &str {
        &report[report.find("\n\n").unwrap() + 2..]
    }

    /// Prints `text`'s effective configuration, reads the printout back as a config file, and
    /// checks it is the same configuration.
    fn round_trip(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let keys = dir.path().join("keys.toml");
        std::fs::write(&keys, "").unwrap();
        let text = text.replace("KEYS_FILE", &keys.display().to_string());
        std::fs::write(&path, text).unwrap();
        let vars = [
            ("CP_CHECK_MAIN_KEY", "sk-main"),
            ("CP_CHECK_ADMIN", "admin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let (config, report) = check(Some(&path), &vars).unwrap();
        let toml = printed(&report).to_string();
        let again = Config::from_toml(&toml)
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
            .validate()
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let original = serde_json::to_value(&*config).unwrap();
        assert_eq!(serde_json::to_value(&*again).unwrap(), original, "{toml}");
        assert_eq!(to_toml(&again).unwrap(), toml);
        toml
    }

    #[test]
    fn the_printed_toml_reads_back_as_the_same_configuration() {
        let toml = round_trip(
            r#"
[server]
listen = "0.0.0.0:9000"
worker_threads = 1
[log]
format = "json"
[[upstreams]]
name = "main"
base_url = "https://api.openai.com/v1"
api_key_env = "CP_CHECK_MAIN_KEY"
models = ["gpt-*"]
default = true
[[upstreams]]
name = "local"
base_url = "http://127.0.0.1:8081/v1"
encoding = "cl100k_base"
context_window = 8192
[context]
mode = "compress"
max_context_tokens = 50000
trigger_ratio = 0.75
[context.model_windows]
"zeta" = 4096
"alpha-*" = { window = 32768, max_output = 4096 }
"mid" = { window = 16384 }
[context.reload]
max_rounds = 2
[context.summarizer]
enabled = true
upstream = "local"
model = "small"
instructions = "Keep \"quotes\" and\nnew lines."
[store]
backend = "redis"
redis_cluster_nodes = ["redis://a:7000", "redis://b:7001"]
on_error = "closed"
[tokens]
image_tokens = 1000
[auth]
keys_file = "KEYS_FILE"
admin_token_env = "CP_CHECK_ADMIN"
[record]
enabled = true
dir = "/var/lib/recordings"
"#,
        );
        // Defaults are filled in, unset keys left out.
        assert!(toml.contains("max_connections = 10000"), "{toml}");
        assert!(toml.contains("retention_days = 30"), "{toml}");
        assert!(!toml.contains("truncate_tool_result_tokens"), "{toml}");
        for window in ["zeta = 4096", "[context.model_windows.\"alpha-*\"]"] {
            assert!(toml.contains(window), "{window} missing: {toml}");
        }
        // The defaults alone, and the shipped config.toml.
        round_trip("");
        round_trip(include_str!("../../config.toml"));
    }

    #[test]
    fn secrets_are_not_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        std::fs::write(
            &path,
            format!(
                "[store]\nredis_cluster_nodes = [\"redis://u:hunter2@a:7000\"]\n\
                 redis_url = \"redis://:swordfish@db:6379\"\n\
                 [[keys]]\nname = \"alice\"\nsha256 = \"{hash}\"\n"
            ),
        )
        .unwrap();
        let (_, report) = check(Some(&path), &[]).unwrap();
        for secret in ["hunter2", "swordfish", &hash[8..]] {
            assert!(!report.contains(secret), "{secret} in {report}");
        }
        assert!(report.contains("sha256 = \"9f86d081…\""), "{report}");
        assert!(report.contains("redis://u:***@a:7000"), "{report}");
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
