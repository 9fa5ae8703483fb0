//! Units: the pieces a chat conversation may be cut into. An assistant message with tool calls
//! and the tool results answering it form one unit; every other message is a unit alone. A unit
//! is never split nor reordered. The rule is the conversation model's
//! ([`model::units`](super::model::units)), read through the chat adapter; these are the chat
//! names of it, for the callers that hold chat messages.

pub use super::adapter::chat::{call_ids, is_instruction, role, segment};
pub use super::model::Malformed;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

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
