//! When the upstream says the context is too long: a 400 or 413 may state the real limit
//! ("maximum context length is 8192 tokens", llama.cpp's `n_ctx`, …). The small error body is
//! read and context management learns the limit for this upstream and model (from the next
//! request on). The request is then planned again against a much smaller budget (compaction,
//! move-out, a summary if one is ready) and sent once more; if that fails too, or the error
//! stated no limit, the client gets the upstream's status, headers and bytes unchanged.

use futures_util::StreamExt;
use http::header;

use super::{Answer, ChatCtx, ChatRequest};
use crate::routes::shared::Shared;
use crate::routes::tool_loop::Final;
use crate::upstream::{Incoming, UpstreamRequest};

/// Error bodies read whole are at most this long (and say so in `Content-Length`); anything
/// else is relayed as a stream.
const MAX_ERROR_BODY: u64 = 64 * 1024;

/// Reads and learns from a small 400/413 answer (`Ok`: the answer to relay unchanged, and the
/// limit it stated), or gives the answer back untouched (`Err`).
pub async fn learn_limit(
    state: &Shared,
    ctx: &ChatCtx,
    answer: Incoming,
) -> Result<(Answer, Option<usize>), Incoming> {
    let small = answer
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n <= MAX_ERROR_BODY);
    if !matches!(answer.status.as_u16(), 400 | 413) || !small || !ctx.managed.counted {
        return Err(answer);
    }
    let status = answer.status;
    let mut headers = answer.headers.clone();
    // Set again from the body read (which a cut-short upstream makes shorter).
    headers.remove(header::CONTENT_LENGTH);
    let mut body = Vec::new();
    let mut chunks = std::pin::pin!(answer.into_stream());
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(e) => {
                tracing::warn!(error = %e, "upstream error body cut short");
                break;
            }
        }
    }
    let model = ctx.request.model().unwrap_or("");
    let limit = match &ctx.identity {
        Some(identity) => {
            state
                .context
                .learn_from_upstream_error(
                    &ctx.upstream.name,
                    model,
                    status.as_u16(),
                    &body,
                    &crate::context::limits::Drawn {
                        tenant: &identity.tenant,
                        sent: &ctx.request.body,
                        sent_tokens: ctx.managed.report.tokens_after,
                        default_window: ctx.upstream.context_window,
                    },
                )
                .await
        }
        None => None,
    };
    // A format whose overflow error states no limit (the Responses API's) implies one: the
    // request as sent was too long. Retried under it, not learned.
    let limit =
        limit.or_else(|| (ctx.format.implied_limit)(&body, ctx.managed.report.tokens_after));
    Ok((
        Answer::Json(Final {
            status,
            headers,
            body: body.into(),
        }),
        limit,
    ))
}

/// Plans the client's request again against a budget well under the stated `limit` and sends
/// it once more. `None` when it cannot be retried: nothing was sent, or the new plan does not
/// make the request smaller (the upstream's error then goes to the client as it came).
pub async fn retry(state: &Shared, ctx: &mut ChatCtx, limit: usize) -> Option<Incoming> {
    let outgoing = ctx.outgoing.clone()?;
    let request = ChatRequest::parse(ctx.request.raw.clone()).ok()?;
    let budget =
        state
            .context
            .retry_budget(limit, &request.body, ctx.managed.report.tokens_after.max(1));
    tracing::info!(
        limit,
        budget,
        "the upstream said the context is too long: retrying once with a smaller budget"
    );
    ctx.request = request;
    ctx.headers = outgoing.headers.clone();
    ctx.budget_override = Some(budget);
    let sent = std::mem::replace(&mut ctx.managed, crate::context::Managed::off());
    let (reload, body_changed, restored) = (ctx.reload.take(), ctx.body_changed, ctx.restored);
    ctx.body_changed = false;
    ctx.restored = 0;
    super::plan(state, ctx).await;
    let smaller = ctx
        .plan
        .as_ref()
        .is_some_and(|p| p.rewrites() && p.report.tokens_after < sent.report.tokens_after);
    if !smaller {
        tracing::info!("the request cannot be made smaller: relaying the upstream's error");
        (ctx.plan, ctx.managed, ctx.reload) = (None, sent, reload);
        (ctx.body_changed, ctx.restored) = (body_changed, restored);
        return None;
    }
    super::apply(state, ctx).await.ok()?;
    let body = super::outgoing_body(ctx);
    let request = UpstreamRequest { body, ..outgoing };
    let answer = ctx.upstream.send(&request).await.ok()?;
    ctx.stats
        .upstream_calls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let report = &ctx.managed.report;
    ctx.stats.bill(crate::pricing::Call::conversation(
        crate::pricing::CallKind::Retry,
        report.tokens_after,
        report.kept_prefix_tokens,
    ));
    if answer.status.is_success() {
        // The request planned for `limit` went through: the limit holds for every tenant.
        let model = ctx.request.model().unwrap_or("");
        state
            .context
            .confirm_limit(&ctx.upstream.name, model, limit)
            .await;
    }
    ctx.outgoing = Some(request);
    ctx.headers = http::HeaderMap::new();
    Some(answer)
}
