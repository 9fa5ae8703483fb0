//! Effective input cost under prompt caching, and prefix stability.
//!
//! Providers cache the longest prefix a request shares with an earlier one. Per upstream call
//! of a session, the tokens that repeat the previous call's prefix (same model, same tools,
//! then the longest run of leading messages equal byte for byte) are priced at the provider's
//! cached rate; the rest at the full rate, plus the provider's cache-write premium. A prefix
//! shorter than the provider's minimum is not cached. Costs are in units of one full-price
//! input token, so they compare across providers as "tokens you pay for".
//!
//! | provider | cached read | cache write | min prefix | source (public price pages, 2025) |
//! |---|---|---|---|---|
//! | `openai` | 50% | — | 1024 | GPT-4o / 4o-mini: cached input half price |
//! | `openai-gpt5` | 10% | — | 1024 | GPT-5 family: $0.125 vs $1.25 per 1M |
//! | `anthropic` | 10% | +25% | 1024 | cache read 0.1×, 5-minute cache write 1.25× |
//! | `deepseek` | 10% | — | 64 | V3.2: cache hit $0.028 vs miss $0.28 per 1M |
//! | `google` | 25% | — | 1024 | Gemini 2.5 implicit caching: 75% off (storage not counted) |
//!
//! Anthropic caches only up to the `cache_control` breakpoints a client sets: the figure
//! assumes a breakpoint at the end of every request (the best case).

use serde::Serialize;
use serde_json::Value;

use crate::tokens::Counter;

/// One provider's prices relative to its full input price.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pricing {
    pub name: &'static str,
    /// Price of a cached input token, as a share of the full price.
    pub cached_rate: f64,
    /// Extra paid on the tokens written to the cache (uncached ones), as a share.
    pub write_premium: f64,
    /// Shortest prefix the provider caches, in tokens.
    pub min_prefix: usize,
}

/// The table in the module docs.
pub const PROVIDERS: [Pricing; 5] = [
    Pricing {
        name: "openai",
        cached_rate: 0.5,
        write_premium: 0.0,
        min_prefix: 1024,
    },
    Pricing {
        name: "openai-gpt5",
        cached_rate: 0.1,
        write_premium: 0.0,
        min_prefix: 1024,
    },
    Pricing {
        name: "anthropic",
        cached_rate: 0.1,
        write_premium: 0.25,
        min_prefix: 1024,
    },
    Pricing {
        name: "deepseek",
        cached_rate: 0.1,
        write_premium: 0.0,
        min_prefix: 64,
    },
    Pricing {
        name: "google",
        cached_rate: 0.25,
        write_premium: 0.0,
        min_prefix: 1024,
    },
];

/// One upstream call, counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Input tokens of the call.
    pub tokens: usize,
    /// Tokens of the prefix it shares with the previous call of its session.
    pub shared_prefix_tokens: usize,
    /// Its messages start with all of the previous call's messages (the first call: false).
    pub extends_previous: bool,
    /// Not the session's first call.
    pub has_previous: bool,
}

/// Counts the upstream calls of one session, in order.
pub fn count_session(counter: &Counter, bodies: &[Value]) -> Vec<Call> {
    let mut calls = Vec::with_capacity(bodies.len());
    let mut previous: Option<(&Value, Vec<Vec<u8>>)> = None;
    for body in bodies {
        let count = counter.count_request(body);
        let messages: Vec<Vec<u8>> = body
            .get("messages")
            .and_then(Value::as_array)
            .map(|m| {
                m.iter()
                    .map(|m| serde_json::to_vec(m).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        let (shared, extends) = match &previous {
            Some((prev, prev_messages))
                if prev.get("model") == body.get("model")
                    && prev.get("tools") == body.get("tools") =>
            {
                let common = prev_messages
                    .iter()
                    .zip(&messages)
                    .take_while(|(a, b)| a == b)
                    .count();
                let tokens = count.tools + count.per_message[..common].iter().sum::<usize>();
                (tokens, common == prev_messages.len())
            }
            _ => (0, false),
        };
        calls.push(Call {
            tokens: count.total,
            shared_prefix_tokens: shared.min(count.total),
            extends_previous: extends,
            has_previous: previous.is_some(),
        });
        previous = Some((body, messages));
    }
    calls
}

/// Input cost of `calls` under `pricing`, in full-price tokens.
pub fn effective_cost(calls: &[Call], pricing: &Pricing) -> f64 {
    calls
        .iter()
        .map(|c| {
            let cached = if c.shared_prefix_tokens >= pricing.min_prefix {
                c.shared_prefix_tokens
            } else {
                0
            };
            cached as f64 * pricing.cached_rate
                + (c.tokens - cached) as f64 * (1.0 + pricing.write_premium)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{CountSettings, Encoding};
    use serde_json::json;

    fn counter() -> Counter {
        Counter::new(Encoding::O200kBase, CountSettings::default())
    }

    /// A hand-computed trace: three calls; the second extends the first, the third rewrites
    /// the first message (as a compaction would) and so shares nothing but the tools.
    #[test]
    fn cached_prefix_cost_matches_a_hand_computed_trace() {
        let c = counter();
        let m1 = json!({"role": "user", "content": "one two three"});
        let m2 = json!({"role": "assistant", "content": "four"});
        let m3 = json!({"role": "user", "content": "five six"});
        let m1b = json!({"role": "user", "content": "[compacted]"});
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let body = |ms: Vec<&Value>| json!({"model": "m", "tools": tools, "messages": ms});
        let bodies = [
            body(vec![&m1]),
            body(vec![&m1, &m2, &m3]),
            body(vec![&m1b, &m2, &m3]),
        ];
        let calls = count_session(&c, &bodies);
        let t: Vec<usize> = bodies.iter().map(|b| c.count_request(b).total).collect();
        let tools_t = c.count_request(&bodies[0]).tools;
        let m1_t = c.count_message(&m1);
        assert_eq!(calls[0].shared_prefix_tokens, 0);
        assert_eq!(calls[1].shared_prefix_tokens, tools_t + m1_t);
        assert!(calls[1].extends_previous);
        assert_eq!(calls[2].shared_prefix_tokens, tools_t);
        assert!(!calls[2].extends_previous);
        // OpenAI-like: cached at 50%, no minimum.
        let half = Pricing {
            name: "t",
            cached_rate: 0.5,
            write_premium: 0.0,
            min_prefix: 0,
        };
        let expected = t[0] as f64
            + (t[1] - tools_t - m1_t) as f64
            + 0.5 * (tools_t + m1_t) as f64
            + (t[2] - tools_t) as f64
            + 0.5 * tools_t as f64;
        assert!((effective_cost(&calls, &half) - expected).abs() < 1e-9);
        // Anthropic-like: 10% reads, 25% write premium on the rest.
        let anthropic = Pricing {
            name: "a",
            cached_rate: 0.1,
            write_premium: 0.25,
            min_prefix: 0,
        };
        let cached = [0, tools_t + m1_t, tools_t];
        let expected: f64 = (0..3)
            .map(|i| 0.1 * cached[i] as f64 + 1.25 * (t[i] - cached[i]) as f64)
            .sum();
        assert!((effective_cost(&calls, &anthropic) - expected).abs() < 1e-9);
        // Below the minimum prefix nothing is cached.
        let strict = Pricing {
            min_prefix: 1_000_000,
            ..half
        };
        assert_eq!(
            effective_cost(&calls, &strict),
            t.iter().sum::<usize>() as f64
        );
    }
}
