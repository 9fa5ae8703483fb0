//! The providers' prompt-caching prices: one table, read by the engine (through the settings of
//! each request, to price a prefix rewrite before making it) and by the replay report (to price
//! what was sent). Pure data and arithmetic; no I/O.
//!
//! Providers bill the longest prefix a request shares with a recent one at a fraction of the
//! input price. Every figure is relative to the provider's full input price, so costs compare
//! across providers as "full-price input tokens".
//!
//! | preset | cached read | cache write | min prefix | lifetime | source (public price pages, 2025) |
//! |---|---|---|---|---|---|
//! | `openai-gpt4o` | 50% | — | 1024 | 300 s | GPT-4o $2.50 vs $1.25 cached per 1M; 4o-mini $0.15 vs $0.075; o1, o3-mini the same half |
//! | `openai-gpt4.1` | 25% | — | 1024 | 300 s | GPT-4.1 $2.00 vs $0.50 cached; o3 $2.00 vs $0.50; o4-mini $1.10 vs $0.275 |
//! | `openai-gpt5` | 10% | — | 1024 | 300 s | GPT-5 $1.25 vs $0.125 cached; mini and nano the same tenth |
//! | (`openai`, GPT-5.6+ and GPT-6) | 10% | +25% | 1024 | 1800 s | 2026: "for GPT-5.6 models and later model families, cache writes cost 1.25× the uncached input token rate" (OpenAI's prompt-caching guide); GPT-6 Sol $2 vs $0.20 cached, writes $2.50, 30-minute retention |
//! | (`openai`, GPT-6.1 and later GPT-6) | 5% | +25% | 1024 | 1800 s | GPT-6.2 Sol $2.00 vs $0.10 cached, writes $2.50 (its model page); GPT-6.1 Sol the same |
//! | `anthropic` | 10% | +25% | 1024 | 300 s | cache read 0.1× base input, 5-minute cache write 1.25×; 1024-token minimum (Sonnet, Opus); for Claude Opus 5.5 the proxy reads at 5% ($0.20 vs $4, its model page) |
//! | `deepseek` | 10% | — | 64 | 3600 s | V3.2: cache hit $0.028 vs miss $0.28 per 1M; cached in 64-token units, kept "hours to days" |
//! | `google` | 25% | — | 1024 | 3600 s | Gemini 2.5 implicit caching: 75% off cached input, 1024-token minimum (Flash); 1 h default lifetime of explicit caches |
//! | `none` | 100% | — | 0 | 0 s | self-hosted or no caching: every token billed in full |
//!
//! `openai` is not one preset: it stands for the row of the request's model family
//! ([`Preset::OpenAi`]; the two rows in parentheses are only reached so); `anthropic` follows
//! the model for Opus 5.5's reads. The replay report prices each named row as written. OpenAI keeps cached prefixes for 5 to 10 minutes of inactivity (up to
//! an hour off-peak): 300 s is the safe side. Anthropic caches only up to the `cache_control`
//! breakpoints a client sets: the figures assume a breakpoint at the end of every request (the
//! best case for going direct).
//!
//! A crate of its own (`context-proxy-pricing`, re-exported as `context_proxy::pricing`) so that
//! the proxy and its measuring tools (`context-proxy-drive`) read the same table.

#![forbid(unsafe_code)]

pub mod bill;

pub use bill::{Bill, Call, CallKind};

use serde::Serialize;

/// One provider's prompt-caching terms, relative to its full input price.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CachePricing {
    /// Price of a cached input token, as a share of the full price (1.0: no discount).
    pub cached_read_rate: f64,
    /// Extra paid on input tokens written to the cache (the uncached ones), as a share.
    pub cache_write_premium: f64,
    /// Shortest prefix the provider caches, in tokens.
    pub min_cacheable_prefix: usize,
    /// How long a cached prefix lives without being used, in seconds.
    pub cache_ttl_secs: u64,
}

impl CachePricing {
    /// No caching: every input token at the full price.
    pub const NONE: CachePricing = CachePricing {
        cached_read_rate: 1.0,
        cache_write_premium: 0.0,
        min_cacheable_prefix: 0,
        cache_ttl_secs: 0,
    };

    /// What an input token that could have been read from the cache costs more when it is
    /// billed again in full (and written to the cache again), as a share of the full price.
    pub fn rebill_rate(&self) -> f64 {
        1.0 + self.cache_write_premium - self.cached_read_rate
    }

