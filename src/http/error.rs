//! The errors a client can see, and the one place they become HTTP responses in the OpenAI
//! error shape (`crate::wire::error`), or in Anthropic's on its Messages routes
//! (`crate::wire::anthropic`).
//!
//! [`ClientError`] is what a part of the proxy implements for its own error type to say how a
//! client sees it (the upstreams, the body reader, auth, inspection): this module imports none
//! of them. [`ProxyError`] is the error of a request's handling: its own few cases, or any
//! [`ClientError`] (`?` converts one).
//!
//! An upstream's own error response is not a `ProxyError`: it is relayed unchanged.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use crate::http::body::{full, ProxyBody};
use crate::wire::anthropic;
use crate::wire::error::openai_error;

/// An error a client sees, with the status and OpenAI error `type` and `code` it is answered
/// with.
pub trait ClientError: std::error::Error + Send + Sync + 'static {
    /// The HTTP status, OpenAI error `type` and `code`.
    fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>);

    /// The `param` the error is about, when there is one.
    fn param(&self) -> Option<&'static str> {
        None
    }

    /// Seconds to send in `Retry-After`, when retrying later can help.
    fn retry_after(&self) -> Option<u64> {
        None
    }
}

/// Why the proxy itself could not answer a request.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidRequest(String),
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
    /// The model kept calling the proxy's own tools after `[context.reload] max_rounds` rounds,
    /// when they were no longer offered, and its answer holds nothing else.
    #[error("the model kept calling the proxy's context tools after {rounds} rounds of them ([context.reload] max_rounds) and its last answer holds no text and no call of the client's tools; the proxy does not ask the upstream again. Retry, or raise max_rounds")]
    ToolLoopExhausted { rounds: usize },
    #[error("the context store is unavailable ({0}) and store.on_error = \"closed\": the request was not forwarded; retry later")]
    StoreUnavailable(String),
    /// On a model binding thinking to its prefix, what the conversation forwarded before
    /// cannot be read from the store, and earlier requests may have been edited: sent as the
    /// client has it, the upstream would refuse the request (the message says what to do).
    #[error("{0}")]
    BoundRecordUnavailable(String),
    /// The error of a part of the proxy (an upstream, the body reader, auth, inspection),
    /// which says itself how the client sees it.
    #[error("{0}")]
    Client(Box<dyn ClientError>),
}

impl<E: ClientError> From<E> for ProxyError {
    fn from(e: E) -> ProxyError {
        ProxyError::Client(Box::new(e))
    }
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
            ToolLoopExhausted { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("tool_loop_exhausted"),
            ),
            StoreUnavailable(_) | BoundRecordUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("store_unavailable"),
            ),
            Client(e) => e.classify(),
        }
    }

    /// The `param` the error is about, when there is one.
    fn param(&self) -> Option<&'static str> {
        match self {
            ProxyError::InvalidJson(_) => Some("body"),
            ProxyError::Client(e) => e.param(),
            _ => None,
        }
    }

    /// The error in the OpenAI shape, `{"error":{"message","type","param","code"}}` (also the
    /// data of a final SSE event when a stream had already begun).
    pub fn to_json(&self) -> serde_json::Value {
        let (_, kind, code) = self.classify();
        openai_error(&self.to_string(), kind, self.param(), code)
    }

    /// The JSON body in the OpenAI error shape.
    pub fn body(&self) -> Bytes {
        Bytes::from(self.to_json().to_string())
    }

    /// The whole HTTP response.
    pub fn into_response(self) -> http::Response<ProxyBody> {
        let body = self.body();
        self.response_with(body)
    }

    /// The whole HTTP response in Anthropic's error shape (its Messages routes), the error type
    /// following the status.
    pub fn into_anthropic_response(self, request_id: &str) -> http::Response<ProxyBody> {
        let (status, _, _) = self.classify();
        let body = anthropic::error_body(status.as_u16(), &self.to_string(), request_id);
        self.response_with(Bytes::from(body.to_string()))
    }

    fn response_with(self, body: Bytes) -> http::Response<ProxyBody> {
        let (status, _, _) = self.classify();
        let mut resp = http::Response::new(full(body));
        *resp.status_mut() = status;
        if let ProxyError::Client(e) = &self {
            if let Some(secs) = e.retry_after() {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
        }
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
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

    #[tokio::test]
    async fn on_messages_routes_errors_take_anthropics_shape() {
        use http_body_util::BodyExt;
        let resp = ProxyError::InvalidRequest("bad mode".into()).into_anthropic_response("req-1");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad mode"}, "request_id": "req-1"})
        );
    }

    #[test]
    fn every_error_has_the_four_keys() {
        /// A part's own error, seen through the trait.
        #[derive(Debug, thiserror::Error)]
        #[error("a part failed")]
        struct Part;
        impl ClientError for Part {
            fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
                (StatusCode::BAD_GATEWAY, "upstream_error", Some("part"))
            }
        }
        let errs = [
            ProxyError::InvalidJson("x".into()),
            ProxyError::ToolLoopExhausted { rounds: 1 },
            ProxyError::from(Part),
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
