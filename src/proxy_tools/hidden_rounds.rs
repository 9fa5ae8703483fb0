//! Hidden rounds on Anthropic Messages. When the proxy answers the model's calls of its own
//! tools, the client gets one assistant message made of its own blocks of every upstream
//! answer of the loop: a message that never existed upstream. Sent back as it is, its thinking
//! blocks would sit after the wrong prefix (a 400 on models that bind thinking to the
//! conversation) and the prompt cache would miss from there on. So the proxy keeps the
//! upstream transcript that message stands for — the first assistant message with its thinking
//! and signatures, the user message of the proxy's `tool_result`s, … , the last assistant
//! message — and puts it back in the client's message's place on every later request. When the
//! last answer also called the client's tools (a mixed round), the proxy's results of it open
//! the client's next user message.
//!
//! A record is found as chat's hidden exchanges are ([`super::hidden`]): by the digest of the
//! client's transcript before the message, here followed by the message itself as the client
//! got it (whose serializer may reorder keys or drop `null`s: the digest reads what a block
//! says, [`Transcript`]).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::hidden::{key_of, Keyed, Transcript};

/// The session state key of the list.
pub const STATE_KEY: &str = "hidden_rounds";

/// The upstream transcript one client assistant message stands for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rounds {
    /// [`key`] of the client's message.
    pub key: String,
    /// The upstream's messages, in order: assistant, user (the proxy's results), assistant, …,
    /// assistant.
    pub messages: Vec<Value>,
    /// When the last assistant message also called the proxy's tools (a mixed round): the
    /// proxy's `tool_result` blocks, which open the client's next user message.
    pub results: Vec<Value>,
}

impl Keyed for Rounds {
    fn key(&self) -> &str {
        &self.key
    }
}

/// The key of the assistant message `shown` (as the client got it) after the client's
/// transcript `before`.
pub fn key(before: Transcript, shown: &Value) -> String {
    key_of(before.then(shown).digest(), std::iter::empty())
}

/// The assistant message the client got for `upstream` (the loop's assistant messages, in
/// order): every block of each but the proxy's calls.
pub fn shown(upstream: &[Value], is_proxy: &dyn Fn(&str) -> bool) -> Value {
    let content: Vec<Value> = upstream
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flat_map(|blocks| crate::wire::messages::visible(blocks, is_proxy))
        .collect();
    json!({"role": "assistant", "content": content})
}

/// One client message to put back: the message at `at` becomes `messages`, and `results`
/// open the message after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Restoration {
    pub at: usize,
    pub messages: Vec<Value>,
    pub results: Vec<Value>,
}

/// Where the records of `list` go back into the client's `messages`, in order. A record whose
/// results have no user message to open is left out (the client's message stays as it is).
pub fn restorations(list: &[Rounds], messages: &[Value]) -> Vec<Restoration> {
    let mut out = Vec::new();
    if list.is_empty() {
        return out;
    }
    let mut before = Transcript::default();
    for (at, message) in messages.iter().enumerate() {
        if message.get("role").and_then(Value::as_str) == Some("assistant") {
            let wanted = key(before, message);
            if let Some(rounds) = list.iter().find(|r| r.key == wanted) {
                let answered = messages
                    .get(at + 1)
                    .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("user"));
                if rounds.results.is_empty() || answered {
                    out.push(Restoration {
                        at,
                        messages: rounds.messages.clone(),
                        results: rounds.results.clone(),
                    });
                }
            }
        }
        before = before.then(message);
    }
    out
}

/// `user` (a user message) with `results` opening its content.
pub fn opened_with(user: &Value, results: &[Value]) -> Value {
    let mut user = user.clone();
    let content = match user.get("content") {
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        _ => Vec::new(),
    };
    let mut opened = results.to_vec();
    opened.extend(content);
    if let Value::Object(map) = &mut user {
        map.insert("content".into(), Value::Array(opened));
    }
    user
}

/// Applies `restorations` to `messages` as values (the route writes them into the bytes).
pub fn restore_in(messages: &[Value], restorations: &[Restoration]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    let mut i = 0;
    let mut pending = restorations.iter().peekable();
    while i < messages.len() {
        match pending.next_if(|r| r.at == i) {
            Some(r) => {
                out.extend(r.messages.iter().cloned());
                if !r.results.is_empty() {
                    if let Some(next) = messages.get(i + 1) {
                        out.push(opened_with(next, &r.results));
                        i += 1;
                    }
                }
            }
            None => out.push(messages[i].clone()),
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(name: &str) -> bool {
        name == "context_read"
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    fn upstream() -> Vec<Value> {
        vec![
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look it up", "signature": "s1"},
                {"type": "tool_use", "id": "t1", "name": "context_read", "input": {"ref": "ctx_a"}}]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "needle"}]}),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "found", "signature": "s2"},
                {"type": "text", "text": "It is the needle."}]}),
        ]
    }

    #[test]
    fn the_clients_message_goes_back_to_the_upstream_transcript() {
        let before = vec![user("where is the needle?")];
        let shown = shown(&upstream(), &proxy);
        assert_eq!(shown["content"].as_array().unwrap().len(), 3);
        let rounds = Rounds {
            key: key(Transcript::of(&before), &shown),
            messages: upstream(),
            results: vec![],
        };
        // The client re-serializes what it got: keys reordered, a null added, a breakpoint.
        let mut resent = shown.clone();
        resent["content"][0] =
            json!({"signature": "s1", "thinking": "look it up", "type": "thinking"});
        resent["content"][2]["citations"] = Value::Null;
        resent["content"][2]["cache_control"] = json!({"type": "ephemeral"});
        let messages = vec![before[0].clone(), resent, user("thanks")];
        let found = restorations(std::slice::from_ref(&rounds), &messages);
        assert_eq!(found.len(), 1);
        let restored = restore_in(&messages, &found);
        assert_eq!(restored.len(), 5);
        assert_eq!(&restored[1..4], &upstream()[..]);
        assert_eq!(restored[4], user("thanks"));
        // Another conversation ending with the same message: nothing comes back.
        let other = vec![user("something else"), shown.clone(), user("thanks")];
        assert!(restorations(std::slice::from_ref(&rounds), &other).is_empty());
    }

    #[test]
    fn a_mixed_round_opens_the_next_user_message_with_the_proxys_results() {
        let mut answer = upstream();
        answer[2]["content"].as_array_mut().unwrap().extend([
            json!({"type": "tool_use", "id": "t2", "name": "context_read", "input": {}}),
            json!({"type": "tool_use", "id": "t3", "name": "Bash", "input": {"command": "ls"}}),
        ]);
        let before = vec![user("go")];
        let shown = shown(&answer, &proxy);
        let rounds = Rounds {
            key: key(Transcript::of(&before), &shown),
            messages: answer.clone(),
            results: vec![json!({"type": "tool_result", "tool_use_id": "t2", "content": "x"})],
        };
        let next = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t3", "content": "a.rs"}]});
        let messages = vec![before[0].clone(), shown.clone(), next];
        let found = restorations(std::slice::from_ref(&rounds), &messages);
        let restored = restore_in(&messages, &found);
        assert_eq!(restored.len(), 5);
        let ids: Vec<&str> = restored[4]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["tool_use_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["t2", "t3"]);
        // Without the client's next message there is nothing to open: left as it is.
        assert!(restorations(std::slice::from_ref(&rounds), &messages[..2]).is_empty());
    }
}
