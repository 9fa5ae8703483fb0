//! Routes a request to what answers it, and records it:
//!
//! - `POST /v1/chat/completions` → `chat`;
//! - `POST /v1/responses` → `responses`;
//! - `POST /v1/messages` (any query, `?beta=true` too) and `POST /v1/messages/count_tokens` →
//!   `messages`;
//! - `GET /v1/models` → an OpenAI-shaped model list;
//! - `/_mock/*` → the control API (not recorded): `POST /_mock/replies` queues a JSON array of
//!   replies, `GET /_mock/received` lists the recorded requests, `POST /_mock/reset` forgets
//!   replies and requests;
//! - anything else, any method → the echo: 200, `x-mock-echo: 1`, and the request as JSON
//!   `{method, path, query, headers, body}`, to test verbatim forwarding.
//!
//! Every response carries `x-mock-name` when the mock has a name. The fixed latency applies to
//! every recorded request.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tracing::debug;

use super::chat::{self, json_response, shutting_down};
use super::ctx::Ctx;
use super::messages;
use super::rules::Endpoint;
use super::script::Reply;
use super::state::Received;
use super::wire;
use crate::body::MockBody;
use crate::DROPPED_HEADER;

/// Answers one request.
pub(crate) async fn handle(ctx: Ctx, request: Request<Incoming>) -> Response<MockBody> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            debug!(error = %err, "could not read the request body");
            let message = format!("could not read the request body: {err}");
            let body = wire::error_body(&message, "invalid_request_error", None, None);
            return named(&ctx, json_response(StatusCode::BAD_REQUEST, &body));
        }
    };
    let path = parts.uri.path();
    let response = if let Some(route) = path.strip_prefix("/_mock/") {
        control(&ctx, &parts.method, route, &body)
    } else {
        let received = Received {
            method: parts.method.to_string(),
            path: path.to_string(),
            query: parts.uri.query().map(str::to_string),
            headers: parts.headers,
            body,
        };
        ctx.state.record(received.clone());
        serve(&ctx, received).await
    };
    named(&ctx, response)
}

async fn serve(ctx: &Ctx, request: Received) -> Response<MockBody> {
    match (request.method.as_str(), request.path.as_str()) {
        ("POST", "/v1/chat/completions") => chat::handle(ctx, &request.body).await,
        ("POST", "/v1/responses") => super::responses::handle(ctx, &request.body).await,
        ("POST", "/v1/responses/compact") => super::responses::compact(ctx, &request.body).await,
        ("POST", "/v1/messages") => {
            messages::handle(ctx, &request.headers, &request.body, Endpoint::Messages).await
        }
        ("POST", "/v1/messages/count_tokens") => {
            messages::handle(ctx, &request.headers, &request.body, Endpoint::CountTokens).await
        }
        ("GET", "/v1/models") => {
            if !ctx.life.sleep(ctx.config.latency).await {
                return shutting_down();
            }
            json_response(StatusCode::OK, &wire::model_list())
        }
        _ => {
            if !ctx.life.sleep(ctx.config.latency).await {
                return shutting_down();
            }
            let mut response = json_response(StatusCode::OK, &request.to_json());
            response
                .headers_mut()
                .insert("x-mock-echo", HeaderValue::from_static("1"));
            response
        }
    }
}

/// The `/_mock/*` routes; `route` is the path after `/_mock/`.
fn control(ctx: &Ctx, method: &Method, route: &str, body: &Bytes) -> Response<MockBody> {
    match (method, route) {
        (&Method::POST, "replies") => match serde_json::from_slice::<Vec<Reply>>(body) {
            Ok(replies) => {
                let queued = replies.len();
                ctx.state.push_replies(replies);
                let pending = ctx.state.pending_replies();
                json_response(
                    StatusCode::OK,
                    &json!({"queued": queued, "pending": pending}),
                )
            }
            Err(err) => {
                let message = format!("POST /_mock/replies wants a JSON array of replies: {err}");
                let body = wire::error_body(&message, "invalid_request_error", None, None);
                json_response(StatusCode::BAD_REQUEST, &body)
            }
        },
        (&Method::GET, "received") => {
            let (received, dropped) = ctx.state.received_and_dropped();
            let received: Vec<Value> = received.iter().map(Received::to_json).collect();
            let mut response = json_response(StatusCode::OK, &Value::Array(received));
            // Whoever reads the log as a whole (replay) must know when it is not whole.
            response
                .headers_mut()
                .insert(DROPPED_HEADER, HeaderValue::from(dropped));
            response
        }
        (&Method::POST, "reset") => {
            ctx.state.reset();
            json_response(StatusCode::OK, &json!({"reset": true}))
        }
        _ => {
            let message = format!(
                "no mock control route {method} /_mock/{route}; there are POST /_mock/replies, \
                 GET /_mock/received and POST /_mock/reset"
            );
            let body =
                wire::error_body(&message, "invalid_request_error", None, Some("unknown_url"));
            json_response(StatusCode::NOT_FOUND, &body)
        }
    }
}

fn named(ctx: &Ctx, mut response: Response<MockBody>) -> Response<MockBody> {
    if let Some(name) = &ctx.name_header {
        response.headers_mut().insert("x-mock-name", name.clone());
    }
    response
}
