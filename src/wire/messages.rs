//! An Anthropic Messages answer as the proxy's tool loop reads it (`docs/messages-wire.md`):
//!
//! - [`Assembler`]: the assistant message assembled from a stream's events — text from
//!   `text_delta`, thinking from `thinking_delta` with its `signature_delta`, the input of
//!   `tool_use` and `server_tool_use` rebuilt from `input_json_delta` fragments, any other block
//!   as it started — with the stop reason and the usage (`message_start`'s, updated by each
//!   cumulative `message_delta`);
//! - [`Relay`]: what of one client response's upstream streams reaches the client: one
//!   `message_start`, the proxy's `tool_use` blocks and their deltas hidden, every other block
//!   renumbered so the client's `index`es run 0, 1, 2… over all rounds, `ping` and unknown
//!   events forwarded, an `error` event last, and one `message_delta` + `message_stop` at the
//!   very end with the usage summed over the rounds;
//! - [`tool_uses`], [`visible`] and [`sum_usage`]: the same for an answer read whole.
//!
//! Pure: events and values in, bytes and values out.

use bytes::Bytes;
use serde_json::{json, Value};

use super::sse::Event;

/// One `tool_use` block of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    /// The input object.
    pub input: Value,
}

/// The `tool_use` blocks of `content`, in order (`server_tool_use` is the API's to run).
pub fn tool_uses(content: &[Value]) -> Vec<ToolUse> {
    content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .map(|b| ToolUse {
            id: text(b.get("id")).to_string(),
            name: text(b.get("name")).to_string(),
            input: b.get("input").cloned().unwrap_or_else(|| json!({})),
        })
        .collect()
}

/// The `tool_use` blocks of `content` as the tool loop runs calls (the input as JSON text).
pub fn calls_of(content: &[Value]) -> Vec<super::ToolCall> {
    tool_uses(content)
        .into_iter()
        .map(|t| super::ToolCall {
            id: t.id,
            kind: "function".into(),
            name: t.name,
            arguments: t.input.to_string(),
        })
        .collect()
}

/// Whether `block` is a call of one of the proxy's tools (`is_proxy` says which names are).
pub fn is_proxy_call(block: &Value, is_proxy: &dyn Fn(&str) -> bool) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_use")
        && is_proxy(text(block.get("name")))
}

/// The blocks of `content` the client sees: all but the proxy's calls.
pub fn visible(content: &[Value], is_proxy: &dyn Fn(&str) -> bool) -> Vec<Value> {
    content
        .iter()
        .filter(|b| !is_proxy_call(b, is_proxy))
        .cloned()
        .collect()
}

/// `into` += `from`, a Messages `usage` object added field by field: numbers add (the nested
/// `cache_creation` and `server_tool_use` counts too), anything else takes `from`'s value.
pub fn sum_usage(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => super::usage::merge_sum(a, b),
        (slot, from) => *slot = from.clone(),
    }
}

