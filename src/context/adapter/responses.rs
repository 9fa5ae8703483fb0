//! The Responses API adapter (`POST /v1/responses`, `docs/responses-wire.md`): `input` is the
//! conversation, one input item per item (a string `input` is no conversation to manage).
//! `instructions` stays outside it, counted and never touched.
//!
//! - `message` items (with or without `type`) map by role: `system`/`developer` are
//!   instructions, `user` and `assistant` the turns;
//! - a call (`function_call`, `custom_tool_call`, `local_shell_call`, `shell_call`,
//!   `apply_patch_call`, `computer_call`) is a tool call answered by the output items
//!   (`*_output`) with the same `call_id`; a run of calls side by side (parallel calls) reads as
//!   one tool call item: each call but the last is bound to the next, the last carries every
//!   id of the run, so the run and its outputs form one unit;
//! - a `reasoning` item is bound to the item after it (it moves with the message or call it
//!   reasons for, byte for byte: its `encrypted_content` is never rewritten);
//! - every other item is opaque and free; the ones the proxy must not move out (a `compaction`
//!   item, an `item_reference`, a type it does not know) say so through
//!   [`Adapter::immovable`].
//!
//! The text the engine may shorten is a message's `content` or an output's `output`: a string,
//! or an array made only of text parts (`input_text`, `output_text`).

use std::borrow::Cow;

use serde_json::Value;

use super::{scan, Adapter, Readable, Spans};
use crate::context::model::{Binding, Item, Kind};
use crate::tokens::{field, str_field, Counter, RequestCount};

/// The Responses API (`POST /v1/responses`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Responses;

/// Every input item type the API accepts (its own error message lists them).
pub const ITEM_TYPES: [&str; 27] = [
    "apply_patch_call",
    "apply_patch_call_output",
    "code_interpreter_call",
    "compaction",
    "compaction_trigger",
    "computer_call",
    "computer_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "file_search_call",
    "function_call",
    "function_call_output",
    "image_generation_call",
    "item_reference",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "mcp_list_tools",
    "message",
    "reasoning",
    "shell_call",
    "shell_call_output",
    "tool_search_call",
    "tool_search_output",
    "web_search_call",
];

/// Calls the client answers with an output item of the same `call_id`.
const CALLS: [&str; 6] = [
    "function_call",
    "custom_tool_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "computer_call",
];

/// The output items answering them.
const OUTPUTS: [&str; 6] = [
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "shell_call_output",
    "apply_patch_call_output",
    "computer_call_output",
];

/// Text part types of message content and outputs.
const TEXT_PARTS: [&str; 2] = ["input_text", "output_text"];

/// The type of an input item: its `type`, or `message` for a message that omits it; `None`
/// for what is not an item.
pub fn item_type(item: &Value) -> Option<&str> {
    match field(item, "type") {
        Some(Value::String(kind)) => Some(kind),
        Some(_) => None,
        None => field(item, "role").is_some().then_some("message"),
    }
}

/// The field holding an item's text: a message's `content`, an output's `output`.
fn text_field(item: &Value) -> Option<&'static str> {
    match item_type(item)? {
        "message" => Some("content"),
        kind if OUTPUTS.contains(&kind) => Some("output"),
        _ => None,
    }
}

/// A string, or an array made only of text parts, as one text.
fn joined_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Array(parts) if !parts.is_empty() => {
            let texts: Option<Vec<&str>> = parts
                .iter()
                .map(|p| match str_field(p, "type") {
                    Some(kind) if TEXT_PARTS.contains(&kind) => str_field(p, "text"),
                    _ => None,
                })
                .collect();
            Some(Cow::Owned(texts?.join("\n")))
        }
        _ => None,
    }
}

