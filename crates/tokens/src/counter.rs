//! The [`Counter`]: counts what the upstream bills for a chat-completions or Responses request,
//! per message (per input item),
//! remembering each message's count in a [`CountCache`] so that a conversation's next request
//! only tokenizes what is new. It holds no I/O and never fails: odd input is counted for what
//! is there (see `message.rs` and `tools.rs` for the rules).

use std::sync::Arc;

use serde_json::Value;

use super::cache::CountCache;
use super::encoding::Encoding;
use super::message::{self, REPLY_PRIMING};
use super::settings::CountSettings;
use super::tools;

/// What a request costs, split the way the context engine needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCount {
    /// Everything the upstream bills for the prompt: messages, reply priming, tools, schema.
    pub total: usize,
    /// One count per element of `messages`, each with its framing overhead.
    pub per_message: Vec<usize>,
    /// The [`crate::stable_hash`] of each element of `messages`, found in the same walk of
    /// the message as its count's cache key.
    pub message_hashes: Vec<u128>,
    /// The `tools` definitions (and legacy `functions`), 0 when there are none.
    pub tools: usize,
    /// A `response_format` JSON schema, 0 when there is none.
    pub response_format: usize,
}

/// Counts requests for one encoding. Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct Counter {
    encoding: Encoding,
    settings: CountSettings,
    cache: Arc<CountCache>,
}

/// Which rules a cached count was computed with.
#[derive(Clone, Copy)]
enum Domain {
    Message = 1,
    Tools = 2,
    ResponseFormat = 3,
}

impl Counter {
    pub fn new(encoding: Encoding, settings: CountSettings) -> Counter {
        let cache = Arc::new(CountCache::new(settings.cache_entries));
        Counter {
            encoding,
            settings,
            cache,
        }
    }

