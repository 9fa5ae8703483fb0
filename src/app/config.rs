//! The configuration: one typed struct read from `config.toml`, with a documented default for
//! every key, unknown keys rejected, and validation at start-up whose messages name the key.
//!
//! This module only reads and checks; it does not open sockets or files other than the config.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::context::ContextConfig;
use crate::recorder::RecordConfig;
use crate::server::ServerConfig;
use crate::store::StoreConfig;
use crate::telemetry::logging::LogConfig;
use crate::tokens::CountSettings;
use crate::upstream::UpstreamConfig;

/// Everything the proxy can be told. Sections mirror `config.toml`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub log: LogConfig,
    /// A single upstream (shorthand for one `[[upstreams]]` entry that is the default).
    pub upstream: Option<UpstreamConfig>,
    /// Several upstreams routed by model name pattern.
    pub upstreams: Vec<UpstreamConfig>,
    /// Context management.
    pub context: ContextConfig,
    /// Where offloaded content and session state live.
    pub store: StoreConfig,
    /// Token counting estimates and cache.
    pub tokens: CountSettings,
    /// Client authentication (`[auth]`).
    pub auth: crate::auth::AuthConfig,
    /// The client keys the proxy knows (`[[keys]]`).
    pub keys: Vec<crate::auth::KeyConfig>,
    /// Recording of the chat-completions traffic.
    pub record: RecordConfig,
    /// The page that shows what the proxy did (`/ui/`).
    pub ui: crate::sessions::UiConfig,
}

/// A configuration that cannot be used, with the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
    #[error("invalid environment override {var}: {message}")]
    Env { var: String, message: String },
}

impl Config {
    /// Reads and validates `path`.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text (no validation of the upstream list; see [`Config::validate`]).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<inline>".into(),
            message: e.to_string(),
        })
    }

    /// Folds `[upstream]` into `[[upstreams]]` and checks every key that has constraints: each
    /// section checks its own keys (`validate` beside its type), this checks what spans
    /// sections (upstream names, the default upstream, the summarizer's upstream). Every
    /// message names the key at fault.
    pub fn validate(mut self) -> Result<ValidConfig, ConfigError> {
        if let Some(single) = self.upstream.take() {
            if !self.upstreams.is_empty() {
                return Err(ConfigError::Invalid(
                    "use either [upstream] or [[upstreams]], not both".into(),
                ));
            }
            self.upstreams.push(UpstreamConfig {
                default: true,
                ..single
            });
        }
        if self.upstreams.is_empty() {
            self.upstreams.push(UpstreamConfig {
                default: true,
                ..UpstreamConfig::default()
            });
        }
        let defaults = self.upstreams.iter().filter(|u| u.default).count();
        if defaults > 1 {
            return Err(ConfigError::Invalid(
                "more than one [[upstreams]] entry has default = true".into(),
            ));
        }
        let mut names = HashMap::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let key = format!("upstreams[{i}] ({})", u.name);
            if names.insert(u.name.clone(), i).is_some() {
                return Err(ConfigError::Invalid(format!("{key}.name is used twice")));
            }
            u.validate(&key).map_err(ConfigError::Invalid)?;
        }
        self.server.validate().map_err(ConfigError::Invalid)?;
        self.context.validate().map_err(ConfigError::Invalid)?;
        if let Some(name) = &self.context.summarizer.upstream {
            if !names.contains_key(name) {
                let mut known: Vec<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
                known.sort_unstable();
                return Err(ConfigError::Invalid(format!(
                    "context.summarizer.upstream {name:?} names no configured upstream; the upstreams are: {}",
                    known.join(", ")
                )));
            }
        }
        self.store.validate().map_err(ConfigError::Invalid)?;
        self.record.validate().map_err(ConfigError::Invalid)?;
        self.ui.validate().map_err(ConfigError::Invalid)?;
        let upstream_keys = self.upstreams.iter().any(|u| u.api_key_env.is_some());
        crate::auth::validate(&self.auth, &self.keys, upstream_keys)
            .map_err(ConfigError::Invalid)?;
        Ok(ValidConfig(self))
    }
}

/// A [`Config`] that passed [`Config::validate`]: what the server is built from. Read-only; to
/// change a key, take the [`Config`] back with [`ValidConfig::into_inner`] and validate again.
#[derive(Debug, Clone)]
pub struct ValidConfig(Config);

