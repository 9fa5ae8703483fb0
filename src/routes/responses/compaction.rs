//! Compaction on the Responses API, between identify and plan (`context::compaction` builds,
//! this module asks and answers):
//!
//! - every `compaction` item the proxy sealed is expanded into its summary message before the
//!   request goes anywhere (one it cannot open is a 400; another maker's item is left alone);
//! - a request whose final input item is a `compaction_trigger` (Codex's "remote compaction
//!   v2"), and every `POST /v1/responses/compact`, is answered by the proxy: the summarizer
//!   summarizes the input (once per prefix: its cache is the planner's), the summary is sealed
//!   into one `compaction` item, and the answer is what the API answers — a `response` with
//!   that one item (JSON, or the events `response.created` … `response.completed`), or the
//!   compacted window `{"output": [user messages…, compaction]}`;
//! - when no summary can be had (no summarizer, its failure or timeout) the answer is the same
//!   with an item sealed around the marker alone (the originals stored, readable with
//!   `context_read`): an upstream without compaction never sees the trigger;
//! - a trigger elsewhere than last, or twice, is a 400;
//! - it goes to the upstream as it came (after expansion) when the upstream compacts natively
//!   (`native_compaction`), the mode is `off`, or nothing can be sealed (the store fails, the
//!   input holds no conversation): `x-context-actions` says why.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::context::adapter::{Adapter, Responses};
use crate::context::compaction::{self, ExpandError, Span};
use crate::context::model::Kind;
use crate::context::session::{Identity, Prefixes};
use crate::context::summary_store::hash_hex;
use crate::context::{Mode, SummaryJob, ACTIONS_HEADER};
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::routes::chat::{self, Answer, ChatCtx, Final};
use crate::routes::shared::Shared;
use crate::summarizer::{self, Task};
use crate::tokens::Counter;

/// Which compaction a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `POST /v1/responses` (a compaction only when its final input item is a trigger).
    Turn,
    /// `POST /v1/responses/compact`.
    Compact,
}

/// What the request does next.
pub enum Next {
    /// The proxy answered it.
    Answered(Response<ProxyBody>),
    /// It goes on through the phases (forwarded unmanaged when `ctx.mode` is off).
    Forward(Box<ChatCtx>),
}

/// Expands the proxy's sealed items, then answers a compaction request or lets it go on.
pub async fn prepare(state: &Arc<Shared>, mut ctx: ChatCtx, ask: Ask) -> Result<Next, ProxyError> {
    let opaque = ctx.unmanaged.is_some() && ctx.request.body.is_null();
    let mentions = |needle: &str| {
        ctx.request
            .raw
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    let relevant =
        ask == Ask::Compact || mentions(compaction::SEAL_PREFIX) || mentions(compaction::TRIGGER);
    if opaque || !relevant {
        return Ok(Next::Forward(Box::new(ctx)));
    }
    chat::read_whole(state, &mut ctx)?;
    if ctx.request.body.is_null() {
        // JSON a DOM cannot hold (a lone surrogate): it goes as it came.
        return Ok(Next::Forward(Box::new(ctx)));
    }
    let trigger = compaction::trigger(&ctx.request.body).map_err(ProxyError::InvalidRequest)?;
    let tenant = chat::tenant_of(&ctx);
    let records = match compaction::records(
        state.context.store().as_ref(),
        &tenant,
        &ctx.request.body,
    )
    .await
    {
        Ok(records) => records,
        Err(e @ ExpandError::Unknown { .. }) => {
            return Err(ProxyError::InvalidRequest(e.to_string()))
        }
        Err(e @ ExpandError::Store(_)) => {
            tracing::warn!(error = %e, "cannot open the proxy's compaction items: forwarded as they came");
            Vec::new()
        }
    };
    let span =
        (trigger || ask == Ask::Compact).then(|| compaction::span(&ctx.request.body, &records));
    ctx.named_refs = compaction::named_refs(&records);
    if compaction::expand(&mut ctx.request.body, &records) > 0 {
        // As if the client had sent the summary: every later phase reads these bytes.
        ctx.request.raw = Bytes::from(ctx.request.body.to_string());
        state.metrics.record_compaction("expanded");
    }
    let Some(span) = span else {
        return Ok(Next::Forward(Box::new(ctx)));
    };
    let forward = |mut ctx: ChatCtx, why: String| {
        ctx.unmanaged = Some(why);
        ctx.mode = Mode::Off;
        Ok(Next::Forward(Box::new(ctx)))
    };
    if ctx.upstream.native_compaction {
        state.metrics.record_compaction("native");
        return forward(
            ctx,
            "compaction: the upstream compacts natively (native_compaction)".into(),
        );
    }
    if ctx.mode == Mode::Off {
        let why = ctx
            .unmanaged
            .take()
            .unwrap_or_else(|| "context mode off".into());
        return forward(ctx, format!("compaction: {why}"));
    }
    match compact(state, &ctx, &span).await {
        Ok(done) => {
            state.metrics.record_compaction(done.source.outcome());
            if let Source::MarkerOnly(why) = &done.source {
                tracing::warn!(%why, "compaction sealed around the marker alone: no summary");
            }
            Ok(Next::Answered(answer(state, ctx, ask, &span, done)))
        }
        Err(why) => {
            tracing::warn!(%why, "compaction not made by the proxy: forwarded as it came");
            state.metrics.record_compaction("forwarded");
            forward(ctx, format!("compaction: {why}; forwarded as it came"))
        }
    }
}

/// A compaction made.
struct Done {
    item: Value,
    summary_tokens: usize,
    input_tokens: usize,
    source: Source,
}

/// Where a compaction's text came from.
enum Source {
    /// The summarizer wrote the summary now.
    Computed,
    /// The summary was in its cache.
    Cached,
    /// No summary could be had (the reason): the item holds the marker alone.
    MarkerOnly(String),
}

impl Source {
    /// The outcome label of `context_proxy_responses_compactions_total`.
    fn outcome(&self) -> &'static str {
        match self {
            Source::Computed => "computed",
            Source::Cached => "hit",
            Source::MarkerOnly(_) => "marker",
        }
    }

    /// What `x-context-actions` says of it.
    fn action(&self) -> String {
        match self {
            Source::Computed | Source::Cached => format!("compaction (summary {})", self.outcome()),
            Source::MarkerOnly(why) => format!("compaction (marker only: {why})"),
        }
    }
}

