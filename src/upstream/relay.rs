//! Relaying an upstream response to the client as it arrives: status and end-to-end headers
//! unchanged, body chunks forwarded one by one with no buffering.
//!
//! When an event stream (`text/event-stream`) fails or falls silent mid-way at an event
//! boundary, the client gets one final error event in its API's shape ([`StreamErrors`]: a
//! `data: {"error":…}` event as OpenAI reports an error mid-stream, or Anthropic's
//! `event: error`) instead of a bare cut; anywhere else the connection is aborted so the client
//! sees an incomplete body rather than a truncated one passed off as whole. A Responses API
//! stream is relayed event by event through a [`TerminalGuard`]: it always ends with exactly
//! one terminal event (an upstream `error` event, a break or an early end become
//! `response.failed`); an Anthropic Messages stream the upstream ends before its `message_stop`
//! ends with Anthropic's `error` event.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::header;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use crate::http::body::{BoxError, ProxyBody};
use crate::upstream::{BodyError, Incoming};
use crate::wire::anthropic;
use crate::wire::error::openai_error;
use crate::wire::responses::TerminalGuard;

/// The shape of the final error event of a stream that fails mid-way: the client's API's.
#[derive(Debug, Clone, Default)]
pub enum StreamErrors {
    /// `data: {"error":{…}}`, as OpenAI's APIs report an error mid-stream.
    #[default]
    OpenAi,
    /// `event: error` with `{"type":"error","error":{"type","message"},"request_id"}`, as
    /// Anthropic's Messages API does.
    Anthropic { request_id: String },
    /// The Responses API's: exactly one terminal event, `response.failed` when the stream
    /// fails, breaks off or ends early, or when the upstream sends an `error` event.
    Responses,
}

/// How a relayed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The upstream's body was relayed whole.
    Complete,
    /// The upstream failed or fell silent mid-way.
    Failed,
    /// The client went away (or the server cut the connection) before the end.
    Cancelled,
}

/// Sees a relayed body as it passes. Neither method may block: they run on the response path.
pub trait Observer: Send + 'static {
    /// Every chunk, before it is sent on.
    fn chunk(&mut self, _bytes: &Bytes) {}
    /// Once, when the body ended or was dropped.
    fn end(&mut self, _end: End) {}
}

/// Observes nothing.
impl Observer for () {}

/// The client's response for `incoming`.
pub fn relay(incoming: Incoming) -> http::Response<ProxyBody> {
    relay_observed(incoming, (), StreamErrors::OpenAi)
}