impl ValidConfig {
    pub fn into_inner(self) -> Config {
        self.0
    }

    /// Whether an upstream sends a key of its own (`api_key_env`): clients must then present a
    /// proxy key, unless `[auth] open_relay`.
    pub fn upstream_keys(&self) -> bool {
        self.upstreams.iter().any(|u| u.api_key_env.is_some())
    }

    /// What is valid but probably not meant: one line each, for the start-up log and
    /// `check-config`. Today: an upstream whose `base_url` has no version path segment.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self
            .upstreams
            .iter()
            .enumerate()
            .filter_map(|(i, u)| u.base_url_warning(&format!("upstreams[{i}] ({})", u.name)))
            .collect();
        warnings.extend(self.budget_warnings());
        warnings
    }

    /// A `max_context_tokens` whose cuts cannot pay on an upstream, whatever the traffic: a cut
    /// goes down to `target_ratio` × the budget, and under the upstream's minimum cacheable
    /// prefix every request after it is billed in full, where going direct it is cached. (With
    /// a budget over that, whether cuts pay depends on the pinned head of each conversation:
    /// the proxy says so once per conversation, docs/context.md.)
    fn budget_warnings(&self) -> Vec<String> {
        let context = &self.context;
        let Some(budget) = context.max_context_tokens else {
            return Vec::new();
        };
        if context.mode == crate::context::Mode::Off {
            return Vec::new();
        }
        let target = (budget as f64 * context.target_ratio) as usize;
        let mut warnings = Vec::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let key = format!("upstreams[{i}] ({})", u.name);
            let Ok(terms) = u.cache_terms(&key) else {
                continue;
            };
            let model = u
                .models
                .iter()
                .find(|m| !m.ends_with('*'))
                .map_or("gpt-4o", String::as_str);
            let cache = terms.for_model(model);
            let min = cache.min_cacheable_prefix;
            if cache.rebill_rate() > 0.0 && target < min {
                let pays = (min as f64 / context.target_ratio).ceil() as usize;
                warnings.push(format!(
                    "context.max_context_tokens = {budget} cuts requests down to {target} tokens, \
                     under {key}'s minimum cacheable prefix ({min}): every request after a cut \
                     is billed in full, where going direct it would be cached, so the budget \
                     costs more than no budget; set it to at least {pays}"
                ));
            }
        }
        warnings
    }
}

