//! `POST /v1/chat/completions`: the proxy's own request path, as a short list of phases over
//! one per-request context ([`ChatCtx`]):
//!
//! **parse → identify → plan → apply → forward → tool loop → respond → record**
//!
//! - `parse` reads the body (bounded) and parses it; the raw bytes are kept, so a request no
//!   phase changes reaches the upstream byte-identical;
//! - `identify` says whose conversation it is (tenant, session), in which mode, and which
//!   upstream serves its model;
//! - `plan` puts back what the proxy hid from the client earlier (its own tool calls), counts
//!   the conversation and lets the pure engine decide ([`crate::context`]), then settles the
//!   summary of a moved-out span (`settle.rs`, [`crate::summarizer`]);
//! - `apply` stores what the plan removes, builds the new body, and offers the proxy's own
//!   tools when the body refers to stored content ([`crate::proxy_tools`]);
//! - `forward` builds the upstream request once (it can be sent again) and sends it; the
//!   answer's status tells whether the upstream accepted the client's key (`vet_key`);
//! - `tool loop` learns the limit an upstream states when it says the context is too long,
//!   plans again against a much smaller budget and retries once (`overflow.rs`), answers the model's calls of the proxy's tools and asks the upstream
//!   again, hiding them from the client (`routes::tool_loop`, with chat's `loop_wire.rs` and `loop_stream.rs`);
//! - `respond` relays the answer to the client as it arrives, reading it on the way;
//! - `record` runs once the response is known — when its body has ended or the client left.
//!
//! Each phase is a plain function with one job; this function is the list.

mod ctx;
mod dom;
pub mod exact;
pub mod format;
mod loop_stream;
mod loop_wire;
mod overflow;
mod record;
mod request;
mod respond;
mod settle;

use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response};
use hyper::body::Incoming;

use crate::context::Mode;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::request_body::{check_json_shape, read_limited};
use crate::routes::shared::Shared;
use crate::routes::tool_loop;
use crate::upstream;
use serde_json::Value;

pub use crate::routes::tool_loop::Final;
pub use ctx::{ChatCtx, Timings};
pub use format::Format;
pub use request::ChatRequest;
pub use respond::{context_headers, respond};

/// Runs the phases for one chat-completions request.
pub async fn handle(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    run(state, req, request_id, &format::CHAT).await
}

/// Runs the phases for one request of a managed route's `format`.
pub async fn run(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
    format: &'static Format,
) -> Result<Response<ProxyBody>, ProxyError> {
    let ctx = start(&state, req, request_id, format).await?;
    finish(state, ctx).await
}

/// parse and identify: the request read, and whose conversation it is. A route with work of
/// its own between these and planning (the Responses API's compaction) runs them, then
/// [`finish`].
pub async fn start(
    state: &Shared,
    req: Request<Incoming>,
    request_id: HeaderValue,
    format: &'static Format,
) -> Result<ChatCtx, ProxyError> {
    let mut ctx = parse(state, req, request_id, format).await?;
    identify(state, &mut ctx);
    Ok(ctx)
}

/// plan → apply → forward → tool loop → respond, for a request [`start`] read.
pub async fn finish(
    state: Arc<Shared>,
    mut ctx: ChatCtx,
) -> Result<Response<ProxyBody>, ProxyError> {
    // The store calls of planning and applying share one budget: a hung store delays the
    // request once, by `op_timeout_ms`, not once per call.
    let store_time = state.store.op_timeout();
    crate::store::with_phase_budget(store_time, async {
        plan(&state, &mut ctx).await;
        apply(&state, &mut ctx).await
    })
    .await?;
    exact::refuse_overflow(&ctx).await?;
    reserve(&mut ctx)?;
    let answer = forward(&mut ctx).await?;
    vet_key(&state, &ctx, answer.status).await;
    let answer = tool_loop(&state, &mut ctx, answer).await?;
    Ok(respond::respond(state, ctx, answer))
}

/// What the client gets: the upstream's answer relayed as it is, or one the tool loop built.
pub enum Answer {
    Relay(upstream::Incoming),
    Json(crate::routes::tool_loop::Final),
    Stream {
        status: http::StatusCode,
        headers: http::HeaderMap,
        events: tool_loop::EventStream,
    },
}

