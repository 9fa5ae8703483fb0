//! Routing: gives each request an id and a tracing span, sends it to the handler for its path,
//! and turns a [`ProxyError`] into the OpenAI error shape (Anthropic's on `/v1/messages…`).
//! The one place a request enters.
//!
//! - `POST /v1/chat/completions` → [`crate::routes::chat`], the proxy's own request path;
//! - `POST /v1/responses` → [`crate::routes::responses`], the same phases for the Responses
//!   API; a WebSocket upgrade there → 426;
//! - `POST /v1/messages` (any query) and `POST /v1/messages/count_tokens` →
//!   [`crate::routes::messages`], Anthropic Messages managed;
//! - any other `/v1/…` → [`crate::routes::passthrough`], forwarded verbatim;
//! - `/ui/…` → [`crate::routes::ui`], the page, when `[ui] enabled`;
//! - `GET /healthz`, `GET /readyz` → answered here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tracing::{Instrument, Level};

use crate::auth::{Auth, AuthError};
use crate::http::body::{full, ProxyBody};
use crate::http::error::ProxyError;
use crate::http::headers::api_key;
use crate::http::request_body;
use crate::routes::shared::Shared;
use crate::routes::{chat, messages, passthrough};

/// Response header carrying the request id (also on every log line of the request). The
/// upstream's own `x-request-id` is relayed untouched.
pub use context_proxy_contract::REQUEST_ID_HEADER as REQUEST_ID;

/// Handles one request; never fails (errors become OpenAI-shaped responses).
pub async fn handle(state: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let id = request_id(&req);
    // A header value made of visible ASCII only, so always a `str`.
    let span = tracing::info_span!("request", id = %id.to_str().unwrap_or_default());
    let started = Instant::now();
    // What the per-request line needs, taken only when that line is logged.
    let line =
        tracing::enabled!(Level::INFO).then(|| (req.method().clone(), req.uri().path().to_owned()));
    // Logs the request as cancelled if the client leaves before its response head.
    let mut cancelled = Cancelled {
        span: span.clone(),
        started,
        line: line.clone(),
    };
    let metrics_route = crate::telemetry::metrics::route_of(req.uri().path());
    let http1 = req.version() <= http::Version::HTTP_11;
    let in_flight = state.metrics.in_flight();
    // Anthropic's clients read errors in Anthropic's shape.
    let anthropic = is_messages_path(req.uri().path());
    let mut response = request_body::holding_bodies(route(state.clone(), req, id.clone()))
        .instrument(span.clone())
        .await
        .unwrap_or_else(|e| {
            if anthropic {
                e.into_anthropic_response(id.to_str().unwrap_or_default())
            } else {
                e.into_response()
            }
        });
    cancelled.line = None;
    drop(in_flight);
    let upstream = response
        .extensions()
        .get::<crate::telemetry::metrics::UpstreamName>();
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
    if http1 {
        // How long an idle keep-alive connection stays open (HTTP/1 only: HTTP/2 forbids the
        // header), so that clients with longer pools do not reuse it as it closes.
        let idle_secs = state.idle_timeout.as_secs();
        if idle_secs > 0 && !response.headers().contains_key(http::header::CONNECTION) {
            response.headers_mut().insert(
                http::header::HeaderName::from_static("keep-alive"),
                HeaderValue::from_str(&format!("timeout={idle_secs}"))
                    .unwrap_or_else(|_| HeaderValue::from_static("timeout=1")),
            );
        }
    }
    response
}

/// Logs a request whose handling was dropped (the client left before its response head); its
/// `line` is taken once the response is ready.
struct Cancelled {
    span: tracing::Span,
    started: Instant,
    line: Option<(Method, String)>,
}

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some((method, path)) = &self.line {
            self.span.in_scope(|| {
                tracing::info!(
                    %method,
                    %path,
                    status = "cancelled",
                    duration_ms = self.started.elapsed().as_secs_f64() * 1e3,
                    "response"
                )
            });
        }
    }
}