/// `span` sealed with its summary (the summarizer's, or its cache's), or with the marker alone
/// when no summary can be had; an error when nothing can be sealed.
async fn compact(state: &Shared, ctx: &ChatCtx, span: &Span) -> Result<Done, String> {
    let identity = ctx
        .identity
        .clone()
        .or_else(|| chat::identity_of(state, ctx))
        .ok_or("the request holds no conversation")?;
    let model = ctx.request.model().unwrap_or("").to_string();
    let counter = state.context.counter_for(&model, ctx.upstream.encoding);
    let covered = &span.items[span.from.min(span.items.len())..];
    let covered_tokens = Responses
        .count(&counter, &json!({ "input": covered }))
        .total;
    let (summary, source) = match summarize(state, ctx, span, &identity, &counter).await {
        Ok((summary, source)) => (Some(summary), source),
        Err(why) => (None, Source::MarkerOnly(why)),
    };
    let store = state.context.store();
    let (item, record) = compaction::seal(
        store.as_ref(),
        &identity,
        span,
        summary.as_deref(),
        covered_tokens,
    )
    .await
    .map_err(|e| format!("store: {e}"))?;
    Ok(Done {
        item,
        summary_tokens: Responses
            .count(&counter, &json!({ "input": [record.message] }))
            .total,
        input_tokens: Responses.count(&counter, &ctx.request.body).total,
        source,
    })
}

/// The summary of `span`: the summarizer's, or its cache's.
async fn summarize(
    state: &Shared,
    ctx: &ChatCtx,
    span: &Span,
    identity: &Identity,
    counter: &Counter,
) -> Result<(String, Source), String> {
    let summarizer = state
        .summarizer
        .as_ref()
        .ok_or("no summarizer ([context.summarizer] enabled = false)")?;
    let count = |t: &str| counter.count_text(t);
    let config = summarizer.config();
    let covered = &span.items[span.from.min(span.items.len())..];
    let room = config
        .max_input_tokens
        .saturating_sub(config.max_summary_tokens + 1_000)
        .saturating_sub(span.previous.as_deref().map_or(0, count));
    // The summarizer reads the conversation, not the instructions: the client sends its
    // system and developer messages again after a compaction (Codex does).
    let said: Vec<Value> = covered
        .iter()
        .filter(|item| Responses.kind(item) != Kind::Instructions)
        .cloned()
        .collect();
    let prefixes = Prefixes::of(&span.items);
    let prefix_hash = prefixes
        .get(span.items.len())
        .map(hash_hex)
        .ok_or("the input cannot be hashed")?;
    let task = Task {
        identity: identity.clone(),
        job: SummaryJob {
            prefix_len: span.items.len(),
            prefix_hash,
            previous: span.previous.clone(),
            span: crate::context::summary::render_span(
                &Responses,
                &said,
                state.context.tool_result_max_tokens(),
                room.max(1_000),
                &count,
            ),
            blocking: true,
            encoding: counter.encoding(),
        },
        upstream: ctx.upstream.clone(),
        authorization: ctx.headers.get(header::AUTHORIZATION).cloned(),
        model: ctx.request.model().unwrap_or("").to_string(),
        // The request waits for it: its calls go on the request's bill.
        bill: Some(ctx.stats.bill.clone()),
    };
    let deadline = tokio::time::Instant::now() + summarizer.timeout();
    let (summary, source) = summarizer
        .obtain(&task, deadline)
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        summary,
        match source {
            summarizer::Source::Cached => Source::Cached,
            summarizer::Source::Computed => Source::Computed,
        },
    ))
}

