//! Chat completions' side of the tool loop ([`crate::routes::tool_loop`]): the calls are the
//! assistant message's `tool_calls`, a result is a `tool` message, a round appends the
//! assistant message and its results to `messages`; streams are relayed chunk by chunk
//! (`loop_stream.rs`).

use serde_json::{json, Value};

use super::loop_stream::{self, assistant_message};
use crate::proxy_tools::{self, hidden, ToolNames};
use crate::routes::tool_loop::{EventStream, LoopWire, Round, Split, Turn};
use crate::upstream::Incoming;
use crate::wire::{Completion, ToolCall, Usage};

/// The tool loop on chat completions.
pub struct ChatLoop;

impl LoopWire for ChatLoop {
    fn inject(&self, body: &mut Value, names: &ToolNames) {
        proxy_tools::inject(body, names);
    }

    fn remove_tools(&self, body: &mut Value, names: &ToolNames, client_had_tools: bool) {
        proxy_tools::remove(body, names, client_had_tools);
    }

    fn answer(&self, body: &Value) -> Option<Turn> {
        let completion = Completion::from_json(body).ok()?;
        let calls = completion
            .choices
            .first()
            .map(|c| c.tool_calls.clone())
            .unwrap_or_default();
        Some(Turn {
            calls,
            usage: completion.usage,
        })
    }

    fn continued(&self, answer: &Value, turn: &Turn) -> Vec<Value> {
        let content = Completion::from_json(answer)
            .ok()
            .and_then(|c| c.choices.into_iter().next())
            .and_then(|c| c.content);
        vec![assistant_message(content.as_deref(), &turn.calls)]
    }

    fn result(&self, call: &ToolCall, text: String) -> Value {
        json!({"role": "tool", "tool_call_id": call.id, "content": text})
    }

    fn append_round(&self, body: &mut Value, output: Vec<Value>, results: Vec<Value>) {
        if let Some(Value::Array(messages)) = body.get_mut("messages") {
            messages.extend(output);
            messages.extend(results);
        }
    }

    fn split(&self, answer: &mut Value, is_proxy: &dyn Fn(&str) -> bool) -> Split {
        let Some(message) = answer.pointer_mut("/choices/0/message") else {
            return Split {
                empty: true,
                ..Split::default()
            };
        };
        let (mut visible, hidden) = hidden::split(message, is_proxy);
        let client_ids: Vec<String> = hidden::call_ids(&visible)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let has_text = visible
            .get("content")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.trim().is_empty());
        let plain = client_ids.is_empty();
        if plain {
            // An empty `tool_calls` array is refused by the API when the client sends it back.
            if let Value::Object(map) = &mut visible {
                map.remove("tool_calls");
            }
        }
        *message = visible;
        if plain {
            if let Some(reason) = answer.pointer_mut("/choices/0/finish_reason") {
                *reason = Value::from("stop");
            }
        }
        Split {
            hidden,
            client_ids,
            empty: plain && !has_text,
        }
    }

    fn transcript(&self, client_body: &Value) -> u128 {
        match client_body.get("messages") {
            Some(Value::Array(list)) => hidden::Transcript::of(list).digest(),
            _ => hidden::Transcript::default().digest(),
        }
    }

    fn write_usage(&self, answer: &mut Value, usage: &Usage) {
        if answer.get("usage").is_some_and(|u| !u.is_null()) {
            usage.write_into(answer);
        }
    }

    fn stream(&self, round: Round, first: Incoming) -> EventStream {
        loop_stream::spawn(round, first)
    }

    /// A stream shows each round's text as it comes, as deltas of the one message the client
    /// accumulates; the JSON answer holds the same text.
    fn shows_earlier_rounds(&self) -> bool {
        true
    }

    /// The earlier rounds' text, in order, before the final message's own (no separator: a
    /// streaming client joins the deltas as they come).
    fn merge(&self, answer: &mut Value, earlier: &[Value], _is_proxy: &dyn Fn(&str) -> bool) {
        let before: String = earlier
            .iter()
            .filter_map(|a| a.pointer("/choices/0/message/content"))
            .filter_map(Value::as_str)
            .collect();
        if before.is_empty() {
            return;
        }
        if let Some(message) = answer.pointer_mut("/choices/0/message") {
            let own = message.get("content").and_then(Value::as_str).unwrap_or("");
            message["content"] = Value::from(before + own);
        }
    }
}
