//! The `[context]` settings, the per-request mode, and the budget they resolve to for one
//! model. Reading only; deciding is the engine's job.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::models::{self, ModelLimits, DEFAULT_LIMITS};

/// What the proxy may do to a request's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// `off | compact | compress | auto`; the `x-context-mode` header overrides it per request.
    pub mode: Mode,
    /// Absolute token budget for a request. When unset, `trigger_ratio` × the model's input
    /// limit (see [`ContextConfig::resolve`]).
    pub max_context_tokens: Option<usize>,
    /// Budget as a fraction of the model's input limit (when `max_context_tokens` is unset).
    pub trigger_ratio: f64,
    /// After acting on an over-budget request, aim for this fraction of the budget, so the
    /// next action is many turns away (hysteresis).
    pub target_ratio: f64,
    /// At least this many of the latest messages are never compacted nor moved out; the
    /// window is widened to whole units, and never starts after the model's last answer.
    pub keep_recent_messages: usize,
    /// Older tool results above this many tokens are compacted into a preview and a reference.
    pub tool_result_max_tokens: usize,
    /// Hard cap for any one tool result or user text, the current turn's included, as a share
    /// of the request's budget: above it, the head and tail stay inline and the whole text
    /// goes to the store. Large-window models thus receive large documents whole.
    pub truncate_share: f64,
    /// Absolute hard cap overriding `truncate_share` (unset by default).
    pub truncate_tool_result_tokens: Option<usize>,
    /// Tokens kept for the answer when the request sets neither `max_completion_tokens` nor
    /// `max_tokens` (at most the model's own output limit).
    pub output_reserve_tokens: usize,
    /// System/developer messages and the first user message (the task) are never moved out.
    pub pin_task: bool,
    /// Lossless transforms of tool results at first sight: JSON without insignificant
    /// whitespace, runs of identical lines collapsed; the original is stored byte-exact.
    pub lossless: bool,
    /// The compaction boundary moves only once the tool results that have aged out of the
    /// recent window would save this many tokens (or the request is over budget), so that
    /// the compacted prefix stays byte-stable for many turns. Default 16 000.
    pub compact_batch_tokens: usize,
    /// Accepted for older configs and ignored (not in `config.toml`, not printed by
    /// `check-config`): an over-budget request is now always brought down to the target in one
    /// move (compaction first, then the oldest units).
    #[serde(skip_serializing)]
    pub auto_compact_ratio: f64,
    /// Most further requests a conversation is expected to make (fewer when it has made fewer
    /// so far: `engine::horizon`): a rewrite of its cached prefix that is not forced by the
    /// budget is made only when the tokens it frees, at the cached rate, over that many
    /// requests, outweigh billing the rest of the prefix again (`engine::rewrite_pays`, with
    /// the upstream's `cache_pricing`).
    pub cache_horizon_turns: f64,
    /// Lines of a compacted tool result kept inline at its start and at its end.
    pub preview_head_lines: usize,
    pub preview_tail_lines: usize,
    /// Limits of models, overriding or adding to the built-in table
    /// (`[context.model_windows]`: `"my-model" = 32768` for the window, or
    /// `"my-model" = { window = 32768, max_output = 4096 }`; a trailing `*` matches a prefix).
    pub model_windows: HashMap<String, WindowEntry>,
    /// The proxy's `context_read` / `context_search` tools (`[context.reload]`).
    pub reload: crate::proxy_tools::ReloadConfig,
    /// Summaries of moved-out spans (`[context.summarizer]`).
    pub summarizer: super::summary::SummarizerConfig,
}

/// One `[context.model_windows]` entry: a window, or a window and the longest answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum WindowEntry {
    Window(usize),
    #[serde(rename_all = "snake_case")]
    Limits {
        window: usize,
        max_output: Option<usize>,
    },
}

impl WindowEntry {
    fn limits(self) -> ModelLimits {
        match self {
            WindowEntry::Window(window) => with_window(window),
            WindowEntry::Limits { window, max_output } => match max_output {
                Some(out) => ModelLimits::new(window, out),
                None => with_window(window),
            },
        }
    }

    fn window(self) -> usize {
        match self {
            WindowEntry::Window(window) | WindowEntry::Limits { window, .. } => window,
        }
    }
}

/// Limits of a model known only by its window: the default answer size, at most half of it.
fn with_window(window: usize) -> ModelLimits {
    ModelLimits::new(window, DEFAULT_LIMITS.max_output.min(window / 2))
}

