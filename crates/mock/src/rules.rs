//! The rules the Messages API holds a request to, each answered with the API's own 400 wording
//! (`docs/messages-wire.md`), so that a test sees a proxy's mistake the way a user would:
//!
//! - the required fields (`model`, `max_tokens` on `/v1/messages`, `messages`), known roles,
//!   the first message a `user` message;
//! - at most four `cache_control` breakpoints across tools, system and messages;
//! - every `tool_use` answered by `tool_result`s opening the very next message, and no
//!   `tool_result` answering anything else; a conversation with either needs `tools`;
//! - thinking blocks signed by the mock and unchanged: a changed one in the latest assistant
//!   message "cannot be modified"; elsewhere its signature is invalid; on the models with
//!   preserved thinking, a block whose conversation before it changed is "bound to a different
//!   conversation" unless the request asks to `drop_block`, which needs the beta
//!   [`BINDING_BETA`]: then such blocks are dropped, and the model reads (and signs its answer
//!   after) the conversation without them ([`read`]);
//! - with thinking on, the assistant message of an open tool loop starts with its thinking.

use std::collections::HashSet;

use serde_json::Value;

use super::anthropic::{signature, signature_halves};
use super::prompt_cache::{array, content_blocks, Prefix};

/// The most `cache_control` breakpoints a request may carry.
pub const MAX_BREAKPOINTS: usize = 4;

/// The models whose thinking signatures bind the conversation before them.
const PRESERVED_THINKING: [&str; 7] = [
    "claude-fable-5-2",
    "claude-mythos-5-2",
    "claude-fable-5-1",
    "claude-mythos-5-1",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
];

/// The beta without which `thinking.block_binding` is not a field of the request.
pub const BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";

/// Whether `model` binds thinking blocks to their prefix.
pub fn preserved_thinking(model: &str) -> bool {
    PRESERVED_THINKING.iter().any(|m| model.starts_with(m))
}

/// A thinking block reading `text`, signed as the mock signs the opening block of the answer to
/// `request` (for tests and sample traffic that build conversations the mock accepts).
pub fn signed_thinking(request: &Value, text: &str) -> Value {
    let mut prefix = Prefix::head(request);
    for message in array(&request["messages"]) {
        prefix.role(message["role"].as_str().unwrap_or(""));
        for block in content_blocks(&message["content"]) {
            prefix.block(&block);
        }
    }
    prefix.role("assistant");
    serde_json::json!({"type": "thinking", "thinking": text, "signature": signature(&prefix.digest(), text)})
}

/// Checks a `POST /v1/messages` body against the API's rules (what the mock answers with a
/// 400); the error is the API's message.
pub fn check_messages(request: &Value) -> Result<(), String> {
    check(request, Endpoint::Messages)
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Messages,
    CountTokens,
}

/// The request's thinking is on.
pub(crate) fn thinking_on(request: &Value) -> bool {
    matches!(
        request["thinking"]["type"].as_str(),
        Some("enabled" | "adaptive")
    )
}

/// Checks `request` sent with the betas of `anthropic-beta` (`betas`, each trimmed) and
/// returns the request as the model reads it: on a preserved-thinking model asked to
/// `drop_block`, without the thinking blocks bound to a different conversation (the model
/// signs its answer after that conversation). The error is the API's message for a 400.
pub(crate) fn read(request: &Value, endpoint: Endpoint, betas: &[&str]) -> Result<Value, String> {
    if request["thinking"].get("block_binding").is_some() && !betas.contains(&BINDING_BETA) {
        return Err("thinking.block_binding: Extra inputs are not permitted".into());
    }
    let dropped = check_dropping(request, endpoint)?;
    let mut read = request.clone();
    for (i, j) in dropped.into_iter().rev() {
        if let Some(Value::Array(blocks)) = read["messages"][i].get_mut("content") {
            blocks.remove(j);
        }
    }
    Ok(read)
}

