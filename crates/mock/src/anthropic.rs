//! The Anthropic Messages wire format the mock writes, shaped like the real API key for key
//! (`docs/messages-wire.md`): the `message` JSON object, its SSE events (`message_start`,
//! `content_block_start`/`_delta`/`_stop`, `ping`, `message_delta`, `message_stop`), the error
//! body and the thinking signatures. Pure functions: a [`MessageAnswer`] in, JSON or event bytes
//! out.

use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::wire::{split_arguments, split_even, split_words};

/// What the model thinks when the request turns thinking on and the script gives no text.
pub const DEFAULT_THINKING: &str = "The user asked something; I answer it directly.";

/// One content block of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerBlock {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
}

/// Usage as the API reports it: `input_tokens` excludes what the cache read or wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    /// Of the cache writes, those with a one-hour time to live.
    pub cache_creation_1h: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

impl MessageUsage {
    fn to_json(self, output_tokens: usize) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_input_tokens - self.cache_creation_1h,
                "ephemeral_1h_input_tokens": self.cache_creation_1h,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        })
    }
}

/// Everything needed to write one answer, as JSON or as a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageAnswer {
    pub id: String,
    pub model: String,
    pub content: Vec<AnswerBlock>,
    pub usage: MessageUsage,
    /// Stream the text in exactly this many deltas instead of word by word.
    pub content_chunks: Option<usize>,
}

impl MessageAnswer {
    /// `tool_use` when the answer calls a tool, else `end_turn`.
    pub fn stop_reason(&self) -> &'static str {
        if self
            .content
            .iter()
            .any(|b| matches!(b, AnswerBlock::ToolUse { .. }))
        {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    /// The `message` object of a JSON answer.
    pub fn to_json(&self) -> Value {
        let content: Vec<Value> = self.content.iter().map(block_json).collect();
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason(),
            "stop_sequence": null,
            "usage": self.usage.to_json(self.usage.output_tokens),
        })
    }

    /// The SSE events of the streamed answer, each `event: …\ndata: …\n\n`: `message_start`,
    /// per block its start, deltas and stop (a `ping` after the first block's start),
    /// `message_delta` with the stop reason and the output tokens, `message_stop`.
    pub fn to_events(&self) -> Vec<Bytes> {
        let mut events = Vec::new();
        let mut start = self.to_json();
        if let Value::Object(message) = &mut start {
            message.insert("content".into(), json!([]));
            message.insert("stop_reason".into(), Value::Null);
            message.insert("usage".into(), self.usage.to_json(1));
        }
        events.push(event(
            "message_start",
            &json!({"type": "message_start", "message": start}),
        ));
        for (index, block) in self.content.iter().enumerate() {
            let opening = match block {
                AnswerBlock::Thinking { .. } => json!({"type": "thinking", "thinking": ""}),
                AnswerBlock::Text(_) => json!({"type": "text", "text": ""}),
                AnswerBlock::ToolUse { id, name, .. } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}})
                }
            };
            events.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": opening}),
            ));
            if index == 0 {
                events.push(event("ping", &json!({"type": "ping"})));
            }
            let delta = |delta: Value| {
                event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": delta}),
                )
            };
            match block {
                AnswerBlock::Thinking {
                    thinking,
                    signature,
                } => {
                    for piece in split_words(thinking) {
                        events.push(delta(json!({"type": "thinking_delta", "thinking": piece})));
                    }
                    events.push(delta(
                        json!({"type": "signature_delta", "signature": signature}),
                    ));
                }
                AnswerBlock::Text(text) => {
                    let pieces = match self.content_chunks {
                        Some(n) => split_even(text, n),
                        None => split_words(text),
                    };
                    for piece in pieces {
                        events.push(delta(json!({"type": "text_delta", "text": piece})));
                    }
                }
                AnswerBlock::ToolUse { input, .. } => {
                    // The first fragment is empty, as the API sends it.
                    events.push(delta(
                        json!({"type": "input_json_delta", "partial_json": ""}),
                    ));
                    for piece in split_arguments(input) {
                        events.push(delta(
                            json!({"type": "input_json_delta", "partial_json": piece}),
                        ));
                    }
                }
            }
            events.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        events.push(event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                "usage": {"output_tokens": self.usage.output_tokens},
            }),
        ));
        events.push(event("message_stop", &json!({"type": "message_stop"})));
        events
    }
}

fn block_json(block: &AnswerBlock) -> Value {
    match block {
        AnswerBlock::Thinking {
            thinking,
            signature,
        } => json!({"type": "thinking", "thinking": thinking, "signature": signature}),
        AnswerBlock::Text(text) => json!({"type": "text", "text": text}),
        AnswerBlock::ToolUse { id, name, input } => {
            // `input` is an object on the wire; arguments that are not one send `{}`.
            let input = serde_json::from_str::<Value>(input)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
    }
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// An error body in Anthropic's shape.
pub fn error_body(kind: &str, message: &str, request_id: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id})
}

