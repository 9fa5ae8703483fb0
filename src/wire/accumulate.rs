//! A chat completion assembled from its stream chunks, or read from a non-streaming body: one
//! view of what the model answered (per choice: role, content, refusal, tool calls, finish
//! reason) and of what it cost.
//!
//! The accumulator also says, for every tool-call fragment in a chunk, which call it belongs
//! to and whether it is the call's first: a caller that must hide some calls from the client
//! (the proxy's own `context_read`) learns their name with their first fragment, before any
//! argument.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::sse::Event;
use super::usage::Usage;

/// What the model answered, from either shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub id: Option<String>,
    pub created: Option<u64>,
    pub model: Option<String>,
    pub system_fingerprint: Option<String>,
    pub service_tier: Option<String>,
    /// In `index` order.
    pub choices: Vec<Choice>,
    pub usage: Option<Usage>,
}

/// One choice's message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    pub index: u64,
    pub role: Option<String>,
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// In the order they started.
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    /// `message.annotations` (concatenated from the deltas), when any were sent.
    pub annotations: Option<Vec<Value>>,
    /// The choice's `logprobs` (its `content` and `refusal` lists concatenated), when sent.
    pub logprobs: Option<Value>,
}

/// One tool call of a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    /// `function` (the default) or `custom`.
    pub kind: String,
    pub name: String,
    /// `function.arguments`, or a custom call's `input`.
    pub arguments: String,
}

/// A stream chunk the accumulator cannot take.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// The upstream reported an error mid-stream; the value is its `error` object.
    #[error("the upstream reported an error mid-stream: {0}")]
    Upstream(Value),
    #[error("a stream chunk is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("a stream chunk is not a JSON object")]
    NotAnObject,
}

/// One tool-call fragment of a chunk: `choices[choice].delta.tool_calls[entry]` belongs to the
/// choice's call number `call` (its position in [`Choice::tool_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The choice's `index`.
    pub choice: u64,
    /// Position of the fragment in the delta's `tool_calls` array.
    pub entry: usize,
    /// Position of the call in [`Choice::tool_calls`].
    pub call: usize,
    /// This fragment started the call.
    pub new: bool,
    /// This fragment gave the call its name (with OpenAI, the same fragment that started it).
    pub named: bool,
}

/// Builds a [`Completion`] from stream chunks, in order.
#[derive(Debug, Default)]
pub struct ChatAccumulator {
    completion: Completion,
    /// Per choice, parallel to `completion.choices`: where each tool call went.
    slots: Vec<CallSlots>,
}

#[derive(Debug, Default)]
struct CallSlots {
    /// A fragment's `index` → the latest call that used it.
    by_index: HashMap<u64, usize>,
    by_id: HashMap<String, usize>,
}

impl ChatAccumulator {
    pub fn new() -> ChatAccumulator {
        ChatAccumulator::default()
    }

