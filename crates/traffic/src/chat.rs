//! Writes a session's messages in the exact chat-completions shape and records where each
//! request ends.
//!
//! Every assistant message is a model reply, so the history before it is a request: that is
//! the only place a request end is recorded. Tool calls and their results are appended together,
//! one `tool` message per call in call order, so no call is left without its result.

use serde_json::{json, Value};

use super::rng::Rng;

/// A tool call the agent makes and the text its tool returns.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub name: &'static str,
    pub arguments: Value,
    pub result: String,
}

impl ToolCall {
    pub fn new(name: &'static str, arguments: Value, result: impl Into<String>) -> ToolCall {
        ToolCall {
            name,
            arguments,
            result: result.into(),
        }
    }
}

/// How the client echoes the model's replies back into the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Only `role`, `content` and `tool_calls`, as hand-written clients send them.
    Minimal,
    /// The whole response message, as SDK clients that append the response object send it:
    /// `refusal: null` and `annotations: []` included.
    Full,
}

/// A session's message list under construction.
#[derive(Debug)]
pub struct Transcript {
    messages: Vec<Value>,
    request_ends: Vec<usize>,
    echo: Echo,
    max_result_bytes: usize,
}

impl Transcript {
    /// An empty transcript; tool results longer than `max_result_bytes` are cut at a line end.
    pub fn new(echo: Echo, max_result_bytes: usize) -> Transcript {
        Transcript {
            messages: Vec::new(),
            request_ends: Vec::new(),
            echo,
            max_result_bytes,
        }
    }

    /// Requests recorded so far (one per assistant message).
    pub fn requests(&self) -> usize {
        self.request_ends.len()
    }

    pub fn system(&mut self, text: String) {
        self.messages
            .push(json!({"role": "system", "content": text}));
    }

    pub fn developer(&mut self, text: String) {
        self.messages
            .push(json!({"role": "developer", "content": text}));
    }

    /// A user turn with plain string content.
    pub fn user(&mut self, text: String) {
        self.messages.push(json!({"role": "user", "content": text}));
    }

    /// A user turn whose content is an array of text parts.
    pub fn user_parts(&mut self, texts: Vec<String>) {
        let parts: Vec<Value> = texts
            .into_iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        self.messages
            .push(json!({"role": "user", "content": parts}));
    }

    /// A model reply in text, ending the agent's turn.
    pub fn reply(&mut self, text: String) {
        self.assistant(Value::String(text), None);
    }

    /// A model reply calling `calls` (in parallel when more than one), with an optional text
    /// note, followed by each call's result in order.
    pub fn act(&mut self, rng: &mut Rng, note: Option<String>, calls: Vec<ToolCall>) {
        let mut ids = Vec::with_capacity(calls.len());
        let mut tool_calls = Vec::with_capacity(calls.len());
        for call in &calls {
            let id = format!("call_{}", rng.alnum(24));
            // Serializing a `Value` cannot fail.
            let arguments = serde_json::to_string(&call.arguments).unwrap_or_default();
            tool_calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            }));
            ids.push(id);
        }
        let content = note.map_or(Value::Null, Value::String);
        self.assistant(content, Some(tool_calls));
        for (id, call) in ids.into_iter().zip(calls) {
            self.messages.push(json!({
                "role": "tool",
                "tool_call_id": id,
                "content": clip(call.result, self.max_result_bytes),
            }));
        }
    }

    fn assistant(&mut self, content: Value, tool_calls: Option<Vec<Value>>) {
        self.request_ends.push(self.messages.len());
        let mut m = json!({"role": "assistant", "content": content});
        if let Some(calls) = tool_calls {
            m["tool_calls"] = Value::Array(calls);
        }
        if self.echo == Echo::Full {
            m["refusal"] = Value::Null;
            m["annotations"] = json!([]);
        }
        self.messages.push(m);
    }

    /// The messages and the end (exclusive) of each request.
    pub fn finish(self) -> (Vec<Value>, Vec<usize>) {
        (self.messages, self.request_ends)
    }
}

/// `text` cut to at most `max` bytes, at the end of a line when there is one in the second
/// half, else at a character boundary.
fn clip(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if let Some(nl) = text[..end].rfind('\n') {
        if nl >= max / 2 {
            end = nl + 1;
        }
    }
    text.truncate(end);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_cuts_at_line_ends_and_char_boundaries() {
        assert_eq!(clip("short".into(), 10), "short");
        assert_eq!(clip("aaaa\nbbbb\ncccc".into(), 12), "aaaa\nbbbb\n");
        assert_eq!(clip("ééééé".into(), 5), "éé");
    }

    #[test]
    fn calls_are_followed_by_their_results_in_order() {
        let mut rng = Rng::new(1);
        let mut t = Transcript::new(Echo::Full, 1 << 20);
        t.system("sys".into());
        t.user("hi".into());
        t.act(
            &mut rng,
            None,
            vec![
                ToolCall::new("a", json!({"x": 1}), "one"),
                ToolCall::new("b", json!({}), "two"),
            ],
        );
        t.reply("done".into());
        let (m, ends) = t.finish();
        assert_eq!(ends, [2, 5]);
        let calls = m[2]["tool_calls"].as_array().unwrap();
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["refusal"], Value::Null);
        assert_eq!(calls[0]["function"]["arguments"], "{\"x\":1}");
        assert_eq!(m[3]["tool_call_id"], calls[0]["id"]);
        assert_eq!(m[4]["tool_call_id"], calls[1]["id"]);
        assert_eq!(m[4]["content"], "two");
        let id = calls[0]["id"].as_str().unwrap();
        assert_eq!(id.len(), 29);
        assert!(id.starts_with("call_"));
        assert!(id[5..].chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
