//! Every `/v1/…` route other than `POST /v1/chat/completions` (models, embeddings, responses,
//! files, …): forwarded verbatim — method, path, query, end-to-end headers — with the body
//! streamed both ways. A small JSON body is read first only to route by its `model`; anything
//! else streams straight through and goes to the default upstream.

use std::sync::Arc;

use http::{header, HeaderMap, Request, Response};
use hyper::body::Incoming;
use serde::Deserialize;

use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::request_body::{declared_length, read_limited, timeout_error, Timed};
use crate::routes::shared::Shared;
use crate::upstream::relay::relay;

/// Forwards `req` to the upstream serving its model (or the default one).
pub async fn handle(
    state: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path()
        .strip_prefix("/v1")
        .unwrap_or(parts.uri.path());
    let limits = &state.body_limits;
    let limit = limits.max_body_bytes;

    let (model, body, timed_out) = if small_json(&parts.headers, limit) {
        let bytes = read_limited(body, &parts.headers, limits, &state.body_budget).await?;
        (model_of(&bytes), reqwest::Body::from(bytes), None)
    } else {
        // Streamed, but still bounded in time: a body that stalls fails the upstream request.
        let timed = Timed::new(body, limits);
        let timed_out = timed.expired_flag();
        (None, reqwest::Body::wrap(timed), Some(timed_out))
    };
    let upstream = state.upstreams.route(model.as_deref());
    // A body whose model was not read may name any model: "" for the key's model check.
    let has_body = declared_length(&parts.headers).is_some_and(|len| len > 0)
        || parts.headers.contains_key(header::TRANSFER_ENCODING);
    let for_auth = model.as_deref().or(has_body.then_some(""));
    crate::auth::authorize(&parts.extensions, for_auth, &upstream.name)?;
    tracing::debug!(upstream = %upstream.name, %path, "forwarding verbatim");
    let incoming = upstream
        .send_streaming(
            parts.method.clone(),
            path,
            parts.uri.query(),
            parts.headers,
            &[header::HOST],
            body,
        )
        .await;
    let incoming = match incoming {
        Ok(incoming) => incoming,
        Err(_) if timed_out.is_some_and(|t| t.load(std::sync::atomic::Ordering::SeqCst)) => {
            return Err(timeout_error(limits).into());
        }
        Err(e) => return Err(e.into()),
    };
    let mut response = relay(incoming);
    response
        .extensions_mut()
        .insert(crate::telemetry::metrics::UpstreamName(
            upstream.name.clone(),
        ));
    Ok(response)
}

/// A JSON body whose declared length is within the limit: worth reading to route by model.
fn small_json(headers: &HeaderMap, limit: usize) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    json && declared_length(headers).is_some_and(|len| len > 0 && len <= limit as u64)
}

/// The top-level `model` string of a JSON body, if it has one.
fn model_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ModelOnly {
        model: Option<String>,
    }
    serde_json::from_slice::<ModelOnly>(body).ok()?.model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_found_or_not() {
        assert_eq!(
            model_of(br#"{"input":"x","model":"text-embedding-3-small"}"#).as_deref(),
            Some("text-embedding-3-small")
        );
        assert_eq!(model_of(br#"{"input":"x"}"#), None);
        assert_eq!(model_of(b"not json"), None);
        assert_eq!(model_of(br#"{"model":5}"#), None);
    }
}
