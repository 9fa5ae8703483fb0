//! The Anthropic Messages adapter (`POST /v1/messages`, `docs/messages-wire.md`).
//!
//! Items: `system` (when present) is the `Instructions` item; each message is one item
//! (`assistant`: a `ToolCalls` item naming its `tool_use` ids, else `Assistant`; `user`: a
//! `User` turn; a `system`-role message, as Claude Code sends one, `Instructions`), except a
//! user message that opens with `tool_result` blocks: each of those is a `ToolResult` item and
//! the blocks after them, if any, one `User` item. So an assistant message with its calls and
//! the results opening the next message are one unit, and everything an assistant message holds
//! (`thinking`, `redacted_thinking`, `server_tool_use` with its result block) moves with it, never
//! rewritten. The text the engine may shorten is a `tool_result`'s `content` (a string or only
//! text blocks) or a user turn's text.
//!
//! Each payload carries its origin under [`ORIGIN`] (which message, which item, whether it is
//! part of a split message), so the decision is written back message by message: a message
//! whose items all came back unchanged is copied from the original bytes
//! ([`splice`](super::splice)), only the others are serialized ([`write_bytes`]). Writing back
//! also keeps the API's rules the engine does not know:
//!
//! - `cache_control` breakpoints stay with the block they mark or go with it, never more than
//!   the request had (and so never over four when it had at most four);
//! - thinking blocks are never modified; on models whose thinking signatures bind the
//!   conversation before them, an edit before a thinking block invalidates it and every later
//!   one, and with thinking on every answer's thinking is signed after what the request
//!   forwarded, so a change must then be repeated by every later request, tool loops
//!   included. So on such a model a change is made with
//!   `thinking.block_binding.prefix_mismatch_behavior: "drop_block"` when the client's betas
//!   allow it; with thinking off, only where no tool loop is open and the latest assistant
//!   message is after it without thinking, removing the invalidated blocks; a decision that
//!   repeats what the conversation's last request forwarded is no edit
//!   ([`WriteRules::repeats_forwarded`]); otherwise the request goes unmanaged, with the
//!   reason;
//! - a block type the adapter does not know, in a message that would change or move, leaves
//!   the request unmanaged, with the reason.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::{json, Map, Value};

use super::scan;
use super::{splice, Adapter, Piece, Readable, Spans};
use crate::context::estimate::{self, scaled, DEFAULT_FACTOR};
pub use crate::context::estimate::{block_type, blocks};
use crate::context::model::{Binding, Kind};
use crate::tokens::{field, stable_hash, str_field, Counter, RequestCount};

/// The key under which a payload carries its origin; never sent upstream.
pub const ORIGIN: &str = "__context_proxy_origin";

/// Block types the adapter knows: anything else in a span that would change leaves the
/// request unmanaged.
const KNOWN_BLOCKS: [&str; 19] = [
    "text",
    "image",
    "document",
    "search_result",
    "tool_result",
    "tool_use",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
    "tool_reference",
];

/// The most `cache_control` breakpoints a request may carry.
pub const MAX_BREAKPOINTS: usize = 4;

/// Anthropic Messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

/// Where a payload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The request's `system`.
    System,
    /// Item `item` of the payloads, from message `message`; `part` when the message was split.
    Message {
        message: usize,
        item: usize,
        part: bool,
    },
}

fn origin(payload: &Value) -> Option<Origin> {
    match field(payload, ORIGIN)? {
        Value::String(s) if s == "system" => Some(Origin::System),
        o => Some(Origin::Message {
            message: o.get("m")?.as_u64()? as usize,
            item: o.get("i")?.as_u64()? as usize,
            part: o.get("part").and_then(Value::as_bool).unwrap_or(false),
        }),
    }
}

fn with_origin(mut value: Value, origin: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.insert(ORIGIN.into(), origin);
    }
    value
}

/// `payload` without its origin: the message or block as the wire knows it.
pub fn without_origin(payload: &Value) -> Value {
    let mut v = payload.clone();
    if let Value::Object(map) = &mut v {
        map.remove(ORIGIN);
    }
    v
}

/// How many leading blocks of a user message are `tool_result`s.
fn leading_results(message: &Value) -> usize {
    match field(message, "content") {
        Some(Value::Array(blocks)) => blocks
            .iter()
            .take_while(|b| block_type(b) == "tool_result")
            .count(),
        _ => 0,
    }
}

