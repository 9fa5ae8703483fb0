//! `POST /v1/messages` (also `?beta=true`, as Claude Code sends it) and
//! `POST /v1/messages/count_tokens`: Anthropic Messages, managed by the phases of
//! [`crate::routes::chat`] with this route's [`Format`]s. What is Anthropic's own:
//!
//! - identity: the tenant from the key (`x-api-key` or a bearer token, a client key or a proxy
//!   key), the session from `x-context-session`, Claude Code's `x-claude-code-session-id` or
//!   `metadata.user_id`, else the opening without Claude Code's attribution line
//!   (`identity.rs`);
//! - counting: the Messages estimate, corrected per session from each answer's usage
//!   ([`crate::context::estimate`]);
//! - writing back: the decision goes into the original bytes
//!   ([`crate::context::adapter::messages::write_bytes`]): untouched messages keep their
//!   bytes, breakpoints are never multiplied, thinking signatures are respected (an edit that
//!   would break one leaves the request unmanaged, with the reason in `x-context-actions`);
//! - forward: the client's headers (`anthropic-version`, `anthropic-beta` byte for byte) to the
//!   same path: `count_tokens` is asked about the body the proxy would forward, so the client
//!   sizes its own compaction on what is sent;
//! - "prompt is too long: N tokens > M maximum" states the limit: learned, and the request is
//!   retried once under it (`routes/chat/overflow.rs`);
//! - errors the proxy makes itself are in Anthropic's shape (the router), also a stream's
//!   final `error` event.
//!
//! - the proxy's own tools: the upstream transcript of its hidden tool rounds put back in place
//!   of the client's merged assistant message before planning
//!   ([`crate::proxy_tools::hidden_rounds`]); its tools written into the bytes after the
//!   client's, never on a model binding thinking to its tools unless the client's betas allow
//!   `drop_block`; the loop's Messages side in `loop_wire.rs` and `loop_stream.rs`
//!   (`count_tokens` gets the same body; no loop runs on its answer).

pub mod identity;
mod loop_stream;
mod loop_wire;

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::context::adapter::messages::{binds_thinking, WriteRules};
use crate::context::adapter::Wire;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::routes::chat::exact::ExactCount;
use crate::routes::chat::{self, format, Format};
use crate::routes::shared::Shared;

/// The beta that lets a request ask the API to drop thinking blocks an edit invalidated.
pub const BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";

/// Which of the two managed paths a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Messages,
    CountTokens,
}

/// `POST /v1/messages`.
pub const MESSAGES: Format = Format {
    name: "messages",
    wire: Wire::Messages,
    path: "/messages",
    session_hint: identity::session_hint,
    unmanaged_head: format::managed_head,
    unmanaged_body: format::managed_body,
    // "prompt is too long: N tokens > M maximum" states its limit: learned, not implied.
    implied_limit: format::no_implied_limit,
    write_rules,
    anthropic_errors: true,
    tool_loop: Some(&loop_wire::MessagesLoop),
    exact_count: Some(&EXACT),
    remembers_forwarded: true,
};

/// `POST /v1/messages/count_tokens`: planned as `/v1/messages` would be, so that the count is
/// the one of the body the proxy would forward.
pub const COUNT_TOKENS: Format = Format {
    name: "count_tokens",
    path: "/messages/count_tokens",
    exact_count: Some(&EXACT_COUNTED),
    remembers_forwarded: false,
    ..MESSAGES
};

/// The exact count of a Messages request: `count_tokens` (free, rate-limited; "an estimate"
/// that "may differ by a small amount", far closer than the proxy's own).
const EXACT: ExactCount = ExactCount {
    path: "/messages/count_tokens",
    body: count_tokens_body,
    tokens: counted_tokens,
    refuses_overflow: true,
    too_long: crate::wire::anthropic::prompt_too_long,
};

/// `count_tokens` itself decides near the budget as `/v1/messages` would, so that it answers
/// the size of what would be forwarded; the overflow is for the request to refuse.
const EXACT_COUNTED: ExactCount = ExactCount {
    refuses_overflow: false,
    ..EXACT
};

/// The fields `count_tokens` takes (Anthropic's API reference): the rest of a Messages
/// request (`max_tokens`, `stream`, `metadata`, sampling) is left out.
const COUNTED_FIELDS: [&str; 9] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
    "output_config",
    "cache_control",
];

/// The `count_tokens` body of a Messages request `body`.
fn count_tokens_body(body: &Value) -> Option<Vec<u8>> {
    let fields = body.as_object()?;
    let counted: serde_json::Map<String, Value> = fields
        .iter()
        .filter(|(k, _)| COUNTED_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    serde_json::to_vec(&counted).ok()
}

/// `input_tokens` of a `count_tokens` answer.
fn counted_tokens(answer: &[u8]) -> Option<usize> {
    let answer: Value = serde_json::from_slice(answer).ok()?;
    usize::try_from(answer.get("input_tokens")?.as_u64()?).ok()
}

/// Runs the managed phases for one request.
pub async fn handle(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
    endpoint: Endpoint,
) -> Result<Response<ProxyBody>, ProxyError> {
    let format = match endpoint {
        Endpoint::Messages => &MESSAGES,
        Endpoint::CountTokens => &COUNT_TOKENS,
    };
    chat::run(state, req, request_id, format).await
}

/// The rules of writing a decision into a Messages request's bytes.
fn write_rules(headers: &HeaderMap, body: &Value) -> Option<WriteRules> {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    Some(WriteRules {
        binds_thinking: binds_thinking(model),
        drop_block_allowed: drop_block_allowed(headers, body),
        // Judged per plan, when the decision is written (`ContextManager::apply_to`).
        repeats_forwarded: false,
    })
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