/// [`relay`], showing every chunk and the end of the body to `observer`. The observer is told
/// the end exactly once, also when the client goes away and the body is dropped. A stream that
/// fails mid-way ends with an error event in the shape of `errors` (the client's API's).
pub fn relay_observed(
    mut incoming: Incoming,
    observer: impl Observer,
    errors: StreamErrors,
) -> http::Response<ProxyBody> {
    let status = incoming.status;
    let mut headers = std::mem::take(&mut incoming.headers);
    let is_event_stream = is_event_stream(&headers);
    let length = content_length(&headers);
    guard_length(&mut headers, is_event_stream, &errors);
    let body = relay_body(
        incoming.into_stream(),
        is_event_stream,
        length,
        observer,
        errors,
    );
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Whether `headers` say the body is an event stream (`text/event-stream`).
pub fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The body's length as its `Content-Length` declares it.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A Responses or Anthropic event stream the proxy may end with an event of its own has no
/// declared length (the client would stop reading at it); it goes chunked.
fn guard_length(headers: &mut http::HeaderMap, is_event_stream: bool, errors: &StreamErrors) {
    if is_event_stream && !matches!(errors, StreamErrors::OpenAi) {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// Whether a chunk of an event stream ends where an event ends (a blank line).
pub fn ends_event(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\n\n") || chunk.ends_with(b"\r\n\r\n")
}

/// A response built by the proxy (`status`, end-to-end `headers`, the body as `chunks`),
/// relayed the same way as an upstream's, with `observer` and `errors`.
pub fn respond_observed(
    status: http::StatusCode,
    headers: http::HeaderMap,
    chunks: impl Stream<Item = Result<Bytes, BodyError>> + Send + 'static,
    observer: impl Observer,
    errors: StreamErrors,
) -> http::Response<ProxyBody> {
    let mut headers = headers;
    let is_event_stream = is_event_stream(&headers);
    let length = content_length(&headers);
    guard_length(&mut headers, is_event_stream, &errors);
    let body = relay_body(chunks, is_event_stream, length, observer, errors);
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

type Chunks = Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>>;

/// The upstream's chunks with an observer: tells it each chunk, and the end once (on drop at
/// the latest).
struct Observed<O: Observer> {
    chunks: Chunks,
    observer: O,
    ended: bool,
    /// Bytes still to come when the body's length is declared: once they have all passed, the
    /// body is whole (hyper stops polling a body at its `Content-Length` and drops it, so its
    /// end would otherwise look like a client that left).
    remaining: Option<u64>,
}

impl<O: Observer> Observed<O> {
    fn end(&mut self, end: End) {
        if !self.ended {
            self.ended = true;
            self.observer.end(end);
        }
    }
}

impl<O: Observer + Unpin> Stream for Observed<O> {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let polled = this.chunks.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(bytes))) => {
                this.observer.chunk(bytes);
                if let Some(remaining) = &mut this.remaining {
                    *remaining = remaining.saturating_sub(bytes.len() as u64);
                    if *remaining == 0 {
                        this.end(End::Complete);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => this.end(End::Failed),
            Poll::Ready(None) => this.end(End::Complete),
            Poll::Pending => {}
        }
        polled
    }
}

impl<O: Observer> Drop for Observed<O> {
    fn drop(&mut self) {
        self.end(End::Cancelled);
    }
}

fn relay_body(
    chunks: impl Stream<Item = Result<Bytes, BodyError>> + Send + 'static,
    is_event_stream: bool,
    length: Option<u64>,
    observer: impl Observer,
    errors: StreamErrors,
) -> ProxyBody {
    let mut at_event_boundary = true;
    let observed = Observed {
        chunks: Box::pin(chunks),
        observer: Unpinned(observer),
        ended: false,
        remaining: length.filter(|&n| n > 0),
    };
    if is_event_stream && matches!(errors, StreamErrors::Responses) {
        return StreamBody::new(Guarded {
            chunks: observed,
            guard: TerminalGuard::default(),
            done: false,
        })
        .boxed_unsync();
    }
    if is_event_stream {
        if let StreamErrors::Anthropic { request_id } = &errors {
            return StreamBody::new(Ended {
                chunks: observed,
                request_id: request_id.clone(),
                at_event_boundary: true,
                seen_end: false,
                tail: b"\n".to_vec(),
                done: false,
            })
            .boxed_unsync();
        }
    }
    let frames = observed.map(move |item| match item {
        Ok(bytes) => {
            if !bytes.is_empty() {
                at_event_boundary = ends_event(&bytes);
            }
            Ok(Frame::data(bytes))
        }
        Err(err) => {
            tracing::warn!(error = %err, "upstream body ended early");
            if is_event_stream && at_event_boundary {
                Ok(Frame::data(error_event(&err, &errors)))
            } else {
                Err(BoxError::from(err))
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

/// A Responses event stream through its [`TerminalGuard`]: whole events, one terminal event.
struct Guarded<S> {
    chunks: S,
    guard: TerminalGuard,
    done: bool,
}

impl<S> Stream for Guarded<S>
where
    S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
{
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let bytes = match std::task::ready!(this.chunks.poll_next_unpin(cx)) {
                Some(Ok(bytes)) => this.guard.feed(&bytes),
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "upstream body ended early");
                    this.done = true;
                    let (code, _) = error_code(&err);
                    this.guard.fail(code, &err.to_string()).unwrap_or_default()
                }
                None => {
                    this.done = true;
                    this.guard.finish()
                }
            };
            if !bytes.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
        }
    }
}

/// An Anthropic event stream, relayed chunk by chunk: one the upstream ends before its
/// `message_stop` (or an `error` event) ends with Anthropic's error event, as one that breaks
/// off between two events does; one that breaks off inside an event is aborted.
struct Ended<S> {
    chunks: S,
    request_id: String,
    at_event_boundary: bool,
    /// Whether a `message_stop` or `error` event went by (the stream's last event).
    seen_end: bool,
    /// The last bytes seen, so that an event name split across two chunks is still found.
    tail: Vec<u8>,
    done: bool,
}

/// The starts of the events that end an Anthropic stream, at the start of a line (a JSON
/// string, where a text could name them, holds no raw newline).
const ANTHROPIC_ENDS: [&[u8]; 4] = [
    b"\nevent: message_stop",
    b"\nevent: error",
    b"\ndata: {\"type\":\"message_stop\"",
    b"\ndata: {\"type\":\"error\"",
];

impl<S> Ended<S> {
    fn saw(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.at_event_boundary = ends_event(bytes);
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(bytes);
        self.seen_end |= ANTHROPIC_ENDS
            .iter()
            .any(|end| window.windows(end.len()).any(|w| w == *end));
        let keep = window.len().saturating_sub(32);
        self.tail = window.split_off(keep);
    }
}

impl<S> Stream for Ended<S>
where
    S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
{
    type Item = Result<Frame<Bytes>, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match std::task::ready!(this.chunks.poll_next_unpin(cx)) {
            Some(Ok(bytes)) => {
                this.saw(&bytes);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, "upstream body ended early");
                this.done = true;
                if this.at_event_boundary {
                    let errors = StreamErrors::Anthropic {
                        request_id: this.request_id.clone(),
                    };
                    Poll::Ready(Some(Ok(Frame::data(error_event(&err, &errors)))))
                } else {
                    Poll::Ready(Some(Err(BoxError::from(err))))
                }
            }
            None => {
                this.done = true;
                if this.seen_end {
                    return Poll::Ready(None);
                }
                tracing::warn!("upstream stream ended before message_stop");
                let message = "the upstream's stream ended before message_stop; retry";
                if this.at_event_boundary {
                    let event = anthropic::error_event(502, message, &this.request_id);
                    Poll::Ready(Some(Ok(Frame::data(event))))
                } else {
                    Poll::Ready(Some(Err(BoxError::from(message))))
                }
            }
        }
    }
}

/// Any observer, made `Unpin` (its methods take `&mut self`; it is never pinned in place).
struct Unpinned<O>(O);

impl<O: Observer> Observer for Unpinned<O> {
    fn chunk(&mut self, bytes: &Bytes) {
        self.0.chunk(bytes);
    }
    fn end(&mut self, end: End) {
        self.0.end(end);
    }
}

impl<O> Unpin for Unpinned<O> {}

/// The error code and the HTTP status that stand for `err`.
fn error_code(err: &BodyError) -> (&'static str, u16) {
    match err {
        BodyError::Idle { .. } => ("upstream_timeout", 504),
        BodyError::Failed { .. } => ("upstream_stream_error", 502),
    }
}

/// One SSE event carrying `err` in the client's API's error shape.
fn error_event(err: &BodyError, errors: &StreamErrors) -> Bytes {
    let (code, status) = error_code(err);
    match errors {
        StreamErrors::OpenAi | StreamErrors::Responses => {
            let value = openai_error(&err.to_string(), "upstream_error", None, Some(code));
            Bytes::from(format!("data: {value}\n\n"))
        }
        StreamErrors::Anthropic { request_id } => {
            anthropic::error_event(status, &err.to_string(), request_id)
        }
    }
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
        let (bytes, aborted) = collect(relay_body(
            failing("data: {}\n\n"),
            true,
            None,
            (),
            StreamErrors::OpenAi,
        ))
        .await;
        assert!(!aborted);
        let text = String::from_utf8(bytes).unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let event: serde_json::Value =
            serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(event["error"]["code"], "upstream_timeout");
    }

    #[tokio::test]
    async fn an_anthropic_stream_ends_with_anthropics_error_event() {
        let errors = StreamErrors::Anthropic {
            request_id: "req_1".into(),
        };
        let stream = failing("event: ping\ndata: {\"type\":\"ping\"}\n\n");
        let (bytes, aborted) = collect(relay_body(stream, true, None, (), errors)).await;
        assert!(!aborted);
        let text = String::from_utf8(bytes).unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let data = last.strip_prefix("event: error\ndata: ").expect(last);
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["type"], "error");
        assert_eq!(event["error"]["type"], "api_error");
        assert_eq!(event["request_id"], "req_1");
        assert!(event.get("code").is_none());
    }

    /// An Anthropic stream the upstream ends cleanly before its `message_stop` ends with
    /// Anthropic's error event, as a break does (the SDKs would take the half answer for a
    /// whole one); one that ends with `message_stop` or the upstream's own `error` event, even
    /// split across chunks, is left as it came.
    #[tokio::test]
    async fn an_anthropic_stream_ended_before_message_stop_gets_an_error_event() {
        let errors = || StreamErrors::Anthropic {
            request_id: "req_1".into(),
        };
        let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
        // A text that names the event is no end.
        let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"event: message_stop\"}}\n\n";
        let chunks = |parts: Vec<String>| {
            futures_util::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from(p))))
        };
        let (bytes, aborted) = collect(relay_body(
            chunks(vec![start.into(), delta.into()]),
            true,
            None,
            (),
            errors(),
        ))
        .await;
        assert!(!aborted);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with(&format!("{start}{delta}")), "{text}");
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let data = last.strip_prefix("event: error\ndata: ").expect(last);
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["error"]["type"], "api_error");
        assert!(
            event["error"]["message"]
                .as_str()
                .unwrap()
                .contains("message_stop"),
            "{event}"
        );
        for end in [
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        ] {
            let whole = format!("{start}{delta}{end}");
            let cut = start.len() + delta.len() + 9;
            let parts = vec![whole[..cut].to_string(), whole[cut..].to_string()];
            let (bytes, aborted) =
                collect(relay_body(chunks(parts), true, None, (), errors())).await;
            assert!(!aborted);
            assert_eq!(String::from_utf8(bytes).unwrap(), whole);
        }
    }

    #[tokio::test]
    async fn a_responses_stream_that_fails_ends_with_response_failed() {
        let created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\"}}\n\n";
        // Cut mid-event: the whole events go, then one response.failed.
        let half = Box::leak(format!("{created}event: response.in_pro").into_boxed_str());
        let (bytes, aborted) = collect(relay_body(
            failing(half),
            true,
            None,
            (),
            StreamErrors::Responses,
        ))
        .await;
        assert!(!aborted);
        let text = String::from_utf8(bytes).unwrap();
        let (first, last) = text.trim_end().split_once("\n\n").unwrap();
        assert_eq!(format!("{first}\n\n"), created);
        let data = last
            .strip_prefix("event: response.failed\ndata: ")
            .expect(last);
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["sequence_number"], 1);
        assert_eq!(event["response"]["id"], "resp_1");
        assert_eq!(event["response"]["error"]["code"], "upstream_timeout");
    }

    #[tokio::test]
    async fn failure_mid_event_or_in_json_aborts() {
        let (_, aborted) = collect(relay_body(
            failing("data: {\"id\""),
            true,
            None,
            (),
            StreamErrors::OpenAi,
        ))
        .await;
        assert!(aborted);
        let (_, aborted) = collect(relay_body(
            failing("{\"id\":"),
            false,
            None,
            (),
            StreamErrors::OpenAi,
        ))
        .await;
        assert!(aborted);
    }

    /// Records what it was told.
    #[derive(Clone, Default)]
    struct Seen(std::sync::Arc<std::sync::Mutex<(Vec<u8>, Vec<End>)>>);

    impl Observer for Seen {
        fn chunk(&mut self, bytes: &Bytes) {
            self.0.lock().unwrap().0.extend_from_slice(bytes);
        }
        fn end(&mut self, end: End) {
            self.0.lock().unwrap().1.push(end);
        }
    }

    #[tokio::test]
    async fn the_observer_sees_every_chunk_and_the_end_once() {
        let chunks = futures_util::stream::iter(vec![
            Ok(Bytes::from_static(b"data: 1\n\n")),
            Ok(Bytes::from_static(b"data: 2\n\n")),
        ]);
        let seen = Seen::default();
        let (bytes, aborted) = collect(relay_body(
            chunks,
            true,
            None,
            seen.clone(),
            StreamErrors::OpenAi,
        ))
        .await;
        assert!(!aborted);
        let (observed, ends) = seen.0.lock().unwrap().clone();
        assert_eq!(observed, bytes);
        assert_eq!(ends, vec![End::Complete]);

        let seen = Seen::default();
        collect(relay_body(
            failing("data: {}\n\n"),
            true,
            None,
            seen.clone(),
            StreamErrors::OpenAi,
        ))
        .await;
        assert_eq!(seen.0.lock().unwrap().1, vec![End::Failed]);
    }

    #[tokio::test]
    async fn a_body_of_declared_length_is_complete_once_it_has_all_passed() {
        // The end of the stream is never polled (hyper stops at Content-Length), then dropped.
        let chunks = futures_util::stream::iter(vec![Ok(Bytes::from_static(b"{\"id\":1}"))])
            .chain(futures_util::stream::pending());
        let seen = Seen::default();
        let mut body = relay_body(chunks, false, Some(8), seen.clone(), StreamErrors::OpenAi);
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(seen.0.lock().unwrap().1, vec![End::Complete]);
        // Short of its length, it was cut.
        let chunks = futures_util::stream::iter(vec![Ok(Bytes::from_static(b"{\"id\""))])
            .chain(futures_util::stream::pending());
        let seen = Seen::default();
        let mut body = relay_body(chunks, false, Some(8), seen.clone(), StreamErrors::OpenAi);
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(seen.0.lock().unwrap().1, vec![End::Cancelled]);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_tells_the_observer_cancelled() {
        let chunks = futures_util::stream::iter(vec![Ok(Bytes::from_static(b"data: 1\n\n"))])
            .chain(futures_util::stream::pending());
        let seen = Seen::default();
        let mut body = relay_body(chunks, true, None, seen.clone(), StreamErrors::OpenAi);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().as_ref(), b"data: 1\n\n");
        assert!(seen.0.lock().unwrap().1.is_empty());
        drop(body);
        assert_eq!(seen.0.lock().unwrap().1, vec![End::Cancelled]);
    }
}
