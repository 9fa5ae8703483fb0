//! The parse phase's product: a chat-completions request as the client sent it (its raw bytes)
//! and, when the proxy manages its context, as JSON (keys in their original order).
//!
//! A request whose context is not managed (mode `off`) is only peeked at: its `model` is read
//! by a streaming pass that skips everything else (`serde::de::IgnoredAny`), so it never costs
//! a DOM, and its bytes go out as they came.

use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::http::error::{describe_json_error, ProxyError};

/// A parsed chat-completions request. `raw` is what the client sent; `body` the same as JSON,
/// keys in their original order — or `Value::Null` when the request was only peeked at
/// ([`ChatRequest::peek`]).
pub struct ChatRequest {
    pub raw: Bytes,
    pub body: Value,
    model: Option<String>,
}

impl ChatRequest {
    /// Parses `raw`: it must be a JSON object. Everything else is the upstream's to judge.
    ///
    /// JSON allows a string to hold a lone UTF-16 surrogate escape (`"\ud800"`), which no Rust
    /// string can: such a body is only peeked at ([`ChatRequest::peek`]) and forwarded as it
    /// came, unmanaged, rather than refused.
    pub fn parse(raw: Bytes) -> Result<ChatRequest, ProxyError> {
        let parsed = match super::dom::parse(&raw) {
            Some(body) => Ok(body),
            None => serde_json::from_slice(&raw),
        };
        let body: Value = match parsed {
            Ok(body) => body,
            Err(e) if is_lone_surrogate(&e) => {
                return ChatRequest::peek(raw.clone())
                    .ok_or_else(|| ProxyError::InvalidJson(describe_json_error(&raw, &e)));
            }
            Err(e) => return Err(ProxyError::InvalidJson(describe_json_error(&raw, &e))),
        };
        if !body.is_object() {
            return Err(ProxyError::InvalidRequest(format!(
                "the request body must be a JSON object with \"model\" and \"messages\", not {}",
                json_kind(&body)
            )));
        }
        let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
        Ok(ChatRequest { raw, body, model })
    }

    /// Reads only `model` from `raw`, validating the rest of the JSON without building it, or
    /// `None` when that is not enough to judge the body (not an object, malformed, a repeated
    /// `model`): then [`ChatRequest::parse`] gives the answer, its errors included.
    pub fn peek(raw: Bytes) -> Option<ChatRequest> {
        // A struct also deserializes from an array: only an object is peeked at.
        if raw.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        let peeked: Peeked = serde_json::from_slice(&raw).ok()?;
        Some(ChatRequest {
            raw,
            body: Value::Null,
            model: peeked.model,
        })
    }

    /// `raw` kept as it came, not read at all (a body the proxy cannot read, forwarded
    /// unmanaged); routed as a request without a model.
    pub fn opaque(raw: Bytes) -> ChatRequest {
        ChatRequest {
            raw,
            body: Value::Null,
            model: None,
        }
    }

    /// The `model` field, when it is a string.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

/// Whether `e` is serde_json refusing a lone surrogate escape, legal JSON that a Rust string
/// cannot hold (serde_json reports it with these two messages only).
fn is_lone_surrogate(e: &serde_json::Error) -> bool {
    let message = e.to_string();
    message.starts_with("lone leading surrogate in hex escape")
        || message.starts_with("unexpected end of hex escape")
}

/// The one field a peek reads; every other one is skipped by `IgnoredAny`.
#[derive(Deserialize)]
struct Peeked {
    #[serde(default, deserialize_with = "string_or_nothing")]
    model: Option<String>,
}

/// A string, or `None` for any other JSON value (skipped without being built), as
/// `Value::as_str` reads a parsed body.
fn string_or_nothing<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct StringOrNothing;
    impl<'de> Visitor<'de> for StringOrNothing {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    d.deserialize_any(StringOrNothing)
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

    #[test]
    fn peek_reads_the_model_as_parse_does() {
        let cases: &[&[u8]] = &[
            br#"{"z":1,"model":"m","a":{"y":2,"b":[3,{"model":"inner"}]}}"#,
            br#" {"messages":[],"model":"gpt-\u0034o","stream":true}"#,
            br#"{"model":5,"messages":[]}"#,
            br#"{"model":{"name":"m"},"messages":[]}"#,
            br#"{"model":["m"]}"#,
            br#"{"model":null}"#,
            br#"{}"#,
        ];
        for &raw in cases {
            let raw = Bytes::from_static(raw);
            let peeked = ChatRequest::peek(raw.clone()).expect("peeked");
            let parsed = ChatRequest::parse(raw.clone()).unwrap();
            assert_eq!(peeked.model(), parsed.model(), "{raw:?}");
            assert_eq!(peeked.raw, raw);
            assert!(peeked.body.is_null());
        }
    }

    #[test]
    fn lone_surrogates_are_legal_json_and_only_peeked_at() {
        for raw in [
            &br#"{"model":"m","messages":[{"role":"user","content":"a \ud800 b"}]}"#[..],
            br#"{"model":"m","messages":[{"role":"user","content":"\udc00"}]}"#,
            br#"{"model":"m","messages":[{"role":"user","content":"\ud800\u0041"}]}"#,
            br#"{"model":"m","messages":[{"role":"user","content":"\ud800"}]}"#,
        ] {
            let req = ChatRequest::parse(Bytes::from_static(raw)).expect("accepted");
            assert!(req.body.is_null(), "peeked, not parsed");
            assert_eq!(req.model(), Some("m"));
        }
        // Still malformed elsewhere: the parser's error.
        let err = ChatRequest::parse(Bytes::from_static(br#"{"model":"m","x":"\ud800",}"#))
            .err()
            .unwrap();
        assert_eq!(err.classify().0, http::StatusCode::BAD_REQUEST);
    }

    #[test]
    fn peek_leaves_what_it_cannot_judge_to_parse() {
        for raw in [
            &b"[\"m\"]"[..],
            b"\"m\"",
            b"{\"model\":\"m\",",
            b"{\"model\":\"m\"} x",
            b"{\"model\":\"a\",\"model\":\"b\"}",
            b"",
        ] {
            assert!(
                ChatRequest::peek(Bytes::from_static(raw)).is_none(),
                "{raw:?}"
            );
        }
    }
}