    /// Input cost of one call of `tokens` tokens whose first `shared` tokens repeat the
    /// previous call's prefix, in full-price tokens.
    pub fn call_cost(&self, tokens: usize, shared: usize) -> f64 {
        let cached = if shared >= self.min_cacheable_prefix {
            shared.min(tokens)
        } else {
            0
        };
        cached as f64 * self.cached_read_rate
            + (tokens - cached) as f64 * (1.0 + self.cache_write_premium)
    }

    /// Checks the ranges; `key` names the config section in the message.
    pub fn validate(&self, key: &str) -> Result<(), String> {
        let rate = self.cached_read_rate;
        if !(rate.is_finite() && rate > 0.0 && rate <= 1.0) {
            return Err(format!(
                "{key}.cached_read_rate must be above 0 and at most 1, not {rate}"
            ));
        }
        let premium = self.cache_write_premium;
        if !(premium.is_finite() && (0.0..=10.0).contains(&premium)) {
            return Err(format!(
                "{key}.cache_write_premium must be between 0 and 10, not {premium}"
            ));
        }
        Ok(())
    }
}

const OPENAI_GPT4O: CachePricing = CachePricing {
    cached_read_rate: 0.5,
    cache_write_premium: 0.0,
    min_cacheable_prefix: 1024,
    cache_ttl_secs: 300,
};
const OPENAI_GPT41: CachePricing = CachePricing {
    cached_read_rate: 0.25,
    ..OPENAI_GPT4O
};
const OPENAI_GPT5: CachePricing = CachePricing {
    cached_read_rate: 0.1,
    ..OPENAI_GPT4O
};
/// GPT-5.6 and later families (GPT-6 Sol, Astra, Luna): a tenth for cached reads, and cache
/// writes billed at 1.25× the uncached rate, kept 30 minutes.
const OPENAI_GPT6: CachePricing = CachePricing {
    cached_read_rate: 0.1,
    cache_write_premium: 0.25,
    min_cacheable_prefix: 1024,
    cache_ttl_secs: 1800,
};
/// GPT-6.1 and 6.2 Sol: cached reads at a twentieth.
const OPENAI_GPT61: CachePricing = CachePricing {
    cached_read_rate: 0.05,
    ..OPENAI_GPT6
};
const ANTHROPIC: CachePricing = CachePricing {
    cached_read_rate: 0.1,
    cache_write_premium: 0.25,
    min_cacheable_prefix: 1024,
    cache_ttl_secs: 300,
};
const DEEPSEEK: CachePricing = CachePricing {
    cached_read_rate: 0.1,
    cache_write_premium: 0.0,
    min_cacheable_prefix: 64,
    cache_ttl_secs: 3600,
};
const GOOGLE: CachePricing = CachePricing {
    cached_read_rate: 0.25,
    cache_write_premium: 0.0,
    min_cacheable_prefix: 1024,
    cache_ttl_secs: 3600,
};

/// Every fixed row of the table, by name, in the order of the module docs (the replay report
/// prices with each of them).
pub const PRESETS: [(&str, CachePricing); 7] = [
    ("openai-gpt4o", OPENAI_GPT4O),
    ("openai-gpt4.1", OPENAI_GPT41),
    ("openai-gpt5", OPENAI_GPT5),
    ("anthropic", ANTHROPIC),
    ("deepseek", DEEPSEEK),
    ("google", GOOGLE),
    ("none", CachePricing::NONE),
];

/// A `cache_pricing` value of the config: a provider, or one fixed row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Preset {
    /// OpenAI: the row of the request's model family ([`openai_for_model`]).
    OpenAi,
    /// One row of [`PRESETS`].
    Fixed(&'static str, CachePricing),
}

/// The names `cache_pricing` accepts, for error messages.
pub const PRESET_NAMES: &str =
    "openai, openai-gpt4o, openai-gpt4.1, openai-gpt5, anthropic, deepseek, google, none";

