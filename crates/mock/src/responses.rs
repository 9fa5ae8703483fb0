//! `POST /v1/responses`: validate the request like the Responses API does (item types, tool
//! calls paired with their outputs by `call_id`, a reasoning item followed by what it reasons
//! for, flat function tools, no server-side state to refer to), enforce the context limit, take
//! the next scripted reply, and answer as a `response` object or as its SSE events
//! (`docs/responses-wire.md`).
//!
//! Phases, as on the chat side: parse → count → limit → take reply → wait → respond. A refused
//! request does not consume a scripted reply. The usage reports the prefix the mock has seen
//! before as `cached_tokens`, the way OpenAI's prompt cache does (1024 tokens and up, in steps
//! of 128).

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{Response, StatusCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::debug;

use super::chat::{answer_reply, json_kind, json_response, latency, read_json, shutting_down};
use super::ctx::Ctx;
use super::responses_wire::{
    context_length_exceeded, encrypted_content, item_id, OutItem, ResponseAnswer, ResponseUsage,
};
use super::script::{Completion, Reply};
use super::usage::{completion_tokens, TOKENS_PER_MESSAGE, TOKENS_PER_REPLY};
use super::wire::{self, derived_id};
use crate::body::MockBody;
use crate::DEFAULT_REPLY_TEXT;
use context_proxy_tokens::Encoding;

/// Every `input[].type` the API accepts, in the order its error message lists them, and
/// `additional_tools` (tools added to the conversation as an item: Codex 0.171 sends its tools
/// so, with no top-level `tools`, to the API by default).
pub const ITEM_TYPES: [&str; 28] = [
    "additional_tools",
    "apply_patch_call",
    "apply_patch_call_output",
    "code_interpreter_call",
    "compaction",
    "compaction_trigger",
    "computer_call",
    "computer_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "file_search_call",
    "function_call",
    "function_call_output",
    "image_generation_call",
    "item_reference",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "mcp_list_tools",
    "message",
    "reasoning",
    "shell_call",
    "shell_call_output",
    "tool_search_call",
    "tool_search_output",
    "web_search_call",
];

/// The request fields a `response` object echoes, in its key order, with the API's defaults.
/// A request field's default when the request leaves it out.
type Default = fn() -> Value;

const ECHOED: [(&str, Default); 14] = [
    ("instructions", || Value::Null),
    ("max_output_tokens", || Value::Null),
    ("model", || Value::Null),
    ("parallel_tool_calls", || Value::Bool(true)),
    ("previous_response_id", || Value::Null),
    ("prompt_cache_key", || Value::Null),
    (
        "reasoning",
        || serde_json::json!({"effort": null, "summary": null}),
    ),
    ("store", || Value::Bool(true)),
    ("temperature", || serde_json::json!(1.0)),
    ("text", || serde_json::json!({"format": {"type": "text"}})),
    ("tool_choice", || Value::String("auto".into())),
    ("tools", || Value::Array(Vec::new())),
    ("top_p", || serde_json::json!(1.0)),
    ("truncation", || Value::String("disabled".into())),
];

/// The item types this mock knows: every one of the API's, or all but the compaction items
/// when it plays a server that is not OpenAI ([`crate::MockConfig::without_compaction`]).
fn known_types(ctx: &Ctx) -> Vec<&'static str> {
    ITEM_TYPES
        .iter()
        .copied()
        .filter(|t| !(ctx.config.without_compaction && t.starts_with("compaction")))
        .collect()
}

/// The parts of a Responses request the mock acts on.
#[derive(Debug)]
struct ResponsesRequest {
    body: Value,
    model: String,
    stream: bool,
}

