//! `POST /v1/messages` (also `?beta=true`, as Claude Code sends it) and
//! `POST /v1/messages/count_tokens`: Anthropic Messages, managed on the conversation model.
//!
//! **parse → identify → plan → apply → forward → tool loop → respond**
//!
//! - `parse` reads the body (bounded) and parses it, keeping the raw bytes;
//! - `identify` names the conversation: the tenant from the key (`x-api-key` or a bearer
//!   token, a client key or a proxy key), the session from `x-context-session`, Claude Code's
//!   `x-claude-code-session-id` or `metadata.user_id`, else the opening without Claude Code's
//!   attribution line (`identity.rs`);
//! - `plan` puts back the upstream transcript of the proxy's hidden tool rounds in place of the
//!   client's merged assistant message ([`crate::proxy_tools::hidden_rounds`]), counts with the
//!   Messages estimate and lets the pure engine decide ([`crate::context`], `Wire::Messages`);
//! - `apply` writes the decision into the original bytes
//!   ([`crate::context::adapter::messages::write_bytes`]): untouched messages keep their
//!   bytes, breakpoints are never multiplied, thinking signatures are respected (an edit that
//!   would break one leaves the request unmanaged, with the reason in `x-context-actions`);
//!   the proxy's tools go after the client's when a marker names stored content or a hidden
//!   round was put back (never on a model binding thinking to its tools unless the client's
//!   betas allow `drop_block`);
//! - `forward` sends the body with the client's headers (`anthropic-version`,
//!   `anthropic-beta` byte for byte) to the same path: `count_tokens` is asked about the body
//!   the proxy would forward, so the client sizes its own compaction on what is sent;
//! - `tool loop` answers the model's calls of the proxy's tools and asks again, hiding them
//!   ([`crate::routes::tool_loop`] with `loop_wire.rs`, `loop_stream.rs`);
//! - `respond` relays the answer as it arrives, with the context headers.
//!
//! Errors the proxy makes itself are in Anthropic's shape (the router). Not yet on this route:
//! the retry after "prompt is too long", summaries.

pub mod identity;
mod loop_stream;
mod loop_wire;

