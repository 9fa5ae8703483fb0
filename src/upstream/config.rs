//! The `[[upstreams]]` section (or the single `[upstream]`): one entry per upstream, with its
//! routing patterns, timeouts and prompt-caching prices. Checked as a whole (names, the default)
//! by the composition root; each entry's own keys here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pricing::{CacheOverrides, CacheTerms, Preset, PRESET_NAMES};
use crate::tokens::Encoding;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// A short name used in logs and errors.
    pub name: String,
    /// Base URL including the version prefix, e.g. `https://api.openai.com/v1` (no query or
    /// fragment: the request's path and query are appended).
    pub base_url: String,
    /// Name of an environment variable holding this upstream's API key. When set, the proxy
    /// sends `Authorization: Bearer <key>` instead of the client's header (`x-api-key: <key>`
    /// when the client sent its key in `x-api-key`, as Anthropic clients do, and on Anthropic's
    /// own API (`*.anthropic.com`) for every request naming an `anthropic-version`).
    pub api_key_env: Option<String>,
    /// Model name patterns (`*` and `?` wildcards) routed to this upstream.
    pub models: Vec<String>,
    /// The upstream for models no pattern matches (at most one; the first upstream otherwise).
    pub default: bool,
    /// Time allowed to open a connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Longest silence between two reads of a response (headers or body), in milliseconds.
    /// There is no total timeout: a long stream is never cut while it keeps sending.
    pub read_timeout_ms: u64,
    /// Idle pooled connections kept per host.
    pub pool_max_idle_per_host: usize,
    /// Tokenizer of this upstream's models (`o200k_base`, `cl100k_base`); by default chosen
    /// from the model name.
    pub encoding: Option<Encoding>,
    /// The context window of models this upstream serves that the built-in table does not know
    /// (a self-hosted server's `--ctx-size`, e.g. 8192). Unset: 128k for unknown models. A
    /// limit the upstream states in a "context too long" error is learned and wins over it.
    pub context_window: Option<usize>,
    /// The provider's prompt-caching prices, which the engine weighs before rewriting a cached
    /// prefix (`crates/pricing/src/lib.rs`): `openai` (per model family), `openai-gpt4o`,
    /// `openai-gpt4.1`, `openai-gpt5`, `anthropic`, `deepseek`, `google` or `none` (no
    /// discount: self-hosted). Unset: recognised from `base_url`'s host; any other host is
    /// priced like `openai`, so the proxy protects the cached prefix.
    pub cache_pricing: Option<String>,
    /// Overrides of the preset: a cached input token's price as a share of the full price.
    pub cached_read_rate: Option<f64>,
    /// Overrides of the preset: the extra paid on tokens written to the cache, as a share.
    pub cache_write_premium: Option<f64>,
    /// Overrides of the preset: the shortest prefix the provider caches, in tokens.
    pub min_cacheable_prefix: Option<usize>,
    /// Overrides of the preset: how long an unused cached prefix lives, in seconds.
    pub cache_ttl_secs: Option<u64>,
    /// The Responses API's compaction (`POST /v1/responses/compact`, a final
    /// `compaction_trigger` input item) forwarded as it came, for the upstream to compact
    /// natively (OpenAI's encrypted compaction). Unset: the proxy compacts with its own
    /// summarizer, which any Responses upstream can then read.
    pub native_compaction: bool,
    /// Anthropic Messages: when a request's estimate is within this share of its budget (or
    /// of its model's window), the upstream's `POST /v1/messages/count_tokens` is asked for
    /// the exact figure and the decision follows it; a request the window cannot hold by that
    /// count is refused with Anthropic's "prompt is too long". 0 (the default): never asked.
    pub count_tokens_margin: f64,
    /// How long the proxy waits for that count, in milliseconds (then it decides by the
    /// estimate).
    pub count_tokens_timeout_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            name: "default".into(),
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: None,
            models: Vec::new(),
            default: false,
            connect_timeout_ms: 5_000,
            read_timeout_ms: 300_000,
            pool_max_idle_per_host: 256,
            encoding: None,
            context_window: None,
            cache_pricing: None,
            cached_read_rate: None,
            cache_write_premium: None,
            min_cacheable_prefix: None,
            cache_ttl_secs: None,
            native_compaction: false,
            count_tokens_margin: 0.0,
            count_tokens_timeout_ms: 2_000,
        }
    }
}

