//! The response body type shared by every route: either a full buffer or a live stream.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// Errors a streamed body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body of every response the proxy sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body holding `bytes` in full.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}
