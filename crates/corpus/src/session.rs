//! A session of agent traffic and the requests it stands for.
//!
//! Histories repeat from one request to the next, so a session stores its messages once and
//! the end of each request: request `k` is `messages[..request_ends[k]]`, and the message at
//! `request_ends[k]` is the assistant reply the model gave to it (a mock upstream can replay it).
//!
//! A session speaks the API its `wire` names: chat completions; the Responses API (Codex's
//! input items); or Anthropic Messages (as Claude Code does): then its messages are Messages'
//! (content blocks, `tool_use` / `tool_result`), its other top-level fields (`system`,
//! `max_tokens`, `thinking`, `metadata`) are in `fields`, and Claude Code's moving cache
//! breakpoint is put on the newest block of each request (`mark_newest`), which is why the
//! stored messages carry none. Files written before `wire` named Messages said so with
//! `"api": "messages"`; they are still read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{AgentKind, Wire};

/// One agent conversation, stored compactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "SessionFile")]
pub struct Session {
    pub id: String,
    pub kind: AgentKind,
    pub model: String,
    /// The `tools` array sent with every request.
    pub tools: Value,
    /// Whether requests ask for a stream (`stream: true`, `stream_options.include_usage`).
    pub stream: bool,
    pub messages: Vec<Value>,
    /// End (exclusive) of each request's history in `messages`, strictly increasing.
    pub request_ends: Vec<usize>,
    /// The API of its requests; on the Responses API `messages` are input items and
    /// `request_ends[k]` is where the model's output items for request `k` begin.
    #[serde(default, skip_serializing_if = "Wire::is_chat")]
    pub wire: Wire,
    /// Responses sessions: the `instructions` every request carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Further top-level fields of every request (Messages: `system`, `max_tokens`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<serde_json::Map<String, Value>>,
    /// Each request's newest block carries a cache breakpoint, as Claude Code puts it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mark_newest: bool,
}

/// A Responses request body borrowing the session, shaped as Codex sends it.
#[derive(Serialize)]
struct ResponsesView<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: &'a [Value],
    tools: &'a Value,
    tool_choice: &'static str,
    parallel_tool_calls: bool,
    reasoning: Reasoning,
    store: bool,
    stream: bool,
    include: [&'static str; 1],
    prompt_cache_key: &'a str,
}

#[derive(Serialize)]
struct Reasoning {
    effort: &'static str,
    summary: &'static str,
}

/// A request of either API.
#[derive(Serialize)]
#[serde(untagged)]
enum View<'a> {
    Chat(RequestView<'a>),
    Responses(ResponsesView<'a>),
}

/// A session file as read: [`Session`]'s fields, and the `api` field older files named
/// Anthropic Messages sessions with (`"api": "messages"`) before `wire` did.
#[derive(Deserialize)]
struct SessionFile {
    id: String,
    kind: AgentKind,
    model: String,
    tools: Value,
    stream: bool,
    messages: Vec<Value>,
    request_ends: Vec<usize>,
    #[serde(default)]
    wire: Wire,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    api: Option<String>,
    #[serde(default)]
    fields: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    mark_newest: bool,
}

impl From<SessionFile> for Session {
    fn from(f: SessionFile) -> Session {
        let wire = match f.api.as_deref() {
            Some("messages") => Wire::Messages,
            _ => f.wire,
        };
        Session {
            id: f.id,
            kind: f.kind,
            model: f.model,
            tools: f.tools,
            stream: f.stream,
            messages: f.messages,
            request_ends: f.request_ends,
            wire,
            instructions: f.instructions,
            fields: f.fields,
            mark_newest: f.mark_newest,
        }
    }
}

/// The history of one request: its messages, the newest block marked when asked.
struct History<'a> {
    messages: &'a [Value],
    mark_newest: bool,
}

impl Serialize for History<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.messages.len()))?;
        let (last, head) = match self.messages.split_last() {
            Some((last, head)) if self.mark_newest => (Some(last), head),
            _ => (None, self.messages),
        };
        for m in head {
            seq.serialize_element(m)?;
        }
        if let Some(last) = last {
            seq.serialize_element(&with_newest_marked(last))?;
        }
        seq.end()
    }
}

