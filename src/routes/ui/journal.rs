//! What the page's journal needs to know of each wire: the conversation a body holds, read
//! as one list. The line and its writer are the domain's ([`crate::sessions::journal`]),
//! re-exported here.

use crate::context::adapter::{scan, Wire};
use crate::tokens::{Counter, Parts};

pub use crate::sessions::journal::*;

/// The conversation of a request body as the page keeps it, as JSON text: the list of its
/// messages or items in the wire's own shape (chat's and Anthropic's `messages`, the Responses
/// API's `input`), with the instructions first as a `system` message when the wire keeps
/// them apart (Anthropic's `system`, the Responses API's `instructions`), so both sides of
/// the side-by-side view are one list. Cut out of the body's bytes, never parsed into values:
/// the messages are kept as the client wrote them (the page parses them when it shows them).
fn messages_of(body: &[u8], wire: Wire) -> Option<String> {
    let (list, instructions) = match wire {
        Wire::Chat => ("messages", None),
        Wire::Responses => ("input", Some("instructions")),
        Wire::Messages => ("messages", Some("system")),
    };
    let text = |span: std::ops::Range<usize>| std::str::from_utf8(body.get(span)?).ok();
    let list = text(scan::member(body, list.as_bytes())?)?;
    let instructions = instructions
        .and_then(|name| text(scan::member(body, name.as_bytes())?))
        .filter(|v| *v != "null");
    let mut out = String::with_capacity(list.len() + instructions.map_or(0, str::len) + 64);
    out.push('[');
    if let Some(system) = instructions {
        out.push_str(r#"{"role":"system","content":"#);
        out.push_str(system);
        out.push('}');
    }
    let items = match list.as_bytes().first()? {
        b'[' => list[1..list.len() - 1].trim(),
        // The Responses API's `input` may be one string: the user's message.
        b'"' => {
            if instructions.is_some() {
                out.push(',');
            }
            out.push_str(r#"{"role":"user","content":"#);
            out.push_str(list);
            out.push_str("}]");
            return Some(out);
        }
        _ => return None,
    };
    if instructions.is_some() && !items.is_empty() {
        out.push(',');
    }
    out.push_str(items);
    out.push(']');
    Some(out)
}

/// The reader of `wire`'s conversation, for [`Pending::conversation`].
pub fn conversation(wire: Wire) -> fn(&[u8]) -> Option<String> {
    match wire {
        Wire::Chat => |body| messages_of(body, Wire::Chat),
        Wire::Responses => |body| messages_of(body, Wire::Responses),
        Wire::Messages => |body| messages_of(body, Wire::Messages),
    }
}

/// The count of `wire`'s bodies as the upstream bills them, for [`Recount::sent`]: by the
/// route's own count (the one the plan made of the client's request), as prefix parts
/// ([`crate::tokens::Parts::of`]).
pub fn sent(wire: Wire) -> fn(&Counter, &[u8]) -> Option<Sent> {
    match wire {
        Wire::Chat => |counter, body| sent_of(counter, body, Wire::Chat),
        Wire::Responses => |counter, body| sent_of(counter, body, Wire::Responses),
        Wire::Messages => |counter, body| sent_of(counter, body, Wire::Messages),
    }
}

fn sent_of(counter: &Counter, body: &[u8], wire: Wire) -> Option<Sent> {
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    let count = wire.adapter().count(counter, &body);
    let model = body.get("model").and_then(serde_json::Value::as_str);
    let parts = Parts::of(&count, model.unwrap_or(""), wire == Wire::Responses);
    Some(Sent {
        parts,
        total: count.total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each wire's conversation is kept as one list, its instructions first.
    #[test]
    fn each_wire_keeps_one_list_with_its_instructions_first() {
        let chat =
            br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}"#;
        assert_eq!(
            messages_of(chat, Wire::Chat).unwrap(),
            r#"[{"role":"system","content":"s"},{"role":"user","content":"u"}]"#
        );
        let responses = br#"{"instructions":"be brief","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}"#;
        assert_eq!(
            messages_of(responses, Wire::Responses).unwrap(),
            r#"[{"role":"system","content":"be brief"},{"type":"function_call_output","call_id":"c","output":"x"}]"#
        );
        let one = br#"{"input":"hi"}"#;
        assert_eq!(
            messages_of(one, Wire::Responses).unwrap(),
            r#"[{"role":"user","content":"hi"}]"#
        );
        let messages = br#"{"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"u"}]}"#;
        assert_eq!(
            messages_of(messages, Wire::Messages).unwrap(),
            r#"[{"role":"system","content":[{"type":"text","text":"sys"}]},{"role":"user","content":"u"}]"#
        );
        // Cut out of the bytes: the client's spacing stays inside, every result is one list.
        let spaced = b"{ \"system\" : \"s\", \"messages\" : [ {\"role\": \"user\"} ]\n}";
        assert_eq!(
            messages_of(spaced, Wire::Messages).unwrap(),
            r#"[{"role":"system","content":"s"},{"role": "user"}]"#
        );
        let empty = br#"{"instructions":"x","input":[ ]}"#;
        assert_eq!(
            messages_of(empty, Wire::Responses).unwrap(),
            r#"[{"role":"system","content":"x"}]"#
        );
        let null = br#"{"system":null,"messages":[]}"#;
        assert_eq!(messages_of(null, Wire::Messages).unwrap(), "[]");
        let both = br#"{"instructions":"x","input":"hi"}"#;
        assert_eq!(
            messages_of(both, Wire::Responses).unwrap(),
            r#"[{"role":"system","content":"x"},{"role":"user","content":"hi"}]"#
        );
        assert_eq!(messages_of(br#"{"messages":3}"#, Wire::Chat), None);
        assert_eq!(messages_of(br#"{"input":"hi"}"#, Wire::Chat), None);
        assert_eq!(messages_of(b"not json", Wire::Messages), None);
    }
}
