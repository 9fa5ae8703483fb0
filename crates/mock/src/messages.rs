//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: validate the request like the
//! Messages API does ([`rules`](super::rules)), count it and run it through the prompt cache,
//! enforce the context limit, take the next scripted reply (the queue chat uses too), and
//! answer as JSON or as an SSE stream in Anthropic's shapes.
//!
//! Phases: parse → check → count → limit → take reply → wait → respond. A request refused
//! before the reply is taken does not consume one.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};
use tracing::debug;

use super::anthropic::{self, AnswerBlock, MessageAnswer, MessageUsage, DEFAULT_THINKING};
use super::chat::{json_response, latency, raw_response, unwrap_hold};
use super::ctx::Ctx;
use super::prompt_cache::{self, claude_tokens};
use super::rules::{self, Endpoint};
use super::script::{Completion, Reply};
use super::sse::{self, StreamPlan};
use super::wire::derived_id;
use crate::body::MockBody;
use crate::DEFAULT_REPLY_TEXT;

/// Answers `POST /v1/messages` (`count_tokens: false`) or `/v1/messages/count_tokens`.
pub(crate) async fn handle(
    ctx: &Ctx,
    headers: &HeaderMap,
    body: &[u8],
    endpoint: Endpoint,
) -> Response<MockBody> {
    let serial = ctx.state.next_serial();
    let request_id = derived_id("req_", 24, &[&ctx.config.name, &serial.to_string()]);
    let invalid = |message: &str| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
            &request_id,
        )
    };
    if headers.get("anthropic-version").is_none() {
        return invalid("anthropic-version: header is required");
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return invalid("There was an issue with your request body: the body is not valid JSON.");
    };
    let betas: Vec<&str> = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    // What the model reads: without the thinking blocks `drop_block` dropped.
    let request = match rules::read(&request, endpoint, &betas) {
        Ok(read) => read,
        Err(message) => {
            debug!(%message, "messages request refused");
            return invalid(&message);
        }
    };
    let blocks = prompt_cache::blocks(&request);
    let prompt_tokens = prompt_cache::prompt_tokens(&blocks);
    if endpoint == Endpoint::CountTokens {
        if !ctx.life.sleep(ctx.config.latency).await {
            return super::chat::shutting_down();
        }
        return json_response(StatusCode::OK, &json!({"input_tokens": prompt_tokens}));
    }
    let delay = latency(ctx, prompt_tokens);
    if let Some(limit) = ctx.config.context_limit.filter(|l| prompt_tokens > *l) {
        if !ctx.life.sleep(delay).await {
            return super::chat::shutting_down();
        }
        return invalid(&anthropic::prompt_too_long(prompt_tokens, limit));
    }
    let model = request["model"].as_str().unwrap_or("").to_string();
    let reply = ctx
        .state
        .pop_reply()
        .unwrap_or_else(|| Reply::text(DEFAULT_REPLY_TEXT));
    if !ctx.life.sleep(delay).await {
        return super::chat::shutting_down();
    }
    let (reply, hold) = unwrap_hold(reply);
    let stream = request["stream"] == Value::Bool(true);
    match reply {
        Reply::Completion(completion) => {
            let cache = ctx.state.prompt_cache().serve(&model, &blocks);
            let usage = MessageUsage {
                input_tokens: prompt_tokens - cache.read - cache.created,
                cache_creation_input_tokens: cache.created,
                cache_creation_1h: cache.created_1h,
                cache_read_input_tokens: cache.read,
                output_tokens: 0,
            };
            let id = derived_id("msg_01", 22, &[&ctx.config.name, &serial.to_string()]);
            let answer = answer(&request, &completion, id, model, usage, serial, ctx);
            if stream {
                let plan = StreamPlan {
                    events: answer.to_events(),
                    interval: ctx.config.chunk_interval,
                    hold,
                };
                let body = sse::stream(plan, &answer.id, ctx.state.clone(), ctx.life.clone());
                let mut response = Response::new(body);
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream; charset=utf-8"),
                );
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                with_request_id(response, &request_id)
            } else {
                if let Some((_, gate)) = hold {
                    if ctx.life.unless_stopping(gate.opened()).await.is_none() {
                        return super::chat::shutting_down();
                    }
                }
                with_request_id(
                    json_response(StatusCode::OK, &answer.to_json()),
                    &request_id,
                )
            }
        }
        other => {
            if let Some((_, gate)) = hold {
                if ctx.life.unless_stopping(gate.opened()).await.is_none() {
                    return super::chat::shutting_down();
                }
            }
            match other {
                Reply::Error { status, body } => match StatusCode::from_u16(status) {
                    Ok(status) => with_request_id(json_response(status, &body), &request_id),
                    Err(_) => error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "api_error",
                        &format!("mock upstream: error status {status} is not an HTTP status"),
                        &request_id,
                    ),
                },
                Reply::Raw {
                    status,
                    headers,
                    body,
                } => raw_response(status, &headers, body),
                // `unwrap_hold` took every hold off, and completions are answered above.
                Reply::Held { .. } | Reply::Completion(_) => error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "api_error",
                    "mock upstream: nested hold",
                    &request_id,
                ),
            }
        }
    }
}

