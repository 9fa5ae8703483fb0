//! The tool loop for a streamed Responses answer, live. Each upstream event goes to the client
//! as it arrives, rewritten to one stream (`docs/responses-wire.md`): one `response.created`
//! and `response.in_progress` (the first round's), `output_index` counting only the items the
//! client gets, one `sequence_number` from 0 across the rounds, and exactly one terminal event
//! whose `response` is the first round's (`id`, `created_at`) with the client's items as its
//! `output` and the usage summed over every upstream call.
//!
//! Held back: every event of a call of the proxy's tools (known from its
//! `response.output_item.added`, which names the tool), and of a `reasoning` item until the
//! item after it shows whether it reasons for such a call (then it is held back with it). A
//! round that called only the proxy's tools does not end the client's stream: the proxy runs
//! the calls and the next round's items follow. A reasoning item that ends such a round is the
//! proxy's too: upstream, the item after it is the proxy's `function_call_output`, and shown to
//! the client it would stand before the next round's items, which it was not made with. A mixed round ends it; the proxy's calls are
//! kept for the next turn. Whatever goes wrong after the stream started ends it with
//! `response.failed`, never silently; an upstream `error` event becomes that
//! `response.failed`, with the error's code and message.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use serde_json::{json, Value};

use super::items::{calls, has_text, scrub_tools};
use crate::routes::tool_loop::stream::{
    self, Failure, NextEvent, Out, RoundEnd, RoundEvents, RoundRelay,
};
use crate::routes::tool_loop::{EventStream, Round};
use crate::upstream::Incoming;
use crate::wire::responses;
use crate::wire::sse::Event;
use crate::wire::Usage;

/// The client's body: the events of every round as one Responses stream, live.
pub fn spawn(round: Round, first: Incoming) -> EventStream {
    stream::spawn(round, first, Across::default())
}

/// What carries over from round to round.
#[derive(Default)]
struct Across {
    /// The next `sequence_number` the client gets.
    sequence: u64,
    /// The next `output_index` the client gets.
    next_index: u64,
    /// The first round's response object (from its `response.created`).
    response: Option<Value>,
    /// The items the client got, in order (as their `response.output_item.done` showed them).
    items: Vec<Value>,
    /// The usage summed over the rounds so far.
    usage: Option<Usage>,
}

impl Across {
    /// `event` as the client gets it: the next sequence number, framed.
    fn frame(&mut self, mut event: Value) -> Bytes {
        if let Value::Object(map) = &mut event {
            map.insert("sequence_number".into(), self.sequence.into());
        }
        self.sequence += 1;
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
            .to_string();
        Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
    }

    /// The response object of a terminal event: the first round's identity, the client's
    /// items, the summed usage, the client's tools only.
    fn final_response(&self, response: &Value, round: &Round) -> Value {
        let mut response = response.clone();
        if let (Value::Object(map), Some(Value::Object(first))) = (&mut response, &self.response) {
            for key in ["id", "created_at"] {
                if let Some(value) = first.get(key) {
                    map.insert(key.into(), value.clone());
                }
            }
            map.insert("output".into(), Value::Array(self.items.clone()));
        }
        if let Some(usage) = &self.usage {
            round.wire.write_usage(&mut response, usage);
        }
        scrub_tools(&mut response, &round.reload.names);
        response
    }

    /// A `response.failed` event ending the client's stream: the first round's response
    /// with `error`.
    fn failed(&mut self, round: &Round, code: &str, message: &str) -> Bytes {
        let base = self
            .response
            .clone()
            .unwrap_or_else(|| json!({"object": "response"}));
        let response = self.final_response(&base, round);
        let response = responses::failed_response(Some(&response), code, message);
        self.frame(json!({"type": "response.failed", "response": response}))
    }

    /// Adds a round's usage to the sum.
    fn add_usage(&mut self, response: &Value) {
        if let Some(u) = response.get("usage").and_then(Usage::from_json) {
            match &mut self.usage {
                Some(sum) => sum.add(&u),
                None => self.usage = Some(u),
            }
        }
    }
}

