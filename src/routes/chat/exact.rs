//! The upstream's exact count, where an estimate is not good enough: on a format whose upstream
//! counts a request for free (Anthropic's `POST /v1/messages/count_tokens`; there is no public
//! Claude tokenizer, so the proxy estimates), and on an upstream whose `count_tokens_margin` is
//! above 0.
//!
//! - **Near the budget**: when the estimate of the request, as the client sent it, is within
//!   the margin of its budget (above or below), the upstream counts it, and the plan decides by
//!   that count: a request the estimate puts just over the budget but the upstream just under
//!   it is not cut, and the other way round ([`crate::context::Route::scale`]).
//! - **Over the window**: when the request as it would be forwarded is, by the estimate,
//!   within the margin of its model's context window or over it (the pinned head alone can be),
//!   the upstream counts that body; over the window by that count, the proxy refuses it itself
//!   in the format's own overflow wording (Anthropic's "prompt is too long: N tokens > M
//!   maximum", which clients match), without sending it.
//!
//! A count that fails or takes longer than `count_tokens_timeout_ms` changes nothing: the
//! request is decided by the estimate, as without the setting.

use bytes::Bytes;
use http::{header, Method};
use serde_json::Value;

use super::ChatCtx;
use crate::context::Sizing;
use crate::http::error::ProxyError;

/// A format's exact count: where the upstream counts a request and how.
#[derive(Debug)]
pub struct ExactCount {
    /// The upstream path that counts a request (after the base URL).
    pub path: &'static str,
    /// The body that path takes for a request `body` (only the fields it accepts).
    pub body: fn(&Value) -> Option<Vec<u8>>,
    /// The count in its answer.
    pub tokens: fn(&[u8]) -> Option<usize>,
    /// A request the window cannot hold is refused (a route that answers with a count, as
    /// `count_tokens` does, answers it instead).
    pub refuses_overflow: bool,
    /// The overflow's message: `tokens` counted over a window of `window`.
    pub too_long: fn(usize, usize) -> String,
}

/// Before planning: the request's size against its budget, and the upstream's count of it when
/// the estimate is near the budget (then the plan follows that count). `None` when the format
/// or the upstream asks for no exact count, or on a retry (its budget is the upstream's).
pub async fn near_budget(
    state: &crate::routes::shared::Shared,
    ctx: &ChatCtx,
    route: &crate::context::Route<'_>,
) -> Option<(Sizing, Option<f64>)> {
    let exact = ctx.format.exact_count?;
    let margin = ctx.upstream.count_tokens_margin;
    if margin <= 0.0 || ctx.budget_override.is_some() {
        return None;
    }
    let identity = ctx.identity.as_ref()?;
    let sizing = state
        .context
        .sizing(identity, &ctx.request.body, ctx.mode, route)
        .await;
    if sizing.tokens == 0 || !sizing.near(sizing.tokens, sizing.budget, margin) {
        return Some((sizing, None));
    }
    let counted = count(ctx, exact, &ctx.request.body).await;
    tracing::debug!(
        estimated = sizing.upstream_tokens(sizing.tokens),
        counted,
        budget = sizing.budget,
        "near the budget: the upstream counted the request"
    );
    Some((sizing, counted.map(|n| n as f64 / sizing.tokens as f64)))
}

/// After applying: refuses a request the model's window cannot hold by the upstream's count
/// of the body as it would be forwarded (asked only when the estimate puts it near the window
/// or over it).
pub async fn refuse_overflow(ctx: &ChatCtx) -> Result<(), ProxyError> {
    let (Some(exact), Some(sizing)) = (ctx.format.exact_count, ctx.sizing) else {
        return Ok(());
    };
    if !exact.refuses_overflow || !ctx.managed.counted {
        return Ok(());
    }
    let margin = ctx.upstream.count_tokens_margin;
    let sent = ctx.managed.report.tokens_after;
    let scaled = Sizing {
        scale: ctx.exact_scale.unwrap_or(sizing.scale),
        ..sizing
    };
    let estimated = scaled.upstream_tokens(sent);
    if (estimated as f64) < sizing.window as f64 * (1.0 - margin) {
        return Ok(());
    }
    let Ok(body) = serde_json::from_slice::<Value>(&super::outgoing_body(ctx)) else {
        return Ok(());
    };
    match count(ctx, exact, &body).await {
        Some(n) if n > sizing.window => {
            tracing::info!(
                counted = n,
                window = sizing.window,
                "the request does not fit the model's window by the upstream's count: refused"
            );
            Err(ProxyError::InvalidRequest((exact.too_long)(
                n,
                sizing.window,
            )))
        }
        _ => Ok(()),
    }
}

/// The upstream's count of `body`, with the client's headers (its key, its API version and
/// betas); `None` when it fails or is late.
async fn count(ctx: &ChatCtx, exact: &ExactCount, body: &Value) -> Option<usize> {
    let payload = (exact.body)(body)?;
    let request = ctx.upstream.request(
        Method::POST,
        exact.path,
        ctx.query.as_deref(),
        ctx.headers.clone(),
        &[
            header::HOST,
            header::CONTENT_LENGTH,
            header::ACCEPT_ENCODING,
        ],
        Bytes::from(payload),
    );
    let asked = async {
        let answer = ctx.upstream.send(&request).await.ok()?;
        if !answer.status.is_success() {
            tracing::debug!(status = %answer.status, "the upstream did not count the request");
            return None;
        }
        let bytes = answer.body.bytes().await.ok()?;
        (exact.tokens)(&bytes)
    };
    match tokio::time::timeout(ctx.upstream.count_tokens_timeout, asked).await {
        Ok(counted) => counted,
        Err(_) => {
            tracing::debug!("the upstream's count came too late: deciding by the estimate");
            None
        }
    }
}