use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::context::adapter::messages::{binds_thinking, with_drop_block, WriteRules};
use crate::context::adapter::messages_added::with_tools;
use crate::context::adapter::Wire;
use crate::context::markers::Readback;
use crate::context::{Managed, Mode, Route};
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::request_body::{check_json_shape, hold_parsed, read_limited};
use crate::proxy_tools::{NotOffered, Offer};
use crate::routes::chat::ChatRequest;
use crate::routes::shared::Shared;
use crate::routes::tool_loop::{self, Reload};
use crate::upstream::relay::{relay_anthropic, respond_anthropic};

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

    // plan: the proxy's hidden tool rounds put back first (the conversation the model really
    // had), then counted and decided.
    let client_raw = request.raw.clone();
    let mut restored = 0;
    // (count_tokens too: it counts the body /v1/messages would forward.)
    if let Some(identity) = &identity {
        if let Some((bytes, n)) = state
            .context
            .restore_rounds(identity, &request.raw, &request.body)
            .await
        {
            match ChatRequest::parse(bytes) {
                Ok(back) => {
                    request = back;
                    restored = n;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the restored request does not parse: sent as the client sent it")
                }
            }
        }
    }
    let rules = WriteRules {
        binds_thinking: binds_thinking(&model),
        drop_block_allowed: drop_block_allowed(&parts.headers, &request.body),
    };
    let offer = match &identity {
        Some(_) if tools_would_unbind(rules, &request.body) => {
            Offer::NotOffered(NotOffered::ThinkingBound)
        }
        Some(_) => crate::proxy_tools::offer(&request.body, state.context.reload_config()),
        None => Offer::NotOffered(NotOffered::Disabled),
    };
    let (readback, offer_tokens) = match &offer {
        Offer::Tools(names) => (
            Readback::Tools {
                read: names.read.clone(),
                search: names.search.clone(),
            },
            crate::context::estimate::scaled(
                crate::proxy_tools::definitions_tokens(names, crate::context::estimate::ENCODING),
                crate::context::estimate::DEFAULT_FACTOR,
            ),
        ),
        Offer::NotOffered(_) => (Readback::Stored, 0),
    };
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
                readback,
                budget_override: None,
                summarize: false,
                cache: Some(upstream.cache.for_model(&model)),
                reserved_tokens: offer_tokens,
                wire: Wire::Messages,
            },
        )
        .await;
    let refers = plan.refers_to_stored_content();

    // apply
    let mut managed = state
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

    // The proxy's tools, after the client's, when the body names stored content or holds the
    // proxy's calls put back (the API refuses `tool_use` blocks without their tools).
    let reload = match offer {
        Offer::Tools(names) if (refers && managed.body.is_some()) || restored > 0 => {
            let client_had_tools = request
                .body
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            let mut body = managed.body.clone().unwrap_or_else(|| request.raw.clone());
            if rules.binds_thinking && request.body.get("thinking").is_some_and(Value::is_object) {
                // The tools change the prefix every earlier thinking block is bound to: the
                // API drops those blocks instead of refusing the request.
                if let Some(dropping) = with_drop_block(&body, &request.body) {
                    body = dropping.into();
                }
            }
            match with_tools(&body, &crate::proxy_tools::messages_definitions(&names)) {
                Some(bytes) => {
                    crate::proxy_tools::inject_messages(&mut request.body, &names);
                    managed.body = Some(bytes.into());
                    managed.report.tokens_after += offer_tokens;
                    Some(Reload {
                        names,
                        client_had_tools,
                        refs: managed.refs.clone(),
                    })
                }
                None => None,
            }
        }
        _ => None,
    };
    if restored > 0 && managed.body.is_none() {
        managed.body = Some(request.raw.clone());
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

    // tool loop: the model's calls of the proxy's tools answered, hidden from the client
    let rid = request_id.to_str().unwrap_or_default().to_string();
    let looped = match (reload, &identity) {
        (Some(reload), Some(identity))
            if answer.status.is_success() && endpoint == Endpoint::Messages =>
        {
            let round = tool_loop::Round {
                wire: &loop_wire::MessagesLoop,
                state: state.clone(),
                upstream: upstream.clone(),
                identity: identity.clone(),
                reload,
                body: std::mem::take(&mut request.body),
                outgoing,
                model: model.clone(),
                encoding: None,
                stats: Arc::new(tool_loop::LoopStats::default()),
                request_id: rid.clone(),
                client_body: client_raw,
            };
            Ok(tool_loop::run(round, answer).await?)
        }
        _ => Err(answer),
    };

    // respond
    let mut response = match looped {
        Err(answer) => relay_anthropic(answer, &rid),
        Ok(tool_loop::LoopAnswer::Json(done)) => respond_anthropic(
            done.status,
            done.headers,
            futures_util::stream::iter([Ok(done.body)]),
            &rid,
        ),
        Ok(tool_loop::LoopAnswer::Stream {
            status,
            headers,
            events,
        }) => respond_anthropic(status, headers, events, &rid),
    };
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

/// Whether adding the proxy's tools to this request would invalidate thinking blocks the API
/// cannot be asked to drop: the model binds each thinking block to the tools before it, the
/// conversation thinks (its config or its blocks), and the client's betas do not allow
/// `drop_block`.
fn tools_would_unbind(rules: WriteRules, body: &Value) -> bool {
    if !rules.binds_thinking || rules.drop_block_allowed {
        return false;
    }
    let thinking_on = body
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "disabled");
    let has_blocks = body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|m| crate::context::estimate::blocks(m.get("content")).into_owned())
        .any(|b| {
            matches!(
                crate::context::estimate::block_type(&b),
                "thinking" | "redacted_thinking"
            )
        });
    thinking_on || has_blocks
}

/// The context headers of the chat route, the same on this one.
fn context_headers(managed: &Managed) -> Vec<(&'static str, HeaderValue)> {
    crate::routes::chat::context_headers(managed)
}