/// Checks `request`; the error is the API's message for a 400 `invalid_request_error`.
pub(crate) fn check(request: &Value, endpoint: Endpoint) -> Result<(), String> {
    check_dropping(request, endpoint).map(|_| ())
}

/// [`check`], and the thinking blocks `drop_block` drops (message, block), in order.
fn check_dropping(request: &Value, endpoint: Endpoint) -> Result<Vec<(usize, usize)>, String> {
    let Value::Object(_) = request else {
        return Err("request body must be a JSON object".into());
    };
    let model = match &request["model"] {
        Value::String(model) => model.as_str(),
        Value::Null => return Err("model: Field required".into()),
        _ => return Err("model: Input should be a valid string".into()),
    };
    if endpoint == Endpoint::Messages {
        match &request["max_tokens"] {
            Value::Null => return Err("max_tokens: Field required".into()),
            v if v.as_u64().is_some_and(|n| n >= 1) => {}
            _ => return Err("max_tokens: Input should be greater than or equal to 1".into()),
        }
    }
    let messages = match &request["messages"] {
        Value::Array(messages) => messages,
        Value::Null => return Err("messages: Field required".into()),
        _ => return Err("messages: Input should be a valid list".into()),
    };
    for (i, message) in messages.iter().enumerate() {
        match message["role"].as_str() {
            // Claude Code sends a `system` message after the first user message.
            Some("user" | "assistant" | "system") => {}
            _ => {
                return Err(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant'"
                ))
            }
        }
        match &message["content"] {
            Value::String(_) => {}
            Value::Array(blocks) => {
                for (j, block) in blocks.iter().enumerate() {
                    if !block["type"].is_string() {
                        return Err(format!("messages.{i}.content.{j}.type: Field required"));
                    }
                }
            }
            _ => return Err(format!("messages.{i}.content: Field required")),
        }
    }
    match messages.first() {
        None => return Err("messages: at least one message is required".into()),
        Some(first) if first["role"] != "user" => {
            return Err("messages: first message must use the \"user\" role".into())
        }
        Some(_) => {}
    }
    breakpoints(request)?;
    tools_defined(request, messages)?;
    pairing(messages)?;
    thinking(request, model, messages)
}

fn breakpoints(request: &Value) -> Result<(), String> {
    let marked = |blocks: &[std::borrow::Cow<'_, Value>]| {
        blocks
            .iter()
            .filter(|b| b.get("cache_control").is_some())
            .count()
    };
    let mut found = array(&request["tools"])
        .iter()
        .filter(|t| t.get("cache_control").is_some())
        .count();
    found += marked(&content_blocks(&request["system"]));
    for message in array(&request["messages"]) {
        found += marked(&content_blocks(&message["content"]));
    }
    if found > MAX_BREAKPOINTS {
        return Err(format!(
            "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found \
             {found}."
        ));
    }
    Ok(())
}

/// A conversation holding `tool_use` or `tool_result` blocks needs `tools` (anthropics/
/// anthropic-sdk-python #494).
fn tools_defined(request: &Value, messages: &[Value]) -> Result<(), String> {
    if !array(&request["tools"]).is_empty() {
        return Ok(());
    }
    let uses_tools = messages.iter().any(|m| {
        content_blocks(&m["content"])
            .iter()
            .any(|b| matches!(block_type(b), "tool_use" | "tool_result"))
    });
    if uses_tools {
        return Err(
            "Requests which include `tool_use` or `tool_result` blocks must define tools.".into(),
        );
    }
    Ok(())
}

fn block_type(block: &Value) -> &str {
    block["type"].as_str().unwrap_or("")
}

