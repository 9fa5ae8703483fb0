//! record: what one request did, once its response is known — metrics, the comparison of the
//! proxy's token count with the upstream's `usage`, a debug line with the timings, and the
//! exchange handed to the traffic recorder when one runs; with `[ui] enabled`, the session's
//! journal line for the page (`routes::ui::journal`), handed to its writer.

use std::sync::atomic::{AtomicU64, Ordering};

use super::ChatCtx;
use crate::context::Skipped;
use crate::routes::shared::Shared;
use crate::upstream::relay::End;
use crate::wire::Usage;

/// Records a finished request. `usage` is the upstream's, when read.
pub fn record(
    state: &Shared,
    ctx: &ChatCtx,
    status: http::StatusCode,
    end: End,
    usage: Option<&Usage>,
    response: Option<bytes::Bytes>,
) {
    let billed = usage.map(|u| u.prompt_tokens);
    if let Some(caller) = &ctx.caller {
        caller.settle_tokens(
            usage.map_or(ctx.managed.report.tokens_after as u64, |u| u.total_tokens),
            ctx.reserved_tokens,
        );
    }
    let metrics = &state.metrics;
    let add = |c: &AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
    let managed = &ctx.managed;
    let route = ctx.format.wire.adapter().name();
    if ctx.format.wire == crate::context::adapter::Wire::Chat {
        add(&metrics.chat_requests, 1);
    }
    add(&metrics.tokens_before, managed.report.tokens_before);
    add(&metrics.tokens_after, managed.report.tokens_after);
    if managed.body.is_some() {
        add(&metrics.context_rewritten, 1);
    }
    if managed.fail_open {
        add(&metrics.context_fail_open, 1);
    }
    if managed.report.warn_unpaid {
        add(&metrics.budget_unpaid_conversations, 1);
    }
    match managed.report.skipped {
        Some(Skipped::Malformed(_)) => {
            add(&metrics.context_malformed, 1);
        }
        Some(Skipped::QuotaExceeded(scope)) => metrics.record_quota_exceeded(scope.as_str()),
        _ => {}
    }
    let upstream_calls = ctx.stats.upstream_calls.load(Ordering::Relaxed);
    let bill = ctx.stats.bill_so_far();
    record_bill(state, ctx, &bill);
    // Only one upstream call's usage is comparable with the proxy's count of the request.
    if let (true, 1, Some(billed)) = (managed.counted, upstream_calls, billed) {
        metrics.record_usage(managed.report.tokens_after, billed);
        // Without a public tokenizer, the answer's usage corrects the conversation's estimate.
        if let Some(identity) = &ctx.identity {
            state.context.observe_usage(
                identity,
                ctx.format.wire,
                managed.report.tokens_after,
                billed as usize,
            );
        }
    }
    let t = &ctx.timings;
    let between = |from: Option<std::time::Instant>, to: Option<std::time::Instant>| {
        Some(to?.saturating_duration_since(from?))
    };
    let report = &managed.report;
    metrics.record_chat(&crate::telemetry::metrics::ChatSample {
        route,
        model: ctx.model.as_deref(),
        upstream: &ctx.upstream.name,
        tokens_before: report.tokens_before,
        tokens_after: report.tokens_after,
        kept_prefix_tokens: report.kept_prefix_tokens,
        truncated: report.truncated,
        compacted: report.compacted,
        offloaded: report.offloaded,
        reloaded: ctx.stats.calls.load(Ordering::Relaxed),
        repeated: report.repeated,
        upstream_calls,
        usage,
        store_error: managed.fail_open.then(|| state.store.backend.as_str()),
        proxy: between(Some(t.received), t.planned),
        upstream_wait: between(t.planned, t.upstream_headers),
        first_byte: between(Some(t.received), t.first_byte),
        total: between(Some(t.received), t.done),
    });
    let ms = |at: Option<std::time::Instant>| {
        at.map(|at| at.duration_since(t.received).as_secs_f64() * 1e3)
    };
    tracing::debug!(
        status = status.as_u16(),
        end = ?end,
        upstream = %ctx.upstream.name,
        upstream_calls,
        reload_rounds = ctx.stats.rounds.load(Ordering::Relaxed),
        restored = ctx.restored,
        actions = %managed.report.actions(),
        planned_ms = ms(t.planned),
        upstream_headers_ms = ms(t.upstream_headers),
        first_byte_ms = ms(t.first_byte),
        done_ms = ms(t.done),
        "chat request recorded"
    );
    if state.ui.is_some() {
        journal_line(state, ctx, status, usage, bill);
    }
    if let Some(recorder) = &state.recorder {
        if !recorder.offer(pending(ctx, status, end, response)) {
            add(&metrics.record_dropped, 1);
        }
    }
}

/// Every upstream call of the request on the metrics, by kind, priced with its upstream's
/// cache prices in full-price input tokens of its model; the summarizer counted its own.
fn record_bill(state: &Shared, ctx: &ChatCtx, bill: &crate::pricing::Bill) {
    let model = ctx.model.as_deref().unwrap_or("");
    let cache = ctx.upstream.cache.for_model(model);
    for call in &bill.calls {
        if call.kind != crate::pricing::CallKind::Summarizer {
            let cost = call.cost(&cache, model);
            state
                .metrics
                .calls
                .record(call.kind.as_str(), call.tokens, cost);
        }
    }
}

