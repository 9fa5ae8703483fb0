//! The body of every response the mock sends: a full buffer or a live SSE stream. The mock's
//! own type, so that it shares nothing with the proxy it stands in front of.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// Errors a streamed body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body of every response the mock sends.
pub type MockBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes` in full.
pub fn full(bytes: impl Into<Bytes>) -> MockBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}
