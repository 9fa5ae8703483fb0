//! The conversation model the engine decides over, the same for every wire format: a
//! conversation is a sequence of items — instructions, user turns, assistant turns, tool calls
//! and their results, and opaque items that stay bound to a neighbour — each with its token
//! count, a stable hash of its content and where it sits in the original bytes.
//!
//! An [`adapter`](super::adapter) reads a request of its wire format into items and writes the
//! engine's decision back. Pure: no I/O, and nothing here knows a field name of any wire
//! format.
//!
//! Units are the pieces a conversation may be cut into ([`units`]): a tool call item and every
//! result answering it form one unit, an opaque item bound to its neighbour goes with it, and
//! every other item is a unit alone. A unit is never split nor reordered. A conversation whose
//! results do not line up with their calls is [`Malformed`]: the engine leaves it as it came.

use std::collections::HashMap;
use std::ops::Range;

/// What an item is, as far as the engine is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind<'a> {
    /// The fixed instructions (system or developer prompt): pinned, never moved out.
    Instructions,
    /// A user turn (the first one is the task).
    User,
    /// An assistant turn without tool calls.
    Assistant,
    /// An assistant turn calling tools, by call id, in order (its results follow it).
    ToolCalls(Vec<&'a str>),
    /// The result of the call with this id.
    ToolResult(&'a str),
    /// An item the engine does not understand: never rewritten, moved only with what it is
    /// bound to.
    Opaque(Binding),
    /// Not an item of the wire format at all (the conversation is malformed).
    Invalid,
}

impl Kind<'_> {
    /// Whether the model wrote this item (an assistant turn, with or without calls).
    pub fn is_assistant(&self) -> bool {
        matches!(self, Kind::Assistant | Kind::ToolCalls(_))
    }
}

/// What an opaque item must stay next to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Nothing: a unit alone (an unknown chat role).
    Free,
    /// The item after it, in the same unit (a Responses `reasoning` item before its message or
    /// call).
    Next,
    /// The item before it, in the same unit.
    Previous,
}

/// One item of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<'a> {
    pub kind: Kind<'a>,
    /// Tokens of the item, framing included.
    pub tokens: usize,
    /// A stable hash of its content (0 when not computed): equal items hash equal, across
    /// requests and processes.
    pub hash: u128,
    /// Where the item's bytes sit in the request body, when read from bytes.
    pub span: Option<Range<usize>>,
}

/// Why a conversation cannot be cut into units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// Item `i` is not an item of the wire format (a chat message without a role, …).
    NotMessages(usize),
    /// A tool result that answers no call of the tool call item just before it.
    OrphanToolResult(usize),
    /// A tool call with no result before the next item that is not a result.
    MissingToolResult(usize),
    /// An opaque item bound to a neighbour it does not have.
    Unbound(usize),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Malformed::NotMessages(i) => {
                write!(f, "messages[{i}] is not a message object with a role")
            }
            Malformed::OrphanToolResult(i) => {
                write!(f, "messages[{i}] is a tool result without its call")
            }
            Malformed::MissingToolResult(i) => {
                write!(f, "messages[{i}] has a tool call without a result")
            }
            Malformed::Unbound(i) => {
                write!(f, "messages[{i}] is bound to a neighbour it does not have")
            }
        }
    }
}

