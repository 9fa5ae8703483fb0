//! Units: the pieces a conversation may be cut into. An assistant message with tool calls and
//! the tool results answering it form one unit; every other message is a unit alone. A unit
//! is never split nor reordered. A conversation whose tool messages do not line up with their
//! calls is malformed: the engine then leaves it exactly as it came.

use std::collections::HashMap;
use std::ops::Range;

use serde_json::Value;

use crate::tokens::{field, str_field};

/// Why a conversation cannot be cut into units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// Not an array of objects with a string `role`.
    NotMessages(usize),
    /// A `tool` message that answers no call of the assistant message just before it.
    OrphanToolResult(usize),
    /// A tool call with no result before the next non-tool message.
    MissingToolResult(usize),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Malformed::NotMessages(i) => {
                write!(f, "messages[{i}] is not a message object with a role")
            }
            Malformed::OrphanToolResult(i) => {
                write!(f, "messages[{i}] is a tool result without its call")
            }
            Malformed::MissingToolResult(i) => {
                write!(f, "messages[{i}] has a tool call without a result")
            }
        }
    }
}

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

/// The `tool_call_id` of a tool result (`""` when it has none).
fn tool_call_id(message: &Value) -> &str {
    str_field(message, "tool_call_id").unwrap_or("")
}

/// Cuts `messages` into units (contiguous ranges covering every message in order).
pub fn segment(messages: &[Value]) -> Result<Vec<Range<usize>>, Malformed> {
    let mut units = Vec::with_capacity(messages.len());
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if !m.is_object() || str_field(m, "role").is_none() {
            return Err(Malformed::NotMessages(i));
        }
        // Empty (no allocation) for a message without calls.
        let ids = call_ids(m);
        match role(m) {
            "tool" => return Err(Malformed::OrphanToolResult(i)),
            "assistant" if !ids.is_empty() => {
                let start = i;
                i += 1;
                // Results in the order of their calls, the usual case, need no map.
                let mut in_order = 0;
                while in_order < ids.len()
                    && i < messages.len()
                    && role(&messages[i]) == "tool"
                    && tool_call_id(&messages[i]) == ids[in_order]
                {
                    in_order += 1;
                    i += 1;
                }
                // Calls not yet answered, by id (a hash map: linear in the number of calls).
                let mut pending: HashMap<&str, usize> = HashMap::new();
                for &id in &ids[in_order..] {
                    *pending.entry(id).or_default() += 1;
                }
                while i < messages.len() && role(&messages[i]) == "tool" {
                    let id = tool_call_id(&messages[i]);
                    match pending.get_mut(id) {
                        Some(1) => {
                            pending.remove(id);
                        }
                        Some(n) => *n -= 1,
                        None => return Err(Malformed::OrphanToolResult(i)),
                    }
                    i += 1;
                }
                if !pending.is_empty() {
                    return Err(Malformed::MissingToolResult(start));
                }
                units.push(start..i);
            }
            _ => {
                units.push(i..i + 1);
                i += 1;
            }
        }
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(ids: &[&str]) -> Value {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}))
            .collect();
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }

    fn result(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "r"})
    }

    #[test]
    fn results_in_any_order_and_repeated_ids_are_matched() {
        let in_order = [
            call(&["a", "b", "c"]),
            result("a"),
            result("b"),
            result("c"),
        ];
        assert_eq!(segment(&in_order).unwrap(), vec![0..4]);
        let shuffled = [
            call(&["a", "b", "c"]),
            result("a"),
            result("c"),
            result("b"),
        ];
        assert_eq!(segment(&shuffled).unwrap(), vec![0..4]);
        let repeated = [
            call(&["a", "a", "b"]),
            result("b"),
            result("a"),
            result("a"),
        ];
        assert_eq!(segment(&repeated).unwrap(), vec![0..4]);
        let one_too_many = [call(&["a", "b"]), result("a"), result("b"), result("a")];
        assert_eq!(segment(&one_too_many), Err(Malformed::OrphanToolResult(3)));
        let one_missing = [
            call(&["a", "b"]),
            result("a"),
            json!({"role": "user", "content": "x"}),
        ];
        assert_eq!(segment(&one_missing), Err(Malformed::MissingToolResult(0)));
    }

    #[test]
    fn tool_chains_are_one_unit() {
        let msgs = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "u"}),
            call(&["a", "b"]),
            result("b"),
            result("a"),
            json!({"role": "assistant", "content": "done"}),
        ];
        assert_eq!(segment(&msgs).unwrap(), vec![0..1, 1..2, 2..5, 5..6]);
    }

    #[test]
    fn malformed_conversations_are_reported() {
        let orphan = vec![json!({"role": "user", "content": "u"}), result("x")];
        assert_eq!(segment(&orphan), Err(Malformed::OrphanToolResult(1)));
        let missing = vec![
            call(&["a", "b"]),
            result("a"),
            json!({"role": "user", "content": "u"}),
        ];
        assert_eq!(segment(&missing), Err(Malformed::MissingToolResult(0)));
        let wrong = vec![call(&["a"]), result("b")];
        assert_eq!(segment(&wrong), Err(Malformed::OrphanToolResult(1)));
        assert_eq!(segment(&[json!("text")]), Err(Malformed::NotMessages(0)));
        assert_eq!(
            segment(&[json!({"content": "x"})]),
            Err(Malformed::NotMessages(0))
        );
    }
}