/// parse: the body, read under `server.max_body_bytes`, as a JSON object, and the upstream
/// serving its model. The mode is known here: a request whose context is not managed is only
/// peeked at for its model (no DOM); a managed one is measured, then parsed.
async fn parse(
    state: &Shared,
    req: Request<Incoming>,
    request_id: HeaderValue,
    format: &'static Format,
) -> Result<ChatCtx, ProxyError> {
    let received = Instant::now();
    let (mut parts, body) = req.into_parts();
    let mode = state
        .context
        .mode(
            parts
                .headers
                .get(crate::context::MODE_HEADER)
                .map(|v| v.to_str().unwrap_or("")),
        )
        .map_err(ProxyError::InvalidRequest)?;
    let limits = &state.body_limits;
    let raw = read_limited(body, &parts.headers, limits, &state.body_budget).await?;
    // A zstd body is decoded (its decoded size under the same limits) and goes on decoded:
    // the proxy may rewrite it, and every upstream reads a plain body.
    let raw = if crate::http::request_body::is_zstd(&parts.headers) {
        let decoded = crate::http::request_body::decode_zstd(&raw, limits, &state.body_budget)?;
        parts.headers.remove(header::CONTENT_ENCODING);
        decoded
    } else {
        raw
    };
    // A body the format cannot read as it came (compressed) goes out as it came.
    let mut unmanaged = (format.unmanaged_head)(&parts.headers);
    let peeked = match (mode, &unmanaged) {
        (_, Some(_)) => Some(ChatRequest::opaque(raw.clone())),
        (Mode::Off, None) => ChatRequest::peek(raw.clone()),
        _ => None,
    };
    let request = match peeked {
        Some(request) => request,
        None => {
            let shape = check_json_shape(&raw, limits)?;
            crate::http::request_body::hold_parsed(&state.body_budget, shape)?;
            ChatRequest::parse(raw)?
        }
    };
    let upstream = state.upstreams.route(request.model()).clone();
    tracing::debug!(upstream = %upstream.name, model = request.model().unwrap_or(""), "routed");
    crate::auth::authorize(&parts.extensions, request.model(), &upstream.name)?;
    let caller = crate::auth::caller(&parts.extensions).cloned();
    // A body only peeked at (mode off, or JSON a DOM cannot hold) is forwarded as it came.
    let mode = if request.body.is_null() {
        if mode != Mode::Off {
            tracing::info!("the body holds a lone surrogate escape: forwarded unmanaged");
        }
        Mode::Off
    } else {
        mode
    };
    if mode != Mode::Off && unmanaged.is_none() {
        unmanaged = (format.unmanaged_body)(&request.body);
    }
    let mode = if unmanaged.is_some() { Mode::Off } else { mode };
    let mut ctx = ChatCtx::new(request_id, parts, request, upstream, received, format);
    ctx.unmanaged = unmanaged;
    ctx.mode = mode;
    ctx.caller = caller;
    ctx.model = ctx.request.model().map(str::to_owned);
    Ok(ctx)
}

/// The body of a request only peeked at by parse, read whole after all (a route found it
/// needs it); the bytes it goes out with do not change.
pub fn read_whole(state: &Shared, ctx: &mut ChatCtx) -> Result<(), ProxyError> {
    if !ctx.request.body.is_null() {
        return Ok(());
    }
    let shape = check_json_shape(&ctx.request.raw, &state.body_limits)?;
    crate::http::request_body::hold_parsed(&state.body_budget, shape)?;
    ctx.request = ChatRequest::parse(ctx.request.raw.clone())?;
    Ok(())
}

/// identify: when the context is managed (the mode, `x-context-mode` or the config's, was read
/// by parse), the conversation (tenant from the API key, session).
fn identify(state: &Shared, ctx: &mut ChatCtx) {
    if ctx.mode != Mode::Off {
        ctx.identity = identity_of(state, ctx);
    }
}

/// The conversation of a parsed request, whatever its mode: the caller's tenant (its proxy
/// key's own when keys are required (crate::auth), else the hash of the API key it presented)
/// and the session (`x-context-session`, else the format's hint, else the opening).
pub fn identity_of(state: &Shared, ctx: &ChatCtx) -> Option<crate::context::Identity> {
    let session = ctx
        .headers
        .get(crate::context::session::SESSION_HEADER)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .map(str::to_owned)
        .or_else(|| (ctx.format.session_hint)(&ctx.headers, &ctx.request.body));
    state.context.identify_wire(
        ctx.format.wire,
        tenant_of(ctx),
        session.as_deref(),
        &ctx.request.body,
    )
}