/// Cuts `items` into units (contiguous ranges covering every item in order).
pub fn units(items: &[Item<'_>]) -> Result<Vec<Range<usize>>, Malformed> {
    let kinds: Vec<&Kind<'_>> = items.iter().map(|item| &item.kind).collect();
    units_of(&kinds)
}

/// [`units`] over the items' kinds alone.
pub fn units_of(kinds: &[&Kind<'_>]) -> Result<Vec<Range<usize>>, Malformed> {
    let mut units: Vec<Range<usize>> = Vec::with_capacity(kinds.len());
    let mut i = 0;
    // Where the unit being built began, when opaque items bound to the next one came first.
    let mut bound_from: Option<usize> = None;
    while i < kinds.len() {
        let start = bound_from.take().unwrap_or(i);
        match kinds[i] {
            Kind::Invalid => return Err(Malformed::NotMessages(i)),
            Kind::ToolResult(_) => return Err(Malformed::OrphanToolResult(i)),
            Kind::Opaque(Binding::Next) => {
                if i + 1 == kinds.len() {
                    return Err(Malformed::Unbound(i));
                }
                bound_from = Some(start);
                i += 1;
                continue;
            }
            Kind::Opaque(Binding::Previous) => {
                match units.last_mut() {
                    Some(last) if start == i => last.end = i + 1,
                    _ => return Err(Malformed::Unbound(i)),
                }
                i += 1;
                continue;
            }
            Kind::ToolCalls(ids) if !ids.is_empty() => {
                let call = i;
                i += 1;
                // Results in the order of their calls, the usual case, need no map.
                let mut in_order = 0;
                while in_order < ids.len() && i < kinds.len() {
                    match kinds[i] {
                        Kind::ToolResult(id) if *id == ids[in_order] => {
                            in_order += 1;
                            i += 1;
                        }
                        _ => break,
                    }
                }
                // Calls not yet answered, by id (a hash map: linear in the number of calls).
                let mut pending: HashMap<&str, usize> = HashMap::new();
                for &id in &ids[in_order..] {
                    *pending.entry(id).or_default() += 1;
                }
                while let Some(Kind::ToolResult(id)) = kinds.get(i) {
                    match pending.get_mut(id) {
                        Some(1) => {
                            pending.remove(id);
                        }
                        Some(n) => *n -= 1,
                        None => return Err(Malformed::OrphanToolResult(i)),
                    }
                    i += 1;
                }
                if !pending.is_empty() {
                    return Err(Malformed::MissingToolResult(call));
                }
                units.push(start..i);
            }
            _ => {
                units.push(start..i + 1);
                i += 1;
            }
        }
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: Kind<'_>) -> Item<'_> {
        Item {
            kind,
            tokens: 1,
            hash: 0,
            span: None,
        }
    }

    #[test]
    fn a_call_with_its_results_is_one_unit_in_any_order() {
        let items = [
            item(Kind::Instructions),
            item(Kind::User),
            item(Kind::ToolCalls(vec!["a", "b"])),
            item(Kind::ToolResult("b")),
            item(Kind::ToolResult("a")),
            item(Kind::Assistant),
        ];
        assert_eq!(units(&items).unwrap(), vec![0..1, 1..2, 2..5, 5..6]);
    }

    #[test]
    fn opaque_items_go_with_their_neighbour() {
        let items = [
            item(Kind::User),
            item(Kind::Opaque(Binding::Next)),
            item(Kind::ToolCalls(vec!["a"])),
            item(Kind::ToolResult("a")),
            item(Kind::Opaque(Binding::Next)),
            item(Kind::Assistant),
            item(Kind::Opaque(Binding::Previous)),
            item(Kind::Opaque(Binding::Free)),
        ];
        assert_eq!(units(&items).unwrap(), vec![0..1, 1..4, 4..7, 7..8]);
        let dangling = [item(Kind::User), item(Kind::Opaque(Binding::Next))];
        assert_eq!(units(&dangling), Err(Malformed::Unbound(1)));
        let first = [item(Kind::Opaque(Binding::Previous))];
        assert_eq!(units(&first), Err(Malformed::Unbound(0)));
    }

    #[test]
    fn unpaired_calls_and_results_are_malformed() {
        let orphan = [item(Kind::User), item(Kind::ToolResult("x"))];
        assert_eq!(units(&orphan), Err(Malformed::OrphanToolResult(1)));
        let missing = [
            item(Kind::ToolCalls(vec!["a", "b"])),
            item(Kind::ToolResult("a")),
            item(Kind::User),
        ];
        assert_eq!(units(&missing), Err(Malformed::MissingToolResult(0)));
        let invalid = [item(Kind::User), item(Kind::Invalid)];
        assert_eq!(units(&invalid), Err(Malformed::NotMessages(1)));
    }
}
