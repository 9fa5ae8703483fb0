//! Hidden exchanges. When one answer of the model calls both the client's tools and the
//! proxy's, the client gets the assistant message with its own calls only; the proxy keeps the
//! calls it answered itself, with their results, in the session. When the client sends the
//! conversation back (with its tool results), the proxy puts them back in place, so the model
//! sees what it really did — and sees the same bytes on every later turn (prompt cache).
//!
//! An exchange is found by the conversation it came from: a digest of every message before
//! that assistant message, as the client sent them, and the ids of the client's calls in it.
//! Call ids alone are not enough: some servers number calls predictably, and clients without
//! keys of their own whose conversations begin alike share a session, so one user's hidden
//! reads would be put into another's request. The digest reads what a message says (role,
//! text, call ids and names, the id a result answers), not its bytes, which client libraries
//! may re-serialize.

use std::ops::ControlFlow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::store::{SessionId, StateList, Store, StoreError, Tenant};

/// Exchanges kept per session (the oldest go first).
const PER_SESSION: usize = 256;

/// What the proxy hid from the client in one assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// Identifies the assistant message: a hash of the transcript before it and of its client
    /// calls' ids ([`key_of`]).
    pub key: String,
    /// The hidden calls, each with its position among all the message's calls.
    pub calls: Vec<(usize, Value)>,
    /// The tool messages answering the hidden calls, in call order.
    pub results: Vec<Value>,
}

/// The key of an assistant message that follows the transcript whose digest is `transcript`
/// ([`Transcript`]) and whose client calls have these ids.
pub fn key_of<'a>(transcript: u128, ids: impl IntoIterator<Item = &'a str>) -> String {
    let mut joined = format!("{transcript:032x}\n");
    for id in ids {
        joined.push_str(id);
        joined.push('\n');
    }
    format!("{:032x}", xxh3_128(joined.as_bytes()))
}

/// A running digest of a conversation's messages, one after the other: after `n` messages it
/// names exactly those `n` (their roles, texts, calls and the ids results answer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transcript(u128);

impl Transcript {
    /// The digest of `messages`, in order.
    pub fn of(messages: &[Value]) -> Transcript {
        messages
            .iter()
            .fold(Transcript::default(), |t, m| t.then(m))
    }

    /// The digest of the messages so far followed by `message`.
    pub fn then(self, message: &Value) -> Transcript {
        let mut h = Xxh3::new();
        h.update(&self.0.to_le_bytes());
        let field = |h: &mut Xxh3, tag: u8, text: &str| {
            h.update(&[tag]);
            h.update(&(text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        };
        fn text(v: Option<&Value>) -> &str {
            v.and_then(Value::as_str).unwrap_or("")
        }
        field(&mut h, b'r', text(message.get("role")));
        match message.get("content") {
            Some(Value::String(s)) => field(&mut h, b'c', s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part.get("text").and_then(Value::as_str) {
                        Some(t) => field(&mut h, b't', t),
                        None => field(&mut h, b'p', &canonical(part)),
                    }
                }
            }
            _ => {}
        }
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            field(&mut h, b'i', text(call.get("id")));
            let name = call
                .get("function")
                .or_else(|| call.get("custom"))
                .and_then(|f| f.get("name"));
            field(&mut h, b'n', text(name));
        }
        field(&mut h, b'a', text(message.get("tool_call_id")));
        Transcript(h.digest128())
    }

    pub fn digest(self) -> u128 {
        self.0
    }

    /// The digest of Responses API input `items`, in order.
    pub fn of_items(items: &[Value]) -> Transcript {
        items
            .iter()
            .fold(Transcript::default(), |t, i| t.then_item(i))
    }