async fn route(
    state: Arc<Shared>,
    mut req: Request<Incoming>,
    id: HeaderValue,
) -> Result<Response<ProxyBody>, ProxyError> {
    confine_path(&mut req)?;
    if req.uri().path().starts_with("/v1/") {
        // Who is calling, before anything is stored or sent (crate::auth).
        authenticate(&state.auth, &mut req)?;
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
                HeaderValue::from_static(crate::telemetry::metrics::CONTENT_TYPE),
            );
            Ok(resp)
        }
        _ if path == "/ui" || path.starts_with("/ui/") => match state.ui {
            Some(_) => Ok(crate::routes::ui::handle(state, req).await),
            None => Err(ProxyError::NotFound {
                method: req.method().to_string(),
                path: path.to_string(),
            }),
        },
        _ if path.starts_with("/v1/context/") => {
            crate::routes::context_api::handle(state, req).await
        }
        "/v1/responses" if crate::routes::responses::is_websocket_upgrade(req.headers()) => {
            Ok(crate::routes::responses::websocket_refused())
        }
        "/v1/responses/compact" if req.method() == Method::POST => {
            crate::routes::responses::compact(state, req, id).await
        }
        "/v1/responses" if req.method() == Method::POST => {
            crate::routes::responses::handle(state, req, id).await
        }
        "/v1/chat/completions" if req.method() == Method::POST => {
            chat::handle(state, req, id).await
        }
        "/v1/messages" if req.method() == Method::POST => {
            messages::handle(state, req, id, messages::Endpoint::Messages).await
        }
        "/v1/messages/count_tokens" if req.method() == Method::POST => {
            messages::handle(state, req, id, messages::Endpoint::CountTokens).await
        }
        _ if path.starts_with("/v1/") => passthrough::handle(state, req).await,
        _ => Err(ProxyError::NotFound {
            method: req.method().to_string(),
            path: path.to_string(),
        }),
    }
}

/// Whether `path` is one of Anthropic's Messages routes (`/v1/messages`, `/v1/messages/…`),
/// whose errors are in Anthropic's shape.
pub fn is_messages_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Resolves the dot segments of the request's path (`.`, `..`, and their percent-encoded forms
/// `%2e`, which the upstream's URL parser would resolve too; `\` counts as `/`, as it does
/// there) before anything routes on it. A path that then leaves `/v1/` is refused: it would
/// reach another path of the upstream's host, with the proxy's own upstream key when it has
/// one. A path inside `/v1/` is replaced by its resolved form.
fn confine_path(req: &mut Request<Incoming>) -> Result<(), ProxyError> {
    let path = req.uri().path();
    // The proxy's own /v1/context/ routes are never forwarded, and a session's name (kept as
    // the client gave it) may hold a `/`, written `%2F` in the path.
    if !path.starts_with("/v1/context/") && hides_a_separator(path) {
        return Err(ProxyError::InvalidPath {
            path: path.to_string(),
        });
    }
    let Some(resolved) = resolve_dot_segments(path) else {
        return Ok(());
    };
    if !resolved.starts_with("/v1/") {
        return Err(ProxyError::InvalidPath {
            path: path.to_string(),
        });
    }
    let path_and_query = match req.uri().query() {
        Some(query) => format!("{resolved}?{query}"),
        None => resolved,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::try_from(path_and_query).map_err(
        |_| ProxyError::InvalidPath {
            path: path.to_string(),
        },
    )?);
    *req.uri_mut() = http::Uri::from_parts(parts).map_err(|_| ProxyError::InvalidPath {
        path: path.to_string(),
    })?;
    Ok(())
}

/// Percent-decoding passes looked through: a path escaped more deeply than this is refused.
const DECODING_DEPTH: usize = 4;

/// Whether `path` hides a separator or a dot segment behind percent-encoding, at any depth an
/// intermediary might decode it to (`%2F`, `%5C`, `%2e%2e`, and double encodings such as
/// `%252F`), or holds a backslash at all. An nginx in front of the upstream decodes and
/// resolves such a path, which then reaches other locations of that host carrying the proxy's
/// upstream key; Envoy's `path_with_escaped_slashes_action: REJECT_REQUEST` refuses them the
/// same way. Literal dot segments are not this function's business ([`resolve_dot_segments`]).
fn hides_a_separator(path: &str) -> bool {
    if path.contains('\\') {
        return true;
    }
    let slashes = path.bytes().filter(|&b| b == b'/').count();
    let mut current = std::borrow::Cow::Borrowed(path);
    for _ in 0..DECODING_DEPTH {
        let decoded = percent_decode(&current);
        if decoded == current {
            return false;
        }
        let is_dot = |s: &str| s == "." || s == "..";
        if decoded.contains('\\')
            || decoded.bytes().filter(|&b| b == b'/').count() > slashes
            || decoded.split('/').any(is_dot)
        {
            return true;
        }
        current = std::borrow::Cow::Owned(decoded);
    }
    // Still encoded after that many passes: nothing legitimate is.
    current.contains('%')
}

