//! The tool loop: when the proxy offered its own tools (`context_read`, `context_search`), the
//! model's calls of them are answered here and the upstream is asked again, so the client only
//! ever sees its own tools. Every managed route runs it; what is the same for all of them is
//! here, what each wire format says differently is its [`LoopWire`]:
//!
//! - here: the round's state ([`Round`], [`LoopStats`]), running a round's calls against the
//!   store ([`Round::run_calls`]), counting rounds and withdrawing the tools after the last
//!   ([`Round::next_request`]), keeping a hidden exchange in the session ([`Round::keep`]), the
//!   page's journal lines, the non-streaming loop (`json.rs`) and the streaming loop's driver
//!   (`stream.rs`: the task, the channel, the next request of each round);
//! - the wire's ([`LoopWire`]): reading the calls of an answer, the tool-result item, appending
//!   a round to the request, removing the proxy's tools, the answer without the proxy's calls,
//!   the digest of the client's transcript (the hidden exchange's key), the stream's relay
//!   (which events reach the client, renumbered) and the final answer's usage.
//!
//! Chat completions' side is `routes/chat/tool_loop.rs`.

pub mod json;
pub mod stream;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::context::Identity;
use crate::http::error::ProxyError;
use crate::proxy_tools::exec::Exec;
use crate::proxy_tools::hidden::{self, Exchange, Hidden};
use crate::proxy_tools::{Tool, ToolNames};
use crate::routes::shared::Shared;
use crate::store::ContentRef;
use crate::tokens::Encoding;
use crate::upstream::{BodyError, Incoming, Upstream, UpstreamRequest};
use crate::wire::{ToolCall, Usage};

/// The client's body of a streamed answer, as the loop produces it.
pub type EventStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, BodyError>> + Send>>;

/// What one wire format says of the tool loop (see the module's doc). Every method is pure but
/// [`LoopWire::stream`], which relays a live answer.
pub trait LoopWire: Send + Sync {
    /// Appends the proxy's tool definitions after the client's tools.
    fn inject(&self, body: &mut Value, names: &ToolNames);

    /// Removes the proxy's tools again, and `tools` itself when the client sent none.
    fn remove_tools(&self, body: &mut Value, names: &ToolNames, client_had_tools: bool);

    /// A successful non-streaming answer read: its calls (every call, the client's too) and
    /// its usage; `None` when it is not an answer of this format (relayed as it is).
    fn answer(&self, body: &Value) -> Option<Turn>;

    /// What the conversation continues with after `answer`, whose calls are `turn.calls`: the
    /// items appended to the next request before the results.
    fn continued(&self, answer: &Value, turn: &Turn) -> Vec<Value>;

    /// The tool result answering `call` with `text`.
    fn result(&self, call: &ToolCall, text: String) -> Value;

    /// Appends one round to the request `body`: the model's `output`, then the `results`.
    fn append_round(&self, body: &mut Value, output: Vec<Value>, results: Vec<Value>);

    /// Takes the proxy's calls out of `answer` (and what is bound to them), as the client must
    /// see it. When no call of the client's is left, the answer is made a plain one (a text
    /// answer's finish reason); [`Split::empty`] says when nothing at all is left.
    fn split(&self, answer: &mut Value, is_proxy: &dyn Fn(&str) -> bool) -> Split;

    /// The digest of the conversation as the client sent it (`client_body`): with the client's
    /// call ids, the key of an exchange hidden from it ([`hidden::key_of`]).
    fn transcript(&self, client_body: &Value) -> u128;

    /// Writes the usage summed over every upstream call into the final `answer`.
    fn write_usage(&self, answer: &mut Value, usage: &Usage);

    /// Takes out of a final `answer` what it says of the proxy's offer (the Responses API
    /// echoes the request's `tools`); whether anything changed.
    fn scrub(&self, answer: &mut Value, names: &ToolNames) -> bool {
        let _ = (answer, names);
        false
    }

    /// The client's stream, relaying `first` and each later round live.
    fn stream(&self, round: Round, first: Incoming) -> EventStream;

    /// `raw`, the bytes of a request written into the client's bytes (`body` parsed from
    /// them), with the proxy's tools added; `None` when the format serializes its body instead
    /// (the tools are in `body`, [`LoopWire::inject`]) or they cannot be written.
    fn inject_bytes(&self, raw: &[u8], body: &Value, names: &ToolNames) -> Option<Vec<u8>> {
        let _ = (raw, body, names);
        None
    }

    /// The body of an error the loop answers itself (`ToolLoopExhausted`), in the route's
    /// API's shape.
    fn error_body(&self, error: &ProxyError, request_id: &str) -> Bytes {
        let _ = request_id;
        error.body()
    }