/// What one request adds to the config when its budget is resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestLimits {
    /// The request's `max_completion_tokens`, else `max_tokens`: room kept for the answer.
    pub requested_output: Option<usize>,
    /// The window of the upstream serving the request (a self-hosted server's `n_ctx`), for
    /// models not in `[context.model_windows]`: it wins over the built-in table.
    pub upstream_default_window: Option<usize>,
    /// A window the upstream itself stated for this model (learned from a "context too long"
    /// error): it wins over every table.
    pub learned_window: Option<usize>,
}

impl RequestLimits {
    /// The answer size a request asks for: `max_completion_tokens`, else `max_tokens` (chat),
    /// or `max_output_tokens` (Responses).
    pub fn requested_output_of(body: &serde_json::Value) -> Option<usize> {
        ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(serde_json::Value::as_u64))
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }
}

/// Smallest hard cap, so a truncated text keeps some head and tail beside its marker.
pub const MIN_TRUNCATE_TOKENS: usize = 500;

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            mode: Mode::Auto,
            max_context_tokens: None,
            trigger_ratio: 0.8,
            target_ratio: 0.6,
            keep_recent_messages: 6,
            tool_result_max_tokens: 2000,
            truncate_share: 0.5,
            truncate_tool_result_tokens: None,
            output_reserve_tokens: 4096,
            pin_task: true,
            lossless: true,
            compact_batch_tokens: 16_000,
            auto_compact_ratio: 0.75,
            cache_horizon_turns: 10.0,
            preview_head_lines: 8,
            preview_tail_lines: 4,
            model_windows: HashMap::new(),
            reload: crate::proxy_tools::ReloadConfig::default(),
            summarizer: super::summary::SummarizerConfig::default(),
        }
    }
}