/// `message` with a cache breakpoint on its last block (a string content becomes a block).
pub fn with_newest_marked(message: &Value) -> Value {
    let mut m = message.clone();
    let marker = serde_json::json!({"type": "ephemeral"});
    match m.get_mut("content") {
        Some(Value::String(text)) => {
            let block =
                serde_json::json!([{"type": "text", "text": text, "cache_control": marker}]);
            m["content"] = block;
        }
        Some(Value::Array(blocks)) => {
            if let Some(Value::Object(last)) = blocks.last_mut() {
                last.insert("cache_control".into(), marker);
            }
        }
        _ => {}
    }
    m
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// A request body borrowing the session, so it can be serialized without cloning messages.
#[derive(Serialize)]
struct RequestView<'a> {
    model: &'a str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    fields: Option<&'a serde_json::Map<String, Value>>,
    messages: History<'a>,
    tools: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

impl Session {
    /// Number of requests the agent sends.
    pub fn request_count(&self) -> usize {
        self.request_ends.len()
    }

    /// Whether the requests speak Anthropic Messages.
    pub fn is_messages(&self) -> bool {
        self.wire == Wire::Messages
    }

    fn view(&self, end: usize) -> View<'_> {
        match self.wire {
            Wire::Chat | Wire::Messages => View::Chat(RequestView {
                model: &self.model,
                fields: self.fields.as_ref(),
                messages: History {
                    messages: &self.messages[..end],
                    mark_newest: self.mark_newest,
                },
                tools: &self.tools,
                stream: self.stream.then_some(true),
                // Messages streams carry their usage anyway.
                stream_options: (self.stream && !self.is_messages()).then_some(StreamOptions {
                    include_usage: true,
                }),
            }),
            Wire::Responses => View::Responses(ResponsesView {
                model: &self.model,
                instructions: self.instructions.as_deref(),
                input: &self.messages[..end],
                tools: &self.tools,
                tool_choice: "auto",
                parallel_tool_calls: true,
                reasoning: Reasoning {
                    effort: "medium",
                    summary: "auto",
                },
                store: false,
                stream: self.stream,
                include: ["reasoning.encrypted_content"],
                prompt_cache_key: &self.id,
            }),
        }
    }

    /// The body of request `k`: `model`, the history `messages[..request_ends[k]]`, `tools`,
    /// and the stream fields when the session streams.
    ///
    /// # Panics
    /// If `k >= self.request_count()`.
    pub fn request(&self, k: usize) -> Value {
        // Serializing plain JSON values and strings cannot fail.
        serde_json::to_value(self.view(self.request_ends[k])).unwrap_or(Value::Null)
    }

    /// The body of request `k` as compact JSON bytes, byte-identical to serializing
    /// `self.request(k)`, without cloning the history.
    ///
    /// # Panics
    /// If `k >= self.request_count()`.
    pub fn request_body(&self, k: usize) -> Vec<u8> {
        serde_json::to_vec(&self.view(self.request_ends[k])).unwrap_or_default()
    }

    /// Every request, in the order the agent sends them.
    pub fn requests(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.request_count()).map(move |k| self.request(k))
    }

    /// The assistant message the model answered request `k` with.
    pub fn reply(&self, k: usize) -> Option<&Value> {
        self.request_ends
            .get(k)
            .and_then(|&end| self.messages.get(end))
    }

    /// The content of every tool message (Messages: of every `tool_result` block; the
    /// Responses API: of every output item).
    pub fn tool_results(&self) -> impl Iterator<Item = &str> + '_ {
        let responses = self.wire == Wire::Responses;
        self.messages.iter().flat_map(move |m| {
            let blocks = m["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let results = blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .filter_map(|b| b["content"].as_str());
            let output = m["type"].as_str().is_some_and(|t| t.ends_with("_output"));
            let output = (responses && output)
                .then(|| m["output"].as_str())
                .flatten();
            (m["role"] == "tool")
                .then(|| m["content"].as_str())
                .flatten()
                .into_iter()
                .chain(output)
                .chain(results)
        })
    }

    /// Size in bytes of the body of every request, in order, computed from the size of each
    /// message without serializing any request.
    pub fn request_sizes(&self) -> Vec<usize> {
        let empty = serde_json::to_vec(&self.view(0)).map_or(0, |b| b.len());
        let mut sizes = Vec::with_capacity(self.request_count());
        let mut prefix = 0;
        let mut done = 0;
        for &end in &self.request_ends {
            for m in &self.messages[done..end.min(self.messages.len())] {
                prefix += serde_json::to_vec(m).map_or(0, |b| b.len());
            }
            done = end;
            sizes.push(empty + prefix + end.saturating_sub(1));
        }
        sizes
    }

    /// Checks the invariants every session satisfies, naming the first one broken: requests
    /// end strictly increasing on a user or tool message and are answered by an assistant
    /// message; every assistant message answers a request; each tool call is followed, in
    /// order, by exactly one tool message with its id; no tool message stands alone; every
    /// call names a declared tool and carries a JSON object as `arguments`.
    pub fn validate(&self) -> Result<(), String> {
        if self.wire == Wire::Responses {
            return crate::responses::validate(self);
        }
        let id = &self.id;
        if self.request_ends.is_empty() {
            return Err(format!("session {id}: no requests"));
        }
        if self.is_messages() {
            return self.validate_messages();
        }
        let declared: Vec<&str> = self
            .tools
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        let mut prev = 0;
        for (k, &end) in self.request_ends.iter().enumerate() {
            if end <= prev || end >= self.messages.len() {
                return Err(format!(
                    "session {id}: request {k} ends at {end}, after {prev} of {}",
                    self.messages.len()
                ));
            }
            let last = &self.messages[end - 1]["role"];
            if last != "user" && last != "tool" {
                return Err(format!(
                    "session {id}: request {k} ends with a {last} message"
                ));
            }
            if self.messages[end]["role"] != "assistant" {
                return Err(format!(
                    "session {id}: request {k} is not answered by an assistant message"
                ));
            }
            prev = end;
        }
        let assistants = self
            .messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count();
        if assistants != self.request_ends.len() {
            return Err(format!(
                "session {id}: {assistants} assistant messages for {} requests",
                self.request_ends.len()
            ));
        }
        let mut ids = std::collections::HashSet::new();
        let mut i = 0;
        while i < self.messages.len() {
            let m = &self.messages[i];
            match m["role"].as_str() {
                Some("system" | "developer" | "user") => {}
                Some("assistant") => {
                    let calls = m.get("tool_calls").and_then(Value::as_array);
                    for (j, call) in calls.into_iter().flatten().enumerate() {
                        let call_id = call["id"].as_str().unwrap_or("");
                        if !ids.insert(call_id.to_string()) || !call_id.starts_with("call_") {
                            return Err(format!(
                                "session {id}: message {i}: bad or repeated call id {call_id:?}"
                            ));
                        }
                        let name = call["function"]["name"].as_str().unwrap_or("");
                        if call["type"] != "function" || !declared.contains(&name) {
                            return Err(format!(
                                "session {id}: message {i}: call to undeclared tool {name:?}"
                            ));
                        }
                        let args = call["function"]["arguments"].as_str().unwrap_or("");
                        if !serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object()) {
                            return Err(format!(
                                "session {id}: message {i}: arguments are not a JSON object"
                            ));
                        }
                        let result = self.messages.get(i + 1 + j);
                        let answered = result.is_some_and(|r| {
                            r["role"] == "tool"
                                && r["tool_call_id"] == call_id
                                && r["content"].is_string()
                        });
                        if !answered {
                            return Err(format!("session {id}: message {i}: call {call_id} has no result right after it"));
                        }
                    }
                    if m["content"].is_null() && calls.is_none_or(|c| c.is_empty()) {
                        return Err(format!("session {id}: message {i}: assistant message with neither content nor calls"));
                    }
                    i += calls.map_or(0, Vec::len);
                }
                Some("tool") => {
                    return Err(format!(
                        "session {id}: message {i}: tool message without a call"
                    ))
                }
                other => return Err(format!("session {id}: message {i}: unknown role {other:?}")),
            }
            i += 1;
        }
        Ok(())
    }
}

