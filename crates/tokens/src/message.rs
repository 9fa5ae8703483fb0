//! What the upstream bills for one chat-completions message: OpenAI's published per-message
//! formula plus documented estimates for the parts it does not cover. Pure functions of the
//! message, the encoding and the settings; no caching here (that is `cache.rs`).
//!
//! The formula, from OpenAI's cookbook "How to count tokens with tiktoken" (verified there
//! against the API's `usage.prompt_tokens` for gpt-4o, gpt-4o-mini, gpt-4 and gpt-3.5-turbo):
//! every message costs 3 tokens of framing plus the tokens of its role and content; a `name`
//! costs its tokens plus 1; the reply is primed with 3 more tokens per request. Beyond it:
//!
//! - content may be a string or an array of parts: `text` and `refusal` parts count their text;
//!   an `image_url`, `input_audio` or `file` part counts a fixed, configurable estimate
//!   (`CountSettings`), since its real cost depends on pixels or seconds we do not decode;
//! - each assistant tool call counts its function name, its `arguments` text (or a custom
//!   tool's `input`) and [`TOKENS_PER_TOOL_CALL`]; the legacy `function_call` counts the same;
//! - call ids (`tool_calls[].id`, `tool_call_id`) and `type` tags are not rendered into the
//!   prompt and count nothing; nor does a `name` on a `tool` message, a field the API's tool
//!   message does not have;
//! - `audio: {id}` on an assistant message (a reference to an earlier audio reply) counts the
//!   audio estimate;
//! - any other field counts the tokens of the strings and numbers inside it, so odd or
//!   vendor-specific input is counted for what is there rather than dropped; `null`, booleans
//!   and object keys count nothing. Nothing here panics, whatever the shape of the value.

use serde_json::{Map, Value};

use super::encoding::Encoding;
use super::json::{field, str_field};
use super::settings::CountSettings;

/// Framing tokens of every message (`<|start|>{role}<|message|>…<|end|>`).
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Extra token when a message carries a `name`.
pub const TOKENS_PER_NAME: usize = 1;
/// Tokens that prime the reply (`<|start|>assistant<|message|>`), once per request.
pub const REPLY_PRIMING: usize = 3;
/// Framing tokens of one assistant tool call on top of its name and arguments.
///
/// OpenAI does not publish this number. 5 reproduces the prompt count the API reported for a
/// recorded gpt-4 exchange (an assistant call to `get_current_weather` with arguments
/// `{"location": "Boston, MA"}`, and its tool result: 35 prompt tokens; see the counter's
/// tests), and agrees with the per-call overhead that independent client libraries fitted to
/// API counts for a single call.
pub const TOKENS_PER_TOOL_CALL: usize = 5;

/// Tokens the upstream bills for `message`, framing included (not the reply priming).
pub fn message_tokens(message: &Value, encoding: Encoding, settings: &CountSettings) -> usize {
    let Some(fields) = message.as_object() else {
        return TOKENS_PER_MESSAGE.saturating_add(leaf_tokens(message, encoding));
    };
    let is_tool = str_field(message, "role") == Some("tool");
    let mut total = TOKENS_PER_MESSAGE;
    for (key, value) in fields {
        let n = match key.as_str() {
            "content" => content_tokens(value, encoding, settings),
            "name" if is_tool => 0,
            "name" if value.is_string() => {
                leaf_tokens(value, encoding).saturating_add(TOKENS_PER_NAME)
            }
            "tool_calls" => match value {
                Value::Array(calls) => calls
                    .iter()
                    .map(|call| tool_call_tokens(call, encoding))
                    .fold(0, usize::saturating_add),
                other => leaf_tokens(other, encoding),
            },
            "function_call" => match value {
                Value::Object(function) => {
                    TOKENS_PER_TOOL_CALL.saturating_add(function_tokens(function, encoding))
                }
                other => leaf_tokens(other, encoding),
            },
            "audio" if value.is_object() => settings.audio_tokens,
            "tool_call_id" => 0,
            // role, refusal, and anything else: its strings and numbers.
            _ => leaf_tokens(value, encoding),
        };
        total = total.saturating_add(n);
    }
    total
}

/// Tokens of a message's `content`: a string, an array of parts, or null.
fn content_tokens(content: &Value, encoding: Encoding, settings: &CountSettings) -> usize {
    match content {
        Value::Array(parts) => parts
            .iter()
            .map(|part| part_tokens(part, encoding, settings))
            .fold(0, usize::saturating_add),
        other => part_tokens(other, encoding, settings),
    }
}