    /// The digest of the input items so far followed by `item` (what it says: its type, role,
    /// text, call id and name, output), as [`then`](Self::then) reads a message.
    pub fn then_item(self, item: &Value) -> Transcript {
        let mut h = Xxh3::new();
        h.update(&self.0.to_le_bytes());
        h.update(b"item");
        let field = |h: &mut Xxh3, tag: u8, text: &str| {
            h.update(&[tag]);
            h.update(&(text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        };
        fn text(v: Option<&Value>) -> &str {
            v.and_then(Value::as_str).unwrap_or("")
        }
        field(&mut h, b'y', item_kind(item));
        field(&mut h, b'r', text(item.get("role")));
        for (tag, key) in [(b'c', "content"), (b'o', "output")] {
            match item.get(key) {
                Some(Value::String(s)) => field(&mut h, tag, s),
                Some(Value::Array(parts)) => {
                    for part in parts {
                        match part.get("text").and_then(Value::as_str) {
                            Some(t) => field(&mut h, b't', t),
                            None => field(&mut h, b'p', &part.to_string()),
                        }
                    }
                }
                _ => {}
            }
        }
        field(&mut h, b'i', text(item.get("call_id")));
        field(&mut h, b'n', text(item.get("name")));
        Transcript(h.digest128())
    }
}

/// A Responses input item's type (`message` when it has a role and no type).
fn item_kind(item: &Value) -> &str {
    match item.get("type").and_then(Value::as_str) {
        Some(kind) => kind,
        None if item.get("role").is_some() => "message",
        None => "",
    }
}

/// Whether a Responses item is the model's output: reasoning, an assistant message, a call.
fn is_model_item(item: &Value) -> bool {
    match item_kind(item) {
        "reasoning" => true,
        "message" => item.get("role").and_then(Value::as_str) == Some("assistant"),
        kind => kind.ends_with("_call"),
    }
}

/// The `call_id`s of the calls among Responses `items`, in order.
pub fn item_call_ids(items: &[Value]) -> Vec<&str> {
    items
        .iter()
        .filter(|i| item_kind(i).ends_with("_call"))
        .filter_map(|i| i.get("call_id").and_then(Value::as_str))
        .collect()
}

/// Which conversation a body holds: chat's `messages` or the Responses API's `input` items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Responses,
}

/// What a part says, whatever its client's serializer did: keys sorted, `null` members and
/// `cache_control` (a breakpoint the client moves from turn to turn) left out.
fn canonical(part: &Value) -> String {
    fn write(out: &mut String, v: &Value) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map
                    .iter()
                    .filter(|(k, v)| !v.is_null() && k.as_str() != "cache_control")
                    .map(|(k, _)| k)
                    .collect();
                keys.sort();
                out.push('{');
                for (n, k) in keys.into_iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push(':');
                    write(out, &map[k]);
                }
                out.push('}');
            }
            Value::Array(list) => {
                out.push('[');
                for (n, item) in list.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    write(out, item);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(&mut out, part);
    out
}

/// A record of a hidden list: found by its key.
pub trait Keyed {
    fn key(&self) -> &str;
}

impl Keyed for Exchange {
    fn key(&self) -> &str {
        &self.key
    }
}

/// The hidden exchanges of a session, in the store: chat's [`Exchange`]s, or Anthropic
/// Messages' hidden rounds ([`super::hidden_rounds::Rounds`]).
pub struct Hidden<T = Exchange> {
    list: StateList<T>,
}

impl Hidden<Exchange> {
    pub fn new(store: Arc<dyn Store>) -> Hidden {
        Hidden {
            list: StateList::new(store, "hidden"),
        }
    }
}

impl<T: Keyed + Clone + Serialize + serde::de::DeserializeOwned> Hidden<T> {
    /// The list kept under the session's state key `key`.
    pub fn under(store: Arc<dyn Store>, key: &'static str) -> Hidden<T> {
        Hidden {
            list: StateList::new(store, key),
        }
    }

