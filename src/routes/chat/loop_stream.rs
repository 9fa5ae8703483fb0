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
use serde_json::{json, Value};

use crate::routes::tool_loop::stream::{
    self, Failure, NextEvent, Out, RoundEnd, RoundEvents, RoundRelay,
};
use crate::routes::tool_loop::{EventStream, Round};
use crate::upstream::Incoming;
use crate::wire::error::openai_error;
use crate::wire::sse::{data_event, Event};
use crate::wire::ToolCall;
use crate::wire::{ChatAccumulator, Filtered, ToolCallDelta, ToolCallFilter, Usage};

/// The client's body: the chat chunks of every round, live.
pub fn spawn(round: Round, first: Incoming) -> EventStream {
    stream::spawn(round, first, Across::default())
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

/// What carries over from round to round: the first round's identity fields, and the usage
/// summed so far with the usage-only chunk that will carry it at the very end.
#[derive(Default)]
struct Across {
    header: Header,
    usage: Option<Usage>,
    usage_chunk: Option<Value>,
}

/// An error event in the OpenAI shape, as the last event the client gets.
fn stream_error(message: &str, code: &str) -> Bytes {
    data_event(&openai_error(message, "upstream_error", None, Some(code)))
}

impl RoundRelay for Across {
    async fn relay(&mut self, round: &Round, answer: Incoming, out: &mut Out) -> RoundEnd {
        relay_round(round, answer, out, self).await
    }

    fn failure(&mut self, round: &Round, failure: Failure) -> Bytes {
        match failure {
            // The upstream's own error object when it sent one, else the proxy's.
            Failure::Status { status, error } => data_event(
                &error
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
                    }),
            ),
            Failure::Unreachable(e) => stream_error(&e, "upstream_unreachable"),
        }
    }
}

/// Relays one upstream stream to the client, hiding the proxy's calls.
async fn relay_round(
    round: &Round,
    answer: Incoming,
    out: &mut Out,
    across: &mut Across,
) -> RoundEnd {
    let mut relay = Relay::new(round);
    let mut events = RoundEvents::new(answer);
    loop {
        let event = match events.next(out).await {
            NextEvent::Event(event) => event,
            NextEvent::End => break,
            NextEvent::Closed => return RoundEnd::Stop,
            NextEvent::BrokeOff(e) => {
                out.send(stream_error(&e, "upstream_stream_error")).await;
                return RoundEnd::Stop;
            }
            NextEvent::Unreadable(e) => {
                let message = format!(
                    "upstream {} sent an unreadable stream: {e}",
                    round.upstream.name
                );
                out.send(stream_error(&message, "upstream_stream_error"))
                    .await;
                return RoundEnd::Stop;
            }
        };
        let (bytes, go_on) = match relay.event(&event, across) {
            Step::Skip => continue,
            Step::Send(bytes) => (bytes, true),
            Step::Last(bytes) => (bytes, false),
        };
        if !out.send(bytes).await || !go_on {
            return RoundEnd::Stop;
        }
    }
    relay.end(out, across).await
}

/// What one upstream event asks of the relay.
enum Step {
    /// Nothing goes to the client.
    Skip,
    /// These bytes go to the client; the round goes on.
    Send(Bytes),
    /// These bytes go to the client, and they are the last.
    Last(Bytes),
}

/// One round's relay: the answer assembled as it streams past, and what is known of its calls.
struct Relay<'r> {
    round: &'r Round,
    /// A round after the first: its chunks take the first round's identity fields.
    later_round: bool,
    /// After the last round the proxy's tools are gone: a call of them is hidden, never run.
    withdrawn: bool,
    acc: ChatAccumulator,
    filter: ToolCallFilter,
    proxy_calls: bool,
    client_calls: bool,
    /// Set once the round is known to go on: from then on nothing of it reaches the client.
    continuing: bool,
    saw_done: bool,
    /// A finish reason was seen: the answer is whole.
    finished: bool,
}

impl<'r> Relay<'r> {
    fn new(round: &'r Round) -> Self {
        Relay {
            round,
            later_round: round.stats.rounds.load(Ordering::Relaxed) > 0,
            withdrawn: round.tools_withdrawn(),
            acc: ChatAccumulator::new(),
            filter: ToolCallFilter::new(),
            proxy_calls: false,
            client_calls: false,
            continuing: false,
            saw_done: false,
            finished: false,
        }
    }

