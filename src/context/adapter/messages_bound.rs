//! What a conversation on a model binding thinking to its prefix last showed the model, and
//! the writing back of a decision under that binding (pure; the store calls are the context
//! manager's).
//!
//! With thinking on, each answer's thinking block is signed after the request exactly as the
//! proxy forwarded it: every later request must show the model those messages again, byte for
//! byte as far as the signature reads them (`cache_control` aside), or the block is "bound to
//! a different conversation". So the proxy keeps, per conversation, a [`Forwarded`] record:
//! which of the client's messages it forwarded as they came and the bytes of those it wrote
//! itself. From it the next request's **repeat form** is rebuilt: the record, then the
//! client's new messages. A decision may change that form only
//!
//! - after its last thinking block (a tool result new in this request, truncated or made
//!   lossless as it arrives: nothing signed follows it), or
//! - at a turn boundary (the last message is the user's own turn, no tool loop open), where
//!   the thinking blocks after the first edit are removed (older thinking may be omitted
//!   outside the current tool-use cycle);
//!
//! otherwise the repeat form goes, with the decision's edits of the messages after its last
//! thinking block. The record lives in the store (`ContextManager`), so replicas and a
//! restarted proxy repeat what another forwarded.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::messages::{bound_hashes, Messages, Unmanaged, Written};
use super::Adapter;
use crate::tokens::field;

/// The largest record kept (its JSON): a conversation whose rewritten messages take more is
/// not remembered, and its next request is judged as if nothing had been rewritten before.
pub const MAX_RECORD_BYTES: usize = 4 << 20;

/// Why a request's changes were held back because its record would exceed
/// [`MAX_RECORD_BYTES`] (`x-context-actions`): the record kept is repeated.
pub const RECORD_TOO_LARGE: &str =
    "the record of what was forwarded would exceed 4 MiB: the form forwarded before repeated";

/// Why a request's changes were held back because the store did not take its record.
pub const RECORD_UNWRITTEN: &str =
    "the store did not take the record of what goes: the form forwarded before repeated";

/// Why a request goes as the client sent it when its record cannot be read: nothing before its
/// last thinking block was ever edited, so its signatures read the client's bytes.
pub const UNREADABLE_UNEDITED: &str = "the store cannot say what was forwarded before, and nothing before the last thinking block was edited: forwarded as sent";

/// What a client is told when its request is refused because its record cannot be read
/// (`what`: the store's error) and earlier requests may have been edited.
pub fn unreadable_refusal(what: &str) -> String {
    format!(
        "context-proxy cannot read what it forwarded earlier in this conversation ({what}). \
         The model signed its thinking after the messages as the proxy edited them: sent as \
         you have them, the API would refuse the request (\"bound to a different \
         conversation\"), so nothing was sent. Retry in a moment; if the proxy's store stays \
         unavailable, start a new conversation (/clear in Claude Code)."
    )
}

/// The session state key of the record of `body`'s conversation: `forwarded-` and a hash of
/// its `system` and first message (without `cache_control`). Claude Code's sub-agents share
/// the session of the agent that started them, with a system prompt and a task of their own:
/// each conversation keeps its own record.
pub fn state_key(body: &Value) -> String {
    let system = body.get("system").map(without_markers).unwrap_or_default();
    let first = bound_hashes(body).first().copied().unwrap_or_default();
    let mut bytes = system.to_string().into_bytes();
    bytes.extend_from_slice(&first.to_le_bytes());
    format!("forwarded-{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// What one request of a conversation forwarded, against the client's messages it stood for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
    /// The conversation's state key ([`state_key`]).
    key: String,
    /// How many of the client's messages the request held.
    covers: usize,
    /// The digest of those messages as a signature reads them ([`bound_hashes`]), hex.
    client: String,
    /// The forwarded messages, in order.
    shown: Vec<Shown>,
}

/// Forwarded messages: a run of the client's, or one the proxy wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Shown {
    /// The client's messages `[start, end)`, as the client sends them (its breakpoints).
    Client([usize; 2]),
    /// A message the proxy wrote: its JSON, without `cache_control` (a breakpoint belongs to
    /// the request that placed it).
    Sent(String),
}