impl Preset {
    /// Parses a `cache_pricing` value.
    pub fn parse(name: &str) -> Option<Preset> {
        if name == "openai" {
            return Some(Preset::OpenAi);
        }
        PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(n, p)| Preset::Fixed(n, p))
    }

    /// The provider an upstream's host belongs to; an unknown host (a gateway, a self-hosted
    /// server) is priced like OpenAI, so the proxy protects the cached prefix unless told
    /// `none`.
    pub fn for_host(host: &str) -> Preset {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let is = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
        if is("anthropic.com") {
            Preset::Fixed("anthropic", ANTHROPIC)
        } else if is("deepseek.com") {
            Preset::Fixed("deepseek", DEEPSEEK)
        } else if is("generativelanguage.googleapis.com") {
            Preset::Fixed("google", GOOGLE)
        } else {
            Preset::OpenAi
        }
    }

    /// The terms for a request to `model`.
    pub fn for_model(self, model: &str) -> CachePricing {
        match self {
            Preset::OpenAi => openai_for_model(model),
            Preset::Fixed("anthropic", p) => anthropic_for_model(model, p),
            Preset::Fixed(_, p) => p,
        }
    }
}

/// Output price over input price assumed for a model the price table does not know.
pub const UNKNOWN_OUTPUT_RATIO: f64 = 4.0;

/// A model's list prices, in dollars per million tokens: what one call of the summarizer (or
/// any model) costs next to the conversation's model, input and output alike.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// List prices by model name prefix (the longest matching prefix wins; a vendor prefix such as
/// `openai/` is ignored). Public price pages, 2025: OpenAI (gpt-4o, 4o-mini, 4.1 family, gpt-5
/// family, o3, o4-mini), Anthropic (Claude Opus 4, Sonnet 4, Haiku 4.5 and 3.5), DeepSeek
/// (V3.2, cache miss), Google (Gemini 2.5 Pro up to 200k and Flash). 2026, the models Claude
/// Code and Codex CLI run by default and their siblings: Anthropic's model pages
/// (platform.claude.com/docs/en/models/…: Fable 5 and 5.1, Opus 5, Opus 5.5, Sonnet 5 and 5.5),
/// OpenAI's gpt-6.2-sol page (developers.openai.com/api/docs/models/gpt-6.2-sol; GPT-6 Sol and
/// 6.1 Sol at the same list price, as LiteLLM's GPT-6.1 Sol note says). Short-context prices:
/// gpt-6 Sol above 272k input tokens costs more.
pub const MODEL_PRICES: [(&str, ModelPrice); 26] = [
    ("gpt-4o", ModelPrice::new(2.50, 10.00)),
    ("gpt-4o-mini", ModelPrice::new(0.15, 0.60)),
    ("gpt-4.1", ModelPrice::new(2.00, 8.00)),
    ("gpt-4.1-mini", ModelPrice::new(0.40, 1.60)),
    ("gpt-4.1-nano", ModelPrice::new(0.10, 0.40)),
    ("gpt-5", ModelPrice::new(1.25, 10.00)),
    ("gpt-5-mini", ModelPrice::new(0.25, 2.00)),
    ("gpt-5-nano", ModelPrice::new(0.05, 0.40)),
    ("o3", ModelPrice::new(2.00, 8.00)),
    ("o4-mini", ModelPrice::new(1.10, 4.40)),
    ("claude-opus-4", ModelPrice::new(15.00, 75.00)),
    ("claude-sonnet-4", ModelPrice::new(3.00, 15.00)),
    ("claude-3-5-haiku", ModelPrice::new(0.80, 4.00)),
    ("claude-haiku-4-5", ModelPrice::new(1.00, 5.00)),
    ("claude-fable-5", ModelPrice::new(10.00, 50.00)),
    ("claude-opus-5", ModelPrice::new(5.00, 25.00)),
    ("claude-opus-5-5", ModelPrice::new(4.00, 20.00)),
    ("claude-sonnet-5", ModelPrice::new(2.00, 10.00)),
    ("gpt-6-sol", ModelPrice::new(2.00, 10.00)),
    ("gpt-6.1-sol", ModelPrice::new(2.00, 10.00)),
    ("gpt-6.2-sol", ModelPrice::new(2.00, 10.00)),
    ("deepseek-chat", ModelPrice::new(0.28, 0.42)),
    ("deepseek-reasoner", ModelPrice::new(0.28, 0.42)),
    ("gemini-2.5-pro", ModelPrice::new(1.25, 10.00)),
    ("gemini-2.5-flash", ModelPrice::new(0.30, 2.50)),
    ("gemini-2.5-flash-lite", ModelPrice::new(0.10, 0.40)),
];

