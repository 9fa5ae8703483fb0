//! What the mock answers: the replies a test queues ([`Reply`]), the [`Gate`] that can pause a
//! reply half-way, and the JSON form of a reply ([`ReplySpec`]) used to script a mock running in
//! another process through `POST /_mock/replies`.
//!
//! This module only describes answers; `chat` decides when to use them and `wire` turns them into
//! OpenAI bytes.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

/// One scripted answer to a chat-completions request.
///
/// Build replies with the constructors ([`Reply::text`], [`Reply::tool_calls`], …) and the
/// modifiers ([`Reply::stream_chunks`], [`Reply::hold_after`]); the variants are public so a test
/// can inspect what it queued.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "ReplySpec")]
pub enum Reply {
    /// A successful assistant answer, sent as JSON or as an SSE stream as the request asks.
    Completion(Completion),
    /// The upstream's own error: `body` is sent verbatim with `status` and
    /// `content-type: application/json`, whether or not the request asked for a stream.
    Error { status: u16, body: Value },
    /// Any response at all, sent verbatim: no header is added except `x-mock-name`.
    Raw {
        status: u16,
        headers: Vec<(String, String)>,
        body: Bytes,
    },
    /// `reply`, delivered only once `gate` is open. A streamed completion sends its first `after`
    /// SSE events before it waits; any other answer waits before its response starts.
    Held {
        reply: Box<Reply>,
        after: usize,
        gate: Gate,
    },
}

/// A successful assistant answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant's text; `None` gives `"content": null` (usual with tool calls).
    pub content: Option<String>,
    /// Tool calls, in order; when non-empty the finish reason is `tool_calls`.
    pub tool_calls: Vec<ToolCall>,
    /// Split a streamed `content` into exactly this many content chunks instead of word by word.
    pub content_chunks: Option<usize>,
    /// On Anthropic Messages, the thinking text of the answer's opening `thinking` block, when
    /// the request turns thinking on (a default text is thought when `None`); chat ignores it.
    pub thinking: Option<String>,
}

/// A function call the assistant makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The call id; when `None` the mock derives a `call_…` id from the answer's serial number and
    /// the call's position, so the same script gives the same ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments. A JSON string is sent as the arguments text verbatim (so a test can send
    /// malformed JSON); any other value is sent as its compact JSON text.
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

impl ToolCall {
    /// The `function.arguments` text sent on the wire.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

impl Reply {
    /// An assistant text answer (finish reason `stop`).
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Completion(Completion {
            content: Some(s.into()),
            tool_calls: Vec::new(),
            content_chunks: None,
            thinking: None,
        })
    }

    /// An answer made of tool calls `(name, arguments)` with `content: null` (finish reason
    /// `tool_calls`). Several calls are parallel calls with indices 0, 1, …
    pub fn tool_calls(calls: Vec<(String, Value)>) -> Reply {
        Reply::Completion(Completion {
            content: None,
            tool_calls: calls.into_iter().map(to_call).collect(),
            content_chunks: None,
            thinking: None,
        })
    }

    /// An answer with both text and tool calls, as some models send.
    pub fn text_and_tool_calls(text: impl Into<String>, calls: Vec<(String, Value)>) -> Reply {
        Reply::Completion(Completion {
            content: Some(text.into()),
            tool_calls: calls.into_iter().map(to_call).collect(),
            content_chunks: None,
            thinking: None,
        })
    }

    /// The upstream's own error, sent verbatim as `application/json` with `status`.
    pub fn error(status: u16, body: Value) -> Reply {
        Reply::Error { status, body }
    }

    /// Any response, sent verbatim.
    pub fn raw(status: u16, headers: Vec<(String, String)>, body: Bytes) -> Reply {
        Reply::Raw {
            status,
            headers,
            body,
        }
    }

    /// Sends the first `chunks` SSE events of a streamed answer, then waits for `gate.open()`
    /// before the rest. A JSON answer, an error or a raw reply waits for the gate before its
    /// response starts. Calling it on a held reply replaces the hold.
    pub fn hold_after(self, chunks: usize, gate: Gate) -> Reply {
        let reply = match self {
            Reply::Held { reply, .. } => reply,
            other => Box::new(other),
        };
        Reply::Held {
            reply,
            after: chunks,
            gate,
        }
    }

    /// On Anthropic Messages, thinks `text` first (when the request turns thinking on). No
    /// effect on errors and raw replies.
    pub fn thinking(self, text: impl Into<String>) -> Reply {
        let text = text.into();
        match self {
            Reply::Completion(mut completion) => {
                completion.thinking = Some(text);
                Reply::Completion(completion)
            }
            Reply::Held { reply, after, gate } => Reply::Held {
                reply: Box::new(reply.thinking(text)),
                after,
                gate,
            },
            other => other,
        }
    }

    /// Streams the text in exactly `n` content chunks (at least one) instead of word by word:
    /// the pieces are as even as possible and concatenate to the text; when the text has fewer
    /// characters than `n`, the extra chunks carry `""`. No effect on errors and raw replies.
    pub fn stream_chunks(self, n: usize) -> Reply {
        match self {
            Reply::Completion(mut completion) => {
                completion.content_chunks = Some(n.max(1));
                Reply::Completion(completion)
            }
            Reply::Held { reply, after, gate } => Reply::Held {
                reply: Box::new(reply.stream_chunks(n)),
                after,
                gate,
            },
            other => other,
        }
    }
}

fn to_call((name, arguments): (String, Value)) -> ToolCall {
    ToolCall {
        id: None,
        name,
        arguments,
    }
}

