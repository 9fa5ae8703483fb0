//! `POST /v1/chat/completions`: the proxy's own request path, as a short list of phases over
//! one request (see DESIGN.md): parse → route → manage (identify, plan, apply: see
//! [`crate::context`]) → forward → respond.
//!
//! Until a phase changes the request, the original bytes are forwarded as they came, so a
//! request that needs no change reaches the upstream byte-identical.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::body::ProxyBody;
use crate::context::{Managed, ACTIONS_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER};
use crate::error::{describe_json_error, ProxyError};
use crate::metrics::{Metrics, UsageProbe};
use crate::relay::{relay, relay_observed};
use crate::request_body::read_limited;
use crate::server::AppState;
use crate::upstream::Outgoing;

/// A parsed chat-completions request. `raw` is what the client sent; `body` the same as JSON,
/// keys in their original order.
pub struct ChatRequest {
    pub raw: Bytes,
    pub body: Value,
}

impl ChatRequest {
    /// Parses `raw`: it must be a JSON object. Everything else is the upstream's to judge.
    pub fn parse(raw: Bytes) -> Result<ChatRequest, ProxyError> {
        let body: Value = serde_json::from_slice(&raw)
            .map_err(|e| ProxyError::InvalidJson(describe_json_error(&raw, &e)))?;
        if !body.is_object() {
            return Err(ProxyError::InvalidRequest(format!(
                "the request body must be a JSON object with \"model\" and \"messages\", not {}",
                json_kind(&body)
            )));
        }
        Ok(ChatRequest { raw, body })
    }

    /// The `model` field, when it is a string.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Runs the phases for one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = req.into_parts();

    // parse
    let raw = read_limited(body, &parts.headers, state.config.server.max_body_bytes).await?;
    let mut request = ChatRequest::parse(raw)?;
    let mode = state
        .context
        .mode(&parts.headers)
        .map_err(ProxyError::InvalidRequest)?;

    // route
    let upstream = state.upstreams.route(request.model());
    tracing::debug!(upstream = %upstream.name, model = request.model().unwrap_or(""), "routed");

    // manage: identify, plan, apply
    let managed = state
        .context
        .manage(&parts.headers, &mut request.body, mode, upstream.encoding)
        .await;
    let outgoing = managed.body.clone().unwrap_or(request.raw);
    record(&state.metrics, &managed);

    // forward
    let incoming = upstream
        .send(Outgoing {
            method: Method::POST,
            path: "/chat/completions",
            query: parts.uri.query(),
            headers: parts.headers,
            // Content-Length follows the body we send. Accept-Encoding is left out so the answer
            // comes uncompressed and the proxy can read its usage as it streams past.
            drop_headers: &[
                header::HOST,
                header::CONTENT_LENGTH,
                header::ACCEPT_ENCODING,
            ],
            body: outgoing.into(),
        })
        .await?;

    // learned-limit hook: a 400/413 may be the upstream saying the context is too long and
    // stating its real limit. Read that small error body, learn from it, and relay the same
    // bytes to the client unchanged (see `learn_from_error`).
    if matches!(incoming.status.as_u16(), 400 | 413) && error_body_is_small(&incoming) {
        let model = request
            .body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut response = learn_from_error(&state, &upstream.name, model, incoming).await;
        context_headers(response.headers_mut(), &managed);
        return Ok(response);
    }

    // respond; when the request was counted, read the upstream's usage.prompt_tokens as it
    // passes, to compare with our count.
    let mut response = if managed.counted {
        let counted = managed.report.tokens_after;
        let mut probe = UsageProbe::default();
        let usage_state = state.clone();
        relay_observed(incoming, move |chunk| {
            if probe.prompt_tokens().is_none() {
                probe.feed(chunk);
                if let Some(billed) = probe.prompt_tokens() {
                    usage_state.metrics.record_usage(counted, billed);
                }
            }
        })
    } else {
        relay(incoming)
    };
    context_headers(response.headers_mut(), &managed);
    Ok(response)
}

// learned-limit hook: the error bodies read whole are at most this long (and say so in
// Content-Length); anything else is relayed as a stream.
const MAX_ERROR_BODY: u64 = 64 * 1024;

// learned-limit hook.
fn error_body_is_small(incoming: &crate::upstream::Incoming) -> bool {
    incoming
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n <= MAX_ERROR_BODY)
}

// learned-limit hook: reads the upstream's error body, lets context management learn the
// limit it states (if any), and answers with the same status, headers and bytes.
async fn learn_from_error(
    state: &AppState,
    upstream: &str,
    model: &str,
    incoming: crate::upstream::Incoming,
) -> Response<ProxyBody> {
    use futures_util::StreamExt;
    let status = incoming.status;
    let mut headers = incoming.headers.clone();
    // hyper sets it again from the body read (which a cut-short upstream makes shorter).
    headers.remove(header::CONTENT_LENGTH);
    let mut body = Vec::new();
    let mut chunks = std::pin::pin!(incoming.into_stream());
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(bytes) => body.extend_from_slice(&bytes),
            Err(e) => {
                tracing::warn!(error = %e, "upstream error body cut short");
                break;
            }
        }
    }
    state
        .context
        .learn_from_upstream_error(upstream, model, status.as_u16(), &body)
        .await;
    let mut response = Response::new(crate::body::full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Counts what context management did.
fn record(metrics: &Metrics, managed: &Managed) {
    let add = |c: &std::sync::atomic::AtomicU64, n: usize| c.fetch_add(n as u64, Ordering::Relaxed);
    add(&metrics.chat_requests, 1);
    add(&metrics.tokens_before, managed.report.tokens_before);
    add(&metrics.tokens_after, managed.report.tokens_after);
    if managed.body.is_some() {
        add(&metrics.context_rewritten, 1);
    }
    if managed.fail_open {
        add(&metrics.context_fail_open, 1);
    }
    if managed
        .report
        .skipped
        .as_deref()
        .is_some_and(|s| s.starts_with("malformed"))
    {
        add(&metrics.context_malformed, 1);
    }
}

/// `x-context-tokens-before`, `x-context-tokens-after` (when counted) and `x-context-actions`.
fn context_headers(headers: &mut http::HeaderMap, managed: &Managed) {
    let report = &managed.report;
    if !managed.counted {
        headers.insert(ACTIONS_HEADER, http::HeaderValue::from_static("off"));
        return;
    }
    let pairs = [
        (TOKENS_BEFORE_HEADER, report.tokens_before.to_string()),
        (TOKENS_AFTER_HEADER, report.tokens_after.to_string()),
        (ACTIONS_HEADER, report.actions()),
    ];
    for (name, value) in pairs {
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_raw_bytes_and_key_order() {
        let raw = Bytes::from_static(br#"{"z":1,"model":"m","a":{"y":2,"b":3}}"#);
        let req = ChatRequest::parse(raw.clone()).unwrap();
        assert_eq!(req.raw, raw);
        assert_eq!(
            serde_json::to_string(&req.body).unwrap(),
            std::str::from_utf8(&raw).unwrap()
        );
        assert_eq!(req.model(), Some("m"));
    }

    #[test]
    fn non_object_body_is_a_clear_400() {
        let err = ChatRequest::parse(Bytes::from_static(b"[1,2]"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("not an array"), "{err}");
        assert_eq!(err.classify().0, http::StatusCode::BAD_REQUEST);
    }
}
