//! Anthropic Messages' side of the tool loop ([`crate::routes::tool_loop`]): the calls are the
//! answer's `tool_use` blocks, a round appends the assistant message as the upstream sent it
//! (thinking blocks and signatures included) and a user message opening with the proxy's
//! `tool_result`s. The client gets one message made of its own blocks of every round
//! ([`LoopWire::merges_rounds`]); the upstream transcript it stands for is kept and put back on
//! the next turn (`proxy_tools::hidden_rounds`). The proxy's tools stay in a request once its
//! calls are in it (the API refuses `tool_use` blocks without their tools): after the last
//! round, a call of them is dropped, not run. Streams are relayed event by event
//! (`loop_stream.rs`).

use bytes::Bytes;
use serde_json::{json, Value};

use super::loop_stream;
use crate::context::adapter::messages::{binds_thinking, with_drop_block};
use crate::context::adapter::messages_added::with_tools;
use crate::http::error::ProxyError;
use crate::proxy_tools::{self, hidden, ToolNames};
use crate::routes::tool_loop::{EventStream, LoopWire, Round, Split, Turn};
use crate::upstream::Incoming;
use crate::wire::messages::{calls_of, is_proxy_call, tool_uses, visible};
use crate::wire::{ToolCall, Usage};

/// The tool loop on Anthropic Messages.
pub struct MessagesLoop;

/// The user message that answers a round: its results, opening it.
fn results_message(results: Vec<Value>) -> Value {
    json!({"role": "user", "content": results})
}

fn content(answer: &Value) -> &[Value] {
    answer
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

impl LoopWire for MessagesLoop {
    fn inject(&self, body: &mut Value, names: &ToolNames) {
        proxy_tools::inject_messages(body, names);
    }

    fn remove_tools(&self, _body: &mut Value, _names: &ToolNames, _client_had_tools: bool) {
        // The conversation now holds the proxy's `tool_use` blocks: they need their tools.
    }

    fn answer(&self, body: &Value) -> Option<Turn> {
        if body.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        Some(Turn {
            calls: calls_of(content(body)),
            usage: body.get("usage").and_then(Usage::from_json),
        })
    }

    fn continued(&self, answer: &Value, _turn: &Turn) -> Vec<Value> {
        vec![json!({"role": "assistant", "content": content(answer)})]
    }

    fn result(&self, call: &ToolCall, text: String) -> Value {
        let mut result = json!({"type": "tool_result", "tool_use_id": call.id, "content": text});
        if text_is_error(&result) {
            result["is_error"] = Value::Bool(true);
        }
        result
    }

    fn append_round(&self, body: &mut Value, output: Vec<Value>, results: Vec<Value>) {
        if let Some(Value::Array(messages)) = body.get_mut("messages") {
            messages.extend(output);
            messages.push(results_message(results));
        }
    }

    fn split(&self, answer: &mut Value, is_proxy: &dyn Fn(&str) -> bool) -> Split {
        let blocks = content(answer).to_vec();
        let hidden: Vec<(usize, Value)> = blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| is_proxy_call(b, is_proxy))
            .map(|(i, b)| (i, b.clone()))
            .collect();
        let shown = visible(&blocks, is_proxy);
        let client_ids: Vec<String> = tool_uses(&shown).into_iter().map(|t| t.id).collect();
        let empty = shown.is_empty();
        if let Value::Object(map) = answer {
            map.insert("content".into(), Value::Array(shown));
            if client_ids.is_empty() && map.get("stop_reason") == Some(&json!("tool_use")) {
                map.insert("stop_reason".into(), json!("end_turn"));
            }
        }
        Split {
            hidden,
            client_ids,
            empty,
        }
    }

    fn transcript(&self, client_body: &Value) -> u128 {
        match client_body.get("messages") {
            Some(Value::Array(list)) => hidden::Transcript::of(list).digest(),
            _ => hidden::Transcript::default().digest(),
        }
    }

    fn write_usage(&self, answer: &mut Value, usage: &Usage) {
        if let Value::Object(map) = answer {
            map.insert("usage".into(), Value::Object(usage.raw.clone()));
        }
    }

    fn stream(&self, round: Round, first: Incoming) -> EventStream {
        loop_stream::spawn(round, first)
    }

    fn merges_rounds(&self) -> bool {
        true
    }

    fn inject_bytes(&self, raw: &[u8], body: &Value, names: &ToolNames) -> Option<Vec<u8>> {
        let model = body.get("model").and_then(Value::as_str).unwrap_or("");
        let mut raw = raw.to_vec();
        if binds_thinking(model) && body.get("thinking").is_some_and(Value::is_object) {
            // The tools change the prefix every earlier thinking block is bound to: the API
            // drops those blocks instead of refusing the request (offered only when allowed).
            raw = with_drop_block(&raw, body)?;
        }
        with_tools(&raw, &proxy_tools::messages_definitions(names))
    }

    fn error_body(&self, error: &ProxyError, request_id: &str) -> Bytes {
        let status = error.classify().0.as_u16();
        let body = crate::wire::anthropic::error_body(status, &error.to_string(), request_id);
        Bytes::from(body.to_string())
    }

    fn merge(&self, answer: &mut Value, earlier: &[Value], is_proxy: &dyn Fn(&str) -> bool) {
        if earlier.is_empty() {
            return;
        }
        let mut merged: Vec<Value> = earlier
            .iter()
            .flat_map(|a| visible(content(a), is_proxy))
            .collect();
        merged.extend(content(answer).iter().cloned());
        if let Value::Object(map) = answer {
            // The client saw the first round's message begin (in a stream, its id).
            if let Some(id) = earlier.first().and_then(|a| a.get("id")) {
                map.insert("id".into(), id.clone());
            }
            map.insert("content".into(), Value::Array(merged));
        }
    }
}

