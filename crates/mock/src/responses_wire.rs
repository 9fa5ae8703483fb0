//! The Responses API wire format the mock writes (`docs/responses-wire.md`), shaped like the
//! real API key for key: the `response` object, its output items (`reasoning` with
//! `encrypted_content`, `message`, `function_call`, `custom_tool_call`), and the SSE events of a
//! streamed response, each `event: TYPE\ndata: JSON\n\n` with one strictly increasing
//! `sequence_number` and no `[DONE]`. Pure: a [`ResponseAnswer`] in, JSON or event bytes out.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::wire::{derived_id, split_arguments, split_even, split_words};

/// One output item of a response.
#[derive(Debug, Clone, PartialEq)]
pub enum OutItem {
    /// A reasoning item: its summary's text when the request asked for one
    /// (`reasoning.summary`), the encrypted content when the request included it.
    Reasoning {
        id: String,
        summary: Option<String>,
        encrypted_content: Option<String>,
    },
    /// The assistant's text.
    Message {
        id: String,
        text: String,
        chunks: Option<usize>,
    },
    /// A call of a function tool (arguments are JSON text).
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A call of a custom (freeform) tool (input is raw text).
    CustomToolCall {
        id: String,
        call_id: String,
        name: String,
        input: String,
    },
    /// The one item answering a final `compaction_trigger`: what came before, encrypted.
    Compaction {
        id: String,
        encrypted_content: String,
    },
}

/// The usage of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
    pub reasoning_tokens: usize,
}

impl ResponseUsage {
    pub fn to_json(self) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        })
    }
}

/// Everything needed to write one response, as JSON or as a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseAnswer {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub output: Vec<OutItem>,
    pub usage: ResponseUsage,
    /// Request fields the response object echoes (`instructions`, `tools`, `store`, …), in
    /// the API's key order, already defaulted.
    pub echo: Vec<(&'static str, Value)>,
    /// Whether delta events carry the `obfuscation` padding (the API's default).
    pub obfuscation: bool,
    /// Whether the request asked to run in the background (`background: true`): the stream
    /// then begins `queued` (`response.created` with status `queued`, `response.queued`)
    /// before `response.in_progress`, as the API's does.
    pub background: bool,
}

/// Ids in the API's form: a prefix and 48 hex digits derived from `seed`.
pub fn item_id(prefix: &str, seed: &[&str]) -> String {
    let raw = derived_id("", 48, seed);
    let hex: String = raw
        .bytes()
        .map(|b| char::from(b"0123456789abcdef"[usize::from(b) % 16]))
        .collect();
    format!("{prefix}{hex}")
}

/// How the mock's own `encrypted_content` starts (Fernet-looking, as the API's: `gAAAAB…`).
const SEALED: &str = "gAAAABmk";
/// Its body's and its check's lengths (126 characters in all, as the API's usually are).
const SEALED_BODY: usize = 102;
const SEALED_CHECK: usize = 16;

/// An `encrypted_content` the way the API shows it: Fernet-looking base64 (`gAAAAB…`),
/// deterministic per seed, and sealed: its last characters check the rest, so the mock knows
/// when one it wrote comes back changed ([`verified`]).
pub fn encrypted_content(seed: &[&str]) -> String {
    let body = derived_id("", SEALED_BODY, seed);
    let check = derived_id("", SEALED_CHECK, &[&body]);
    format!("{SEALED}{body}{check}")
}

/// Whether `content` is one the mock wrote, unchanged. Content the mock did not write (another
/// server's, a test's) has no seal and is taken as it is.
pub fn verified(content: &str) -> bool {
    let Some(rest) = content.strip_prefix(SEALED) else {
        return true;
    };
    rest.len() == SEALED_BODY + SEALED_CHECK
        && rest.is_char_boundary(SEALED_BODY)
        && derived_id("", SEALED_CHECK, &[&rest[..SEALED_BODY]]) == rest[SEALED_BODY..]
}

