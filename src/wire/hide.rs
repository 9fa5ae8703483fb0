//! Hiding some tool calls of a stream from the client: their fragments are dropped from each
//! chunk, and the other calls are renumbered so the client sees `index` 0, 1, … without gaps
//! (clients such as the OpenAI SDKs place a fragment by its `index`: a gap would misplace it).

use std::collections::HashMap;

use serde_json::Value;

use super::accumulate::ToolCallDelta;

/// What [`ToolCallFilter::apply`] did to a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtered {
    /// Nothing: relay the event's raw bytes.
    Unchanged,
    /// Fragments were dropped or renumbered: send the rewritten chunk.
    Changed,
    /// Only hidden fragments were there: the chunk tells the client nothing (no text, no
    /// visible call, no finish reason, no usage); drop the event.
    Emptied,
}

/// The client-side numbering of the visible calls of one stream.
#[derive(Debug, Default)]
pub struct ToolCallFilter {
    /// (choice, call) → the `index` the client sees.
    client_index: HashMap<(u64, usize), u64>,
    /// Per choice, the next client `index`.
    next: HashMap<u64, u64>,
}

impl ToolCallFilter {
    pub fn new() -> ToolCallFilter {
        ToolCallFilter::default()
    }

    /// Rewrites `chunk`, whose fragments are `deltas` (what
    /// [`ChatAccumulator::push`](super::ChatAccumulator::push) returned for it): drops those
    /// `hide` selects, renumbers the rest.
    pub fn apply(
        &mut self,
        chunk: &mut Value,
        deltas: &[ToolCallDelta],
        hide: impl Fn(&ToolCallDelta) -> bool,
    ) -> Filtered {
        if deltas.is_empty() {
            return Filtered::Unchanged;
        }
        // Number the visible calls front to back (the order they start in), then edit back to
        // front, so removing an entry leaves the earlier positions valid.
        let plan: Vec<Option<u64>> = deltas
            .iter()
            .map(|d| (!hide(d)).then(|| self.client_index(d)))
            .collect();
        let mut changed = false;
        let mut dropped = false;
        for (delta, client) in deltas.iter().zip(plan).rev() {
            let Some(calls) = tool_calls_of(chunk, delta.choice) else {
                continue;
            };
            if delta.entry >= calls.len() {
                continue;
            }
            let Some(client) = client else {
                calls.remove(delta.entry);
                changed = true;
                dropped = true;
                continue;
            };
            let entry = &mut calls[delta.entry];
            if entry.get("index").and_then(Value::as_u64) != Some(client) {
                entry["index"] = client.into();
                changed = true;
            }
        }
        if !changed {
            return Filtered::Unchanged;
        }
        if dropped && remove_empty_tool_calls(chunk) {
            return Filtered::Emptied;
        }
        Filtered::Changed
    }

    fn client_index(&mut self, delta: &ToolCallDelta) -> u64 {
        // Calls start in stream order, so numbering at first sight keeps the client's order.
        if let Some(&index) = self.client_index.get(&(delta.choice, delta.call)) {
            return index;
        }
        let next = self.next.entry(delta.choice).or_insert(0);
        let index = *next;
        *next += 1;
        self.client_index.insert((delta.choice, delta.call), index);
        index
    }
}

/// `choices[i].delta.tool_calls` of the choice with `index`.
fn tool_calls_of(chunk: &mut Value, choice: u64) -> Option<&mut Vec<Value>> {
    chunk
        .get_mut("choices")?
        .as_array_mut()?
        .iter_mut()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == choice)?
        .get_mut("delta")?
        .get_mut("tool_calls")?
        .as_array_mut()
}