    /// Takes one SSE event of the stream: its `data` as a chunk; events without data and
    /// `[DONE]` change nothing.
    pub fn push_event(&mut self, event: &Event) -> Result<Vec<ToolCallDelta>, ChunkError> {
        match &event.data {
            Some(data) if !event.is_done() => {
                let chunk: Value = serde_json::from_str(data)?;
                self.push(&chunk)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Takes one parsed `chat.completion.chunk` and reports its tool-call fragments.
    pub fn push(&mut self, chunk: &Value) -> Result<Vec<ToolCallDelta>, ChunkError> {
        let chunk = chunk.as_object().ok_or(ChunkError::NotAnObject)?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(ChunkError::Upstream(error.clone()));
        }
        read_header(&mut self.completion, chunk);
        if let Some(usage) = chunk.get("usage").and_then(Usage::from_json) {
            self.completion.usage = Some(usage);
        }
        let mut deltas = Vec::new();
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let at = self.choice_at(index);
            let (state, slots) = (&mut self.completion.choices[at], &mut self.slots[at]);
            if let Some(delta) = choice.get("delta") {
                apply_delta(state, slots, delta, &mut deltas);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                state.finish_reason = Some(reason.to_string());
            }
            if let Some(logprobs) = choice.get("logprobs").filter(|l| l.is_object()) {
                extend_logprobs(&mut state.logprobs, logprobs);
            }
        }
        Ok(deltas)
    }

    /// What has been assembled so far.
    pub fn completion(&self) -> &Completion {
        &self.completion
    }

    /// The stream's usage (the usage chunk's, or the last chunk's), once seen.
    pub fn usage(&self) -> Option<Usage> {
        self.completion.usage.clone()
    }

    /// The tool call a [`ToolCallDelta`] points to.
    pub fn tool_call(&self, choice: u64, call: usize) -> Option<&ToolCall> {
        let choice = self.completion.choices.iter().find(|c| c.index == choice)?;
        choice.tool_calls.get(call)
    }

    /// The `chat.completion` body the non-streaming API would have answered.
    pub fn to_completion(&self) -> Value {
        self.completion.to_json()
    }

    /// Position of choice `index` in the list, added when new.
    fn choice_at(&mut self, index: u64) -> usize {
        let choices = &mut self.completion.choices;
        match choices.binary_search_by_key(&index, |c| c.index) {
            Ok(at) => at,
            Err(at) => {
                choices.insert(
                    at,
                    Choice {
                        index,
                        ..Choice::default()
                    },
                );
                self.slots.insert(at, CallSlots::default());
                at
            }
        }
    }
}

/// The top-level fields every chunk repeats.
fn read_header(completion: &mut Completion, chunk: &Map<String, Value>) {
    let text = |key: &str| chunk.get(key).and_then(Value::as_str).map(str::to_string);
    if let Some(id) = text("id") {
        completion.id = Some(id);
    }
    if let Some(created) = chunk.get("created").and_then(Value::as_u64) {
        completion.created = Some(created);
    }
    if let Some(model) = text("model") {
        completion.model = Some(model);
    }
    if let Some(fp) = text("system_fingerprint") {
        completion.system_fingerprint = Some(fp);
    }
    if let Some(tier) = text("service_tier") {
        completion.service_tier = Some(tier);
    }
}

fn apply_delta(
    choice: &mut Choice,
    slots: &mut CallSlots,
    delta: &Value,
    out: &mut Vec<ToolCallDelta>,
) {
    if let Some(role) = delta.get("role").and_then(Value::as_str) {
        choice.role = Some(role.to_string());
    }
    if let Some(text) = delta.get("content").and_then(Value::as_str) {
        choice
            .content
            .get_or_insert_with(String::new)
            .push_str(text);
    }
    if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
        choice
            .refusal
            .get_or_insert_with(String::new)
            .push_str(text);
    }
    if let Some(list) = delta.get("annotations").and_then(Value::as_array) {
        choice
            .annotations
            .get_or_insert_with(Vec::new)
            .extend(list.iter().cloned());
    }
    let calls = delta.get("tool_calls").and_then(Value::as_array);
    for (entry, fragment) in calls.into_iter().flatten().enumerate() {
        let (call, new) = route_call(choice, slots, fragment);
        let named = apply_call_fragment(&mut choice.tool_calls[call], fragment);
        out.push(ToolCallDelta {
            choice: choice.index,
            entry,
            call,
            new,
            named,
        });
    }
}

/// Which call a fragment continues, or a new one. A fragment with an `id` belongs to the call
/// with that id (upstreams that reuse `index` 0 for every call tell them apart this way, and
/// some repeat the id in every fragment); one without continues the latest call at its `index`.
fn route_call(choice: &mut Choice, slots: &mut CallSlots, fragment: &Value) -> (usize, bool) {
    let index = fragment.get("index").and_then(Value::as_u64);
    let id = fragment
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty());
    let existing = match id {
        Some(id) => slots.by_id.get(id).copied(),
        None => match index {
            Some(index) => slots.by_index.get(&index).copied(),
            None => choice.tool_calls.len().checked_sub(1),
        },
    };
    let (call, new) = match existing {
        Some(call) => (call, false),
        None => {
            choice.tool_calls.push(ToolCall {
                id: id.unwrap_or_default().to_string(),
                kind: "function".into(),
                ..ToolCall::default()
            });
            (choice.tool_calls.len() - 1, true)
        }
    };
    if let Some(id) = id {
        slots.by_id.insert(id.to_string(), call);
    }
    slots.by_index.insert(index.unwrap_or(0), call);
    (call, new)
}

