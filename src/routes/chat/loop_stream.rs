//! The tool loop for a streamed answer, live. The upstream request keeps `stream: true`; each
//! event goes to the client as it arrives, except the fragments of the proxy's own tool calls
//! (held back from the first fragment, which names the tool; the client's calls are renumbered
//! around them). A round that called only the proxy's tools ends without its finish chunk: the
//! proxy runs the calls, opens the next upstream stream and continues the same response (same
//! `id`, `created`, `model`, `system_fingerprint`). With `stream_options.include_usage`, one
//! usage chunk comes at the very end, summed over the rounds. A client that goes away stops the
//! loop and the upstream call.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::tool_loop::{assistant_message, Round};
use crate::upstream::{BodyError, Incoming};
use crate::wire::error::openai_error;
use crate::wire::sse::data_event;
use crate::wire::{ChatAccumulator, Filtered, SseReader, ToolCallFilter, Usage};

/// Events buffered between the loop and the client's connection.
const CHANNEL_EVENTS: usize = 64;

/// The client's body: events as the loop produces them. The loop runs on its own task (with a
/// span) and stops when this stream is dropped.
pub fn spawn(round: Round, first: Incoming) -> impl Stream<Item = Result<Bytes, BodyError>> + Send {
    let (tx, rx) = mpsc::channel(CHANNEL_EVENTS);
    let span = tracing::debug_span!("reload_stream", request_id = %round.request_id);
    tokio::spawn(
        async move {
            let mut out = Out { tx };
            run(round, first, &mut out).await;
        }
        .instrument(span),
    );
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

struct Out {
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
}

impl Out {
    /// Sends to the client; false once it has gone away.
    async fn send(&mut self, bytes: Bytes) -> bool {
        self.tx.send(Ok(bytes)).await.is_ok()
    }

    async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// The first round's `id`, `created`, `model` and `system_fingerprint`, which every later
/// round's chunks take over.
#[derive(Default)]
struct Header {
    fields: Vec<(&'static str, Value)>,
}

impl Header {
    fn learn(&mut self, chunk: &Value) {
        if !self.fields.is_empty() {
            return;
        }
        for key in ["id", "created", "model", "system_fingerprint"] {
            if let Some(v) = chunk.get(key) {
                self.fields.push((key, v.clone()));
            }
        }
    }

    /// Rewrites `chunk` with the first round's values; whether anything changed.
    fn apply(&self, chunk: &mut Value) -> bool {
        let mut changed = false;
        if let Value::Object(map) = chunk {
            for (key, value) in &self.fields {
                if let Some(slot) = map.get_mut(*key) {
                    if slot != value {
                        *slot = value.clone();
                        changed = true;
                    }
                }
            }
        }
        changed
    }
}

/// How one round ended.
enum RoundEnd {
    /// The model called only the proxy's tools: run them and go on.
    Continue(Value, Vec<crate::wire::ToolCall>),
    /// The answer is complete (or failed, or the client left): stop.
    Stop,
}

async fn run(mut round: Round, first: Incoming, out: &mut Out) {
    let mut header = Header::default();
    let mut usage: Option<Usage> = None;
    let mut usage_chunk: Option<Value> = None;
    let mut answer = first;
    loop {
        let end = relay_round(
            &round,
            answer,
            out,
            &mut header,
            &mut usage,
            &mut usage_chunk,
        )
        .await;
        let RoundEnd::Continue(assistant, calls) = end else {
            return;
        };
        let results = tokio::select! {
            () = out.closed() => return,
            results = round.run_calls(&calls) => results,
        };
        let request = round.next_request(assistant, results);
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
                // The upstream's own error object when it sent one, else the proxy's.
                let error = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("error").cloned())
                    .map(|error| json!({ "error": error }))
                    .unwrap_or_else(|| {
                        openai_error(
                            &format!(
                                "upstream {} answered {status} during the proxy's tool round",
                                round.upstream.name
                            ),
                            "upstream_error",
                            None,
                            Some("upstream_error"),
                        )
                    });
                out.send(data_event(&error)).await;
                return;
            }
            Err(e) => {
                let error = openai_error(
                    &e.to_string(),
                    "upstream_error",
                    None,
                    Some("upstream_unreachable"),
                );
                out.send(data_event(&error)).await;
                return;
            }
        };
    }
}

