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

/// What one request of a conversation forwarded, against the client's messages it stood for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
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
            covers: client_hashes.len(),
            client: digest(&client_hashes),
            shown,
        })
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

/// Writes a decision on a model binding thinking to its prefix, with thinking on and without
/// `drop_block` (see the module doc). `raw`/`body`: the client's request; `decided`: the
/// decision written without the binding rules; `before`: the conversation's record, if any.
pub fn write_bound(
    raw: &[u8],
    body: &Value,
    decided: Written,
    before: Option<&Forwarded>,
) -> Result<Written, Unmanaged> {
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
    let before = before.filter(|f| f.continued_by(&client_hashes));
    let mut repeat: Vec<(Part<'_>, u64, bool)> = Vec::new();
    let covers = before.map_or(0, |f| f.covers);
    for shown in before.map(|f| f.shown.as_slice()).unwrap_or_default() {
        match shown {
            Shown::Client([a, b]) if *a <= *b && *b <= covers => {
                for i in *a..*b {
                    repeat.push((Part::Client(i), client_hashes[i], has_thinking(&client[i])));
                }
            }
            Shown::Client(_) => return Err(Unmanaged::Misaligned),
            Shown::Sent(bytes) => {
                let v: Value = serde_json::from_str(bytes).map_err(|_| Unmanaged::Misaligned)?;
                let h = bound_hashes(&serde_json::json!({"messages": [v]}))[0];
                repeat.push((Part::Bytes(bytes), h, has_thinking(&v)));
            }
        }
    }
    for i in covers..client.len() {
        repeat.push((Part::Client(i), client_hashes[i], has_thinking(&client[i])));
    }

    // The first message the decision shows differently from the repeat form.
    let edit_at = decided_hashes
        .iter()
        .zip(repeat.iter().map(|(_, h, _)| h))
        .position(|(d, r)| d != r)
        .unwrap_or(decided_hashes.len().min(repeat.len()));
    let thinks_after = decided_messages[edit_at.min(decided_messages.len())..]
        .iter()
        .any(has_thinking);
    if !thinks_after {
        // Every thinking block shown comes before the first change.
        return Ok(decided);
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
        return Ok(Written {
            body: assemble(raw, &spans, &decided, &decided_spans, &parts),
            thinking_removed: removed,
            drop_block: false,
            held_back: false,
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
    if aligned {
        parts.truncate(last_thinking + 1);
        parts.extend((decided_messages.len() - tail..decided_messages.len()).map(Part::Decided));
    }
    Ok(Written {
        body: assemble(raw, &spans, &decided, &decided_spans, &parts),
        thinking_removed: 0,
        drop_block: false,
        held_back: true,
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

/// The client's request `raw` with its messages replaced by `parts`.
fn assemble(
    raw: &[u8],
    spans: &super::Spans,
    decided: &Written,
    decided_spans: &super::Spans,
    parts: &[Part<'_>],
) -> Vec<u8> {
    // Everything but the messages comes from the decision's body (`drop_block` is never set
    // here; the proxy's other changes to the request are made after this).
    let body = &decided.body;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..decided_spans.list.start]);
    out.push(b'[');
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        match part {
            Part::Client(i) => out.extend_from_slice(&raw[spans.items[*i].clone()]),
            Part::Bytes(s) => out.extend_from_slice(s.as_bytes()),
            Part::Decided(k) => out.extend_from_slice(&body[decided_spans.items[*k].clone()]),
        }
    }
    out.push(b']');
    out.extend_from_slice(&body[decided_spans.list.end..]);
    out
}