    /// The same counter for another encoding (a per-upstream override), sharing this one's
    /// settings and cache; cached counts are keyed by encoding, so they never mix.
    pub fn with_encoding(&self, encoding: Encoding) -> Counter {
        Counter {
            encoding,
            settings: self.settings.clone(),
            cache: self.cache.clone(),
        }
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    pub fn settings(&self) -> &CountSettings {
        &self.settings
    }

    /// Number of counts in the cache (shared by clones).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// Tokens in `text`, uncached.
    pub fn count_text(&self, text: &str) -> usize {
        self.encoding.count(text)
    }

    /// Tokens the upstream bills for one message, its framing included.
    pub fn count_message(&self, message: &Value) -> usize {
        self.cached(Domain::Message, message, |m| {
            message::message_tokens(m, self.encoding, &self.settings)
        })
    }

    /// Tokens the upstream bills for a whole request body. A body without a `messages` array
    /// counts no messages; the reply priming is always counted.
    pub fn count_request(&self, body: &Value) -> RequestCount {
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let (per_message, message_hashes): (Vec<usize>, Vec<u128>) = messages
            .iter()
            .map(|m| self.count_and_hash_message(m))
            .unzip();
        let tools = ["tools", "functions"]
            .into_iter()
            .filter_map(|key| body.get(key))
            .map(|list| {
                self.cached(Domain::Tools, list, |l| {
                    tools::tools_tokens(l, self.encoding)
                })
            })
            .fold(0, usize::saturating_add);
        let response_format = body.get("response_format").map_or(0, |format| {
            self.cached(Domain::ResponseFormat, format, |f| {
                tools::response_format_tokens(f, self.encoding)
            })
        });
        let total = per_message
            .iter()
            .fold(REPLY_PRIMING, |sum, n| sum.saturating_add(*n))
            .saturating_add(tools)
            .saturating_add(response_format);
        RequestCount {
            total,
            per_message,
            message_hashes,
            tools,
            response_format,
        }
    }

    /// Tokens the upstream bills for a whole Responses API request body (`POST /v1/responses`):
    /// each element of `input` counted like a message (its framing included; a string `input`
    /// is one user message), `instructions` like a system message, the flat `tools`, a
    /// `text.format` JSON schema, and the reply priming. `per_message` and `message_hashes`
    /// are the elements of an `input` array (empty for a string).
    pub fn count_responses_request(&self, body: &Value) -> RequestCount {
        let items = body
            .get("input")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let (per_message, message_hashes): (Vec<usize>, Vec<u128>) =
            items.iter().map(|m| self.count_and_hash_message(m)).unzip();
        let text_input = match body.get("input") {
            Some(Value::String(text)) => message::TOKENS_PER_MESSAGE + self.count_text(text),
            _ => 0,
        };
        let instructions = match body.get("instructions") {
            Some(Value::String(text)) => message::TOKENS_PER_MESSAGE + self.count_text(text),
            _ => 0,
        };
        let tools = body.get("tools").map_or(0, |list| {
            self.cached(Domain::Tools, list, |l| {
                tools::tools_tokens(l, self.encoding)
            })
        });
        let response_format = body
            .get("text")
            .and_then(|text| text.get("format"))
            .filter(|format| format.get("type").and_then(Value::as_str) == Some("json_schema"))
            .map_or(0, |format| {
                self.cached(Domain::ResponseFormat, format, |f| {
                    let schema = f.get("schema").unwrap_or(f);
                    self.encoding.count(&schema.to_string())
                })
            });
        let total = per_message
            .iter()
            .fold(REPLY_PRIMING, |sum, n| sum.saturating_add(*n))
            .saturating_add(text_input)
            .saturating_add(instructions)
            .saturating_add(tools)
            .saturating_add(response_format);
        RequestCount {
            total,
            per_message,
            message_hashes,
            tools,
            response_format,
        }
    }

    /// `(self.count_message(message), stable_hash(message))`, walking the message once when
    /// its count is cached.
    fn count_and_hash_message(&self, message: &Value) -> (usize, u128) {
        let count = |m: &Value| message::message_tokens(m, self.encoding, &self.settings);
        if !self.cache.enabled() {
            return (count(message), crate::stable_hash(message));
        }
        let (key, hash) = self
            .cache
            .key_and_stable_hash(&self.salt(Domain::Message), message);
        if let Some(n) = self.cache.get(key) {
            return (n, hash);
        }
        let n = count(message);
        self.cache.insert(key, n);
        (n, hash)
    }

    /// `count(value)`, remembered under the value's content hash.
    fn cached(&self, domain: Domain, value: &Value, count: impl FnOnce(&Value) -> usize) -> usize {
        if !self.cache.enabled() {
            return count(value);
        }
        let key = self.cache.key(&self.salt(domain), value);
        if let Some(n) = self.cache.get(key) {
            return n;
        }
        let n = count(value);
        self.cache.insert(key, n);
        n
    }

    /// Everything besides the value that its count depends on.
    fn salt(&self, domain: Domain) -> [u8; 34] {
        let mut salt = [0u8; 34];
        salt[0] = domain as u8;
        salt[1] = match self.encoding {
            Encoding::O200kBase => 1,
            Encoding::Cl100kBase => 2,
        };
        let s = &self.settings;
        let estimates = [
            s.image_tokens,
            s.image_low_detail_tokens,
            s.audio_tokens,
            s.file_tokens,
        ];
        for (i, n) in estimates.into_iter().enumerate() {
            salt[2 + 8 * i..10 + 8 * i].copy_from_slice(&(n as u64).to_le_bytes());
        }
        salt
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter")
            .field("encoding", &self.encoding)
            .field("settings", &self.settings)
            .field("cached_entries", &self.cache.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::message::{TOKENS_PER_MESSAGE, TOKENS_PER_TOOL_CALL};

    fn counter(encoding: Encoding) -> Counter {
        Counter::new(encoding, CountSettings::default())
    }

    /// The cookbook's example conversation; the API reported 124 prompt tokens on gpt-4o and
    /// gpt-4o-mini, 129 on gpt-4 and gpt-3.5-turbo.
    fn jargon() -> Value {
        json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
            {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
            {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
            {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
            {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
            {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."}
        ]})
    }

    /// The cookbook's tools example; the API reported 101 prompt tokens on gpt-4o and
    /// gpt-4o-mini, 105 on gpt-4 and gpt-3.5-turbo.
    fn weather() -> Value {
        json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
            {"role": "user", "content": "What's the weather like in San Francisco?"}
        ], "tools": [{"type": "function", "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "description": "The unit of temperature to return", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["location"]}
        }}]})
    }

    #[test]
    fn matches_api_reported_prompt_tokens() {
        assert_eq!(
            counter(Encoding::O200kBase).count_request(&jargon()).total,
            124
        );
        assert_eq!(
            counter(Encoding::Cl100kBase).count_request(&jargon()).total,
            129
        );
        assert_eq!(
            counter(Encoding::O200kBase).count_request(&weather()).total,
            101
        );
        assert_eq!(
            counter(Encoding::Cl100kBase)
                .count_request(&weather())
                .total,
            105
        );
    }

    /// A recorded gpt-4 exchange: an assistant tool call and its result, 35 prompt tokens.
    #[test]
    fn matches_api_reported_tool_call_exchange() {
        let body = json!({"model": "gpt-4", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_Id8ycVMsW8gdsf7kSXfgAcf1", "type": "function",
                "function": {"name": "get_current_weather", "arguments": "{\n  \"location\": \"Boston, MA\"\n}"}}]},
            {"role": "tool", "tool_call_id": "call_Id8ycVMsW8gdsf7kSXfgAcf1",
                "name": "get_current_weather", "content": "29 degree celcius"}
        ]});
        assert_eq!(counter(Encoding::Cl100kBase).count_request(&body).total, 35);
    }

    #[test]
    fn request_arithmetic() {
        let c = counter(Encoding::O200kBase);
        let body = weather();
        let r = c.count_request(&body);
        assert_eq!(r.per_message.len(), 2);
        assert_eq!(
            r.total,
            r.per_message.iter().sum::<usize>() + REPLY_PRIMING + r.tools + r.response_format
        );
        assert_eq!(r.per_message[1], c.count_message(&body["messages"][1]));
        assert_eq!(
            r.per_message[1],
            TOKENS_PER_MESSAGE
                + c.count_text("user")
                + c.count_text("What's the weather like in San Francisco?")
        );
        assert_eq!(r.tools, tools::tools_tokens(&body["tools"], c.encoding()));
        assert_eq!(r.response_format, 0);
    }

    #[test]
    fn message_hashes_are_the_stable_hashes_cached_or_not() {
        let body = weather();
        let expected: Vec<u128> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(crate::stable_hash)
            .collect();
        for entries in [0, 100] {
            let c = Counter::new(
                Encoding::O200kBase,
                CountSettings {
                    cache_entries: entries,
                    ..CountSettings::default()
                },
            );
            // Twice: a miss, then a hit.
            for _ in 0..2 {
                let r = c.count_request(&body);
                assert_eq!(r.message_hashes, expected, "cache_entries {entries}");
                assert_eq!(
                    r.per_message,
                    counter(Encoding::O200kBase)
                        .count_request(&body)
                        .per_message
                );
            }
        }
    }

    #[test]
    fn tool_call_counting() {
        let c = counter(Encoding::O200kBase);
        let args = r#"{"command":"ls -la","cwd":"/tmp"}"#;
        let m = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": args}}
        ]});
        assert_eq!(
            c.count_message(&m),
            TOKENS_PER_MESSAGE
                + c.count_text("assistant")
                + TOKENS_PER_TOOL_CALL
                + c.count_text("shell")
                + c.count_text(args)
        );
    }

    #[test]
    fn cache_hit_gives_the_same_number() {
        let c = counter(Encoding::O200kBase);
        let body = jargon();
        let cold = c.count_request(&body);
        let entries = c.cached_entries();
        assert_eq!(entries, 6);
        let warm = c.count_request(&body);
        assert_eq!(cold, warm);
        assert_eq!(c.cached_entries(), entries, "a warm request adds nothing");
        // An uncached counter agrees.
        let uncached = Counter::new(
            Encoding::O200kBase,
            CountSettings {
                cache_entries: 0,
                ..CountSettings::default()
            },
        );
        assert_eq!(uncached.count_request(&body), cold);
        assert_eq!(uncached.cached_entries(), 0);
        // The next turn only adds its new message.
        let mut next = body.clone();
        next["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "Understood."}));
        let r = c.count_request(&next);
        assert_eq!(r.per_message[..6], cold.per_message[..]);
        assert_eq!(c.cached_entries(), entries + 1);
    }

    #[test]
    fn cache_keys_include_encoding_and_estimates() {
        let o200k = counter(Encoding::O200kBase);
        let cl100k = o200k.with_encoding(Encoding::Cl100kBase);
        let m = json!({"role": "user", "content": "お誕生日おめでとう"});
        assert_eq!(o200k.count_message(&m), 3 + 1 + 8);
        assert_eq!(cl100k.count_message(&m), 3 + 1 + 9);
        assert_eq!(
            o200k.count_message(&m),
            3 + 1 + 8,
            "cl100k entry must not leak"
        );
        assert_eq!(o200k.cached_entries(), 2);

        let image = json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]});
        let default = counter(Encoding::O200kBase);
        let base = default.count_message(&image);
        assert_eq!(base, 3 + 1 + 765);
        let cheap = Counter::new(
            Encoding::O200kBase,
            CountSettings {
                image_tokens: 100,
                ..CountSettings::default()
            },
        );
        assert_eq!(cheap.count_message(&image), 3 + 1 + 100);
    }

    #[test]
    fn malformed_requests_do_not_panic() {
        let c = counter(Encoding::O200kBase);
        for body in [
            json!(null),
            json!("body"),
            json!([]),
            json!({}),
            json!({"messages": null}),
            json!({"messages": "hello"}),
            json!({"messages": {"role": "user"}}),
            json!({"messages": [], "tools": "none", "functions": 3, "response_format": []}),
            json!({"messages": [null, 1, "x", [], {}, {"role": null, "content": null}],
                   "tools": [null, 1, {"type": "function", "function": null}],
                   "response_format": {"type": "json_schema", "json_schema": null}}),
        ] {
            let r = c.count_request(&body);
            assert_eq!(
                r.total,
                r.per_message.iter().sum::<usize>() + REPLY_PRIMING + r.tools + r.response_format,
                "{body}"
            );
        }
        assert_eq!(c.count_request(&json!({})).total, REPLY_PRIMING);
        let r = c.count_request(&json!({"messages": [null, {}]}));
        assert_eq!(r.per_message, vec![3, 3]);
    }

    #[test]
    fn response_format_is_counted() {
        let c = counter(Encoding::O200kBase);
        let mut body = jargon();
        let before = c.count_request(&body).total;
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "object", "properties": {"plain": {"type": "string"}}}}});
        let r = c.count_request(&body);
        assert!(r.response_format > 0);
        assert_eq!(r.total, before + r.response_format);
    }

    #[test]
    fn settings_from_config() {
        let s: CountSettings = toml::from_str("image_tokens = 1105\ncache_entries = 0").unwrap();
        assert_eq!(s.image_tokens, 1105);
        assert_eq!(s.cache_entries, 0);
        assert_eq!(s.audio_tokens, CountSettings::default().audio_tokens);
        assert!(toml::from_str::<CountSettings>("image_tokenz = 1").is_err());
    }
}