    /// Whether the client gets one answer made of its own part of every round (Anthropic
    /// Messages), not the last round's alone: the final answer then carries the earlier
    /// rounds' part ([`LoopWire::merge`]), and the upstream transcript that answer stands for
    /// is kept for the next turn ([`Round::keep_rounds`]).
    fn merges_rounds(&self) -> bool {
        false
    }

    /// Whether the client's answer holds its part of the earlier rounds' answers too
    /// ([`LoopWire::merge`]): where a stream shows each round's items as they come (the
    /// Responses API) the JSON answer must hold them too, so both modes give the same items.
    /// True for every wire that merges rounds.
    fn shows_earlier_rounds(&self) -> bool {
        self.merges_rounds()
    }

    /// Puts the client's part of the `earlier` answers before the final `answer`'s own.
    fn merge(&self, answer: &mut Value, earlier: &[Value], is_proxy: &dyn Fn(&str) -> bool) {
        let _ = (answer, earlier, is_proxy);
    }
}

impl std::fmt::Debug for dyn LoopWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoopWire")
    }
}

/// The calls and usage of one answer ([`LoopWire::answer`]).
#[derive(Debug, Default)]
pub struct Turn {
    pub calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
}

/// What [`LoopWire::split`] took out of an answer.
#[derive(Debug, Default)]
pub struct Split {
    /// The proxy's calls (with what is bound to them), each with its position in the answer.
    pub hidden: Vec<(usize, Value)>,
    /// The ids of the client's calls left, in order.
    pub client_ids: Vec<String>,
    /// Nothing is left for the client: no text, no call of its own.
    pub empty: bool,
}

/// The final answer for the client of a non-streaming loop.
pub struct Final {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// What the client gets from the loop.
pub enum LoopAnswer {
    Json(Final),
    Stream {
        status: StatusCode,
        headers: HeaderMap,
        events: EventStream,
    },
}

/// Runs the loop from the upstream's first (successful) answer: live when it is a stream.
pub async fn run(round: Round, first: Incoming) -> Result<LoopAnswer, ProxyError> {
    if crate::upstream::relay::is_event_stream(&first.headers) {
        let status = first.status;
        let mut headers = first.headers.clone();
        headers.remove(http::header::CONTENT_LENGTH);
        let events = round.wire.stream(round, first);
        return Ok(LoopAnswer::Stream {
            status,
            headers,
            events,
        });
    }
    Ok(LoopAnswer::Json(json::run(round, first).await?))
}

/// What the tool loop needs to know about a request whose tools the proxy extended.
#[derive(Debug, Clone)]
pub struct Reload {
    pub names: ToolNames,
    /// The client sent tools of its own (so `tools` stays when the proxy's are removed).
    pub client_had_tools: bool,
    /// The stored content the forwarded request refers to: the scope of a search.
    pub refs: Vec<ContentRef>,
}

/// Counts kept while the loop runs (also after the response headers went out, for streams).
#[derive(Debug, Default)]
pub struct LoopStats {
    /// Rounds of the proxy's own calls answered.
    pub rounds: AtomicU32,
    /// Calls of the proxy's tools run.
    pub calls: AtomicU32,
    /// Of those, the ones that returned an error to the model.
    pub failed_calls: AtomicU32,
    /// Upstream calls made for this request.
    pub upstream_calls: AtomicU32,
    /// The calls run, for the page's journal line (`[ui] enabled` only; at most
    /// `journal::MAX_CALLS_KEPT`).
    pub log: std::sync::Mutex<Vec<crate::routes::ui::journal::ReloadCall>>,
    /// Every upstream call made for the request, by kind, with what it sent (a managed
    /// request's; shared with the summarizer while the request waits for a summary).
    pub bill: Arc<std::sync::Mutex<crate::pricing::Bill>>,
}

impl LoopStats {
    /// Puts `call` on the request's bill.
    pub fn bill(&self, call: crate::pricing::Call) {
        self.bill
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
    }

    /// The last call of the conversation on the bill was refused as too long: it costs nothing.
    pub fn refuse_last(&self) {
        self.bill
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refuse_last();
    }