/// The answer to `request` for the scripted `completion`: a thinking block first when the
/// request turns thinking on, then the text, then one `tool_use` per call.
fn answer(
    request: &Value,
    completion: &Completion,
    id: String,
    model: String,
    mut usage: MessageUsage,
    serial: u64,
    ctx: &Ctx,
) -> MessageAnswer {
    let mut content = Vec::new();
    if rules::thinking_on(request) {
        let thought = completion.thinking.as_deref().unwrap_or(DEFAULT_THINKING);
        // Omitted thinking is sent empty, signed as sent.
        let thought = if request["thinking"]["display"] == "omitted" {
            ""
        } else {
            thought
        };
        // The block opens the new assistant message, after the whole request.
        let block = rules::signed_thinking(request, thought);
        content.push(AnswerBlock::Thinking {
            thinking: thought.to_string(),
            signature: block["signature"].as_str().unwrap_or_default().to_string(),
        });
    }
    if let Some(text) = completion.content.as_deref().filter(|t| !t.is_empty()) {
        content.push(AnswerBlock::Text(text.to_string()));
    }
    let serial = serial.to_string();
    let reference = first_reference(request);
    for (index, call) in completion.tool_calls.iter().enumerate() {
        let index = index.to_string();
        let mut input = call.arguments_text();
        if let Some(reference) = &reference {
            input = input.replace(
                &format!("\"{REF_PLACEHOLDER}\""),
                &format!("\"{reference}\""),
            );
        }
        content.push(AnswerBlock::ToolUse {
            id: call.id.clone().unwrap_or_else(|| {
                derived_id("toolu_01", 22, &[&ctx.config.name, &serial, &index])
            }),
            name: call.name.clone(),
            input,
        });
    }
    if content.is_empty() {
        content.push(AnswerBlock::Text(String::new()));
    }
    usage.output_tokens = content
        .iter()
        .map(|block| match block {
            AnswerBlock::Thinking { thinking, .. } => claude_tokens(thinking),
            AnswerBlock::Text(text) => claude_tokens(text),
            AnswerBlock::ToolUse { name, input, .. } => claude_tokens(name) + claude_tokens(input),
        })
        .sum::<usize>()
        .max(1);
    MessageAnswer {
        id,
        model,
        content,
        usage,
        content_chunks: completion.content_chunks,
    }
}

/// In a scripted call's input, a string `"$ref"` stands for the first stored-content reference
/// (`ctx_` and 24 characters) the request's messages show, as a model that read a proxy's
/// marker would write it: a test scripts a read-back without knowing the reference.
pub const REF_PLACEHOLDER: &str = "$ref";

/// The first `ctx_…` reference in the request's messages.
fn first_reference(request: &Value) -> Option<String> {
    let text = request.get("messages")?.to_string();
    let is_ref_char = |c: char| c.is_ascii_lowercase() || ('2'..='7').contains(&c);
    let mut rest = text.as_str();
    while let Some(at) = rest.find("ctx_") {
        let candidate: String = rest[at + 4..]
            .chars()
            .take_while(|c| is_ref_char(*c))
            .collect();
        if candidate.len() == 24 {
            return Some(format!("ctx_{candidate}"));
        }
        rest = &rest[at + 4..];
    }
    None
}

/// An error response in Anthropic's shape, with its `request-id` header.
fn error(status: StatusCode, kind: &str, message: &str, request_id: &str) -> Response<MockBody> {
    let body = anthropic::error_body(kind, message, request_id);
    with_request_id(json_response(status, &body), request_id)
}

fn with_request_id(mut response: Response<MockBody>, request_id: &str) -> Response<MockBody> {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert("request-id", value);
    }
    response
}