/// The text of a `content` that is a string or made only of text blocks (joined by newlines).
fn content_text(content: Option<&Value>) -> Option<Cow<'_, str>> {
    match content? {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Array(blocks) if !blocks.is_empty() => {
            let texts: Option<Vec<&str>> = blocks
                .iter()
                .map(|b| match block_type(b) {
                    "text" => str_field(b, "text"),
                    _ => None,
                })
                .collect();
            let texts = texts?;
            match texts.as_slice() {
                [one] => Some(Cow::Borrowed(one)),
                _ => Some(Cow::Owned(texts.join("\n"))),
            }
        }
        _ => None,
    }
}

/// `content` replaced by `text`: a string stays a string; text blocks become one text block
/// carrying the last one's `cache_control`, so a breakpoint stays with what it marked.
fn content_with_text(content: Option<&Value>, text: String) -> Value {
    match content {
        Some(Value::Array(blocks)) => {
            let mut block = Map::new();
            block.insert("type".into(), "text".into());
            block.insert("text".into(), text.into());
            if let Some(marker) = blocks.iter().rev().find_map(|b| field(b, "cache_control")) {
                block.insert("cache_control".into(), marker.clone());
            }
            Value::Array(vec![Value::Object(block)])
        }
        _ => Value::String(text),
    }
}

/// The request's `cache_control` breakpoints: in tools, system blocks and message blocks.
pub fn breakpoints(body: &Value) -> usize {
    let marked = |blocks: &[Value]| {
        blocks
            .iter()
            .filter(|b| field(b, "cache_control").is_some())
            .count()
    };
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .map_or(0, |t| marked(t));
    let system = marked(&blocks(body.get("system")));
    let messages: usize = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |ms| {
            ms.iter()
                .map(|m| marked(&blocks(field(m, "content"))))
                .sum()
        });
    tools + system + messages
}