    /// Keeps `exchange` for the session (merged with what other replicas keep).
    pub async fn keep(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        exchange: T,
    ) -> Result<(), StoreError> {
        self.list
            .update(tenant, session, |list| {
                if list.iter().any(|e| e.key() == exchange.key()) {
                    return ControlFlow::Break(());
                }
                list.push(exchange.clone());
                if list.len() > PER_SESSION {
                    list.drain(..list.len() - PER_SESSION);
                }
                ControlFlow::Continue(())
            })
            .await
    }

    /// Every exchange kept for the session.
    pub async fn read(&self, tenant: &Tenant, session: &SessionId) -> Result<Vec<T>, StoreError> {
        self.list.read(tenant, session).await
    }
}

impl Hidden<Exchange> {
    /// Puts every hidden exchange of the session back in place in `messages` (chat's
    /// messages or the Responses API's input items, as `shape` says). Returns how many were
    /// restored. Reads the store only when the conversation holds a call.
    pub async fn restore(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        shape: Shape,
        messages: &mut Vec<Value>,
    ) -> Result<usize, StoreError> {
        let has_calls = match shape {
            Shape::Chat => messages.iter().any(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && m.get("tool_calls")
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty())
            }),
            Shape::Responses => !item_call_ids(messages).is_empty(),
        };
        if !has_calls {
            return Ok(0);
        }
        let list = self.list.read(tenant, session).await?;
        if list.is_empty() {
            return Ok(0);
        }
        Ok(match shape {
            Shape::Chat => restore_in(&list, messages),
            Shape::Responses => restore_items(&list, messages),
        })
    }
}

/// [`Hidden::restore`] on a list already read.
pub fn restore_in(list: &[Exchange], messages: &mut Vec<Value>) -> usize {
    // The digest of the transcript before each message, as the client sent it (before anything
    // is put back): what the exchange's key was made of when it was hidden.
    let mut before = Vec::with_capacity(messages.len());
    let mut transcript = Transcript::default();
    for message in messages.iter() {
        before.push(transcript);
        transcript = transcript.then(message);
    }
    let mut before = before.into_iter();
    let mut restored = 0;
    let mut i = 0;
    while i < messages.len() {
        let Some(transcript) = before.next() else {
            break;
        };
        let message = &messages[i];
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            i += 1;
            continue;
        }
        let ids = call_ids(message);
        if ids.is_empty() {
            i += 1;
            continue;
        }
        let key = key_of(transcript.digest(), ids.iter().copied());
        let Some(exchange) = list.iter().find(|e| e.key == key) else {
            i += 1;
            continue;
        };
        // Already restored (the client kept the proxy's calls): leave it.
        let hidden_ids: Vec<&str> = exchange
            .calls
            .iter()
            .filter_map(|(_, c)| c.get("id").and_then(Value::as_str))
            .collect();
        if hidden_ids.iter().any(|h| ids.contains(h)) {
            i += 1;
            continue;
        }
        if let Some(Value::Array(calls)) = messages[i].get_mut("tool_calls") {
            for (position, call) in &exchange.calls {
                let at = (*position).min(calls.len());
                calls.insert(at, call.clone());
            }
        }
        let results = exchange.results.len();
        for (k, result) in exchange.results.iter().enumerate() {
            messages.insert(i + 1 + k, result.clone());
        }
        restored += 1;
        i += 1 + results;
    }
    restored
}

