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

    /// A stream shows each round's items as they come (text cannot be unsent): the JSON
    /// answer holds them too, so both modes give the client the same items.
    fn shows_earlier_rounds(&self) -> bool {
        true
    }

    /// The client's items of the `earlier` rounds (each called only the proxy's tools), in
    /// order, before the final answer's own; the response keeps the first round's `id` and
    /// `created_at`, as a stream does.
    fn merge(&self, answer: &mut Value, earlier: &[Value], is_proxy: &dyn Fn(&str) -> bool) {
        if earlier.is_empty() {
            return;
        }
        let mut output: Vec<Value> = earlier
            .iter()
            .filter_map(|a| a.get("output").and_then(Value::as_array))
            .flat_map(|items| shown_of_proxy_round(items, is_proxy))
            .collect();
        let Value::Object(map) = answer else {
            return;
        };
        if let Some(Value::Array(last)) = map.get_mut("output") {
            output.append(last);
        }
        map.insert("output".into(), Value::Array(output));
        if let Some(Value::Object(first)) = earlier.first() {
            for key in ["id", "created_at"] {
                if let Some(value) = first.get(key) {
                    map.insert(key.into(), value.clone());
                }
            }
        }
    }
}

/// What the client gets of the output of a round that called only the proxy's tools: every
/// item but those calls, the reasoning bound to them, and a reasoning item ending the round
/// (upstream, the proxy's outputs follow it; `loop_stream.rs` holds it back the same way).
fn shown_of_proxy_round(output: &[Value], is_proxy: &dyn Fn(&str) -> bool) -> Vec<Value> {
    let hide = hidden_positions(output, is_proxy);
    let shown: Vec<&Value> = output
        .iter()
        .zip(hide)
        .filter(|(_, hidden)| !hidden)
        .map(|(item, _)| item)
        .collect();
    let end = shown
        .iter()
        .rposition(|item| item.get("type").and_then(Value::as_str) != Some("reasoning"))
        .map_or(0, |at| at + 1);
    shown[..end].iter().map(|item| (*item).clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An output item: 0 reasoning, 1 a message, 2 a call of the proxy's tool, 3 the client's.
    fn item(kind: u8, n: usize) -> Value {
        match kind {
            0 => {
                json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [], "encrypted_content": format!("gAAAAB{n}")})
            }
            1 => {
                json!({"type": "message", "id": format!("msg_{n}"), "role": "assistant", "content": [{"type": "output_text", "text": format!("text {n}")}]})
            }
            2 => {
                json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_p{n}"), "name": "context_read", "arguments": "{}"})
            }
            _ => {
                json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_c{n}"), "name": "shell", "arguments": "{}"})
            }
        }
    }

    proptest! {
        /// A mixed answer split for the client and put back next turn: the client's items
        /// keep their order, every reasoning item hidden reasons for a proxy call, and the
        /// model's view comes back whole, byte for byte, with every call answered.
        #[test]
        fn a_split_answer_comes_back_whole(kinds in proptest::collection::vec(0u8..4, 1..12)) {
            let mut kinds = kinds;
            kinds.push(3); // mixed: at least one call of the client's
            kinds.insert(0, 2);
            let output: Vec<Value> = kinds.iter().enumerate().map(|(n, k)| item(*k, n)).collect();
            let input = vec![json!({"role": "user", "content": "go"})];
            let is_proxy = |name: &str| name == "context_read";
            let mut answer = json!({ "output": output.clone() });
            let split = ResponsesLoop.split(&mut answer, &is_proxy);
            let visible = answer["output"].as_array().unwrap().clone();
            // What the client sees: no call of the proxy's, its items in order.
            prop_assert!(visible.iter().all(|i| i["name"] != "context_read"));
            let expected: Vec<&Value> = output.iter().filter(|i| !split.hidden.iter().any(|(_, h)| h == *i)).collect();
            prop_assert_eq!(visible.iter().collect::<Vec<_>>(), expected);
            // A hidden reasoning item reasons for a proxy call; a shown one never does.
            for (n, i) in output.iter().enumerate() {
                if i["type"] != "reasoning" {
                    continue;
                }
                let next = output[n..].iter().find(|j| j["type"] != "reasoning");
                let for_proxy = next.is_some_and(|j| j["name"] == "context_read");
                prop_assert_eq!(split.hidden.iter().any(|(_, h)| h == i), for_proxy);
            }
            // Next turn: the client's history with its own outputs; the proxy's come back.
            let results: Vec<Value> = calls(&output)
                .iter()
                .filter(|c| is_proxy(&c.name))
                .map(|c| ResponsesLoop.result(c, format!("read {}", c.id)))
                .collect();
            let exchange = hidden::Exchange {
                key: hidden::key_of(
                    ResponsesLoop.transcript(&json!({ "input": input.clone() })),
                    split.client_ids.iter().map(String::as_str),
                ),
                calls: split.hidden,
                results: results.clone(),
            };
            let client_outputs: Vec<Value> = split
                .client_ids
                .iter()
                .map(|id| json!({"type": "function_call_output", "call_id": id, "output": "ok"}))
                .collect();
            let mut next: Vec<Value> = input.clone();
            next.extend(visible);
            next.extend(client_outputs.clone());
            prop_assert_eq!(hidden::restore_items(std::slice::from_ref(&exchange), &mut next), 1);
            let mut whole = input;
            whole.extend(output);
            whole.extend(results);
            whole.extend(client_outputs);
            let bytes = |items: &[Value]| items.iter().map(Value::to_string).collect::<Vec<_>>();
            prop_assert_eq!(bytes(&next), bytes(&whole));
        }
    }
}