/// `text` with every `%XX` escape decoded once (bytes that do not form UTF-8 are replaced;
/// a `%` not followed by two hex digits stays).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with its dot segments resolved (RFC 3986 §5.2.4, with `%2e` as a dot and `\` as a
/// separator, like the WHATWG URL parser the upstream client uses), or `None` when it has none.
/// A `..` above the root resolves to the root's `""`, so the result does not start with `/v1/`.
fn resolve_dot_segments(path: &str) -> Option<String> {
    let is_dot = |s: &str| s == "." || s.eq_ignore_ascii_case("%2e");
    let is_dot_dot = |s: &str| {
        s == ".."
            || [".%2e", "%2e.", "%2e%2e"]
                .iter()
                .any(|d| s.eq_ignore_ascii_case(d))
    };
    let segments: Vec<&str> = path.split(['/', '\\']).skip(1).collect();
    if !path.contains('\\') && !segments.iter().any(|s| is_dot(s) || is_dot_dot(s)) {
        return None;
    }
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    let mut escaped = false;
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        if is_dot_dot(segment) {
            escaped |= out.pop().is_none();
        } else if !is_dot(segment) {
            out.push(segment);
            continue;
        }
        if last {
            // `/a/..` is the directory `/`: keep the trailing slash.
            out.push("");
        }
    }
    if escaped {
        return Some(String::new());
    }
    Some(format!("/{}", out.join("/")))
}

fn method_not_allowed(req: &Request<Incoming>, allowed: &'static str) -> ProxyError {
    ProxyError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        allowed,
    }
}

/// `/healthz`: the process serves. `/readyz`: it serves, is not draining, and its store
/// answers (the fs store: a real write succeeds, so a full disk is reported).
async fn health(state: &Shared, readiness: bool) -> Response<ProxyBody> {
    let (status, text) = if !readiness {
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    } else if state.is_draining() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"draining"}"#.to_string(),
        )
    } else if let Err(e) = state.context.store().ping().await {
        // Degraded: requests are still served (per store.on_error), but nothing can be stored.
        // Why goes to the log: the answer is public, the store's paths and errors are not.
        tracing::warn!(error = %e, "readiness: the store is degraded");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"status":"degraded"}"#.to_string(),
        )
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

/// Longest client-supplied request id kept.
const MAX_REQUEST_ID_LEN: usize = 64;