fn digest(hashes: &[u64]) -> String {
    let mut bytes = Vec::with_capacity(hashes.len() * 8);
    for h in hashes {
        bytes.extend_from_slice(&h.to_le_bytes());
    }
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
}

/// `message` without any `cache_control` member, at any depth.
fn without_markers(message: &Value) -> Value {
    match message {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), without_markers(v)))
                .collect(),
        ),
        Value::Array(list) => Value::Array(list.iter().map(without_markers).collect()),
        other => other.clone(),
    }
}

impl Forwarded {
    /// The record of a request whose client messages were `client` (a Messages body) and
    /// which forwarded `sent` (a Messages body): `None` when it would exceed
    /// [`MAX_RECORD_BYTES`].
    pub fn record(client: &Value, sent: &Value) -> Option<Forwarded> {
        let client_hashes = bound_hashes(client);
        let sent_hashes = bound_hashes(sent);
        let sent_messages = sent.get("messages").and_then(Value::as_array)?;
        let mut at: HashMap<u64, Vec<usize>> = HashMap::new();
        for (j, h) in client_hashes.iter().enumerate() {
            at.entry(*h).or_default().push(j);
        }
        let mut shown: Vec<Shown> = Vec::new();
        let mut next = 0;
        let mut size = 0;
        for (k, h) in sent_hashes.iter().enumerate() {
            let found = at
                .get(h)
                .and_then(|js| js.iter().copied().find(|&j| j >= next));
            match (found, shown.last_mut()) {
                (Some(j), Some(Shown::Client(run))) if run[1] == j => run[1] = j + 1,
                (Some(j), _) => shown.push(Shown::Client([j, j + 1])),
                (None, _) => {
                    let bytes = without_markers(&sent_messages[k]).to_string();
                    size += bytes.len();
                    if size > MAX_RECORD_BYTES {
                        return None;
                    }
                    shown.push(Shown::Sent(bytes));
                }
            }
            if let Some(j) = found {
                next = j + 1;
            }
        }
        Some(Forwarded {
            key: state_key(client),
            covers: client_hashes.len(),
            client: digest(&client_hashes),
            shown,
        })
    }

    /// The session state key it is kept under ([`state_key`]).
    pub fn state_key(&self) -> &str {
        &self.key
    }

    /// Whether the client's messages (their [`bound_hashes`]) still begin with the ones this
    /// record stood for.
    fn continued_by(&self, client_hashes: &[u64]) -> bool {
        self.covers <= client_hashes.len() && digest(&client_hashes[..self.covers]) == self.client
    }
}

/// A message of the form being built: where its bytes come from.
#[derive(Clone, Copy)]
enum Part<'a> {
    /// The client's message `i` (its bytes in the request).
    Client(usize),
    /// Bytes the proxy wrote.
    Bytes(&'a str),
    /// Message `i` of the decision's body.
    Decided(usize),
}

fn is_thinking(block: &Value) -> bool {
    matches!(
        super::messages::block_type(block),
        "thinking" | "redacted_thinking"
    )
}

fn has_thinking(message: &Value) -> bool {
    super::messages::blocks(field(message, "content"))
        .iter()
        .any(is_thinking)
}

/// The repeat form of a request: what the record says was shown, then the client's new
/// messages; each with its [`bound_hashes`] hash and whether it holds thinking.
struct Repeat<'a> {
    parts: Vec<(Part<'a>, u64, bool)>,
    /// How many of the client's messages the record stood for (0 without one).
    covers: usize,
}

impl Repeat<'_> {
    /// The client's messages themselves, in order: nothing to repeat.
    fn is_the_clients(&self, n: usize) -> bool {
        self.parts.len() == n
            && self
                .parts
                .iter()
                .enumerate()
                .all(|(k, (p, _, _))| matches!(p, Part::Client(i) if *i == k))
    }
}