/// [`Hidden::restore`] of Responses input `items` on a list already read. An exchange was
/// kept from the model's output items that followed the client's input: it is found at a run
/// of the model's items (reasoning, assistant messages, calls) by the digest of the items
/// before the run and the ids of the run's calls; its items go back at their positions in the
/// run, its outputs right after the run.
pub fn restore_items(list: &[Exchange], items: &mut Vec<Value>) -> usize {
    let original = std::mem::take(items);
    let mut before = Vec::with_capacity(original.len());
    let mut transcript = Transcript::default();
    for item in &original {
        before.push(transcript);
        transcript = transcript.then_item(item);
    }
    let found = |start: usize| -> Option<(usize, &Exchange)> {
        let end = start
            + original[start..]
                .iter()
                .take_while(|i| is_model_item(i))
                .count();
        let ids = item_call_ids(&original[start..end]);
        if ids.is_empty() {
            return None;
        }
        let key = key_of(before[start].digest(), ids.iter().copied());
        let exchange = list.iter().find(|e| e.key == key)?;
        // Already restored (the client kept the proxy's items): leave it.
        let restored = exchange
            .calls
            .iter()
            .filter_map(|(_, c)| c.get("call_id").and_then(Value::as_str))
            .any(|h| ids.contains(&h));
        (!restored).then_some((end, exchange))
    };
    let mut out = Vec::with_capacity(original.len());
    let mut restored = 0;
    let mut j = 0;
    while j < original.len() {
        let Some((end, exchange)) = found(j) else {
            out.push(original[j].clone());
            j += 1;
            continue;
        };
        let mut run = original[j..end].to_vec();
        for (position, item) in &exchange.calls {
            let at = (*position).min(run.len());
            run.insert(at, item.clone());
        }
        out.extend(run);
        out.extend(exchange.results.iter().cloned());
        restored += 1;
        j = end;
    }
    *items = out;
    restored
}

