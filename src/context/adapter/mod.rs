//! Adapters: one per wire format, between a request body and the [conversation
//! model](super::model). An adapter reads a request into items (what each element of the
//! conversation is, its text) and writes the engine's decision back, touching only what
//! changed: an item the engine leaves alone keeps its bytes.
//!
//! The engine holds each item's JSON (its payload) and asks the adapter to read and rebuild it;
//! it never reads a field name itself. The adapters: chat completions ([`chat::Chat`]),
//! Anthropic Messages ([`messages::Messages`]) and the Responses API
//! ([`responses::Responses`]) (see `docs/conversation-model.md`); [`Wire`] names the formats
//! the planner is handed by a route. `scan` finds an array's elements in a body's bytes, for
//! every adapter's `spans`; `messages_added` writes what the proxy adds to a Messages request
//! (its hidden rounds put back, its tools) into the bytes.

pub mod chat;
pub mod messages;
pub mod messages_added;
pub mod messages_bound;
pub mod responses;
pub(crate) mod scan;

use std::borrow::Cow;
use std::ops::Range;

use serde_json::Value;

use super::model::{Item, Kind};

pub use chat::Chat;
pub use messages::Messages;
pub use responses::Responses;

use crate::tokens::{Counter, RequestCount};

/// The wire formats whose conversations the proxy manages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wire {
    /// Chat completions (`POST /v1/chat/completions`).
    #[default]
    Chat,
    /// The Responses API (`POST /v1/responses`).
    Responses,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
}

impl Wire {
    /// The adapter reading this format.
    pub fn adapter(self) -> &'static dyn Adapter {
        match self {
            Wire::Chat => &Chat,
            Wire::Responses => &Responses,
            Wire::Messages => &Messages,
        }
    }
}

/// One item as the summarizer reads it.
#[derive(Debug, Default)]
pub struct Readable<'v> {
    /// Who speaks (`user`, `assistant`, `tool`, an item type).
    pub who: Cow<'v, str>,
    /// The call this item answers.
    pub answers: Option<&'v str>,
    /// Its text, when it has one.
    pub text: Option<Cow<'v, str>>,
    /// The calls it makes, as `id name(arguments)`.
    pub calls: Vec<String>,
}

/// A wire format's view of a request's conversation.
pub trait Adapter: Send + Sync {
    /// The format's name, for logs (`chat`, …).
    fn name(&self) -> &'static str;

    /// What the upstream bills for `body`, per item of the conversation (in `payloads`
    /// order) and in all; by default by the chat rules (one item per element of `messages`).
    fn count(&self, counter: &Counter, body: &Value) -> RequestCount {
        counter.count_request(body)
    }

    /// Tokens of one item, framing included (what the engine counts a rewritten item with);
    /// by default by the chat rules.
    fn count_item(&self, counter: &Counter, item: &Value) -> usize {
        counter.count_message(item)
    }

    /// Why `item` must not be moved out, when it must not: an item whose type the adapter
    /// does not know (it may carry state the model needs), or one the proxy could not read
    /// back. A request whose moved-out span holds one goes unmanaged, with this reason.
    fn immovable(&self, item: &Value) -> Option<String> {
        let _ = item;
        None
    }

    /// The conversation's items as JSON values, in order, or `None` when the body holds no
    /// conversation.
    fn payloads<'b>(&self, body: &'b Value) -> Option<Cow<'b, [Value]>>;

    /// What one item is.
    fn kind<'v>(&self, item: &'v Value) -> Kind<'v>;

    /// The text an item carries that the engine may shorten (a string, or only text parts,
    /// joined by newlines), or `None`.
    fn text<'v>(&self, item: &'v Value) -> Option<Cow<'v, str>>;

    /// Whether [`Adapter::text`] has something for `item`, without building it.
    fn has_text(&self, item: &Value) -> bool {
        self.text(item).is_some()
    }

    /// The item's text when it is one string as sent (what a lossless transform may rewrite).
    fn whole_text<'v>(&self, item: &'v Value) -> Option<&'v str>;

    /// `item` with its text replaced by `text`, every other field kept in place.
    fn with_text(&self, item: &Value, text: String) -> Value;

    /// A user turn standing for moved-out items, reading `text`.
    fn marker(&self, text: String) -> Value;

    /// One item as the summarizer reads it ([`crate::context::summary::render_span`]): who
    /// speaks, the call it answers, its text, the calls it makes. By default by the chat rules.
    fn readable<'v>(&self, item: &'v Value) -> Readable<'v> {
        chat::readable(item)
    }

    /// One item as a line of the stored record of a moved-out span.
    fn line(&self, item: &Value) -> String {
        item.to_string()
    }

    /// Where the conversation and each item sit in `raw`, the body `payloads` was read from;
    /// `None` when they cannot be found (the bytes are not a body of this format).
    fn spans(&self, raw: &[u8]) -> Option<Spans>;

    /// Writes the new items into `body` in place of the conversation.
    fn write(&self, body: &mut Value, items: Vec<Value>);

    /// The items of `payloads`, with their counts and hashes (the same length, or empty when
    /// not computed) and their byte spans (when known).
    fn items<'v>(
        &self,
        payloads: &'v [Value],
        counts: &[usize],
        hashes: &[u128],
        spans: Option<&[Range<usize>]>,
    ) -> Vec<Item<'v>> {
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| Item {
                kind: self.kind(p),
                tokens: counts.get(i).copied().unwrap_or(0),
                hash: hashes.get(i).copied().unwrap_or(0),
                span: spans.and_then(|s| s.get(i).cloned()),
            })
            .collect()
    }
}

/// Where a conversation sits in a request's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spans {
    /// The conversation's array, brackets included.
    pub list: Range<usize>,
    /// Each item, in order.
    pub items: Vec<Range<usize>>,
}

/// One item of a body rebuilt from the original bytes.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'v> {
    /// Original item `i`, copied from the bytes as it came.
    Kept(usize),
    /// An item the engine wrote, serialized.
    New(&'v Value),
}

/// `raw` with the conversation at `spans.list` replaced by `pieces`: everything the engine did
/// not change keeps its bytes (whitespace, escapes, number forms, key order).
pub fn splice(raw: &[u8], spans: &Spans, pieces: &[Piece<'_>]) -> Vec<u8> {
    let items = &spans.items;
    let kept =
        |piece: Option<&Piece<'_>>, i: usize| matches!(piece, Some(Piece::Kept(k)) if *k == i);
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(&raw[..spans.list.start]);
    // Separators between originals still side by side keep their bytes too.
    match items.first() {
        Some(first) if kept(pieces.first(), 0) => {
            out.extend_from_slice(&raw[spans.list.start..first.start])
        }
        _ => out.push(b'['),
    }
    for (n, piece) in pieces.iter().enumerate() {
        if n > 0 {
            match (&pieces[n - 1], piece) {
                (Piece::Kept(a), Piece::Kept(b)) if *b == a + 1 => {
                    out.extend_from_slice(&raw[items[*a].end..items[*b].start])
                }
                _ => out.push(b','),
            }
        }
        match piece {
            Piece::Kept(i) => out.extend_from_slice(&raw[items[*i].clone()]),
            // A `Value` always serializes (its keys are strings).
            Piece::New(v) => out.extend_from_slice(v.to_string().as_bytes()),
        }
    }
    match items.last() {
        Some(last) if kept(pieces.last(), items.len() - 1) => {
            out.extend_from_slice(&raw[last.end..spans.list.end])
        }
        _ => out.push(b']'),
    }
    out.extend_from_slice(&raw[spans.list.end..]);
    out
}
