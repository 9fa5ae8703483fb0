//! `POST /v1/chat/completions`: the proxy's own request path, as a short list of phases over
//! one per-request context ([`ChatCtx`]):
//!
//! **parse → identify → plan → apply → forward → tool loop → respond → record**
//!
//! - `parse` reads the body (bounded) and parses it; the raw bytes are kept, so a request no
//!   phase changes reaches the upstream byte-identical;
//! - `identify` says whose conversation it is (tenant, session), in which mode, and which
//!   upstream serves its model;
//! - `plan` counts it and lets the pure engine decide ([`crate::context`]);
//! - `apply` stores what the plan removes and builds the new body;
//! - `forward` builds the upstream request once (it can be sent again) and sends it;
//! - `tool loop` is where the proxy answers its own tools and retries (its room is here; it
//!   passes the answer through until the reload tools land);
//! - `respond` relays the answer to the client as it arrives, reading it on the way;
//! - `record` runs once the response is known — when its body has ended or the client left.
//!
//! Each phase is a plain function with one job; this function is the list.

mod ctx;
mod record;
mod request;
mod respond;

use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response};
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::context::Mode;
use crate::error::ProxyError;
use crate::request_body::read_limited;
use crate::state::AppState;
use crate::upstream;

pub use ctx::{ChatCtx, Timings};
pub use request::ChatRequest;

/// Runs the phases for one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    let mut ctx = parse(&state, req, request_id).await?;
    identify(&state, &mut ctx)?;
    plan(&state, &mut ctx).await;
    apply(&state, &mut ctx).await;
    let answer = forward(&mut ctx).await?;
    let answer = tool_loop(&state, &mut ctx, answer).await?;
    Ok(respond::respond(state, ctx, answer))
}

/// parse: the body, read under `server.max_body_bytes`, as a JSON object, and the upstream
/// serving its model.
async fn parse(
    state: &AppState,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<ChatCtx, ProxyError> {
    let received = Instant::now();
    let (parts, body) = req.into_parts();
    let raw = read_limited(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let request = ChatRequest::parse(raw)?;
    let upstream = state.upstreams.route(request.model()).clone();
    tracing::debug!(upstream = %upstream.name, model = request.model().unwrap_or(""), "routed");
    Ok(ChatCtx::new(request_id, parts, request, upstream, received))
}

/// identify: the mode (`x-context-mode` or the config's) and, when the context is managed,
/// the conversation (tenant from the API key, session).
fn identify(state: &AppState, ctx: &mut ChatCtx) -> Result<(), ProxyError> {
    ctx.mode = state
        .context
        .mode(&ctx.headers)
        .map_err(ProxyError::InvalidRequest)?;
    if ctx.mode != Mode::Off {
        ctx.identity = state.context.identify(&ctx.headers, &ctx.request.body);
    }
    Ok(())
}

/// plan: count and decide (no store writes).
async fn plan(state: &AppState, ctx: &mut ChatCtx) {
    let plan = state
        .context
        .plan(
            ctx.identity.as_ref(),
            &ctx.request.body,
            ctx.mode,
            ctx.upstream.encoding,
        )
        .await;
    ctx.plan = Some(plan);
}

/// apply: store what the plan removes, remember the decision, build the new body.
async fn apply(state: &AppState, ctx: &mut ChatCtx) {
    let Some(plan) = ctx.plan.take() else {
        return;
    };
    let request_id = ctx.request_id.clone();
    ctx.managed = state
        .context
        .apply(
            ctx.identity.as_ref(),
            plan,
            &mut ctx.request.body,
            request_id.to_str().unwrap_or_default(),
        )
        .await;
    ctx.timings.planned = Some(Instant::now());
}

/// forward: the upstream request, built once from the new body (or the client's bytes) and the
/// client's headers, then sent.
async fn forward(ctx: &mut ChatCtx) -> Result<upstream::Incoming, ProxyError> {
    let body = ctx
        .managed
        .body
        .clone()
        .unwrap_or_else(|| ctx.request.raw.clone());
    let request = ctx.upstream.request(
        Method::POST,
        "/chat/completions",
        ctx.query.as_deref(),
        std::mem::take(&mut ctx.headers),
        // Content-Length follows the body we send. Accept-Encoding is left out so the answer
        // comes uncompressed and the proxy can read it as it streams past.
        &[
            header::HOST,
            header::CONTENT_LENGTH,
            header::ACCEPT_ENCODING,
        ],
        body,
    );
    let answer = ctx.upstream.send(&request).await?;
    ctx.upstream_calls += 1;
    ctx.timings.upstream_headers = Some(Instant::now());
    ctx.outgoing = Some(request);
    Ok(answer)
}

/// tool loop: where the proxy runs the calls of its own injected tools and calls the upstream
/// again, and retries once when the upstream says the context is too long. Until those land,
/// the upstream's answer goes to the client as it is.
async fn tool_loop(
    _state: &AppState,
    _ctx: &mut ChatCtx,
    answer: upstream::Incoming,
) -> Result<upstream::Incoming, ProxyError> {
    Ok(answer)
}