impl OutItem {
    /// The item as `response.output_item.done` and the final `output` show it.
    pub fn done(&self) -> Value {
        match self {
            OutItem::Reasoning {
                id,
                summary,
                encrypted_content,
            } => {
                let summary: Vec<Value> = summary.iter().map(|t| summary_text(t)).collect();
                let mut item = json!({"id": id, "type": "reasoning", "summary": summary});
                if let (Some(content), Value::Object(map)) = (encrypted_content, &mut item) {
                    map.insert("encrypted_content".into(), json!(content));
                }
                item
            }
            OutItem::Message { id, text, .. } => json!({
                "id": id,
                "type": "message",
                "status": "completed",
                "content": [output_text(text)],
                "role": "assistant",
            }),
            OutItem::FunctionCall {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id,
                "type": "function_call",
                "status": "completed",
                "arguments": arguments,
                "call_id": call_id,
                "name": name,
            }),
            OutItem::CustomToolCall {
                id,
                call_id,
                name,
                input,
            } => json!({
                "id": id,
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": call_id,
                "input": input,
                "name": name,
            }),
            OutItem::Compaction {
                id,
                encrypted_content,
            } => json!({"id": id, "type": "compaction", "encrypted_content": encrypted_content}),
        }
    }

    /// The item as `response.output_item.added` shows it: nothing generated yet.
    fn added(&self) -> Value {
        match self {
            OutItem::Reasoning { id, .. } => json!({"id": id, "type": "reasoning", "summary": []}),
            OutItem::Message { id, .. } => json!({
                "id": id, "type": "message", "status": "in_progress", "content": [],
                "role": "assistant",
            }),
            OutItem::FunctionCall {
                id, call_id, name, ..
            } => json!({
                "id": id, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": call_id, "name": name,
            }),
            OutItem::CustomToolCall {
                id, call_id, name, ..
            } => json!({
                "id": id, "type": "custom_tool_call", "status": "in_progress",
                "call_id": call_id, "input": "", "name": name,
            }),
            OutItem::Compaction { id, .. } => json!({"id": id, "type": "compaction"}),
        }
    }
}

