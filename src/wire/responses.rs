//! The Responses API's stream endings (`docs/responses-wire.md`): a stream ends with exactly
//! one of `response.completed`, `response.incomplete` or `response.failed`, and clients
//! depend on it (the SDKs' stream helpers want a terminal event, Codex retries a stream that
//! just stops). [`failed_response`] is the `response` of a `response.failed` the proxy writes;
//! [`TerminalGuard`] keeps a relayed stream to that rule: an upstream `error` event becomes a
//! `response.failed` carrying its code and message, a stream that breaks off or ends without
//! a terminal event gets one, and nothing follows the terminal event.

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use super::sse::{SseConfig, SseReader};

/// Whether `kind` is an event type that ends a Responses stream.
pub fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

/// The code and message of an upstream `error` event: `{type:"error", code, message, param}`
/// as the API sends it, or `{type:"error", error:{code|type, message}}` as some compatible
/// servers do.
pub fn error_fields(event: &Value) -> (String, String) {
    let inner = event
        .get("error")
        .filter(|e| e.is_object())
        .unwrap_or(event);
    let text = |key: &str| inner.get(key).and_then(Value::as_str).map(str::to_owned);
    let code = text("code")
        .or_else(|| {
            inner
                .get("code")
                .filter(|c| c.is_number())
                .map(Value::to_string)
        })
        .or_else(|| text("type").filter(|t| t != "error"))
        .unwrap_or_else(|| "upstream_error".into());
    let message = text("message").unwrap_or_else(|| "the upstream reported an error".into());
    (code, message)
}

/// The `response` of a `response.failed` event: `base` (the stream's response object, from
/// its `response.created`) with `status: "failed"` and `error: {code, message}`.
pub fn failed_response(base: Option<&Value>, code: &str, message: &str) -> Value {
    let mut response = base
        .filter(|b| b.is_object())
        .cloned()
        .unwrap_or_else(|| json!({"object": "response", "output": []}));
    if let Value::Object(map) = &mut response {
        map.insert("status".into(), "failed".into());
        map.insert("error".into(), json!({"code": code, "message": message}));
    }
    response
}

/// One SSE frame of event `value` (its `type` names it), as the Responses API writes them.
pub fn frame(value: &Value) -> Bytes {
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {value}\n\n"))
}

/// Keeps a relayed Responses stream to one terminal event. Feed it the upstream's chunks; it
/// gives back whole events only (a partial one waits for its end), each as it came, except an
/// `error` event, which becomes the `response.failed` that ends the stream. Linear in the
/// bytes, bounded per event like any [`SseReader`].
#[derive(Debug)]
pub struct TerminalGuard {
    reader: SseReader,
    /// The response object of the stream's `response.created`.
    response: Option<Value>,
    /// The data of the last event passed on (its `sequence_number` is read only when the
    /// proxy must write the next event).
    last_data: Option<String>,
    /// A terminal event has been passed on (or written): nothing more goes to the client.
    ended: bool,
}

impl Default for TerminalGuard {
    fn default() -> Self {
        TerminalGuard {
            reader: SseReader::new(SseConfig {
                expect_done: false,
                ..SseConfig::default()
            }),
            response: None,
            last_data: None,
            ended: false,
        }
    }
}

impl TerminalGuard {
    /// The bytes the client gets for `chunk` (empty while an event is incomplete).
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        if self.ended {
            return Bytes::new();
        }
        self.reader.push(chunk);
        let mut out: Vec<Bytes> = Vec::new();
        loop {
            match self.reader.next_event() {
                Ok(Some(event)) => {
                    if let Some(bytes) = self.event(event.raw, event.event, event.data) {
                        out.push(bytes);
                    }
                    if self.ended {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    out.extend(self.fail("upstream_stream_error", &e.to_string()));
                    break;
                }
            }
        }
        join(out)
    }

