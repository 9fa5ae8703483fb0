//! When the upstream says the context is too long: a 400 or 413 may state the real limit
//! ("maximum context length is 8192 tokens", llama.cpp's `n_ctx`, …). The small error body is
//! read, context management learns the limit for this upstream and model (from the next
//! request on), and the client gets the same status, headers and bytes.

use futures_util::StreamExt;
use http::header;

use super::loop_json::Final;
use super::{Answer, ChatCtx};
use crate::state::AppState;
use crate::upstream::Incoming;

/// Error bodies read whole are at most this long (and say so in `Content-Length`); anything
/// else is relayed as a stream.
const MAX_ERROR_BODY: u64 = 64 * 1024;

/// Reads and learns from a small 400/413 answer (`Ok`, relayed unchanged), or gives the answer
/// back untouched (`Err`).
pub async fn learn_limit(
    state: &AppState,
    ctx: &ChatCtx,
    answer: Incoming,
) -> Result<Answer, Incoming> {
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
    state
        .context
        .learn_from_upstream_error(&ctx.upstream.name, model, status.as_u16(), &body)
        .await;
    Ok(Answer::Json(Final {
        status,
        headers,
        body: body.into(),
    }))
}