fn pairing(messages: &[Value]) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let blocks = content_blocks(&message["content"]);
        if message["role"] == "assistant" {
            if !open.is_empty() {
                return Err(unanswered(i - 1, &open));
            }
            open = blocks
                .iter()
                .filter(|b| block_type(b) == "tool_use")
                .filter_map(|b| b["id"].as_str())
                .map(str::to_string)
                .collect();
            continue;
        }
        // The results open the message, one per call.
        let results: Vec<&Value> = blocks
            .iter()
            .map(|b| b.as_ref())
            .take_while(|b| block_type(b) == "tool_result")
            .collect();
        if !open.is_empty() {
            let answered: HashSet<&str> = results
                .iter()
                .filter_map(|r| r["tool_use_id"].as_str())
                .collect();
            let missing: Vec<String> = open
                .iter()
                .filter(|id| !answered.contains(id.as_str()))
                .cloned()
                .collect();
            if results.is_empty() {
                return Err(format!(
                    "messages.{i}: Did not find {} tool_result block(s) at the beginning of \
                     this message. Messages following tool_use blocks must begin with a \
                     matching number of tool_result blocks.",
                    open.len()
                ));
            }
            if !missing.is_empty() {
                return Err(unanswered(i - 1, &missing));
            }
        }
        for (j, block) in blocks.iter().enumerate() {
            if block_type(block) != "tool_result" {
                continue;
            }
            let id = block["tool_use_id"].as_str().unwrap_or("");
            if j >= results.len() || !open.iter().any(|o| o == id) {
                return Err(format!(
                    "messages.{i}.content.{j}: unexpected `tool_use_id` found in \
                     `tool_result` blocks: {id}. Each `tool_result` block must have a \
                     corresponding `tool_use` block in the previous message."
                ));
            }
        }
        open.clear();
    }
    Ok(())
}

fn unanswered(i: usize, ids: &[String]) -> String {
    format!(
        "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately \
         after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the \
         next message.",
        ids.join(", ")
    )
}