/// A latch a test opens to let a held reply continue. Clones share the latch; once open it stays
/// open, so opening before the reply reaches its hold point is fine.
#[derive(Debug, Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate(Arc::new(watch::Sender::new(false)))
    }

    /// Opens the gate for every reply held on it.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the gate is open.
    pub(crate) async fn opened(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail with a closed channel.
        let _ = rx.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

/// The JSON form of a [`Reply`], as posted to `POST /_mock/replies`:
///
/// ```json
/// {"text": "hi"}
/// {"text": "a long answer", "stream_chunks": 200}
/// {"thinking": "the user wants…", "text": "hi"}
/// {"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}
/// {"text": "let me look", "tool_calls": [{"id": "call_1", "name": "f", "arguments": "{bad"}]}
/// {"error": {"status": 429, "body": {"error": {"message": "slow down", "type": "requests", "param": null, "code": null}}}}
/// {"raw": {"status": 502, "headers": [["content-type", "text/html"]], "body": "<html>bad gateway</html>"}}
/// ```
///
/// Exactly one of `text`/`tool_calls` (together allowed), `error` and `raw` must be present.
/// A gate cannot be expressed in JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<RawSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_chunks: Option<usize>,
    /// Anthropic Messages only: the answer's thinking text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

/// JSON form of [`Reply::Error`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorSpec {
    pub status: u16,
    pub body: Value,
}

/// JSON form of [`Reply::Raw`]; the body is text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    pub status: u16,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: String,
}

/// Why a [`ReplySpec`] does not describe a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid mock reply: {0}")]
pub struct InvalidReply(String);

impl TryFrom<ReplySpec> for Reply {
    type Error = InvalidReply;

    fn try_from(spec: ReplySpec) -> Result<Reply, InvalidReply> {
        let completion = spec.text.is_some() || spec.tool_calls.is_some();
        let kinds = [completion, spec.error.is_some(), spec.raw.is_some()];
        if kinds.iter().filter(|present| **present).count() != 1 {
            return Err(InvalidReply(
                "give exactly one of `text`/`tool_calls`, `error` or `raw`".into(),
            ));
        }
        if (spec.stream_chunks.is_some() || spec.thinking.is_some()) && !completion {
            return Err(InvalidReply(
                "`stream_chunks` and `thinking` apply only to `text`/`tool_calls` replies".into(),
            ));
        }
        if let Some(ErrorSpec { status, body }) = spec.error {
            return Ok(Reply::Error { status, body });
        }
        if let Some(RawSpec {
            status,
            headers,
            body,
        }) = spec.raw
        {
            return Ok(Reply::Raw {
                status,
                headers,
                body: Bytes::from(body),
            });
        }
        Ok(Reply::Completion(Completion {
            content: spec.text,
            tool_calls: spec.tool_calls.unwrap_or_default(),
            content_chunks: spec.stream_chunks.map(|n| n.max(1)),
            thinking: spec.thinking,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Reply, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn json_forms_parse_into_replies() {
        let Reply::Completion(c) = parse(json!({"text": "hi", "stream_chunks": 3})).unwrap() else {
            panic!("not a completion")
        };
        assert_eq!(c.content.as_deref(), Some("hi"));
        assert_eq!(c.content_chunks, Some(3));

        let Reply::Completion(c) =
            parse(json!({"tool_calls": [{"name": "f", "arguments": {"x": 1}}, {"name": "g"}]}))
                .unwrap()
        else {
            panic!("not a completion")
        };
        assert_eq!(c.content, None);
        assert_eq!(c.tool_calls[0].arguments_text(), r#"{"x":1}"#);
        assert_eq!(c.tool_calls[1].arguments_text(), "{}");

        let Reply::Error { status, body } =
            parse(json!({"error": {"status": 429, "body": {"error": {"message": "m"}}}})).unwrap()
        else {
            panic!("not an error")
        };
        assert_eq!(status, 429);
        assert_eq!(body, json!({"error": {"message": "m"}}));

        let Reply::Raw {
            status,
            headers,
            body,
        } = parse(json!({"raw": {"status": 502, "headers": [["a", "b"]], "body": "x"}})).unwrap()
        else {
            panic!("not raw")
        };
        assert_eq!(
            (status, headers, body),
            (502, vec![("a".into(), "b".into())], Bytes::from("x"))
        );
    }

    #[test]
    fn ambiguous_or_unknown_json_is_rejected() {
        for bad in [
            json!({}),
            json!({"text": "a", "error": {"status": 500, "body": {}}}),
            json!({"error": {"status": 500, "body": {}}, "stream_chunks": 2}),
            json!({"txt": "typo"}),
            json!({"tool_calls": [{"name": "f", "args": {}}]}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn string_arguments_are_sent_verbatim() {
        let call = ToolCall {
            id: None,
            name: "f".into(),
            arguments: json!("{not json"),
        };
        assert_eq!(call.arguments_text(), "{not json");
    }

    #[test]
    fn modifiers_compose() {
        let gate = Gate::new();
        let reply = Reply::text("a b")
            .hold_after(1, gate.clone())
            .stream_chunks(0)
            .hold_after(2, gate);
        let Reply::Held { reply, after, .. } = reply else {
            panic!("not held")
        };
        assert_eq!(after, 2);
        let Reply::Completion(c) = *reply else {
            panic!("hold nested")
        };
        assert_eq!(c.content_chunks, Some(1));
    }

    #[tokio::test]
    async fn gate_opened_before_waiting_does_not_block() {
        let gate = Gate::new();
        assert!(!gate.is_open());
        gate.clone().open();
        gate.opened().await;
        assert!(gate.is_open());
    }
}