/// Applies one fragment to its call; true when it gave the call its name. The first name
/// wins (some servers repeat it in every fragment); arguments are concatenated.
fn apply_call_fragment(call: &mut ToolCall, fragment: &Value) -> bool {
    if let Some(kind) = fragment.get("type").and_then(Value::as_str) {
        call.kind = kind.to_string();
    }
    let (body, text_key) = match fragment.get("custom") {
        Some(custom) if custom.is_object() => {
            call.kind = "custom".into();
            (custom, "input")
        }
        _ => match fragment.get("function") {
            Some(function) => (function, "arguments"),
            None => return false,
        },
    };
    if let Some(text) = body.get(text_key).and_then(Value::as_str) {
        call.arguments.push_str(text);
    }
    match body.get("name").and_then(Value::as_str) {
        Some(name) if call.name.is_empty() && !name.is_empty() => {
            call.name = name.to_string();
            true
        }
        _ => false,
    }
}

/// Appends a chunk's `logprobs.content` and `logprobs.refusal` lists to the choice's.
fn extend_logprobs(acc: &mut Option<Value>, chunk: &Value) {
    let acc = acc.get_or_insert_with(|| json!({"content": null, "refusal": null}));
    for key in ["content", "refusal"] {
        if let Some(items) = chunk.get(key).and_then(Value::as_array) {
            match &mut acc[key] {
                Value::Array(list) => list.extend(items.iter().cloned()),
                slot => *slot = Value::Array(items.clone()),
            }
        }
    }
}

/// A non-streaming body that is not a chat completion.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// The body is an error (`{"error": …}`); the value is the `error` object.
    #[error("the upstream answered an error: {0}")]
    Upstream(Value),
    #[error("a chat completion must be a JSON object with a `choices` list")]
    NotACompletion,
}

impl Completion {
    /// Reads a non-streaming `chat.completion` body.
    pub fn from_json(body: &Value) -> Result<Completion, ShapeError> {
        let object = body.as_object().ok_or(ShapeError::NotACompletion)?;
        if let Some(error) = object.get("error").filter(|e| !e.is_null()) {
            return Err(ShapeError::Upstream(error.clone()));
        }
        let choices = object
            .get("choices")
            .and_then(Value::as_array)
            .ok_or(ShapeError::NotACompletion)?;
        let mut completion = Completion::default();
        read_header(&mut completion, object);
        completion.usage = object.get("usage").and_then(Usage::from_json);
        for (position, choice) in choices.iter().enumerate() {
            let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_string);
            let message = choice.get("message").unwrap_or(&Value::Null);
            let tool_calls = message.get("tool_calls").and_then(Value::as_array);
            completion.choices.push(Choice {
                index: choice
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64),
                role: text(message.get("role")),
                content: message_text(message.get("content")),
                refusal: text(message.get("refusal")),
                tool_calls: tool_calls.into_iter().flatten().map(read_call).collect(),
                finish_reason: text(choice.get("finish_reason")),
                annotations: message
                    .get("annotations")
                    .and_then(Value::as_array)
                    .cloned(),
                logprobs: choice.get("logprobs").filter(|l| !l.is_null()).cloned(),
            });
        }
        completion.choices.sort_by_key(|c| c.index);
        Ok(completion)
    }

    /// The `chat.completion` body for this view, in the API's field order. A message with
    /// tool calls and no text has `content: null`.
    pub fn to_json(&self) -> Value {
        let choices: Vec<Value> = self.choices.iter().map(choice_json).collect();
        let mut out = Map::new();
        out.insert("id".into(), json!(self.id));
        out.insert("object".into(), json!("chat.completion"));
        out.insert("created".into(), json!(self.created));
        out.insert("model".into(), json!(self.model));
        out.insert("choices".into(), Value::Array(choices));
        if let Some(usage) = &self.usage {
            out.insert("usage".into(), usage.to_json());
        }
        if let Some(tier) = &self.service_tier {
            out.insert("service_tier".into(), json!(tier));
        }
        out.insert("system_fingerprint".into(), json!(self.system_fingerprint));
        Value::Object(out)
    }
}