impl Adapter for Messages {
    fn name(&self) -> &'static str {
        "messages"
    }

    /// The estimate of `crate::context::estimate` (there is no public Claude tokenizer): the
    /// BPE times the default factor, which errs high.
    fn count(&self, counter: &Counter, body: &Value) -> RequestCount {
        let payloads = self.payloads(body).unwrap_or_default();
        let per_message: Vec<usize> = payloads
            .iter()
            .map(|p| self.count_item(counter, p))
            .collect();
        let message_hashes = payloads.iter().map(stable_hash).collect();
        let fixed = scaled(estimate::fixed_tokens(body), DEFAULT_FACTOR);
        RequestCount {
            total: per_message.iter().sum::<usize>() + fixed,
            per_message,
            message_hashes,
            tools: fixed,
            response_format: 0,
        }
    }

    fn count_item(&self, _counter: &Counter, item: &Value) -> usize {
        let raw = match origin(item) {
            // `system` is not a message: no framing.
            Some(Origin::System) => estimate::content_tokens(field(item, "content")),
            _ => estimate::message_tokens(item),
        };
        scaled(raw, DEFAULT_FACTOR)
    }

    fn payloads<'b>(&self, body: &'b Value) -> Option<Cow<'b, [Value]>> {
        let messages = body.get("messages")?.as_array()?;
        let mut out = Vec::with_capacity(messages.len() + 1);
        match body.get("system") {
            None | Some(Value::Null) => {}
            Some(system) => {
                out.push(json!({"role": "system", "content": system, ORIGIN: "system"}))
            }
        }
        for (m, message) in messages.iter().enumerate() {
            let results = if str_field(message, "role") == Some("user") {
                leading_results(message)
            } else {
                0
            };
            if results == 0 {
                let i = out.len();
                out.push(with_origin(message.clone(), json!({"m": m, "i": i})));
                continue;
            }
            let blocks = message["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut rest = message.clone();
            for block in &blocks[..results] {
                let i = out.len();
                let mut part = rest.clone();
                part["content"] = json!([block]);
                out.push(with_origin(part, json!({"m": m, "i": i, "part": true})));
            }
            if blocks.len() > results {
                let i = out.len();
                rest["content"] = Value::Array(blocks[results..].to_vec());
                out.push(with_origin(rest, json!({"m": m, "i": i, "part": true})));
            }
        }
        Some(Cow::Owned(out))
    }

    fn kind<'v>(&self, item: &'v Value) -> Kind<'v> {
        if !item.is_object() {
            return Kind::Invalid;
        }
        let content = field(item, "content");
        match str_field(item, "role") {
            Some("system") => Kind::Instructions,
            Some("assistant") => {
                let ids: Vec<&str> = match content {
                    Some(Value::Array(blocks)) => blocks
                        .iter()
                        .filter(|b| block_type(b) == "tool_use")
                        .filter_map(|b| str_field(b, "id"))
                        .collect(),
                    _ => Vec::new(),
                };
                if ids.is_empty() {
                    Kind::Assistant
                } else {
                    Kind::ToolCalls(ids)
                }
            }
            Some("user") => match content {
                Some(Value::Array(blocks))
                    if blocks.len() == 1
                        && block_type(&blocks[0]) == "tool_result"
                        && matches!(origin(item), Some(Origin::Message { part: true, .. })) =>
                {
                    Kind::ToolResult(str_field(&blocks[0], "tool_use_id").unwrap_or(""))
                }
                _ => Kind::User,
            },
            Some(_) => Kind::Opaque(Binding::Free),
            None => Kind::Invalid,
        }
    }

    fn text<'v>(&self, item: &'v Value) -> Option<Cow<'v, str>> {
        match self.kind(item) {
            Kind::ToolResult(_) => content_text(field(&item["content"][0], "content")),
            Kind::User | Kind::Assistant => content_text(field(item, "content")),
            _ => None,
        }
    }

    fn whole_text<'v>(&self, item: &'v Value) -> Option<&'v str> {
        match self.kind(item) {
            Kind::ToolResult(_) => str_field(&item["content"][0], "content"),
            Kind::User => str_field(item, "content"),
            _ => None,
        }
    }

    fn with_text(&self, item: &Value, text: String) -> Value {
        let mut new = item.clone();
        match self.kind(item) {
            Kind::ToolResult(_) => {
                let block = &mut new["content"][0];
                let replaced = content_with_text(field(block, "content"), text);
                block["content"] = replaced;
            }
            _ => {
                let replaced = content_with_text(field(item, "content"), text);
                new["content"] = replaced;
            }
        }
        new
    }

    fn marker(&self, text: String) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": text}]})
    }

    fn line(&self, item: &Value) -> String {
        without_origin(item).to_string()
    }

    /// Text and tool results (`(result of id)`) as its text, tool calls as its calls
    /// (`id name(input)`); thinking is left out (the model's own reasoning is not the
    /// conversation).
    fn readable<'v>(&self, item: &'v Value) -> Readable<'v> {
        let mut lines = Vec::new();
        let mut calls = Vec::new();
        for block in blocks(field(item, "content")).iter() {
            match block_type(block) {
                "text" => lines.push(str_field(block, "text").unwrap_or("").to_string()),
                "tool_use" | "server_tool_use" | "mcp_tool_use" => calls.push(format!(
                    "{} {}({})",
                    str_field(block, "id").unwrap_or(""),
                    str_field(block, "name").unwrap_or(""),
                    field(block, "input")
                        .map(Value::to_string)
                        .unwrap_or_default()
                )),
                "tool_result" => lines.push(format!(
                    "(result of {})\n{}",
                    str_field(block, "tool_use_id").unwrap_or(""),
                    content_text(field(block, "content")).unwrap_or_default()
                )),
                "thinking" | "redacted_thinking" => {}
                other => lines.push(format!("[{other} block]")),
            }
        }
        Readable {
            who: Cow::Borrowed(str_field(item, "role").unwrap_or("user")),
            answers: None,
            text: (!lines.is_empty()).then(|| Cow::Owned(lines.join("\n"))),
            calls,
        }
    }

    fn spans(&self, raw: &[u8]) -> Option<Spans> {
        let list = scan::member(raw, b"messages")?;
        let items = scan::elements(raw, list.clone())?;
        Some(Spans { list, items })
    }

    fn write(&self, body: &mut Value, items: Vec<Value>) {
        let messages = regroup(&items)
            .into_iter()
            .map(|group| group.value)
            .collect();
        if let Some(slot) = body.get_mut("messages") {
            *slot = Value::Array(messages);
        }
    }
}

/// One message of the new conversation: the items it is made of.
struct Group {
    /// The original message, when its items came from one.
    message: Option<usize>,
    /// Its items: the payload each came from (if any) and its index among the new items.
    items: Vec<(Option<usize>, usize)>,
    value: Value,
}