/// Answers one `POST /v1/responses`.
pub(crate) async fn handle(ctx: &Ctx, body: &[u8]) -> Response<MockBody> {
    let request = match parse(body, &known_types(ctx)) {
        Ok(request) => request,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, &error),
    };
    let encoding = Encoding::for_model(&request.model);
    let prefix = prefix_tokens(&request.body, encoding);
    let input_tokens = prefix.last().map_or(0, |(_, tokens)| *tokens) + TOKENS_PER_REPLY;
    let delay = latency(ctx, input_tokens);
    if let Some(limit) = ctx
        .config
        .context_limit
        .filter(|limit| input_tokens > *limit)
    {
        debug!(limit, input_tokens, "context length exceeded");
        if !ctx.life.sleep(delay).await {
            return shutting_down();
        }
        return json_response(StatusCode::BAD_REQUEST, &context_length_exceeded());
    }
    let cached_tokens = ctx.state.cache_prefixes(&prefix);
    if is_compaction(&request.body) {
        // Served natively, as OpenAI does: one compaction item, no scripted reply used.
        if !ctx.life.sleep(delay).await {
            return shutting_down();
        }
        let usage = ResponseUsage {
            input_tokens,
            cached_tokens,
            output_tokens: COMPACTION_TOKENS,
            reasoning_tokens: 0,
        };
        let answer = compaction_answer(ctx, &request, usage);
        return if request.stream {
            super::chat::sse_response(ctx, answer.to_events(), &answer.id, None)
        } else {
            json_response(StatusCode::OK, &answer.to_json())
        };
    }
    let reply = ctx.state.pop_reply().unwrap_or_else(|| {
        ctx.config
            .reader
            .then(|| crate::reader::reply_responses(&request.body))
            .flatten()
            .unwrap_or_else(|| Reply::text(DEFAULT_REPLY_TEXT))
    });
    if !ctx.life.sleep(delay).await {
        return shutting_down();
    }
    let usage = |completion: &Completion| {
        let output_tokens = completion_tokens(
            completion.content.as_deref(),
            completion
                .tool_calls
                .iter()
                .map(|call| (call.name.as_str(), "")),
            encoding,
        ) + completion
            .tool_calls
            .iter()
            .map(|call| encoding.count(&call.arguments_text()))
            .sum::<usize>();
        ResponseUsage {
            input_tokens,
            cached_tokens,
            output_tokens,
            reasoning_tokens: 0,
        }
    };
    answer_reply(
        ctx,
        reply,
        request.stream,
        |completion| answer(ctx, completion, &request, usage(completion)).to_json(),
        |completion, hold| {
            let answer = answer(ctx, completion, &request, usage(completion));
            super::chat::sse_response(ctx, answer.to_events(), &answer.id, hold)
        },
    )
    .await
}

/// The output tokens the mock bills for a compaction.
const COMPACTION_TOKENS: usize = 200;

/// Whether the request's input ends with a `compaction_trigger` (`check_items` allows one
/// only there).
fn is_compaction(body: &Value) -> bool {
    body["input"]
        .as_array()
        .and_then(|items| items.last())
        .is_some_and(|item| item["type"] == "compaction_trigger")
}

/// The compaction item the mock makes: encrypted the way the API shows it (`gAAAAB…`).
fn compaction_item(ctx: &Ctx) -> OutItem {
    let serial = ctx.state.next_serial().to_string();
    let name = ctx.config.name.as_str();
    OutItem::Compaction {
        id: item_id("cmp_", &[name, &serial, "compaction"]),
        encrypted_content: encrypted_content(&[name, &serial, "compaction"]),
    }
}

/// The response to a final `compaction_trigger`: one compaction item.
fn compaction_answer(
    ctx: &Ctx,
    request: &ResponsesRequest,
    usage: ResponseUsage,
) -> ResponseAnswer {
    let nothing = Completion {
        content: None,
        tool_calls: Vec::new(),
        content_chunks: None,
        thinking: None,
    };
    let mut answer = answer(ctx, &nothing, request, usage);
    answer.output = vec![compaction_item(ctx)];
    answer
}