impl ContextConfig {
    /// Checks the ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.reload.validate()?;
        self.summarizer.validate()?;
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
        ratio("truncate_share", self.truncate_share)?;
        let h = self.cache_horizon_turns;
        if !(h.is_finite() && h > 0.0 && h <= 1e6) {
            return Err(format!(
                "context.cache_horizon_turns must be above 0 and at most 1000000, not {h}"
            ));
        }
        if self.max_context_tokens == Some(0) {
            return Err(
                "context.max_context_tokens must be above 0 (leave it unset to use trigger_ratio)"
                    .into(),
            );
        }
        if self.tool_result_max_tokens == 0 {
            return Err("context.tool_result_max_tokens must be above 0".into());
        }
        if let Some(cap) = self.truncate_tool_result_tokens {
            if cap < MIN_TRUNCATE_TOKENS {
                return Err(format!(
                    "context.truncate_tool_result_tokens must be at least {MIN_TRUNCATE_TOKENS} \
                     (leave it unset to use truncate_share)"
                ));
            }
            if cap <= self.tool_result_max_tokens {
                return Err(
                    "context.truncate_tool_result_tokens must be above context.tool_result_max_tokens"
                        .into(),
                );
            }
        }
        for (model, entry) in &self.model_windows {
            let limits = entry.limits();
            if entry.window() == 0 || limits.max_output >= limits.window {
                return Err(format!(
                    "context.model_windows.\"{model}\": the window must be above 0 and above max_output"
                ));
            }
        }
        Ok(())
    }

    /// The settings for one request to `model` in `mode`.
    ///
    /// Budget = `max_context_tokens` when set; else `trigger_ratio` × the model's input limit:
    /// its window (learned from the upstream, else `[context.model_windows]`, else the
    /// upstream's default window, else the built-in table, else 128k) minus the room for the
    /// answer (the request's `max_completion_tokens`/`max_tokens`, else
    /// `output_reserve_tokens` capped at the model's largest answer), and never above a
    /// provider's own input cap (gpt-5: 272k).
    pub fn resolve(&self, model: &str, mode: Mode, request: &RequestLimits) -> Settings {
        let limits = self.limits_of(model, request);
        let output = request
            .requested_output
            .unwrap_or_else(|| self.output_reserve_tokens.min(limits.max_output));
        let input = limits.input_limit(output);
        let budget = self
            .max_context_tokens
            .unwrap_or_else(|| ((input as f64 * self.trigger_ratio) as usize).max(1));
        let truncate_tokens = self
            .truncate_tool_result_tokens
            .unwrap_or((budget as f64 * self.truncate_share) as usize)
            .max(MIN_TRUNCATE_TOKENS);
        Settings {
            mode,
            budget,
            target: (budget as f64 * self.target_ratio) as usize,
            keep_recent: self.keep_recent_messages,
            tool_result_max_tokens: self.tool_result_max_tokens,
            truncate_tokens,
            compact_batch_tokens: self.compact_batch_tokens,
            cache: crate::pricing::openai_for_model(model),
            cache_horizon_turns: self.cache_horizon_turns,
            preview_head_lines: self.preview_head_lines,
            preview_tail_lines: self.preview_tail_lines,
            pin_task: self.pin_task,
            lossless: self.lossless,
            readback: super::markers::Readback::default(),
            cut_reserve_tokens: MARKER_RESERVE_TOKENS
                + if self.summarizer.enabled {
                    self.summarizer.max_summary_tokens
                } else {
                    0
                },
            tools_offer_tokens: 0,
        }
    }

    /// The limits of `model` for this request: learned, then the config's table, then the
    /// upstream's default window, then the built-in table, then [`DEFAULT_LIMITS`].
    pub fn limits_of(&self, model: &str, request: &RequestLimits) -> ModelLimits {
        let configured = models::lookup(
            self.model_windows.iter().map(|(k, v)| (k.as_str(), *v)),
            model,
        );
        let builtin = models::builtin(model);
        if let Some(window) = request.learned_window {
            let max_output = configured
                .map(WindowEntry::limits)
                .or(builtin)
                .map_or(DEFAULT_LIMITS.max_output, |l| l.max_output)
                .min(window / 2);
            return ModelLimits::new(window, max_output);
        }
        configured
            .map(WindowEntry::limits)
            .or(request.upstream_default_window.map(with_window))
            .or(builtin)
            .unwrap_or(DEFAULT_LIMITS)
    }

    /// The window of `model` when something says it (the config's table, the upstream's
    /// default window, the built-in table), not the default assumed for an unknown model.
    pub fn known_window(&self, model: &str, request: &RequestLimits) -> Option<usize> {
        models::lookup(
            self.model_windows.iter().map(|(k, v)| (k.as_str(), *v)),
            model,
        )
        .map(|w| WindowEntry::limits(w).window)
        .or(request.upstream_default_window)
        .or(models::builtin(model).map(|l| l.window))
    }

    /// The context window of `model` (no upstream default, nothing learned).
    pub fn window_of(&self, model: &str) -> usize {
        self.limits_of(model, &RequestLimits::default()).window
    }
}

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
    /// Hard cap of one tool result or user text (from the budget, or the absolute override).
    pub truncate_tokens: usize,
    pub compact_batch_tokens: usize,
    /// The upstream's prompt-caching prices for this model (the unknown-host default,
    /// OpenAI's, until the route sets the upstream's).
    pub cache: crate::pricing::CachePricing,
    /// Further requests over which an optional rewrite must pay for itself.
    pub cache_horizon_turns: f64,
    pub preview_head_lines: usize,
    pub preview_tail_lines: usize,
    /// System/developer messages and the first user message are never moved out.
    pub pin_task: bool,
    /// Lossless transforms of tool results run first.
    pub lossless: bool,
    /// How markers tell the model to read content back (the proxy's tools, or not offered).
    pub readback: super::markers::Readback,
    /// Room a forced cut keeps free in the budget for what stands in for the moved units: the
    /// marker, and the summary placed in it when summaries are on (`max_summary_tokens`).
    pub cut_reserve_tokens: usize,
    /// Tokens of the proxy's tools' definitions when a rewrite that first makes the request
    /// refer to stored content adds them (they lead the prompt a provider caches, so the
    /// rewrite bills the whole prefix again, and every later request carries them); 0 when
    /// they are not offered, or already go out with every request (the planner sets it).
    pub tools_offer_tokens: usize,
}