/// The exchange for the recorder: bytes the request already holds, shared, not copied.
fn pending(
    ctx: &ChatCtx,
    status: http::StatusCode,
    end: End,
    response: Option<bytes::Bytes>,
) -> crate::recorder::Pending {
    let t = &ctx.timings;
    let ms = |at: Option<std::time::Instant>| {
        at.map(|at| at.duration_since(t.received).as_secs_f64() * 1e3)
    };
    let forwarded = ctx
        .outgoing
        .as_ref()
        .map(|o| o.body.clone())
        .filter(|body| *body != ctx.request.raw);
    let session = match &ctx.identity {
        Some(identity) => Some(identity.session.name().into_owned()),
        None => ctx
            .outgoing
            .as_ref()
            .and_then(|o| o.headers.get(crate::context::session::SESSION_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    };
    let managed = &ctx.managed;
    crate::recorder::Pending {
        at: std::time::SystemTime::now()
            .checked_sub(t.received.elapsed())
            .unwrap_or_else(std::time::SystemTime::now),
        request_id: ctx.request_id().to_string(),
        session,
        tenant: ctx.identity.as_ref().map(|i| i.tenant.as_str().to_string()),
        mode: ctx.mode.as_str(),
        route: ctx.format.name,
        request: ctx.request.raw.clone(),
        forwarded,
        response,
        status: status.as_u16(),
        end,
        ttfb_ms: ms(t.first_byte),
        total_ms: ms(t.done),
        tokens_before: managed.counted.then_some(managed.report.tokens_before),
        tokens_after: managed.counted.then_some(managed.report.tokens_after),
        actions: if managed.counted {
            managed.report.actions()
        } else {
            "off".to_string()
        },
        upstream_calls: u64::from(ctx.stats.upstream_calls.load(Ordering::Relaxed)),
        reload_rounds: u64::from(ctx.stats.rounds.load(Ordering::Relaxed)),
    }
}

/// Hands the page's journal line of a managed request (and the bodies to keep) to the journal
/// writer, after the answer went out.
fn journal_line(
    state: &Shared,
    ctx: &ChatCtx,
    status: http::StatusCode,
    usage: Option<&Usage>,
    bill: crate::pricing::Bill,
) {
    use crate::routes::ui::journal::{self, RequestLine};
    let (Some(ui), Some(identity)) = (&state.ui, &ctx.identity) else {
        return;
    };
    // A count of tokens is no turn of the conversation, and is not billed as one.
    if ctx.format.name == "count_tokens" {
        return;
    }
    let t = &ctx.timings;
    let ms = |at: Option<std::time::Instant>| {
        at.map(|at| at.duration_since(t.received).as_secs_f64() * 1e3)
    };
    let report = &ctx.managed.report;
    let at = std::time::SystemTime::now();
    let line = RequestLine {
        ts: crate::context::writer::rfc3339(at),
        request_id: ctx.request_id().to_string(),
        event: "request".into(),
        route: ctx.format.name.into(),
        model: ctx.model.clone(),
        upstream: ctx.upstream.name.clone(),
        status: status.as_u16(),
        mode: ctx.mode.as_str().to_string(),
        stream: ctx
            .request
            .body
            .get("stream")
            .and_then(serde_json::Value::as_bool)
            == Some(true),
        tokens_before: report.tokens_before,
        tokens_after: report.tokens_after,
        kept_prefix_tokens: report.kept_prefix_tokens,
        // Counted by the writer, against the session's previous request.
        client_shared_tokens: None,
        rewrote_prefix: report.rewrote_prefix,
        actions: report.actions(),
        summary: ctx.summary.map(str::to_string),
        prompt_tokens: usage.map(|u| u.prompt_tokens),
        cached_tokens: usage.and_then(|u| u.cached_tokens),
        completion_tokens: usage.map(|u| u.completion_tokens),
        proxy_ms: ms(t.planned),
        ttfb_ms: ms(t.first_byte),
        latency_ms: ms(t.done),
        upstream_calls: ctx.stats.upstream_calls.load(Ordering::Relaxed),
        reload_rounds: ctx.stats.rounds.load(Ordering::Relaxed),
        reload_calls: ctx.stats.calls.load(Ordering::Relaxed),
        reloads: std::mem::take(&mut *ctx.stats.log.lock().unwrap_or_else(|e| e.into_inner())),
        refs: ctx
            .managed
            .refs
            .iter()
            .map(|r| r.as_str().to_string())
            .collect(),
        bodies: None,
        calls: bill,
    };
    // The bodies as they are (shared, not copied): the writer reads them. The forwarded one
    // only when the proxy sent other bytes (the same buffer when it sent the client's): the
    // writer counts it, as the upstream bills it, for the line's bill.
    let keep = ui.config.keep_messages && ctx.request.raw.len() <= ui.config.max_kept_bytes;
    let raw = &ctx.request.raw;
    let forwarded_body = ctx
        .outgoing
        .as_ref()
        .map(|o| &o.body)
        .filter(|body| body.as_ptr() != raw.as_ptr() || body.len() != raw.len())
        .cloned();
    let recount = forwarded_body.as_ref().map(|_| journal::Recount {
        counter: state
            .context
            .counter_for(ctx.model.as_deref().unwrap_or(""), ctx.upstream.encoding),
        sent: journal::sent(ctx.format.wire),
    });
    let pending = journal::Pending {
        tenant: identity.tenant.clone(),
        session: identity.session.clone(),
        conversation: journal::conversation(ctx.format.wire),
        line,
        at,
        client_parts: ctx.client_parts.clone(),
        client_body: keep.then(|| raw.clone()),
        forwarded_body,
        recount,
    };
    ui.journal.offer(pending);
}
