//! Effective input cost under prompt caching, and prefix stability.
//!
//! Providers cache the longest prefix a request shares with an earlier one. Per upstream call
//! of a session, the tokens that repeat the previous call's prefix (same model, same tools,
//! instructions, then the longest run of leading messages or input items equal byte for byte)
//! are priced at the provider's
//! cached rate; the rest at the full rate, plus the provider's cache-write premium. A prefix
//! shorter than the provider's minimum is not cached. Costs are in units of one full-price
//! input token, so they compare across providers as "tokens you pay for". The prices are the
//! table of [`context_proxy_pricing`], the one the engine decides with.

use serde::Serialize;
use serde_json::Value;

use context_proxy_pricing::{CachePricing, ModelPrice, PRESETS};
use context_proxy_tokens::{head_tokens, shared_prefix, Counter};

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

/// Why the proxy made an upstream call for a client request: the proxy's own bill's kinds.
pub use context_proxy_pricing::CallKind;

/// The proxy's own tools, by the prefix of their names (a client tool of the same name makes
/// the proxy's take a longer one).
const PROXY_TOOLS: [&str; 2] = ["context_read", "context_search"];

/// Whether `body` is a Responses API request (`input` items, no `messages`).
fn is_responses(body: &Value) -> bool {
    body.get("messages").is_none() && body.get("input").is_some()
}

/// The conversation of `body`: chat's `messages`, or the Responses API's `input` items.
fn conversation(body: &Value) -> Option<&Vec<Value>> {
    let key = if is_responses(body) {
        "input"
    } else {
        "messages"
    };
    body.get(key).and_then(Value::as_array)
}

/// The name of the tool the call answered by `last` made, when `last` is a tool result.
fn answered_call<'a>(messages: &'a [Value], last: &Value) -> Option<&'a str> {
    if last["role"] == "tool" {
        let id = &last["tool_call_id"];
        return messages.iter().rev().find_map(|m| {
            m["tool_calls"]
                .as_array()?
                .iter()
                .find(|c| &c["id"] == id)
                .and_then(|c| c["function"]["name"].as_str())
        });
    }
    if last["type"] == "function_call_output" {
        let id = &last["call_id"];
        return messages
            .iter()
            .rev()
            .find(|m| m["type"] == "function_call" && &m["call_id"] == id)
            .and_then(|m| m["name"].as_str());
    }
    None
}

/// What kind of call `body` is, after `previous` (the session's call before it).
fn kind_of(body: &Value, previous: Option<&Value>) -> CallKind {
    let messages = conversation(body);
    if let Some(called) = messages.and_then(|m| answered_call(m, m.last()?)) {
        if PROXY_TOOLS.iter().any(|t| called.starts_with(t)) {
            return CallKind::Reload;
        }
    }
    // A retry resends the same request, cut smaller: its recent tail is the previous call's
    // (a new turn adds messages, so its tail differs even when a short reply repeats).
    let tail = |b: &Value| -> Option<Vec<Value>> {
        let m = conversation(b)?;
        (m.len() >= RETRY_TAIL).then(|| m[m.len() - RETRY_TAIL..].to_vec())
    };
    match (previous.and_then(tail), tail(body)) {
        (Some(a), Some(b)) if a == b => CallKind::Retry,
        _ => CallKind::Forwarded,
    }
}

/// Messages at the end of two calls that are the same when the second retries the first (the
/// recent window the proxy never cuts holds at least as many).
const RETRY_TAIL: usize = 4;

/// Whether `item` is the model's output (an assistant message, a call, reasoning), not a
/// result nor the user's.
fn is_model_output(item: &Value) -> bool {
    item["role"] == "assistant"
        || matches!(
            item["type"].as_str(),
            Some("function_call" | "custom_tool_call" | "reasoning")
        )
}

/// One upstream call, counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub kind: CallKind,
    /// Input tokens of the call.
    pub tokens: usize,
    /// Output tokens paid for that the client never saw: on a reload round, the model's
    /// output it resends (its call of the proxy's tools), as the proxy's bill has it.
    pub hidden_output: usize,
    /// Their cost in full-price input tokens of the call's model (its output price over its
    /// input price, [`ModelPrice::relative_cost`]): the same under every provider's caching.
    pub hidden_output_cost: f64,
    /// The upstream refused it as too long (the proxy retried it smaller next): not billed
    /// (`context_proxy_pricing::Call::refused`).
    pub refused: bool,
    /// Tokens of the prefix it shares with the previous call of its session.
    pub shared_prefix_tokens: usize,
    /// Its messages start with all of the previous call's messages (the first call: false).
    pub extends_previous: bool,
    /// Not the session's first call.
    pub has_previous: bool,
}

