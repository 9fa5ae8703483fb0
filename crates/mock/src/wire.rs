//! The OpenAI wire format the mock writes, shaped like the real API key for key: the
//! `chat.completion` JSON object, the `chat.completion.chunk` SSE events, the error bodies and the
//! model list. Pure functions: an [`Answer`] in, JSON or event bytes out.

use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::script::Completion;
use super::usage::completion_tokens;
use context_proxy_tokens::Encoding;

/// Longest tool-call arguments fragment in a stream, in characters.
const MAX_ARGUMENTS_FRAGMENT: usize = 8;

/// The models `GET /v1/models` lists.
const MODELS: [&str; 6] = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1",
    "gpt-4.1-mini",
    "gpt-5",
    "gpt-3.5-turbo",
];

/// Everything needed to write one answer, as JSON or as a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub content: Option<String>,
    pub tool_calls: Vec<AnsweredCall>,
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    /// Of `prompt_tokens`, those the prompt cache read (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Stream the content in exactly this many chunks instead of word by word.
    pub content_chunks: Option<usize>,
}

/// A tool call as sent: its id assigned and its arguments as text.
#[derive(Debug, Clone, PartialEq)]
pub struct AnsweredCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Where an answer comes from, besides the scripted completion.
#[derive(Debug, Clone, Copy)]
pub struct AnswerMeta<'a> {
    /// Name of the mock, so that two mocks give different ids.
    pub mock_name: &'a str,
    /// Number of this answer among the mock's answers; ids derive from it.
    pub serial: u64,
    /// The request's model, echoed.
    pub model: &'a str,
    /// Unix seconds.
    pub created: u64,
    pub prompt_tokens: usize,
    /// Of `prompt_tokens`, those the prompt cache read.
    pub cached_tokens: usize,
}

impl Answer {
    /// The answer to send for `completion`.
    pub fn new(completion: &Completion, meta: AnswerMeta<'_>) -> Answer {
        let serial = meta.serial.to_string();
        let tool_calls: Vec<AnsweredCall> = completion
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| AnsweredCall {
                id: call.id.clone().unwrap_or_else(|| {
                    let index = index.to_string();
                    derived_id("call_", 24, &[meta.mock_name, &serial, &index])
                }),
                name: call.name.clone(),
                arguments: call.arguments_text(),
            })
            .collect();
        let completion_tokens = completion_tokens(
            completion.content.as_deref(),
            tool_calls
                .iter()
                .map(|call| (call.name.as_str(), call.arguments.as_str())),
            Encoding::for_model(meta.model),
        );
        Answer {
            id: derived_id("chatcmpl-", 29, &[meta.mock_name, &serial]),
            created: meta.created,
            model: meta.model.to_string(),
            system_fingerprint: fingerprint(meta.model),
            content: completion.content.clone(),
            finish_reason: if tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            },
            tool_calls,
            prompt_tokens: meta.prompt_tokens,
            cached_tokens: meta.cached_tokens.min(meta.prompt_tokens),
            completion_tokens,
            content_chunks: completion.content_chunks,
        }
    }

    /// The `chat.completion` object.
    pub fn to_json(&self) -> Value {
        let mut message = serde_json::Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(self.content));
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    })
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        message.insert("refusal".into(), Value::Null);
        message.insert("annotations".into(), json!([]));
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": self.finish_reason,
            }],
            "usage": self.usage(),
            "service_tier": "default",
            "system_fingerprint": self.system_fingerprint,
        })
    }

    /// The SSE events of the streamed answer, `[DONE]` included, each `data: …\n\n`.
    ///
    /// Order: the role chunk, the content chunks, for each tool call a chunk with its id and
    /// name then its arguments fragments, the finish chunk (`delta: {}`), the usage chunk when
    /// `include_usage` (every other chunk then carries `"usage": null`), `[DONE]`.
    pub fn to_events(&self, include_usage: bool) -> Vec<Bytes> {
        let mut deltas = vec![json!({"role": "assistant", "content": "", "refusal": null})];
        if let Some(content) = &self.content {
            let pieces = match self.content_chunks {
                Some(n) => split_even(content, n),
                None => split_words(content),
            };
            deltas.extend(pieces.into_iter().map(|piece| json!({ "content": piece })));
        }
        for (index, call) in self.tool_calls.iter().enumerate() {
            deltas.push(json!({"tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}));
            deltas.extend(split_arguments(&call.arguments).into_iter().map(|fragment| {
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
            }));
        }
        let mut chunks: Vec<Value> = deltas
            .into_iter()
            .map(|delta| self.chunk(choice(delta, Value::Null), include_usage, Value::Null))
            .collect();
        chunks.push(self.chunk(
            choice(json!({}), json!(self.finish_reason)),
            include_usage,
            Value::Null,
        ));
        if include_usage {
            chunks.push(self.chunk(json!([]), true, self.usage()));
        }
        let mut events: Vec<Bytes> = chunks.iter().map(sse_event).collect();
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        events
    }

    fn chunk(&self, choices: Value, include_usage: bool, usage: Value) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        });
        if include_usage {
            if let Value::Object(map) = &mut chunk {
                map.insert("usage".into(), usage);
            }
        }
        chunk
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        })
    }
}