fn repeat_of<'a>(
    client: &[Value],
    client_hashes: &[u64],
    before: Option<&'a Forwarded>,
) -> Result<Repeat<'a>, Unmanaged> {
    let before = before.filter(|f| f.continued_by(client_hashes));
    let mut parts: Vec<(Part<'a>, u64, bool)> = Vec::new();
    let covers = before.map_or(0, |f| f.covers);
    for shown in before.map(|f| f.shown.as_slice()).unwrap_or_default() {
        match shown {
            Shown::Client([a, b]) if *a <= *b && *b <= covers => {
                for i in *a..*b {
                    parts.push((Part::Client(i), client_hashes[i], has_thinking(&client[i])));
                }
            }
            Shown::Client(_) => return Err(Unmanaged::Misaligned),
            Shown::Sent(bytes) => {
                let v: Value = serde_json::from_str(bytes).map_err(|_| Unmanaged::Misaligned)?;
                let h = bound_hashes(&serde_json::json!({"messages": [v]}))[0];
                parts.push((Part::Bytes(bytes), h, has_thinking(&v)));
            }
        }
    }
    for i in covers..client.len() {
        parts.push((Part::Client(i), client_hashes[i], has_thinking(&client[i])));
    }
    Ok(Repeat { parts, covers })
}

/// The request `raw` (`body` parsed from it) in its repeat form: the messages `before` says
/// were forwarded, then the client's new ones, everything else as the client sent it; `None`
/// when that is the client's request itself (no record, one the client's messages do not
/// continue, or one without changes).
pub fn repeat(
    raw: &[u8],
    body: &Value,
    before: Option<&Forwarded>,
) -> Result<Option<Vec<u8>>, Unmanaged> {
    let client: &[Value] = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(Unmanaged::Misaligned)?;
    let client_hashes = bound_hashes(body);
    let form = repeat_of(client, &client_hashes, before)?;
    if form.is_the_clients(client.len()) {
        return Ok(None);
    }
    let spans = Messages.spans(raw).ok_or(Unmanaged::NoSpans)?;
    if spans.items.len() != client.len() {
        return Err(Unmanaged::NoSpans);
    }
    let parts: Vec<Part<'_>> = form.parts.iter().map(|(p, _, _)| *p).collect();
    Ok(Some(assemble(raw, &spans, raw, &spans, &parts)))
}

/// A decision written under the binding ([`write_bound`]).
#[derive(Debug)]
pub struct Bound {
    pub written: Written,
    /// What goes differs from the repeat form (the decision changed something): the record
    /// must be replaced before it goes. When false, the record kept reproduces it.
    pub changes_record: bool,
}

