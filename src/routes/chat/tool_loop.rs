//! tool loop: when the proxy offered its own tools (`context_read`, `context_search`), the
//! model's calls of them are answered here and the upstream is asked again, so the client only
//! ever sees its own tools. Non-streaming answers are read whole (`loop_json.rs`); streams stay
//! live, event by event (`loop_stream.rs`). This file holds what both share: running a round's
//! calls, building the next request, keeping the calls hidden from a client that also got
//! calls of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::context::Identity;
use crate::proxy_tools::exec::Exec;
use crate::proxy_tools::hidden::{self, Exchange, Hidden};
use crate::proxy_tools::{self, Tool, ToolNames};
use crate::routes::shared::Shared;
use crate::store::ContentRef;
use crate::tokens::Encoding;
use crate::upstream::{Upstream, UpstreamRequest};
use crate::wire::ToolCall;

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
}

/// Everything a round needs, owned, so a streaming loop can run on its own task.
pub struct Round {
    pub state: Arc<Shared>,
    pub upstream: Arc<Upstream>,
    pub identity: Identity,
    pub reload: Reload,
    /// The request body as last sent (messages grow by each round).
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

    /// Runs the calls of the proxy's tools among `calls`, in order; returns their tool
    /// messages.
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
                results.push(json!({"role": "tool", "tool_call_id": call.id, "content": format!(
                    "error: not run: at most {max_calls} calls of {} and {} are answered per turn; call again for more",
                    self.reload.names.read, self.reload.names.search
                )}));
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
            results.push(json!({"role": "tool", "tool_call_id": call.id, "content": outcome.text}));
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

    /// Appends the model's tool-calling message and the results to the conversation and builds
    /// the next request. Once `max_rounds` rounds were answered, the proxy's tools are taken
    /// away so the model answers with what it has.
    pub fn next_request(&mut self, assistant: Value, results: Vec<Value>) -> UpstreamRequest {
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        self.state
            .metrics
            .reload_rounds
            .fetch_add(1, Ordering::Relaxed);
        if let Some(Value::Array(messages)) = self.body.get_mut("messages") {
            messages.push(assistant);
            messages.extend(results);
        }
        if self.tools_withdrawn() {
            proxy_tools::remove(
                &mut self.body,
                &self.reload.names,
                self.reload.client_had_tools,
            );
        }
        let mut request = self.outgoing.clone();
        request.body = Bytes::from(self.body.to_string());
        self.outgoing = request.clone();
        request
    }

    /// Keeps the proxy's calls of `message` (and their `results`) for the session, and returns
    /// the message as the client must see it.
    pub async fn hide(&self, message: &Value, results: Vec<Value>) -> Value {
        let (visible, calls) = hidden::split(message, |name| self.is_proxy(name));
        let ids = hidden::call_ids(&visible);
        // The conversation as the client sent it, which is what it sends back before this
        // message next turn (the body in hand has the proxy's changes).
        let transcript = serde_json::from_slice::<Value>(&self.client_body)
            .ok()
            .and_then(|body| {
                body.get("messages").map(|m| match m {
                    Value::Array(list) => hidden::Transcript::of(list),
                    _ => hidden::Transcript::default(),
                })
            })
            .unwrap_or_default();
        let exchange = Exchange {
            key: hidden::key_of(transcript.digest(), ids),
            calls,
            results,
        };
        let store = Hidden::new(self.state.context.store().clone());
        if let Err(e) = store
            .keep(&self.identity.tenant, &self.identity.session, exchange)
            .await
        {
            tracing::warn!(error = %e, "cannot keep the proxy's hidden tool calls: the next turn will not show them to the model");
        }
        visible
    }
}

/// The answer the client gets when the model called the proxy's tools after they were withdrawn
/// ([`Round::tools_withdrawn`]): those calls are dropped, not run. `None` when nothing would be
/// left for the client (no text, no call of its own): the caller answers with
/// [`ProxyError::ToolLoopExhausted`](crate::http::error::ProxyError::ToolLoopExhausted) instead.
pub fn without_withdrawn_calls(round: &Round, message: &Value) -> Option<Value> {
    let (mut visible, _) = hidden::split(message, |name| round.is_proxy(name));
    let client_calls = visible
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    let has_text = visible
        .get("content")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.trim().is_empty());
    if !client_calls {
        if !has_text {
            return None;
        }
        // An empty `tool_calls` array is refused by the API when the client sends it back.
        if let Value::Object(map) = &mut visible {
            map.remove("tool_calls");
        }
    }
    Some(visible)
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

fn clip(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        None => text,
        Some((at, _)) => &text[..at],
    }
}