/// The caller's tenant: its proxy key's own when keys are required, else the hash of the API
/// key it presented.
pub fn tenant_of(ctx: &ChatCtx) -> crate::store::Tenant {
    match &ctx.caller {
        Some(caller) => caller.tenant.clone(),
        None => crate::store::Tenant::from_api_key(crate::http::headers::api_key(&ctx.headers)),
    }
}

/// plan: put back the proxy's hidden tool calls, then count and decide (no store writes). The
/// markers name the proxy's tools as they will be offered in this request.
async fn plan(state: &Shared, ctx: &mut ChatCtx) {
    if ctx.mode == Mode::Off {
        // Nothing to plan: the body was only peeked at and goes out as it came.
        return;
    }
    restore_rounds(state, ctx).await;
    // The proxy's tools are offered on the routes whose format runs the tool loop (not where
    // they would invalidate thinking blocks bound to the tools before them).
    let rules = (ctx.format.write_rules)(&ctx.headers, &ctx.request.body);
    if rules.is_some_and(|r| {
        crate::context::adapter::messages::tools_would_unbind(r, &ctx.request.body)
    }) {
        ctx.offer =
            crate::proxy_tools::Offer::NotOffered(crate::proxy_tools::NotOffered::ThinkingBound);
    } else if ctx.format.tool_loop.is_some() {
        ctx.offer = crate::proxy_tools::offer(&ctx.request.body, state.context.reload_config());
    }
    carry_restored_rounds(state, ctx);
    if let crate::proxy_tools::Offer::Tools(names) = &ctx.offer {
        let encoding = ctx.upstream.encoding.unwrap_or_else(|| {
            crate::tokens::Encoding::for_model(ctx.model.as_deref().unwrap_or(""))
        });
        ctx.offer_tokens = match ctx.format.wire {
            // Counted as the estimate counts the request's own tools.
            crate::context::adapter::Wire::Messages => crate::context::estimate::tools_estimate(
                &crate::proxy_tools::messages_definitions(names),
            ),
            _ => crate::proxy_tools::definitions_tokens(names, encoding),
        };
    }
    let mut route = crate::context::Route {
        upstream: Some(&ctx.upstream.name),
        encoding: ctx.upstream.encoding,
        default_window: ctx.upstream.context_window,
        readback: match &ctx.offer {
            crate::proxy_tools::Offer::Tools(names) => crate::context::markers::Readback::Tools {
                read: names.read.clone(),
                search: names.search.clone(),
            },
            crate::proxy_tools::Offer::NotOffered(_) => crate::context::markers::Readback::Stored,
        },
        budget_override: ctx.budget_override,
        summarize: state.summarizer.is_some(),
        cache: Some(
            ctx.upstream
                .cache
                .for_model(ctx.model.as_deref().unwrap_or("")),
        ),
        reserved_tokens: ctx.offer_tokens,
        wire: ctx.format.wire,
        scale: None,
        journal: state.ui.is_some(),
    };
    // Near the budget, the upstream's exact count decides (when the format and the upstream
    // ask for it).
    if let Some((sizing, scale)) = exact::near_budget(state, ctx, &route).await {
        ctx.sizing = Some(sizing);
        ctx.exact_scale = scale;
        route.scale = scale;
    }
    let mut plan = state
        .context
        .plan(
            ctx.identity.as_ref(),
            &mut ctx.request.body,
            ctx.mode,
            &route,
        )
        .await;
    ctx.client_parts = plan.client_parts.take();
    if plan.restored > 0 {
        ctx.restored = plan.restored;
        ctx.body_changed = true;
    }
    ctx.plan = Some(plan);
    settle::settle(state, ctx).await;
}