    /// The request's bill so far.
    pub fn bill_so_far(&self) -> crate::pricing::Bill {
        self.bill.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Everything a round needs, owned, so a streaming loop can run on its own task.
pub struct Round {
    /// The route's wire format.
    pub wire: &'static dyn LoopWire,
    /// Its conversation model's adapter: what a round appends is counted with it.
    pub adapter: &'static dyn crate::context::adapter::Adapter,
    pub state: Arc<Shared>,
    pub upstream: Arc<Upstream>,
    pub identity: Identity,
    pub reload: Reload,
    /// The request body as last sent (the conversation grows by each round).
    pub body: Value,
    /// The request as last sent; the next one reuses its URL and headers.
    pub outgoing: UpstreamRequest,
    pub model: String,
    pub encoding: Option<Encoding>,
    pub stats: Arc<LoopStats>,
    pub request_id: String,
    /// The request's bytes as the client sent them: a hidden exchange is keyed by the client's
    /// transcript ([`hidden::Transcript`]), read from them only when one is kept.
    pub client_body: Bytes,
}

impl Round {
    pub fn is_proxy(&self, name: &str) -> bool {
        self.reload.names.tool(name).is_some()
    }

    /// Whether the proxy's tools were taken away: `max_rounds` rounds were answered and the
    /// upstream was asked once more without them. From then on a call of the proxy's tools is
    /// never run, whatever the model does, so one client request makes at most
    /// `max_rounds + 1` upstream calls in the loop.
    pub fn tools_withdrawn(&self) -> bool {
        self.stats.rounds.load(Ordering::Relaxed) as usize
            >= self.state.context.reload_config().max_rounds
    }

    /// Whether `calls` holds calls of the proxy's tools, and of the client's.
    pub fn kinds(&self, calls: &[ToolCall]) -> (bool, bool) {
        let proxy = calls.iter().any(|c| self.is_proxy(&c.name));
        let client = calls.iter().any(|c| !self.is_proxy(&c.name));
        (proxy, client)
    }

    /// Runs the calls of the proxy's tools among `calls`, in order; returns their results
    /// ([`LoopWire::result`]).
    pub async fn run_calls(&self, calls: &[ToolCall]) -> Vec<Value> {
        let context = &self.state.context;
        let counter = context.counter_for(&self.model, self.encoding);
        let count = move |text: &str| counter.count_text(text);
        let exec = Exec {
            store: context.store().as_ref(),
            tenant: &self.identity.tenant,
            refs: &self.reload.refs,
            names: &self.reload.names,
            config: context.reload_config(),
            count: &count,
        };
        let max_calls = context.reload_config().max_calls_per_round;
        let mut results = Vec::new();
        let mut run = 0;
        for call in calls {
            let Some(tool) = self.reload.names.tool(&call.name) else {
                continue;
            };
            if run == max_calls {
                // Every call needs its result, but one answer runs only so many: the next
                // request must not grow by thousands of reads.
                results.push(self.wire.result(call, format!(
                    "error: not run: at most {max_calls} calls of {} and {} are answered per turn; call again for more",
                    self.reload.names.read, self.reload.names.search
                )));
                self.stats.failed_calls.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            run += 1;
            let outcome = exec.run(tool, &call.arguments).await;
            self.stats.calls.fetch_add(1, Ordering::Relaxed);
            let metrics = &self.state.metrics;
            let counter = match (tool, outcome.ok) {
                (Tool::Read, true) => &metrics.reload_read_ok,
                (Tool::Read, false) => &metrics.reload_read_failed,
                (Tool::Search, true) => &metrics.reload_search_ok,
                (Tool::Search, false) => &metrics.reload_search_failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if !outcome.ok {
                self.stats.failed_calls.fetch_add(1, Ordering::Relaxed);
            }
            // The ref and the size of the answer; never content, nor a search pattern.
            let reference = serde_json::from_str::<Value>(&call.arguments)
                .ok()
                .and_then(|a| {
                    a.get("ref")
                        .and_then(Value::as_str)
                        .map(|r| clip(r, 40).to_string())
                })
                .unwrap_or_default();
            tracing::debug!(
                tool = %call.name,
                %reference,
                ok = outcome.ok,
                lines = outcome.lines,
                "reload call"
            );
            if self.state.ui.is_some() {
                self.log_call(
                    &call.name,
                    &call.arguments,
                    outcome.ok,
                    outcome.lines,
                    &outcome.text,
                );
            }
            results.push(self.wire.result(call, outcome.text));
        }
        results
    }

    /// Keeps one call for the page's journal line.
    fn log_call(&self, tool: &str, arguments: &str, ok: bool, lines: usize, text: &str) {
        use crate::routes::ui::journal::{ReloadCall, MAX_CALLS_KEPT, RESULT_PREVIEW_CHARS};
        let mut log = self.stats.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() < MAX_CALLS_KEPT {
            let result = clip(text, RESULT_PREVIEW_CHARS);
            log.push(ReloadCall {
                round: self.stats.rounds.load(Ordering::Relaxed) + 1,
                tool: tool.to_string(),
                arguments: clip(arguments, 500).to_string(),
                ok,
                lines,
                clipped: result.len() < text.len(),
                result: result.to_string(),
            });
        }
    }

    /// Appends the model's `output` of a round and the `results` to the conversation and
    /// builds the next request. Once `max_rounds` rounds were answered, the proxy's tools are
    /// taken away so the model answers with what it has.
    pub fn next_request(&mut self, output: Vec<Value>, results: Vec<Value>) -> UpstreamRequest {
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        self.state
            .metrics
            .reload_rounds
            .fetch_add(1, Ordering::Relaxed);
        let counter = self.state.context.counter_for(&self.model, self.encoding);
        let count = |items: &[Value]| -> usize {
            items
                .iter()
                .map(|item| self.adapter.count_item(&counter, item))
                .sum()
        };
        // The model's output of the round: its call of the proxy's tools, which the client
        // never sees and the proxy pays for (the proxy's count of the items; reasoning the
        // upstream does not show is not in it).
        let hidden = count(&output);
        let appended = hidden + count(&results);
        self.wire.append_round(&mut self.body, output, results);
        // On the bill: the previous call again (read from the cache), the round after it, and
        // the hidden output that asked for it.
        let previous = self.stats.bill_so_far().last_sent();
        let mut call = previous.map(|p| {
            crate::pricing::Call::conversation(crate::pricing::CallKind::Reload, p + appended, p)
                .with_output(hidden)
        });
        if self.tools_withdrawn() {
            self.wire.remove_tools(
                &mut self.body,
                &self.reload.names,
                self.reload.client_had_tools,
            );
            // The tools come first in the prompt: without the proxy's, nothing is cached.
            if let Some(call) = &mut call {
                let tools =
                    crate::proxy_tools::definitions_tokens(&self.reload.names, counter.encoding());
                call.tokens = call.tokens.saturating_sub(tools);
                call.shared = 0;
            }
        }
        if let Some(call) = call {
            self.stats.bill(call);
        }
        let mut request = self.outgoing.clone();
        request.body = Bytes::from(self.body.to_string());
        self.outgoing = request.clone();
        request
    }

    /// Keeps the proxy's calls that `split` took out of an answer, with their `results`, for
    /// the session: the next request that carries the client's calls gets them back.
    pub async fn keep(&self, split: Split, results: Vec<Value>) {
        // The conversation as the client sent it, which is what it sends back before this
        // answer next turn (the body in hand has the proxy's changes).
        let transcript = serde_json::from_slice::<Value>(&self.client_body)
            .map(|body| self.wire.transcript(&body))
            .unwrap_or_default();
        let exchange = Exchange {
            key: hidden::key_of(transcript, split.client_ids.iter().map(String::as_str)),
            calls: split.hidden,
            results,
        };
        let store = Hidden::new(self.state.context.store().clone());
        if let Err(e) = store
            .keep(&self.identity.tenant, &self.identity.session, exchange)
            .await
        {
            tracing::warn!(error = %e, "cannot keep the proxy's hidden tool calls: the next turn will not show them to the model");
        }
    }
}

impl Round {
    /// The number of messages in the request as the loop began: the rounds append after it.
    pub fn conversation_len(&self) -> usize {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    }

    /// Keeps, for the next turn, the upstream transcript the client's merged assistant
    /// message `shown` stands for ([`LoopWire::merges_rounds`]): the messages the rounds
    /// appended after the first `start`, then `last` (the final answer's message as the
    /// upstream sent it), with the proxy's `results` of a mixed last round.
    pub async fn keep_rounds(
        &self,
        start: usize,
        last: Vec<Value>,
        shown: &Value,
        results: Vec<Value>,
    ) {
        use crate::proxy_tools::hidden_rounds::{self, Rounds, STATE_KEY};
        let mut messages: Vec<Value> = self
            .body
            .get("messages")
            .and_then(Value::as_array)
            .map(|m| m.iter().skip(start).cloned().collect())
            .unwrap_or_default();
        messages.extend(last);
        let before = serde_json::from_slice::<Value>(&self.client_body)
            .ok()
            .and_then(|body| {
                body.get("messages")
                    .and_then(Value::as_array)
                    .map(|m| hidden::Transcript::of(m))
            })
            .unwrap_or_default();
        let rounds = Rounds {
            key: hidden_rounds::key(before, shown),
            messages,
            results,
        };
        let store = Hidden::<Rounds>::under(self.state.context.store().clone(), STATE_KEY);
        if let Err(e) = store
            .keep(&self.identity.tenant, &self.identity.session, rounds)
            .await
        {
            tracing::warn!(error = %e, "cannot keep the proxy's hidden tool rounds: the next turn will show the model the client's merged message");
        }
    }
}

/// `text` cut to `max` characters.
pub fn clip(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        None => text,
        Some((at, _)) => &text[..at],
    }
}
