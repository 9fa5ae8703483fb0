//! Routing: gives each request an id and a tracing span, sends it to the handler for its path,
//! and turns a [`ProxyError`] into the OpenAI error shape. The one place a request enters.
//!
//! - `POST /v1/chat/completions` → [`crate::chat`], the proxy's own request path;
//! - any other `/v1/…` → [`crate::passthrough`], forwarded verbatim;
//! - `GET /healthz`, `GET /readyz` → answered here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::body::{full, ProxyBody};
use crate::error::ProxyError;
use crate::server::AppState;
use crate::{chat, passthrough};

/// Response header carrying the request id (also on every log line of the request). The
/// upstream's own `x-request-id` is relayed untouched.
pub const REQUEST_ID: &str = "x-context-request-id";

/// Handles one request; never fails (errors become OpenAI-shaped responses).
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<ProxyBody> {
    let id = request_id(&req);
    let span = tracing::info_span!("request", id = %id);
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut response = route(state, req)
        .instrument(span.clone())
        .await
        .unwrap_or_else(ProxyError::into_response);
    span.in_scope(|| {
        tracing::info!(
            %method,
            %path,
            status = response.status().as_u16(),
            headers_ms = started.elapsed().as_secs_f64() * 1e3,
            "response"
        )
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

async fn route(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let path = req.uri().path();
    match path {
        "/healthz" | "/readyz" => {
            if req.method() != Method::GET && req.method() != Method::HEAD {
                return Err(method_not_allowed(&req, "GET"));
            }
            Ok(health(&state, path == "/readyz").await)
        }
        "/metrics" => {
            if req.method() != Method::GET {
                return Err(method_not_allowed(&req, "GET"));
            }
            let mut resp = Response::new(full(state.metrics.render()));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(resp)
        }
        "/v1/chat/completions" if req.method() == Method::POST => chat::handle(state, req).await,
        _ if path.starts_with("/v1/") => passthrough::handle(state, req).await,
        _ => Err(ProxyError::NotFound {
            method: req.method().to_string(),
            path: path.to_string(),
        }),
    }
}

fn method_not_allowed(req: &Request<Incoming>, allowed: &'static str) -> ProxyError {
    ProxyError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        allowed,
    }
}

/// `/healthz`: the process serves. `/readyz`: it serves, is not draining, and its store
/// answers.
async fn health(state: &AppState, readiness: bool) -> Response<ProxyBody> {
    let (status, text) = if !readiness {
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    } else if state.draining.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"draining"}"#.to_string(),
        )
    } else if let Err(e) = state.context.store().ping().await {
        let body = serde_json::json!({"status": "store unavailable", "error": e.to_string()});
        (StatusCode::SERVICE_UNAVAILABLE, body.to_string())
    } else {
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    };
    let mut resp = Response::new(full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The client's `x-context-request-id` when it is short and printable, else a new one.
fn request_id(req: &Request<Incoming>) -> String {
    if let Some(given) = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()) {
        if !given.is_empty() && given.len() <= 128 && given.bytes().all(|b| b.is_ascii_graphic()) {
            return given.to_string();
        }
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static PREFIX: OnceLock<u32> = OnceLock::new();
    let prefix = PREFIX.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
            .unwrap_or(0);
        nanos ^ std::process::id().rotate_left(16)
    });
    format!(
        "req_{prefix:08x}{:010x}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
