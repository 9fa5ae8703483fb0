//! The parse phase's product: a chat-completions request as the client sent it (its raw bytes)
//! and as JSON (keys in their original order).

use bytes::Bytes;
use serde_json::Value;

use crate::error::{describe_json_error, ProxyError};

/// A parsed chat-completions request. `raw` is what the client sent; `body` the same as JSON,
/// keys in their original order.
pub struct ChatRequest {
    pub raw: Bytes,
    pub body: Value,
}

impl ChatRequest {
    /// Parses `raw`: it must be a JSON object. Everything else is the upstream's to judge.
    pub fn parse(raw: Bytes) -> Result<ChatRequest, ProxyError> {
        let body: Value = serde_json::from_slice(&raw)
            .map_err(|e| ProxyError::InvalidJson(describe_json_error(&raw, &e)))?;
        if !body.is_object() {
            return Err(ProxyError::InvalidRequest(format!(
                "the request body must be a JSON object with \"model\" and \"messages\", not {}",
                json_kind(&body)
            )));
        }
        Ok(ChatRequest { raw, body })
    }

    /// The `model` field, when it is a string.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_raw_bytes_and_key_order() {
        let raw = Bytes::from_static(br#"{"z":1,"model":"m","a":{"y":2,"b":3}}"#);
        let req = ChatRequest::parse(raw.clone()).unwrap();
        assert_eq!(req.raw, raw);
        assert_eq!(
            serde_json::to_string(&req.body).unwrap(),
            std::str::from_utf8(&raw).unwrap()
        );
        assert_eq!(req.model(), Some("m"));
    }

    #[test]
    fn non_object_body_is_a_clear_400() {
        let err = ChatRequest::parse(Bytes::from_static(b"[1,2]"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("not an array"), "{err}");
        assert_eq!(err.classify().0, http::StatusCode::BAD_REQUEST);
    }
}
