//! `POST /v1/chat/completions`: validate the request like OpenAI does, enforce the context limit,
//! take the next scripted reply (or the default one), wait the configured latency, and answer as
//! JSON or as an SSE stream.
//!
//! Phases: parse → count → limit → take reply → wait → respond. A request refused by parsing or
//! by the context limit does not consume a scripted reply: it never reached "the model".

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::Value;
use tracing::{debug, warn};

use super::ctx::Ctx;
use super::script::{Completion, Gate, Reply};
use super::sse::{self, StreamPlan};
use super::usage::{prompt_prefixes, TOKENS_PER_REPLY};
use super::wire::{self, Answer, AnswerMeta};
use crate::body::{full, MockBody};
use context_proxy_tokens::Encoding;

/// The answer when no reply is queued.
pub const DEFAULT_REPLY_TEXT: &str = "This is the mock upstream's default reply.";

/// OpenAI's message for a body that is not JSON.
const INVALID_JSON_MESSAGE: &str = "We could not parse the JSON body of your request. (HINT: \
    This likely means you aren't using your HTTP library correctly. The OpenAI API expects a \
    JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to \
    fix this, please contact us through our help center at help.openai.com.)";

/// The parts of a chat request the mock acts on.
#[derive(Debug)]
struct ChatRequest {
    body: Value,
    model: String,
    stream: bool,
    include_usage: bool,
}

/// Answers one chat-completions request.
pub(crate) async fn handle(ctx: &Ctx, body: &[u8]) -> Response<MockBody> {
    let request = match parse(body) {
        Ok(request) => request,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, &error),
    };
    let prefixes = prompt_prefixes(&request.body, Encoding::for_model(&request.model));
    let prompt_tokens = prefixes.last().map_or(0, |(_, tokens)| *tokens) + TOKENS_PER_REPLY;
    let delay = latency(ctx, prompt_tokens);
    if let Some(limit) = ctx
        .config
        .context_limit
        .filter(|limit| prompt_tokens > *limit)
    {
        debug!(limit, prompt_tokens, "context length exceeded");
        if !ctx.life.sleep(delay).await {
            return shutting_down();
        }
        let body = wire::context_length_exceeded(limit, prompt_tokens);
        return json_response(StatusCode::BAD_REQUEST, &body);
    }
    let reply = ctx.state.pop_reply().unwrap_or_else(|| {
        ctx.config
            .reader
            .then(|| crate::reader::reply(&request.body))
            .flatten()
            .unwrap_or_else(|| Reply::text(DEFAULT_REPLY_TEXT))
    });
    if !ctx.life.sleep(delay).await {
        return shutting_down();
    }
    let prompt = Prompt {
        tokens: prompt_tokens,
        cached: ctx.state.cache_prefixes(&prefixes),
    };
    respond(ctx, reply, &request, prompt).await
}

/// A prompt's tokens, and those of them its cache read (the prefix seen before).
#[derive(Debug, Clone, Copy)]
struct Prompt {
    tokens: usize,
    cached: usize,
}

/// Fixed latency plus the per-prompt-token latency.
pub(crate) fn latency(ctx: &Ctx, prompt_tokens: usize) -> Duration {
    let per_token = ctx.config.latency_per_input_token.as_nanos();
    let tokens = u128::try_from(prompt_tokens).unwrap_or(u128::MAX);
    let nanos = u64::try_from(per_token.saturating_mul(tokens)).unwrap_or(u64::MAX);
    ctx.config
        .latency
        .saturating_add(Duration::from_nanos(nanos))
}

async fn respond(
    ctx: &Ctx,
    reply: Reply,
    request: &ChatRequest,
    prompt: Prompt,
) -> Response<MockBody> {
    answer_reply(
        ctx,
        reply,
        request.stream,
        |completion| answer(ctx, completion, request, prompt).to_json(),
        |completion, hold| stream(ctx, completion, request, prompt, hold),
    )
    .await
}

/// Sends `reply`: a completion as JSON (`json`) or as a stream (`stream`, when `streamed`),
/// an error or a raw reply verbatim, each after its hold. Shared by every API the mock plays.
pub(crate) async fn answer_reply(
    ctx: &Ctx,
    reply: Reply,
    streamed: bool,
    json: impl FnOnce(&Completion) -> Value,
    stream: impl FnOnce(&Completion, Option<(usize, Gate)>) -> Response<MockBody>,
) -> Response<MockBody> {
    let (reply, hold) = unwrap_hold(reply);
    if let (Reply::Completion(completion), true) = (&reply, streamed) {
        return stream(completion, hold);
    }
    if let Some((_, gate)) = hold {
        if ctx.life.unless_stopping(gate.opened()).await.is_none() {
            return shutting_down();
        }
    }
    match reply {
        Reply::Completion(completion) => json_response(StatusCode::OK, &json(&completion)),
        Reply::Error { status, body } => match StatusCode::from_u16(status) {
            Ok(status) => json_response(status, &body),
            Err(_) => bad_script(&format!("error status {status} is not an HTTP status")),
        },
        Reply::Raw {
            status,
            headers,
            body,
        } => raw_response(status, &headers, body),
        // `unwrap_hold` took every hold off.
        Reply::Held { .. } => bad_script("nested hold"),
    }
}