/// The ids of the tool calls of an assistant message, in order.
pub fn call_ids(message: &Value) -> Vec<&str> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .filter_map(|c| c.get("id").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// Splits the calls of an assistant message into the client's and the proxy's (`is_proxy`
/// says which names are the proxy's). Returns the message as the client must see it (its own
/// calls only, `index` fields renumbered when present) and the hidden calls with their
/// positions.
pub fn split(message: &Value, is_proxy: impl Fn(&str) -> bool) -> (Value, Vec<(usize, Value)>) {
    let mut visible = message.clone();
    let mut hidden = Vec::new();
    if let Some(Value::Array(calls)) = visible.get_mut("tool_calls") {
        let mut kept = Vec::with_capacity(calls.len());
        for (position, call) in calls.drain(..).enumerate() {
            let name = call
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if is_proxy(name) {
                hidden.push((position, call));
            } else {
                kept.push(call);
            }
        }
        for (index, call) in kept.iter_mut().enumerate() {
            if let Some(slot) = call.get_mut("index") {
                *slot = Value::from(index);
            }
        }
        *calls = kept;
    }
    (visible, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str, name: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}})
    }

    #[test]
    fn split_then_restore_gives_back_the_models_view() {
        let full = json!({"role": "assistant", "content": null, "tool_calls": [
            call("c1", "context_read"), call("c2", "run_tests"), call("c3", "context_search"), call("c4", "edit")
        ]});
        let (visible, hidden) = split(&full, |n| n.starts_with("context_"));
        assert_eq!(visible["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(visible["tool_calls"][0]["id"], "c2");
        let exchange = Exchange {
            key: key_of(
                Transcript::of(&[json!({"role": "user", "content": "go"})]).digest(),
                ["c2", "c4"],
            ),
            calls: hidden,
            results: vec![
                json!({"role": "tool", "tool_call_id": "c1", "content": "read"}),
                json!({"role": "tool", "tool_call_id": "c3", "content": "found"}),
            ],
        };
        let mut messages = vec![
            json!({"role": "user", "content": "go"}),
            visible.clone(),
            json!({"role": "tool", "tool_call_id": "c2", "content": "ok"}),
            json!({"role": "tool", "tool_call_id": "c4", "content": "done"}),
        ];
        assert_eq!(
            restore_in(std::slice::from_ref(&exchange), &mut messages),
            1
        );
        assert_eq!(messages[1], full);
        let ids: Vec<&str> = messages[2..]
            .iter()
            .map(|m| m["tool_call_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["c1", "c3", "c2", "c4"]);
        // Restoring again (the client kept what it got back) changes nothing.
        let again = messages.clone();
        assert_eq!(
            restore_in(std::slice::from_ref(&exchange), &mut messages),
            0
        );
        assert_eq!(messages, again);
    }

    #[test]
    fn responses_items_come_back_in_place_with_their_reasoning() {
        let user = json!({"role": "user", "content": "go"});
        let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-x"});
        let proxy = json!({"type": "function_call", "id": "fc_1", "call_id": "call_p", "name": "context_read", "arguments": "{}"});
        let client = json!({"type": "function_call", "id": "fc_2", "call_id": "call_c", "name": "edit", "arguments": "{}"});
        let proxy_out =
            json!({"type": "function_call_output", "call_id": "call_p", "output": "read"});
        let client_out =
            json!({"type": "function_call_output", "call_id": "call_c", "output": "ok"});
        let exchange = Exchange {
            key: key_of(
                Transcript::of_items(std::slice::from_ref(&user)).digest(),
                ["call_c"],
            ),
            calls: vec![(0, reasoning.clone()), (1, proxy.clone())],
            results: vec![proxy_out.clone()],
        };
        let mut items = vec![user.clone(), client.clone(), client_out.clone()];
        assert_eq!(
            restore_items(std::slice::from_ref(&exchange), &mut items),
            1
        );
        assert_eq!(
            items,
            [
                user.clone(),
                reasoning,
                proxy,
                client.clone(),
                proxy_out,
                client_out.clone()
            ]
        );
        // Once in place, nothing more; after another transcript, nothing at all.
        let again = items.clone();
        assert_eq!(
            restore_items(std::slice::from_ref(&exchange), &mut items),
            0
        );
        assert_eq!(items, again);
        let mut other = vec![
            json!({"role": "user", "content": "else"}),
            client,
            client_out,
        ];
        let before = other.clone();
        assert_eq!(
            restore_items(std::slice::from_ref(&exchange), &mut other),
            0
        );
        assert_eq!(other, before);
    }

    #[test]
    fn the_key_is_the_transcript_and_the_client_call_ids() {
        assert_eq!(key_of(1, ["a", "b"]), key_of(1, ["a", "b"]));
        assert_ne!(key_of(1, ["a", "b"]), key_of(1, ["ab"]));
        assert_ne!(key_of(1, ["a"]), key_of(2, ["a"]));
        let other = vec![json!({"role": "assistant", "tool_calls": [call("x", "f")]})];
        let exchange = Exchange {
            key: key_of(0, ["y"]),
            calls: vec![],
            results: vec![],
        };
        let mut m = other.clone();
        assert_eq!(restore_in(&[exchange], &mut m), 0);
        assert_eq!(m, other);
    }

    #[test]
    fn an_exchange_returns_only_after_the_transcript_it_came_from() {
        let mine = vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "tool", "tool_call_id": "c0", "content": "mine"}),
        ];
        let exchange = Exchange {
            key: key_of(Transcript::of(&mine).digest(), ["c2"]),
            calls: vec![(0, call("c1", "context_read"))],
            results: vec![json!({"role": "tool", "tool_call_id": "c1", "content": "secret"})],
        };
        let answer =
            json!({"role": "assistant", "content": null, "tool_calls": [call("c2", "run")]});
        let result = json!({"role": "tool", "tool_call_id": "c2", "content": "ok"});
        // Another conversation with the same call ids: nothing comes back.
        let mut theirs = vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "tool", "tool_call_id": "c0", "content": "theirs"}),
            answer.clone(),
            result.clone(),
        ];
        let before = theirs.clone();
        assert_eq!(restore_in(std::slice::from_ref(&exchange), &mut theirs), 0);
        assert_eq!(theirs, before);
        // The same conversation re-serialized (a null field added): it comes back.
        let mut again = mine.clone();
        again[0]["name"] = Value::Null;
        again.push(answer);
        again.push(result);
        assert_eq!(restore_in(std::slice::from_ref(&exchange), &mut again), 1);
        assert_eq!(again[2]["tool_calls"][0]["id"], "c1");
        assert_eq!(again[3]["content"], "secret");
    }
}
