//! Effective input cost under prompt caching, and prefix stability.
//!
//! Providers cache the longest prefix a request shares with an earlier one. Per upstream call
//! of a session, the tokens that repeat the previous call's prefix (same model, same tools,
//! then the longest run of leading messages equal byte for byte) are priced at the provider's
//! cached rate; the rest at the full rate, plus the provider's cache-write premium. A prefix
//! shorter than the provider's minimum is not cached. Costs are in units of one full-price
//! input token, so they compare across providers as "tokens you pay for". The prices are the
//! table of [`context_proxy_pricing`], the one the engine decides with.

use serde::Serialize;
use serde_json::Value;

use context_proxy_pricing::{CachePricing, PRESETS};
use context_proxy_tokens::Counter;

/// One row of the report: a name and its caching terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pricing {
    pub name: &'static str,
    pub terms: CachePricing,
}

/// Every preset of [`context_proxy_pricing::PRESETS`], in its order.
pub fn providers() -> Vec<Pricing> {
    PRESETS
        .iter()
        .map(|&(name, terms)| Pricing { name, terms })
        .collect()
}

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
pub fn effective_cost(calls: &[Call], pricing: &CachePricing) -> f64 {
    calls
        .iter()
        .map(|c| pricing.call_cost(c.tokens, c.shared_prefix_tokens))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use context_proxy_tokens::{CountSettings, Encoding};
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
        let half = CachePricing {
            cached_read_rate: 0.5,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        let expected = t[0] as f64
            + (t[1] - tools_t - m1_t) as f64
            + 0.5 * (tools_t + m1_t) as f64
            + (t[2] - tools_t) as f64
            + 0.5 * tools_t as f64;
        assert!((effective_cost(&calls, &half) - expected).abs() < 1e-9);
        // Anthropic-like: 10% reads, 25% write premium on the rest.
        let anthropic = CachePricing {
            cached_read_rate: 0.1,
            cache_write_premium: 0.25,
            ..half
        };
        let cached = [0, tools_t + m1_t, tools_t];
        let expected: f64 = (0..3)
            .map(|i| 0.1 * cached[i] as f64 + 1.25 * (t[i] - cached[i]) as f64)
            .sum();
        assert!((effective_cost(&calls, &anthropic) - expected).abs() < 1e-9);
        // Below the minimum prefix nothing is cached.
        let strict = CachePricing {
            min_cacheable_prefix: 1_000_000,
            ..half
        };
        assert_eq!(
            effective_cost(&calls, &strict),
            t.iter().sum::<usize>() as f64
        );
    }
}
