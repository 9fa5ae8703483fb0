//! Reading a request body into memory, bounded by `server.max_body_bytes`.

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use crate::error::ProxyError;

/// The `Content-Length` the client declared, if any.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Reads the whole body, answering 413 as soon as it is known to exceed `limit`.
pub async fn read_limited(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    if declared_length(headers).is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::BodyRead(e.to_string())),
    }
}
