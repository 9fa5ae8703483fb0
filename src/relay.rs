//! Relaying an upstream response to the client as it arrives: status and end-to-end headers
//! unchanged, body chunks forwarded one by one with no buffering.
//!
//! When an event stream (`text/event-stream`) fails or falls silent mid-way at an event
//! boundary, the client gets one final `data: {"error":…}` event (how OpenAI reports an error
//! mid-stream) instead of a bare cut; anywhere else the connection is aborted so the client
//! sees an incomplete body rather than a truncated one passed off as whole.

use bytes::Bytes;
use futures_util::StreamExt;
use http::header;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::json;

use crate::body::{BoxError, ProxyBody};
use crate::upstream::{BodyError, Incoming};

/// The client's response for `incoming`.
pub fn relay(incoming: Incoming) -> http::Response<ProxyBody> {
    relay_observed(incoming, |_| {})
}

/// [`relay`], showing every chunk to `observe` as it passes (it must not block). `observe` is
/// dropped when the body ends or the client goes away.
pub fn relay_observed(
    mut incoming: Incoming,
    observe: impl FnMut(&Bytes) + Send + 'static,
) -> http::Response<ProxyBody> {
    let status = incoming.status;
    let headers = std::mem::take(&mut incoming.headers);
    let is_event_stream = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = relay_body(incoming.into_stream(), is_event_stream, observe);
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn relay_body(
    chunks: impl futures_util::Stream<Item = Result<Bytes, BodyError>> + Send + 'static,
    is_event_stream: bool,
    mut observe: impl FnMut(&Bytes) + Send + 'static,
) -> ProxyBody {
    let mut at_event_boundary = true;
    let frames = chunks.map(move |item| match item {
        Ok(bytes) => {
            observe(&bytes);
            if !bytes.is_empty() {
                at_event_boundary = bytes.ends_with(b"\n\n") || bytes.ends_with(b"\r\n\r\n");
            }
            Ok(Frame::data(bytes))
        }
        Err(err) => {
            tracing::warn!(error = %err, "upstream body ended early");
            if is_event_stream && at_event_boundary {
                Ok(Frame::data(error_event(&err)))
            } else {
                Err(BoxError::from(err))
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

/// One SSE event carrying `err` in the OpenAI error shape.
fn error_event(err: &BodyError) -> Bytes {
    let code = match err {
        BodyError::Idle { .. } => "upstream_timeout",
        BodyError::Failed { .. } => "upstream_stream_error",
    };
    let value = json!({
        "error": {"message": err.to_string(), "type": "upstream_error", "param": null, "code": code}
    });
    Bytes::from(format!("data: {value}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(body: ProxyBody) -> (Vec<u8>, bool) {
        let mut body = body;
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => out.extend_from_slice(f.data_ref().map(|b| &b[..]).unwrap_or_default()),
                Err(_) => return (out, true),
            }
        }
        (out, false)
    }

    fn failing(first: &'static str) -> impl futures_util::Stream<Item = Result<Bytes, BodyError>> {
        futures_util::stream::iter(vec![
            Ok(Bytes::from_static(first.as_bytes())),
            Err(BodyError::Idle {
                upstream: "u".into(),
                timeout_ms: 5,
            }),
        ])
    }

    #[tokio::test]
    async fn event_stream_failure_at_boundary_ends_with_error_event() {
        let (bytes, aborted) = collect(relay_body(failing("data: {}\n\n"), true, |_| {})).await;
        assert!(!aborted);
        let text = String::from_utf8(bytes).unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let event: serde_json::Value =
            serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(event["error"]["code"], "upstream_timeout");
    }

    #[tokio::test]
    async fn failure_mid_event_or_in_json_aborts() {
        let (_, aborted) = collect(relay_body(failing("data: {\"id\""), true, |_| {})).await;
        assert!(aborted);
        let (_, aborted) = collect(relay_body(failing("{\"id\":"), false, |_| {})).await;
        assert!(aborted);
    }
}