    /// One event of the upstream's stream: what the client gets of it.
    fn event(&mut self, event: &Event, across: &mut Across) -> Step {
        if event.is_done() {
            self.saw_done = true;
            return Step::Skip;
        }
        let Some(data) = event.data.as_deref() else {
            // A comment or keep-alive.
            return if self.continuing {
                Step::Skip
            } else {
                Step::Send(event.raw.clone())
            };
        };
        let Ok(mut chunk) = serde_json::from_str::<Value>(data) else {
            return Step::Send(event.raw.clone());
        };
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Step::Last(event.raw.clone());
        }
        let deltas = self.acc.push(&chunk).unwrap_or_default();
        self.note_calls(&deltas);
        across.header.learn(&chunk);
        let Some(usage_stripped) = take_usage(&mut chunk, across) else {
            return Step::Skip;
        };
        let finish_rewritten = match self.finish(&mut chunk) {
            Ok(rewritten) => rewritten,
            Err(error) => return Step::Last(error),
        };
        if self.continuing {
            return Step::Skip;
        }
        let (acc, names) = (&self.acc, &self.round.reload.names);
        let filtered = self.filter.apply(&mut chunk, &deltas, |d| {
            acc.tool_call(d.choice, d.call)
                .is_some_and(|c| names.tool(&c.name).is_some())
        });
        let renamed = self.later_round && across.header.apply(&mut chunk);
        match filtered {
            Filtered::Emptied => Step::Skip,
            Filtered::Unchanged if !renamed && !usage_stripped && !finish_rewritten => {
                Step::Send(event.raw.clone())
            }
            _ => Step::Send(data_event(&chunk)),
        }
    }

    /// Notes whose calls the new or newly named calls of `deltas` are.
    fn note_calls(&mut self, deltas: &[ToolCallDelta]) {
        for d in deltas.iter().filter(|d| d.new || d.named) {
            if let Some(call) = self.acc.tool_call(d.choice, d.call) {
                if self.round.reload.names.tool(&call.name).is_some() {
                    self.proxy_calls = true;
                } else if !call.name.is_empty() {
                    self.client_calls = true;
                }
            }
        }
    }

    /// A chunk with a finish reason, when the round called only the proxy's tools: the round
    /// goes on, or, with the tools withdrawn, the finish reason becomes `stop` (`Ok(true)`) or,
    /// when nothing at all reached the client, the round ends with an error event (`Err`).
    fn finish(&mut self, chunk: &mut Value) -> Result<bool, Bytes> {
        let finishing = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.get("finish_reason").is_some_and(|f| !f.is_null()))
            });
        self.finished |= finishing;
        if !(finishing && self.proxy_calls && !self.client_calls) {
            return Ok(false);
        }
        if !self.withdrawn {
            self.continuing = true;
            return Ok(false);
        }
        if !finish_without_calls(&self.acc, chunk) {
            let rounds = self.round.stats.rounds.load(Ordering::Relaxed) as usize;
            tracing::warn!(rounds, "the model called the proxy's tools after they were withdrawn: not run, and nothing else was answered");
            let error = crate::http::error::ProxyError::ToolLoopExhausted { rounds };
            return Err(data_event(&error.to_json()));
        }
        tracing::warn!("the model called the proxy's tools after they were withdrawn: not run");
        Ok(true)
    }

    /// The upstream's stream has ended: go on with the proxy's calls, or end the answer (the
    /// proxy's calls of a mixed answer kept hidden, the usage summed over every round, then
    /// `[DONE]`).
    async fn end(self, out: &mut Out, across: &mut Across) -> RoundEnd {
        if self.proxy_calls && !self.finished {
            // The upstream ended its stream in the middle of the proxy's own call, which the
            // client never saw: without a word it would get an empty answer.
            tracing::warn!("upstream stream ended during a call of the proxy's tools");
            let message = format!("upstream {} ended its stream in the middle of an answer (during the proxy's context tool call); retry", self.round.upstream.name);
            out.send(stream_error(&message, "upstream_stream_error"))
                .await;
            return RoundEnd::Stop;
        }
        if self.continuing {
            let completion = self.acc.completion();
            let Some(choice) = completion.choices.first() else {
                return RoundEnd::Stop;
            };
            let assistant = assistant_message(choice.content.as_deref(), &choice.tool_calls);
            return RoundEnd::Continue(vec![assistant], choice.tool_calls.clone());
        }
        if self.proxy_calls && self.client_calls && !self.withdrawn {
            // Mixed: the client got its own calls; the proxy answers its own and keeps them.
            let completion = self.acc.completion();
            if let Some(choice) = completion.choices.first() {
                let results = self.round.run_calls(&choice.tool_calls).await;
                let message = assistant_message(choice.content.as_deref(), &choice.tool_calls);
                let mut answer = json!({"choices": [{ "message": message }]});
                let split = self
                    .round
                    .wire
                    .split(&mut answer, &|name| self.round.is_proxy(name));
                self.round.keep(split, results).await;
            }
        }
        if let (Some(mut chunk), Some(sum)) = (across.usage_chunk.take(), across.usage.as_ref()) {
            sum.write_into(&mut chunk);
            across.header.apply(&mut chunk);
            if !out.send(data_event(&chunk)).await {
                return RoundEnd::Stop;
            }
        }
        if self.saw_done {
            out.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
        }
        RoundEnd::Stop
    }
}

/// Adds a chunk's usage to the sum: the usage chunk waits for the end (`None`: send nothing
/// now); usage on a chunk with choices is kept for the sum and nulled on it (`Some(true)`).
fn take_usage(chunk: &mut Value, across: &mut Across) -> Option<bool> {
    let Some(u) = chunk.get("usage").and_then(Usage::from_json) else {
        return Some(false);
    };
    match &mut across.usage {
        Some(sum) => sum.add(&u),
        None => across.usage = Some(u),
    }
    let usage_only = chunk
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty);
    if usage_only {
        across.usage_chunk = Some(chunk.take());
        return None;
    }
    if let Value::Object(map) = chunk {
        map.insert("usage".into(), Value::Null);
    }
    Some(true)
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

/// The assistant message of a round, as the conversation continues with it.
pub fn assistant_message(content: Option<&str>, calls: &[ToolCall]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            if c.kind == "custom" {
                json!({"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}})
            } else {
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            }
        })
        .collect();
    let content = match content {
        Some(text) if !text.is_empty() => Value::String(text.to_string()),
        _ => Value::Null,
    };
    json!({"role": "assistant", "content": content, "tool_calls": calls})
}