/// The new items as messages: consecutive parts of one split message join again; the
/// `system` item is not a message.
fn regroup(items: &[Value]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::with_capacity(items.len());
    for (at, item) in items.iter().enumerate() {
        let o = origin(item);
        if o == Some(Origin::System) {
            continue;
        }
        let clean = without_origin(item);
        match (o, groups.last_mut()) {
            (
                Some(Origin::Message {
                    message,
                    item: i,
                    part: true,
                }),
                Some(last),
            ) if last.message == Some(message) => {
                last.items.push((Some(i), at));
                if let (Some(Value::Array(into)), Some(Value::Array(from))) =
                    (last.value.get_mut("content"), clean.get("content"))
                {
                    into.extend(from.iter().cloned());
                }
            }
            (
                Some(Origin::Message {
                    message, item: i, ..
                }),
                _,
            ) => groups.push(Group {
                message: Some(message),
                items: vec![(Some(i), at)],
                value: clean,
            }),
            _ => groups.push(Group {
                message: None,
                items: vec![(None, at)],
                value: clean,
            }),
        }
    }
    groups
}

/// What writing a decision back needs to know besides the items.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteRules {
    /// The model binds each thinking block's signature to the conversation before it
    /// ([`binds_thinking`]).
    pub binds_thinking: bool,
    /// The client's betas allow `thinking.block_binding.prefix_mismatch_behavior` (or the
    /// request already asks for `drop_block`).
    pub drop_block_allowed: bool,
    /// The decision repeats what the previous request of the conversation forwarded before the
    /// model's last answer (the engine rewrote nothing it had sent: `Report::rewrote_prefix`
    /// is false), so every thinking block the client sends back was signed after those very
    /// changes: a change there that the client's bytes do not have (a tool result truncated
    /// when it was new, compacted since) is what the upstream saw, not an edit. Only a new
    /// edit invalidates thinking blocks.
    pub repeats_forwarded: bool,
}

/// A decision written back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The new body.
    pub body: Vec<u8>,
    /// Thinking blocks removed because the edit before them invalidated them.
    pub thinking_removed: usize,
    /// `drop_block` was asked for on the client's behalf.
    pub drop_block: bool,
    /// Changes the decision made before a thinking block were held back (a model binding
    /// thinking to its prefix, inside a tool loop, without `drop_block`): only what follows
    /// the last thinking block changed ([`super::messages_bound::write_bound`]).
    pub held_back: bool,
}

/// Why a decision cannot be written back: the request goes out as it came.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmanaged {
    #[error("unknown content block `{0}` in a message that would change")]
    UnknownBlock(String),
    #[error("an edit before the latest assistant message would invalidate its thinking signature")]
    LatestThinking,
    #[error("an edit before a thinking block inside an open tool loop would invalidate it")]
    OpenToolLoop,
    #[error("the model binds thinking to the conversation before it and the client's betas do not allow drop_block: a change now would invalidate the thinking of every later turn")]
    BoundThinking,
    #[error("the body's messages could not be located in its bytes")]
    NoSpans,
    #[error("the decision does not line up with the request's items")]
    Misaligned,
}

/// Whether `model` binds thinking signatures to the conversation before them (preserved
/// thinking): every model but the known older families, so that a new model is treated with
/// care.
pub fn binds_thinking(model: &str) -> bool {
    const OLDER: [&str; 8] = [
        "claude-2",
        "claude-instant",
        "claude-3",
        "claude-opus-4",
        "claude-sonnet-4",
        "claude-haiku-4",
        "claude-4",
        "claude-haiku-3",
    ];
    !OLDER.iter().any(|prefix| model.starts_with(prefix))
}

/// Whether adding tools to `body` would invalidate thinking blocks the API cannot be asked to
/// drop: the model binds each thinking block to the tools before it, the conversation thinks
/// (its config or its blocks), and `drop_block` is not allowed.
pub fn tools_would_unbind(rules: WriteRules, body: &Value) -> bool {
    if !rules.binds_thinking || rules.drop_block_allowed {
        return false;
    }
    let has_blocks = body
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|messages| messages.iter().any(has_thinking));
    thinking_on(body) || has_blocks
}

/// Whether the request turns thinking on (`enabled` or `adaptive`).
pub fn thinking_on(body: &Value) -> bool {
    body.get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "disabled")
}