impl ModelPrice {
    pub const fn new(input_per_mtok: f64, output_per_mtok: f64) -> ModelPrice {
        ModelPrice {
            input_per_mtok,
            output_per_mtok,
        }
    }

    /// The list prices of `model` ([`MODEL_PRICES`]), when it is in the table.
    pub fn of(model: &str) -> Option<ModelPrice> {
        let m = model.rsplit('/').next().unwrap_or(model);
        MODEL_PRICES
            .iter()
            .filter(|(prefix, _)| m.starts_with(prefix))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|&(_, p)| p)
    }

    /// What a call of this model with `input` and `output` tokens (its input billed in full)
    /// costs in full-price input tokens of a model priced `unit`: the figures of the replay's
    /// report.
    pub fn in_units_of(&self, unit: &ModelPrice, input: usize, output: usize) -> f64 {
        self.dollars(input as f64, output as u64) / unit.dollars(1.0, 0)
    }

    /// [`ModelPrice::in_units_of`] by model names: a call of `model` in full-price input
    /// tokens of `unit_model`. A model missing from the table is priced as the unit model; a
    /// unit model missing from it as one whose output costs [`UNKNOWN_OUTPUT_RATIO`] times its
    /// input. The summarizer's calls are priced so, in the proxy and in the replay's report.
    pub fn relative_cost(model: &str, unit_model: &str, input: usize, output: usize) -> f64 {
        let fallback = ModelPrice::new(1.0, UNKNOWN_OUTPUT_RATIO);
        let unit = ModelPrice::of(unit_model).unwrap_or(fallback);
        let price = ModelPrice::of(model).unwrap_or(unit);
        price.in_units_of(&unit, input, output)
    }

    /// Dollars of a call of this model whose input costs `input_units` full-price input
    /// tokens (its input under the provider's caching: [`CachePricing::call_cost`]) and that
    /// wrote `output` tokens. The one conversion from the table's units to dollars: the page
    /// and the replay's report both price with it.
    pub fn dollars(&self, input_units: f64, output: u64) -> f64 {
        (input_units * self.input_per_mtok + output as f64 * self.output_per_mtok) / 1e6
    }
}

/// Fields of [`CachePricing`] an upstream's config sets over its preset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheOverrides {
    pub cached_read_rate: Option<f64>,
    pub cache_write_premium: Option<f64>,
    pub min_cacheable_prefix: Option<usize>,
    pub cache_ttl_secs: Option<u64>,
}

/// An upstream's caching terms: its preset, with the config's overrides on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheTerms {
    pub preset: Preset,
    pub overrides: CacheOverrides,
}

impl CacheTerms {
    /// The terms for a request to `model`.
    pub fn for_model(&self, model: &str) -> CachePricing {
        let base = self.preset.for_model(model);
        let o = &self.overrides;
        CachePricing {
            cached_read_rate: o.cached_read_rate.unwrap_or(base.cached_read_rate),
            cache_write_premium: o.cache_write_premium.unwrap_or(base.cache_write_premium),
            min_cacheable_prefix: o.min_cacheable_prefix.unwrap_or(base.min_cacheable_prefix),
            cache_ttl_secs: o.cache_ttl_secs.unwrap_or(base.cache_ttl_secs),
        }
    }
}

impl Default for CacheTerms {
    /// OpenAI's, per model family.
    fn default() -> Self {
        CacheTerms {
            preset: Preset::OpenAi,
            overrides: CacheOverrides::default(),
        }
    }
}

