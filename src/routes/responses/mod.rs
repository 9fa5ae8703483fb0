//! `POST /v1/responses`, the Responses API (`docs/responses-wire.md`): the managed phases of
//! [`crate::routes::chat`] run with this format — the conversation read by the Responses
//! adapter, sent to the upstream's `/responses`. What is the Responses API's own:
//!
//! - identity: `x-context-session`, else `prompt_cache_key` (Codex sends its thread id), else
//!   the `session-id`, `thread-id` or older `session_id` header;
//! - a request that depends on server-side state (`previous_response_id`, `conversation`,
//!   `item_reference` items) carries only a delta: it goes as it came, and
//!   `x-context-actions` says why; so does a body compressed otherwise than with zstd (a zstd
//!   body, which Codex sends in some setups, is decoded by parse and managed);
//! - the API's overflow error states no limit: the request as sent was too long, and the
//!   retry plans under it;
//! - a WebSocket upgrade (Codex tries one first) is answered `426 Upgrade Required` at once,
//!   so the client falls back to HTTP without retrying.
//!
//! Every other `/v1/responses/…` route is forwarded verbatim by `routes::passthrough`.

mod items;
mod loop_stream;
mod loop_wire;

use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;

use crate::context::adapter::Wire;
use crate::http::body::{full, ProxyBody};
use crate::http::error::ProxyError;
use crate::routes::chat::{self, Format};

mod compaction;

use crate::routes::shared::Shared;
use compaction::{Ask, Next};

/// Headers Codex names its conversation with, in the order they are read.
const SESSION_HEADERS: [&str; 3] = ["session-id", "thread-id", "session_id"];

/// `POST /v1/responses/compact`: answered by the proxy, or forwarded as it came (never
/// managed: the upstream compacts what it is sent).
const COMPACT: Format = Format {
    path: "/responses/compact",
    ..RESPONSES
};

/// The Responses API's format of the managed phases.
pub const RESPONSES: Format = Format {
    name: "responses",
    wire: Wire::Responses,
    path: "/responses",
    session_hint,
    unmanaged_head,
    unmanaged_body,
    implied_limit,
    tool_loop: Some(&loop_wire::ResponsesLoop),
    write_rules: chat::format::serialized,
    anthropic_errors: false,
    exact_count: None,
    remembers_forwarded: false,
};

/// Runs the managed phases for one `POST /v1/responses`.
pub async fn handle(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    run(state, req, request_id, &RESPONSES, Ask::Turn).await
}

/// Runs `POST /v1/responses/compact`: answered by the proxy's summarizer, or forwarded as it
/// came (`compaction.rs`).
pub async fn compact(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    run(state, req, request_id, &COMPACT, Ask::Compact).await
}

async fn run(
    state: Arc<Shared>,
    req: Request<Incoming>,
    request_id: HeaderValue,
    format: &'static Format,
    ask: Ask,
) -> Result<Response<ProxyBody>, ProxyError> {
    let ctx = chat::start(&state, req, request_id, format).await?;
    match compaction::prepare(&state, ctx, ask).await? {
        Next::Answered(response) => Ok(response),
        Next::Forward(ctx) => chat::finish(state, *ctx).await,
    }
}

/// Whether a request on `/v1/responses` asks to become a WebSocket.
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `426 Upgrade Required` for a WebSocket upgrade: the proxy speaks the Responses API over
/// HTTP only, and Codex falls back to HTTP at once on this status (any other costs it five
/// retries).
pub fn websocket_refused() -> Response<ProxyBody> {
    let body = crate::wire::error::openai_error(
        "this proxy serves the Responses API over HTTP only: send POST /v1/responses instead of \
         a WebSocket",
        "invalid_request_error",
        None,
        Some("websocket_not_supported"),
    );
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = StatusCode::UPGRADE_REQUIRED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn session_hint(headers: &HeaderMap, body: &Value) -> Option<String> {
    if let Some(key) = body
        .get("prompt_cache_key")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
    {
        return Some(key.to_owned());
    }
    SESSION_HEADERS.iter().find_map(|name| {
        headers
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    })
}

fn unmanaged_head(headers: &HeaderMap) -> Option<String> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)?
        .to_str()
        .unwrap_or("?");
    (!encoding.eq_ignore_ascii_case("identity"))
        .then(|| format!("body sent with Content-Encoding: {encoding}"))
}

fn unmanaged_body(body: &Value) -> Option<String> {
    if body
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Some("previous_response_id: the conversation is held upstream".into());
    }
    if body.get("conversation").is_some_and(|v| !v.is_null()) {
        return Some("conversation: the conversation is held upstream".into());
    }
    let references = body
        .get("input")
        .and_then(Value::as_array)
        .is_some_and(|items| {
            items
                .iter()
                .any(|i| crate::context::adapter::responses::item_type(i) == Some("item_reference"))
        });
    references.then(|| "item_reference: input refers to items held upstream".into())
}

/// The Responses API's overflow error (`context_length_exceeded`, no limit stated).
fn implied_limit(body: &[u8], sent_tokens: usize) -> Option<usize> {
    let error: Value = serde_json::from_slice(body).ok()?;
    (error["error"]["code"] == "context_length_exceeded" && sent_tokens > 0).then_some(sent_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identity_comes_from_the_cache_key_then_the_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("thread-id", HeaderValue::from_static("t-1"));
        assert_eq!(session_hint(&headers, &json!({})), Some("t-1".into()));
        headers.insert("session-id", HeaderValue::from_static("s-1"));
        assert_eq!(session_hint(&headers, &json!({})), Some("s-1".into()));
        assert_eq!(
            session_hint(&headers, &json!({"prompt_cache_key": "k"})),
            Some("k".into())
        );
        assert_eq!(session_hint(&HeaderMap::new(), &json!({})), None);
    }

    #[test]
    fn server_side_state_and_compression_leave_a_request_unmanaged() {
        assert!(unmanaged_body(&json!({"previous_response_id": "resp_1"})).is_some());
        assert!(unmanaged_body(&json!({"conversation": {"id": "conv_1"}})).is_some());
        assert!(
            unmanaged_body(&json!({"input": [{"type": "item_reference", "id": "msg_1"}]}))
                .is_some()
        );
        assert!(unmanaged_body(
            &json!({"input": [{"role": "user", "content": "x"}], "previous_response_id": null})
        )
        .is_none());
        let mut headers = HeaderMap::new();
        assert!(unmanaged_head(&headers).is_none());
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(unmanaged_head(&headers).unwrap().contains("gzip"));
        let too_long = br#"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#;
        assert_eq!(implied_limit(too_long, 900), Some(900));
        assert_eq!(implied_limit(b"{}", 900), None);
    }
}