/// The tokens of `body`, by the rules of its API.
fn count(counter: &Counter, body: &Value) -> context_proxy_tokens::RequestCount {
    if is_responses(body) {
        counter.count_responses_request(body)
    } else {
        counter.count_request(body)
    }
}

/// Counts the upstream calls of one session, in order. The prefix a call shares with the
/// previous one is [`shared_prefix`]'s (the page's too): its parts are the head (model, tools
/// and instructions, by their bytes; [`head_tokens`]) and each message or input item, by its
/// bytes. A retry follows a call the upstream refused as too long: that call is marked
/// refused, and the retry's cached prefix is the one of the call before it (a refused request
/// is not cached).
pub fn count_session(counter: &Counter, bodies: &[Value]) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::with_capacity(bodies.len());
    // The last call sent, and the one before it.
    let mut previous: Option<(&Value, Vec<Part>)> = None;
    let mut before_previous: Option<(&Value, Vec<Part>)> = None;
    for body in bodies {
        let count = count(counter, body);
        let head = Part::Head(
            body.get("model"),
            body.get("tools"),
            body.get("instructions"),
        );
        let parts: Vec<Part> = std::iter::once(head)
            .chain(
                conversation(body)
                    .into_iter()
                    .flatten()
                    .map(|m| Part::Message(serde_json::to_vec(m).unwrap_or_default())),
            )
            .collect();
        let tokens: Vec<usize> = std::iter::once(head_tokens(&count, is_responses(body)))
            .chain(count.per_message.iter().copied())
            .collect();
        let kind = kind_of(body, previous.as_ref().map(|(p, _)| *p));
        if kind == CallKind::Retry {
            if let Some(refused) = calls.last_mut() {
                refused.refused = true;
            }
        }
        let base = if kind == CallKind::Retry {
            &before_previous
        } else {
            &previous
        };
        let shared = shared_prefix(base.as_ref().map(|(_, p)| p.as_slice()), &parts, &tokens);
        // A reload round resends the model's output of the round before it, which the
        // client never saw: from the previous call's end (its parts are its head, then its
        // messages), what is not a result.
        let hidden_output: usize = match (kind, &previous) {
            (CallKind::Reload, Some((_, prev_parts))) => conversation(body)
                .map(|items| {
                    items
                        .iter()
                        .zip(&count.per_message)
                        .skip(prev_parts.len().saturating_sub(1))
                        .filter(|(item, _)| is_model_output(item))
                        .map(|(_, &t)| t)
                        .sum()
                })
                .unwrap_or(0),
            _ => 0,
        };
        let model = body.get("model").and_then(Value::as_str).unwrap_or("");
        calls.push(Call {
            kind,
            tokens: count.total,
            hidden_output,
            hidden_output_cost: ModelPrice::relative_cost(model, model, 0, hidden_output),
            refused: false,
            shared_prefix_tokens: shared.tokens.min(count.total),
            extends_previous: shared.extends,
            has_previous: previous.is_some(),
        });
        before_previous = previous.take();
        previous = Some((body, parts));
    }
    calls
}

/// A part of a call's prefix: its head (model, tools, instructions, compared as JSON values),
/// or one message or input item (compared byte for byte).
#[derive(PartialEq)]
enum Part<'a> {
    Head(Option<&'a Value>, Option<&'a Value>, Option<&'a Value>),
    Message(Vec<u8>),
}

/// The summarizer's calls of a run: they answer no client request of their own, are billed at
/// the summarizer model's prices, input and output, and are never cached (each reads a new
/// span).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SummarizerCalls {
    pub calls: usize,
    pub input_tokens: usize,
    /// Completion tokens, as the proxy counted them (`/metrics`); `None` when unknown.
    pub output_tokens: Option<usize>,
    /// Their cost in full-price input tokens of the conversations' models: each call at the
    /// summarizer model's list prices ([`ModelPrice`]), output included; a model missing from
    /// the table is priced as the conversation's model, its output at 4× its input.
    pub cost: f64,
}