/// After the rounds were put back: the upstream transcript holds the proxy's calls, which the
/// API refuses without their tools. When the client asks for no tool call (`tool_choice`
/// none) the tools are defined all the same (the model cannot call them); when they cannot be
/// defined at all (disabled since, their names taken by the client's, thinking bound to the
/// tools), the request goes with the client's own messages, as it came.
fn carry_restored_rounds(state: &Shared, ctx: &mut ChatCtx) {
    use crate::proxy_tools::{NotOffered, Offer};
    let Some(client) = ctx.client_raw.as_ref() else {
        return;
    };
    if matches!(ctx.offer, Offer::NotOffered(NotOffered::ToolChoiceNone)) {
        ctx.offer = crate::proxy_tools::names(&ctx.request.body, state.context.reload_config());
    }
    let Offer::NotOffered(why) = &ctx.offer else {
        return;
    };
    match ChatRequest::parse(client.clone()) {
        Ok(theirs) => {
            tracing::info!(
                ?why,
                "the proxy's tools cannot be defined: its rounds are not put back"
            );
            ctx.request = theirs;
            ctx.client_raw = None;
            ctx.restored = 0;
        }
        Err(e) => tracing::warn!(error = %e, "the client's request does not parse"),
    }
}

/// Before planning, on a format whose tool loop merges its rounds into one answer (Anthropic
/// Messages): the upstream transcript of the proxy's hidden rounds put back into the request's
/// bytes in place of the client's merged messages (the client's bytes kept for the loop).
async fn restore_rounds(state: &Shared, ctx: &mut ChatCtx) {
    let (Some(wire), Some(identity)) = (ctx.format.tool_loop, &ctx.identity) else {
        return;
    };
    if !wire.merges_rounds() {
        return;
    }
    let Some((bytes, n)) = state
        .context
        .restore_rounds(identity, &ctx.request.raw, &ctx.request.body)
        .await
    else {
        return;
    };
    match ChatRequest::parse(bytes) {
        Ok(back) => {
            let client = std::mem::replace(&mut ctx.request, back);
            ctx.client_raw = Some(client.raw);
            ctx.restored += n;
        }
        Err(e) => {
            tracing::warn!(error = %e, "the restored request does not parse: sent as the client sent it")
        }
    }
}

/// apply: offer the proxy's tools when the new body will refer to stored content; store what
/// the plan removes, remember the decision, build the new body. With `store.on_error =
/// "closed"`, a store failure refuses the request instead of forwarding it unmanaged.
async fn apply(state: &Shared, ctx: &mut ChatCtx) -> Result<(), ProxyError> {
    let Some(plan) = ctx.plan.take() else {
        repeat_when_off(state, ctx).await;
        ctx.timings.planned = Some(Instant::now());
        return Ok(());
    };
    let fail_closed = state.store.fail_closed();
    if fail_closed && plan.store_failed {
        return Err(ProxyError::StoreUnavailable(
            "the session's state could not be read".into(),
        ));
    }
    // Hidden rounds put back hold the proxy's calls: they need its tools (Messages). A head
    // that crowds the budget has them from the conversation's first request on, so that they
    // do not change the cached prefix at its first cut (`engine::head_crowds_budget`).
    let rounds_back = ctx.client_raw.is_some();
    let early = plan.report.head_crowds_budget && !plan.store_failed;
    // The input names stored content itself (an expanded compaction): the tools read it.
    let named = !ctx.named_refs.is_empty();
    let offered = match (
        plan.refers_to_stored_content() || rounds_back || early || named,
        ctx.format.tool_loop,
    ) {
        (true, Some(wire)) => match ctx.offer.clone() {
            crate::proxy_tools::Offer::Tools(names) => {
                let client_had_tools = ctx
                    .request
                    .body
                    .get("tools")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty());
                wire.inject(&mut ctx.request.body, &names);
                Some((wire, names, client_had_tools))
            }
            crate::proxy_tools::Offer::NotOffered(why) => {
                tracing::debug!(?why, "the proxy's tools are not offered");
                None
            }
        },
        _ => None,
    };
    let request_id = ctx.request_id.clone();
    let request_id = request_id.to_str().unwrap_or_default();
    // Messages: the decision is written into the client's bytes, under the API's rules.
    let rules = (ctx.format.write_rules)(&ctx.headers, &ctx.request.body);
    ctx.managed = state
        .context
        .apply_to(
            ctx.identity.as_ref(),
            plan,
            &mut ctx.request.body,
            rules.map(|rules| crate::context::WrittenInto {
                raw: &ctx.request.raw[..],
                rules,
                forwards: ctx.format.remembers_forwarded,
            }),
            request_id,
        )
        .await;
    if let Some(why) = ctx.managed.refused.take() {
        return Err(ProxyError::BoundRecordUnavailable(why));
    }
    if let Some((wire, names, client_had_tools)) = offered {
        let unchanged = ctx.managed.body.is_none() && !ctx.managed.fail_open;
        if rules.is_some() {
            // Written into the bytes: the tools go there too.
            if (rounds_back || early) && unchanged {
                ctx.managed.body = Some(ctx.request.raw.clone());
            }
            if let Some(body) = &ctx.managed.body {
                ctx.managed.body = wire
                    .inject_bytes(body, &ctx.request.body, &names)
                    .map(bytes::Bytes::from);
            }
        } else if (early || named) && unchanged && ctx.managed.counted {
            // Nothing else changed: the body goes out with the tools alone.
            ctx.managed.body = Some(bytes::Bytes::from(ctx.request.body.to_string()));
        }
        if ctx.managed.body.is_some() {
            // The definitions go out with the request: they are counted in what it sends, and
            // in the prefix it keeps when the previous request had them too (it showed the
            // same stored content, or the head crowds the budget). When they are new, the
            // request's `tools` changed, and they lead the prompt the provider caches: nothing
            // is kept.
            let report = &mut ctx.managed.report;
            report.tokens_after += ctx.offer_tokens;
            if report.kept_refers_to_stored || report.head_crowds_budget || rounds_back {
                if report.kept_prefix_tokens > 0 {
                    report.kept_prefix_tokens += ctx.offer_tokens;
                }
            } else {
                report.kept_prefix_tokens = 0;
            }
            let mut refs = ctx.managed.refs.clone();
            refs.extend(
                ctx.named_refs
                    .iter()
                    .filter(|r| !ctx.managed.refs.contains(r))
                    .cloned(),
            );
            ctx.reload = Some(tool_loop::Reload {
                names,
                client_had_tools,
                refs,
            });
        } else {
            // Nothing was stored after all (the store failed): no tools either.
            wire.remove_tools(&mut ctx.request.body, &names, client_had_tools);
        }
    }
    if fail_closed && ctx.managed.fail_open {
        return Err(ProxyError::StoreUnavailable(
            "the removed content could not be stored".into(),
        ));
    }
    ctx.timings.planned = Some(Instant::now());
    Ok(())
}

