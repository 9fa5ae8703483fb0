//! The `[context]` settings, the per-request mode, and the budget they resolve to for one
//! model. Reading only; deciding is the engine's job.

use std::collections::HashMap;

use serde::Deserialize;

/// What the proxy may do to a request's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forward untouched.
    Off,
    /// Truncate and compact tool results only.
    Compact,
    /// Truncate, then move the oldest whole units out when over budget (no compaction).
    Compress,
    /// Truncate and compact; when that is not enough, move the oldest whole units out.
    Auto,
}

impl Mode {
    /// Parses the `x-context-mode` header value.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Mode::Off),
            "compact" => Some(Mode::Compact),
            "compress" => Some(Mode::Compress),
            "auto" => Some(Mode::Auto),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Compact => "compact",
            Mode::Compress => "compress",
            Mode::Auto => "auto",
        }
    }

    pub fn compacts(self) -> bool {
        matches!(self, Mode::Compact | Mode::Auto)
    }

    pub fn offloads(self) -> bool {
        matches!(self, Mode::Compress | Mode::Auto)
    }
}

/// `[context]` in `config.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// `off | compact | compress | auto`; the `x-context-mode` header overrides it per request.
    pub mode: Mode,
    /// Absolute token budget for a request. When unset, `trigger_ratio` × the model's window.
    pub max_context_tokens: Option<usize>,
    /// Budget as a fraction of the model's context window (when `max_context_tokens` is unset).
    pub trigger_ratio: f64,
    /// After acting on an over-budget request, aim for this fraction of the budget, so the
    /// next action is many turns away (hysteresis).
    pub target_ratio: f64,
    /// The latest messages never compacted nor moved out.
    pub keep_recent_messages: usize,
    /// Older tool results above this many tokens are compacted into a preview and a reference.
    pub tool_result_max_tokens: usize,
    /// Hard cap for any one tool result or user text, the current turn's included: above it,
    /// the head and tail stay inline and the whole text goes to the store.
    pub truncate_tool_result_tokens: usize,
    /// The compaction boundary moves only once the tool results that have aged out of the
    /// recent window would save this many tokens (or the request is over budget), so that
    /// the compacted prefix stays byte-stable for many turns.
    pub compact_batch_tokens: usize,
    /// In `auto`, when compaction leaves more than this fraction of an over-budget request,
    /// the oldest units are moved out too.
    pub auto_compact_ratio: f64,
    /// Lines of a compacted tool result kept inline at its start and at its end.
    pub preview_head_lines: usize,
    pub preview_tail_lines: usize,
    /// Context windows of models, overriding or adding to the built-in table
    /// (`[context.model_windows]`, e.g. `"my-model" = 32768`; a trailing `*` matches a prefix).
    pub model_windows: HashMap<String, usize>,
    /// The proxy's `context_read` / `context_search` tools (`[context.reload]`).
    pub reload: crate::reload::ReloadConfig,
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            mode: Mode::Auto,
            max_context_tokens: None,
            trigger_ratio: 0.8,
            target_ratio: 0.6,
            keep_recent_messages: 6,
            tool_result_max_tokens: 2000,
            truncate_tool_result_tokens: 24_000,
            compact_batch_tokens: 8000,
            auto_compact_ratio: 0.75,
            preview_head_lines: 8,
            preview_tail_lines: 4,
            model_windows: HashMap::new(),
            reload: crate::reload::ReloadConfig::default(),
        }
    }
}

impl ContextConfig {
    /// Checks the ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.reload.validate()?;
        let ratio = |name: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(format!(
                    "context.{name} must be above 0 and at most 1, not {v}"
                ))
            }
        };
        ratio("trigger_ratio", self.trigger_ratio)?;
        ratio("target_ratio", self.target_ratio)?;
        ratio("auto_compact_ratio", self.auto_compact_ratio)?;
        if self.max_context_tokens == Some(0) {
            return Err(
                "context.max_context_tokens must be above 0 (leave it unset to use trigger_ratio)"
                    .into(),
            );
        }
        if self.tool_result_max_tokens == 0 {
            return Err("context.tool_result_max_tokens must be above 0".into());
        }
        if self.truncate_tool_result_tokens < 200 {
            return Err("context.truncate_tool_result_tokens must be at least 200".into());
        }
        if self.truncate_tool_result_tokens <= self.tool_result_max_tokens {
            return Err(
                "context.truncate_tool_result_tokens must be above context.tool_result_max_tokens"
                    .into(),
            );
        }
        Ok(())
    }

    /// The settings for one request to `model` in `mode`.
    pub fn resolve(&self, model: &str, mode: Mode) -> Settings {
        let budget = self
            .max_context_tokens
            .unwrap_or_else(|| (self.window_of(model) as f64 * self.trigger_ratio) as usize);
        Settings {
            mode,
            budget,
            target: (budget as f64 * self.target_ratio) as usize,
            keep_recent: self.keep_recent_messages,
            tool_result_max_tokens: self.tool_result_max_tokens,
            truncate_tokens: self.truncate_tool_result_tokens,
            compact_batch_tokens: self.compact_batch_tokens,
            auto_compact_ratio: self.auto_compact_ratio,
            preview_head_lines: self.preview_head_lines,
            preview_tail_lines: self.preview_tail_lines,
        }
    }

    /// The context window of `model`: the config's table, then the built-in one.
    pub fn window_of(&self, model: &str) -> usize {
        lookup(
            self.model_windows.iter().map(|(k, v)| (k.as_str(), *v)),
            model,
        )
        .or_else(|| lookup(BUILTIN_WINDOWS.iter().copied(), model))
        .unwrap_or(DEFAULT_WINDOW)
    }
}