/// The thinking rules; the blocks `drop_block` drops (their prefix changed), which are then not
/// part of the prefix of any later block.
fn thinking(
    request: &Value,
    model: &str,
    messages: &[Value],
) -> Result<Vec<(usize, usize)>, String> {
    let preserved = preserved_thinking(model);
    let drop_block =
        request["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block";
    let mut dropped = Vec::new();
    let latest_assistant = messages.iter().rposition(|m| m["role"] == "assistant");
    let mut prefix = Prefix::head(request);
    for (i, message) in messages.iter().enumerate() {
        prefix.role(message["role"].as_str().unwrap_or(""));
        for (j, block) in content_blocks(&message["content"]).iter().enumerate() {
            if block_type(block) == "thinking" {
                let at = format!("messages.{i}.content.{j}");
                let Some(given) = block["signature"].as_str() else {
                    return Err(format!("{at}.signature: Field required"));
                };
                let text = block["thinking"].as_str().unwrap_or("");
                let expected = signature(&prefix.digest(), text);
                let (Some((text_half, prefix_half)), Some((want_text, want_prefix))) =
                    (signature_halves(given), signature_halves(&expected))
                else {
                    return Err(format!("{at}: Invalid `signature` in `thinking` block."));
                };
                if text_half != want_text {
                    if Some(i) == latest_assistant {
                        return Err(format!(
                            "{at}: `thinking` or `redacted_thinking` blocks in the latest \
                             assistant message cannot be modified. These blocks must remain \
                             as they were in the original response."
                        ));
                    }
                    return Err(format!("{at}: Invalid `signature` in `thinking` block."));
                }
                if preserved && prefix_half != want_prefix && drop_block {
                    dropped.push((i, j));
                    continue;
                }
                if preserved && prefix_half != want_prefix {
                    return Err(format!(
                        "{at}: Invalid `signature` in `thinking` block. The block is bound to \
                         a different conversation. Remove the block, or set \
                         `thinking.block_binding.prefix_mismatch_behavior` to \"drop_block\"."
                    ));
                }
            }
            prefix.block(block);
        }
    }
    // With thinking on, the assistant message answered by the final tool results opens with
    // its thinking.
    let last = messages.len() - 1;
    let loop_open = messages[last]["role"] == "user"
        && content_blocks(&messages[last]["content"])
            .first()
            .is_some_and(|b| block_type(b) == "tool_result");
    if thinking_on(request) && loop_open && last > 0 {
        let assistant = content_blocks(&messages[last - 1]["content"]);
        let first = assistant.first().map_or("", |b| block_type(b));
        if !matches!(first, "thinking" | "redacted_thinking") {
            return Err(format!(
                "messages.{}.content.0.type: Expected `thinking` or `redacted_thinking`, but \
                 found `{first}`. When `thinking` is enabled, a final `assistant` message must \
                 start with a thinking block (preceeding the lastmost set of `tool_use` and \
                 `tool_result` blocks). We recommend you include thinking blocks from previous \
                 turns. To avoid this requirement, disable `thinking`. Please consult our \
                 documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking",
                last - 1
            ));
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn signed(request: &Value, i: usize, text: &str) -> Value {
        let messages = array(&request["messages"]);
        let mut prefix = Prefix::head(request);
        for m in &messages[..i] {
            prefix.role(m["role"].as_str().unwrap());
            for b in content_blocks(&m["content"]) {
                prefix.block(&b);
            }
        }
        prefix.role("assistant");
        json!({"type": "thinking", "thinking": text, "signature": signature(&prefix.digest(), text)})
    }

    fn conversation(model: &str) -> Value {
        let mut request = json!({
            "model": model, "max_tokens": 100,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": []},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a b"}]},
                {"role": "assistant", "content": []},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "c"}]},
            ]
        });
        for (i, id) in [(1, "toolu_1"), (3, "toolu_2")] {
            let thought = signed(&request, i, "hmm");
            request["messages"][i]["content"] = json!([thought,
                {"type": "tool_use", "id": id, "name": "ls", "input": {}}]);
        }
        request
    }

    #[test]
    fn a_well_formed_conversation_passes() {
        check(&conversation("claude-sonnet-4-5"), Endpoint::Messages).unwrap();
        check(&conversation("claude-opus-5-5"), Endpoint::Messages).unwrap();
    }

    #[test]
    fn each_rule_gives_the_apis_error() {
        type Change = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Change, &str)> = vec![
            (
                Box::new(|r| r["max_tokens"] = Value::Null),
                "max_tokens: Field required",
            ),
            (
                Box::new(|r| r["messages"][0]["role"] = "assistant".into()),
                "first message must use the \"user\" role",
            ),
            (
                Box::new(|r| {
                    r["system"] = json!([{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]);
                    for (i, id) in [(2, "toolu_1"), (4, "toolu_2")] {
                        r["messages"][i]["content"] = json!([{"type": "tool_result",
                            "tool_use_id": id, "content": "c",
                            "cache_control": {"type": "ephemeral"}}]);
                    }
                    r["messages"][0]["content"] = json!([{"type": "text", "text": "q",
                        "cache_control": {"type": "ephemeral"}}]);
                    r["tools"] = json!([{"name": "ls", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]);
                }),
                "A maximum of 4 blocks with cache_control may be provided. Found 5.",
            ),
            (
                Box::new(|r| r["messages"][2]["content"][0]["tool_use_id"] = "toolu_9".into()),
                "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
            ),
            (
                Box::new(|r| {
                    r["messages"][4]["content"] = json!([{"type": "text", "text": "x"}, r["messages"][4]["content"][0].clone()])
                }),
                "messages.4: Did not find 1 tool_result block(s)",
            ),
            (
                Box::new(|r| {
                    r["messages"][0]["content"] =
                        json!([{"type": "tool_result", "tool_use_id": "toolu_0", "content": "x"}])
                }),
                "unexpected `tool_use_id` found in `tool_result` blocks: toolu_0",
            ),
            (
                Box::new(|r| {
                    r.as_object_mut().unwrap().remove("tools");
                }),
                "Requests which include `tool_use` or `tool_result` blocks must define tools.",
            ),
            (
                Box::new(|r| r["messages"][3]["content"][0]["thinking"] = "hmm.".into()),
                "blocks in the latest assistant message cannot be modified",
            ),
            (
                Box::new(|r| r["messages"][1]["content"][0]["thinking"] = "hmm.".into()),
                "messages.1.content.0: Invalid `signature` in `thinking` block.",
            ),
            (
                Box::new(|r| {
                    let content = r["messages"][3]["content"].as_array_mut().unwrap();
                    content.remove(0);
                }),
                "Expected `thinking` or `redacted_thinking`, but found `tool_use`",
            ),
        ];
        for (change, wanted) in cases {
            let mut request = conversation("claude-sonnet-4-5");
            change(&mut request);
            let error = check(&request, Endpoint::Messages).unwrap_err();
            assert!(error.contains(wanted), "{error}\nwanted: {wanted}");
        }
    }

    #[test]
    fn preserved_thinking_binds_the_prefix() {
        let mut request = conversation("claude-opus-5-5");
        // An earlier tool result shortened: the later thinking block no longer matches.
        request["messages"][2]["content"][0]["content"] = "a".into();
        let error = check(&request, Endpoint::Messages).unwrap_err();
        assert!(
            error.starts_with("messages.3.content.0: Invalid `signature`"),
            "{error}"
        );
        assert!(
            error.contains("bound to a different conversation"),
            "{error}"
        );
        // Older models, or drop_block: accepted.
        let mut older = conversation("claude-sonnet-4-5");
        older["messages"][2]["content"][0]["content"] = "a".into();
        check(&older, Endpoint::Messages).unwrap();
        request["thinking"]["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
        check(&request, Endpoint::Messages).unwrap();
        // Moving a cache marker is not an edit.
        let mut marked = conversation("claude-opus-5-5");
        marked["messages"][2]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        check(&marked, Endpoint::Messages).unwrap();
    }

    /// `drop_block` is a field of the beta only; the blocks it drops are not read, nor part of
    /// the prefix later blocks and the answer are signed after.
    #[test]
    fn drop_block_needs_its_beta_and_really_drops() {
        let mut request = conversation("claude-opus-5-5");
        request["messages"][2]["content"][0]["content"] = "a".into();
        request["thinking"]["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
        let error = read(
            &request,
            Endpoint::Messages,
            &["interleaved-thinking-2025-05-14"],
        )
        .unwrap_err();
        assert_eq!(
            error,
            "thinking.block_binding: Extra inputs are not permitted"
        );
        let seen = read(&request, Endpoint::Messages, &[BINDING_BETA]).unwrap();
        assert_eq!(seen["messages"][3]["content"][0]["type"], "tool_use");
        assert_eq!(seen["messages"][1]["content"][0]["type"], "thinking");
        // An answer signed after what was read is valid next time only with the block
        // dropped again: without drop_block the stale block is refused.
        let mut next = request.clone();
        let answer = signed_thinking(&seen, "next");
        next["messages"][4]["content"] =
            json!([{"type": "tool_result", "tool_use_id": "toolu_2", "content": "c"}]);
        next["messages"].as_array_mut().unwrap().extend([
            json!({"role": "assistant", "content": [answer, {"type": "tool_use", "id": "toolu_3", "name": "ls", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "d"}]}),
        ]);
        read(&next, Endpoint::Messages, &[BINDING_BETA]).unwrap();
        next["thinking"]
            .as_object_mut()
            .unwrap()
            .remove("block_binding");
        let error = check(&next, Endpoint::Messages).unwrap_err();
        assert!(
            error.contains("bound to a different conversation"),
            "{error}"
        );
        // Same body, the stale block removed by the sender: the answer's block is valid.
        next["messages"][3]["content"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        check(&next, Endpoint::Messages).unwrap();
    }
}