/// A request in mode off (`x-context-mode: off`, or the config's) whose model binds thinking
/// to its prefix, with thinking on (Messages): where the proxy edited its conversation before,
/// the client's bytes would be refused ("bound to a different conversation"), so the form the
/// conversation forwarded before goes, with nothing new changed
/// ([`crate::context::ContextManager::repeat_recorded`]; `x-context-actions: off,repeated`).
async fn repeat_when_off(state: &Shared, ctx: &mut ChatCtx) {
    let binds = ctx
        .model
        .as_deref()
        .is_some_and(crate::context::adapter::messages::binds_thinking);
    if ctx.mode != Mode::Off || ctx.unmanaged.is_some() || !ctx.format.remembers_forwarded || !binds
    {
        return;
    }
    if read_whole(state, ctx).is_err() {
        return;
    }
    let (Some(rules), Some(identity)) = (
        (ctx.format.write_rules)(&ctx.headers, &ctx.request.body),
        identity_of(state, ctx),
    ) else {
        return;
    };
    ctx.managed = state
        .context
        .repeat_recorded(&identity, &ctx.request.raw, &ctx.request.body, rules)
        .await;
}

/// After `apply`: reserves the request's estimated tokens (the prompt as forwarded, and the
/// answer's room it asked for) against its key's tokens-per-minute budget, so concurrent
/// requests cannot all pass on one balance (429 otherwise); `record` settles it.
fn reserve(ctx: &mut ChatCtx) -> Result<(), ProxyError> {
    let Some(caller) = &ctx.caller else {
        return Ok(());
    };
    let prompt = if ctx.managed.counted {
        ctx.managed.report.tokens_after
    } else {
        0
    };
    let output = crate::context::RequestLimits::requested_output_of(&ctx.request.body).unwrap_or(0);
    let estimate = (prompt + output) as u64;
    caller.reserve_tokens(estimate)?;
    ctx.reserved_tokens = estimate;
    Ok(())
}