/// Answers one `POST /v1/responses/compact` natively: every user message of the input, then
/// one compaction item (`{"object": "response.compaction", "output": […], "usage": …}`).
pub(crate) async fn compact(ctx: &Ctx, body: &[u8]) -> Response<MockBody> {
    if ctx.config.without_compaction {
        // The route does not exist there: FastAPI's 404 (vLLM's server).
        return json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"detail": "Not Found"}),
        );
    }
    let request = match parse(body, &known_types(ctx)) {
        Ok(request) => request,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, &error),
    };
    let encoding = Encoding::for_model(&request.model);
    let prefix = prefix_tokens(&request.body, encoding);
    let input_tokens = prefix.last().map_or(0, |(_, tokens)| *tokens);
    if !ctx.life.sleep(latency(ctx, input_tokens)).await {
        return shutting_down();
    }
    let mut output: Vec<Value> = match &request.body["input"] {
        Value::String(text) => vec![serde_json::json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}]})],
        Value::Array(items) => items
            .iter()
            .filter(|item| {
                item["role"] == "user" && item["type"].as_str().unwrap_or("message") == "message"
            })
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let item = compaction_item(ctx);
    output.push(item.done());
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let usage = ResponseUsage {
        input_tokens,
        cached_tokens: 0,
        output_tokens: COMPACTION_TOKENS,
        reasoning_tokens: 0,
    };
    let serial = ctx.state.next_serial().to_string();
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "id": item_id("resp_", &[ctx.config.name.as_str(), &serial]),
            "object": "response.compaction",
            "created_at": created_at,
            "output": output,
            "usage": usage.to_json(),
        }),
    )
}

/// The response to send for `completion`: a reasoning item when the request asks for
/// reasoning (with its `encrypted_content` when `include` names it), the text, the calls (a
/// call of a tool the request declares `custom` is a `custom_tool_call` with the text as its
/// input).
fn answer(
    ctx: &Ctx,
    completion: &Completion,
    request: &ResponsesRequest,
    usage: ResponseUsage,
) -> ResponseAnswer {
    let body = &request.body;
    let serial = ctx.state.next_serial().to_string();
    let name = ctx.config.name.as_str();
    let seed = |kind: &str, index: usize| {
        [
            name.to_string(),
            serial.clone(),
            kind.into(),
            index.to_string(),
        ]
    };
    let ids = |prefix: &str, kind: &str, index: usize| {
        let seed = seed(kind, index);
        let seed: Vec<&str> = seed.iter().map(String::as_str).collect();
        item_id(prefix, &seed)
    };
    let mut output = Vec::new();
    if body["reasoning"].is_object() {
        let included = body["include"]
            .as_array()
            .is_some_and(|list| list.iter().any(|v| v == "reasoning.encrypted_content"));
        // A summary when asked for (`auto`, `concise`, `detailed`): a line on what comes.
        let summary = body["reasoning"]["summary"].is_string().then(|| {
            let what = match (&completion.content, completion.tool_calls.is_empty()) {
                (_, false) => "which tool to call",
                (Some(_), true) => "how to answer",
                (None, true) => "whether anything is left to say",
            };
            format!("**Planning the next step**\n\nDeciding {what}.")
        });
        output.push(OutItem::Reasoning {
            id: ids("rs_", "reasoning", 0),
            summary,
            encrypted_content: included.then(|| encrypted_content(&[name, &serial])),
        });
    }
    if let Some(text) = &completion.content {
        output.push(OutItem::Message {
            id: ids("msg_", "message", 0),
            text: text.clone(),
            chunks: completion.content_chunks,
        });
    }
    let custom = |tool: &str| {
        body["tools"].as_array().is_some_and(|tools| {
            tools
                .iter()
                .any(|t| t["type"] == "custom" && t["name"] == tool)
        })
    };
    for (index, call) in completion.tool_calls.iter().enumerate() {
        let call_id = call.id.clone().unwrap_or_else(|| {
            let index = index.to_string();
            derived_id("call_", 24, &[name, &serial, &index])
        });
        output.push(if custom(&call.name) {
            OutItem::CustomToolCall {
                id: ids("ctc_", "call", index),
                call_id,
                name: call.name.clone(),
                input: call.arguments_text(),
            }
        } else {
            OutItem::FunctionCall {
                id: ids("fc_", "call", index),
                call_id,
                name: call.name.clone(),
                arguments: call.arguments_text(),
            }
        });
    }
    let echo = ECHOED
        .iter()
        .map(|(key, default)| {
            let value = body.get(*key).cloned().unwrap_or_else(default);
            (*key, value)
        })
        .collect();
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    ResponseAnswer {
        id: item_id("resp_", &[name, &serial]),
        created_at,
        model: request.model.clone(),
        output,
        usage,
        echo,
        obfuscation: body["stream_options"]["include_obfuscation"] != Value::Bool(false),
        background: body["background"] == Value::Bool(true),
    }
}