/// Relays one upstream stream to the client, hiding the proxy's calls.
async fn relay_round(
    round: &Round,
    answer: Incoming,
    out: &mut Out,
    header: &mut Header,
    usage: &mut Option<Usage>,
    usage_chunk: &mut Option<Value>,
) -> RoundEnd {
    let later_round = round.stats.rounds.load(Ordering::Relaxed) > 0;
    // After the last round the proxy's tools are gone: a call of them is hidden, never run.
    let withdrawn = round.tools_withdrawn();
    let mut reader = SseReader::default();
    let mut acc = ChatAccumulator::new();
    let mut filter = ToolCallFilter::new();
    let mut proxy_calls = false;
    let mut client_calls = false;
    // Set once the round is known to go on: from then on nothing of it reaches the client.
    let mut continuing = false;
    let mut saw_done = false;
    // A finish reason was seen: the answer is whole.
    let mut finished = false;
    let mut chunks = std::pin::pin!(answer.into_stream());
    loop {
        let next = tokio::select! {
            () = out.closed() => return RoundEnd::Stop,
            next = chunks.next() => next,
        };
        let bytes = match next {
            None => break,
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "upstream stream ended early during the tool loop");
                let error = openai_error(
                    &e.to_string(),
                    "upstream_error",
                    None,
                    Some("upstream_stream_error"),
                );
                out.send(data_event(&error)).await;
                return RoundEnd::Stop;
            }
        };
        reader.push(&bytes);
        loop {
            let event = match reader.next_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable upstream stream during the tool loop");
                    let error = openai_error(
                        &format!(
                            "upstream {} sent an unreadable stream: {e}",
                            round.upstream.name
                        ),
                        "upstream_error",
                        None,
                        Some("upstream_stream_error"),
                    );
                    out.send(data_event(&error)).await;
                    return RoundEnd::Stop;
                }
            };
            if event.is_done() {
                saw_done = true;
                continue;
            }
            let Some(data) = event.data.as_deref() else {
                // A comment or keep-alive.
                if !continuing && !out.send(event.raw.clone()).await {
                    return RoundEnd::Stop;
                }
                continue;
            };
            let Ok(mut chunk) = serde_json::from_str::<Value>(data) else {
                if !out.send(event.raw.clone()).await {
                    return RoundEnd::Stop;
                }
                continue;
            };
            if chunk.get("error").is_some_and(|e| !e.is_null()) {
                out.send(event.raw.clone()).await;
                return RoundEnd::Stop;
            }
            let mut usage_stripped = false;
            let mut finish_rewritten = false;
            let deltas = acc.push(&chunk).unwrap_or_default();
            for d in deltas.iter().filter(|d| d.new || d.named) {
                if let Some(call) = acc.tool_call(d.choice, d.call) {
                    if round.reload.names.tool(&call.name).is_some() {
                        proxy_calls = true;
                    } else if !call.name.is_empty() {
                        client_calls = true;
                    }
                }
            }
            header.learn(&chunk);
            // The usage chunk waits for the end, summed over the rounds.
            let usage_only = chunk
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
                && chunk.get("usage").is_some_and(|u| !u.is_null());
            if let Some(u) = chunk.get("usage").and_then(Usage::from_json) {
                match usage {
                    Some(sum) => sum.add(&u),
                    None => *usage = Some(u),
                }
                if usage_only {
                    *usage_chunk = Some(chunk);
                    continue;
                }
                // Usage on a chunk with choices: kept for the sum, sent once at the end.
                if let Value::Object(map) = &mut chunk {
                    map.insert("usage".into(), Value::Null);
                }
                usage_stripped = true;
            }
            let finishing = chunk
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.get("finish_reason").is_some_and(|f| !f.is_null()))
                });
            finished |= finishing;
            if finishing && proxy_calls && !client_calls {
                if withdrawn {
                    if !finish_without_calls(&acc, &mut chunk) {
                        let rounds = round.stats.rounds.load(Ordering::Relaxed) as usize;
                        tracing::warn!(rounds, "the model called the proxy's tools after they were withdrawn: not run, and nothing else was answered");
                        let error = crate::http::error::ProxyError::ToolLoopExhausted { rounds };
                        out.send(data_event(&error.to_json())).await;
                        return RoundEnd::Stop;
                    }
                    tracing::warn!(
                        "the model called the proxy's tools after they were withdrawn: not run"
                    );
                    finish_rewritten = true;
                } else {
                    continuing = true;
                }
            }
            if continuing {
                continue;
            }
            let filtered = filter.apply(&mut chunk, &deltas, |d| {
                acc.tool_call(d.choice, d.call)
                    .is_some_and(|c| round.reload.names.tool(&c.name).is_some())
            });
            let renamed = later_round && header.apply(&mut chunk);
            let bytes = match filtered {
                Filtered::Emptied => continue,
                Filtered::Unchanged if !renamed && !usage_stripped && !finish_rewritten => {
                    event.raw.clone()
                }
                _ => data_event(&chunk),
            };
            if !out.send(bytes).await {
                return RoundEnd::Stop;
            }
        }
    }
    if proxy_calls && !finished {
        // The upstream ended its stream in the middle of the proxy's own call, which the
        // client never saw: without a word it would get an empty answer.
        tracing::warn!("upstream stream ended during a call of the proxy's tools");
        let error = openai_error(&format!("upstream {} ended its stream in the middle of an answer (during the proxy's context tool call); retry", round.upstream.name), "upstream_error", None, Some("upstream_stream_error"));
        out.send(data_event(&error)).await;
        return RoundEnd::Stop;
    }
    if continuing {
        let completion = acc.completion();
        let Some(choice) = completion.choices.first() else {
            return RoundEnd::Stop;
        };
        let assistant = assistant_message(choice.content.as_deref(), &choice.tool_calls);
        return RoundEnd::Continue(assistant, choice.tool_calls.clone());
    }
    if proxy_calls && client_calls && !withdrawn {
        // Mixed: the client got its own calls; the proxy answers its own and keeps them.
        let completion = acc.completion();
        if let Some(choice) = completion.choices.first() {
            let results = round.run_calls(&choice.tool_calls).await;
            let message = assistant_message(choice.content.as_deref(), &choice.tool_calls);
            round.hide(&message, results).await;
        }
    }
    // The end of the answer: the usage summed over every round, then [DONE].
    if let (Some(mut chunk), Some(sum)) = (usage_chunk.take(), usage.as_ref()) {
        sum.write_into(&mut chunk);
        header.apply(&mut chunk);
        if !out.send(data_event(&chunk)).await {
            return RoundEnd::Stop;
        }
    }
    if saw_done {
        out.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }
    RoundEnd::Stop
}

/// The finish chunk of an answer whose only calls were the proxy's withdrawn tools, which the
/// client never saw: it ends with `stop`, as a text answer does. False when the answer holds no
/// text either (nothing at all reached the client).
fn finish_without_calls(acc: &ChatAccumulator, chunk: &mut Value) -> bool {
    let completion = acc.completion();
    let has_text = completion
        .choices
        .first()
        .and_then(|c| c.content.as_deref())
        .is_some_and(|t| !t.trim().is_empty());
    if !has_text {
        return false;
    }
    if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
        for choice in choices {
            if let Some(reason) = choice.get_mut("finish_reason") {
                if reason.as_str() == Some("tool_calls") {
                    *reason = Value::from("stop");
                }
            }
        }
    }
    true
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