/// forward: the upstream request, built once from the new body (or the client's bytes) and the
/// client's headers, then sent.
async fn forward(ctx: &mut ChatCtx) -> Result<upstream::Incoming, ProxyError> {
    let body = outgoing_body(ctx);
    let request = ctx.upstream.request(
        Method::POST,
        ctx.format.path,
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
    ctx.stats
        .upstream_calls
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if ctx.managed.counted {
        let report = &ctx.managed.report;
        ctx.stats.bill(crate::pricing::Call::conversation(
            crate::pricing::CallKind::Forwarded,
            report.tokens_after,
            report.kept_prefix_tokens,
        ));
    }
    ctx.timings.upstream_headers = Some(Instant::now());
    ctx.outgoing = Some(request);
    Ok(answer)
}

/// After `forward`: whether the upstream accepted the client's key. A 2xx marks the tenant
/// accepted; a 401 or 403 for a tenant never accepted before erases what its session stored,
/// before the client sees the answer, so a rejected key leaves nothing behind.
async fn vet_key(state: &Shared, ctx: &ChatCtx, status: http::StatusCode) {
    let Some(identity) = &ctx.identity else {
        return;
    };
    if status.is_success() {
        state.context.accepted(&identity.tenant);
        return;
    }
    if status != http::StatusCode::UNAUTHORIZED && status != http::StatusCode::FORBIDDEN {
        return;
    }
    match state
        .context
        .rejected(identity, &ctx.managed.refs, ctx.request_id())
        .await
    {
        Ok(0) => {}
        Ok(items) => {
            state.metrics.record_rejected_erased(items);
            tracing::info!(
                status = status.as_u16(),
                session = %identity.session,
                items,
                "the upstream refused the key: erased what this session stored"
            );
        }
        Err(e) => tracing::warn!(error = %e, "cannot erase what a refused key stored"),
    }
}

/// The body to send: the new one, the JSON changed otherwise, or the client's bytes.
fn outgoing_body(ctx: &ChatCtx) -> bytes::Bytes {
    match (&ctx.managed.body, ctx.body_changed) {
        (Some(body), _) => body.clone(),
        (None, true) => bytes::Bytes::from(ctx.request.body.to_string()),
        (None, false) => ctx.request.raw.clone(),
    }
}

/// tool loop: when the proxy offered its tools and the upstream answered, run the model's
/// calls of them and ask again, until the answer is the client's (see `tool_loop.rs`).
async fn tool_loop(
    state: &Arc<Shared>,
    ctx: &mut ChatCtx,
    answer: upstream::Incoming,
) -> Result<Answer, ProxyError> {
    let answer = match overflow::learn_limit(state, ctx, answer).await {
        Ok((relayed, Some(limit))) => {
            // Refused as too long: made, and not billed (`pricing::Call::refused`).
            ctx.stats.refuse_last();
            match overflow::retry(state, ctx, limit).await {
                // A second "too long" is relayed as the upstream sent it.
                Some(answer) => answer,
                None => return Ok(relayed),
            }
        }
        Ok((relayed, None)) => return Ok(relayed),
        Err(answer) => answer,
    };
    let (Some(wire), Some(reload), Some(identity), Some(outgoing)) = (
        ctx.format.tool_loop,
        &ctx.reload,
        &ctx.identity,
        &ctx.outgoing,
    ) else {
        return Ok(Answer::Relay(answer));
    };
    if !answer.status.is_success() {
        return Ok(Answer::Relay(answer));
    }
    let model = ctx.request.model().unwrap_or("").to_string();
    let round = tool_loop::Round {
        wire,
        adapter: ctx.format.wire.adapter(),
        state: state.clone(),
        upstream: ctx.upstream.clone(),
        identity: identity.clone(),
        reload: reload.clone(),
        body: std::mem::take(&mut ctx.request.body),
        outgoing: outgoing.clone(),
        model,
        encoding: ctx.upstream.encoding,
        stats: ctx.stats.clone(),
        request_id: ctx.request_id().to_string(),
        client_body: ctx
            .client_raw
            .clone()
            .unwrap_or_else(|| ctx.request.raw.clone()),
    };
    Ok(match tool_loop::run(round, answer).await? {
        tool_loop::LoopAnswer::Json(done) => Answer::Json(done),
        tool_loop::LoopAnswer::Stream {
            status,
            headers,
            events,
        } => Answer::Stream {
            status,
            headers,
            events,
        },
    })
}