/// Removes `tool_calls: []` left by hiding; true when no choice says anything any more and
/// the chunk has no usage.
fn remove_empty_tool_calls(chunk: &mut Value) -> bool {
    let mut empty = chunk.get("usage").is_none_or(Value::is_null);
    let choices = chunk.get_mut("choices").and_then(Value::as_array_mut);
    for choice in choices.into_iter().flatten() {
        if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
            if delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
            {
                delta.remove("tool_calls");
            }
            let silent = delta
                .iter()
                .all(|(key, value)| value.is_null() || (key == "content" && value == ""));
            empty &= silent;
        }
        empty &= choice.get("finish_reason").is_none_or(Value::is_null);
    }
    empty
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::TOOL_CALL_STREAM;
    use crate::wire::{ChatAccumulator, SseReader};
    use serde_json::json;

    /// Relays `stream` hiding the calls named `hidden`: what the client receives.
    fn relay_hiding(stream: &str, hidden: &str) -> (String, Vec<Filtered>) {
        let mut reader = SseReader::default();
        let mut acc = ChatAccumulator::new();
        let mut filter = ToolCallFilter::new();
        let (mut out, mut outcomes) = (String::new(), Vec::new());
        for event in reader.feed(stream.as_bytes()) {
            let event = event.unwrap();
            let Some(data) = event.data.as_deref().filter(|_| !event.is_done()) else {
                out.push_str(std::str::from_utf8(&event.raw).unwrap());
                continue;
            };
            let mut chunk: Value = serde_json::from_str(data).unwrap();
            let deltas = acc.push(&chunk).unwrap();
            let hide = |d: &ToolCallDelta| acc.tool_call(d.choice, d.call).unwrap().name == hidden;
            let outcome = filter.apply(&mut chunk, &deltas, hide);
            outcomes.push(outcome);
            match outcome {
                Filtered::Unchanged => out.push_str(std::str::from_utf8(&event.raw).unwrap()),
                Filtered::Changed => out.push_str(&format!("data: {chunk}\n\n")),
                Filtered::Emptied => {}
            }
        }
        (out, outcomes)
    }

    fn assemble(stream: &str) -> Value {
        let mut reader = SseReader::default();
        let mut acc = ChatAccumulator::new();
        for event in reader.feed(stream.as_bytes()) {
            acc.push_event(&event.unwrap()).unwrap();
        }
        acc.to_completion()
    }

    #[test]
    fn the_client_never_sees_a_hidden_call_and_the_others_are_renumbered() {
        let (out, outcomes) = relay_hiding(TOOL_CALL_STREAM, "context_read");
        use Filtered::*;
        assert_eq!(
            outcomes,
            [
                Unchanged, Emptied, Emptied, Changed, Emptied, Changed, Changed, Unchanged,
                Unchanged
            ]
        );
        assert!(!out.contains("context_read") && !out.contains("ctx_abc"));
        let message = &assemble(&out)["choices"][0]["message"];
        assert_eq!(
            message["tool_calls"],
            json!([{"id": "call_bY2", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}])
        );
        assert!(out.contains(r#""tool_calls":[{"index":0,"id":"call_bY2""#));

        // Hiding nothing relays every event byte for byte.
        let (out, _) = relay_hiding(TOOL_CALL_STREAM, "no_such_tool");
        assert_eq!(out, TOOL_CALL_STREAM);
    }

    #[test]
    fn calls_new_in_one_chunk_keep_their_order_and_reused_indices_are_made_distinct() {
        let mut acc = ChatAccumulator::new();
        let mut filter = ToolCallFilter::new();
        let mut chunk = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}},
            {"index": 0, "id": "h", "function": {"name": "context_search", "arguments": ""}},
            {"index": 0, "id": "b", "function": {"name": "g", "arguments": ""}}]}}]});
        let deltas = acc.push(&chunk).unwrap();
        let hide = |d: &ToolCallDelta| {
            acc.tool_call(d.choice, d.call)
                .unwrap()
                .name
                .starts_with("context_")
        };
        assert_eq!(filter.apply(&mut chunk, &deltas, hide), Filtered::Changed);
        let calls = &chunk["choices"][0]["delta"]["tool_calls"];
        assert_eq!(
            (calls[0]["id"].clone(), calls[0]["index"].clone()),
            (json!("a"), json!(0))
        );
        assert_eq!(
            (calls[1]["id"].clone(), calls[1]["index"].clone()),
            (json!("b"), json!(1))
        );
        assert_eq!(calls.as_array().unwrap().len(), 2);

        // A chunk of only a hidden fragment but with a finish reason still goes out.
        let mut chunk = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "h", "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}]});
        let deltas = acc.push(&chunk).unwrap();
        let hide = |d: &ToolCallDelta| {
            acc.tool_call(d.choice, d.call)
                .unwrap()
                .name
                .starts_with("context_")
        };
        assert_eq!(filter.apply(&mut chunk, &deltas, hide), Filtered::Changed);
        assert_eq!(
            chunk,
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        );
    }
}
