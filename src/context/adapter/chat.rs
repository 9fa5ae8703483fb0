//! The chat-completions adapter: `messages` is the conversation, one message per item.
//! `system` and `developer` messages are the instructions, `user` and `assistant` messages the
//! turns, an assistant message with `tool_calls` a tool call item answered by the `tool`
//! messages whose `tool_call_id` names its calls; a message of any other role is opaque and
//! free (a unit alone, never rewritten). The text the engine may shorten is `content`: a
//! string, or an array made only of text parts.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::Value;

use super::{scan, Adapter, Spans};
use crate::context::model::{Binding, Kind};
use crate::tokens::{field, str_field};

/// Chat completions (`POST /v1/chat/completions`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Chat;

/// The role of a message, or `""` when it has none.
pub fn role(message: &Value) -> &str {
    str_field(message, "role").unwrap_or("")
}

/// Whether a message is part of the fixed instructions (never moved out).
pub fn is_instruction(message: &Value) -> bool {
    matches!(role(message), "system" | "developer")
}

/// The ids of the tool calls of an assistant message, in order.
pub fn call_ids(message: &Value) -> Vec<&str> {
    field(message, "tool_calls")
        .and_then(Value::as_array)
        .map(|calls| calls.iter().filter_map(|c| str_field(c, "id")).collect())
        .unwrap_or_default()
}

/// The text of a message's content: a string, or an array made only of text parts.
pub fn content_text(message: &Value) -> Option<Cow<'_, str>> {
    match field(message, "content")? {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Array(parts) if !parts.is_empty() => {
            let texts: Option<Vec<&str>> = parts
                .iter()
                .map(|p| match str_field(p, "type") {
                    Some("text") => str_field(p, "text"),
                    _ => None,
                })
                .collect();
            Some(Cow::Owned(texts?.join("\n")))
        }
        _ => None,
    }
}

/// A chat message as the summarizer reads it: its role, the call it answers, its text, its
/// calls (the default of [`Adapter::readable`], which Messages shares).
pub fn readable(message: &Value) -> super::Readable<'_> {
    let calls = match field(message, "tool_calls") {
        Some(Value::Array(calls)) => calls
            .iter()
            .map(|c| {
                let text = |pointer: &str| c.pointer(pointer).and_then(Value::as_str);
                format!(
                    "{} {}({})",
                    text("/id").unwrap_or(""),
                    text("/function/name").unwrap_or(""),
                    text("/function/arguments").unwrap_or("")
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    super::Readable {
        who: Cow::Borrowed(role(message)),
        answers: str_field(message, "tool_call_id"),
        text: content_text(message),
        calls,
    }
}

impl Adapter for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn payloads<'b>(&self, body: &'b Value) -> Option<Cow<'b, [Value]>> {
        body.get("messages")
            .and_then(Value::as_array)
            .map(|m| Cow::Borrowed(m.as_slice()))
    }

    fn kind<'v>(&self, message: &'v Value) -> Kind<'v> {
        if !message.is_object() {
            return Kind::Invalid;
        }
        let Some(role) = str_field(message, "role") else {
            return Kind::Invalid;
        };
        match role {
            "system" | "developer" => Kind::Instructions,
            "user" => Kind::User,
            "assistant" => {
                // Empty (no allocation) for a message without calls.
                let ids = call_ids(message);
                if ids.is_empty() {
                    Kind::Assistant
                } else {
                    Kind::ToolCalls(ids)
                }
            }
            "tool" => Kind::ToolResult(str_field(message, "tool_call_id").unwrap_or("")),
            _ => Kind::Opaque(Binding::Free),
        }
    }

    fn text<'v>(&self, message: &'v Value) -> Option<Cow<'v, str>> {
        content_text(message)
    }

    fn has_text(&self, message: &Value) -> bool {
        match field(message, "content") {
            Some(Value::String(_)) => true,
            Some(Value::Array(parts)) => {
                !parts.is_empty()
                    && parts.iter().all(|p| {
                        str_field(p, "type") == Some("text") && str_field(p, "text").is_some()
                    })
            }
            _ => false,
        }
    }

    fn whole_text<'v>(&self, message: &'v Value) -> Option<&'v str> {
        str_field(message, "content")
    }

    fn with_text(&self, message: &Value, text: String) -> Value {
        let mut m = message.clone();
        if let Some(content) = m.get_mut("content") {
            *content = Value::String(text);
        }
        m
    }

    fn marker(&self, text: String) -> Value {
        serde_json::json!({"role": "user", "content": text})
    }

    fn spans(&self, raw: &[u8]) -> Option<Spans> {
        let list = scan::member(raw, b"messages")?;
        let items = scan::elements(raw, list.clone())?;
        Some(Spans { list, items })
    }

    fn write(&self, body: &mut Value, messages: Vec<Value>) {
        if let Some(slot) = body.get_mut("messages") {
            *slot = Value::Array(messages);
        }
    }
}