impl RoundRelay for Across {
    async fn relay(&mut self, round: &Round, answer: Incoming, out: &mut Out) -> RoundEnd {
        let mut relay = Relay::new(round, self);
        let mut events = RoundEvents::new(answer);
        loop {
            let message = match events.next(out).await {
                NextEvent::Event(event) => {
                    let (sends, last) = relay.event(&event);
                    for bytes in sends {
                        if !out.send(bytes).await {
                            return RoundEnd::Stop;
                        }
                    }
                    if last {
                        return RoundEnd::Stop;
                    }
                    continue;
                }
                NextEvent::End => break,
                NextEvent::Closed => return RoundEnd::Stop,
                NextEvent::BrokeOff(e) => {
                    format!("upstream {} broke off its stream: {e}", round.upstream.name)
                }
                NextEvent::Unreadable(e) => {
                    format!(
                        "upstream {} sent an unreadable stream: {e}",
                        round.upstream.name
                    )
                }
            };
            let last = relay
                .across
                .failed(round, "upstream_stream_error", &message);
            out.send(last).await;
            return RoundEnd::Stop;
        }
        relay.end(out).await
    }

    fn failure(&mut self, round: &Round, failure: Failure) -> Bytes {
        match failure {
            Failure::Status { status, error } => {
                let text = |key: &str| {
                    error
                        .as_ref()
                        .and_then(|e| e.get(key))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                let code = text("code").unwrap_or_else(|| "upstream_error".into());
                let message = text("message").unwrap_or_else(|| {
                    format!(
                        "upstream {} answered {status} during the proxy's tool round",
                        round.upstream.name
                    )
                });
                self.failed(round, &code, &message)
            }
            Failure::Unreachable(e) => self.failed(round, "upstream_unreachable", &e),
        }
    }
}

/// One round's relay.
struct Relay<'r> {
    round: &'r Round,
    across: &'r mut Across,
    /// A round after the first: its `response.created` and `in_progress` are not the client's.
    later_round: bool,
    /// After the last round the proxy's tools are gone: a call of them is hidden, never run.
    withdrawn: bool,
    /// The upstream's `output_index` → the client's.
    index: HashMap<u64, u64>,
    /// The upstream's `output_index` of items the client never gets.
    hidden: HashSet<u64>,
    /// Reasoning items waiting for the item after them, each with its events so far.
    pending: Vec<(u64, Vec<Value>)>,
    proxy_calls: bool,
    client_calls: bool,
    /// The round's terminal event.
    terminal: Option<Value>,
    /// The items the client got from the earlier rounds.
    shown_before: usize,
}

impl<'r> Relay<'r> {
    fn new(round: &'r Round, across: &'r mut Across) -> Self {
        Relay {
            round,
            shown_before: across.items.len(),
            across,
            later_round: round.stats.rounds.load(Ordering::Relaxed) > 0,
            withdrawn: round.tools_withdrawn(),
            index: HashMap::new(),
            hidden: HashSet::new(),
            pending: Vec::new(),
            proxy_calls: false,
            client_calls: false,
            terminal: None,
        }
    }

    /// One upstream event: what the client gets now, and whether it was the last.
    fn event(&mut self, event: &Event) -> (Vec<Bytes>, bool) {
        let Some(data) = event.data.as_deref() else {
            // A comment or keep-alive.
            return (vec![event.raw.clone()], false);
        };
        let Ok(parsed) = serde_json::from_str::<Value>(data) else {
            return (vec![event.raw.clone()], false);
        };
        let kind = parsed
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        match kind.as_str() {
            "response.created" | "response.in_progress" | "response.queued" => {
                if self.later_round {
                    return (Vec::new(), false);
                }
                let mut parsed = parsed;
                if let Some(response) = parsed.get_mut("response") {
                    scrub_tools(response, &self.round.reload.names);
                    if kind == "response.created" {
                        self.across.response = Some(response.clone());
                    }
                }
                (vec![self.across.frame(parsed)], false)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(response) = parsed.get("response") {
                    self.across.add_usage(response);
                }
                self.terminal = Some(parsed);
                (Vec::new(), false)
            }
            // The upstream's own error ends the client's stream as its one terminal event.
            "error" => {
                let (code, message) = responses::error_fields(&parsed);
                (vec![self.across.failed(self.round, &code, &message)], true)
            }
            "response.output_item.added" => (self.added(parsed), false),
            _ => (self.item_event(parsed), false),
        }
    }

    /// An item starts: hidden when it is a call of the proxy's tools (with the reasoning
    /// before it), held when it is reasoning, else the client's.
    fn added(&mut self, event: Value) -> Vec<Bytes> {
        let Some(upstream) = event.get("output_index").and_then(Value::as_u64) else {
            return vec![self.across.frame(event)];
        };
        let item = event.get("item").cloned().unwrap_or(Value::Null);
        match item.get("type").and_then(Value::as_str).unwrap_or("") {
            "reasoning" => {
                self.pending.push((upstream, vec![event]));
                Vec::new()
            }
            "function_call"
                if self
                    .round
                    .is_proxy(item.get("name").and_then(Value::as_str).unwrap_or("")) =>
            {
                self.proxy_calls = true;
                self.hidden.insert(upstream);
                for (index, _) in self.pending.drain(..) {
                    self.hidden.insert(index);
                }
                Vec::new()
            }
            kind => {
                if kind.ends_with("_call") {
                    self.client_calls = true;
                }
                let mut sends = self.flush();
                sends.extend(self.visible(upstream, event));
                sends
            }
        }
    }

