//! The streaming tool loop's driver, the same for every wire: the loop runs on a task of its
//! own (with a span) and sends the client's events through a bounded channel; it relays a
//! round with the wire's [`RoundRelay`], runs the proxy's calls, sends the next request and
//! relays its answer, until a round is the client's. A client that goes away stops the loop
//! and the upstream call. An upstream that fails once the stream has started ends it with the
//! relay's error event (the wire's shape), never silently.

use std::future::Future;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{EventStream, Round};
use crate::upstream::{BodyError, Incoming};
use crate::wire::sse::{Event, SseReader};
use crate::wire::ToolCall;

/// Events buffered between the loop and the client's connection.
const CHANNEL_EVENTS: usize = 64;

/// The client's side of a streaming loop.
pub struct Out {
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
}

impl Out {
    /// Sends to the client; false once it has gone away.
    pub async fn send(&mut self, bytes: Bytes) -> bool {
        self.tx.send(Ok(bytes)).await.is_ok()
    }

    /// Resolves once the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// How one round ended.
pub enum RoundEnd {
    /// The model called only the proxy's tools: the round's output (what the conversation
    /// continues with) and its calls; run them and go on.
    Continue(Vec<Value>, Vec<ToolCall>),
    /// The answer is complete (or failed, or the client left): stop.
    Stop,
}

/// Why the next round could not start, once the client's stream has begun.
pub enum Failure {
    /// The upstream answered this status; `error` is its error object when it sent one.
    Status {
        status: http::StatusCode,
        error: Option<Value>,
    },
    /// The upstream could not be reached.
    Unreachable(String),
}

/// One wire's relay of a streamed answer, with what it carries from round to round.
pub trait RoundRelay: Send + 'static {
    /// Relays one upstream answer to the client, hiding the proxy's calls.
    fn relay(
        &mut self,
        round: &Round,
        answer: Incoming,
        out: &mut Out,
    ) -> impl Future<Output = RoundEnd> + Send;

    /// The last event(s) of a stream whose next round failed to start.
    fn failure(&mut self, round: &Round, failure: Failure) -> Bytes;
}

/// The client's body: `relay` relays `first` and each later round, on a task of its own that
/// stops when this stream is dropped.
pub fn spawn<R: RoundRelay>(round: Round, first: Incoming, relay: R) -> EventStream {
    let (tx, rx) = mpsc::channel(CHANNEL_EVENTS);
    let span = tracing::debug_span!("reload_stream", request_id = %round.request_id);
    tokio::spawn(
        async move {
            let mut out = Out { tx };
            drive(round, first, relay, &mut out).await;
        }
        .instrument(span),
    );
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

async fn drive<R: RoundRelay>(mut round: Round, first: Incoming, mut relay: R, out: &mut Out) {
    let mut answer = first;
    loop {
        let RoundEnd::Continue(output, calls) = relay.relay(&round, answer, out).await else {
            return;
        };
        let results = tokio::select! {
            () = out.closed() => return,
            results = round.run_calls(&calls) => results,
        };
        let request = round.next_request(output, results);
        let sent = tokio::select! {
            () = out.closed() => return,
            sent = round.upstream.send(&request) => sent,
        };
        round.stats.upstream_calls.fetch_add(1, Ordering::Relaxed);
        answer = match sent {
            Ok(a) if a.status.is_success() => a,
            Ok(a) => {
                // The stream already started: the upstream's error becomes the final event.
                let status = a.status;
                let body = read_error(a).await;
                let error = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("error").cloned());
                let last = relay.failure(&round, Failure::Status { status, error });
                out.send(last).await;
                return;
            }
            Err(e) => {
                let last = relay.failure(&round, Failure::Unreachable(e.to_string()));
                out.send(last).await;
                return;
            }
        };
    }
}

/// The (small) body of an upstream error, bounded.
async fn read_error(answer: Incoming) -> Bytes {
    const MAX: usize = 1 << 20;
    let mut out = Vec::new();
    let mut chunks = std::pin::pin!(answer.into_stream());
    while let Some(Ok(chunk)) = chunks.next().await {
        out.extend_from_slice(&chunk);
        if out.len() > MAX {
            break;
        }
    }
    Bytes::from(out)
}

/// One round's upstream answer, read as SSE events as they arrive: what every wire's relay
/// reads the same way (only what it does with an event, and how it words a failure, differ).
pub struct RoundEvents {
    reader: SseReader,
    chunks: std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, BodyError>> + Send>>,
}

/// What reading a round's next event gave.
pub enum NextEvent {
    Event(Event),
    /// The upstream's answer ended.
    End,
    /// The client left.
    Closed,
    /// The upstream's stream broke off (the error's text).
    BrokeOff(String),
    /// The upstream's bytes are not a readable event stream (the error's text).
    Unreadable(String),
}

impl RoundEvents {
    pub fn new(answer: Incoming) -> RoundEvents {
        RoundEvents {
            reader: SseReader::default(),
            chunks: Box::pin(answer.into_stream()),
        }
    }

    /// The next event, waiting for the upstream's next chunk while the client is there.
    pub async fn next(&mut self, out: &Out) -> NextEvent {
        loop {
            match self.reader.next_event() {
                Ok(Some(event)) => return NextEvent::Event(event),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable upstream stream during the tool loop");
                    return NextEvent::Unreadable(e.to_string());
                }
            }
            let next = tokio::select! {
                () = out.closed() => return NextEvent::Closed,
                next = self.chunks.next() => next,
            };
            match next {
                None => return NextEvent::End,
                Some(Ok(bytes)) => self.reader.push(&bytes),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "upstream stream ended early during the tool loop");
                    return NextEvent::BrokeOff(e.to_string());
                }
            }
        }
    }
}