fn summary_text(text: &str) -> Value {
    json!({"type": "summary_text", "text": text})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

/// Builds SSE events with one sequence counter.
struct Events {
    out: Vec<Bytes>,
    obfuscation: bool,
}

impl Events {
    /// Appends the event `kind` with `fields` after `type` and `sequence_number`.
    fn push(&mut self, kind: &str, fields: Value) {
        let mut data = Map::new();
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.out.len()));
        if let Value::Object(fields) = fields {
            data.extend(fields);
        }
        let data = Value::Object(data);
        self.out
            .push(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    /// A delta event: `fields` and, by default, the `obfuscation` padding the API adds so that
    /// a delta's length does not tell its content.
    fn delta(&mut self, kind: &str, mut fields: Value, delta: &str) {
        if self.obfuscation {
            let pad = 16usize.saturating_sub(delta.chars().count()).max(1);
            let seq = self.out.len().to_string();
            if let Value::Object(map) = &mut fields {
                map.insert(
                    "obfuscation".into(),
                    json!(derived_id("", pad, &[delta, &seq])),
                );
            }
        }
        self.push(kind, fields);
    }
}

impl ResponseAnswer {
    /// The `response` object, with `status` and the output given.
    fn object(&self, status: &str, output: Value, usage: Value) -> Value {
        let mut map = Map::new();
        map.insert("id".into(), json!(self.id));
        map.insert("object".into(), json!("response"));
        map.insert("created_at".into(), json!(self.created_at));
        map.insert("status".into(), json!(status));
        map.insert("background".into(), json!(self.background));
        map.insert("error".into(), Value::Null);
        map.insert("incomplete_details".into(), Value::Null);
        for (key, value) in &self.echo {
            if *key == "model" {
                continue;
            }
            map.insert((*key).into(), value.clone());
        }
        map.insert("model".into(), json!(self.model));
        map.insert("output".into(), output);
        map.insert("usage".into(), usage);
        Value::Object(map)
    }

    /// The completed `response` object.
    pub fn to_json(&self) -> Value {
        let output = self.output.iter().map(OutItem::done).collect();
        self.object("completed", Value::Array(output), self.usage.to_json())
    }

    /// The SSE events of the streamed response: `response.created`, `response.in_progress`,
    /// every item's events in order, `response.completed`.
    pub fn to_events(&self) -> Vec<Bytes> {
        let mut events = Events {
            out: Vec::new(),
            obfuscation: self.obfuscation,
        };
        let pending = self.object("in_progress", json!([]), Value::Null);
        if self.background {
            let queued = self.object("queued", json!([]), Value::Null);
            events.push("response.created", json!({ "response": queued }));
            events.push("response.queued", json!({ "response": queued }));
        } else {
            events.push("response.created", json!({ "response": pending }));
        }
        events.push("response.in_progress", json!({ "response": pending }));
        for (index, item) in self.output.iter().enumerate() {
            events.push(
                "response.output_item.added",
                json!({"output_index": index, "item": item.added()}),
            );
            match item {
                OutItem::Reasoning {
                    id,
                    summary: Some(summary),
                    ..
                } => {
                    // The summary part, its text in deltas, as the API streams it.
                    let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
                    let with = |extra: Value| {
                        let mut fields = at.clone();
                        if let (Value::Object(map), Value::Object(extra)) = (&mut fields, extra) {
                            map.extend(extra);
                        }
                        fields
                    };
                    events.push(
                        "response.reasoning_summary_part.added",
                        with(json!({"part": summary_text("")})),
                    );
                    for piece in split_words(summary) {
                        events.delta(
                            "response.reasoning_summary_text.delta",
                            with(json!({"delta": piece})),
                            piece,
                        );
                    }
                    events.push(
                        "response.reasoning_summary_text.done",
                        with(json!({"text": summary})),
                    );
                    events.push(
                        "response.reasoning_summary_part.done",
                        with(json!({"part": summary_text(summary)})),
                    );
                }
                OutItem::Reasoning { .. } | OutItem::Compaction { .. } => {}
                OutItem::Message { id, text, chunks } => {
                    let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                    let with = |extra: Value| {
                        let mut fields = at.clone();
                        if let (Value::Object(map), Value::Object(extra)) = (&mut fields, extra) {
                            map.extend(extra);
                        }
                        fields
                    };
                    events.push(
                        "response.content_part.added",
                        with(json!({"part": output_text("")})),
                    );
                    let pieces = match chunks {
                        Some(n) => split_even(text, *n),
                        None => split_words(text),
                    };
                    for piece in pieces {
                        events.delta(
                            "response.output_text.delta",
                            with(json!({"delta": piece, "logprobs": []})),
                            piece,
                        );
                    }
                    events.push(
                        "response.output_text.done",
                        with(json!({"text": text, "logprobs": []})),
                    );
                    events.push(
                        "response.content_part.done",
                        with(json!({"part": output_text(text)})),
                    );
                }
                OutItem::FunctionCall { id, arguments, .. } => {
                    for piece in split_arguments(arguments) {
                        events.delta(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": index, "delta": piece}),
                            piece,
                        );
                    }
                    events.push(
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": index, "arguments": arguments}),
                    );
                }
                OutItem::CustomToolCall { id, input, .. } => {
                    for piece in split_arguments(input) {
                        events.delta(
                            "response.custom_tool_call_input.delta",
                            json!({"item_id": id, "output_index": index, "delta": piece}),
                            piece,
                        );
                    }
                    events.push(
                        "response.custom_tool_call_input.done",
                        json!({"item_id": id, "output_index": index, "input": input}),
                    );
                }
            }
            events.push(
                "response.output_item.done",
                json!({"output_index": index, "item": item.done()}),
            );
        }
        events.push("response.completed", json!({"response": self.to_json()}));
        events.out
    }
}

/// The Responses API's answer to an input over the model's context window (it states no
/// limit).
pub fn context_length_exceeded() -> Value {
    super::wire::error_body(
        "Your input exceeds the context window of this model. Please adjust your input and try \
         again.",
        "invalid_request_error",
        Some("input"),
        Some("context_length_exceeded"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> ResponseAnswer {
        ResponseAnswer {
            id: item_id("resp_", &["r"]),
            created_at: 1_700_000_000,
            model: "gpt-5".into(),
            output: vec![
                OutItem::Reasoning {
                    id: item_id("rs_", &["1"]),
                    summary: None,
                    encrypted_content: Some(encrypted_content(&["1"])),
                },
                OutItem::Message {
                    id: item_id("msg_", &["1"]),
                    text: "Hello there".into(),
                    chunks: None,
                },
                OutItem::FunctionCall {
                    id: item_id("fc_", &["1"]),
                    call_id: "call_1".into(),
                    name: "shell".into(),
                    arguments: r#"{"cmd":"ls -la"}"#.into(),
                },
            ],
            usage: ResponseUsage {
                input_tokens: 100,
                cached_tokens: 0,
                output_tokens: 10,
                reasoning_tokens: 0,
            },
            echo: vec![("store", json!(false))],
            obfuscation: true,
            background: false,
        }
    }

    fn data(event: &Bytes) -> (String, Value) {
        let text = std::str::from_utf8(event).unwrap();
        let (head, data) = text.split_once('\n').unwrap();
        let kind = head.strip_prefix("event: ").unwrap().to_string();
        let data = data.strip_prefix("data: ").unwrap().trim_end();
        (kind, serde_json::from_str(data).unwrap())
    }

    #[test]
    fn events_are_numbered_and_ordered_like_the_api() {
        let events: Vec<(String, Value)> = answer().to_events().iter().map(data).collect();
        for (n, (kind, data)) in events.iter().enumerate() {
            assert_eq!(&data["type"], kind);
            assert_eq!(data["sequence_number"], n);
        }
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds[0], "response.created");
        assert_eq!(kinds[1], "response.in_progress");
        assert_eq!(*kinds.last().unwrap(), "response.completed");
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "response.output_item.added")
                .count(),
            3
        );
        let text: String = events
            .iter()
            .filter(|(k, _)| k == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text, "Hello there");
        let args: String = events
            .iter()
            .filter(|(k, _)| k == "response.function_call_arguments.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(args, r#"{"cmd":"ls -la"}"#);
        assert!(events
            .iter()
            .filter(|(k, _)| k.ends_with(".delta"))
            .all(|(_, d)| d["obfuscation"].is_string()));
        let done = &events.last().unwrap().1["response"];
        assert_eq!(
            done["output"][0]["encrypted_content"]
                .as_str()
                .unwrap()
                .len(),
            126
        );
        assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 0);
    }

    #[test]
    fn a_background_stream_is_queued_first_and_summaries_stream_in_parts() {
        let mut answer = answer();
        answer.background = true;
        answer.output[0] = OutItem::Reasoning {
            id: item_id("rs_", &["1"]),
            summary: Some("**Plan**\n\nRead the file.".into()),
            encrypted_content: None,
        };
        let events: Vec<(String, Value)> = answer.to_events().iter().map(data).collect();
        let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds[..5],
            [
                "response.created",
                "response.queued",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_summary_part.added",
            ]
        );
        assert_eq!(events[0].1["response"]["status"], "queued");
        assert_eq!(events[1].1["response"]["status"], "queued");
        assert_eq!(events[2].1["response"]["status"], "in_progress");
        assert_eq!(events[0].1["response"]["background"], true);
        let summary: String = events
            .iter()
            .filter(|(k, _)| k == "response.reasoning_summary_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(summary, "**Plan**\n\nRead the file.");
        let at = kinds
            .iter()
            .position(|k| *k == "response.reasoning_summary_part.done")
            .unwrap();
        assert_eq!(kinds[at + 1], "response.output_item.done");
        let done = &events[at + 1].1["item"];
        assert_eq!(done["summary"][0]["type"], "summary_text");
        assert_eq!(done["summary"][0]["text"], "**Plan**\n\nRead the file.");
        assert!(events
            .iter()
            .all(|(_, d)| d["output_index"].is_null() || d["output_index"].is_u64()));
    }

    #[test]
    fn ids_look_like_the_apis() {
        let id = item_id("msg_", &["x"]);
        assert_eq!(id.len(), 52);
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(id, item_id("msg_", &["y"]));
    }
}