impl std::ops::Deref for ValidConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = Config::from_toml("[server]\nlisten_addr = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
    }

    #[test]
    fn a_bad_listen_address_says_what_is_allowed() {
        let err = Config::from_toml("[server]\nlisten = \"localhost\"\n").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("listen") && err.contains("127.0.0.1:8080"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_store_key_is_named_once() {
        let text = "[store]\nbackend = \"redis\"\nredis_url = \"http//x\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: store.redis_url \"http//x\" must start with redis:// or rediss://"
        );
    }

    #[test]
    fn single_upstream_becomes_the_default() {
        let cfg = Config::from_toml("[upstream]\nbase_url = \"http://127.0.0.1:9/v1\"\n")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(cfg.upstreams.len(), 1);
        assert!(cfg.upstreams[0].default);
    }

    #[test]
    fn both_upstream_forms_are_rejected() {
        let text = "[upstream]\nbase_url = \"http://a/v1\"\n[[upstreams]]\nname = \"b\"\nbase_url = \"http://b/v1\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert!(err.to_string().contains("not both"), "{err}");
    }

    #[test]
    fn a_budget_whose_cuts_fall_under_the_minimum_prefix_is_warned_about() {
        let warnings = |budget: usize, pricing: &str| {
            Config::from_toml(&format!(
                "[upstream]\nbase_url = \"https://api.openai.com/v1\"\ncache_pricing = \"{pricing}\"\n\
                 [context]\nmax_context_tokens = {budget}\n"
            ))
            .unwrap()
            .validate()
            .unwrap()
            .warnings()
        };
        // 0.6 × 1500 = 900 < 1024: cut requests are never cached by Anthropic.
        let w = warnings(1500, "anthropic");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("1024") && w[0].contains("at least 1707"),
            "{}",
            w[0]
        );
        // Room enough, or a provider that caches from 64 tokens, or none at all: nothing said.
        assert!(warnings(1707, "anthropic").is_empty());
        assert!(warnings(1500, "deepseek").is_empty());
        assert!(warnings(1500, "none").is_empty());
    }

    #[test]
    fn a_base_url_without_a_version_segment_is_warned_about() {
        let warnings = |base_url: &str| {
            Config::from_toml(&format!("[upstream]\nbase_url = \"{base_url}\"\n"))
                .unwrap()
                .validate()
                .unwrap()
                .warnings()
        };
        for fine in [
            "https://api.openai.com/v1",
            "http://127.0.0.1:11434/v1/",
            "https://openrouter.ai/api/v1",
            "https://generativelanguage.googleapis.com/v1beta/openai/",
            "https://open.bigmodel.cn/api/paas/v4",
        ] {
            assert_eq!(warnings(fine), Vec::<String>::new(), "{fine}");
        }
        for bare in [
            "http://127.0.0.1:11434",
            "http://localhost:8000/",
            "https://h/openai",
        ] {
            let w = warnings(bare);
            assert_eq!(w.len(), 1, "{bare}: {w:?}");
            assert!(w[0].contains("upstreams[0] (default).base_url"), "{w:?}");
            assert!(w[0].contains("no version path segment"), "{w:?}");
            assert!(
                w[0].contains(&format!("{}/v1?", bare.trim_end_matches('/'))),
                "{w:?}"
            );
        }
    }

    #[test]
    fn bad_base_url_names_the_upstream() {
        let text = "[[upstreams]]\nname = \"x\"\nbase_url = \"ftp://h\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert!(err.to_string().contains("upstreams[0] (x)"), "{err}");
        let text = "[[upstreams]]\nname = \"q\"\nbase_url = \"http://h/v1?k=1\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert!(
            err.to_string().contains("upstreams[0] (q).base_url"),
            "{err}"
        );
    }

    #[test]
    fn an_unknown_summarizer_upstream_is_named_with_the_upstreams_that_exist() {
        let text = "[[upstreams]]\nname = \"main\"\nbase_url = \"http://a/v1\"\n\
                    [[upstreams]]\nname = \"cheap\"\nbase_url = \"http://b/v1\"\n\
                    [context.summarizer]\nupstream = \"chaep\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("context.summarizer.upstream \"chaep\""),
            "{err}"
        );
        assert!(err.contains("cheap, main"), "{err}");
        let fixed = text.replace("chaep", "cheap");
        Config::from_toml(&fixed).unwrap().validate().unwrap();
    }

    #[test]
    fn cache_pricing_is_a_known_preset_or_the_host_and_errors_name_the_key() {
        let text =
            "[[upstreams]]\nname = \"x\"\nbase_url = \"http://h/v1\"\ncache_pricing = \"azure\"\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert!(
            err.to_string().contains("upstreams[0] (x).cache_pricing"),
            "{err}"
        );
        let text = "[upstream]\nbase_url = \"http://h/v1\"\ncached_read_rate = 0\n";
        let err = Config::from_toml(text).unwrap().validate().unwrap_err();
        assert!(err.to_string().contains(".cached_read_rate"), "{err}");
        let text =
            "[upstream]\nbase_url = \"https://api.anthropic.com/v1\"\ncache_ttl_secs = 3600\n";
        let cfg = Config::from_toml(text).unwrap().validate().unwrap();
        let p = cfg.upstreams[0]
            .cache_terms("u")
            .unwrap()
            .for_model("claude");
        assert_eq!((p.cached_read_rate, p.cache_write_premium), (0.1, 0.25));
        assert_eq!(p.cache_ttl_secs, 3600);
        let text =
            "[upstream]\nbase_url = \"http://127.0.0.1:8000/v1\"\ncache_pricing = \"none\"\n";
        let cfg = Config::from_toml(text).unwrap().validate().unwrap();
        let p = cfg.upstreams[0]
            .cache_terms("u")
            .unwrap()
            .for_model("llama");
        assert_eq!(p.cached_read_rate, 1.0);
    }

    #[test]
    fn shipped_config_toml_parses_and_validates() {
        let text = include_str!("../../config.toml");
        Config::from_toml(text).unwrap().validate().unwrap();
    }
}