/// Tokens of one content part: its text, or a fixed estimate for media.
fn part_tokens(part: &Value, encoding: Encoding, settings: &CountSettings) -> usize {
    let Value::Object(fields) = part else {
        return leaf_tokens(part, encoding);
    };
    match str_field(part, "type") {
        Some("text") => field(part, "text").map_or(0, |t| leaf_tokens(t, encoding)),
        Some("refusal") => field(part, "refusal").map_or(0, |t| leaf_tokens(t, encoding)),
        Some("image_url") => {
            let detail = field(part, "image_url").and_then(|image| str_field(image, "detail"));
            if detail == Some("low") {
                settings.image_low_detail_tokens
            } else {
                settings.image_tokens
            }
        }
        Some("input_audio") => settings.audio_tokens,
        Some("file") => settings.file_tokens,
        _ => fields
            .iter()
            .filter(|(key, _)| key.as_str() != "type")
            .map(|(_, value)| leaf_tokens(value, encoding))
            .fold(0, usize::saturating_add),
    }
}

/// Tokens of one entry of an assistant's `tool_calls`.
fn tool_call_tokens(call: &Value, encoding: Encoding) -> usize {
    let Value::Object(fields) = call else {
        return TOKENS_PER_TOOL_CALL.saturating_add(leaf_tokens(call, encoding));
    };
    let mut total = TOKENS_PER_TOOL_CALL;
    for (key, value) in fields {
        let n = match (key.as_str(), value) {
            ("id" | "type" | "index", _) => 0,
            ("function" | "custom", Value::Object(function)) => function_tokens(function, encoding),
            (_, other) => leaf_tokens(other, encoding),
        };
        total = total.saturating_add(n);
    }
    total
}

/// Tokens of a called function: `{name, arguments}` (or a custom tool's `{name, input}`).
/// Arguments are JSON text on the wire; a client that sends an object instead is counted by
/// its compact JSON text.
fn function_tokens(function: &Map<String, Value>, encoding: Encoding) -> usize {
    function
        .iter()
        .map(|(key, value)| match (key.as_str(), value) {
            ("arguments" | "input", Value::Object(_) | Value::Array(_)) => {
                encoding.count(&value.to_string())
            }
            (_, other) => leaf_tokens(other, encoding),
        })
        .fold(0, usize::saturating_add)
}