    /// Any other event of an item: dropped, held or renumbered as its item is.
    fn item_event(&mut self, event: Value) -> Vec<Bytes> {
        let Some(upstream) = event.get("output_index").and_then(Value::as_u64) else {
            return vec![self.across.frame(event)];
        };
        if self.hidden.contains(&upstream) {
            return Vec::new();
        }
        if let Some((_, events)) = self.pending.iter_mut().find(|(i, _)| *i == upstream) {
            events.push(event);
            return Vec::new();
        }
        self.visible(upstream, event)
    }

    /// An event of an item the client gets, with the client's `output_index`.
    fn visible(&mut self, upstream: u64, mut event: Value) -> Vec<Bytes> {
        let next = &mut self.across.next_index;
        let client = *self.index.entry(upstream).or_insert_with(|| {
            let index = *next;
            *next += 1;
            index
        });
        if let Value::Object(map) = &mut event {
            map.insert("output_index".into(), client.into());
        }
        if event.get("type").and_then(Value::as_str) == Some("response.output_item.done") {
            if let Some(item) = event.get("item") {
                self.across.items.push(item.clone());
            }
        }
        vec![self.across.frame(event)]
    }

    /// The reasoning items held back go to the client (what follows them is the client's).
    fn flush(&mut self) -> Vec<Bytes> {
        let mut sends = Vec::new();
        for (upstream, events) in std::mem::take(&mut self.pending) {
            for event in events {
                sends.extend(self.visible(upstream, event));
            }
        }
        sends
    }

    /// The upstream's stream has ended: go on with the proxy's calls, or end the client's
    /// stream with one terminal event.
    async fn end(mut self, out: &mut Out) -> RoundEnd {
        let Some(terminal) = self.terminal.take() else {
            tracing::warn!("upstream stream ended without a terminal event during the tool loop");
            let message = format!(
                "upstream {} ended its stream in the middle of an answer; retry",
                self.round.upstream.name
            );
            let last = self
                .across
                .failed(self.round, "upstream_stream_error", &message);
            out.send(last).await;
            return RoundEnd::Stop;
        };
        let kind = terminal
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let output: Vec<Value> = terminal
            .pointer("/response/output")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let completed = kind == "response.completed";
        if completed && self.proxy_calls && !self.client_calls && !self.withdrawn {
            // Reasoning still held ends the round: bound to the proxy's outputs after it, it
            // stays hidden (the next request carries it, in `output`, byte for byte).
            self.pending.clear();
            let calls = calls(&output);
            return RoundEnd::Continue(output, calls);
        }
        let mut sends = self.flush();
        if self.proxy_calls && self.withdrawn {
            let said = self.across.items.iter().any(has_text);
            if !said {
                let rounds = self.round.stats.rounds.load(Ordering::Relaxed) as usize;
                tracing::warn!(rounds, "the model called the proxy's tools after they were withdrawn: not run, and nothing else was answered");
                let error = crate::http::error::ProxyError::ToolLoopExhausted { rounds };
                sends.push(self.across.failed(
                    self.round,
                    "tool_loop_exhausted",
                    &error.to_string(),
                ));
                for bytes in sends {
                    out.send(bytes).await;
                }
                return RoundEnd::Stop;
            }
            tracing::warn!("the model called the proxy's tools after they were withdrawn: not run");
        }
        if self.proxy_calls && self.client_calls && !self.withdrawn {
            // Mixed: the client got its own calls; the proxy answers its own and keeps them.
            let results = self.round.run_calls(&calls(&output)).await;
            let mut answer = json!({ "output": output });
            let mut split = self
                .round
                .wire
                .split(&mut answer, &|name| self.round.is_proxy(name));
            // Next turn the client sends the earlier rounds' items before this round's: the
            // proxy's calls go back at their places among all of them.
            for (position, _) in &mut split.hidden {
                *position += self.shown_before;
            }
            self.round.keep(split, results).await;
        }
        let mut terminal = terminal;
        if let Some(response) = terminal.get("response").cloned() {
            terminal["response"] = self.across.final_response(&response, self.round);
        }
        sends.push(self.across.frame(terminal));
        for bytes in sends {
            if !out.send(bytes).await {
                break;
            }
        }
        RoundEnd::Stop
    }
}