fn text(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

/// A stream's answer assembled event by event.
#[derive(Debug, Default, Clone)]
pub struct Assembler {
    /// The blocks by their upstream `index`, each with the JSON text of its input so far.
    blocks: Vec<(u64, Value, String)>,
    usage: Value,
    stop_reason: Option<Value>,
    stopped: bool,
}

impl Assembler {
    /// Takes one event's JSON in.
    pub fn push(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(usage) = event.get("message").and_then(|m| m.get("usage")) {
                    self.usage = usage.clone();
                }
            }
            Some("content_block_start") => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                self.blocks.retain(|(i, _, _)| *i != index);
                self.blocks.push((index, block, String::new()));
            }
            Some("content_block_delta") => {
                let index = event.get("index").and_then(Value::as_u64);
                let Some((_, block, input)) =
                    self.blocks.iter_mut().find(|(i, _, _)| Some(*i) == index)
                else {
                    return;
                };
                let delta = event.get("delta").unwrap_or(&Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append(block, "text", delta.get("text")),
                    Some("thinking_delta") => append(block, "thinking", delta.get("thinking")),
                    Some("signature_delta") => append(block, "signature", delta.get("signature")),
                    Some("input_json_delta") => input.push_str(text(delta.get("partial_json"))),
                    Some("citations_delta") => {
                        if let (Value::Object(map), Some(citation)) = (block, delta.get("citation"))
                        {
                            let list = map
                                .entry("citations")
                                .or_insert_with(|| Value::Array(Vec::new()));
                            if let Value::Array(list) = list {
                                list.push(citation.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event.get("delta").and_then(|d| d.get("stop_reason")) {
                    self.stop_reason = Some(reason.clone());
                }
                if let (Value::Object(usage), Some(Value::Object(later))) =
                    (&mut self.usage, event.get("usage"))
                {
                    // Cumulative: a later count replaces the earlier one.
                    for (key, value) in later {
                        usage.insert(key.clone(), value.clone());
                    }
                } else if let Some(later) = event.get("usage") {
                    self.usage = later.clone();
                }
            }
            Some("message_stop") => self.stopped = true,
            _ => {}
        }
    }

    /// The content so far, in `index` order; a call's input parsed from its fragments (an
    /// empty or unreadable text leaves the input it started with).
    pub fn content(&self) -> Vec<Value> {
        let mut blocks: Vec<&(u64, Value, String)> = self.blocks.iter().collect();
        blocks.sort_by_key(|(i, _, _)| *i);
        blocks
            .into_iter()
            .map(|(_, block, input)| {
                let mut block = block.clone();
                if !input.is_empty() {
                    if let (Value::Object(map), Ok(parsed)) =
                        (&mut block, serde_json::from_str::<Value>(input))
                    {
                        map.insert("input".into(), parsed);
                    }
                }
                block
            })
            .collect()
    }

    /// The assistant message as the conversation continues with it.
    pub fn message(&self) -> Value {
        json!({"role": "assistant", "content": self.content()})
    }

    /// The usage of the answer so far (`Null` before `message_start`).
    pub fn usage(&self) -> &Value {
        &self.usage
    }

    /// The stop reason, once `message_delta` said it.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop_reason.as_ref().and_then(Value::as_str)
    }

    /// `message_stop` arrived.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The block at upstream `index`.
    fn block(&self, index: u64) -> Option<&Value> {
        self.blocks
            .iter()
            .find(|(i, _, _)| *i == index)
            .map(|(_, b, _)| b)
    }
}

fn append(block: &mut Value, key: &str, piece: Option<&Value>) {
    let Some(piece) = piece.and_then(Value::as_str) else {
        return;
    };
    if let Value::Object(map) = block {
        let slot = map
            .entry(key.to_string())
            .or_insert_with(|| Value::String(String::new()));
        match slot {
            Value::String(s) => s.push_str(piece),
            other => *other = Value::String(piece.to_string()),
        }
    }
}

/// What one upstream event gives the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing.
    Skip,
    /// These bytes.
    Send(Bytes),
    /// These bytes, and nothing after them (an `error` event).
    Last(Bytes),
}

/// The client's view of the upstream streams that answer one request (see the module's doc).
#[derive(Debug, Default)]
pub struct Relay {
    /// Rounds finished before this one.
    rounds: u32,
    /// The client's next block index.
    next_index: u64,
    /// This round's upstream indexes and the client's (`None`: hidden).
    map: Vec<(u64, Option<u64>)>,
    acc: Assembler,
    /// This round's `message_delta` and `message_stop`, held until the loop knows whether the
    /// answer ends here.
    held: Vec<Bytes>,
    /// The usage of the rounds finished.
    usage: Option<Value>,
    /// This round called the proxy's tools / the client's.
    proxy_calls: bool,
    client_calls: bool,
    /// Blocks of this round the client got.
    shown: usize,
}

impl Relay {
    pub fn new() -> Relay {
        Relay::default()
    }

    /// One upstream event; `is_proxy` says which tool names are the proxy's.
    pub fn event(&mut self, event: &Event, is_proxy: &dyn Fn(&str) -> bool) -> Step {
        let Some(data) = event.data.as_deref() else {
            // A comment or keep-alive.
            return Step::Send(event.raw.clone());
        };
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            return Step::Send(event.raw.clone());
        };
        self.acc.push(&value);
        let index = value.get("index").and_then(Value::as_u64);
        match value.get("type").and_then(Value::as_str) {
            Some("message_start") if self.rounds > 0 => Step::Skip,
            Some("content_block_start") => {
                let index = index.unwrap_or(0);
                let block = self.acc.block(index).cloned().unwrap_or(Value::Null);
                if is_proxy_call(&block, is_proxy) {
                    self.proxy_calls = true;
                    self.map.push((index, None));
                    return Step::Skip;
                }
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    self.client_calls = true;
                }
                let client = self.next_index;
                self.next_index += 1;
                self.shown += 1;
                self.map.push((index, Some(client)));
                self.renumbered(event, value, index, client)
            }
            Some("content_block_delta" | "content_block_stop") => {
                let Some(index) = index else {
                    return Step::Send(event.raw.clone());
                };
                match self.map.iter().rev().find(|(i, _)| *i == index) {
                    Some((_, None)) => Step::Skip,
                    Some((_, Some(client))) => {
                        let client = *client;
                        self.renumbered(event, value, index, client)
                    }
                    None => Step::Send(event.raw.clone()),
                }
            }
            Some("message_delta" | "message_stop") => {
                self.held.push(event.raw.clone());
                Step::Skip
            }
            Some("error") => Step::Last(event.raw.clone()),
            _ => Step::Send(event.raw.clone()),
        }
    }

    fn renumbered(&self, event: &Event, mut value: Value, index: u64, client: u64) -> Step {
        if index == client {
            return Step::Send(event.raw.clone());
        }
        value["index"] = Value::from(client);
        Step::Send(event_bytes(&value))
    }

    /// Whether this round called the proxy's tools, and the client's.
    pub fn calls(&self) -> (bool, bool) {
        (self.proxy_calls, self.client_calls)
    }

    /// This round's assistant message, as the upstream sent it.
    pub fn message(&self) -> Value {
        self.acc.message()
    }

    /// This round's answer so far.
    pub fn assembled(&self) -> &Assembler {
        &self.acc
    }

    /// How many of this round's blocks the client got.
    pub fn shown(&self) -> usize {
        self.shown
    }

    /// The client's next block index (how many blocks it got over every round).
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// The round ends and another follows: its usage is kept for the end, its
    /// `message_delta` and `message_stop` dropped.
    pub fn next_round(&mut self) {
        let usage = self.acc.usage().clone();
        match &mut self.usage {
            Some(sum) => sum_usage(sum, &usage),
            None => self.usage = Some(usage),
        }
        self.rounds += 1;
        self.map.clear();
        self.acc = Assembler::default();
        self.held.clear();
        self.proxy_calls = false;
        self.client_calls = false;
        self.shown = 0;
    }

    /// The usage summed over every round so far, this one included.
    pub fn usage(&self) -> Value {
        let mut sum = self.usage.clone().unwrap_or(Value::Null);
        match &mut sum {
            Value::Null => sum = self.acc.usage().clone(),
            sum => sum_usage(sum, self.acc.usage()),
        }
        sum
    }

    /// The end of the answer: the last round's `message_delta` and `message_stop` as the
    /// upstream sent them when there was one round and nothing changes, else one
    /// `message_delta` with the usage summed over the rounds (and the stop reason
    /// `stop_reason` when given) and one `message_stop`.
    pub fn closing(&self, stop_reason: Option<&str>) -> Bytes {
        if self.rounds == 0 && stop_reason.is_none() && self.held.len() == 2 {
            let mut out = Vec::new();
            for raw in &self.held {
                out.extend_from_slice(raw);
            }
            return Bytes::from(out);
        }
        let reason = match stop_reason {
            Some(reason) => Value::from(reason),
            None => self.acc.stop_reason.clone().unwrap_or(Value::Null),
        };
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": Value::Null},
            "usage": self.usage(),
        });
        let mut out = event_bytes(&delta).to_vec();
        out.extend_from_slice(&event_bytes(&json!({"type": "message_stop"})));
        Bytes::from(out)
    }
}