fn choice_json(choice: &Choice) -> Value {
    let mut message = Map::new();
    message.insert(
        "role".into(),
        json!(choice.role.as_deref().unwrap_or("assistant")),
    );
    let content = match &choice.content {
        Some(text) if text.is_empty() && !choice.tool_calls.is_empty() => Value::Null,
        content => json!(content),
    };
    message.insert("content".into(), content);
    if !choice.tool_calls.is_empty() {
        let calls = choice.tool_calls.iter().map(call_json).collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    message.insert("refusal".into(), json!(choice.refusal));
    if let Some(annotations) = &choice.annotations {
        message.insert("annotations".into(), json!(annotations));
    }
    json!({
        "index": choice.index,
        "message": message,
        "logprobs": choice.logprobs,
        "finish_reason": choice.finish_reason,
    })
}

fn call_json(call: &ToolCall) -> Value {
    if call.kind == "custom" {
        json!({"id": call.id, "type": "custom", "custom": {"name": call.name, "input": call.arguments}})
    } else {
        json!({"id": call.id, "type": call.kind, "function": {"name": call.name, "arguments": call.arguments}})
    }
}

fn read_call(call: &Value) -> ToolCall {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let kind = text(call, "type").unwrap_or_else(|| "function".into());
    let (body, text_key) = match call.get("custom") {
        Some(custom) if kind == "custom" => (custom, "input"),
        _ => (call.get("function").unwrap_or(&Value::Null), "arguments"),
    };
    ToolCall {
        id: text(call, "id").unwrap_or_default(),
        kind,
        name: text(body, "name").unwrap_or_default(),
        arguments: text(body, text_key).unwrap_or_default(),
    }
}

/// A message's text: a string, or the `text` parts of a list joined.
fn message_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{TEXT_STREAM, TOOL_CALL_COMPLETION, TOOL_CALL_STREAM};
    use crate::wire::sse::SseReader;

    /// Runs a whole SSE stream through the reader and the accumulator.
    fn accumulate(stream: &str) -> (ChatAccumulator, Vec<ToolCallDelta>) {
        let mut reader = SseReader::default();
        let mut acc = ChatAccumulator::new();
        let mut deltas = Vec::new();
        let events = reader.feed(stream.as_bytes()).collect::<Vec<_>>();
        for event in events.into_iter().chain(reader.finish()) {
            deltas.extend(acc.push_event(&event.unwrap()).unwrap());
        }
        (acc, deltas)
    }

    fn chunk(delta_calls: Value) -> Value {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"tool_calls": delta_calls}, "finish_reason": null}]})
    }

    #[test]
    fn a_streamed_tool_call_answer_equals_the_non_streaming_one() {
        let (acc, _) = accumulate(TOOL_CALL_STREAM);
        let expected: Value = serde_json::from_str(TOOL_CALL_COMPLETION).unwrap();
        assert_eq!(acc.to_completion(), expected);
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&acc.to_completion()), keys(&expected), "field order");
        let parsed = Completion::from_json(&expected).unwrap();
        assert_eq!(&parsed, acc.completion(), "both shapes give the same view");
        assert_eq!(parsed.to_json(), expected);
    }

    #[test]
    fn parallel_calls_with_fragmented_arguments_are_reported_as_they_start() {
        let (acc, deltas) = accumulate(TOOL_CALL_STREAM);
        let calls = &acc.completion().choices[0].tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("context_read", r#"{"ref": "ctx_abc"}"#)
        );
        assert_eq!(calls[1].arguments, r#"{"city": "Paris"}"#);
        let calls_of: Vec<(usize, bool, bool)> =
            deltas.iter().map(|d| (d.call, d.new, d.named)).collect();
        assert_eq!(
            calls_of,
            [
                (0, true, true),
                (0, false, false),
                (1, true, true),
                (0, false, false),
                (1, false, false),
                (1, false, false)
            ]
        );
        let first = acc.tool_call(0, 0).unwrap();
        assert_eq!(
            (first.id.as_str(), first.name.as_str()),
            ("call_aX1", "context_read")
        );
        assert!(acc.tool_call(0, 2).is_none() && acc.tool_call(1, 0).is_none());
    }

    #[test]
    fn calls_that_reuse_index_zero_are_told_apart_by_id() {
        let mut acc = ChatAccumulator::new();
        let fragments = [
            json!([{"index": 0, "id": "a", "type": "function", "function": {"name": "context_read", "arguments": "{\"r"}}]),
            json!([{"index": 0, "function": {"arguments": "ef\":1}"}}]),
            json!([{"index": 0, "id": "b", "type": "function", "function": {"name": "ls", "arguments": ""}}]),
            json!([{"index": 0, "id": "b", "function": {"name": "ls", "arguments": "{}"}}]),
        ];
        let mut seen = Vec::new();
        for f in fragments {
            seen.extend(acc.push(&chunk(f)).unwrap());
        }
        let calls = &acc.completion().choices[0].tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("context_read", "{\"ref\":1}")
        );
        assert_eq!(
            (
                calls[1].id.as_str(),
                calls[1].name.as_str(),
                calls[1].arguments.as_str()
            ),
            ("b", "ls", "{}")
        );
        let news: Vec<_> = seen.iter().map(|d| (d.call, d.new)).collect();
        assert_eq!(news, [(0, true), (0, false), (1, true), (1, false)]);
    }

    #[test]
    fn several_calls_in_one_delta_and_several_choices() {
        let mut acc = ChatAccumulator::new();
        let first = json!({"choices": [
            {"index": 1, "delta": {"role": "assistant", "content": "B"}},
            {"index": 0, "delta": {"role": "assistant", "tool_calls": [
                {"index": 0, "id": "x", "function": {"name": "f", "arguments": "1"}},
                {"index": 1, "id": "y", "function": {"name": "g", "arguments": "2"}}]}}]});
        let deltas = acc.push(&first).unwrap();
        assert_eq!(
            deltas
                .iter()
                .map(|d| (d.choice, d.entry, d.call))
                .collect::<Vec<_>>(),
            [(0, 0, 0), (0, 1, 1)]
        );
        acc.push(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "function": {"arguments": "3"}}]}, "finish_reason": "tool_calls"},
            {"index": 1, "delta": {}, "finish_reason": "length"}]}))
            .unwrap();
        let c = acc.completion();
        assert_eq!(
            c.choices.iter().map(|c| c.index).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(c.choices[0].tool_calls[1].arguments, "23");
        assert_eq!(c.choices[1].content.as_deref(), Some("B"));
        assert_eq!(c.choices[1].finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn text_answer_with_usage_on_the_last_chunk() {
        let (acc, deltas) = accumulate(TEXT_STREAM);
        assert!(deltas.is_empty());
        let usage = acc.usage().unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens
            ),
            (9, 4, 13)
        );
        assert_eq!(
            acc.to_completion(),
            json!({
                "id": "chatcmpl-9", "object": "chat.completion", "created": 1745600001u64,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello, world.",
                             "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
                "system_fingerprint": "fp_0aa8d3e20b"
            })
        );
    }

    #[test]
    fn refusal_annotations_logprobs_custom_calls() {
        let mut acc = ChatAccumulator::new();
        acc.push(
            &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "refusal": "I can"},
            "logprobs": {"content": null, "refusal": [{"token": "I"}]}}]}),
        )
        .unwrap();
        acc.push(&json!({"choices": [{"index": 0, "delta": {"refusal": "not.", "annotations": [{"type": "url_citation"}]},
            "logprobs": {"content": null, "refusal": [{"token": " can"}]}}]})).unwrap();
        acc.push(&chunk(json!([{"index": 0, "id": "k", "type": "custom", "custom": {"name": "sh", "input": "ls"}}]))).unwrap();
        acc.push(&chunk(json!([{"index": 0, "custom": {"input": " -l"}}])))
            .unwrap();
        let choice = &acc.to_completion()["choices"][0];
        assert_eq!(choice["message"]["refusal"], "I cannot.");
        assert_eq!(
            choice["message"]["annotations"],
            json!([{"type": "url_citation"}])
        );
        assert_eq!(
            choice["logprobs"],
            json!({"content": null, "refusal": [{"token": "I"}, {"token": " can"}]})
        );
        assert_eq!(
            choice["message"]["tool_calls"],
            json!([{"id": "k", "type": "custom", "custom": {"name": "sh", "input": "ls -l"}}])
        );
    }

    #[test]
    fn errors_mid_stream_and_odd_chunks() {
        let mut acc = ChatAccumulator::new();
        let err = acc
            .push(&json!({"error": {"message": "overloaded", "type": "server_error", "param": null, "code": null}}))
            .unwrap_err();
        assert!(matches!(err, ChunkError::Upstream(e) if e["message"] == "overloaded"));
        assert!(matches!(
            acc.push(&json!([1])),
            Err(ChunkError::NotAnObject)
        ));
        // Azure's first chunk: no choices, prompt filter results; `usage: null` is no usage.
        acc.push(&json!({"choices": [], "prompt_filter_results": [], "usage": null}))
            .unwrap();
        assert_eq!(acc.usage(), None);
        let mut reader = SseReader::default();
        let event = reader.feed(b"data: {not json\n\n").next().unwrap().unwrap();
        assert!(matches!(acc.push_event(&event), Err(ChunkError::Json(_))));
    }

    #[test]
    fn non_streaming_bodies() {
        let body = json!({"id": "x", "object": "chat.completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "refusal": null,
                         "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                      "prompt_tokens_details": {"cached_tokens": 0}},
            "service_tier": "default", "system_fingerprint": null});
        let c = Completion::from_json(&body).unwrap();
        assert_eq!(c.choices[0].content.as_deref(), Some("hi"));
        assert_eq!(c.usage.as_ref().unwrap().cached_tokens, Some(0));
        assert_eq!(c.to_json(), body);
        let err = json!({"error": {"message": "too long", "type": "invalid_request_error",
                                   "param": "messages", "code": "context_length_exceeded"}});
        assert!(
            matches!(Completion::from_json(&err), Err(ShapeError::Upstream(e)) if e["code"] == "context_length_exceeded")
        );
        assert!(matches!(
            Completion::from_json(&json!({"data": []})),
            Err(ShapeError::NotACompletion)
        ));
    }

    /// A tool-call fragment with any mix of the optional keys.
    fn fragment() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        (
            proptest::option::of(0u64..3),
            proptest::option::of("[a-c]"),
            proptest::option::of("[a-z_]{0,6}"),
            "[ -~]{0,8}",
            any::<bool>(),
        )
            .prop_map(|(index, id, name, args, custom)| {
                let mut f = Map::new();
                if let Some(index) = index {
                    f.insert("index".into(), index.into());
                }
                if let Some(id) = id {
                    f.insert("id".into(), id.into());
                }
                let mut body = Map::new();
                if let Some(name) = name {
                    body.insert("name".into(), name.into());
                }
                let (key, text_key) = if custom {
                    ("custom", "input")
                } else {
                    ("function", "arguments")
                };
                body.insert(text_key.into(), args.into());
                f.insert(key.into(), Value::Object(body));
                Value::Object(f)
            })
    }

    proptest::proptest! {
        /// Whatever the fragments, nothing panics and every argument byte lands in exactly one
        /// call; a `ToolCallFilter` then keeps every visible fragment and numbers calls densely.
        #[test]
        fn any_fragments_are_assembled_without_loss(
            chunks in proptest::collection::vec(
                (0u64..2, proptest::collection::vec(fragment(), 0..4)), 0..12),
        ) {
            let mut acc = ChatAccumulator::new();
            let mut filter = crate::wire::ToolCallFilter::new();
            let mut sent = 0;
            let mut client_indices = HashMap::new();
            for (choice, fragments) in chunks {
                sent += fragments.iter().map(|f| {
                    let body = f.get("function").or(f.get("custom")).unwrap();
                    body.get("arguments").or(body.get("input")).unwrap().as_str().unwrap().len()
                }).sum::<usize>();
                let mut chunk = json!({"choices": [{"index": choice, "delta": {"tool_calls": fragments}}]});
                let deltas = acc.push(&chunk).unwrap();
                let hide = |d: &ToolCallDelta| acc.tool_call(d.choice, d.call).unwrap().name == "a";
                let kept = deltas.iter().filter(|d| !hide(d)).count();
                filter.apply(&mut chunk, &deltas, hide);
                let out = chunk["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default();
                proptest::prop_assert_eq!(out.len(), kept);
                let seen = client_indices.entry(choice).or_insert_with(std::collections::BTreeSet::new);
                for entry in out {
                    let index = entry["index"].as_u64().unwrap();
                    proptest::prop_assert!(index as usize <= seen.len(), "dense client indices");
                    seen.insert(index);
                }
            }
            let got: usize = acc.completion().choices.iter()
                .flat_map(|c| &c.tool_calls).map(|c| c.arguments.len()).sum();
            proptest::prop_assert_eq!(got, sent);
            let _ = acc.to_completion();
        }
    }
}
