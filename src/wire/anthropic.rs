//! Anthropic's Messages wire format, what the proxy writes of it itself: the error shape
//! `{"type":"error","error":{"type","message"},"request_id"}` with the error type each status
//! has (`docs/messages-wire.md`), as a JSON body or as a stream's final `error` event; and the
//! usage of an answer (input, cache writes, cache reads, output). Pure.

use bytes::Bytes;
use serde_json::{json, Value};

/// The Anthropic error type of an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error body in Anthropic's shape.
pub fn error_body(status: u16, message: &str, request_id: &str) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(status), "message": message},
        "request_id": request_id,
    })
}

/// The final event of a stream that cannot go on.
pub fn error_event(status: u16, message: &str, request_id: &str) -> Bytes {
    let body = error_body(status, message, request_id);
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}

/// What an overflow the proxy reports itself says, in the wording clients match.
pub fn prompt_too_long(tokens: usize, limit: usize) -> String {
    format!("prompt is too long: {tokens} tokens > {limit} maximum")
}

/// The usage of a Messages answer: `input_tokens` excludes cache reads and writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    /// Reads a `usage` object (missing fields are 0).
    pub fn of(usage: &Value) -> Usage {
        let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        Usage {
            input_tokens: n("input_tokens"),
            cache_creation_input_tokens: n("cache_creation_input_tokens"),
            cache_read_input_tokens: n("cache_read_input_tokens"),
            output_tokens: n("output_tokens"),
        }
    }

    /// The prompt's size: input, cache writes and cache reads together.
    pub fn prompt(&self) -> u64 {
        self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens
    }

    /// `self` with the fields `later` reports replaced (a stream's `message_delta` usage is
    /// cumulative and may carry only `output_tokens`).
    pub fn updated(self, later: &Value) -> Usage {
        let n = |k: &str, old: u64| later.get(k).and_then(Value::as_u64).unwrap_or(old);
        Usage {
            input_tokens: n("input_tokens", self.input_tokens),
            cache_creation_input_tokens: n(
                "cache_creation_input_tokens",
                self.cache_creation_input_tokens,
            ),
            cache_read_input_tokens: n("cache_read_input_tokens", self.cache_read_input_tokens),
            output_tokens: n("output_tokens", self.output_tokens),
        }
    }
}

/// The usage of a Messages answer, JSON or SSE, read from its bytes: the `usage` of a message
/// object, or `message_start`'s updated by each `message_delta`. `None` when there is none.
pub fn usage_of(body: &[u8]) -> Option<Usage> {
    if let Ok(message) = serde_json::from_slice::<Value>(body) {
        return message.get("usage").map(Usage::of);
    }
    let text = std::str::from_utf8(body).ok()?;
    let mut usage: Option<Usage> = None;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                usage = event
                    .get("message")
                    .and_then(|m| m.get("usage"))
                    .map(Usage::of);
            }
            Some("message_delta") => {
                if let (Some(u), Some(later)) = (usage, event.get("usage")) {
                    usage = Some(u.updated(later));
                }
            }
            _ => {}
        }
    }
    usage
}

/// A Messages stream assembled into the message it carried (for the recorder): the
/// `message_start` message with each block built from its start and deltas (`text_delta`,
/// `thinking_delta`, `signature_delta`, `input_json_delta` parsed when the block stops), and
/// `message_delta`'s stop reason and usage. `None` when the body holds no `message_start`.
pub fn assemble(body: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(body);
    let mut message: Option<Value> = None;
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => message = event.get("message").cloned(),
            Some("content_block_start") => {
                if blocks.len() <= index {
                    blocks.resize(index + 1, Value::Null);
                    partial.resize(index + 1, String::new());
                }
                blocks[index] = event.get("content_block").cloned().unwrap_or(Value::Null);
            }
            Some("content_block_delta") => {
                let (Some(block), Some(delta)) = (blocks.get_mut(index), event.get("delta")) else {
                    continue;
                };
                let piece = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                let mut append = |key: &str, more: &str| {
                    if let Some(Value::String(s)) = block.get_mut(key) {
                        s.push_str(more);
                    } else if let Value::Object(map) = block {
                        map.insert(key.into(), more.into());
                    }
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append("text", piece("text")),
                    Some("thinking_delta") => append("thinking", piece("thinking")),
                    Some("signature_delta") => append("signature", piece("signature")),
                    Some("input_json_delta") => partial[index].push_str(piece("partial_json")),
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                if let (Some(block), Some(json)) = (blocks.get_mut(index), partial.get(index)) {
                    if !json.is_empty() {
                        block["input"] = serde_json::from_str(json).unwrap_or(Value::Null);
                    }
                }
            }
            Some("message_delta") => {
                let Some(m) = message.as_mut() else { continue };
                if let Some(Value::Object(delta)) = event.get("delta") {
                    for (k, v) in delta {
                        m[k.as_str()] = v.clone();
                    }
                }
                if let (Some(Value::Object(later)), Some(Value::Object(usage))) =
                    (event.get("usage"), m.get_mut("usage"))
                {
                    for (k, v) in later {
                        if !v.is_null() {
                            usage.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut message = message?;
    message["content"] = Value::Array(blocks);
    Some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_apis_shape_and_types() {
        let v = error_body(429, "slow down", "req_1");
        assert_eq!(
            v.to_string(),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"},"request_id":"req_1"}"#
        );
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (500, "api_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(error_type(status), kind);
        }
        let e = error_event(529, "Overloaded", "r");
        assert!(e.starts_with(b"event: error\ndata: {\"type\":\"error\""));
        assert_eq!(
            prompt_too_long(103_078, 102_398),
            "prompt is too long: 103078 tokens > 102398 maximum"
        );
    }

    #[test]
    fn usage_is_read_from_json_and_streams() {
        let json = br#"{"type":"message","usage":{"input_tokens":5,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":7}}"#;
        let u = usage_of(json).unwrap();
        assert_eq!(u.prompt(), 115);
        assert_eq!(u.output_tokens, 7);
        let sse = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n";
        let u = usage_of(sse).unwrap();
        assert_eq!((u.prompt(), u.output_tokens), (105, 42));
        assert_eq!(usage_of(b"nothing"), None);
    }

    #[test]
    fn a_stream_is_assembled_into_its_message() {
        let sse = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"Eq1\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Read\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"p\\\":\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"1}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let m = assemble(sse.as_bytes()).unwrap();
        assert_eq!(
            m["content"],
            json!([{"type":"thinking","thinking":"hm","signature":"Eq1"},
                {"type":"tool_use","id":"toolu_1","name":"Read","input":{"p":1}}])
        );
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["usage"], json!({"input_tokens":5,"output_tokens":9}));
        assert_eq!(assemble(b"data: {}\n\n"), None);
    }
}
