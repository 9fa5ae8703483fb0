//! The Responses API's side of the tool loop ([`crate::routes::tool_loop`]): the proxy's tools
//! are flat function tools; the calls are the answer's `function_call` items; a result is a
//! `function_call_output` item; a round appends the answer's output items (reasoning with its
//! `encrypted_content`, messages, calls, byte for byte) and the outputs to `input`. The
//! response object echoes the request's `tools`: the proxy's are taken out of what the client
//! sees. Streams are relayed event by event (`loop_stream.rs`).

use serde_json::{json, Value};

use super::items::{calls, has_text, hidden_positions, scrub_tools};
use super::loop_stream;
use crate::proxy_tools::{self, hidden, ToolNames};
use crate::routes::tool_loop::{EventStream, LoopWire, Round, Split, Turn};
use crate::upstream::Incoming;
use crate::wire::{ToolCall, Usage};

/// The tool loop on the Responses API.
pub struct ResponsesLoop;

impl LoopWire for ResponsesLoop {
    fn inject(&self, body: &mut Value, names: &ToolNames) {
        proxy_tools::inject_flat(body, names);
    }

    fn remove_tools(&self, body: &mut Value, names: &ToolNames, client_had_tools: bool) {
        proxy_tools::remove(body, names, client_had_tools);
    }

    fn answer(&self, body: &Value) -> Option<Turn> {
        let output = body.get("output")?.as_array()?;
        Some(Turn {
            calls: calls(output),
            usage: body.get("usage").and_then(Usage::from_json),
        })
    }

    fn continued(&self, answer: &Value, _turn: &Turn) -> Vec<Value> {
        answer
            .get("output")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn result(&self, call: &ToolCall, text: String) -> Value {
        json!({"type": "function_call_output", "call_id": call.id, "output": text})
    }

    fn append_round(&self, body: &mut Value, output: Vec<Value>, results: Vec<Value>) {
        let Some(object) = body.as_object_mut() else {
            return;
        };
        let input = object
            .entry("input")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::String(text) = input {
            // A string input is one user message.
            *input = json!([{"role": "user", "content": std::mem::take(text)}]);
        }
        if let Value::Array(items) = input {
            items.extend(output);
            items.extend(results);
        }
    }

    fn split(&self, answer: &mut Value, is_proxy: &dyn Fn(&str) -> bool) -> Split {
        let Some(Value::Array(output)) = answer.get_mut("output") else {
            return Split {
                empty: true,
                ..Split::default()
            };
        };
        let hide = hidden_positions(output, is_proxy);
        let mut split = Split::default();
        let mut visible = Vec::with_capacity(output.len());
        for (position, item) in std::mem::take(output).into_iter().enumerate() {
            if hide[position] {
                split.hidden.push((position, item));
            } else {
                visible.push(item);
            }
        }
        split.client_ids = hidden::item_call_ids(&visible)
            .into_iter()
            .map(str::to_owned)
            .collect();
        split.empty = split.client_ids.is_empty() && !visible.iter().any(has_text);
        *output = visible;
        split
    }

    fn transcript(&self, client_body: &Value) -> u128 {
        match client_body.get("input") {
            Some(Value::Array(items)) => hidden::Transcript::of_items(items).digest(),
            Some(Value::String(text)) => {
                hidden::Transcript::of_items(&[json!({"role": "user", "content": text})]).digest()
            }
            _ => hidden::Transcript::default().digest(),
        }
    }

    fn write_usage(&self, answer: &mut Value, usage: &Usage) {
        if answer.get("usage").is_some_and(|u| !u.is_null()) {
            usage.write_into(answer);
        }
    }

    fn scrub(&self, answer: &mut Value, names: &ToolNames) -> bool {
        scrub_tools(answer, names)
    }

    fn stream(&self, round: Round, first: Incoming) -> EventStream {
        loop_stream::spawn(round, first)
    }
}