/// Writes a decision on a model binding thinking to its prefix, with thinking on and without
/// `drop_block` (see the module doc). `raw`/`body`: the client's request; `decided`: the
/// decision written without the binding rules; `before`: the conversation's record, if any.
pub fn write_bound(
    raw: &[u8],
    body: &Value,
    decided: Written,
    before: Option<&Forwarded>,
) -> Result<Bound, Unmanaged> {
    let client: &[Value] = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(Unmanaged::Misaligned)?;
    let client_hashes = bound_hashes(body);
    let spans = Messages.spans(raw).ok_or(Unmanaged::NoSpans)?;
    if spans.items.len() != client.len() {
        return Err(Unmanaged::NoSpans);
    }
    let decided_body: Value =
        serde_json::from_slice(&decided.body).map_err(|_| Unmanaged::Misaligned)?;
    let decided_messages = decided_body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or(Unmanaged::Misaligned)?;
    let decided_spans = Messages.spans(&decided.body).ok_or(Unmanaged::NoSpans)?;
    let decided_hashes = bound_hashes(&decided_body);

    // The repeat form: what the record says was shown, then the client's new messages.
    let Repeat {
        parts: repeat,
        covers,
    } = repeat_of(client, &client_hashes, before)?;
    let repeat_hashes: Vec<u64> = repeat.iter().map(|(_, h, _)| *h).collect();

    // The first message the decision shows differently from the repeat form.
    let edit_at = decided_hashes
        .iter()
        .zip(&repeat_hashes)
        .position(|(d, r)| d != r)
        .unwrap_or(decided_hashes.len().min(repeat.len()));
    let thinks_after = decided_messages[edit_at.min(decided_messages.len())..]
        .iter()
        .any(has_thinking);
    if !thinks_after {
        // Every thinking block shown comes before the first change.
        let changes_record = decided_hashes != repeat_hashes;
        return Ok(Bound {
            written: decided,
            changes_record,
        });
    }
    let turn_boundary = client.last().is_some_and(|m| {
        field(m, "role").and_then(Value::as_str) == Some("user")
            && !super::messages::blocks(field(m, "content"))
                .iter()
                .any(|b| super::messages::block_type(b) == "tool_result")
    });
    if turn_boundary {
        // Removed after the edit: no tool-use cycle is open, older thinking may be omitted.
        let mut removed = 0;
        let stripped: Vec<Option<String>> = decided_messages
            .iter()
            .enumerate()
            .map(|(k, message)| {
                if k < edit_at || !has_thinking(message) {
                    return None;
                }
                let mut message = message.clone();
                if let Some(Value::Array(content)) = message.get_mut("content") {
                    let n = content.len();
                    content.retain(|b| !is_thinking(b));
                    removed += n - content.len();
                    if content.is_empty() {
                        return Some(String::new());
                    }
                }
                Some(message.to_string())
            })
            .collect();
        let parts: Vec<Part<'_>> = stripped
            .iter()
            .enumerate()
            .filter_map(|(k, s)| match s {
                None => Some(Part::Decided(k)),
                // An assistant message that held only thinking is gone.
                Some(s) if s.is_empty() => None,
                Some(s) => Some(Part::Bytes(s)),
            })
            .collect();
        return Ok(Bound {
            written: Written {
                body: assemble(raw, &spans, &decided.body, &decided_spans, &parts),
                thinking_removed: removed,
                drop_block: false,
                held_back: false,
            },
            // An edit before a thinking block: never what the record reproduces.
            changes_record: true,
        });
    }
    // Inside a tool loop: the repeat form, with the decision's versions of the messages after
    // its last thinking block (results new in this request).
    let last_thinking = repeat.iter().rposition(|(_, _, t)| *t).unwrap_or(0);
    let tail = repeat.len() - last_thinking - 1;
    let aligned = tail > 0
        && decided_messages.len() >= tail
        && (0..tail).all(|k| {
            same_shape(
                &decided_messages[decided_messages.len() - tail + k],
                &client[client.len() - tail + k],
            )
        })
        && repeat[last_thinking + 1..]
            .iter()
            .all(|(p, _, _)| matches!(p, Part::Client(i) if *i >= covers));
    let mut parts: Vec<Part<'_>> = repeat.iter().map(|(p, _, _)| *p).collect();
    let mut changes_record = false;
    if aligned {
        let from = decided_messages.len() - tail;
        changes_record = decided_hashes[from..] != repeat_hashes[last_thinking + 1..];
        parts.truncate(last_thinking + 1);
        parts.extend((from..decided_messages.len()).map(Part::Decided));
    }
    Ok(Bound {
        written: Written {
            body: assemble(raw, &spans, &decided.body, &decided_spans, &parts),
            thinking_removed: 0,
            drop_block: false,
            held_back: true,
        },
        changes_record,
    })
}

