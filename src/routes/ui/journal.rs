//! What the page's journal needs to know of each wire: the conversation a body holds, read
//! as one list. The line and its writer are the domain's ([`crate::sessions::journal`]),
//! re-exported here.

use serde_json::Value;

use crate::context::adapter::Wire;

pub use crate::sessions::journal::*;

/// The conversation of a request body as the page keeps it, as JSON text: the list of its
/// messages or items in the wire's own shape (chat's and Anthropic's `messages`, the Responses
/// API's `input`), with the instructions first as a `system` message when the wire keeps
/// them apart (Anthropic's `system`, the Responses API's `instructions`), so both sides of
/// the side-by-side view are one list.
fn messages_of(body: &[u8], wire: Wire) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let (list, instructions) = match wire {
        Wire::Chat => (value.get("messages")?, None),
        Wire::Responses => (value.get("input")?, value.get("instructions")),
        Wire::Messages => (value.get("messages")?, value.get("system")),
    };
    let mut items = match list {
        Value::Array(items) => items.clone(),
        // The Responses API's `input` may be one string: the user's message.
        Value::String(text) => vec![serde_json::json!({"role": "user", "content": text})],
        _ => return None,
    };
    if let Some(system) = instructions.filter(|v| !v.is_null()) {
        items.insert(0, serde_json::json!({"role": "system", "content": system}));
    }
    Some(Value::Array(items).to_string())
}

/// The reader of `wire`'s conversation, for [`Pending::conversation`].
pub fn conversation(wire: Wire) -> fn(&[u8]) -> Option<String> {
    match wire {
        Wire::Chat => |body| messages_of(body, Wire::Chat),
        Wire::Responses => |body| messages_of(body, Wire::Responses),
        Wire::Messages => |body| messages_of(body, Wire::Messages),
    }
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
        assert_eq!(messages_of(br#"{"input":"hi"}"#, Wire::Chat), None);
        assert_eq!(messages_of(b"not json", Wire::Messages), None);
    }
}
