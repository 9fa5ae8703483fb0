//! `POST /v1/messages` (also `?beta=true`, as Claude Code sends it) and
//! `POST /v1/messages/count_tokens`: Anthropic Messages, managed on the conversation model.
//!
//! **parse → identify → plan → apply → forward → respond**
//!
//! - `parse` reads the body (bounded) and parses it, keeping the raw bytes;
//! - `identify` names the conversation: the tenant from the key (`x-api-key` or a bearer
//!   token, a client key or a proxy key), the session from `x-context-session`, Claude Code's
//!   `x-claude-code-session-id` or `metadata.user_id`, else the opening without Claude Code's
//!   attribution line (`identity.rs`);
//! - `plan` counts with the Messages estimate and lets the pure engine decide
//!   ([`crate::context`], `Wire::Messages`);
//! - `apply` writes the decision into the original bytes
//!   ([`crate::context::adapter::messages::write_bytes`]): untouched messages keep their
//!   bytes, breakpoints are never multiplied, thinking signatures are respected (an edit that
//!   would break one leaves the request unmanaged, with the reason in `x-context-actions`);
//! - `forward` sends the body with the client's headers (`anthropic-version`,
//!   `anthropic-beta` byte for byte) to the same path: `count_tokens` is asked about the body
//!   the proxy would forward, so the client sizes its own compaction on what is sent;
//! - `respond` relays the answer as it arrives, with the context headers.
//!
//! Errors the proxy makes itself are in Anthropic's shape (the router). Not yet on this route:
//! the proxy's own tools (markers say the content is stored), the retry after "prompt is too
//! long", summaries.

pub mod identity;

use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::context::adapter::messages::{binds_thinking, WriteRules};
use crate::context::adapter::Wire;
use crate::context::{Managed, Mode, Route};
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::request_body::{check_json_shape, hold_parsed, read_limited};
use crate::routes::chat::ChatRequest;
use crate::routes::shared::Shared;
use crate::upstream::relay::relay_anthropic;

/// The beta that lets a request ask the API to drop thinking blocks an edit invalidated.
pub const BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";

/// Which of the two managed paths a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
}

impl Endpoint {
    /// The upstream path (below `/v1`).
    fn path(self) -> &'static str {
        match self {
            Endpoint::Messages => "/messages",
            Endpoint::CountTokens => "/messages/count_tokens",
        }
    }
}

/// Runs the phases for one request.
pub async fn handle(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
    endpoint: Endpoint,
) -> Result<Response<ProxyBody>, ProxyError> {
    // parse
    let (parts, body) = req.into_parts();
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
    let shape = check_json_shape(&raw, limits)?;
    hold_parsed(&state.body_budget, shape)?;
    let mut request = ChatRequest::parse(raw)?;
    let upstream = state.upstreams.route(request.model()).clone();
    crate::auth::authorize(&parts.extensions, request.model(), &upstream.name)?;
    let caller = crate::auth::caller(&parts.extensions).cloned();
    let model = request.model().unwrap_or("").to_string();
    // A body no DOM holds (a lone surrogate escape) is forwarded as it came.
    let mode = if request.body.is_null() {
        Mode::Off
    } else {
        mode
    };

    // identify
    let identity = (mode != Mode::Off)
        .then(|| {
            let tenant = match &caller {
                Some(caller) => caller.tenant.clone(),
                None => crate::store::Tenant::from_api_key(crate::http::headers::api_key(
                    &parts.headers,
                )),
            };
            let hint = identity::session_hint(&parts.headers, &request.body);
            state
                .context
                .identify_wire(Wire::Messages, tenant, hint.as_deref(), &request.body)
        })
        .flatten();

    // plan
    let plan = state
        .context
        .plan(
            identity.as_ref(),
            &mut request.body,
            mode,
            &Route {
                upstream: Some(&upstream.name),
                encoding: None,
                default_window: upstream.context_window,
                readback: crate::context::markers::Readback::Stored,
                budget_override: None,
                summarize: false,
                cache: Some(upstream.cache.for_model(&model)),
                reserved_tokens: 0,
                wire: Wire::Messages,
            },
        )
        .await;

    // apply
    let rules = WriteRules {
        binds_thinking: binds_thinking(&model),
        drop_block_allowed: drop_block_allowed(&parts.headers, &request.body),
    };
    let managed = state
        .context
        .apply_messages(
            identity.as_ref(),
            plan,
            &mut request.body,
            &request.raw,
            rules,
            request_id.to_str().unwrap_or_default(),
        )
        .await;
    if state.store.fail_closed() && managed.fail_open {
        return Err(ProxyError::StoreUnavailable(
            "the removed content could not be stored".into(),
        ));
    }

    // forward
    let body = managed.body.clone().unwrap_or_else(|| request.raw.clone());
    let outgoing = upstream.request(
        Method::POST,
        endpoint.path(),
        parts.uri.query(),
        parts.headers,
        &[
            header::HOST,
            header::CONTENT_LENGTH,
            header::ACCEPT_ENCODING,
        ],
        body,
    );
    let answer = upstream.send(&outgoing).await?;
    if let Some(identity) = &identity {
        if answer.status.is_success() {
            state.context.accepted(&identity.tenant);
        }
    }

    // respond
    let mut response = relay_anthropic(answer, request_id.to_str().unwrap_or_default());
    for (name, value) in context_headers(&managed) {
        response.headers_mut().insert(name, value);
    }
    response
        .extensions_mut()
        .insert(crate::telemetry::metrics::UpstreamName(
            upstream.name.clone(),
        ));
    Ok(response)
}

/// Whether the API may be asked to drop the thinking blocks an edit invalidates: the client's
/// betas include [`BINDING_BETA`], or the request already asks for it.
fn drop_block_allowed(headers: &http::HeaderMap, body: &Value) -> bool {
    let beta = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|b| b.trim() == BINDING_BETA);
    let asked = body
        .get("thinking")
        .and_then(|t| t.get("block_binding"))
        .and_then(|b| b.get("prefix_mismatch_behavior"))
        .and_then(Value::as_str)
        == Some("drop_block");
    beta || asked
}

/// The context headers of the chat route, the same on this one.
fn context_headers(managed: &Managed) -> Vec<(&'static str, HeaderValue)> {
    crate::routes::chat::context_headers(managed)
}
