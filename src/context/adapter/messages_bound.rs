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
//! client's new messages; for a client that rewound (it sends a prefix of what the record
//! covers, maybe then other messages), the record's form of the longest prefix it kept, then
//! its own messages. A conversation keeps one record per branch ([`Records`]), so a client
//! going back to a branch it left finds that branch's form. A decision may change that form
//! only
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

use super::messages::{
    bound_hashes, bound_hashes_as_sent, message_hash, Messages, Unmanaged, Written,
};
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
    let first = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.first())
        .map_or(0, |m| message_hash(m, true));
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
    /// Those messages' [`bound_hashes`], one by one: a client that rewound is matched by the
    /// longest prefix of its messages this record covers. Empty in a record an earlier
    /// version wrote, whose digest is of [`bound_hashes_as_sent`] (only a client continuing
    /// all of it matches).
    #[serde(default)]
    hashes: Vec<u64>,
    /// The forwarded messages, in order.
    shown: Vec<Shown>,
}

/// The most branches of one conversation kept ([`Records`]).
pub const MAX_BRANCHES: usize = 4;

/// What a conversation forwarded, branch by branch: a client that rewound (Claude Code's Esc
/// Esc, `/rewind`) and went on differently leaves a branch whose record the new one does not
/// continue; both are kept (the newest first, at most [`MAX_BRANCHES`], [`MAX_RECORD_BYTES`]
/// in all), so that going back to the branch left repeats what it forwarded. A record that
/// continues another's client messages replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Records {
    branches: Vec<Forwarded>,
}

/// Where a request's repeat form comes from: the branch chosen and how many of the client's
/// messages it stands for ([`Records::choose`]).
struct Chosen<'a> {
    record: &'a Forwarded,
    /// The client's messages the record covers: all of its messages, or (a rewind) the
    /// longest prefix of the client's that it covers.
    matched: usize,
}

impl Records {
    /// Parses what the store holds: the branches, or a single record as an earlier version
    /// kept it; `None` when neither.
    pub fn parse(bytes: &[u8]) -> Option<Records> {
        serde_json::from_slice::<Records>(bytes).ok().or_else(|| {
            serde_json::from_slice::<Forwarded>(bytes)
                .ok()
                .map(|f| Records { branches: vec![f] })
        })
    }

    /// The branches kept, the newest first.
    pub fn branches(&self) -> &[Forwarded] {
        &self.branches
    }

    /// These records with `new` (the record of what a request now forwards) first, and
    /// without the branches it continues (their client messages are a prefix of its own);
    /// the oldest dropped past [`MAX_BRANCHES`] or [`MAX_RECORD_BYTES`]. `None` when `new`
    /// alone exceeds [`MAX_RECORD_BYTES`].
    pub fn with(&self, new: Forwarded) -> Option<Records> {
        let mut size = new.weight();
        if size > MAX_RECORD_BYTES {
            return None;
        }
        let mut branches = vec![new];
        for old in &self.branches {
            if branches.len() >= MAX_BRANCHES || old.key != branches[0].key {
                break;
            }
            // An earlier version's record is not kept beside a new one: it cannot tell
            // whether the new one continues it.
            if old.hashes.is_empty() || old.continued_by(&branches[0].hashes, None) {
                continue;
            }
            size += old.weight();
            if size > MAX_RECORD_BYTES {
                break;
            }
            branches.push(old.clone());
        }
        Some(Records { branches })
    }

