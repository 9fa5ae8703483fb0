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
use tracing::{Instrument, Level};

use crate::body::{full, ProxyBody};
use crate::error::ProxyError;
use crate::state::AppState;
use crate::{chat, passthrough};

/// Response header carrying the request id (also on every log line of the request). The
/// upstream's own `x-request-id` is relayed untouched.
pub const REQUEST_ID: &str = "x-context-request-id";

/// Handles one request; never fails (errors become OpenAI-shaped responses).
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<ProxyBody> {
    let id = request_id(&req);
    // A header value made of visible ASCII only, so always a `str`.
    let span = tracing::info_span!("request", id = %id.to_str().unwrap_or_default());
    let started = Instant::now();
    // What the per-request line needs, taken only when that line is logged.
    let line =
        tracing::enabled!(Level::INFO).then(|| (req.method().clone(), req.uri().path().to_owned()));
    let metrics_route = crate::metrics::route_of(req.uri().path());
    let in_flight = state.metrics.in_flight();
    let mut response = route(state.clone(), req, id.clone())
        .instrument(span.clone())
        .await
        .unwrap_or_else(ProxyError::into_response);
    drop(in_flight);
    let upstream = response.extensions().get::<crate::metrics::UpstreamName>();
    let (status, elapsed) = (response.status(), started.elapsed());
    state
        .metrics
        .record_request(metrics_route, status, upstream, elapsed);
    if let Some((method, path)) = line {
        span.in_scope(|| {
            tracing::info!(
                %method,
                %path,
                status = response.status().as_u16(),
                headers_ms = started.elapsed().as_secs_f64() * 1e3,
                "response"
            )
        });
    }
    response.headers_mut().insert(REQUEST_ID, id);
    response
}

async fn route(
    state: Arc<AppState>,
    mut req: Request<Incoming>,
    id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    if req.uri().path().starts_with("/v1/") {
        // Who is calling, before anything is stored or sent (crate::auth).
        crate::auth::check(&state, &mut req)?;
    }
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
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            Ok(resp)
        }
        _ if path.starts_with("/v1/context/") => crate::inspect::handle(state, req).await,
        "/v1/chat/completions" if req.method() == Method::POST => {
            chat::handle(state, req, id).await
        }
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
    } else if state.is_draining() {
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

/// The client's `x-context-request-id` when it is short and printable, else a new one
/// (`req_` and 18 hex digits: a per-process prefix, then a counter).
fn request_id(req: &Request<Incoming>) -> HeaderValue {
    if let Some(given) = req.headers().get(REQUEST_ID) {
        let bytes = given.as_bytes();
        if !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(u8::is_ascii_graphic) {
            return given.clone();
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
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = *b"req_000000000000000000";
    hex_into(&mut id[4..12], u64::from(*prefix));
    hex_into(&mut id[12..], count);
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("req_invalid"))
}

/// Writes the low `4 * out.len()` bits of `value` into `out` as lowercase hex digits.
fn hex_into(out: &mut [u8], mut value: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b"0123456789abcdef"[(value & 0xf) as usize];
        value >>= 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digits_are_zero_padded_low_bits() {
        let mut out = [0u8; 10];
        hex_into(&mut out, 0xab);
        assert_eq!(&out, format!("{:010x}", 0xab).as_bytes());
        let mut out = [0u8; 8];
        hex_into(&mut out, 0xdead_beef);
        assert_eq!(&out, b"deadbeef");
        let mut out = [0u8; 4];
        hex_into(&mut out, 0x1_2345);
        assert_eq!(&out, b"2345");
    }
}