/// Whether a result's text is the proxy's tool error (`exec` begins them with `error:`).
fn text_is_error(result: &Value) -> bool {
    result
        .get("content")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("error:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(name: &str) -> bool {
        name == "context_read"
    }

    #[test]
    fn rounds_append_the_upstreams_message_and_the_results_first() {
        let answer = json!({"type": "message", "id": "msg_1", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "toolu_1", "name": "context_read", "input": {"ref": "ctx_a"}}
        ], "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}});
        let turn = MessagesLoop.answer(&answer).unwrap();
        assert_eq!(turn.calls[0].arguments, r#"{"ref":"ctx_a"}"#);
        let mut body = json!({"messages": [{"role": "user", "content": "q"}]});
        let output = MessagesLoop.continued(&answer, &turn);
        let result = MessagesLoop.result(&turn.calls[0], "line 1".into());
        MessagesLoop.append_round(&mut body, output, vec![result]);
        assert_eq!(body["messages"][1]["content"], answer["content"]);
        assert_eq!(
            body["messages"][2],
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "line 1"}]})
        );
        let error = MessagesLoop.result(&turn.calls[0], "error: no such ref".into());
        assert_eq!(error["is_error"], true);
    }

    #[test]
    fn the_client_gets_its_blocks_of_every_round() {
        let first = json!({"type": "message", "id": "msg_1", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "context_read", "input": {}}]});
        let mut last = json!({"type": "message", "id": "msg_2", "content": [
            {"type": "text", "text": "Found it."},
            {"type": "tool_use", "id": "toolu_2", "name": "context_read", "input": {}},
            {"type": "tool_use", "id": "toolu_3", "name": "Bash", "input": {}}],
            "stop_reason": "tool_use"});
        let split = MessagesLoop.split(&mut last, &proxy);
        assert_eq!(split.client_ids, ["toolu_3"]);
        assert_eq!(split.hidden[0].0, 1);
        MessagesLoop.merge(&mut last, std::slice::from_ref(&first), &proxy);
        let texts: Vec<&str> = last["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["text"].as_str().or(b["name"].as_str()).unwrap())
            .collect();
        assert_eq!(texts, ["Let me look.", "Found it.", "Bash"]);
        assert_eq!(last["id"], "msg_1");
        assert_eq!(last["stop_reason"], "tool_use");
        let mut only_proxy = first.clone();
        let split = MessagesLoop.split(&mut only_proxy, &proxy);
        assert!(!split.empty);
        assert_eq!(only_proxy["content"].as_array().unwrap().len(), 1);
    }
}