    /// The branch a client's messages (their [`bound_hashes`]) continue: of those whose
    /// client messages all begin the client's, the one covering most (a later request of the
    /// same branch); else (the client rewound into a branch) the one sharing the longest
    /// prefix with the client's, the newest on a tie.
    /// `as_sent`: the client's [`bound_hashes_as_sent`], when a record of an earlier version
    /// is kept.
    fn choose(&self, client_hashes: &[u64], as_sent: Option<&[u64]>) -> Option<Chosen<'_>> {
        let mut whole: Option<&Forwarded> = None;
        for record in &self.branches {
            if record.continued_by(client_hashes, as_sent)
                && whole.is_none_or(|w| record.covers > w.covers)
            {
                whole = Some(record);
            }
        }
        if let Some(record) = whole {
            return Some(Chosen {
                record,
                matched: record.covers,
            });
        }
        let mut best: Option<Chosen<'_>> = None;
        for record in &self.branches {
            let matched = record.common_prefix(client_hashes);
            if matched > 0 && best.as_ref().is_none_or(|b| matched > b.matched) {
                best = Some(Chosen { record, matched });
            }
        }
        best
    }
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
            hashes: client_hashes,
            shown,
        })
    }

    /// The session state key it is kept under ([`state_key`]).
    pub fn state_key(&self) -> &str {
        &self.key
    }

    /// Whether the client's messages (their [`bound_hashes`]; `as_sent`, their
    /// [`bound_hashes_as_sent`], for a record of an earlier version) still begin with the ones
    /// this record stood for.
    fn continued_by(&self, client_hashes: &[u64], as_sent: Option<&[u64]>) -> bool {
        let hashes = match (self.hashes.is_empty(), as_sent) {
            (false, _) => client_hashes,
            (true, Some(as_sent)) => as_sent,
            (true, None) => return false,
        };
        self.covers <= hashes.len() && digest(&hashes[..self.covers]) == self.client
    }

    /// How many of the client's first messages are the record's (0 for a record without its
    /// messages' hashes).
    fn common_prefix(&self, client_hashes: &[u64]) -> usize {
        self.hashes
            .iter()
            .zip(client_hashes)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// About what the record takes in the store: the bytes of the messages the proxy wrote,
    /// and the hashes.
    fn weight(&self) -> usize {
        let sent: usize = self
            .shown
            .iter()
            .map(|s| match s {
                Shown::Sent(bytes) => bytes.len() + 4,
                Shown::Client(_) => 16,
            })
            .sum();
        sent + 24 * self.hashes.len() + self.key.len() + 64
    }

    /// What the record forwarded for the client's first `matched` messages: where a message
    /// the proxy wrote stands for several of the client's (a marker for a moved-out span), the
    /// prefix stops before it. How many of the client's messages that stands for, and the
    /// forwarded messages: the client's by index, or bytes the proxy wrote.
    fn prefix(&self, matched: usize) -> Result<(usize, Vec<Recorded<'_>>), Unmanaged> {
        let matched = matched.min(self.covers);
        let mut parts: Vec<Recorded<'_>> = Vec::new();
        // The proxy's messages since the last of the client's: they stand for the client's
        // messages from `at` up to the next one shown.
        let mut written: Vec<&str> = Vec::new();
        let mut at = 0;
        let mut done = (0, 0);
        'shown: for shown in &self.shown {
            match shown {
                Shown::Sent(bytes) => written.push(bytes),
                Shown::Client([a, b]) => {
                    if *a < at || *b < *a || *b > self.covers {
                        return Err(Unmanaged::Misaligned);
                    }
                    if *a > matched {
                        break 'shown;
                    }
                    parts.extend(written.drain(..).map(Recorded::Bytes));
                    at = *a;
                    done = (at, parts.len());
                    for i in *a..*b {
                        if i >= matched {
                            break 'shown;
                        }
                        parts.push(Recorded::Client(i));
                        at = i + 1;
                        done = (at, parts.len());
                    }
                }
            }
        }
        if matched == self.covers {
            // The proxy's last messages stand for the client's up to the end.
            parts.extend(written.drain(..).map(Recorded::Bytes));
            done = (self.covers, parts.len());
        }
        parts.truncate(done.1);
        Ok((done.0, parts))
    }
}

