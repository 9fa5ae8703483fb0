//! The tool loop for a streamed Messages answer, live: each event goes to the client as it
//! arrives ([`crate::wire::messages::Relay`]): one `message_start`, the proxy's `tool_use`
//! blocks and their deltas held back, every other block renumbered so the client's indexes run
//! on over the rounds, `ping` forwarded. A round that called only the proxy's tools ends
//! without its `message_delta` and `message_stop`: the proxy runs the calls and continues the
//! same message with the next upstream stream. The last round ends with one `message_delta`
//! (usage summed over the rounds) and one `message_stop`, or an `error` event; then the
//! upstream transcript the client's message stands for is kept for the next turn.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::routes::tool_loop::stream::{
    self, Failure, NextEvent, Out, RoundEnd, RoundEvents, RoundRelay,
};
use crate::routes::tool_loop::{EventStream, Round};
use crate::upstream::Incoming;
use crate::wire::anthropic::error_event;
use crate::wire::messages::{calls_of, visible, Relay, Step};

/// The client's body: the loop on a task of its own.
pub fn spawn(round: Round, first: Incoming) -> EventStream {
    stream::spawn(round, first, Across::default())
}

/// What carries over from round to round.
#[derive(Default)]
struct Across {
    relay: Relay,
    /// The conversation's length before the first round appended to it.
    start: Option<usize>,
    /// The blocks the client got from the rounds so far.
    shown: Vec<Value>,
}

impl RoundRelay for Across {
    async fn relay(&mut self, round: &Round, answer: Incoming, out: &mut Out) -> RoundEnd {
        self.start.get_or_insert_with(|| round.conversation_len());
        let is_proxy = |name: &str| round.is_proxy(name);
        let mut events = RoundEvents::new(answer);
        loop {
            let event = match events.next(out).await {
                NextEvent::Event(event) => event,
                NextEvent::End => break,
                NextEvent::Closed => return RoundEnd::Stop,
                NextEvent::BrokeOff(e) => {
                    let message = format!("the upstream's stream broke off: {e}");
                    out.send(error(round, 502, &message)).await;
                    return RoundEnd::Stop;
                }
                NextEvent::Unreadable(e) => {
                    let message = format!(
                        "upstream {} sent an unreadable stream: {e}",
                        round.upstream.name
                    );
                    out.send(error(round, 502, &message)).await;
                    return RoundEnd::Stop;
                }
            };
            let (bytes, go_on) = match self.relay.event(&event, &is_proxy) {
                Step::Skip => continue,
                Step::Send(bytes) => (bytes, true),
                Step::Last(bytes) => (bytes, false),
            };
            if !out.send(bytes).await || !go_on {
                return RoundEnd::Stop;
            }
        }
        self.end(round, out).await
    }

    fn failure(&mut self, round: &Round, failure: Failure) -> Bytes {
        match failure {
            // The upstream's own error object when it sent one, else the proxy's.
            Failure::Status {
                error: Some(error), ..
            } => crate::wire::messages::event_bytes(&json!({"type": "error", "error": error})),
            Failure::Status {
                status,
                error: None,
            } => error(
                round,
                status.as_u16(),
                &format!(
                    "upstream {} answered {status} during the proxy's tool round",
                    round.upstream.name
                ),
            ),
            Failure::Unreachable(e) => error(round, 502, &e),
        }
    }
}

impl Across {
    /// The upstream's stream has ended: go on with the proxy's calls, or end the message.
    async fn end(&mut self, round: &Round, out: &mut Out) -> RoundEnd {
        let (proxy, client) = self.relay.calls();
        let message = self.relay.message();
        let content = message["content"].as_array().cloned().unwrap_or_default();
        if !self.relay.assembled().stopped() {
            tracing::warn!("upstream stream ended before message_stop during the tool loop");
            let message = format!(
                "upstream {} ended its stream in the middle of an answer; retry",
                round.upstream.name
            );
            out.send(error(round, 502, &message)).await;
            return RoundEnd::Stop;
        }
        let is_proxy = |name: &str| round.is_proxy(name);
        let withdrawn = round.tools_withdrawn();
        if proxy && !client && !withdrawn {
            self.shown.extend(visible(&content, &is_proxy));
            let calls = calls_of(&content);
            self.relay.next_round();
            return RoundEnd::Continue(vec![message], calls);
        }
        let mut last = vec![message];
        let mut results = Vec::new();
        let mut stop_reason = None;
        if proxy && client && !withdrawn {
            // Mixed: the client got its own calls; the proxy answers its own and keeps them.
            let calls = calls_of(&content);
            results = tokio::select! {
                () = out.closed() => return RoundEnd::Stop,
                results = round.run_calls(&calls) => results,
            };
        } else if proxy {
            // Withdrawn: the proxy's calls are dropped, not run.
            let rounds = round
                .stats
                .rounds
                .load(std::sync::atomic::Ordering::Relaxed) as usize;
            tracing::warn!(
                rounds,
                "the model called the proxy's tools after they were withdrawn: not run"
            );
            let kept = visible(&content, &is_proxy);
            if kept.is_empty() && self.shown.is_empty() {
                let error = crate::http::error::ProxyError::ToolLoopExhausted { rounds };
                out.send(crate::wire::anthropic::error_event(
                    error.classify().0.as_u16(),
                    &error.to_string(),
                    &round.request_id,
                ))
                .await;
                return RoundEnd::Stop;
            }
            last = vec![json!({"role": "assistant", "content": kept})];
            if !client {
                stop_reason = Some("end_turn");
            }
        }
        self.shown.extend(visible(&content, &is_proxy));
        let rounds = round
            .stats
            .rounds
            .load(std::sync::atomic::Ordering::Relaxed);
        if rounds > 0 || !results.is_empty() {
            let shown = json!({"role": "assistant", "content": self.shown});
            let start = self.start.unwrap_or_default();
            round.keep_rounds(start, last, &shown, results).await;
        }
        out.send(self.relay.closing(stop_reason)).await;
        RoundEnd::Stop
    }
}

/// An error event in Anthropic's shape, the last the client gets.
fn error(round: &Round, status: u16, message: &str) -> Bytes {
    error_event(status, message, &round.request_id)
}