impl UpstreamConfig {
    /// Checks this entry's own keys; `key` names the entry in messages (`upstreams[0] (name)`).
    pub fn validate(&self, key: &str) -> Result<(), String> {
        let url = reqwest::Url::parse(&self.base_url)
            .map_err(|e| format!("{key}.base_url {:?} is not a URL: {e}", self.base_url))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(format!(
                "{key}.base_url must start with http:// or https://"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "{key}.base_url must not have a query or fragment (the request's are appended)"
            ));
        }
        self.cache_terms(key)?;
        if !(0.0..=1.0).contains(&self.count_tokens_margin) {
            return Err(format!(
                "{key}.count_tokens_margin must be between 0 (never ask) and 1"
            ));
        }
        if self.count_tokens_timeout_ms == 0 {
            return Err(format!("{key}.count_tokens_timeout_ms must be above 0"));
        }
        if self.connect_timeout_ms == 0 || self.read_timeout_ms == 0 {
            return Err(format!(
                "{key}.connect_timeout_ms and read_timeout_ms must be above 0"
            ));
        }
        Ok(())
    }

    /// The caching terms: `cache_pricing` (else the provider of `base_url`'s host) with the
    /// overrides on top. Errors name the key under `key`.
    pub fn cache_terms(&self, key: &str) -> Result<CacheTerms, String> {
        let preset = match &self.cache_pricing {
            Some(name) => Preset::parse(name).ok_or_else(|| {
                format!("{key}.cache_pricing {name:?} is not one of {PRESET_NAMES}")
            })?,
            None => reqwest::Url::parse(&self.base_url)
                .ok()
                .and_then(|u| u.host_str().map(Preset::for_host))
                .unwrap_or(Preset::OpenAi),
        };
        let terms = CacheTerms {
            preset,
            overrides: CacheOverrides {
                cached_read_rate: self.cached_read_rate,
                cache_write_premium: self.cache_write_premium,
                min_cacheable_prefix: self.min_cacheable_prefix,
                cache_ttl_secs: self.cache_ttl_secs,
            },
        };
        // Every model family of the preset must come out valid.
        for model in ["gpt-4o", "gpt-4.1", "gpt-5"] {
            terms.for_model(model).validate(key)?;
        }
        Ok(terms)
    }

    /// A warning when `base_url` has no version path segment (`/v1`, `/v1beta`, `/v4`, …):
    /// a request to `/v1/chat/completions` goes to `base_url` + `/chat/completions`, which
    /// OpenAI-compatible servers (OpenAI, Ollama, vLLM, llama.cpp) answer 404. Only a warning:
    /// a few servers (DeepSeek) answer without one.
    pub fn base_url_warning(&self, key: &str) -> Option<String> {
        let url = reqwest::Url::parse(&self.base_url).ok()?;
        let versioned = url.path_segments()?.any(|segment| {
            let mut chars = segment.chars();
            chars.next() == Some('v') && chars.next().is_some_and(|c| c.is_ascii_digit())
        });
        if versioned {
            return None;
        }
        let base = self.base_url.trim_end_matches('/');
        Some(format!(
            "{key}.base_url {base:?} has no version path segment: a request to \
             /v1/chat/completions goes to {base}/chat/completions, which most OpenAI-compatible \
             servers (Ollama, vLLM, llama.cpp) answer 404; did you mean {base}/v1?"
        ))
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.read_timeout_ms)
    }
    pub fn count_tokens_timeout(&self) -> Duration {
        Duration::from_millis(self.count_tokens_timeout_ms)
    }
}