fn is_thinking(block: &Value) -> bool {
    matches!(block_type(block), "thinking" | "redacted_thinking")
}

/// Whether `message` holds a `thinking` or `redacted_thinking` block.
pub fn has_thinking(message: &Value) -> bool {
    blocks(field(message, "content")).iter().any(is_thinking)
}

/// Writes `items` (the engine's new items for `payloads`, read from `body` and its bytes `raw`)
/// back into the bytes: every message left whole is copied as it came.
pub fn write_bytes(
    raw: &[u8],
    body: &Value,
    payloads: &[Value],
    items: &[Value],
    rules: WriteRules,
) -> Result<Written, Unmanaged> {
    let originals = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(Unmanaged::Misaligned)?;
    let spans = Messages.spans(raw).ok_or(Unmanaged::NoSpans)?;
    if spans.items.len() != originals.len() {
        return Err(Unmanaged::NoSpans);
    }
    // The payload indexes of each original message.
    let mut of_message: Vec<Vec<usize>> = vec![Vec::new(); originals.len()];
    for (i, p) in payloads.iter().enumerate() {
        if let Some(Origin::Message { message, .. }) = origin(p) {
            of_message
                .get_mut(message)
                .ok_or(Unmanaged::Misaligned)?
                .push(i);
        }
    }
    // Every new item that says it came from the request names one of its payloads.
    for item in items {
        if let Some(Origin::Message { item: i, .. }) = origin(item) {
            if i >= payloads.len() {
                return Err(Unmanaged::Misaligned);
            }
        }
    }
    let mut groups = regroup(items);
    // A message is kept when all its items came back, in order and unchanged.
    let kept = |g: &Group| -> Option<usize> {
        let m = g.message?;
        let same = g.items.len() == of_message[m].len()
            && g.items
                .iter()
                .zip(&of_message[m])
                .all(|((from, at), want)| *from == Some(*want) && items[*at] == payloads[*want]);
        same.then_some(m)
    };
    let mut kept_at: Vec<Option<usize>> = groups.iter().map(kept).collect();
    // Every message that changes or moves must be made of blocks the adapter knows.
    let present: Vec<usize> = kept_at.iter().flatten().copied().collect();
    for (m, message) in originals.iter().enumerate() {
        if present.contains(&m) {
            continue;
        }
        if let Some(unknown) = blocks(field(message, "content"))
            .iter()
            .map(block_type)
            .find(|t| !KNOWN_BLOCKS.contains(t))
        {
            return Err(Unmanaged::UnknownBlock(unknown.to_string()));
        }
    }
    // The first position where the new conversation differs from the old one.
    let edit_at = kept_at
        .iter()
        .enumerate()
        .position(|(g, k)| *k != Some(g))
        .unwrap_or(kept_at.len());
    // With thinking on, every answer's thinking is signed after what this request forwards: a
    // change made now must be repeated, byte for byte, by every later request, including the
    // ones in an open tool loop where nothing may change. Without `drop_block` the proxy
    // cannot promise that, so it changes nothing (unless the change repeats what was
    // forwarded already).
    if rules.binds_thinking
        && !rules.drop_block_allowed
        && !rules.repeats_forwarded
        && edit_at < kept_at.len()
        && thinking_on(body)
    {
        return Err(Unmanaged::BoundThinking);
    }
    let mut removed = 0;
    let mut drop_block = false;
    let invalidated: Vec<usize> = (edit_at..groups.len())
        .filter(|&g| kept_at[g].is_some() && has_thinking(&groups[g].value))
        .collect();
    if rules.binds_thinking && !rules.repeats_forwarded && !invalidated.is_empty() {
        if rules.drop_block_allowed && body.get("thinking").is_some_and(Value::is_object) {
            drop_block = true;
        } else {
            let latest_assistant = originals
                .iter()
                .rposition(|m| str_field(m, "role") == Some("assistant"));
            if latest_assistant.is_some_and(|a| has_thinking(&originals[a])) {
                return Err(Unmanaged::LatestThinking);
            }
            if originals.last().is_some_and(|m| leading_results(m) > 0) {
                return Err(Unmanaged::OpenToolLoop);
            }
            for g in invalidated {
                if let Some(Value::Array(content)) = groups[g].value.get_mut("content") {
                    let before = content.len();
                    content.retain(|b| !is_thinking(b));
                    removed += before - content.len();
                }
                kept_at[g] = None;
            }
            // An assistant message that held only thinking is gone.
            let mut g = 0;
            groups.retain(|group| {
                let keep =
                    !matches!(group.value.get("content"), Some(Value::Array(c)) if c.is_empty());
                if !keep {
                    kept_at.remove(g);
                } else {
                    g += 1;
                }
                keep
            });
        }
    }
    let pieces: Vec<Piece<'_>> = groups
        .iter()
        .zip(&kept_at)
        .map(|(g, k)| match k {
            Some(m) => Piece::Kept(*m),
            None => Piece::New(&g.value),
        })
        .collect();
    let mut out = splice(raw, &spans, &pieces);
    if drop_block {
        out = with_drop_block(&out, body).ok_or(Unmanaged::NoSpans)?;
    }
    Ok(Written {
        body: out,
        thinking_removed: removed,
        drop_block,
        held_back: false,
    })
}