/// The API's answer to a prompt over the model's window.
pub fn prompt_too_long(tokens: usize, limit: usize) -> String {
    format!("prompt is too long: {tokens} tokens > {limit} maximum")
}

/// The signature of a thinking block: one half binds its text (a changed text is detected on
/// every model), the other the conversation before it (`prefix`, checked on the models with
/// preserved thinking).
pub fn signature(prefix: &[u8; 32], thinking: &str) -> String {
    format!(
        "EqMock{}{}",
        hex16(&Sha256::digest([b"text\0", thinking.as_bytes()].concat())),
        hex16(&Sha256::digest(
            [&prefix[..], b"\0", thinking.as_bytes()].concat()
        )),
    )
}

/// The two halves of a signature the mock issued: (text, prefix); `None` for any other.
pub fn signature_halves(signature: &str) -> Option<(&str, &str)> {
    let rest = signature.strip_prefix("EqMock")?;
    (rest.len() == 64 && rest.is_ascii()).then(|| rest.split_at(32))
}

fn hex16(digest: &[u8]) -> String {
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> MessageAnswer {
        MessageAnswer {
            id: "msg_1".into(),
            model: "claude-sonnet-4-5".into(),
            content: vec![
                AnswerBlock::Thinking {
                    thinking: "let me see".into(),
                    signature: signature(&[0; 32], "let me see"),
                },
                AnswerBlock::Text("I will look".into()),
                AnswerBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "Read".into(),
                    input: r#"{"file_path":"/a"}"#.into(),
                },
            ],
            usage: MessageUsage {
                input_tokens: 10,
                cache_creation_input_tokens: 5,
                cache_creation_1h: 0,
                cache_read_input_tokens: 100,
                output_tokens: 20,
            },
            content_chunks: None,
        }
    }

    #[test]
    fn json_keys_come_in_the_apis_order() {
        let v = answer().to_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "id",
                "type",
                "role",
                "model",
                "content",
                "stop_reason",
                "stop_sequence",
                "usage"
            ]
        );
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(v["content"][2]["input"]["file_path"], "/a");
        assert_eq!(v["usage"]["cache_read_input_tokens"], 100);
        assert_eq!(v["usage"]["cache_creation"]["ephemeral_5m_input_tokens"], 5);
    }

    #[test]
    fn events_rebuild_the_message() {
        let a = answer();
        let events = a.to_events();
        let mut names = Vec::new();
        let (mut thinking, mut signature_seen, mut text, mut json_text) =
            (String::new(), String::new(), String::new(), String::new());
        for e in &events {
            let e = std::str::from_utf8(e).unwrap();
            let (head, data) = e.split_once('\n').unwrap();
            let name = head.strip_prefix("event: ").unwrap();
            let data: Value =
                serde_json::from_str(data.strip_prefix("data: ").unwrap().trim_end()).unwrap();
            assert_eq!(data["type"], name);
            names.push(name.to_string());
            let d = &data["delta"];
            match d["type"].as_str() {
                Some("thinking_delta") => thinking.push_str(d["thinking"].as_str().unwrap()),
                Some("signature_delta") => {
                    signature_seen.push_str(d["signature"].as_str().unwrap())
                }
                Some("text_delta") => text.push_str(d["text"].as_str().unwrap()),
                Some("input_json_delta") => json_text.push_str(d["partial_json"].as_str().unwrap()),
                _ => {}
            }
        }
        assert_eq!(names.first().unwrap(), "message_start");
        assert_eq!(names[2], "ping");
        assert_eq!(names.last().unwrap(), "message_stop");
        assert_eq!(names[names.len() - 2], "message_delta");
        assert_eq!(thinking, "let me see");
        assert_eq!(text, "I will look");
        assert_eq!(json_text, r#"{"file_path":"/a"}"#);
        let AnswerBlock::Thinking { signature, .. } = &a.content[0] else {
            unreachable!()
        };
        assert_eq!(&signature_seen, signature);
    }

    #[test]
    fn signatures_bind_text_and_prefix() {
        let s = signature(&[1; 32], "x");
        let (text, prefix) = signature_halves(&s).unwrap();
        let other = signature(&[2; 32], "x");
        let (text2, prefix2) = signature_halves(&other).unwrap();
        assert_eq!(text, text2);
        assert_ne!(prefix, prefix2);
        assert!(signature_halves("EqReal").is_none());
    }
}
