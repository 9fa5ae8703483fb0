//! What a Messages request costs, as the API reports it: its blocks in render order (tools,
//! system, messages), each counted, the conversation's running digest after each, and a prompt
//! cache that reads and writes at `cache_control` breakpoints the way Anthropic's does.
//!
//! Counting: there is no public Claude tokenizer, so the mock models one: the real `cl100k_base`
//! BPE (a tokenizer the proxy does not use for Claude, so its estimate is tested against a
//! different one) times [`CLAUDE_RATIO_PERCENT`] / 100, per block, rounded up — Claude's tokenizers give more
//! tokens than OpenAI's on the same text, by about 1.15× over `cl100k_base` in the heuristic
//! counters use (`docs/messages-wire.md`, "Counting") — plus 3 tokens per message and 3 for the
//! reply, and 1,600 per image or document.
//!
//! Caching: a breakpoint writes the prefix ending at its block (when it is at least
//! [`MIN_CACHEABLE`] tokens); a request reads the longest written prefix that ends at one of
//! its breakpoints or at one of the 20 blocks before each. A prefix is its content with every
//! `cache_control` left out, so moving a marker does not change what was cached, and any other
//! byte of content before it does. Entries never expire (the mock has no clock); the store is
//! bounded.

use std::borrow::Cow;
use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use context_proxy_tokens::Encoding;

/// The tokenizer standing in for Claude's.
pub const ENCODING: Encoding = Encoding::Cl100kBase;
/// Claude's tokens per [`ENCODING`] token, in hundredths (1.15×).
pub const CLAUDE_RATIO_PERCENT: usize = 115;

/// The tokens the modelled Claude tokenizer gives `text`.
pub fn claude_tokens(text: &str) -> usize {
    claude_of(ENCODING.count(text))
}

/// `bpe` tokens of [`ENCODING`] as Claude's, rounded up.
fn claude_of(bpe: usize) -> usize {
    (bpe * CLAUDE_RATIO_PERCENT).div_ceil(100)
}
/// Tokens every message costs besides its blocks.
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Tokens that prime the reply.
pub const TOKENS_PER_REPLY: usize = 3;
/// Tokens of an image or a document block.
pub const TOKENS_PER_MEDIA: usize = 1_600;
/// The shortest prefix the cache keeps.
pub const MIN_CACHEABLE: usize = 1_024;
/// How many blocks before a breakpoint the cache looks back for a hit.
pub const LOOKBACK: usize = 20;
/// Entries kept.
const MAX_ENTRIES: usize = 100_000;

/// The running digest of a conversation, block by block, `cache_control` left out.
#[derive(Clone)]
pub(crate) struct Prefix(Sha256);

impl Prefix {
    /// The digest of the request's `tools` and `system`, before any message.
    pub(crate) fn head(request: &Value) -> Prefix {
        let mut prefix = Prefix(Sha256::new());
        for tool in array(&request["tools"]) {
            prefix.block(tool);
        }
        prefix.0.update(b"\0system\0");
        for block in content_blocks(&request["system"]) {
            prefix.block(&block);
        }
        prefix
    }

    /// A message of `role` begins.
    pub(crate) fn role(&mut self, role: &str) {
        self.0.update(b"\0role\0");
        self.0.update(role.as_bytes());
    }

    /// One block, without its `cache_control`.
    pub(crate) fn block(&mut self, block: &Value) {
        self.0.update(b"\0block\0");
        match block {
            Value::Object(map) if map.contains_key("cache_control") => {
                let mut map = map.clone();
                map.remove("cache_control");
                self.0.update(Value::Object(map).to_string().as_bytes());
            }
            other => self.0.update(other.to_string().as_bytes()),
        }
    }

    pub(crate) fn digest(&self) -> [u8; 32] {
        self.0.clone().finalize().into()
    }
}

/// An array's elements (none when it is not an array).
pub(crate) fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// The blocks of a `content` or `system`: a string is one text block.
pub(crate) fn content_blocks(content: &Value) -> Vec<Cow<'_, Value>> {
    match content {
        Value::String(text) => vec![Cow::Owned(json!({"type": "text", "text": text}))],
        Value::Array(blocks) => blocks.iter().map(Cow::Borrowed).collect(),
        _ => Vec::new(),
    }
}

/// One block of a request in render order.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) tokens: usize,
    /// The digest of the prefix ending with this block.
    pub(crate) digest: [u8; 32],
    /// A breakpoint here, and whether its time to live is an hour.
    pub(crate) breakpoint: Option<bool>,
}

fn breakpoint(block: &Value) -> Option<bool> {
    let marker = block.get("cache_control")?;
    Some(marker["ttl"] == "1h")
}

/// The tokens of one content block.
pub(crate) fn block_tokens(block: &Value) -> usize {
    let count = |v: &Value| v.as_str().map_or(0, claude_tokens);
    match block["type"].as_str() {
        Some("text") => count(&block["text"]),
        Some("thinking") => count(&block["thinking"]),
        Some("redacted_thinking") => count(&block["data"]),
        Some("tool_use" | "server_tool_use") => {
            count(&block["name"]) + claude_tokens(&block["input"].to_string())
        }
        Some("tool_result") => {
            TOKENS_PER_MESSAGE
                + content_blocks(&block["content"])
                    .iter()
                    .map(|b| block_tokens(b))
                    .sum::<usize>()
        }
        Some("image" | "document") => TOKENS_PER_MEDIA,
        _ => claude_tokens(&block.to_string()),
    }
}