impl Adapter for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn count(&self, counter: &Counter, body: &Value) -> RequestCount {
        counter.count_responses_request(body)
    }

    fn payloads<'b>(&self, body: &'b Value) -> Option<Cow<'b, [Value]>> {
        body.get("input")
            .and_then(Value::as_array)
            .map(|items| Cow::Borrowed(items.as_slice()))
    }

    fn kind<'v>(&self, item: &'v Value) -> Kind<'v> {
        if !item.is_object() {
            return Kind::Invalid;
        }
        let Some(kind) = item_type(item) else {
            return Kind::Invalid;
        };
        let call_id = || str_field(item, "call_id");
        match kind {
            "message" => match str_field(item, "role") {
                Some("system" | "developer") => Kind::Instructions,
                Some("user") => Kind::User,
                Some("assistant") => Kind::Assistant,
                _ => Kind::Invalid,
            },
            "reasoning" => Kind::Opaque(Binding::Next),
            kind if CALLS.contains(&kind) => match call_id() {
                Some(id) => Kind::ToolCalls(vec![id]),
                None => Kind::Invalid,
            },
            // Its pairing field is `id` in the API's schema, `call_id` as Codex sends it.
            "local_shell_call_output" => match call_id().or_else(|| str_field(item, "id")) {
                Some(id) => Kind::ToolResult(id),
                None => Kind::Invalid,
            },
            kind if OUTPUTS.contains(&kind) => match call_id() {
                Some(id) => Kind::ToolResult(id),
                None => Kind::Invalid,
            },
            _ => Kind::Opaque(Binding::Free),
        }
    }

    fn items<'v>(
        &self,
        payloads: &'v [Value],
        counts: &[usize],
        hashes: &[u128],
        spans: Option<&[std::ops::Range<usize>]>,
    ) -> Vec<Item<'v>> {
        let mut items: Vec<Item<'v>> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Item {
                kind: self.kind(p),
                tokens: counts.get(i).copied().unwrap_or(0),
                hash: hashes.get(i).copied().unwrap_or(0),
                span: spans.and_then(|s| s.get(i).cloned()),
            })
            .collect();
        // A run of calls side by side: each bound to the next, the last carrying every id.
        let mut i = 0;
        while i < items.len() {
            let mut end = i;
            while end + 1 < items.len()
                && matches!(items[end].kind, Kind::ToolCalls(_))
                && matches!(items[end + 1].kind, Kind::ToolCalls(_))
            {
                end += 1;
            }
            if end > i {
                let mut ids = Vec::with_capacity(end + 1 - i);
                for item in &mut items[i..end] {
                    if let Kind::ToolCalls(mut own) =
                        std::mem::replace(&mut item.kind, Kind::Opaque(Binding::Next))
                    {
                        ids.append(&mut own);
                    }
                }
                if let Kind::ToolCalls(last) = &items[end].kind {
                    ids.extend(last.iter().copied());
                }
                items[end].kind = Kind::ToolCalls(ids);
            }
            i = end + 1;
        }
        items
    }

    fn immovable(&self, item: &Value) -> Option<String> {
        match item_type(item)? {
            "compaction" => Some("input holds a `compaction` item, sealed by its maker".into()),
            "item_reference" => Some("input holds an `item_reference` (server-side state)".into()),
            kind if !ITEM_TYPES.contains(&kind) => {
                Some(format!("input item type `{kind}` is unknown to the proxy"))
            }
            _ => None,
        }
    }

    fn text<'v>(&self, item: &'v Value) -> Option<Cow<'v, str>> {
        joined_text(field(item, text_field(item)?)?)
    }

    fn readable<'v>(&self, item: &'v Value) -> Readable<'v> {
        let Some(kind) = item_type(item) else {
            return Readable::default();
        };
        let call_id = str_field(item, "call_id").unwrap_or("");
        match kind {
            "message" => Readable {
                who: Cow::Borrowed(str_field(item, "role").unwrap_or("")),
                text: self.text(item),
                ..Readable::default()
            },
            kind if CALLS.contains(&kind) => {
                // What the call asks: its arguments, a custom tool's input, a shell action.
                let asked = match (field(item, "arguments"), field(item, "input")) {
                    (Some(Value::String(a)), _) | (_, Some(Value::String(a))) => a.clone(),
                    _ => field(item, "action")
                        .map(Value::to_string)
                        .unwrap_or_default(),
                };
                let name = str_field(item, "name").unwrap_or(kind);
                Readable {
                    who: Cow::Borrowed("assistant"),
                    calls: vec![format!("{call_id} {name}({asked})")],
                    ..Readable::default()
                }
            }
            kind if OUTPUTS.contains(&kind) => Readable {
                who: Cow::Borrowed("tool"),
                answers: str_field(item, "call_id"),
                text: self
                    .text(item)
                    .or_else(|| field(item, "output").map(|o| Cow::Owned(o.to_string()))),
                ..Readable::default()
            },
            // Reasoning is encrypted; other items say only what they are.
            kind => Readable {
                who: Cow::Borrowed(kind),
                ..Readable::default()
            },
        }
    }

    fn whole_text<'v>(&self, item: &'v Value) -> Option<&'v str> {
        str_field(item, text_field(item)?)
    }

    fn with_text(&self, item: &Value, text: String) -> Value {
        let mut item = item.clone();
        if let Some(slot) = text_field(&item).and_then(|key| item.get_mut(key)) {
            *slot = Value::String(text);
        }
        item
    }

    fn marker(&self, text: String) -> Value {
        serde_json::json!({"type": "message", "role": "user", "content": text})
    }

    fn spans(&self, raw: &[u8]) -> Option<Spans> {
        let list = scan::member(raw, b"input")?;
        let items = scan::elements(raw, list.clone())?;
        Some(Spans { list, items })
    }

    fn write(&self, body: &mut Value, items: Vec<Value>) {
        if let Some(slot) = body.get_mut("input") {
            *slot = Value::Array(items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::adapter::{splice, Piece};
    use crate::context::model::units;
    use serde_json::json;

    const BODY: &str = r#"{"model":"gpt-5","instructions":"Be a coder.",
 "input":[
  {"role":"developer","content":"<env/>"},
  {"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"}]},
  {"type":"reasoning","summary":[],"encrypted_content":"gAAAAB\u002b=="},
  {"type":"function_call","call_id":"c1","name":"shell","arguments":"{\"cmd\":\"ls\"}"},
  {"type":"function_call","call_id":"c2","name":"shell","arguments":"{}"},
  {"type":"function_call_output","call_id":"c2","output":"two"},
  {"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"one"}]},
  {"type":"custom_tool_call","call_id":"p1","name":"apply_patch","input":"*** Begin Patch"},
  {"type":"custom_tool_call_output","call_id":"p1","output":"ok"},
  {"type":"web_search_call","id":"ws_1","status":"completed"},
  {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]},
  {"type":"future_item","x":1}
 ],
 "store":false}"#;

    fn body() -> Value {
        serde_json::from_str(BODY).unwrap()
    }

    #[test]
    fn items_in() {
        let body = body();
        let payloads = Responses.payloads(&body).unwrap();
        let items = Responses.items(&payloads, &[], &[], None);
        let kinds: Vec<Kind<'_>> = items.iter().map(|i| i.kind.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::Instructions,
                Kind::User,
                Kind::Opaque(Binding::Next),
                Kind::Opaque(Binding::Next),
                Kind::ToolCalls(vec!["c1", "c2"]),
                Kind::ToolResult("c2"),
                Kind::ToolResult("c1"),
                Kind::ToolCalls(vec!["p1"]),
                Kind::ToolResult("p1"),
                Kind::Opaque(Binding::Free),
                Kind::Assistant,
                Kind::Opaque(Binding::Free),
            ]
        );
        // The reasoning, both calls and their outputs are one unit.
        assert_eq!(
            units(&items).unwrap(),
            vec![0..1, 1..2, 2..7, 7..9, 9..10, 10..11, 11..12]
        );
        assert_eq!(Responses.text(&payloads[1]).unwrap(), "fix it");
        assert_eq!(Responses.text(&payloads[6]).unwrap(), "one");
        assert_eq!(Responses.whole_text(&payloads[5]), Some("two"));
        assert_eq!(Responses.whole_text(&payloads[6]), None);
        assert!(!Responses.has_text(&payloads[3]));
        assert!(!Responses.has_text(&payloads[2]));
        assert_eq!(Responses.immovable(&payloads[9]), None);
        assert!(Responses
            .immovable(&payloads[11])
            .unwrap()
            .contains("future_item"));
        assert!(Responses
            .immovable(&json!({"type": "compaction", "encrypted_content": "x"}))
            .is_some());
        assert_eq!(Responses.kind(&json!("text")), Kind::Invalid);
        assert_eq!(Responses.kind(&json!({"content": "x"})), Kind::Invalid);
        assert_eq!(
            Responses.kind(&json!({"type": "function_call", "name": "f"})),
            Kind::Invalid
        );
        assert!(Responses.payloads(&json!({"input": "hi"})).is_none());
    }

    #[test]
    fn orphans_and_separated_reasoning_are_malformed() {
        let orphan = json!([{"role": "user", "content": "x"},
            {"type": "function_call_output", "call_id": "c", "output": "r"}]);
        let items = Responses.items(orphan.as_array().unwrap(), &[], &[], None);
        assert!(units(&items).is_err());
        let unanswered = json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "x"}]);
        let items = Responses.items(unanswered.as_array().unwrap(), &[], &[], None);
        assert!(units(&items).is_err());
        let dangling =
            json!([{"role": "user", "content": "x"}, {"type": "reasoning", "summary": []}]);
        let items = Responses.items(dangling.as_array().unwrap(), &[], &[], None);
        assert!(units(&items).is_err());
    }

    #[test]
    fn items_out_keep_every_other_field() {
        let mut body = body();
        let payloads = Responses.payloads(&body).unwrap().into_owned();
        let shorter = Responses.with_text(&payloads[6], "1".into());
        assert_eq!(
            shorter,
            json!({"type":"function_call_output","call_id":"c1","output":"1"})
        );
        let marker = Responses.marker("moved".into());
        Responses.write(&mut body, vec![payloads[0].clone(), marker, shorter]);
        assert_eq!(body["input"][1]["role"], "user");
        let keys: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["model", "instructions", "input", "store"]);
    }

    #[test]
    fn an_untouched_request_round_trips_byte_for_byte() {
        let raw = BODY.as_bytes();
        let body = body();
        let spans = Responses.spans(raw).unwrap();
        let payloads = Responses.payloads(&body).unwrap();
        assert_eq!(spans.items.len(), payloads.len());
        let kept: Vec<Piece<'_>> = (0..payloads.len()).map(Piece::Kept).collect();
        assert_eq!(splice(raw, &spans, &kept), raw);
        let new = Responses.with_text(&payloads[5], "2".into());
        let mut pieces = kept.clone();
        pieces[5] = Piece::New(&new);
        let text = String::from_utf8(splice(raw, &spans, &pieces)).unwrap();
        // The encrypted content keeps its escape, byte for byte.
        assert!(text.contains(r#""encrypted_content":"gAAAAB\u002b==""#));
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reparsed["input"][5], new);
    }
}