/// Tokens of the strings and numbers inside `value`, recursively; object keys, booleans and
/// null count nothing.
pub fn leaf_tokens(value: &Value, encoding: Encoding) -> usize {
    match value {
        Value::String(s) => encoding.count(s),
        Value::Number(n) => encoding.count(&n.to_string()),
        Value::Array(items) => items
            .iter()
            .map(|v| leaf_tokens(v, encoding))
            .fold(0, usize::saturating_add),
        Value::Object(fields) => fields
            .values()
            .map(|v| leaf_tokens(v, encoding))
            .fold(0, usize::saturating_add),
        Value::Null | Value::Bool(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const O200K: Encoding = Encoding::O200kBase;

    fn count(message: Value) -> usize {
        message_tokens(&message, O200K, &CountSettings::default())
    }

    fn t(text: &str) -> usize {
        O200K.count(text)
    }

    #[test]
    fn overhead_arithmetic() {
        assert_eq!(
            count(json!({"role": "user", "content": "Hello there"})),
            3 + t("user") + t("Hello there")
        );
        assert_eq!(
            count(json!({"role": "system", "name": "example_user", "content": "Hi"})),
            3 + t("system") + t("example_user") + 1 + t("Hi")
        );
        // An empty message still pays its framing.
        assert_eq!(count(json!({})), 3);
        assert_eq!(count(json!({"role": "user", "content": ""})), 3 + t("user"));
    }

    #[test]
    fn content_parts() {
        let s = CountSettings {
            image_tokens: 1000,
            image_low_detail_tokens: 50,
            audio_tokens: 300,
            file_tokens: 2000,
            ..CountSettings::default()
        };
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/b.png", "detail": "high"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-abc123", "filename": "report.pdf"}},
        ]});
        assert_eq!(
            message_tokens(&m, O200K, &s),
            3 + t("user") + t("What is in this image?") + 1000 + 50 + 1000 + 300 + 2000
        );
        // The base64 payload of an image is never tokenized.
        let big = "A".repeat(100_000);
        let m = json!({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{big}")}}
        ]});
        assert_eq!(message_tokens(&m, O200K, &s), 3 + t("user") + 1000);
    }

    #[test]
    fn assistant_text_and_refusal_parts() {
        let m = json!({"role": "assistant", "content": [
            {"type": "text", "text": "Part one."},
            {"type": "refusal", "refusal": "I can't help with that."}
        ]});
        assert_eq!(
            count(m),
            3 + t("assistant") + t("Part one.") + t("I can't help with that.")
        );
        let m = json!({"role": "assistant", "content": null, "refusal": "No."});
        assert_eq!(count(m), 3 + t("assistant") + t("No."));
    }

    #[test]
    fn tool_calls_and_results() {
        let args = r#"{"path":"src/main.rs","offset":10}"#;
        let m = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "read_file", "arguments": args}},
            {"id": "call_def", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
            {"id": "call_ghi", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}
        ]});
        assert_eq!(
            count(m),
            3 + t("assistant")
                + (TOKENS_PER_TOOL_CALL + t("read_file") + t(args))
                + (TOKENS_PER_TOOL_CALL + t("grep") + t("{}"))
                + (TOKENS_PER_TOOL_CALL + t("apply_patch") + t("*** Begin Patch"))
        );
        // The id of the call a result answers is not billed.
        let r = json!({"role": "tool", "tool_call_id": "call_abc", "content": "fn main() {}"});
        assert_eq!(count(r), 3 + t("tool") + t("fn main() {}"));
        // Nor is a `name` on a tool message (the API's tool message has none).
        let r = json!({"role": "tool", "tool_call_id": "call_abc", "name": "read_file",
            "content": "fn main() {}"});
        assert_eq!(count(r), 3 + t("tool") + t("fn main() {}"));
        // Legacy function calling.
        let f = json!({"role": "assistant", "content": null,
            "function_call": {"name": "read_file", "arguments": args}});
        assert_eq!(
            count(f),
            3 + t("assistant") + TOKENS_PER_TOOL_CALL + t("read_file") + t(args)
        );
        // Arguments sent as an object rather than JSON text count as their JSON text.
        let o = json!({"role": "assistant", "tool_calls": [
            {"function": {"name": "grep", "arguments": {"pattern": "fn"}}}]});
        assert_eq!(
            count(o),
            3 + t("assistant") + TOKENS_PER_TOOL_CALL + t("grep") + t(r#"{"pattern":"fn"}"#)
        );
    }

    #[test]
    fn malformed_input_counts_what_is_there() {
        assert_eq!(count(json!(null)), 3);
        assert_eq!(count(json!("hello")), 3 + t("hello"));
        assert_eq!(count(json!(42)), 3 + t("42"));
        assert_eq!(count(json!([1, "two", null])), 3 + t("1") + t("two"));
        assert_eq!(count(json!({"content": "no role"})), 3 + t("no role"));
        assert_eq!(
            count(json!({"role": 7, "content": 12.5})),
            3 + t("7") + t("12.5")
        );
        assert_eq!(
            count(json!({"role": "user", "content": true})),
            3 + t("user")
        );
        assert_eq!(count(json!({"role": "user", "name": null})), 3 + t("user"));
        assert_eq!(
            count(json!({"role": "user", "content": {"type": "text", "text": "x"}})),
            3 + t("user") + t("x")
        );
        assert_eq!(
            count(
                json!({"role": "user", "content": [null, 3, "bare", {"type": "text"},
                {"type": "unknown", "data": "abc"}, {"no_type": ["deep", {"er": "yes"}]}]})
            ),
            3 + t("user") + t("3") + t("bare") + t("abc") + t("deep") + t("yes")
        );
        assert_eq!(
            count(json!({"role": "assistant", "tool_calls": "oops"})),
            3 + t("assistant") + t("oops")
        );
        assert_eq!(
            count(json!({"role": "assistant", "tool_calls": [null, "x", {"function": 3}]})),
            3 + t("assistant") + 3 * TOKENS_PER_TOOL_CALL + t("x") + t("3")
        );
        assert_eq!(
            count(json!({"role": "assistant", "function_call": "auto"})),
            3 + t("assistant") + t("auto")
        );
        assert_eq!(
            count(json!({"role": "assistant", "audio": null})),
            3 + t("assistant")
        );
        assert_eq!(
            count(json!({"role": "assistant", "audio": {"id": "audio_1"}})),
            3 + t("assistant") + CountSettings::default().audio_tokens
        );
        // Vendor extras are counted for their text.
        assert_eq!(
            count(json!({"role": "assistant", "content": "a", "reasoning_content": "because"})),
            3 + t("assistant") + t("a") + t("because")
        );
    }
}