/// The request's prefixes, in order, as (hash of the prefix, tokens up to its end): the
/// tools and instructions first, then each input item. What the prompt cache matches on.
fn prefix_tokens(body: &Value, encoding: Encoding) -> Vec<([u8; 32], usize)> {
    let mut out = Vec::new();
    let mut hasher = Sha256::new();
    let mut total = 0;
    let mut push = |text: &str, tokens: usize, out: &mut Vec<([u8; 32], usize)>| {
        hasher.update(text.as_bytes());
        hasher.update([0]);
        total += tokens;
        out.push((hasher.clone().finalize().into(), total));
    };
    let tools = body["tools"].to_string();
    let instructions = body["instructions"].as_str().unwrap_or("");
    let head_tokens = body["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|tool| encoding.count(&tool.to_string()))
        .sum::<usize>()
        + if instructions.is_empty() {
            0
        } else {
            TOKENS_PER_MESSAGE + encoding.count(instructions)
        };
    push(&format!("{tools}{instructions}"), head_tokens, &mut out);
    match &body["input"] {
        Value::String(text) => push(text, TOKENS_PER_MESSAGE + encoding.count(text), &mut out),
        Value::Array(items) => {
            for item in items {
                push(
                    &item.to_string(),
                    TOKENS_PER_MESSAGE + item_tokens(item, encoding),
                    &mut out,
                );
            }
        }
        _ => {}
    }
    out
}

/// The tokens of one input item's text: message text, call names, arguments and inputs,
/// outputs, reasoning summaries.
fn item_tokens(item: &Value, encoding: Encoding) -> usize {
    let count = |v: &Value| v.as_str().map_or(0, |text| encoding.count(text));
    let parts = |v: &Value| match v {
        Value::String(text) => encoding.count(text),
        Value::Array(parts) => parts.iter().map(|p| count(&p["text"])).sum(),
        _ => 0,
    };
    parts(&item["content"])
        + parts(&item["output"])
        + parts(&item["summary"])
        + count(&item["name"])
        + count(&item["arguments"])
        + count(&item["input"])
}

/// Parses and validates the body, or gives the body of the API's 400 for it.
fn parse(body: &[u8], known: &[&str]) -> Result<ResponsesRequest, Value> {
    let invalid = |message: &str, param: Option<&str>, code: Option<&str>| {
        wire::error_body(message, "invalid_request_error", param, code)
    };
    let missing = |param: &str| {
        invalid(
            &format!("Missing required parameter: '{param}'."),
            Some(param),
            Some("missing_required_parameter"),
        )
    };
    let body = read_json(body)?;
    let model = match &body["model"] {
        Value::String(model) => model.clone(),
        _ => return Err(missing("model")),
    };
    if let Some(id) = body["previous_response_id"].as_str() {
        return Err(invalid(
            &format!("Previous response with id '{id}' not found."),
            Some("previous_response_id"),
            Some("previous_response_not_found"),
        ));
    }
    if !body["conversation"].is_null() {
        let id = body["conversation"]
            .as_str()
            .or_else(|| body["conversation"]["id"].as_str())
            .unwrap_or("");
        return Err(invalid(
            &format!("Conversation with id '{id}' not found."),
            Some("conversation"),
            None,
        ));
    }
    for (i, tool) in body["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if tool["type"] == "function" && !tool["name"].is_string() {
            return Err(missing(&format!("tools[{i}].name")));
        }
    }
    match &body["input"] {
        Value::Null | Value::String(_) => {}
        Value::Array(items) => check_items(items, known)?,
        other => {
            let message = format!(
                "Invalid type for 'input': expected one of a string or array of input items, \
                 but got {} instead.",
                json_kind(other)
            );
            return Err(invalid(&message, Some("input"), Some("invalid_type")));
        }
    }
    let stream = body["stream"] == Value::Bool(true);
    Ok(ResponsesRequest {
        body,
        model,
        stream,
    })
}

