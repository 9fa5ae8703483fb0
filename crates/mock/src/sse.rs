//! Streams SSE events to a client through a channel-backed response body, and tells whether the
//! client took them all or went away.
//!
//! A task feeds the events into a channel of capacity one, paced by `chunk_interval` and
//! optionally held at a gate; the body hyper sends is the channel's receiver. When the client goes
//! away hyper drops the body, so the task's next send (or its wait on `closed()`) fails: the
//! stream counts as cancelled. Once the task can reserve the channel's slot again after the last
//! event, that event has been handed to the connection: the stream counts as completed. A stream
//! cut short by shutdown ends its body with an error, so the client sees a broken stream rather
//! than a clean end without `[DONE]`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tracing::{debug, info_span, Instrument};

use super::ctx::Lifecycle;
use super::script::Gate;
use super::state::State;
use crate::body::{BoxError, MockBody};

/// Events to stream and how to pace them.
#[derive(Debug)]
pub(crate) struct StreamPlan {
    /// Complete SSE events, `data: [DONE]\n\n` included.
    pub(crate) events: Vec<Bytes>,
    /// Delay before every event after the first.
    pub(crate) interval: Duration,
    /// Send this many events, then wait for the gate before the rest.
    pub(crate) hold: Option<(usize, Gate)>,
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Every event was handed to the connection.
    Delivered,
    /// The client went away first.
    ClientGone,
}

/// Starts streaming `plan` and returns the response body; `id` names the task's span.
pub(crate) fn stream(plan: StreamPlan, id: &str, state: Arc<State>, life: Lifecycle) -> MockBody {
    let (tx, rx) = mpsc::channel(1);
    let finished = Arc::new(AtomicBool::new(false));
    let body = ChannelBody {
        rx,
        finished: finished.clone(),
    };
    let span = info_span!("mock_stream", id, events = plan.events.len());
    tokio::spawn(
        async move {
            match life.unless_stopping(deliver(&tx, plan)).await {
                Some(Outcome::Delivered) => {
                    debug!("stream delivered");
                    finished.store(true, Ordering::Release);
                    state.stream_completed();
                }
                Some(Outcome::ClientGone) => {
                    debug!("client went away mid-stream");
                    state.stream_cancelled();
                }
                None => debug!("stream stopped: mock shutting down"),
            }
        }
        .instrument(span),
    );
    body.boxed_unsync()
}

async fn deliver(tx: &mpsc::Sender<Bytes>, plan: StreamPlan) -> Outcome {
    let StreamPlan {
        events,
        interval,
        hold,
    } = plan;
    let count = events.len();
    let hold = hold.map(|(after, gate)| (after.min(count), gate));
    for (i, event) in events.into_iter().enumerate() {
        if let Some((_, gate)) = hold.as_ref().filter(|(at, _)| *at == i) {
            if until_client_gone(tx, gate.opened()).await.is_err() {
                return Outcome::ClientGone;
            }
        }
        if i > 0
            && !interval.is_zero()
            && until_client_gone(tx, tokio::time::sleep(interval))
                .await
                .is_err()
        {
            return Outcome::ClientGone;
        }
        if tx.send(event).await.is_err() {
            return Outcome::ClientGone;
        }
    }
    if let Some((_, gate)) = hold.as_ref().filter(|(at, _)| *at == count) {
        if until_client_gone(tx, gate.opened()).await.is_err() {
            return Outcome::ClientGone;
        }
    }
    // The slot frees up once the connection has taken the last event from the channel.
    match tx.reserve().await {
        Ok(_) => Outcome::Delivered,
        Err(_) => Outcome::ClientGone,
    }
}

/// Waits for `future`, or fails as soon as the body's receiver is dropped.
async fn until_client_gone(
    tx: &mpsc::Sender<Bytes>,
    future: impl std::future::Future<Output = ()>,
) -> Result<(), ()> {
    tokio::select! {
        () = future => Ok(()),
        () = tx.closed() => Err(()),
    }
}

/// A response body whose data frames come from a channel. When the sender is dropped it ends,
/// cleanly if the stream was `finished`, with an error otherwise.
#[derive(Debug)]
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    finished: Arc<AtomicBool>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        this.rx.poll_recv(cx).map(|event| match event {
            Some(bytes) => Some(Ok(Frame::data(bytes))),
            None if this.finished.load(Ordering::Acquire) => None,
            None => Some(Err("mock upstream stopped mid-stream".into())),
        })
    }
}
