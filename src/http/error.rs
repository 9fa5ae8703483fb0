//! The errors a client can see, and the one place they become HTTP responses in the OpenAI
//! error shape `{"error":{"message","type","param","code"}}`.
//!
//! An upstream's own error response is not a `ProxyError`: it is relayed unchanged.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::json;

use crate::http::body::{full, ProxyBody};
use crate::upstream::UpstreamError;

/// Why the proxy itself could not answer a request.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("request body is larger than the limit of {limit} bytes (server.max_body_bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the request body holds more than {limit} JSON values (server.max_json_elements)")]
    JsonTooLarge { limit: usize },
    #[error("the request body nests arrays and objects deeper than {limit} levels (server.max_json_depth)")]
    JsonTooDeep { limit: usize },
    #[error("the proxy holds as many request bodies as it may (server.max_body_bytes_in_flight = {budget} bytes): retry shortly")]
    Overloaded { budget: usize },
    #[error("the request body did not arrive in time: it must arrive within {timeout_ms} ms plus its size at {min_rate} bytes per second (server.body_read_timeout_ms, server.body_min_bytes_per_sec)")]
    BodyTimeout { timeout_ms: u64, min_rate: u64 },
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("the path {path:?} leaves /v1/ once its dot segments are resolved, or hides a '/', a '\\' or a dot segment behind percent-encoding (%2F, %5C, %2E%2E, or these encoded again): this proxy only forwards plain /v1/* paths")]
    InvalidPath { path: String },
    #[error("no route for {method} {path}: this proxy serves /v1/* (OpenAI-compatible API), /healthz and /readyz")]
    NotFound { method: String, path: String },
    #[error("method {method} is not allowed on {path}; use {allowed}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allowed: &'static str,
    },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The model kept calling the proxy's own tools after `[context.reload] max_rounds` rounds,
    /// when they were no longer offered, and its answer holds nothing else.
    #[error("the model kept calling the proxy's context tools after {rounds} rounds of them ([context.reload] max_rounds) and its last answer holds no text and no call of the client's tools; the proxy does not ask the upstream again. Retry, or raise max_rounds")]
    ToolLoopExhausted { rounds: usize },
    #[error("the context store is unavailable ({0}) and store.on_error = \"closed\": the request was not forwarded; retry later")]
    StoreUnavailable(String),
    /// The caller's key is missing, unknown, not allowed this model, or over its budget.
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    /// A `/v1/context/…` request about a session or reference that cannot be answered.
    #[error(transparent)]
    Inspect(#[from] crate::sessions::InspectError),
}

impl ProxyError {
    /// The HTTP status, OpenAI error `type` and `code` of this error.
    pub fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        use ProxyError::*;
        match self {
            InvalidJson(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_json"),
            ),
            InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
            ),
            JsonTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
            ),
            JsonTooDeep { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("json_too_deep"),
            ),
            Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("overloaded"),
            ),
            BodyTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("body_read_timeout"),
            ),
            BodyRead(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("body_read_error"),
            ),
            InvalidPath { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_path"),
            ),
            NotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("unknown_url"),
            ),
            MethodNotAllowed { .. } => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                Some("method_not_allowed"),
            ),
            Upstream(UpstreamError::Unreachable { .. }) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("upstream_unreachable"),
            ),
            ToolLoopExhausted { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("tool_loop_exhausted"),
            ),
            StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("store_unavailable"),
            ),
            Upstream(UpstreamError::Timeout { .. }) => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                Some("upstream_timeout"),
            ),
            Auth(e) => e.classify(),
            Inspect(e) => e.classify(),
        }
    }

    /// The `param` the error is about, when there is one.
    fn param(&self) -> Option<&'static str> {
        match self {
            ProxyError::InvalidJson(_) => Some("body"),
            _ => None,
        }
    }

    /// The error in the OpenAI shape, `{"error":{"message","type","param","code"}}` (also the
    /// data of a final SSE event when a stream had already begun).
    pub fn to_json(&self) -> serde_json::Value {
        let (_, kind, code) = self.classify();
        json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": self.param(),
                "code": code,
            }
        })
    }

    /// The JSON body in the OpenAI error shape.
    pub fn body(&self) -> Bytes {
        Bytes::from(self.to_json().to_string())
    }

    /// The whole HTTP response.
    pub fn into_response(self) -> http::Response<ProxyBody> {
        let (status, _, _) = self.classify();
        let mut resp = http::Response::new(full(self.body()));
        *resp.status_mut() = status;
        if matches!(self, ProxyError::Overloaded { .. }) {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let ProxyError::Auth(e) = &self {
            if let Some(secs) = e.retry_after() {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
        }
        resp
    }
}

/// Describes a JSON syntax error with what is wrong and where (line, column, byte offset and
/// the text around it), so that a person can find it.
pub fn describe_json_error(body: &[u8], err: &serde_json::Error) -> String {
    let (line, column) = (err.line(), err.column());
    let offset = byte_offset(body, line, column);
    let start = offset.saturating_sub(20);
    let end = (offset + 20).min(body.len());
    let near = String::from_utf8_lossy(&body[start..end]).replace('\n', "\\n");
    let what = err.to_string();
    let what = what.split(" at line ").next().unwrap_or(&what);
    format!(
        "the request body is not valid JSON: {what} at line {line}, column {column} (byte {offset}), near `{near}`"
    )
}

fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let mut current = 1;
    let mut line_start = 0;
    for (i, b) in body.iter().enumerate() {
        if current == line {
            break;
        }
        if *b == b'\n' {
            current += 1;
            line_start = i + 1;
        }
    }
    (line_start + column.saturating_sub(1)).min(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_the_four_keys() {
        let errs = [
            ProxyError::InvalidJson("x".into()),
            ProxyError::BodyTooLarge { limit: 1 },
            ProxyError::Upstream(UpstreamError::Timeout {
                upstream: "u".into(),
                timeout_ms: 1,
            }),
            ProxyError::Upstream(UpstreamError::Unreachable {
                upstream: "u".into(),
                detail: "connection refused".into(),
            }),
        ];
        for e in errs {
            let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
            let obj = v["error"].as_object().unwrap();
            for key in ["message", "type", "param", "code"] {
                assert!(obj.contains_key(key), "{key} missing in {v}");
            }
            assert!(!obj["message"].as_str().unwrap().is_empty());
        }
    }

    #[test]
    fn json_error_says_where() {
        let body = b"{\n  \"model\": \"gpt-4o\",\n  \"messages\": [}\n";
        let err = serde_json::from_slice::<serde_json::Value>(body).unwrap_err();
        let msg = describe_json_error(body, &err);
        assert!(msg.contains("line 3"), "{msg}");
        assert!(msg.contains("near `"), "{msg}");
    }

    #[test]
    fn json_error_on_empty_and_binary_bodies_does_not_panic() {
        for body in [&b""[..], &[0xff, 0xfe, 0x00][..], &b"\n\n\n"[..]] {
            let err = serde_json::from_slice::<serde_json::Value>(body).unwrap_err();
            let msg = describe_json_error(body, &err);
            assert!(msg.starts_with("the request body is not valid JSON"));
        }
    }
}