/// Whether the decision's message `d` stands for the client's `c`: same role, same tool
/// results in the same order.
fn same_shape(d: &Value, c: &Value) -> bool {
    let results = |m: &Value| -> Vec<String> {
        super::messages::blocks(field(m, "content"))
            .iter()
            .filter(|b| super::messages::block_type(b) == "tool_result")
            .map(|b| {
                field(b, "tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    };
    field(d, "role") == field(c, "role") && results(d) == results(c)
}

/// The client's request `raw` with its messages replaced by `parts`; everything but the
/// messages from `body` (the decision's, `drop_block` never set here: the proxy's other
/// changes to the request are made after this).
fn assemble(
    raw: &[u8],
    spans: &super::Spans,
    body: &[u8],
    body_spans: &super::Spans,
    parts: &[Part<'_>],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..body_spans.list.start]);
    out.push(b'[');
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        match part {
            Part::Client(i) => out.extend_from_slice(&raw[spans.items[*i].clone()]),
            Part::Bytes(s) => out.extend_from_slice(s.as_bytes()),
            Part::Decided(k) => out.extend_from_slice(&body[body_spans.items[*k].clone()]),
        }
    }
    out.push(b']');
    out.extend_from_slice(&body[body_spans.list.end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A binding conversation inside a tool loop: a prompt, a call with thinking, its result.
    fn conversation(result: &str) -> Value {
        json!({
            "model": "claude-sonnet-5-5",
            "thinking": {"type": "adaptive"},
            "system": "You are Claude Code.",
            "messages": [
                {"role": "user", "content": "Read f.rs."},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "read it", "signature": "s1"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}
            ]
        })
    }

    fn bytes(body: &Value) -> Vec<u8> {
        serde_json::to_vec(body).unwrap()
    }

    fn unchanged(body: &Value) -> Written {
        Written {
            body: bytes(body),
            thinking_removed: 0,
            drop_block: false,
            held_back: false,
        }
    }

    #[test]
    fn the_repeat_form_is_the_records_and_none_without_an_edit() {
        let client = conversation("the whole file");
        let raw = bytes(&client);
        assert_eq!(repeat(&raw, &client, None), Ok(None));
        let same = Forwarded::record(&client, &client).unwrap();
        assert_eq!(repeat(&raw, &client, Some(&same)), Ok(None));
        // The result went truncated: the next request (one more round) repeats that.
        let sent = conversation("the whole…");
        let edited = Forwarded::record(&client, &sent).unwrap();
        let mut next = client.clone();
        let messages = next["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "done", "signature": "s2"},
            {"type": "text", "text": "Done."}]}));
        messages.push(json!({"role": "user", "content": "Thanks."}));
        let repeated = repeat(&bytes(&next), &next, Some(&edited))
            .unwrap()
            .unwrap();
        let repeated: Value = serde_json::from_slice(&repeated).unwrap();
        assert_eq!(repeated["messages"][2], sent["messages"][2]);
        assert_eq!(
            repeated["messages"].as_array().unwrap()[3..],
            next["messages"].as_array().unwrap()[3..]
        );
        assert_eq!(repeated["system"], next["system"]);
    }

    #[test]
    fn only_a_form_the_record_does_not_reproduce_changes_it() {
        let client = conversation("the whole file");
        let raw = bytes(&client);
        let sent = conversation("the whole…");
        let edited = Forwarded::record(&client, &sent).unwrap();
        // The decision is what was forwarded before: the record kept reproduces it.
        let again = write_bound(&raw, &client, unchanged(&sent), Some(&edited)).unwrap();
        assert!(!again.changes_record);
        assert_eq!(
            bound_hashes(&serde_json::from_slice(&again.written.body).unwrap()),
            bound_hashes(&sent)
        );
        // A new change after the last thinking block: the record must be replaced.
        let other = conversation("the…");
        let changed = write_bound(&raw, &client, unchanged(&other), Some(&edited)).unwrap();
        assert!(changed.changes_record);
        // Without a record, the client's own messages are the repeat form.
        let plain = write_bound(&raw, &client, unchanged(&client), None).unwrap();
        assert!(!plain.changes_record);
    }
}
