//! Counting Anthropic Messages without Claude's tokenizer, which is not public: the real BPE
//! (`o200k_base`) over what the model reads, times a calibration factor that errs high
//! (over-counting makes the proxy act a little early; under-counting makes the upstream refuse
//! the request and breaks Claude Code's own compaction). Each answer's `usage` gives the true
//! prompt size; [`Calibration`] turns it into the session's own factor, kept a margin above
//! what was measured. Pure: counts in, counts out.
//!
//! What is counted, per item of the Messages adapter (`adapter/messages.rs`): the text of
//! text, thinking and tool-result blocks, a tool call's name and input as JSON, an image or a
//! document as [`MEDIA_TOKENS`], any other block as its JSON; 3 tokens per message and 3 per
//! tool result; the tool definitions, as JSON, and 3 tokens priming the reply are outside the
//! items.

use std::borrow::Cow;

use serde_json::{json, Value};

use crate::tokens::{field, str_field, Encoding};

/// A block's `type`.
pub fn block_type(block: &Value) -> &str {
    str_field(block, "type").unwrap_or("")
}

/// The blocks of a `content`: a string is one text block (borrowed when it is an array).
pub fn blocks(content: Option<&Value>) -> Cow<'_, [Value]> {
    match content {
        Some(Value::Array(blocks)) => Cow::Borrowed(blocks.as_slice()),
        Some(Value::String(text)) => Cow::Owned(vec![json!({"type": "text", "text": text})]),
        _ => Cow::Owned(Vec::new()),
    }
}

/// The factor over the BPE count before any answer has been seen: Claude's tokenizers give
/// about 1.1–1.2 tokens per `o200k_base` token on code and prose; 1.25 errs high.
pub const DEFAULT_FACTOR: f64 = 1.25;
/// The margin kept above the factor measured from an answer's usage.
pub const MARGIN: f64 = 1.05;
/// Bounds of a learned factor (a usage figure outside them is not believed).
pub const FACTOR_RANGE: (f64, f64) = (0.8, 3.0);
/// Tokens of an image or a document block.
pub const MEDIA_TOKENS: usize = 1_600;
/// Tokens of each message's framing, and of each tool result's.
pub const FRAMING: usize = 3;
/// Tokens priming the reply.
pub const REPLY_PRIMING: usize = 3;

/// The tokenizer the estimate counts with.
pub const ENCODING: Encoding = Encoding::O200kBase;

/// A Messages request counted: the BPE figures before the factor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Raw {
    /// Each item's tokens.
    pub per_item: Vec<usize>,
    /// Tokens outside the items: tool definitions and the reply priming.
    pub fixed: usize,
}

impl Raw {
    pub fn total(&self) -> usize {
        self.per_item.iter().sum::<usize>() + self.fixed
    }
}

/// The BPE tokens of one content block.
pub fn block_tokens(block: &Value) -> usize {
    let count = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, |t| ENCODING.count(t));
    match block_type(block) {
        "text" => count(field(block, "text")),
        "thinking" => count(field(block, "thinking")),
        "redacted_thinking" => count(field(block, "data")),
        "tool_use" | "server_tool_use" => {
            count(field(block, "name"))
                + field(block, "input").map_or(0, |i| ENCODING.count(&i.to_string()))
        }
        "tool_result" => {
            FRAMING
                + blocks(field(block, "content"))
                    .iter()
                    .map(block_tokens)
                    .sum::<usize>()
        }
        "image" | "document" => MEDIA_TOKENS,
        _ => {
            let mut v = block.clone();
            if let Value::Object(map) = &mut v {
                map.remove("cache_control");
            }
            ENCODING.count(&v.to_string())
        }
    }
}

/// The BPE tokens of one message (or part of one), its framing included.
pub fn message_tokens(message: &Value) -> usize {
    content_tokens(field(message, "content")) + FRAMING
}

/// The BPE tokens of a `content` or `system` (a string or blocks), without framing.
pub fn content_tokens(content: Option<&Value>) -> usize {
    blocks(content).iter().map(block_tokens).sum()
}

/// The BPE tokens outside the items of `body`.
pub fn fixed_tokens(body: &Value) -> usize {
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .map_or(0, |tools| tool_tokens(tools));
    tools + REPLY_PRIMING
}

/// The BPE tokens of tool definitions, each as its JSON.
fn tool_tokens(tools: &[Value]) -> usize {
    tools.iter().map(|t| ENCODING.count(&t.to_string())).sum()
}

/// The estimate of what `tools` add to a request, in the units of the request's counts (the
/// default factor): the room the proxy keeps free for its own tools.
pub fn tools_estimate(tools: &[Value]) -> usize {
    scaled(tool_tokens(tools), DEFAULT_FACTOR)
}

/// `raw` tokens scaled by `factor`, rounded up.
pub fn scaled(raw: usize, factor: f64) -> usize {
    (raw as f64 * factor).ceil() as usize
}

/// The factor a conversation is counted with: the default until an answer's usage is seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub factor: f64,
    /// Whether the factor was learned from an answer.
    pub learned: bool,
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration {
            factor: DEFAULT_FACTOR,
            learned: false,
        }
    }
}

impl Calibration {
    /// The factor after an answer reported `actual` prompt tokens (input, cache writes and
    /// cache reads together) for a request of `raw` BPE tokens: the measured ratio plus the
    /// margin, within [`FACTOR_RANGE`]; a figure outside the range leaves the factor as it was.
    pub fn observe(self, raw: usize, actual: usize) -> Calibration {
        if raw == 0 || actual == 0 {
            return self;
        }
        let measured = actual as f64 / raw as f64;
        if !(FACTOR_RANGE.0..=FACTOR_RANGE.1).contains(&measured) {
            return self;
        }
        Calibration {
            factor: (measured * MARGIN).clamp(FACTOR_RANGE.0, FACTOR_RANGE.1),
            learned: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_block_counts() {
        let c = |t: &str| ENCODING.count(t);
        let user = json!({"role": "user", "content": [{"type": "text", "text": "read a"},
            {"type": "image", "source": {"type": "url", "url": "x"}}]});
        assert_eq!(message_tokens(&user), c("read a") + MEDIA_TOKENS + FRAMING);
        let assistant = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "ok", "signature": "s"},
            {"type": "tool_use", "id": "t", "name": "Read", "input": {"p": "a"}}]});
        assert_eq!(
            message_tokens(&assistant),
            c("ok") + c("Read") + c(r#"{"p":"a"}"#) + FRAMING
        );
        let result = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "hello"}]});
        assert_eq!(message_tokens(&result), c("hello") + 2 * FRAMING);
        assert_eq!(content_tokens(Some(&json!("Be brief."))), c("Be brief."));
        let body = json!({"tools": [{"name": "Read", "input_schema": {"type": "object"}}]});
        assert_eq!(
            fixed_tokens(&body),
            c(&body["tools"][0].to_string()) + REPLY_PRIMING
        );
    }

    #[test]
    fn the_factor_learns_from_usage_and_stays_high() {
        let c = Calibration::default();
        assert_eq!(scaled(100, c.factor), 125);
        let learned = c.observe(1_000, 1_100);
        assert!(learned.learned);
        assert!((learned.factor - 1.1 * MARGIN).abs() < 1e-9);
        assert!(scaled(1_000, learned.factor) >= 1_100);
        // A figure that cannot be true is not believed.
        assert_eq!(c.observe(1_000, 10), c);
        assert_eq!(c.observe(0, 10), c);
    }
}