/// Longest matching entry: exact name, or a prefix pattern ending in `*`.
fn lookup<'a>(table: impl Iterator<Item = (&'a str, usize)>, model: &str) -> Option<usize> {
    let model = model.rsplit('/').next().unwrap_or(model);
    table
        .filter(|(pattern, _)| match pattern.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => *pattern == model,
        })
        .max_by_key(|(pattern, _)| pattern.len())
        .map(|(_, window)| window)
}

/// Window assumed for a model in neither table.
pub const DEFAULT_WINDOW: usize = 128_000;

/// Known models' context windows (tokens), by name or prefix.
const BUILTIN_WINDOWS: &[(&str, usize)] = &[
    ("gpt-4o*", 128_000),
    ("gpt-4.1*", 1_047_576),
    ("gpt-4-turbo*", 128_000),
    ("gpt-4-32k*", 32_768),
    ("gpt-4", 8192),
    ("gpt-4-0613", 8192),
    ("gpt-3.5-turbo*", 16_385),
    ("gpt-5*", 400_000),
    ("o1*", 200_000),
    ("o3*", 200_000),
    ("o4-mini*", 200_000),
    ("claude-*", 200_000),
    ("deepseek-*", 128_000),
    ("gemini-1.5*", 1_048_576),
    ("gemini-2*", 1_048_576),
    ("llama3*", 8192),
    ("llama-3.1*", 128_000),
    ("qwen2.5*", 32_768),
    ("mistral-large*", 128_000),
];

/// Everything the engine needs to decide for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub mode: Mode,
    /// High watermark: above it the request must shrink.
    pub budget: usize,
    /// Low watermark: what an over-budget request is shrunk to, when it can be.
    pub target: usize,
    pub keep_recent: usize,
    pub tool_result_max_tokens: usize,
    pub truncate_tokens: usize,
    pub compact_batch_tokens: usize,
    pub auto_compact_ratio: f64,
    pub preview_head_lines: usize,
    pub preview_tail_lines: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_prefer_config_and_longest_pattern() {
        let mut cfg = ContextConfig::default();
        assert_eq!(cfg.window_of("gpt-4o-mini"), 128_000);
        assert_eq!(cfg.window_of("gpt-4"), 8192);
        assert_eq!(
            cfg.window_of("openrouter/anthropic/claude-3.5-sonnet"),
            200_000
        );
        assert_eq!(cfg.window_of("something-new"), DEFAULT_WINDOW);
        cfg.model_windows.insert("gpt-4o-mini".into(), 1000);
        cfg.model_windows.insert("local-*".into(), 4096);
        assert_eq!(cfg.window_of("gpt-4o-mini"), 1000);
        assert_eq!(cfg.window_of("local-llama"), 4096);
    }

    #[test]
    fn budget_from_ratio_or_absolute() {
        let mut cfg = ContextConfig::default();
        let s = cfg.resolve("gpt-4o", Mode::Auto);
        assert_eq!(s.budget, 102_400);
        assert_eq!(s.target, 61_440);
        cfg.max_context_tokens = Some(10_000);
        assert_eq!(cfg.resolve("gpt-4o", Mode::Auto).budget, 10_000);
    }

    #[test]
    fn validation_names_the_key() {
        let cfg = ContextConfig {
            trigger_ratio: 1.5,
            ..ContextConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .contains("context.trigger_ratio"));
        let cfg = ContextConfig {
            truncate_tool_result_tokens: 1000,
            ..ContextConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .contains("truncate_tool_result_tokens"));
        ContextConfig::default().validate().unwrap();
    }

    #[test]
    fn mode_header_parses() {
        assert_eq!(Mode::parse(" OFF "), Some(Mode::Off));
        assert_eq!(Mode::parse("auto"), Some(Mode::Auto));
        assert_eq!(Mode::parse("aggressive"), None);
    }
}