impl SummarizerCalls {
    /// The calls `bodies` (summarizer requests), with `output_tokens` in all, each in units of
    /// the full input price of the conversation it summarizes, as the forwarded calls are
    /// counted (a token of a conversation is a full-price input token of its own model): a
    /// call whose model is one of the conversations' `models` was made by the request's own
    /// model (the summarizer's default) and is priced in its units; any other model (one the
    /// config names) in units of the traffic's model, `models[0]`. (Priced in the first
    /// session's units alone, a summary of a gpt-4o conversation in a traffic led by a
    /// gpt-4o-mini one cost 16.7 times its tokens.)
    pub fn price(
        counter: &Counter,
        bodies: &[Value],
        output_tokens: Option<usize>,
        models: &[String],
    ) -> SummarizerCalls {
        let traffic = models.first().map_or("", String::as_str);
        let inputs: Vec<usize> = bodies.iter().map(|b| count(counter, b).total).collect();
        let input_tokens: usize = inputs.iter().sum();
        // Output shared out over the calls by their input (the proxy counts it in all).
        let output = output_tokens.unwrap_or(0) as f64;
        let cost = bodies
            .iter()
            .zip(&inputs)
            .map(|(body, &input)| {
                let model = body.get("model").and_then(Value::as_str).unwrap_or("");
                let share = if input_tokens > 0 {
                    output * input as f64 / input_tokens as f64
                } else {
                    0.0
                };
                let unit = if models.iter().any(|m| m == model) {
                    model
                } else {
                    traffic
                };
                ModelPrice::relative_cost(model, unit, input, share.round() as usize)
            })
            .sum();
        SummarizerCalls {
            calls: bodies.len(),
            input_tokens,
            output_tokens,
            cost,
        }
    }
}

/// Cost of `calls` under `pricing`, in full-price input tokens: each call's input under the
/// provider's caching and the hidden output it pays for; a refused call costs nothing.
pub fn effective_cost(calls: &[Call], pricing: &CachePricing) -> f64 {
    calls
        .iter()
        .filter(|c| !c.refused)
        .map(|c| pricing.call_cost(c.tokens, c.shared_prefix_tokens) + c.hidden_output_cost)
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

    /// Responses calls: the instructions and the leading items are the shared prefix; a call
    /// answering the proxy's own tool is a reload.
    #[test]
    fn responses_calls_share_instructions_and_items() {
        let c = counter();
        let user = json!({"role": "user", "content": "fix the build"});
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"});
        let out =
            json!({"type": "function_call_output", "call_id": "c1", "output": "ok ".repeat(50)});
        let body = |items: Vec<&Value>| json!({"model": "gpt-5", "instructions": "You are Codex.", "input": items});
        let first = body(vec![&user]);
        let second = body(vec![&user, &call, &out]);
        let calls = count_session(&c, &[first.clone(), second.clone()]);
        let one = c.count_responses_request(&first);
        let two = c.count_responses_request(&second);
        assert_eq!(calls[0].tokens, one.total);
        assert_eq!(calls[1].tokens, two.total);
        assert!(calls[1].extends_previous);
        let head = two.total - two.per_message.iter().sum::<usize>();
        assert_eq!(calls[1].shared_prefix_tokens, head + two.per_message[0]);
        let read = json!({"type": "function_call", "call_id": "r1", "name": "context_read", "arguments": "{}"});
        let answer = json!({"type": "function_call_output", "call_id": "r1", "output": "x"});
        let reload = body(vec![&user, &call, &out, &read, &answer]);
        assert_eq!(kind_of(&reload, Some(&second)), CallKind::Reload);
        let other = json!({"model": "gpt-5", "instructions": "Other.", "input": [user]});
        assert_eq!(
            count_session(&c, &[first, other])[1].shared_prefix_tokens,
            0
        );
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

    /// A summary is priced in units of its own conversation's model when the summarizer is
    /// that model (the default), as the forwarded calls are counted; a summary by a model no
    /// conversation uses, in units of the traffic's (the first session's) model.
    #[test]
    fn a_summary_is_priced_in_its_conversations_units() {
        let c = counter();
        let body = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "word ".repeat(1_000)}]});
        let models = ["gpt-4o-mini".to_string(), "gpt-4o".to_string()];
        let input = |b: &Value| count(&c, b).total;
        let (mini, big, nano) = (body("gpt-4o-mini"), body("gpt-4o"), body("gpt-4.1-nano"));
        // No output: each in its own units is its input tokens.
        let own = SummarizerCalls::price(&c, &[mini.clone(), big.clone()], Some(0), &models);
        assert!(
            (own.cost - (input(&mini) + input(&big)) as f64).abs() < 1e-6,
            "{own:?}"
        );
        // With output, at the model's own output/input ratio (4 for both).
        let out = SummarizerCalls::price(&c, std::slice::from_ref(&big), Some(100), &models);
        assert!(
            (out.cost - (input(&big) + 400) as f64).abs() < 1e-6,
            "{out:?}"
        );
        // Another model: in units of the traffic's, gpt-4o-mini ($0.10 against $0.15).
        let other = SummarizerCalls::price(&c, std::slice::from_ref(&nano), Some(0), &models);
        assert!(
            (other.cost - input(&nano) as f64 * 0.10 / 0.15).abs() < 1e-6,
            "{other:?}"
        );
    }
}