/// What a call item is called in the API's pairing errors, and the output type answering it.
fn call_kind(kind: &str) -> Option<(&'static str, &'static [&'static str])> {
    match kind {
        "function_call" => Some(("function call", &["function_call_output"])),
        // Codex answers its local shell calls with a `function_call_output`.
        "local_shell_call" => Some(("function call", &["function_call_output"])),
        "custom_tool_call" => Some(("custom tool call", &["custom_tool_call_output"])),
        "shell_call" => Some(("shell call", &["shell_call_output"])),
        _ => None,
    }
}

fn output_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "function_call_output" => Some("function call"),
        "custom_tool_call_output" => Some("custom tool call"),
        "shell_call_output" => Some("shell call"),
        _ => None,
    }
}

/// The input items' rules: known types, message roles, call ids, every output answering an
/// earlier call of its kind, every call answered, a reasoning item followed by an item, no
/// reference to a stored item, no item `id` twice.
fn check_items(items: &[Value], known: &[&str]) -> Result<(), Value> {
    let invalid = |message: &str, param: &str, code: Option<&str>| {
        wire::error_body(message, "invalid_request_error", Some(param), code)
    };
    let missing = |param: &str| {
        invalid(
            &format!("Missing required parameter: '{param}'."),
            param,
            Some("missing_required_parameter"),
        )
    };
    // Calls by id: (what they are called, the outputs that answer them, answered).
    let mut calls: HashMap<&str, (&str, &[&str], bool)> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut ids: HashSet<&str> = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let Some(map) = item.as_object() else {
            let message = format!(
                "Invalid type for 'input[{i}]': expected an input item, but got {} instead.",
                json_kind(item)
            );
            return Err(invalid(
                &message,
                &format!("input[{i}]"),
                Some("invalid_type"),
            ));
        };
        let kind = match map.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            None if map.contains_key("role") => "message",
            None => return Err(missing(&format!("input[{i}].role"))),
            Some(other) => {
                let message = format!(
                    "Invalid type for 'input[{i}].type': expected a string, but got {} instead.",
                    json_kind(other)
                );
                return Err(invalid(
                    &message,
                    &format!("input[{i}].type"),
                    Some("invalid_type"),
                ));
            }
        };
        if !known.contains(&kind) {
            let (last, rest) = known.split_last().unwrap_or((&"", &[]));
            let listed: Vec<String> = rest.iter().map(|t| format!("'{t}'")).collect();
            let message = format!(
                "Invalid value: '{kind}'. Supported values are: {}, and '{last}'.",
                listed.join(", ")
            );
            return Err(invalid(
                &message,
                &format!("input[{i}]"),
                Some("invalid_value"),
            ));
        }
        if let Some(id) = map.get("id").and_then(Value::as_str) {
            if !ids.insert(id) {
                // The API's words (continuedev/continue #10200, earendil-works/pi #5149).
                let message = format!(
                    "Duplicate item found with id {id}. Remove duplicate items from your input \
                     and try again."
                );
                return Err(invalid(&message, "input", None));
            }
        }
        let call_id = || map.get("call_id").and_then(Value::as_str);
        match kind {
            "message" => {
                let role = map.get("role").and_then(Value::as_str).unwrap_or("");
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    let message = format!(
                        "Invalid value: '{role}'. Supported values are: 'assistant', 'system', \
                         'developer', and 'user'."
                    );
                    return Err(invalid(
                        &message,
                        &format!("input[{i}].role"),
                        Some("invalid_value"),
                    ));
                }
                if !map.contains_key("content") {
                    return Err(missing(&format!("input[{i}].content")));
                }
            }
            "reasoning" if i + 1 == items.len() => {
                let id = map.get("id").and_then(Value::as_str).unwrap_or("");
                let message = format!(
                    "Item '{id}' of type 'reasoning' was provided without its required \
                     following item."
                );
                return Err(invalid(&message, "input", None));
            }
            "reasoning" => {
                let content = map.get("encrypted_content").and_then(Value::as_str);
                if content.is_some_and(|c| !super::responses_wire::verified(c)) {
                    let id = map.get("id").and_then(Value::as_str).unwrap_or("");
                    let message = format!(
                        "The encrypted content for item {id} could not be verified. Reason: \
                         Encrypted content could not be decrypted or parsed."
                    );
                    return Err(invalid(
                        &message,
                        &format!("input[{i}].encrypted_content"),
                        Some("invalid_encrypted_content"),
                    ));
                }
            }
            "compaction_trigger" if i + 1 != items.len() => {
                let message = format!(
                    "Invalid 'input[{i}]': a 'compaction_trigger' item must be the final input \
                     item."
                );
                return Err(invalid(
                    &message,
                    &format!("input[{i}]"),
                    Some("invalid_value"),
                ));
            }
            "compaction" => {
                // Only what the API encrypted itself can be decrypted.
                let content = map.get("encrypted_content").and_then(Value::as_str);
                if !content.is_some_and(|c| c.starts_with("gAAAAB")) {
                    let message =
                        format!("The encrypted content for item input[{i}] could not be verified.");
                    return Err(invalid(
                        &message,
                        "input",
                        Some("invalid_encrypted_content"),
                    ));
                }
            }
            "item_reference" => {
                let id = map.get("id").and_then(Value::as_str).unwrap_or("");
                let message = format!(
                    "Item with id '{id}' not found. Items are not persisted when `store` is set \
                     to false. Try again with `store` set to true, or remove this item from \
                     your input."
                );
                return Err(invalid(&message, "input", None));
            }
            _ => {}
        }
        if let Some((name, outputs)) = call_kind(kind) {
            let Some(id) = call_id() else {
                return Err(missing(&format!("input[{i}].call_id")));
            };
            calls.insert(id, (name, outputs, false));
            order.push(id);
        }
        if let Some(name) = output_kind(kind) {
            let Some(id) = call_id() else {
                return Err(missing(&format!("input[{i}].call_id")));
            };
            match calls.get_mut(id) {
                Some((_, outputs, answered)) if outputs.contains(&kind) => *answered = true,
                _ => {
                    let message =
                        format!("No tool call found for {name} output with call_id {id}.");
                    return Err(invalid(&message, "input", None));
                }
            }
        }
    }
    for id in order {
        if let Some((name, _, false)) = calls.get(id) {
            let message = format!("No tool output found for {name} {id}.");
            return Err(invalid(&message, "input", None));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn error_of(body: Value) -> Value {
        parse(body.to_string().as_bytes(), &ITEM_TYPES).unwrap_err()["error"].clone()
    }

    #[test]
    fn an_item_id_given_twice_is_the_apis_400() {
        let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": []});
        let twice = error_of(json!({"model": "m", "input": [
            {"role": "user", "content": "x", "id": "msg_1"},
            reasoning, {"role": "assistant", "content": "y", "id": "msg_2"},
            reasoning, {"role": "assistant", "content": "z", "id": "msg_3"}]}));
        assert_eq!(
            twice["message"],
            "Duplicate item found with id rs_1. Remove duplicate items from your input and try again."
        );
        assert_eq!(twice["param"], "input");
        assert_eq!(twice["code"], Value::Null);
        let once = json!({"model": "m", "input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": []},
            {"role": "user", "content": "x", "id": "msg_1"},
            {"role": "assistant", "content": "y", "id": "msg_2"}]});
        assert!(parse(once.to_string().as_bytes(), &ITEM_TYPES).is_ok());
    }

    #[test]
    fn pairing_errors_are_the_apis() {
        let orphan = error_of(json!({"model": "m", "input": [
            {"role": "user", "content": "x"},
            {"type": "function_call_output", "call_id": "call_9", "output": "r"}]}));
        assert_eq!(
            orphan["message"],
            "No tool call found for function call output with call_id call_9."
        );
        assert_eq!(orphan["param"], "input");
        let unanswered = error_of(json!({"model": "m", "input": [
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "x"}]}));
        assert_eq!(
            unanswered["message"],
            "No tool output found for function call call_1."
        );
        let wrong_kind = error_of(json!({"model": "m", "input": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "custom_tool_call_output", "call_id": "c", "output": "r"}]}));
        assert_eq!(
            wrong_kind["message"],
            "No tool call found for custom tool call output with call_id c."
        );
        let dangling = error_of(json!({"model": "m", "input": [
            {"role": "user", "content": "x"},
            {"type": "reasoning", "id": "rs_1", "summary": []}]}));
        assert!(dangling["message"]
            .as_str()
            .unwrap()
            .contains("without its required following item"));
    }

    #[test]
    fn reasoning_the_mock_wrote_must_come_back_unchanged() {
        let sealed = encrypted_content(&["mock", "7"]);
        let input = |content: &str| {
            json!({"model": "m", "input": [
                {"role": "user", "content": "x"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": content},
                {"role": "assistant", "content": "y"}]})
        };
        assert!(parse(input(&sealed).to_string().as_bytes(), &ITEM_TYPES).is_ok());
        let mut changed = sealed.clone();
        changed.replace_range(20..21, if &sealed[20..21] == "A" { "B" } else { "A" });
        let error = error_of(input(&changed));
        assert_eq!(error["code"], "invalid_encrypted_content");
        assert_eq!(error["param"], "input[1].encrypted_content");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .starts_with("The encrypted content for item rs_1 could not be verified."));
        let cut = error_of(input(&sealed[..100]));
        assert_eq!(cut["code"], "invalid_encrypted_content");
    }

    #[test]
    fn well_formed_inputs_pass() {
        let ok = json!({"model": "m", "input": [
            {"role": "developer", "content": "d"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB"},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": "b", "name": "apply_patch", "input": "p"},
            {"type": "function_call_output", "call_id": "a", "output": "r"},
            {"type": "custom_tool_call_output", "call_id": "b", "output": "ok"},
            {"type": "compaction", "encrypted_content": "gAAAABe"}]});
        assert!(parse(ok.to_string().as_bytes(), &ITEM_TYPES).is_ok());
        assert!(parse(br#"{"model":"m","input":"hi"}"#, &ITEM_TYPES).is_ok());
    }

    #[test]
    fn a_trigger_stands_last_and_only_the_apis_compaction_is_read() {
        let user = json!({"role": "user", "content": "x"});
        let trigger = json!({"type": "compaction_trigger"});
        assert!(parse(
            json!({"model": "m", "input": [user, trigger]})
                .to_string()
                .as_bytes(),
            &ITEM_TYPES
        )
        .is_ok());
        let misplaced = error_of(json!({"model": "m", "input": [trigger, user]}));
        assert_eq!(misplaced["param"], "input[0]");
        assert!(misplaced["message"]
            .as_str()
            .unwrap()
            .contains("final input item"));
        let twice = error_of(json!({"model": "m", "input": [user, trigger, trigger]}));
        assert_eq!(twice["param"], "input[1]");
        let foreign = error_of(json!({"model": "m", "input": [
            {"type": "compaction", "encrypted_content": "context-proxy.compaction.v1:ctx_x"}, user]}));
        assert_eq!(foreign["code"], "invalid_encrypted_content");
        assert!(is_compaction(&json!({"input": [user, trigger]})));
        assert!(!is_compaction(&json!({"input": [user]})));
    }

    #[test]
    fn unknown_types_tools_and_state_are_refused() {
        let unknown = error_of(json!({"model": "m", "input": [{"type": "context_compaction"}]}));
        assert_eq!(unknown["code"], "invalid_value");
        assert!(unknown["message"].as_str().unwrap().starts_with(
            "Invalid value: 'context_compaction'. Supported values are: 'additional_tools', 'apply_patch_call',"
        ));
        let nested = error_of(json!({"model": "m", "input": "x",
            "tools": [{"type": "function", "function": {"name": "f"}}]}));
        assert_eq!(nested["param"], "tools[0].name");
        let previous =
            error_of(json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}));
        assert_eq!(previous["code"], "previous_response_not_found");
        let reference =
            error_of(json!({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}));
        assert!(reference["message"]
            .as_str()
            .unwrap()
            .starts_with("Item with id 'msg_1' not found."));
        assert_eq!(error_of(json!({"input": "x"}))["param"], "model");
    }
}