impl Session {
    /// [`Session::validate`] of a Messages session: requests end on a user message and are
    /// answered by an assistant message; each `tool_use` is answered by a `tool_result` opening
    /// the next message, in order, naming a declared tool.
    fn validate_messages(&self) -> Result<(), String> {
        let id = &self.id;
        let declared: Vec<&str> = self
            .tools
            .as_array()
            .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        let mut prev = 0;
        for (k, &end) in self.request_ends.iter().enumerate() {
            if end <= prev || end >= self.messages.len() {
                return Err(format!("session {id}: request {k} ends at {end}"));
            }
            if self.messages[end - 1]["role"] != "user" || self.messages[end]["role"] != "assistant"
            {
                return Err(format!(
                    "session {id}: request {k} is not a user turn answered"
                ));
            }
            prev = end;
        }
        let blocks = |m: &Value| m["content"].as_array().cloned().unwrap_or_default();
        for (i, m) in self.messages.iter().enumerate() {
            let calls: Vec<Value> = blocks(m)
                .into_iter()
                .filter(|b| b["type"] == "tool_use")
                .collect();
            if calls.is_empty() {
                continue;
            }
            let next = self.messages.get(i + 1).map(blocks).unwrap_or_default();
            for (j, call) in calls.iter().enumerate() {
                let name = call["name"].as_str().unwrap_or("");
                if !declared.contains(&name) || !call["input"].is_object() {
                    return Err(format!("session {id}: message {i}: bad call to {name:?}"));
                }
                let answered = next
                    .get(j)
                    .is_some_and(|r| r["type"] == "tool_result" && r["tool_use_id"] == call["id"]);
                if !answered {
                    return Err(format!("session {id}: message {i}: call {j} unanswered"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Session {
        Session {
            wire: Wire::Chat,
            instructions: None,
            id: "t".into(),
            kind: AgentKind::Support,
            model: "gpt-4o".into(),
            tools: json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]),
            stream: true,
            messages: vec![
                json!({"role": "system", "content": "s"}),
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"}),
                json!({"role": "assistant", "content": "done"}),
            ],
            request_ends: vec![2, 4],
            fields: None,
            mark_newest: false,
        }
    }

    #[test]
    fn one_field_names_the_wire_and_older_files_are_read() {
        let mut s = sample();
        s.wire = Wire::Messages;
        let written = serde_json::to_value(&s).unwrap();
        assert_eq!(written["wire"], "messages");
        assert!(written.get("api").is_none());
        let read: Session = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(read, s);
        // A file from before `wire` named Messages: `"api": "messages"`, no `wire`.
        let mut older = written;
        let map = older.as_object_mut().unwrap();
        map.remove("wire");
        map.insert("api".into(), json!("messages"));
        let read: Session = serde_json::from_value(older).unwrap();
        assert!(read.is_messages());
        assert_eq!(read, s);
        // Chat is the default and is not written.
        let chat = serde_json::to_value(sample()).unwrap();
        assert!(chat.get("wire").is_none());
        assert_eq!(
            serde_json::from_value::<Session>(chat).unwrap().wire,
            Wire::Chat
        );
    }

    #[test]
    fn requests_are_prefixes_with_stream_fields() {
        let s = sample();
        s.validate().unwrap();
        let r = s.request(1);
        assert_eq!(r["messages"].as_array().unwrap().len(), 4);
        assert_eq!(r["stream"], true);
        assert_eq!(r["stream_options"]["include_usage"], true);
        assert_eq!(s.reply(0).unwrap()["tool_calls"][0]["id"], "call_1");
        assert_eq!(s.requests().count(), 2);
        assert_eq!(s.tool_results().collect::<Vec<_>>(), ["ok"]);
    }

    #[test]
    fn request_body_and_sizes_match_the_value() {
        let mut s = sample();
        for stream in [true, false] {
            s.stream = stream;
            let sizes = s.request_sizes();
            assert_eq!(sizes.len(), s.request_count());
            for (k, size) in sizes.into_iter().enumerate() {
                let body = s.request_body(k);
                assert_eq!(body, serde_json::to_vec(&s.request(k)).unwrap());
                assert_eq!(size, body.len());
            }
        }
        assert!(s.request(0).get("stream").is_none());
    }

    #[test]
    fn validate_rejects_broken_sessions() {
        let mut orphan = sample();
        orphan.messages.swap(2, 3);
        assert!(orphan.validate().is_err());
        let mut bad_args = sample();
        bad_args.messages[2]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
        assert!(bad_args.validate().unwrap_err().contains("arguments"));
        let mut bad_end = sample();
        bad_end.request_ends = vec![3, 4];
        assert!(bad_end.validate().is_err());
        let mut unknown = sample();
        unknown.messages[2]["tool_calls"][0]["function"]["name"] = json!("g");
        assert!(unknown.validate().unwrap_err().contains("undeclared"));
    }
}
