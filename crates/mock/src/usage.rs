//! The token numbers the mock reports and enforces, counted with the real BPE tokenizer of the
//! request's model.
//!
//! A request counts the text of every message (string content, `text`/`refusal` parts, `name`,
//! tool call names and arguments), 3 tokens per message, 3 for the reply primer, and the JSON text
//! of each tool schema. This is close to, not exactly, what OpenAI bills; what matters is that it
//! is real-BPE-based, so the proxy's own counts can be checked against it.

use serde_json::Value;
use sha2::{Digest, Sha256};

use context_proxy_tokens::Encoding;

/// Tokens every message costs besides its text.
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Tokens that prime the assistant's reply.
pub const TOKENS_PER_REPLY: usize = 3;

/// A chat-completions request's prefixes, in order, as (hash of the prefix, tokens up to its
/// end): the tools first, then each message. What OpenAI's prompt cache matches on (the mock's
/// model of it: `State::cache_prefixes`). The last one's tokens and [`TOKENS_PER_REPLY`] are
/// [`prompt_tokens`].
pub fn prompt_prefixes(request: &Value, encoding: Encoding) -> Vec<([u8; 32], usize)> {
    let mut hasher = Sha256::new();
    let mut total = 0;
    let mut out = Vec::new();
    let mut push = |text: &str, tokens: usize| {
        hasher.update(text.as_bytes());
        hasher.update([0]);
        total += tokens;
        out.push((hasher.clone().finalize().into(), total));
    };
    let tools = &request["tools"];
    push(&tools.to_string(), tools_tokens(tools, encoding));
    for message in request["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        push(
            &message.to_string(),
            TOKENS_PER_MESSAGE + message_tokens(message, encoding),
        );
    }
    out
}

fn tools_tokens(tools: &Value, encoding: Encoding) -> usize {
    tools
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|tool| encoding.count(&tool.to_string()))
        .sum()
}

/// Prompt tokens of a chat-completions request body.
pub fn prompt_tokens(request: &Value, encoding: Encoding) -> usize {
    let messages = request["messages"].as_array().map(Vec::as_slice);
    let in_messages: usize = messages
        .unwrap_or_default()
        .iter()
        .map(|message| TOKENS_PER_MESSAGE + message_tokens(message, encoding))
        .sum();
    let in_tools = tools_tokens(&request["tools"], encoding);
    in_messages + in_tools + TOKENS_PER_REPLY
}

fn message_tokens(message: &Value, encoding: Encoding) -> usize {
    let count = |v: &Value| v.as_str().map_or(0, |text| encoding.count(text));
    let content = match &message["content"] {
        Value::String(text) => encoding.count(text),
        Value::Array(parts) => parts
            .iter()
            .map(|part| count(&part["text"]) + count(&part["refusal"]))
            .sum(),
        _ => 0,
    };
    let calls: usize = message["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|call| {
            count(&call["function"]["name"])
                + count(&call["function"]["arguments"])
                + count(&call["custom"]["name"])
                + count(&call["custom"]["input"])
        })
        .sum();
    content + calls + count(&message["name"])
}

/// Completion tokens of an answer: its text plus each tool call's name and arguments text.
pub fn completion_tokens<'a>(
    content: Option<&str>,
    calls: impl IntoIterator<Item = (&'a str, &'a str)>,
    encoding: Encoding,
) -> usize {
    let text = content.map_or(0, |text| encoding.count(text));
    let calls: usize = calls
        .into_iter()
        .map(|(name, arguments)| encoding.count(name) + encoding.count(arguments))
        .sum();
    text + calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_every_kind_of_message_text() {
        let enc = Encoding::O200kBase;
        let request = json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hello there"},
                                             {"type": "image_url", "image_url": {"url": "x"}}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"rust\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Rust is a language."}
            ],
            "tools": [{"type": "function", "function": {"name": "lookup"}}]
        });
        let expected = enc.count("You are terse.")
            + enc.count("Hello there")
            + enc.count("lookup")
            + enc.count("{\"q\":\"rust\"}")
            + enc.count("Rust is a language.")
            + enc.count(&request["tools"][0].to_string())
            + 4 * TOKENS_PER_MESSAGE
            + TOKENS_PER_REPLY;
        assert_eq!(prompt_tokens(&request, enc), expected);
    }

    #[test]
    fn counts_with_real_bpe_not_a_byte_heuristic() {
        let enc = Encoding::O200kBase;
        let text = "上下文管理让长时间运行的代理永远不会耗尽上下文";
        let request = json!({"messages": [{"role": "user", "content": text}]});
        assert_eq!(prompt_tokens(&request, enc), enc.count(text) + 6);
        assert_ne!(enc.count(text), text.len() / 4);
    }

    #[test]
    fn missing_messages_count_only_the_primer() {
        assert_eq!(
            prompt_tokens(&json!({}), Encoding::O200kBase),
            TOKENS_PER_REPLY
        );
    }

    #[test]
    fn completion_counts_text_and_calls() {
        let enc = Encoding::Cl100kBase;
        let n = completion_tokens(Some("hi there"), [("f", "{\"a\":1}")], enc);
        assert_eq!(
            n,
            enc.count("hi there") + enc.count("f") + enc.count("{\"a\":1}")
        );
    }
}