/// OpenAI's cached-input terms for `model`'s family (see the module table): GPT-6.1 and later
/// GPT-6 models a twentieth, GPT-6 and GPT-5.6 and later a tenth, both with cache writes at
/// 1.25× kept 30 minutes; GPT-5 a tenth; GPT-4.1, o3 and o4-mini a quarter; everything else
/// (GPT-4o, 4o-mini, o1, o3-mini) half.
pub fn openai_for_model(model: &str) -> CachePricing {
    // An OpenAI-compatible gateway may prefix the vendor (`openai/gpt-5`).
    let m = model.rsplit('/').next().unwrap_or(model);
    // The minor version after `prefix` (`gpt-5.6-terra` → 6), when there is one.
    let minor = |prefix: &str| -> Option<u32> {
        let rest = m.strip_prefix(prefix)?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if minor("gpt-6.").is_some_and(|n| n >= 1) {
        OPENAI_GPT61
    } else if m.starts_with("gpt-6") || minor("gpt-5.").is_some_and(|n| n >= 6) {
        OPENAI_GPT6
    } else if m.starts_with("gpt-5") {
        OPENAI_GPT5
    } else if m.starts_with("gpt-4.1")
        || (m.starts_with("o3") && !m.starts_with("o3-mini"))
        || m.starts_with("o4")
    {
        OPENAI_GPT41
    } else {
        OPENAI_GPT4O
    }
}

/// Anthropic's terms for `model`: `base` (the `anthropic` row), but Claude Opus 5.5's cache
/// reads, which cost a twentieth of its input price ($0.20 against $4 per 1M).
fn anthropic_for_model(model: &str, base: CachePricing) -> CachePricing {
    let m = model.rsplit('/').next().unwrap_or(model);
    if m.starts_with("claude-opus-5-5") {
        CachePricing {
            cached_read_rate: 0.05,
            ..base
        }
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_by_name_and_openai_follows_the_model() {
        assert_eq!(
            Preset::parse("none").unwrap().for_model("x"),
            CachePricing::NONE
        );
        assert_eq!(
            Preset::parse("anthropic").unwrap().for_model("gpt-5"),
            ANTHROPIC
        );
        let openai = Preset::parse("openai").unwrap();
        assert_eq!(openai.for_model("gpt-4o-mini").cached_read_rate, 0.5);
        assert_eq!(openai.for_model("gpt-4.1-nano").cached_read_rate, 0.25);
        assert_eq!(openai.for_model("o4-mini").cached_read_rate, 0.25);
        assert_eq!(openai.for_model("o3-mini").cached_read_rate, 0.5);
        assert_eq!(openai.for_model("openai/gpt-5-mini").cached_read_rate, 0.1);
        // GPT-5.6 and later families bill cache writes (1.25×) and keep them 30 minutes.
        let gpt6 = openai.for_model("gpt-6.2-sol");
        assert_eq!(
            (gpt6.cached_read_rate, gpt6.cache_write_premium),
            (0.05, 0.25)
        );
        assert_eq!(gpt6.cache_ttl_secs, 1800);
        assert_eq!(
            openai.for_model("openai/gpt-6.1-sol").cached_read_rate,
            0.05
        );
        assert_eq!(openai.for_model("gpt-6-sol").cached_read_rate, 0.1);
        assert_eq!(openai.for_model("gpt-6-luna").cache_write_premium, 0.25);
        assert_eq!(openai.for_model("gpt-5.6-terra").cache_write_premium, 0.25);
        assert_eq!(openai.for_model("gpt-5.10").cache_write_premium, 0.25);
        assert_eq!(openai.for_model("gpt-5.2").cache_write_premium, 0.0);
        assert_eq!(openai.for_model("gpt-5.2").cached_read_rate, 0.1);
        // Anthropic's row, but Opus 5.5's reads.
        let anthropic = Preset::parse("anthropic").unwrap();
        assert_eq!(
            anthropic.for_model("claude-opus-5-5").cached_read_rate,
            0.05
        );
        assert_eq!(
            anthropic.for_model("claude-opus-5-5").cache_write_premium,
            0.25
        );
        assert_eq!(anthropic.for_model("claude-sonnet-5-5"), ANTHROPIC);
        assert!(Preset::parse("azure").is_none());
        for (name, _) in PRESETS {
            assert!(PRESET_NAMES.contains(name), "{name}");
        }
    }

    #[test]
    fn hosts_are_recognised_and_unknown_ones_priced_like_openai() {
        let name = |host: &str| match Preset::for_host(host) {
            Preset::OpenAi => "openai",
            Preset::Fixed(n, _) => n,
        };
        assert_eq!(name("api.openai.com"), "openai");
        assert_eq!(name("api.anthropic.com"), "anthropic");
        assert_eq!(name("API.DeepSeek.com"), "deepseek");
        assert_eq!(name("generativelanguage.googleapis.com"), "google");
        assert_eq!(name("127.0.0.1"), "openai");
        assert_eq!(name("notanthropic.com"), "openai");
    }

    #[test]
    fn overrides_replace_single_fields_of_the_preset() {
        let terms = CacheTerms {
            preset: Preset::OpenAi,
            overrides: CacheOverrides {
                cache_ttl_secs: Some(3600),
                ..CacheOverrides::default()
            },
        };
        let p = terms.for_model("gpt-5");
        assert_eq!((p.cached_read_rate, p.cache_ttl_secs), (0.1, 3600));
        assert_eq!(p.min_cacheable_prefix, 1024);
    }

    #[test]
    fn call_cost_prices_the_cached_prefix() {
        let p = ANTHROPIC;
        // 1000 cached at 10%, 1000 written at 125%.
        assert!((p.call_cost(2000, 1500) - (150.0 + 625.0)).abs() < 1e-9);
        // Below the minimum prefix nothing is cached.
        assert!((p.call_cost(2000, 1000) - 2500.0).abs() < 1e-9);
        assert_eq!(CachePricing::NONE.call_cost(2000, 1500), 2000.0);
        assert!((p.rebill_rate() - 1.15).abs() < 1e-12);
        assert_eq!(CachePricing::NONE.rebill_rate(), 0.0);
    }

    /// The models Claude Code (2.1.332: `claude-opus-5-5`) and Codex CLI (0.171:
    /// `gpt-6.2-sol`) run by default are priced, so the page shows their sessions in dollars.
    #[test]
    fn the_default_models_of_claude_code_and_codex_are_priced() {
        let of = |m: &str| {
            let p = ModelPrice::of(m).unwrap_or_else(|| panic!("{m} has no list price"));
            (p.input_per_mtok, p.output_per_mtok)
        };
        assert_eq!(of("claude-opus-5-5"), (4.0, 20.0));
        assert_eq!(of("claude-opus-5"), (5.0, 25.0));
        assert_eq!(of("claude-fable-5-1"), (10.0, 50.0));
        assert_eq!(of("claude-sonnet-5-5"), (2.0, 10.0));
        assert_eq!(of("gpt-6.2-sol"), (2.0, 10.0));
        assert_eq!(of("openai/gpt-6.1-sol"), (2.0, 10.0));
        // Older names keep their prices.
        assert_eq!(of("claude-opus-4-1"), (15.0, 75.0));
    }

    #[test]
    fn model_prices_match_the_longest_prefix() {
        assert_eq!(
            ModelPrice::of("gpt-4o-mini-2024-07-18")
                .unwrap()
                .input_per_mtok,
            0.15
        );
        assert_eq!(ModelPrice::of("gpt-4o").unwrap().output_per_mtok, 10.0);
        assert_eq!(
            ModelPrice::of("openai/gpt-5-nano").unwrap().input_per_mtok,
            0.05
        );
        assert_eq!(
            ModelPrice::of("claude-sonnet-4-5").unwrap().output_per_mtok,
            15.0
        );
        assert!(ModelPrice::of("llama3.1:8b").is_none());
        // A summarizer call on gpt-4o-mini of 10,000 tokens in and 500 out, in gpt-4o input
        // tokens: (10,000 × 0.15 + 500 × 0.60) / 2.50 = 720.
        let mini = ModelPrice::of("gpt-4o-mini").unwrap();
        let big = ModelPrice::of("gpt-4o").unwrap();
        assert!((mini.in_units_of(&big, 10_000, 500) - 720.0).abs() < 1e-9);
        // A million cached tokens of gpt-5 at a tenth, and 1 000 output tokens: $0.125 + $0.01.
        let gpt5 = ModelPrice::of("gpt-5").unwrap();
        let input = OPENAI_GPT5.call_cost(1_000_000, 1_000_000);
        assert!((gpt5.dollars(input, 1_000) - 0.135).abs() < 1e-9);
    }

    #[test]
    fn validation_names_the_key() {
        let bad = CachePricing {
            cached_read_rate: 1.5,
            ..OPENAI_GPT4O
        };
        assert!(bad
            .validate("upstreams[0] (x)")
            .unwrap_err()
            .contains("upstreams[0] (x).cached_read_rate"));
        let bad = CachePricing {
            cache_write_premium: -0.1,
            ..OPENAI_GPT4O
        };
        assert!(bad
            .validate("u")
            .unwrap_err()
            .contains("cache_write_premium"));
        for (_, p) in PRESETS {
            p.validate("u").unwrap();
        }
    }
}