/// Tokens a moved-out marker takes, at most (its text names a count, a size and a reference).
pub const MARKER_RESERVE_TOKENS: usize = 120;

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(cfg: &ContextConfig, model: &str) -> Settings {
        cfg.resolve(model, Mode::Auto, &RequestLimits::default())
    }

    #[test]
    fn windows_prefer_config_and_longest_pattern() {
        let mut cfg = ContextConfig::default();
        assert_eq!(cfg.window_of("gpt-4o-mini"), 128_000);
        assert_eq!(cfg.window_of("gpt-4"), 8192);
        assert_eq!(
            cfg.window_of("openrouter/anthropic/claude-3.5-sonnet"),
            200_000
        );
        assert_eq!(cfg.window_of("something-new"), DEFAULT_LIMITS.window);
        cfg.model_windows
            .insert("gpt-4o-mini".into(), WindowEntry::Window(1000));
        cfg.model_windows
            .insert("local-*".into(), WindowEntry::Window(4096));
        assert_eq!(cfg.window_of("gpt-4o-mini"), 1000);
        assert_eq!(cfg.window_of("local-llama"), 4096);
    }

    #[test]
    fn model_windows_accept_a_number_or_window_and_max_output() {
        let cfg: ContextConfig = toml::from_str(
            "[model_windows]\n\"a\" = 32768\n\"b*\" = { window = 8192, max_output = 1024 }\n",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.window_of("a"), 32768);
        let b = cfg.limits_of("b-1", &RequestLimits::default());
        assert_eq!((b.window, b.max_output), (8192, 1024));
        // (8192 - min(4096, 1024)) × 0.8
        assert_eq!(plain(&cfg, "b-1").budget, 5734);
        let bad: ContextConfig =
            toml::from_str("[model_windows]\n\"c\" = { window = 100, max_output = 100 }\n")
                .unwrap();
        assert!(bad.validate().unwrap_err().contains("model_windows"));
    }

    #[test]
    fn budget_is_a_ratio_of_the_input_limit() {
        let mut cfg = ContextConfig::default();
        // gpt-4o: (128,000 − 4,096 reserved for the answer) × 0.8.
        let s = plain(&cfg, "gpt-4o");
        assert_eq!(s.budget, 99_123);
        assert_eq!(s.target, 59_473);
        // gpt-5: the 272k input cap, not 0.8 × 400k.
        assert_eq!(plain(&cfg, "gpt-5").budget, 217_600);
        // The request's max_completion_tokens is the room kept for the answer.
        let asked = RequestLimits {
            requested_output: Some(28_000),
            ..RequestLimits::default()
        };
        assert_eq!(cfg.resolve("gpt-4o", Mode::Auto, &asked).budget, 80_000);
        cfg.max_context_tokens = Some(10_000);
        assert_eq!(plain(&cfg, "gpt-4o").budget, 10_000);
    }

    #[test]
    fn learned_and_upstream_windows_take_precedence() {
        let mut cfg = ContextConfig::default();
        let upstream = RequestLimits {
            upstream_default_window: Some(8192),
            ..RequestLimits::default()
        };
        // A self-hosted server's window wins over the table's guess for the name...
        assert_eq!(cfg.limits_of("llama3.1:8b", &upstream).window, 8192);
        assert_eq!(
            cfg.resolve("my-model", Mode::Auto, &upstream).budget,
            (8192 - 4096) * 4 / 5
        );
        // ...but not over the operator's table.
        cfg.model_windows
            .insert("llama3.1*".into(), WindowEntry::Window(65_536));
        assert_eq!(cfg.limits_of("llama3.1:8b", &upstream).window, 65_536);
        // What the upstream said wins over everything.
        let learned = RequestLimits {
            learned_window: Some(16_384),
            ..upstream
        };
        assert_eq!(cfg.limits_of("llama3.1:8b", &learned).window, 16_384);
    }

    #[test]
    fn hard_cap_is_a_share_of_the_budget_unless_set() {
        let mut cfg = ContextConfig::default();
        assert_eq!(plain(&cfg, "gpt-4o").truncate_tokens, 49_561);
        assert!(plain(&cfg, "gpt-4.1").truncate_tokens > 400_000);
        assert_eq!(plain(&cfg, "gpt-4").truncate_tokens, 1_638);
        cfg.truncate_tool_result_tokens = Some(24_000);
        assert_eq!(plain(&cfg, "gpt-4.1").truncate_tokens, 24_000);
        cfg.max_context_tokens = Some(600);
        cfg.truncate_tool_result_tokens = None;
        assert_eq!(plain(&cfg, "gpt-4o").truncate_tokens, MIN_TRUNCATE_TOKENS);
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
            truncate_tool_result_tokens: Some(1000),
            ..ContextConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .contains("truncate_tool_result_tokens"));
        let cfg = ContextConfig {
            truncate_share: 0.0,
            ..ContextConfig::default()
        };
        assert!(cfg.validate().unwrap_err().contains("truncate_share"));
        let cfg = ContextConfig {
            cache_horizon_turns: 0.0,
            ..ContextConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .contains("context.cache_horizon_turns"));
        ContextConfig::default().validate().unwrap();
    }

    #[test]
    fn requested_output_prefers_max_completion_tokens() {
        let body = serde_json::json!({"max_tokens": 100, "max_completion_tokens": 200});
        assert_eq!(RequestLimits::requested_output_of(&body), Some(200));
        let body = serde_json::json!({"max_tokens": 100});
        assert_eq!(RequestLimits::requested_output_of(&body), Some(100));
        assert_eq!(
            RequestLimits::requested_output_of(&serde_json::json!({})),
            None
        );
    }

    #[test]
    fn mode_header_parses() {
        assert_eq!(Mode::parse(" OFF "), Some(Mode::Off));
        assert_eq!(Mode::parse("auto"), Some(Mode::Auto));
        assert_eq!(Mode::parse("aggressive"), None);
    }
}