/// The request's blocks in render order.
pub(crate) fn blocks(request: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    let mut prefix = Prefix(Sha256::new());
    for tool in array(&request["tools"]) {
        prefix.block(tool);
        out.push(Block {
            tokens: claude_tokens(&tool.to_string()),
            digest: prefix.digest(),
            breakpoint: breakpoint(tool),
        });
    }
    prefix.0.update(b"\0system\0");
    for block in content_blocks(&request["system"]) {
        prefix.block(&block);
        out.push(Block {
            tokens: block_tokens(&block),
            digest: prefix.digest(),
            breakpoint: breakpoint(&block),
        });
    }
    for message in array(&request["messages"]) {
        prefix.role(message["role"].as_str().unwrap_or(""));
        let mut framing = TOKENS_PER_MESSAGE;
        for block in content_blocks(&message["content"]) {
            prefix.block(&block);
            out.push(Block {
                tokens: block_tokens(&block) + std::mem::take(&mut framing),
                digest: prefix.digest(),
                breakpoint: breakpoint(&block),
            });
        }
        if framing > 0 {
            out.push(Block {
                tokens: framing,
                digest: prefix.digest(),
                breakpoint: None,
            });
        }
    }
    out
}

/// The prompt tokens of a request.
pub(crate) fn prompt_tokens(blocks: &[Block]) -> usize {
    blocks.iter().map(|b| b.tokens).sum::<usize>() + TOKENS_PER_REPLY
}

/// What the cache did for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheUse {
    pub(crate) read: usize,
    pub(crate) created: usize,
    pub(crate) created_1h: usize,
}

/// The prompt cache of one mock.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    entries: Mutex<Entries>,
}

/// The written prefixes, and their order of writing (the oldest is forgotten first).
type Entries = (HashSet<[u8; 32]>, VecDeque<[u8; 32]>);

impl PromptCache {
    /// Reads the longest cached prefix of `blocks` and writes its breakpoints (`model` keys
    /// the cache, as each model has its own).
    pub(crate) fn serve(&self, model: &str, blocks: &[Block]) -> CacheUse {
        let key = |digest: &[u8; 32]| -> [u8; 32] {
            Sha256::digest([model.as_bytes(), b"\0", digest].concat()).into()
        };
        // Prefix tokens ending at each block.
        let ends: Vec<usize> = blocks
            .iter()
            .scan(0, |sum, b| {
                *sum += b.tokens;
                Some(*sum)
            })
            .collect();
        let breakpoints: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].breakpoint.is_some())
            .collect();
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut read = 0;
        for &at in &breakpoints {
            for i in (at.saturating_sub(LOOKBACK)..=at).rev() {
                if ends[i] >= MIN_CACHEABLE && entries.0.contains(&key(&blocks[i].digest)) {
                    read = read.max(ends[i]);
                    break;
                }
            }
        }
        let mut used = CacheUse {
            read,
            ..CacheUse::default()
        };
        for &at in &breakpoints {
            if ends[at] < MIN_CACHEABLE {
                continue;
            }
            let k = key(&blocks[at].digest);
            if entries.0.insert(k) {
                entries.1.push_back(k);
                if entries.1.len() > MAX_ENTRIES {
                    if let Some(old) = entries.1.pop_front() {
                        entries.0.remove(&old);
                    }
                }
            }
        }
        if let Some(&last) = breakpoints.last() {
            if ends[last] >= MIN_CACHEABLE && ends[last] > read {
                used.created = ends[last] - read;
                if blocks[last].breakpoint == Some(true) {
                    used.created_1h = used.created;
                }
            }
        }
        used
    }

    pub(crate) fn clear(&self) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.0.clear();
        entries.1.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tail: &str, marker_on_last: bool) -> Value {
        let long = "word ".repeat(1_500);
        let mut last = json!({"type": "text", "text": tail});
        if marker_on_last {
            last["cache_control"] = json!({"type": "ephemeral"});
        }
        json!({
            "system": [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [last]}],
        })
    }

    #[test]
    fn a_repeated_prefix_is_read_and_a_new_tail_written() {
        let cache = PromptCache::default();
        let first = blocks(&request("one", true));
        let used = cache.serve("m", &first);
        assert_eq!(used.read, 0);
        assert_eq!(used.created, first.iter().map(|b| b.tokens).sum::<usize>());
        // Same system, another question: the system prompt is read, the new tail written.
        let second = blocks(&request("two", true));
        let used = cache.serve("m", &second);
        assert_eq!(used.read, second[0].tokens);
        assert_eq!(used.created, second[1].tokens);
        // The very same request again: all read, nothing written.
        let used = cache.serve("m", &second);
        assert_eq!(used.read, second.iter().map(|b| b.tokens).sum::<usize>());
        assert_eq!(used.created, 0);
        // Another model has its own cache.
        assert_eq!(cache.serve("other", &second).read, 0);
    }

    #[test]
    fn markers_are_not_content_and_short_prefixes_are_not_cached() {
        let a = blocks(&request("x", true));
        let b = blocks(&request("x", false));
        assert_eq!(a[1].digest, b[1].digest);
        let cache = PromptCache::default();
        let short = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]});
        let short = blocks(&short);
        assert_eq!(cache.serve("m", &short), CacheUse::default());
        assert_eq!(cache.serve("m", &short), CacheUse::default());
    }
}