/// A message of a record's form ([`Forwarded::prefix`]).
enum Recorded<'a> {
    /// The client's message `i`.
    Client(usize),
    /// A message the proxy wrote (JSON).
    Bytes(&'a str),
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
    before: Option<&'a Records>,
) -> Result<Repeat<'a>, Unmanaged> {
    let mut parts: Vec<(Part<'a>, u64, bool)> = Vec::new();
    // Only a record of an earlier version reads the messages as they were sent.
    let as_sent = before
        .is_some_and(|r| r.branches.iter().any(|b| b.hashes.is_empty()))
        .then(|| bound_hashes_as_sent(&serde_json::json!({ "messages": client })));
    let (covers, recorded) = match before.and_then(|r| r.choose(client_hashes, as_sent.as_deref()))
    {
        Some(chosen) => chosen.record.prefix(chosen.matched)?,
        None => (0, Vec::new()),
    };
    for shown in recorded {
        match shown {
            Recorded::Client(i) if i < client.len() => {
                parts.push((Part::Client(i), client_hashes[i], has_thinking(&client[i])));
            }
            Recorded::Client(_) => return Err(Unmanaged::Misaligned),
            Recorded::Bytes(bytes) => {
                let v: Value = serde_json::from_str(bytes).map_err(|_| Unmanaged::Misaligned)?;
                let h = message_hash(&v, true);
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
    before: Option<&Records>,
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
    before: Option<&Records>,
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

    fn records(record: Forwarded) -> Records {
        Records::default().with(record).unwrap()
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
        let same = records(Forwarded::record(&client, &client).unwrap());
        assert_eq!(repeat(&raw, &client, Some(&same)), Ok(None));
        // The result went truncated: the next request (one more round) repeats that.
        let sent = conversation("the whole…");
        let edited = records(Forwarded::record(&client, &sent).unwrap());
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
        let edited = records(Forwarded::record(&client, &sent).unwrap());
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

    /// `messages` appended to `body`'s.
    fn with_messages(body: &Value, messages: &[Value]) -> Value {
        let mut body = body.clone();
        body["messages"]
            .as_array_mut()
            .unwrap()
            .extend(messages.iter().cloned());
        body
    }

    fn round(t: usize, result: &str) -> [Value; 2] {
        [
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("read {t}"), "signature": format!("s{t}")},
                {"type": "tool_use", "id": format!("toolu_{t}"), "name": "Read", "input": {}}]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": result}]}),
        ]
    }

    fn messages_of(raw: &[u8]) -> Vec<Value> {
        let body: Value = serde_json::from_slice(raw).unwrap();
        body["messages"].as_array().unwrap().clone()
    }

    /// A client that rewound (sends a prefix of what the record covers, then something else)
    /// gets the record's form of the prefix it still has, and its own messages after it.
    #[test]
    fn a_rewound_client_gets_the_records_form_of_the_prefix_it_kept() {
        let client = conversation("the whole file");
        let [a2, r2] = round(2, "the second file");
        let client = with_messages(&client, &[a2.clone(), r2.clone()]);
        // The proxy truncated both results.
        let sent = with_messages(
            &conversation("the whole…"),
            &[a2.clone(), round(2, "the sec…")[1].clone()],
        );
        let kept = records(Forwarded::record(&client, &sent).unwrap());
        // Back to before the second call: another answer, another result.
        let [b2, s2] = round(9, "another file");
        let rewound = with_messages(&conversation("the whole file"), &[b2.clone(), s2.clone()]);
        let form = repeat(&bytes(&rewound), &rewound, Some(&kept))
            .unwrap()
            .unwrap();
        let form = messages_of(&form);
        assert_eq!(form[..3], sent["messages"].as_array().unwrap()[..3]);
        assert_eq!(form[3..], [b2, s2]);
        // Back to the prompt alone, said differently: nothing the proxy wrote is kept.
        let mut again = conversation("x");
        again["messages"] = json!([{"role": "user", "content": "Read g.rs."}]);
        assert_eq!(repeat(&bytes(&again), &again, Some(&kept)), Ok(None));
    }

    /// A message the proxy wrote for several of the client's (a marker): a rewind into the
    /// span it stands for keeps the record's form only up to it.
    #[test]
    fn a_rewind_into_a_moved_out_span_stops_before_its_marker() {
        let record = Forwarded {
            key: "forwarded-0".into(),
            covers: 6,
            client: String::new(),
            hashes: vec![0, 1, 2, 3, 4, 5],
            shown: vec![
                Shown::Client([0, 1]),
                Shown::Sent("{\"role\":\"user\",\"content\":\"marker\"}".into()),
                Shown::Client([4, 6]),
            ],
        };
        let shape = |m| {
            let (covers, parts) = record.prefix(m).unwrap();
            let parts: Vec<String> = parts
                .iter()
                .map(|p| match p {
                    Recorded::Client(i) => i.to_string(),
                    Recorded::Bytes(_) => "marker".into(),
                })
                .collect();
            (covers, parts.join(" "))
        };
        assert_eq!(shape(6), (6, "0 marker 4 5".into()));
        assert_eq!(shape(5), (5, "0 marker 4".into()));
        assert_eq!(shape(4), (4, "0 marker".into()));
        assert_eq!(shape(3), (1, "0".into()));
        assert_eq!(shape(1), (1, "0".into()));
        assert_eq!(shape(0), (0, "".into()));
    }

    /// A record that continues a branch replaces it; one that left it (a rewind, then other
    /// messages) is kept beside it, and a client going back to the branch left finds it.
    #[test]
    fn a_branch_left_is_kept_and_found_again() {
        let [a2, r2] = round(2, "the second file");
        let a = with_messages(&conversation("the whole file"), &[a2.clone(), r2.clone()]);
        let a_sent = with_messages(
            &conversation("the whole…"),
            &[a2, round(2, "the sec…")[1].clone()],
        );
        let first = Forwarded::record(&conversation("the whole file"), &conversation("the whole…"))
            .unwrap();
        let kept = records(first)
            .with(Forwarded::record(&a, &a_sent).unwrap())
            .unwrap();
        assert_eq!(
            kept.branches().len(),
            1,
            "the longer record continues the first"
        );
        // Rewound after the first result: another branch, its result truncated too.
        let [b2, s2] = round(7, "a third file");
        let b = with_messages(&conversation("the whole file"), &[b2.clone(), s2]);
        let b_sent = with_messages(
            &conversation("the whole…"),
            &[b2, round(7, "a th…")[1].clone()],
        );
        let both = kept.with(Forwarded::record(&b, &b_sent).unwrap()).unwrap();
        assert_eq!(both.branches().len(), 2);
        // Each branch, continued, gets its own form.
        for (client, sent) in [(&a, &a_sent), (&b, &b_sent)] {
            let next = with_messages(
                client,
                &[
                    json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "done", "signature": "s"},
                {"type": "text", "text": "Done."}]}),
                    json!({"role": "user", "content": "Next."}),
                ],
            );
            let form = messages_of(&repeat(&bytes(&next), &next, Some(&both)).unwrap().unwrap());
            assert_eq!(form[..5], sent["messages"].as_array().unwrap()[..]);
            assert_eq!(form[5..], next["messages"].as_array().unwrap()[5..]);
        }
        // At most MAX_BRANCHES are kept, the newest first.
        let mut many = both;
        for t in 10..20 {
            let [c2, u2] = round(t, "yet another");
            let c = with_messages(&conversation("the whole file"), &[c2, u2]);
            many = many.with(Forwarded::record(&c, &c).unwrap()).unwrap();
        }
        assert_eq!(many.branches().len(), MAX_BRANCHES);
        assert_eq!(many.branches()[0].hashes.len(), 5);
    }

    /// A record an earlier version kept (one, without its messages' hashes) still serves a
    /// client that continues all of it.
    #[test]
    fn a_single_record_of_an_earlier_version_still_reads() {
        let client = conversation("the whole file");
        let sent = conversation("the whole…");
        let mut record = Forwarded::record(&client, &sent).unwrap();
        // What an earlier version wrote: no hashes, the digest of the messages as sent (the
        // prompt, a string, read otherwise now).
        record.hashes.clear();
        record.client = digest(&bound_hashes_as_sent(&client));
        assert_ne!(record.client, digest(&bound_hashes(&client)));
        let mut old = serde_json::to_value(&record).unwrap();
        old.as_object_mut().unwrap().remove("hashes");
        let parsed = Records::parse(old.to_string().as_bytes()).unwrap();
        let form = repeat(&bytes(&client), &client, Some(&parsed))
            .unwrap()
            .unwrap();
        assert_eq!(messages_of(&form), sent["messages"].as_array().unwrap()[..]);
    }
}