/// Takes the holds off a reply; the outermost hold applies.
pub(crate) fn unwrap_hold(mut reply: Reply) -> (Reply, Option<(usize, Gate)>) {
    let mut hold = None;
    while let Reply::Held {
        reply: inner,
        after,
        gate,
    } = reply
    {
        hold.get_or_insert((after, gate));
        reply = *inner;
    }
    (reply, hold)
}

fn answer(ctx: &Ctx, completion: &Completion, request: &ChatRequest, prompt: Prompt) -> Answer {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    Answer::new(
        completion,
        AnswerMeta {
            mock_name: &ctx.config.name,
            serial: ctx.state.next_serial(),
            model: &request.model,
            created,
            prompt_tokens: prompt.tokens,
            cached_tokens: prompt.cached,
        },
    )
}

fn stream(
    ctx: &Ctx,
    completion: &Completion,
    request: &ChatRequest,
    prompt: Prompt,
    hold: Option<(usize, Gate)>,
) -> Response<MockBody> {
    let answer = answer(ctx, completion, request, prompt);
    sse_response(
        ctx,
        answer.to_events(request.include_usage),
        &answer.id,
        hold,
    )
}

/// `events` streamed as `text/event-stream`, paced and held as configured; `id` names the task.
pub(crate) fn sse_response(
    ctx: &Ctx,
    events: Vec<bytes::Bytes>,
    id: &str,
    hold: Option<(usize, Gate)>,
) -> Response<MockBody> {
    let plan = StreamPlan {
        events,
        interval: ctx.config.chunk_interval,
        hold,
    };
    let body = sse::stream(plan, id, ctx.state.clone(), ctx.life.clone());
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `json` with every `\\uXXXX` escape of a surrogate that is not half of a pair replaced by
/// `\\ufffd`; everything else byte for byte.
fn replace_lone_surrogates(json: &[u8]) -> Vec<u8> {
    let hex = |at: usize| -> Option<u16> {
        let digits = json.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let escape_at = |at: usize| -> Option<u16> {
        (json.get(at) == Some(&b'\\') && json.get(at + 1) == Some(&b'u'))
            .then(|| hex(at + 2))
            .flatten()
    };
    let mut out = Vec::with_capacity(json.len());
    let (mut i, mut in_string) = (0, false);
    while i < json.len() {
        let b = json[i];
        if !in_string {
            in_string = b == b'"';
            out.push(b);
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = false;
                out.push(b);
                i += 1;
            }
            b'\\' => match escape_at(i) {
                Some(0xD800..=0xDBFF) if matches!(escape_at(i + 6), Some(0xDC00..=0xDFFF)) => {
                    out.extend_from_slice(&json[i..i + 12]);
                    i += 12;
                }
                Some(0xD800..=0xDFFF) => {
                    out.extend_from_slice(b"\\ufffd");
                    i += 6;
                }
                _ => {
                    let end = (i + 2).min(json.len());
                    out.extend_from_slice(&json[i..end]);
                    i = end;
                }
            },
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The body as a JSON object, or the body of OpenAI's 400 for it.
pub(crate) fn read_json(body: &[u8]) -> Result<Value, Value> {
    let invalid = |message: &str, code: Option<&str>| {
        wire::error_body(message, "invalid_request_error", None, code)
    };
    // Legal JSON that a Rust string cannot hold (a lone surrogate escape) is read with U+FFFD
    // in its place, as a lenient server would.
    let body: Value = serde_json::from_slice(body)
        .or_else(|_| serde_json::from_slice(&replace_lone_surrogates(body)))
        .map_err(|_| invalid(INVALID_JSON_MESSAGE, None))?;
    if !body.is_object() {
        let message = format!(
            "Invalid type for 'body': expected an object, but got {} instead.",
            json_kind(&body)
        );
        return Err(invalid(&message, Some("invalid_type")));
    }
    Ok(body)
}

/// Parses and validates the body, or gives the body of OpenAI's 400 for it.
fn parse(body: &[u8]) -> Result<ChatRequest, Value> {
    let invalid = |message: &str, param: Option<&str>, code: Option<&str>| {
        wire::error_body(message, "invalid_request_error", param, code)
    };
    let body = read_json(body)?;
    let model = match &body["model"] {
        Value::String(model) => model.clone(),
        _ => return Err(invalid("you must provide a model parameter", None, None)),
    };
    match &body["messages"] {
        Value::Null => {
            return Err(invalid(
                "Missing required parameter: 'messages'.",
                Some("messages"),
                Some("missing_required_parameter"),
            ))
        }
        Value::Array(messages) if messages.is_empty() => {
            return Err(invalid(
                "Invalid 'messages': empty array. Expected an array with minimum length 1, but \
                 got an empty array instead.",
                Some("messages"),
                Some("empty_array"),
            ))
        }
        Value::Array(_) => {}
        other => {
            let message = format!(
                "Invalid type for 'messages': expected an array, but got {} instead.",
                json_kind(other)
            );
            return Err(invalid(&message, Some("messages"), Some("invalid_type")));
        }
    }
    let stream = body["stream"] == Value::Bool(true);
    let include_usage = body["stream_options"]["include_usage"] == Value::Bool(true);
    Ok(ChatRequest {
        body,
        model,
        stream,
        include_usage,
    })
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `value` as an `application/json` response.
pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<MockBody> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn raw_response(
    status: u16,
    headers: &[(String, String)],
    body: bytes::Bytes,
) -> Response<MockBody> {
    let Ok(status) = StatusCode::from_u16(status) else {
        return bad_script(&format!("raw status {status} is not an HTTP status"));
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    for (name, value) in headers {
        let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return bad_script(&format!(
                "raw header `{name}: {value}` is not a valid header"
            ));
        };
        response.headers_mut().append(name, value);
    }
    response
}

/// A 500 telling the test its scripted reply cannot be sent.
fn bad_script(problem: &str) -> Response<MockBody> {
    warn!(problem, "scripted reply cannot be sent");
    let message = format!("mock upstream: the scripted reply cannot be sent: {problem}");
    let body = wire::error_body(&message, "server_error", None, Some("mock_bad_script"));
    json_response(StatusCode::INTERNAL_SERVER_ERROR, &body)
}

/// A 503 for a request cut short by shutdown.
pub(crate) fn shutting_down() -> Response<MockBody> {
    let body = wire::error_body(
        "mock upstream is shutting down",
        "server_error",
        None,
        Some("mock_shutting_down"),
    );
    json_response(StatusCode::SERVICE_UNAVAILABLE, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_requests_get_openai_shaped_errors() {
        let cases: [(&[u8], Value, Value); 5] = [
            (b"{not json", Value::Null, Value::Null),
            (b"[]", Value::Null, "invalid_type".into()),
            (
                br#"{"messages":[{"role":"user","content":"x"}]}"#,
                Value::Null,
                Value::Null,
            ),
            (
                br#"{"model":"gpt-4o"}"#,
                "messages".into(),
                "missing_required_parameter".into(),
            ),
            (
                br#"{"model":"gpt-4o","messages":[]}"#,
                "messages".into(),
                "empty_array".into(),
            ),
        ];
        for (body, param, code) in cases {
            let error = parse(body).unwrap_err();
            let error = &error["error"];
            assert_eq!(error["type"], "invalid_request_error", "{error}");
            assert_eq!(error["param"], param, "{error}");
            assert_eq!(error["code"], code, "{error}");
            assert!(!error["message"].as_str().unwrap().is_empty());
        }
    }

    #[test]
    fn stream_flags_are_read() {
        let request = parse(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,
                 "stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert!(request.stream && request.include_usage);
        assert_eq!(request.model, "m");
    }

    #[test]
    fn outermost_hold_applies() {
        let outer = Gate::new();
        let reply = Reply::Held {
            reply: Box::new(Reply::text("x").hold_after(1, Gate::new())),
            after: 5,
            gate: outer,
        };
        let (reply, hold) = unwrap_hold(reply);
        assert!(matches!(reply, Reply::Completion(_)));
        assert_eq!(hold.map(|(after, _)| after), Some(5));
    }

    #[test]
    fn lone_surrogates_are_read_as_replacement_characters() {
        let raw = br#"{"a":"x\ud800y","b":"\ud83d\ude00","c":"\\ud800","d":"\udc00\ud800"}"#;
        let fixed = replace_lone_surrogates(raw);
        let v: Value = serde_json::from_slice(&fixed).unwrap();
        assert_eq!(v["a"], "x\u{fffd}y");
        assert_eq!(v["b"], "\u{1f600}");
        assert_eq!(v["c"], "\\ud800", "an escaped backslash is no escape");
        assert_eq!(v["d"], "\u{fffd}\u{fffd}");
    }
}