/// The API's answer to the compaction, relayed through the respond phase (metrics, record).
fn answer(
    state: &Arc<Shared>,
    ctx: ChatCtx,
    ask: Ask,
    span: &Span,
    done: Done,
) -> Response<ProxyBody> {
    let usage = json!({
        "input_tokens": done.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": done.summary_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.input_tokens + done.summary_tokens,
    });
    let id = response_id(ctx.request_id(), &done.item);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stream = ctx.request.body.get("stream") == Some(&Value::Bool(true));
    let (content_type, body) = match ask {
        Ask::Compact => {
            let mut output = span.kept.clone();
            output.push(done.item.clone());
            let body = json!({
                "id": id, "object": "response.compaction", "created_at": created,
                "output": output, "usage": usage,
            });
            ("application/json", body.to_string())
        }
        Ask::Turn => {
            let response = |status: &str, output: Vec<Value>, usage: Value| {
                response_object(&ctx.request.body, &id, created, status, output, usage)
            };
            let done_response = response("completed", vec![done.item.clone()], usage);
            if stream {
                let events = [
                    json!({"type": "response.created", "response": response("in_progress", vec![], Value::Null)}),
                    json!({"type": "response.in_progress", "response": response("in_progress", vec![], Value::Null)}),
                    json!({"type": "response.output_item.added", "output_index": 0, "item": done.item}),
                    json!({"type": "response.output_item.done", "output_index": 0, "item": done.item}),
                    json!({"type": "response.completed", "response": done_response}),
                ];
                ("text/event-stream", sse(events))
            } else {
                ("application/json", done_response.to_string())
            }
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let actions = done.source.action();
    let mut response = chat::respond(
        state.clone(),
        ctx,
        Answer::Json(Final {
            status: StatusCode::OK,
            headers,
            body: Bytes::from(body),
        }),
    );
    if let Ok(v) = HeaderValue::from_str(&actions) {
        response.headers_mut().insert(ACTIONS_HEADER, v);
    }
    response
}

/// A `response` object answering `request` with `output`, its echoed fields the request's.
fn response_object(
    request: &Value,
    id: &str,
    created: u64,
    status: &str,
    output: Vec<Value>,
    usage: Value,
) -> Value {
    let mut out = Map::new();
    out.insert("id".into(), json!(id));
    out.insert("object".into(), json!("response"));
    out.insert("created_at".into(), json!(created));
    out.insert("status".into(), json!(status));
    out.insert("background".into(), json!(false));
    out.insert("error".into(), Value::Null);
    out.insert("incomplete_details".into(), Value::Null);
    for key in ["instructions", "max_output_tokens", "model"] {
        out.insert(key.into(), request.get(key).cloned().unwrap_or(Value::Null));
    }
    out.insert("output".into(), Value::Array(output));
    for (key, default) in [
        ("parallel_tool_calls", json!(true)),
        ("previous_response_id", Value::Null),
        ("prompt_cache_key", Value::Null),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("store", json!(true)),
        ("temperature", json!(1.0)),
        ("text", json!({"format": {"type": "text"}})),
        ("tool_choice", json!("auto")),
        ("tools", json!([])),
        ("top_p", json!(1.0)),
        ("truncation", json!("disabled")),
    ] {
        out.insert(key.into(), request.get(key).cloned().unwrap_or(default));
    }
    out.insert("usage".into(), usage);
    Value::Object(out)
}

/// The events as an SSE body, `sequence_number` counting from 0.
fn sse(events: impl IntoIterator<Item = Value>) -> String {
    let mut body = String::new();
    for (n, mut event) in events.into_iter().enumerate() {
        let kind = event["type"].as_str().unwrap_or("").to_owned();
        if let Value::Object(map) = &mut event {
            map.insert("sequence_number".into(), json!(n));
        }
        body.push_str(&format!("event: {kind}\ndata: {event}\n\n"));
    }
    body
}

/// `resp_` and 48 hex digits, from the request and the item.
fn response_id(request_id: &str, item: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(request_id.as_bytes());
    hasher.update(item.to_string().as_bytes());
    let hex: String = hasher.finalize()[..24]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("resp_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_are_numbered_in_order_and_the_response_echoes_the_request() {
        let body = sse([json!({"type": "a"}), json!({"type": "b", "x": 1})]);
        assert_eq!(
            body,
            "event: a\ndata: {\"type\":\"a\",\"sequence_number\":0}\n\n\
             event: b\ndata: {\"type\":\"b\",\"x\":1,\"sequence_number\":1}\n\n"
        );
        let request = json!({"model": "gpt-5", "store": false, "instructions": "Be brief."});
        let r = response_object(
            &request,
            "resp_1",
            7,
            "completed",
            vec![json!(1)],
            json!({}),
        );
        assert_eq!(r["store"], false);
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(r["output"], json!([1]));
        assert_eq!(r["tool_choice"], "auto");
        let id = response_id("req", &json!({}));
        assert!(id.starts_with("resp_") && id.len() == 5 + 48);
    }
}