/// The client's `x-context-request-id` when it is 1 to [`MAX_REQUEST_ID_LEN`] characters of
/// `A-Z a-z 0-9 - _ . :` (it goes into every log line of the request), else a new one (`req_`
/// and 18 hex digits: a per-process prefix, then a counter).
fn request_id(req: &Request<Incoming>) -> HeaderValue {
    if let Some(given) = req.headers().get(REQUEST_ID) {
        let bytes = given.as_bytes();
        let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
        if !bytes.is_empty() && bytes.len() <= MAX_REQUEST_ID_LEN && bytes.iter().all(allowed) {
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

/// Who calls a `/v1/…` request (`crate::auth`): finds the [`Caller`] (401 or 429 otherwise) and
/// leaves it in the request's extensions for the route. The admin token counts only on the
/// proxy's own `/v1/context/…` routes.
fn authenticate<B>(auth: &Auth, req: &mut Request<B>) -> Result<(), AuthError> {
    let admin_route = req.uri().path().starts_with("/v1/context/");
    let caller = auth.authenticate(api_key(req.headers()), admin_route)?;
    if caller.key.is_some() || caller.admin {
        // The proxy's own credentials go no further: an upstream with a key sends its own, and
        // one without gets none (it never sees a proxy key).
        req.headers_mut().remove(http::header::AUTHORIZATION);
        req.headers_mut().remove("api-key");
    }
    req.extensions_mut().insert(caller);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_resolved_like_the_upstream_client_does() {
        let resolve = |p: &str| resolve_dot_segments(p);
        assert_eq!(resolve("/v1/models"), None);
        assert_eq!(
            resolve("/v1/files/../models").as_deref(),
            Some("/v1/models")
        );
        assert_eq!(resolve("/v1/./models").as_deref(), Some("/v1/models"));
        assert_eq!(resolve("/v1/../../x").as_deref(), Some(""));
        assert_eq!(resolve("/v1/%2e%2E/x").as_deref(), Some("/x"));
        assert_eq!(resolve("/v1/..").as_deref(), Some("/"));
        assert_eq!(resolve("/v1/a\\..\\b").as_deref(), Some("/v1/b"));
        assert_eq!(resolve("/v1/a/%2e").as_deref(), Some("/v1/a/"));
        // What the upstream client (the `url` crate) would make of the same path: the same
        // path, or (above the root, where it stops at `/`) also a path outside `/v1/`.
        for path in [
            "/v1/../../x",
            "/v1/%2e%2E/x",
            "/v1/files/../models",
            "/v1/a\\..\\b",
        ] {
            let url = reqwest::Url::parse(&format!("http://h{path}")).unwrap();
            match resolve(path).unwrap().as_str() {
                "" => assert!(!url.path().starts_with("/v1/"), "{path}"),
                ours => assert_eq!(url.path(), ours, "{path}"),
            }
        }
    }

    #[test]
    fn escaped_separators_and_dot_segments_are_found_at_any_depth() {
        for path in [
            "/v1/models/..%2F..%2F..%2Fadmin",
            "/v1/models/..%2f..%2fadmin",
            "/v1/models/%2e%2e/admin",
            "/v1/files/%2E%2e/models",
            "/v1/models/..%5Cadmin",
            "/v1/models/%5c",
            "/v1/models/..%252F..%252Fadmin",
            "/v1/models/%252e%252e/admin",
            "/v1/models/%25252e%25252e/admin",
            "/v1/models/%2525252525252e",
            "/v1/a\\b",
            "/v1/models/%2e",
        ] {
            assert!(hides_a_separator(path), "{path}");
        }
        for path in [
            "/v1/models",
            "/v1/files/file%20name.txt",
            "/v1/files/a%2eb",
            "/v1/models/ft%3Agpt-4o%3Aacme",
            "/v1/files/100%",
            "/v1/files/%zz",
            "/v1/files/../models",
        ] {
            assert!(!hides_a_separator(path), "{path}");
        }
    }

    /// Decodes `path` until it no longer changes (bounded), as a chain of intermediaries might.
    fn decoded_fully(path: &str) -> String {
        let mut current = path.to_string();
        for _ in 0..16 {
            let next = percent_decode(&current);
            if next == current {
                break;
            }
            current = next;
        }
        current
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// Whatever path a client sends, what the proxy accepts stays inside `/v1/` for the
        /// upstream's URL parser and for an intermediary that decodes it entirely and then
        /// resolves its dot segments (with `\` as a separator too).
        #[test]
        fn an_accepted_path_stays_inside_v1_however_it_is_decoded(
            pieces in proptest::collection::vec(proptest::sample::select(vec![
                "/", "v1", "models", "..", ".", "%2e", "%2E", "%2f", "%2F", "%5c", "%5C",
                "%25", "2e", "2f", "5c", "%", "\\", "a", "%20", "%2", "e",
            ]), 0..14)
        ) {
            let path = format!("/v1/{}", pieces.concat());
            let Ok(uri) = path.parse::<http::Uri>() else { return Ok(()); };
            let path = uri.path();
            if hides_a_separator(path) {
                return Ok(());
            }
            let resolved = resolve_dot_segments(path).unwrap_or_else(|| path.to_string());
            if !resolved.starts_with("/v1/") {
                return Ok(());
            }
            let url = reqwest::Url::parse(&format!("http://h{resolved}")).unwrap();
            proptest::prop_assert!(url.path().starts_with("/v1/"), "{} -> {}", path, url.path());
            let decoded = decoded_fully(&resolved);
            let again = resolve_dot_segments(&decoded).unwrap_or(decoded.clone());
            proptest::prop_assert!(again.starts_with("/v1/"), "{} -> {} -> {}", path, decoded, again);
        }
    }

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