/// Cuts chat `messages` into units (see [`crate::context::model::units`]).
pub fn segment(messages: &[Value]) -> Result<Vec<Range<usize>>, crate::context::model::Malformed> {
    let kinds: Vec<Kind<'_>> = messages.iter().map(|m| Chat.kind(m)).collect();
    let refs: Vec<&Kind<'_>> = kinds.iter().collect();
    crate::context::model::units_of(&refs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::adapter::{splice, Piece};
    use serde_json::json;

    const BODY: &str = r#"{ "model" : "gpt-4o",
  "messages": [
    {"role":"system","content":"Be brief."} ,
    {"role": "user", "content": [{"type": "text", "text": "caf\u00e9 1.0e3"}]},
    {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"cat","arguments":"{\"p\":\"]\"}"}}]},
    {"role":"tool","tool_call_id":"c2","content":"two"},
    {"role":"tool","tool_call_id":"c1","content":"one"},
    {"role":"function","name":"legacy","content":"x"},
    {"role":"assistant","content":"done"}
  ],
  "tools": [], "stream": false }"#;

    fn body() -> Value {
        serde_json::from_str(BODY).unwrap()
    }

    #[test]
    fn items_in() {
        let body = body();
        let payloads = Chat.payloads(&body).unwrap();
        let items = Chat.items(&payloads, &[5, 6, 7, 8, 9, 10, 11], &[], None);
        let kinds: Vec<Kind<'_>> = items.iter().map(|i| i.kind.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::Instructions,
                Kind::User,
                Kind::ToolCalls(vec!["c1", "c2"]),
                Kind::ToolResult("c2"),
                Kind::ToolResult("c1"),
                Kind::Opaque(Binding::Free),
                Kind::Assistant,
            ]
        );
        assert_eq!(items[3].tokens, 8);
        assert_eq!(
            segment(&payloads).unwrap(),
            vec![0..1, 1..2, 2..5, 5..6, 6..7]
        );
        assert_eq!(Chat.text(&payloads[1]).unwrap(), "café 1.0e3");
        assert_eq!(Chat.whole_text(&payloads[1]), None);
        assert_eq!(Chat.whole_text(&payloads[3]), Some("two"));
        assert!(!Chat.has_text(&payloads[2]));
        assert_eq!(Chat.kind(&json!("text")), Kind::Invalid);
        assert_eq!(Chat.kind(&json!({"content": "x"})), Kind::Invalid);
        assert!(Chat.payloads(&json!({"input": []})).is_none());
    }

    #[test]
    fn items_out() {
        let mut body = body();
        let payloads = Chat.payloads(&body).unwrap().into_owned();
        let shorter = Chat.with_text(&payloads[3], "2".into());
        assert_eq!(
            shorter,
            json!({"role":"tool","tool_call_id":"c2","content":"2"})
        );
        let marker = Chat.marker("moved".into());
        Chat.write(
            &mut body,
            vec![payloads[0].clone(), marker.clone(), shorter],
        );
        assert_eq!(
            body["messages"],
            json!([payloads[0], {"role": "user", "content": "moved"}, {"role":"tool","tool_call_id":"c2","content":"2"}])
        );
        // Every other member stays where it was.
        let keys: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["model", "messages", "tools", "stream"]);
    }

    #[test]
    fn an_untouched_request_round_trips_byte_for_byte() {
        let raw = BODY.as_bytes();
        let body = body();
        let spans = Chat.spans(raw).unwrap();
        let payloads = Chat.payloads(&body).unwrap();
        assert_eq!(spans.items.len(), payloads.len());
        // Each span parses to its item.
        for (span, item) in spans.items.iter().zip(payloads.iter()) {
            let parsed: Value = serde_json::from_slice(&raw[span.clone()]).unwrap();
            assert_eq!(&parsed, item);
        }
        let kept: Vec<Piece<'_>> = (0..payloads.len()).map(Piece::Kept).collect();
        assert_eq!(splice(raw, &spans, &kept), raw);
        // A changed item is the only bytes that change.
        let new = Chat.with_text(&payloads[4], "1".into());
        let mut pieces = kept.clone();
        pieces[4] = Piece::New(&new);
        let out = splice(raw, &spans, &pieces);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(r#"{"role":"tool","tool_call_id":"c1","content":"1"}"#));
        assert!(
            text.contains(r#"caf\u00e9 1.0e3"#) && text.starts_with(r#"{ "model" : "gpt-4o","#)
        );
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reparsed["messages"][4], new);
    }

    #[test]
    fn spans_of_odd_bodies() {
        assert_eq!(Chat.spans(b"{}"), None);
        assert_eq!(Chat.spans(b"[]"), None);
        assert_eq!(Chat.spans(br#"{"messages": [1, 2"#), None);
        let empty = Chat.spans(br#"{"messages":[ ]}"#).unwrap();
        assert!(empty.items.is_empty());
        // A repeated member: the parser keeps the last one, so does the scan.
        let raw = br#"{"messages":[1],"x":{"messages":[9]},"messages":[2,3]}"#;
        let spans = Chat.spans(raw).unwrap();
        assert_eq!(&raw[spans.items[0].clone()], b"2");
        assert_eq!(spans.items.len(), 2);
        let escaped = br#"{"m\u0065ssages":[{"a":"\"]"}]}"#;
        let spans = Chat.spans(escaped).unwrap();
        assert_eq!(&escaped[spans.items[0].clone()], br#"{"a":"\"]"}"#);
    }
}