fn choice(delta: Value, finish_reason: Value) -> Value {
    json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
}

fn sse_event(data: &Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Splits text into words, each piece after the first starting with the whitespace before it
/// (as model tokens do): `"Hi  there\n"` → `["Hi", "  there", "\n"]`.
pub fn split_words(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut previous_was_space = true;
    for (at, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space && !previous_was_space && at > start {
            pieces.push(&text[start..at]);
            start = at;
        }
        previous_was_space = space;
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

/// Splits text into exactly `n` (at least 1) pieces of near-equal character counts; pieces are
/// empty when the text has fewer than `n` characters.
pub fn split_even(text: &str, n: usize) -> Vec<&str> {
    let n = n.max(1);
    let chars = text.chars().count();
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(at, _)| at)
        .chain(std::iter::once(text.len()))
        .collect();
    let mut pieces = Vec::with_capacity(n);
    let mut from = 0;
    for i in 0..n {
        let len = chars / n + usize::from(i < chars % n);
        pieces.push(&text[boundaries[from]..boundaries[from + len]]);
        from += len;
    }
    pieces
}

/// Splits arguments text into fragments of at most [`MAX_ARGUMENTS_FRAGMENT`] characters, at
/// least two when it has two characters or more.
pub fn split_arguments(arguments: &str) -> Vec<&str> {
    let chars = arguments.chars().count();
    if chars == 0 {
        return Vec::new();
    }
    let size = chars.div_ceil(2).min(MAX_ARGUMENTS_FRAGMENT);
    split_even(arguments, chars.div_ceil(size))
}

/// `prefix` followed by `len` base-62 characters derived from `seed`.
pub(crate) fn derived_id(prefix: &str, len: usize, seed: &[&str]) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut hasher = Sha256::new();
    for part in seed {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    id.extend(
        digest
            .iter()
            .cycle()
            .take(len)
            .map(|byte| char::from(ALPHABET[usize::from(*byte) % ALPHABET.len()])),
    );
    id
}

/// `fp_` and 10 hex digits derived from the model, like OpenAI's backend fingerprints.
fn fingerprint(model: &str) -> String {
    let digest = Sha256::digest(model.as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("fp_{hex}")
}

/// An error body in OpenAI's shape: all four keys present.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// OpenAI's exact answer to a request over the model's context window.
pub fn context_length_exceeded(limit: usize, tokens: usize) -> Value {
    error_body(
        &format!(
            "This model's maximum context length is {limit} tokens. However, your messages \
             resulted in {tokens} tokens. Please reduce the length of the messages."
        ),
        "invalid_request_error",
        Some("messages"),
        Some("context_length_exceeded"),
    )
}

/// The `GET /v1/models` list.
pub fn model_list() -> Value {
    let data: Vec<Value> = MODELS
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 1_715_367_049, "owned_by": "system"}))
        .collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::ToolCall;

    fn meta(serial: u64) -> AnswerMeta<'static> {
        AnswerMeta {
            mock_name: "m",
            serial,
            model: "gpt-4o",
            created: 1_700_000_000,
            prompt_tokens: 10,
            cached_tokens: 0,
        }
    }

    fn calls() -> Completion {
        Completion {
            content: None,
            tool_calls: vec![
                ToolCall {
                    id: None,
                    name: "f".into(),
                    arguments: json!({"path": "/tmp/a"}),
                },
                ToolCall {
                    id: Some("call_given".into()),
                    name: "g".into(),
                    arguments: json!({}),
                },
            ],
            content_chunks: None,
            thinking: None,
        }
    }

    #[test]
    fn splitting_keeps_every_character() {
        assert_eq!(split_words("Hi  there\n"), ["Hi", "  there", "\n"]);
        assert_eq!(split_words(" lead"), [" lead"]);
        assert!(split_words("").is_empty());
        assert_eq!(split_even("héllo", 2), ["hél", "lo"]);
        assert_eq!(split_even("ab", 4), ["a", "b", "", ""]);
        assert_eq!(split_arguments("{}"), ["{", "}"]);
        let args = r#"{"path":"/tmp/some/long/file.txt","lines":[1,2,3]}"#;
        let fragments = split_arguments(args);
        assert!(fragments.len() > 2);
        assert!(fragments.iter().all(|f| f.chars().count() <= 8));
        assert_eq!(fragments.concat(), args);
    }

    #[test]
    fn ids_are_deterministic_and_distinct_per_answer() {
        let a = Answer::new(&calls(), meta(1));
        assert_eq!(a, Answer::new(&calls(), meta(1)));
        let b = Answer::new(&calls(), meta(2));
        assert_ne!(a.id, b.id);
        assert_ne!(a.tool_calls[0].id, b.tool_calls[0].id);
        assert!(a.id.starts_with("chatcmpl-") && a.id.len() == 9 + 29);
        assert!(a.tool_calls[0].id.starts_with("call_") && a.tool_calls[0].id.len() == 5 + 24);
        assert_eq!(a.tool_calls[1].id, "call_given");
        assert!(a.system_fingerprint.starts_with("fp_") && a.system_fingerprint.len() == 13);
        assert_eq!(a.finish_reason, "tool_calls");
    }

    #[test]
    fn json_keys_come_in_openai_order() {
        let answer = Answer::new(&calls(), meta(1));
        let value = answer.to_json();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "id",
                "object",
                "created",
                "model",
                "choices",
                "usage",
                "service_tier",
                "system_fingerprint"
            ]
        );
        let message = value["choices"][0]["message"].as_object().unwrap();
        let keys: Vec<&str> = message.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["role", "content", "tool_calls", "refusal", "annotations"]
        );
    }

    #[test]
    fn events_without_usage_have_no_usage_key() {
        let completion = Completion {
            content: Some("one two".into()),
            tool_calls: Vec::new(),
            content_chunks: None,
            thinking: None,
        };
        let events = Answer::new(&completion, meta(1)).to_events(false);
        // role, "one", " two", finish, [DONE]
        assert_eq!(events.len(), 5);
        for event in &events[..4] {
            let data: Value = serde_json::from_slice(&event[6..event.len() - 2]).unwrap();
            assert!(data.get("usage").is_none(), "{data}");
        }
        assert_eq!(&events[4][..], b"data: [DONE]\n\n");
    }

    #[test]
    fn context_error_is_openais_wording() {
        assert_eq!(
            context_length_exceeded(8192, 8227).to_string(),
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#
        );
    }
}
