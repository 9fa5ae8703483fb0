//! The token usage an upstream reports, summed over the upstream calls of one request and
//! written back into the answer.

use serde_json::{Map, Number, Value};

/// One `usage` object: the counts the proxy reads, and the object as the upstream sent it so
/// that writing it back keeps the fields the proxy does not name (`completion_tokens_details`,
/// vendor extras such as a cost).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// `prompt_tokens_details.cached_tokens` (Anthropic's `cache_read_input_tokens`), when the
    /// upstream reports it.
    pub cached_tokens: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens` (the prompt tokens written to the cache, billed
    /// at a premium), when the upstream reports it; `None` for OpenAI's shapes.
    pub cache_creation_tokens: Option<u64>,
    /// The upstream's object (after [`add`](Self::add), the field-wise sum).
    pub raw: Map<String, Value>,
}

impl Usage {
    /// Reads a `usage` object, chat's (`prompt_tokens`, …), the Responses API's
    /// (`input_tokens`, `output_tokens`, `input_tokens_details`) or Anthropic's (its
    /// `input_tokens` excludes `cache_creation_input_tokens` and `cache_read_input_tokens`: the
    /// prompt is their sum); `None` unless it is an object with a whole prompt count. A missing
    /// `total_tokens` is prompt + completion.
    pub fn from_json(value: &Value) -> Option<Usage> {
        let raw = value.as_object()?;
        let keys = Keys::of(raw);
        let number = |key: &str| raw.get(key).and_then(Value::as_u64);
        let mut prompt_tokens = raw.get(keys.prompt)?.as_u64()?;
        let completion_tokens = number(keys.completion).unwrap_or(0);
        let (cached_tokens, cache_creation_tokens) = if keys.anthropic {
            let read = number(ANTHROPIC_READ).unwrap_or(0);
            let written = number(ANTHROPIC_WRITE).unwrap_or(0);
            prompt_tokens += read + written;
            (Some(read), Some(written))
        } else {
            let cached = raw
                .get(keys.details)
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64);
            (cached, None)
        };
        let total_tokens = number("total_tokens").unwrap_or(prompt_tokens + completion_tokens);
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens,
            cached_tokens,
            cache_creation_tokens,
            raw: raw.clone(),
        })
    }

    /// This usage with the counts a later `usage` object of the same answer reports (an
    /// Anthropic stream's `message_delta`, cumulative, often with `output_tokens` only).
    pub fn updated(&self, later: &Map<String, Value>) -> Usage {
        let mut raw = self.raw.clone();
        for (key, value) in later {
            if !value.is_null() {
                raw.insert(key.clone(), value.clone());
            }
        }
        if !later.contains_key("total_tokens") {
            raw.remove("total_tokens");
        }
        Usage::from_json(&Value::Object(raw)).unwrap_or_else(|| self.clone())
    }

    /// Adds another call's usage: the counts are summed, and so is every number of the raw
    /// objects, field by field (token details, timings, costs); any other field takes
    /// `other`'s value, and fields only one side has are kept.
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.cached_tokens = sum(self.cached_tokens, other.cached_tokens);
        self.cache_creation_tokens = sum(self.cache_creation_tokens, other.cache_creation_tokens);
        merge_sum(&mut self.raw, &other.raw);
    }

    /// The `usage` object to send: the raw object (its field order and unknown fields kept)
    /// with the counts set from this value.
    pub fn to_json(&self) -> Value {
        let mut out = self.raw.clone();
        let keys = Keys::of(&self.raw);
        if keys.anthropic {
            let read = self.cached_tokens.unwrap_or(0);
            let written = self.cache_creation_tokens.unwrap_or(0);
            let input = self.prompt_tokens.saturating_sub(read + written);
            out.insert(keys.prompt.into(), input.into());
            out.insert(keys.completion.into(), self.completion_tokens.into());
            out.insert(ANTHROPIC_READ.into(), read.into());
            out.insert(ANTHROPIC_WRITE.into(), written.into());
            return Value::Object(out);
        }
        out.insert(keys.prompt.into(), self.prompt_tokens.into());
        out.insert(keys.completion.into(), self.completion_tokens.into());
        out.insert("total_tokens".into(), self.total_tokens.into());
        if let Some(cached) = self.cached_tokens {
            let details = out
                .entry(keys.details)
                .or_insert_with(|| Value::Object(Map::new()));
            if !details.is_object() {
                *details = Value::Object(Map::new());
            }
            if let Value::Object(details) = details {
                details.insert("cached_tokens".into(), cached.into());
            }
        }
        Value::Object(out)
    }

    /// Sets `body.usage` (a completion or a stream chunk) to this usage.
    pub fn write_into(&self, body: &mut Value) {
        if let Value::Object(body) = body {
            body.insert("usage".into(), self.to_json());
        }
    }
}

/// Anthropic's cache reads and writes, outside its `input_tokens`.
const ANTHROPIC_READ: &str = "cache_read_input_tokens";
const ANTHROPIC_WRITE: &str = "cache_creation_input_tokens";

/// The names of a usage object's counts: chat's, or the Responses API's when the object
/// has `input_tokens` and no `prompt_tokens`, or Anthropic's when it also has a cache field.
struct Keys {
    prompt: &'static str,
    completion: &'static str,
    details: &'static str,
    anthropic: bool,
}

impl Keys {
    fn of(raw: &Map<String, Value>) -> Keys {
        if raw.contains_key("input_tokens") && !raw.contains_key("prompt_tokens") {
            Keys {
                prompt: "input_tokens",
                completion: "output_tokens",
                details: "input_tokens_details",
                anthropic: raw.contains_key(ANTHROPIC_READ) || raw.contains_key(ANTHROPIC_WRITE),
            }
        } else {
            Keys {
                prompt: "prompt_tokens",
                completion: "completion_tokens",
                details: "prompt_tokens_details",
                anthropic: false,
            }
        }
    }
}

/// `into` += `from`, field by field: numbers add, objects merge, anything else is replaced.
pub(crate) fn merge_sum(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(Value::Number(a)), Value::Number(b)) => {
                if let Some(sum) = add_numbers(a, b) {
                    *a = sum;
                }
            }
            (Some(Value::Object(a)), Value::Object(b)) => merge_sum(a, b),
            (Some(slot), _) => *slot = value.clone(),
            (None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn add_numbers(a: &Number, b: &Number) -> Option<Number> {
    if let (Some(a), Some(b)) = (a.as_u64(), b.as_u64()) {
        return Some(a.saturating_add(b).into());
    }
    if let (Some(a), Some(b)) = (a.as_i64(), b.as_i64()) {
        return Some(a.saturating_add(b).into());
    }
    Number::from_f64(a.as_f64()? + b.as_f64()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_counts_and_cached_tokens() {
        let u = Usage::from_json(&json!({
            "prompt_tokens": 812, "completion_tokens": 41, "total_tokens": 853,
            "prompt_tokens_details": {"cached_tokens": 768}
        }))
        .unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (812, 41, 853)
        );
        assert_eq!(u.cached_tokens, Some(768));
        let u = Usage::from_json(&json!({"prompt_tokens": 5, "completion_tokens": 2})).unwrap();
        assert_eq!((u.total_tokens, u.cached_tokens), (7, None));
        assert_eq!(Usage::from_json(&Value::Null), None);
        assert_eq!(Usage::from_json(&json!({"completion_tokens": 2})), None);
        assert_eq!(Usage::from_json(&json!({"prompt_tokens": -1})), None);
    }

    #[test]
    fn reads_and_writes_the_responses_shape() {
        let raw = json!({"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1024},
            "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 128},
            "total_tokens": 1500});
        let mut u = Usage::from_json(&raw).unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            (1200, 300, Some(1024))
        );
        u.add(&Usage::from_json(&raw).unwrap());
        let summed = u.to_json();
        assert_eq!(summed["input_tokens"], 2400);
        assert_eq!(summed["output_tokens_details"]["reasoning_tokens"], 256);
        assert_eq!(summed["input_tokens_details"]["cached_tokens"], 2048);
        assert!(summed.get("prompt_tokens").is_none());
    }

    #[test]
    fn reads_sums_and_writes_anthropics_shape() {
        let raw = json!({"input_tokens": 25, "cache_creation_input_tokens": 1000,
            "cache_read_input_tokens": 120000, "output_tokens": 7, "service_tier": "standard"});
        let mut u = Usage::from_json(&raw).unwrap();
        assert_eq!(u.prompt_tokens, 121_025);
        assert_eq!(
            (u.cached_tokens, u.cache_creation_tokens),
            (Some(120_000), Some(1_000))
        );
        assert_eq!(u.total_tokens, 121_032);
        // A stream's message_delta reports the output so far, and sometimes the rest again.
        let later = json!({"output_tokens": 42});
        let delta = u.updated(later.as_object().unwrap());
        assert_eq!(
            (delta.prompt_tokens, delta.completion_tokens),
            (121_025, 42)
        );
        u.add(&delta);
        let summed = u.to_json();
        assert_eq!(
            summed,
            json!({"input_tokens": 50, "cache_creation_input_tokens": 2000,
                "cache_read_input_tokens": 240000, "output_tokens": 49,
                "service_tier": "standard"})
        );
        // Without a cache field it is the Responses API's shape.
        let responses = Usage::from_json(&json!({"input_tokens": 5, "output_tokens": 1})).unwrap();
        assert_eq!(
            (responses.prompt_tokens, responses.cache_creation_tokens),
            (5, None)
        );
    }

    #[test]
    fn add_sums_counts_details_and_extras() {
        let mut total = Usage::from_json(&json!({
            "prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
            "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 4},
            "cost": 0.25, "provider": "a"
        }))
        .unwrap();
        let second = Usage::from_json(&json!({
            "prompt_tokens": 150, "completion_tokens": 20, "total_tokens": 170,
            "completion_tokens_details": {"reasoning_tokens": 6, "audio_tokens": 1},
            "cost": 0.5, "provider": "b", "queue_time": 1
        }))
        .unwrap();
        total.add(&second);
        assert_eq!(
            (
                total.prompt_tokens,
                total.completion_tokens,
                total.total_tokens
            ),
            (250, 30, 280)
        );
        assert_eq!(total.cached_tokens, Some(64));
        assert_eq!(
            total.to_json(),
            json!({
                "prompt_tokens": 250, "completion_tokens": 30, "total_tokens": 280,
                "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 10, "audio_tokens": 1},
                "cost": 0.75, "provider": "b", "queue_time": 1
            })
        );
        let keys: Vec<_> = total
            .to_json()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            keys[..4],
            [
                "prompt_tokens",
                "completion_tokens",
                "total_tokens",
                "prompt_tokens_details"
            ]
        );
    }

    #[test]
    fn writes_a_built_usage_and_into_a_body() {
        let mut u = Usage::default();
        u.add(&Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            total_tokens: 5,
            cached_tokens: Some(1),
            cache_creation_tokens: None,
            raw: Map::new(),
        });
        let mut body = json!({"id": "x", "usage": null, "choices": []});
        u.write_into(&mut body);
        assert_eq!(
            body,
            json!({"id": "x", "choices": [], "usage": {
                "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 1}
            }})
        );
        let keys: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["id", "usage", "choices"], "usage stays where it was");
    }
}