/// What a thinking signature binds of each message of `body`, hashed: the message as the
/// model reads it, not as it was serialized — without its `cache_control` markers (moving a
/// marker is not an edit), object keys in any order, and a `content` string the same as one
/// `text` block of that text (Claude Code sends its newest prompt as a block carrying its
/// breakpoint, and the same prompt as a string once a newer message carries it). Two requests
/// whose first `n` hashes agree show the model the same first `n` messages.
pub fn bound_hashes(body: &Value) -> Vec<u64> {
    message_hashes(body, true)
}

/// [`bound_hashes`] as an earlier version computed them: the message's members in their order
/// and a `content` string as it is (`cache_control` left out), for records it wrote.
pub fn bound_hashes_as_sent(body: &Value) -> Vec<u64> {
    message_hashes(body, false)
}

fn message_hashes(body: &Value, as_read: bool) -> Vec<u64> {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or_else(Vec::new, |messages| {
            messages.iter().map(|m| message_hash(m, as_read)).collect()
        })
}

/// [`bound_hashes`] of one message (`as_read`; else [`bound_hashes_as_sent`]): its text as
/// [`message_hashes`] reads it, fed to the hash as it is written (a large tool result is never
/// copied into a string of its own).
pub fn message_hash(message: &Value, as_read: bool) -> u64 {
    /// The hash, as a writer: `serde_json` writes keys and leaves straight into it.
    struct Hasher(xxhash_rust::xxh3::Xxh3);
    impl std::io::Write for Hasher {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.update(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Hasher {
        fn put(&mut self, text: &str) {
            self.0.update(text.as_bytes());
        }
        /// A JSON value written as `serde_json` writes it (a string escaped and quoted).
        fn json<T: serde::Serialize + ?Sized>(&mut self, v: &T) {
            // Writing into the hash cannot fail, and a `Value` or `str` always serializes.
            let _ = serde_json::to_writer(&mut *self, v);
        }
    }
    /// Writes `v`; `holds_blocks`: `v` is a message or a `tool_result` block, whose `content`
    /// string the API reads as one text block.
    fn write(v: &Value, as_read: bool, holds_blocks: bool, out: &mut Hasher) {
        match v {
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map
                    .iter()
                    .filter(|(k, _)| k.as_str() != "cache_control")
                    .collect();
                if as_read {
                    members.sort_by(|a, b| a.0.cmp(b.0));
                }
                let holds_blocks =
                    holds_blocks || map.get("type").and_then(Value::as_str) == Some("tool_result");
                out.put("{");
                for (k, v) in members {
                    out.json(k.as_str());
                    out.put(":");
                    match v {
                        Value::String(_) if as_read && holds_blocks && k == "content" => {
                            // One text block, written as `write` writes it (keys sorted).
                            out.put("[{\"text\":");
                            out.json(v);
                            out.put(",\"type\":\"text\",},]");
                        }
                        _ => write(v, as_read, false, out),
                    }
                    out.put(",");
                }
                out.put("}");
            }
            Value::Array(list) => {
                out.put("[");
                for v in list {
                    write(v, as_read, false, out);
                    out.put(",");
                }
                out.put("]");
            }
            other => out.json(other),
        }
    }
    let mut hasher = Hasher(xxhash_rust::xxh3::Xxh3::new());
    write(message, as_read, true, &mut hasher);
    hasher.0.digest()
}

/// `raw` with `thinking.block_binding.prefix_mismatch_behavior` set to `drop_block`.
pub fn with_drop_block(raw: &[u8], body: &Value) -> Option<Vec<u8>> {
    let span = scan::member(raw, b"thinking")?;
    let mut thinking = body.get("thinking")?.clone();
    let binding = thinking
        .as_object_mut()?
        .entry("block_binding")
        .or_insert_with(|| json!({}));
    binding
        .as_object_mut()?
        .insert("prefix_mismatch_behavior".into(), "drop_block".into());
    let mut out = Vec::with_capacity(raw.len() + 64);
    out.extend_from_slice(&raw[..span.start]);
    out.extend_from_slice(thinking.to_string().as_bytes());
    out.extend_from_slice(&raw[span.end..]);
    Some(out)
}

/// The range of payload indexes that are messages (after the `system` item).
pub fn message_items(payloads: &[Value]) -> Range<usize> {
    let first = usize::from(
        payloads
            .first()
            .is_some_and(|p| origin(p) == Some(Origin::System)),
    );
    first..payloads.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":100,
  "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
  "messages":[
    {"role":"user","content":"caf\u00e9"},
    {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"Eq1"},{"type":"tool_use","id":"t1","name":"Read","input":{"p":1.0e3}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"long"}],"cache_control":{"type":"ephemeral"}},{"type":"text","text":"more"}]},
    {"role":"assistant","content":"ok"},
    {"role":"user","content":"next"}
  ]}"#;

    fn body() -> Value {
        serde_json::from_str(BODY).unwrap()
    }

    #[test]
    fn items_in() {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap();
        let kinds: Vec<Kind<'_>> = payloads.iter().map(|p| Messages.kind(p)).collect();
        assert_eq!(
            kinds,
            vec![
                Kind::Instructions,
                Kind::User,
                Kind::ToolCalls(vec!["t1"]),
                Kind::ToolResult("t1"),
                Kind::User,
                Kind::Assistant,
                Kind::User,
            ]
        );
        assert_eq!(Messages.text(&payloads[3]).unwrap(), "long");
        assert_eq!(Messages.whole_text(&payloads[3]), None);
        assert_eq!(Messages.whole_text(&payloads[1]), Some("café"));
        assert_eq!(Messages.text(&payloads[2]), None);
        assert!(!Messages.line(&payloads[3]).contains(ORIGIN));
        assert_eq!(breakpoints(&body), 2);
    }

    #[test]
    fn text_replaced_keeps_the_breakpoint_with_it() {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap();
        let new = Messages.with_text(&payloads[3], "short".into());
        assert_eq!(
            without_origin(&new)["content"][0],
            json!({"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"short"}],"cache_control":{"type":"ephemeral"}})
        );
    }

    fn write(items: &[Value], rules: WriteRules) -> Result<Written, Unmanaged> {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap();
        write_bytes(BODY.as_bytes(), &body, &payloads, items, rules)
    }

    #[test]
    fn untouched_messages_keep_their_bytes() {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap().into_owned();
        let same = write(&payloads, WriteRules::default()).unwrap();
        assert_eq!(same.body, BODY.as_bytes());
        // One tool result shortened: only its message is serialized again, split parts joined.
        let mut items = payloads.clone();
        items[3] = Messages.with_text(&payloads[3], "short".into());
        let out = write(&items, WriteRules::default()).unwrap();
        let text = String::from_utf8(out.body).unwrap();
        assert!(text.contains(r#"{"role":"user","content":"caf\u00e9"}"#));
        assert!(text.contains(r#"{"p":1.0e3}"#));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["messages"][2]["content"][0]["content"][0]["text"],
            "short"
        );
        assert_eq!(v["messages"][2]["content"][1]["text"], "more");
        assert!(!text.contains(ORIGIN));
    }

    #[test]
    fn an_edit_before_thinking_follows_the_binding_rules() {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap().into_owned();
        // The first user message shortened: the later thinking block is invalidated.
        let mut items = payloads.clone();
        items[1] = Messages.with_text(&payloads[1], "c".into());
        let older = write(&items, WriteRules::default()).unwrap();
        assert_eq!(older.thinking_removed, 0);
        let binding = WriteRules {
            binds_thinking: true,
            drop_block_allowed: false,
            repeats_forwarded: false,
        };
        // The latest assistant message has no thinking and no loop is open: removed.
        let out = write(&items, binding).unwrap();
        assert_eq!(out.thinking_removed, 1);
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(v["messages"][1]["content"][0]["type"], "tool_use");
        let drop = WriteRules {
            drop_block_allowed: true,
            ..binding
        };
        // Without a `thinking` member there is nothing to ask for: removed.
        assert_eq!(write(&items, drop).unwrap().thinking_removed, 1);
        // With drop_block allowed, the API is asked to drop it instead.
        let raw = BODY.replace(
            r#""max_tokens":100,"#,
            r#""max_tokens":100,"thinking":{"type":"enabled","budget_tokens":1024},"#,
        );
        let body: Value = serde_json::from_str(&raw).unwrap();
        let out = write_bytes(raw.as_bytes(), &body, &payloads, &items, drop).unwrap();
        assert!(out.drop_block);
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(
            v["thinking"]["block_binding"]["prefix_mismatch_behavior"],
            "drop_block"
        );
        assert_eq!(v["messages"][1]["content"][0]["type"], "thinking");
    }

    /// A change the previous request already forwarded (a tool result truncated when it was
    /// new) is what the later thinking blocks were signed after: kept, none removed, even with
    /// the latest assistant message thinking.
    #[test]
    fn a_change_repeating_the_forwarded_one_is_no_edit() {
        let body = body();
        let payloads = Messages.payloads(&body).unwrap().into_owned();
        let mut items = payloads.clone();
        items[1] = Messages.with_text(&payloads[1], "c".into());
        let repeated = WriteRules {
            binds_thinking: true,
            drop_block_allowed: false,
            repeats_forwarded: true,
        };
        let out = write(&items, repeated).unwrap();
        assert_eq!(out.thinking_removed, 0);
        assert!(!out.drop_block);
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(v["messages"][1]["content"][0]["type"], "thinking");
        assert_eq!(v["messages"][0]["content"], "c");
    }

    #[test]
    fn unknown_blocks_in_a_changed_message_leave_it_unmanaged() {
        let raw = BODY.replace(r#""more"}"#, r#""more"},{"type":"cache_edits","edits":[]}"#);
        let body: Value = serde_json::from_str(&raw).unwrap();
        let payloads = Messages.payloads(&body).unwrap().into_owned();
        let mut items = payloads.clone();
        items[3] = Messages.with_text(&payloads[3], "short".into());
        let err = write_bytes(
            raw.as_bytes(),
            &body,
            &payloads,
            &items,
            WriteRules::default(),
        );
        assert_eq!(err, Err(Unmanaged::UnknownBlock("cache_edits".into())));
        // Untouched, it is no concern.
        assert!(write_bytes(
            raw.as_bytes(),
            &body,
            &payloads,
            &payloads,
            WriteRules::default()
        )
        .is_ok());
    }

    /// A prompt Claude Code sends as a text block with its breakpoint, then as a string once
    /// a newer message carries the breakpoint, is the same message to a signature; so is a
    /// block whose keys come in another order. Another text is not.
    #[test]
    fn a_string_and_one_text_block_of_it_bind_alike() {
        let hashes = |content: Value| {
            bound_hashes(&json!({"messages": [{"role": "user", "content": content}]}))[0]
        };
        let block = hashes(json!([{"type": "text", "text": "And d.txt?",
            "cache_control": {"type": "ephemeral"}}]));
        assert_eq!(hashes(json!("And d.txt?")), block);
        assert_eq!(
            hashes(json!([{"text": "And d.txt?", "type": "text"}])),
            block
        );
        assert_ne!(hashes(json!("And e.txt?")), block);
        let result = |content: Value| {
            hashes(json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]))
        };
        assert_eq!(
            result(json!("ok")),
            result(json!([{"type": "text", "text": "ok"}]))
        );
        // A tool's input is the client's data, read as it is.
        let input = |content: Value| {
            bound_hashes(&json!({"messages": [{"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {"content": content}}]}]}))
                [0]
        };
        assert_ne!(
            input(json!("x")),
            input(json!([{"type": "text", "text": "x"}]))
        );
        // An earlier version's hashes read the bytes as sent.
        let as_sent = |content: Value| {
            bound_hashes_as_sent(&json!({"messages": [{"role": "user", "content": content}]}))[0]
        };
        assert_ne!(
            as_sent(json!("x")),
            as_sent(json!([{"type": "text", "text": "x"}]))
        );
    }
}