    /// The upstream's body failed (`code`, `message` say how): the `response.failed` ending
    /// the client's stream, unless it had ended.
    pub fn fail(&mut self, code: &str, message: &str) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        self.ended = true;
        let mut event = json!({
            "type": "response.failed",
            "response": failed_response(self.response.as_ref(), code, message),
        });
        if let Some(next) = self.next_sequence() {
            event["sequence_number"] = next.into();
        }
        Some(frame(&event))
    }

    /// The upstream's body ended: what was held back, and a `response.failed` when no
    /// terminal event came (empty when the stream had ended well).
    pub fn finish(&mut self) -> Bytes {
        if self.ended {
            return Bytes::new();
        }
        let mut out = Vec::new();
        let mut cut = false;
        let mut rest = Vec::new();
        for event in self.reader.finish() {
            match event {
                Ok(event) => rest.push(event),
                Err(_) => cut = true,
            }
        }
        for event in rest {
            if !self.ended {
                out.extend(self.event(event.raw, event.event, event.data));
            }
        }
        let message = if cut {
            "the upstream's stream ended in the middle of an event; retry"
        } else {
            "the upstream's stream ended without response.completed; retry"
        };
        out.extend(self.fail("upstream_stream_error", message));
        join(out)
    }

    /// One whole event: what the client gets of it.
    fn event(&mut self, raw: Bytes, kind: Option<String>, data: Option<String>) -> Option<Bytes> {
        let Some(data) = data else {
            return Some(raw);
        };
        let kind = kind.or_else(|| {
            let value: Value = serde_json::from_str(&data).ok()?;
            Some(value.get("type")?.as_str()?.to_owned())
        });
        match kind.as_deref() {
            Some("response.created") => {
                self.response = serde_json::from_str::<Value>(&data)
                    .ok()
                    .and_then(|mut v| v.get_mut("response").map(Value::take));
            }
            Some("error") => {
                let value: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                let (code, message) = error_fields(&value);
                self.ended = true;
                let mut event = json!({
                    "type": "response.failed",
                    "response": failed_response(self.response.as_ref(), &code, &message),
                });
                // It takes the error event's place in the numbering.
                match value.get("sequence_number").and_then(Value::as_u64) {
                    Some(n) => event["sequence_number"] = n.into(),
                    None => {
                        if let Some(next) = self.next_sequence() {
                            event["sequence_number"] = next.into();
                        }
                    }
                }
                return Some(frame(&event));
            }
            Some(kind) if is_terminal(kind) => self.ended = true,
            _ => {}
        }
        self.last_data = Some(data);
        Some(raw)
    }

    /// The `sequence_number` after the last event passed on, when it had one.
    fn next_sequence(&self) -> Option<u64> {
        let last: Value = serde_json::from_str(self.last_data.as_deref()?).ok()?;
        Some(last.get("sequence_number")?.as_u64()? + 1)
    }
}

fn join(mut parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => {
            let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for part in parts {
                out.extend_from_slice(&part);
            }
            out.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                serde_json::from_str(data).unwrap()
            })
            .collect()
    }

    const CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n";
    const DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"output_index\":0,\"delta\":\"Hi\"}\n\n";
    const ERROR: &str = "event: error\ndata: {\"type\":\"error\",\"sequence_number\":2,\"code\":\"server_error\",\"message\":\"The model failed.\",\"param\":null}\n\n";

    #[test]
    fn an_error_event_becomes_the_one_response_failed() {
        let mut guard = TerminalGuard::default();
        let text = format!("{CREATED}{DELTA}{ERROR}{DELTA}");
        // Cut anywhere: whole events come out, the error rewritten, nothing after it.
        let mut out = Vec::new();
        for piece in text.as_bytes().chunks(7) {
            out.extend_from_slice(&guard.feed(piece));
        }
        assert!(guard.finish().is_empty());
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with(&format!("{CREATED}{DELTA}")), "{out}");
        let got = events(&out);
        assert_eq!(got.len(), 3);
        let last = &got[2];
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["sequence_number"], 2);
        assert_eq!(last["response"]["id"], "resp_1");
        assert_eq!(last["response"]["status"], "failed");
        assert_eq!(last["response"]["error"]["code"], "server_error");
        assert_eq!(last["response"]["error"]["message"], "The model failed.");
        assert!(out.contains("event: response.failed\n"));
    }

    #[test]
    fn a_stream_that_stops_or_breaks_gets_a_response_failed() {
        let mut guard = TerminalGuard::default();
        let out = guard.feed(format!("{CREATED}{DELTA}").as_bytes());
        assert_eq!(events(std::str::from_utf8(&out).unwrap()).len(), 2);
        let last = guard.finish();
        let last = &events(std::str::from_utf8(&last).unwrap())[0];
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["sequence_number"], 2);
        assert_eq!(last["response"]["error"]["code"], "upstream_stream_error");

        let mut guard = TerminalGuard::default();
        guard.feed(CREATED.as_bytes());
        let last = guard.fail("upstream_timeout", "silent for 5 ms").unwrap();
        let last = &events(std::str::from_utf8(&last).unwrap())[0];
        assert_eq!(last["response"]["id"], "resp_1");
        assert_eq!(last["response"]["error"]["code"], "upstream_timeout");
        assert!(guard.fail("again", "no").is_none());
    }

    #[test]
    fn a_whole_stream_passes_byte_for_byte() {
        let completed = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\"}}\n\n";
        let text = format!(": keep-alive\n\n{CREATED}{DELTA}{completed}");
        let mut guard = TerminalGuard::default();
        let out = guard.feed(text.as_bytes());
        assert_eq!(out, text.as_bytes());
        assert!(guard.finish().is_empty());
        // After the terminal event, nothing more goes out.
        assert!(guard.feed(ERROR.as_bytes()).is_empty());
    }

    #[test]
    fn error_events_of_either_shape_are_read() {
        let (code, message) =
            error_fields(&json!({"type": "error", "code": "rate_limit_exceeded", "message": "m"}));
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("rate_limit_exceeded", "m")
        );
        let (code, message) = error_fields(
            &json!({"type": "error", "error": {"type": "server_error", "message": "n"}}),
        );
        assert_eq!((code.as_str(), message.as_str()), ("server_error", "n"));
        let (code, _) = error_fields(&json!({"type": "error"}));
        assert_eq!(code, "upstream_error");
    }
}