/// One event, `event: <type>\ndata: <json>\n\n`, as the API writes them.
pub fn event_bytes(value: &Value) -> Bytes {
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {value}\n\n"))
}

/// `message`'s `usage` set to `usage` (a JSON answer's, summed over the rounds).
pub fn write_usage(message: &mut Value, usage: &Value) {
    if let Value::Object(map) = message {
        map.insert("usage".into(), usage.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SseReader;

    fn events(text: &str) -> Vec<Event> {
        let mut reader = SseReader::default();
        reader.push(text.as_bytes());
        let mut out = Vec::new();
        while let Ok(Some(e)) = reader.next_event() {
            out.push(e);
        }
        out.extend(reader.finish().filter_map(Result::ok));
        out
    }

    fn ev(value: Value) -> String {
        String::from_utf8(event_bytes(&value).to_vec()).unwrap()
    }

    /// A round: thinking, text, then calls `(id, name, input fragments)`.
    fn round(thought: &str, text: Option<&str>, calls: &[(&str, &str, &[&str])]) -> String {
        let mut s = ev(
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "m", "stop_reason": null,
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 5, "output_tokens": 1}}}),
        );
        let mut i = 0;
        s += &ev(
            json!({"type": "content_block_start", "index": i, "content_block": {"type": "thinking", "thinking": ""}}),
        );
        s += &ev(json!({"type": "ping"}));
        s += &ev(
            json!({"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": thought}}),
        );
        s += &ev(
            json!({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": "sig"}}),
        );
        s += &ev(json!({"type": "content_block_stop", "index": i}));
        i += 1;
        if let Some(t) = text {
            s += &ev(
                json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}),
            );
            s += &ev(
                json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}),
            );
            s += &ev(json!({"type": "content_block_stop", "index": i}));
            i += 1;
        }
        for (id, name, pieces) in calls {
            s += &ev(
                json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            );
            for p in *pieces {
                s += &ev(
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": p}}),
                );
            }
            s += &ev(json!({"type": "content_block_stop", "index": i}));
            i += 1;
        }
        let reason = if calls.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        s += &ev(
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": 7}}),
        );
        s += &ev(json!({"type": "message_stop"}));
        s
    }

    fn proxy(name: &str) -> bool {
        name == "context_read"
    }

    /// What the client got, parsed: the events' JSON in order.
    fn client(out: &[u8]) -> Vec<Value> {
        events(std::str::from_utf8(out).unwrap())
            .iter()
            .filter_map(|e| serde_json::from_str(e.data.as_deref()?).ok())
            .collect()
    }

    #[test]
    fn assembles_text_thinking_and_inputs_from_fragments() {
        let mut acc = Assembler::default();
        for e in events(&round(
            "hmm",
            Some("hi"),
            &[("t1", "Read", &["", "{\"pa", "th\":\"a.rs\"}"])],
        )) {
            acc.push(&serde_json::from_str(e.data.as_deref().unwrap()).unwrap());
        }
        assert_eq!(
            acc.message(),
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "hi"},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.rs"}}
            ]})
        );
        assert_eq!(acc.stop_reason(), Some("tool_use"));
        assert!(acc.stopped());
        assert_eq!(acc.usage()["output_tokens"], 7);
        assert_eq!(acc.usage()["cache_read_input_tokens"], 100);
        assert_eq!(tool_uses(&acc.content())[0].input, json!({"path": "a.rs"}));
    }

    #[test]
    fn hides_the_proxys_calls_and_renumbers_over_rounds() {
        let mut relay = Relay::new();
        let mut out = Vec::new();
        let first = round(
            "need to read",
            None,
            &[("t1", "context_read", &["{\"ref\":\"ctx_a\"}"])],
        );
        for e in events(&first) {
            match relay.event(&e, &proxy) {
                Step::Send(b) => out.extend_from_slice(&b),
                Step::Skip => {}
                Step::Last(_) => panic!("no error here"),
            }
        }
        assert_eq!(relay.calls(), (true, false));
        assert_eq!(relay.shown(), 1);
        assert_eq!(
            tool_uses(&relay.message()["content"].as_array().unwrap().clone())[0].input,
            json!({"ref": "ctx_a"})
        );
        relay.next_round();
        let second = round("now I know", Some("the needle"), &[("t2", "Edit", &["{}"])]);
        for e in events(&second) {
            if let Step::Send(b) = relay.event(&e, &proxy) {
                out.extend_from_slice(&b);
            }
        }
        assert_eq!(relay.calls(), (false, true));
        out.extend_from_slice(&relay.closing(None));
        let seen = client(&out);
        let kinds: Vec<&str> = seen.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1);
        assert_eq!(kinds.iter().filter(|k| **k == "message_delta").count(), 1);
        assert_eq!(kinds.last(), Some(&"message_stop"));
        assert_eq!(kinds.iter().filter(|k| **k == "ping").count(), 2);
        // Starts are 0, 1, 2, 3 in order; every delta and stop names a started block.
        let starts: Vec<u64> = seen
            .iter()
            .filter(|v| v["type"] == "content_block_start")
            .map(|v| v["index"].as_u64().unwrap())
            .collect();
        assert_eq!(starts, [0, 1, 2, 3]);
        assert!(!String::from_utf8_lossy(&out).contains("context_read"));
        // The client assembles thinking, thinking, text, its own call.
        let mut acc = Assembler::default();
        for v in &seen {
            acc.push(v);
        }
        let content = acc.content();
        let types: Vec<&str> = content
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["thinking", "thinking", "text", "tool_use"]);
        assert_eq!(content[1]["signature"], "sig");
        // Usage: both rounds, every field.
        let usage = &seen[kinds.iter().position(|k| *k == "message_delta").unwrap()]["usage"];
        assert_eq!(usage["output_tokens"], 14);
        assert_eq!(usage["input_tokens"], 20);
        assert_eq!(usage["cache_read_input_tokens"], 200);
        assert_eq!(usage["cache_creation_input_tokens"], 10);
        assert_eq!(seen.last().unwrap()["type"], "message_stop");
    }

    #[test]
    fn one_round_without_the_proxy_is_relayed_byte_for_byte() {
        let text = round("x", Some("y"), &[("t", "Bash", &["{}"])]);
        let mut relay = Relay::new();
        let mut out = Vec::new();
        for e in events(&text) {
            if let Step::Send(b) = relay.event(&e, &proxy) {
                out.extend_from_slice(&b);
            }
        }
        out.extend_from_slice(&relay.closing(None));
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn an_error_event_is_the_last_and_server_tools_pass() {
        let mut relay = Relay::new();
        let e = events(&ev(
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
        ));
        assert!(matches!(relay.event(&e[0], &proxy), Step::Send(_)));
        let d = events(&ev(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"query\":\"q\"}"}}),
        ));
        relay.event(&d[0], &proxy);
        assert_eq!(
            relay.message()["content"][0]["input"],
            json!({"query": "q"})
        );
        let err = events(&ev(
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ));
        assert!(matches!(relay.event(&err[0], &proxy), Step::Last(_)));
    }

    #[test]
    fn visible_and_summed_usage_of_whole_answers() {
        let content = vec![
            json!({"type": "text", "text": "a"}),
            json!({"type": "tool_use", "id": "1", "name": "context_read", "input": {}}),
            json!({"type": "tool_use", "id": "2", "name": "Bash", "input": {}}),
        ];
        let shown = visible(&content, &proxy);
        assert_eq!(shown.len(), 2);
        assert_eq!(shown[1]["name"], "Bash");
        let mut u = json!({"input_tokens": 1, "cache_creation": {"ephemeral_5m_input_tokens": 2}, "service_tier": "standard"});
        sum_usage(
            &mut u,
            &json!({"input_tokens": 3, "cache_creation": {"ephemeral_5m_input_tokens": 4}, "service_tier": "standard"}),
        );
        assert_eq!(
            u,
            json!({"input_tokens": 4, "cache_creation": {"ephemeral_5m_input_tokens": 6}, "service_tier": "standard"})
        );
    }
}
