//! The context engine: decides what to truncate, compact and move out of one request, and
//! builds the new items. Pure: the conversation's items (the [model](super::model): what each
//! is, its tokens; their JSON read and rebuilt only through the wire format's
//! [adapter](super::adapter)), the settings and the decision recorded for this conversation's
//! prefix go in; the new items, the store writes they depend on, the new decision and a report
//! come out. No I/O, no clock, no randomness. ("Message" below means an item.)
//!
//! Stages, in order:
//! 0. **Lossless** (when `lossless`): every tool result, at first sight, loses what carries no
//!    information (JSON whitespace, runs of repeated lines; see `transforms`), when that saves
//!    tokens. The original is a [`Write`] like any other.
//! 1. **Truncate** any tool result or user text over the hard cap (a share of the budget):
//!    head and tail stay, and the result never exceeds the cap.
//! 2. **Compact** tool results over `tool_result_max_tokens` before the compaction boundary into
//!    a preview and a reference. The boundary only moves forward, and only in batches: when the
//!    results that aged out of the recent window would save `compact_batch_tokens` and the move
//!    pays for itself under the provider's prompt caching ([`rewrite_pays`]), when rewriting
//!    is free (the cache is cold, or the provider gives no discount), or when the request is
//!    over budget; it then jumps to the start of the recent window. Between moves the
//!    compacted prefix is byte-identical from one request to the next.
//! 3. **Move out** (auto, compress): the oldest whole units after the pinned head
//!    (system/developer messages and, with `pin_task`, the first user message) are replaced by
//!    one marker message placed after that head. The boundary stays where it was, goes to a
//!    ready summary's boundary when that pays, and over budget goes once, so the following
//!    turns extend the prefix for many turns: at the depth the [`CutModel`] prices lowest per
//!    turn, between the shallowest cut that fits and the low watermark (the target). When no
//!    cut within the recent window fits, a forced cut goes past it, up to the model's last
//!    answer. "Over budget" counts the room of the marker a prior cut left.
//! 4. **Squeeze** the round the model has not read when it alone still leaves the request over
//!    budget: its tool results are cut to one common cap ([`squeeze_cap`]), so parallel
//!    results share what the budget leaves. The [`Squeeze`] is part of the decision, repeated
//!    exactly while it stands (the model has read those results by the next request), and
//!    dropped once a cut moves its results out.
//!
//! **What the model has not seen is untouchable**: everything after the last assistant message
//! (the results it is about to read) is never compacted nor moved out; only the hard cap and
//! the squeeze may shorten it. The recent window is whole units, at least `keep_recent`
//! messages, and always includes that unseen part; only a forced cut goes past it.
//!
//! Every removed byte is in a [`Write`]; a conversation that is not well formed is left as it
//! came.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adapter::{Adapter, Chat};
use super::markers;
use super::model::{self, Item, Kind};
use super::settings::{Mode, Settings};
use super::transforms::{self, Lossless};
use crate::pricing::CachePricing;
use crate::store::{ContentKind, ContentRef};

/// The text of a chat message's content (the chat adapter's [`Adapter::text`]).
pub use super::adapter::chat::content_text;

/// Tokens the engine reserves for a truncation marker inside the hard cap.
const TRUNCATION_MARKER_TOKENS: usize = 120;

/// What the engine needs from outside: counting and content addressing. Both are pure
/// functions of their input; callers may cache them.
pub trait Env {
    /// Tokens of one message, framing included.
    fn count_message(&self, message: &Value) -> usize;
    /// The content-addressed reference of `text`.
    fn reference(&self, text: &str) -> ContentRef;
    /// The lossless form of a tool result ([`transforms::lossless`]); callers may cache it by
    /// content.
    fn lossless(&self, text: &str) -> Option<Arc<Lossless>> {
        transforms::lossless(text).map(Arc::new)
    }
}

/// Where the conversation's boundaries stand; recorded against the prefix it covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Tool results of messages before this index are compacted (when over the threshold).
    pub compact_before: usize,
    /// Messages from the end of the pinned head (instructions, and the task with `pin_task`)
    /// up to this index are moved out.
    pub offload_before: usize,
    /// The user message inside the moved-out run that stays, right after the marker: the
    /// latest user message when the cut reached into its turn's tool loop. Kept while the
    /// boundary stays, so the prefix does not change when the next turn begins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_user: Option<usize>,
    /// The tool results of a round squeezed to fit the budget while the model had not read
    /// them: repeated exactly while it stands, so the prefix does not change when the model
    /// has read them; dropped once its range is moved out or compacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub squeeze: Option<Squeeze>,
}

impl Decision {
    /// How many leading messages this decision depends on.
    pub fn prefix_len(&self) -> usize {
        self.compact_before
            .max(self.offload_before)
            .max(self.squeeze.map_or(0, |s| s.to))
    }
}

/// The tool results of `from..to` cut to head and tail at one common `cap` (tokens each):
/// a round too large for the budget, sharing it fairly ([`squeeze_cap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Squeeze {
    pub from: usize,
    pub to: usize,
    pub cap: usize,
}

/// The smallest cap a squeezed result is cut to: its head, its tail and the truncation
/// marker naming its reference still fit.
pub const SQUEEZE_FLOOR_TOKENS: usize = 240;

/// The largest common cap at which results of `counts` tokens (each cut to at most the cap)
/// take at most `room` tokens together, by bisection; never under [`SQUEEZE_FLOOR_TOKENS`]
/// (the results then take more than `room`: the budget is met when it can be). `None` when
/// they fit as they are.
pub fn squeeze_cap(counts: &[usize], room: usize) -> Option<usize> {
    let taken = |cap: usize| counts.iter().map(|&c| c.min(cap)).sum::<usize>();
    let largest = counts.iter().copied().max()?;
    if taken(largest) <= room {
        return None;
    }
    if taken(SQUEEZE_FLOOR_TOKENS) > room {
        return Some(SQUEEZE_FLOOR_TOKENS);
    }
    // taken(low) <= room < taken(high)
    let (mut low, mut high) = (SQUEEZE_FLOOR_TOKENS, largest);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if taken(mid) <= room {
            low = mid;
        } else {
            high = mid;
        }
    }
    Some(low)
}

/// Where the content of a write comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The text content of `messages[i]` of the input.
    MessageText(usize),
    /// Text built by the engine (moved-out messages, one JSON message per line).
    Owned(String),
}

/// Why content was written: what the model sees in its place. Ordered by how much was
/// removed; a reference written for two reasons keeps the larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// JSON whitespace removed (lossless).
    Minified,
    /// Runs of repeated lines collapsed (lossless).
    Deduped,
    /// Head and tail kept inline.
    Truncated,
    /// A preview and the reference.
    Compacted,
    /// Whole messages replaced by one marker.
    MovedOut,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Minified => "minified",
            Action::Deduped => "deduped",
            Action::Truncated => "truncated",
            Action::Compacted => "compacted",
            Action::MovedOut => "moved_out",
        }
    }
}

/// Content the output depends on: it must be in the store before the output is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub reference: ContentRef,
    pub kind: ContentKind,
    pub source: Source,
    /// What was done to it (for the context log).
    pub action: Action,
}

/// What was done, for headers and logs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub tokens_before: usize,
    pub tokens_after: usize,
    /// Tool results sent minified (not compacted later).
    pub minified: usize,
    /// Tool results sent with repeated lines collapsed (not compacted later).
    pub deduped: usize,
    pub truncated: usize,
    pub compacted: usize,
    pub offloaded: usize,
    /// Why the request was left alone although context management was on.
    pub skipped: Option<Skipped>,
    /// Tokens at the start of the forwarded request that the previous request of the
    /// conversation (everything before the model's last answer) also had, byte for byte, by
    /// the engine's own count: the cached prefix the proxy kept.
    pub kept_prefix_tokens: usize,
    /// Whether this request rewrote a message the previous request had sent (a move of a
    /// boundary): the provider bills everything after it again.
    pub rewrote_prefix: bool,
    /// Whether the budget forced the change (the request, as the prior decision leaves it, is
    /// over budget); otherwise every move was optional and priced.
    pub forced: bool,
    /// Set when the budget forced a cut that costs more per turn than going direct (by the
    /// [`CutModel`]): the pinned head leaves the budget too little room.
    pub costlier_than_direct: Option<Unpaid>,
    /// The first such cut of its session: the manager warned about it just now (set by the
    /// planner, counted by the metrics).
    pub warn_unpaid: bool,
    /// A request whose run is moved out (a forced cut now, or a boundary standing), priced
    /// for what follows: whether a summary of the run pays ([`summary_pays`]).
    pub priced: Option<Priced>,
    /// The marker of the moved-out run is part of `kept_prefix_tokens` (the boundary did not
    /// move): a summary placed into it later counts there too.
    pub marker_kept: bool,
    /// The kept prefix shows stored content (the marker, a compacted or truncated result):
    /// the previous request was offered the proxy's tools too, whose definitions the route
    /// then counts in the kept prefix as well.
    pub kept_refers_to_stored: bool,
    /// The pinned head takes more than half the budget ([`head_crowds_budget`]): the proxy's
    /// tools go out from the conversation's first request (set by the planner).
    pub head_crowds_budget: bool,
    /// Changes decided before a thinking block the model binds to its prefix were held back:
    /// only what follows the last thinking block changed (set when the decision is written;
    /// `x-context-actions` says `held_back=thinking`).
    pub held_back: bool,
    /// The form the conversation forwarded before went again, where it differs from the
    /// client's messages, with no change of this request's (a model binding thinking to its
    /// prefix: the engine planned nothing, or its changes were held back; `x-context-actions`
    /// says `repeated`).
    pub repeated: bool,
}

/// A forced cut that costs more than going direct, by the [`CutModel`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unpaid {
    /// The cut's expected input cost per turn over going direct's (above 1).
    pub ratio: f64,
    /// The smallest budget at which a cut of this conversation would pay
    /// ([`smallest_paying_budget`]); `None` when none would.
    pub smallest_paying_budget: Option<usize>,
}

/// Why a request was forwarded as it came although context management was on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// The body has no `messages` array: nothing to manage.
    NoMessages,
    /// The conversation is not well formed (a tool result without its call, …): the engine
    /// never rewrites what it cannot keep valid.
    Malformed(String),
    /// The span the engine would move out holds an item it must not move (an item type the
    /// adapter does not know, a sealed summary, a reference to server-side state).
    Immovable(String),
    /// The store failed, so nothing could be offloaded (fail-open).
    StoreUnavailable,
    /// Storing what the plan removes would go over a daily write quota (fail-open).
    QuotaExceeded(super::quota::Exceeded),
    /// The wire format's adapter cannot write the decision back without breaking a rule of its
    /// API (a thinking signature, an unknown block): the request goes as it came.
    Unmanaged(String),
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::NoMessages => f.write_str("no messages array"),
            Skipped::Malformed(why) => write!(f, "malformed conversation: {why}"),
            Skipped::Immovable(why) => f.write_str(why),
            Skipped::StoreUnavailable => f.write_str("store unavailable"),
            Skipped::Unmanaged(why) => write!(f, "unmanaged: {why}"),
            Skipped::QuotaExceeded(scope) => {
                write!(f, "store quota exceeded: {}", scope.as_str())
            }
        }
    }
}

impl Report {
    /// The `x-context-actions` header value.
    pub fn actions(&self) -> String {
        if let Some(why) = &self.skipped {
            return format!("skipped ({why})");
        }
        let mut parts = Vec::new();
        for (n, what) in [
            (self.minified, "minified"),
            (self.deduped, "deduped"),
            (self.truncated, "truncated"),
            (self.compacted, "compacted"),
            (self.offloaded, "offloaded"),
        ] {
            if n > 0 {
                parts.push(format!("{what}={n}"));
            }
        }
        if self.held_back {
            parts.push("held_back=thinking".into());
        }
        if self.repeated {
            parts.push("repeated".into());
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(",")
        }
    }
}

/// The engine's answer.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The new messages, or `None` when the request is forwarded unchanged.
    pub messages: Option<Vec<Value>>,
    pub writes: Vec<Write>,
    pub decision: Decision,
    pub report: Report,
    /// The input messages moved out behind one marker, which stands at `moved.start` of the
    /// new messages (where a summary is placed); the user message it keeps
    /// ([`Decision::kept_user`]) follows the marker.
    pub moved: Option<Range<usize>>,
}

/// One request's conversation, as counted.
pub struct Input<'a> {
    /// The items' JSON, read and rebuilt only through `adapter`.
    pub messages: &'a [Value],
    /// What each item is (same length as `messages`).
    pub items: Vec<Item<'a>>,
    /// The wire format of `messages`.
    pub adapter: &'a dyn Adapter,
    /// Tokens of each message, framing included (same length as `messages`).
    pub counts: &'a [usize],
    /// Tokens outside the messages: reply priming, tool schemas, response format.
    pub fixed: usize,
    /// Whether the provider may still hold this conversation's prefix in its cache (its
    /// previous request is younger than the cache's lifetime, or unknown). A cold cache makes
    /// rewriting the prefix free.
    pub cache_warm: bool,
    /// A summary is ready for the moved-out span up to this boundary: the move-out may go
    /// there ahead of the budget, when that pays.
    pub ready_summary: Option<ReadySummary>,
}

/// A ready summary of the span moved out up to `prefix_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadySummary {
    pub prefix_len: usize,
    /// Tokens of the summary text, placed in the marker.
    pub tokens: usize,
}

impl<'a> Input<'a> {
    /// A chat conversation as counted, the cache warm and no summary ready.
    pub fn new(messages: &'a [Value], counts: &'a [usize], fixed: usize) -> Input<'a> {
        Input::read(&Chat, messages, counts, &[], fixed)
    }

    /// A conversation of `adapter`'s wire format as counted (`hashes`: each item's stable
    /// hash, or empty), the cache warm and no summary ready.
    pub fn read(
        adapter: &'a dyn Adapter,
        messages: &'a [Value],
        counts: &'a [usize],
        hashes: &[u128],
        fixed: usize,
    ) -> Input<'a> {
        Input {
            messages,
            items: adapter.items(messages, counts, hashes, None),
            adapter,
            counts,
            fixed,
            cache_warm: true,
            ready_summary: None,
        }
    }

    /// Where what the previous request of this conversation held ends: at the model's last
    /// answer (0 when it has not answered yet).
    pub fn answered_end(&self) -> usize {
        self.items
            .iter()
            .rposition(|m| m.kind.is_assistant())
            .unwrap_or(0)
    }

    /// The kept prefix of this request forwarded as it came: everything before the model's
    /// last answer, with the tools and framing.
    pub fn unchanged_prefix_tokens(&self) -> usize {
        match self.answered_end() {
            0 => 0,
            end => self.fixed + self.counts[..end].iter().sum::<usize>(),
        }
    }
}

/// Whether an optional rewrite of the cached prefix pays for itself over the horizon:
///
/// `freed × cached_read_rate × horizon_turns > rebilled × (1 + cache_write_premium − cached_read_rate)`
///
/// `freed`: the tokens the rewrite removes from every later request, which would otherwise be
/// read from the cache at the cached rate on each of the next `horizon_turns` requests.
/// `rebilled`: the tokens after the first rewritten message that the previous request already
/// had in the cache; the next request pays them in full (plus the write premium) instead of at
/// the cached rate, once. With no discount (`cached_read_rate` = 1, no premium) every rewrite
/// that frees something pays.
pub fn rewrite_pays(
    freed: usize,
    rebilled: usize,
    cache: &CachePricing,
    horizon_turns: f64,
) -> bool {
    freed > 0
        && freed as f64 * cache.cached_read_rate * horizon_turns
            > rebilled as f64 * cache.rebill_rate()
}

/// What a rewrite frees and bills again ([`rewrite_pays`]'s terms) when it is the first to make
/// the request refer to stored content, and so brings the proxy's `tools` (their definitions'
/// tokens; 0: none come): they lead the prompt a provider caches, so `before` (the tokens in
/// front of the first rewritten message, the previous request's, cached) is billed again too,
/// and the tools go out with every later request.
///
/// Derivation: over `H` requests from the rewrite, without it each reads `before + rebilled +
/// freed` from the cache (at `r`); with it the first writes `tools + before + rebilled` (at
/// `1 + w`) and the next `H − 1` read them (at `r`). The difference is
/// `(freed − tools)·r·H − (rebilled + before + tools)·(1 + w − r)`: [`rewrite_pays`] with
/// `freed − tools` freed and `rebilled + before + tools` billed again.
pub fn with_tools_added(
    freed: usize,
    rebilled: usize,
    before: usize,
    tools: usize,
) -> (usize, usize) {
    if tools == 0 {
        return (freed, rebilled);
    }
    (freed.saturating_sub(tools), rebilled + before + tools)
}

/// What the cost of a forced cut's depth depends on, besides the request it leaves.
///
/// The model ([`cut_cost_per_turn`]): a cut that leaves a request of `s` tokens bills the
/// pinned head (`head`, unchanged, so read from the cache) at the cached rate and everything
/// after it written again in full (plus the write premium); then the conversation grows by
/// `growth` tokens a turn, each turn reading the previous request from the cache and writing
/// its new tokens, until the budget forces the next cut, after `(budget − s) / growth` turns,
/// or until the horizon ends, whichever comes first. The expected input cost per turn is that
/// cycle's cost over its turns (the cut's included). A deeper cut (a smaller `s`) rebills less
/// on the cut and on every later turn and lets more turns pass before the next cut; a shallower
/// one keeps a prompt the provider still caches when the deep one falls under its minimum
/// cacheable prefix. The cached rate, the write premium, the minimum prefix and the growth so
/// far decide between them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CutModel {
    /// The budget the request must fit.
    pub budget: usize,
    /// Tokens of the pinned head (tools, instructions, the task) before the first moved unit:
    /// the cut leaves them where they were, so they stay cached.
    pub head: usize,
    /// The conversation's growth per turn so far, in tokens.
    pub growth: f64,
    /// Further requests the cut is priced over: as many as the conversation has made, at most
    /// `cache_horizon_turns`.
    pub horizon: f64,
    pub cache: CachePricing,
    /// The proxy's tools' tokens when this cut is the first to refer to stored content (the
    /// marker does) and brings them: they lead the cached prompt, so the cut reads nothing from
    /// the cache, and they go out with every later request. 0 when they are there already, or
    /// not offered.
    pub tools: usize,
}

/// Expected input cost per turn, in full-price tokens, of a forced cut that leaves a request
/// of `size` tokens (see [`CutModel`]).
///
/// Derivation. Let `s = size`, `g` the growth per turn, `n = min(horizon, (budget − s) / g)`
/// the turns until the next forced cut (a real number: the growth is an average), and
/// `call(t, c)` the provider's price of a request of `t` tokens whose first `c` repeat the
/// previous request ([`CachePricing::call_cost`]: cached at `cached_read_rate` when `c` is at
/// least the minimum prefix, the rest at `1 + cache_write_premium`). Turn 0 is the cut, turn
/// `k` extends turn `k − 1` by `g`:
///
/// `cost = call(s, head) + Σ_{k=1..⌊n⌋} call(s + k·g, s + (k−1)·g) + (n − ⌊n⌋)·call(s + (⌊n⌋+1)·g, s + ⌊n⌋·g)`
///
/// and the cost per turn is `cost / (1 + n)`. Without caching (`cached_read_rate` 1, no
/// premium) every term is the request's size, so the cost per turn is `s + g·φ(n)` with
/// `φ` rising more slowly than `n` falls: it grows with `s`, and the deepest cut is the
/// cheapest, as the low watermark has it. With a discount, the cut's rewrite
/// (`s − head` at the full rate) is paid once per cycle, so a longer cycle (a deeper cut)
/// spreads it thinner; but a request under the minimum cacheable prefix pays every turn in
/// full.
///
/// When the cut brings the proxy's tools (`tools = t > 0`), every request of the cycle is `t`
/// larger and the cut reads nothing from the cache: `call(s + t, 0)` first, then
/// `call(s + t + k·g, s + t + (k−1)·g)`. The whole head is billed again once per cycle, so
/// a deeper cut (a longer cycle) spreads that thinner too. (`n` counts from the budget as the
/// engine has it: the planner keeps the tools' room in it when they do not fit beside the
/// request.)
pub fn cut_cost_per_turn(size: usize, model: &CutModel) -> f64 {
    let room = model.budget.saturating_sub(size) as f64;
    let n = if model.growth > 0.0 {
        model.horizon.min(room / model.growth)
    } else {
        model.horizon
    };
    let sent = size + model.tools;
    let cached = if model.tools > 0 {
        0
    } else {
        model.head.min(size)
    };
    let cut = model.cache.call_cost(sent, cached);
    per_turn(cut, sent, n, model)
}

/// `first` (the cost of turn 0, a request of `size`), then `n` turns (a real number) each
/// growing by the model's growth and reading the previous one from the cache: per turn.
fn per_turn(first: f64, size: usize, n: f64, model: &CutModel) -> f64 {
    let n = n.max(0.0);
    let g = model.growth.max(0.0);
    let at = |k: f64| (size as f64 + k * g).round() as usize;
    let turn = |k: f64| model.cache.call_cost(at(k), at(k - 1.0));
    let whole = n.floor();
    let mut cost = first;
    let mut k = 1.0;
    while k <= whole {
        cost += turn(k);
        k += 1.0;
    }
    cost += (n - whole) * turn(whole + 1.0);
    cost / (1.0 + n)
}

/// Of the requests a forced cut may leave (`sizes`, from the shallowest cut that fits the
/// budget to the deepest, the one down to the low watermark), the index of the one the
/// [`CutModel`] prices lowest per turn; a tie goes to the deeper cut, so floating-point noise
/// never makes a cut shallower.
pub fn cheapest_cut(sizes: &[usize], model: &CutModel) -> usize {
    let Some((&deepest, shallower)) = sizes.split_last() else {
        return 0;
    };
    let mut best = (shallower.len(), cut_cost_per_turn(deepest, model));
    for (i, &size) in shallower.iter().enumerate().rev() {
        let cost = cut_cost_per_turn(size, model);
        if cost < best.1 - 1e-9 * best.1.abs().max(1.0) {
            best = (i, cost);
        }
    }
    best.0
}

/// What the bill compares once a forced cut is made: the proxy's requests and going direct's
/// over the same next requests of the conversation, for the warning that a budget costs more
/// than no budget ([`Unpaid`]). The cut's depth is chosen by [`cut_cost_per_turn`], over one
/// cycle to the next cut; whether the budget pays is a question about the whole rest of the
/// conversation, so both sides are priced here request by request over one common horizon,
/// each growing as it does on the wire:
///
/// - **through the proxy**: the cut's request (`size` and the tools it brings; the pinned head
///   read from the cache unless the tools come before it), then each turn the conversation as
///   the proxy forwards it grows by `growth` (what it holds past the head over its requests so
///   far, after the proxy's own transforms: truncated, compacted, moved out); each turn reads
///   the previous request from the cache; when it would pass the budget it is cut again, down
///   to `kept`, the head (and tools) read from the cache and the rest written again;
/// - **going direct**: the request as the client sent it (`raw`), of which `raw_prefix` (what
///   the previous request held) is read from the cache and the rest written; then each turn it
///   grows by the cut model's `growth` (the client's own growth per request), reading the
///   previous request and writing its new tokens. It is never cut: every request carries all
///   that came before, which is what the proxy saves on a long conversation.
///
/// Both totals are taken over `1 + horizon` requests (the last weighed by its fraction) and
/// divided by as many: [`with_proxy_per_turn`] over [`direct_per_turn`] is the ratio the
/// warning states. (The previous comparison priced one cut's cycle per turn against going
/// direct over a horizon of as many requests as the conversation had made: a cut early in a
/// fast-growing coding session, whose cycle is short and costly, looked dearer than going
/// direct for two or three requests, while going direct rereads the whole growing session on
/// every later one; the whole-session bill was 0.25× while it said no budget would pay.)
///
/// Without caching both sides pay every token they send, so the proxy costs more only when it
/// sends more: a cut that moves out less than its marker and the tools it brings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outlook {
    /// The cut's model: the budget, the pinned head, the client's growth per request, the
    /// cache prices and the tools the cut brings (its own `horizon` is the cut's, not this).
    pub model: CutModel,
    /// Tokens a later cut leaves: as many as this one forwards (the same head and marker, a
    /// recent window of as many messages), or the low watermark when that is more.
    pub kept: usize,
    /// The conversation's growth per request as the proxy forwards it.
    pub growth: f64,
    /// The request as the client sent it, and the part of it the previous request held.
    pub raw: usize,
    pub raw_prefix: usize,
    /// Further requests both sides are priced over (`cache_horizon_turns`).
    pub horizon: f64,
}

/// Expected input cost per request through the proxy from a forced cut leaving `size` tokens
/// (see [`Outlook`]). Turn 0 is the cut; turn `k` (weight `min(1, horizon − k + 1)`) is the
/// previous request grown by `growth`, or cut again to `kept` when that passes the budget:
///
/// `cost = call(size + t, head·[t = 0]) + Σ_k w_k · (grown ≤ budget ? call(grown + t, previous + t) : call(kept + t, head + t))`
///
/// over `1 + horizon`, `t` the tools the cut brings (from then on in every request, first).
pub fn with_proxy_per_turn(size: usize, outlook: &Outlook) -> f64 {
    let m = &outlook.model;
    let t = m.tools;
    let cached = if t > 0 { 0 } else { m.head.min(size) };
    let mut cost = m.cache.call_cost(size + t, cached);
    let mut previous = size as f64;
    let g = outlook.growth.max(0.0);
    each_turn(outlook.horizon, |w| {
        let grown = previous + g;
        let (now, shared) = if grown > m.budget as f64 {
            (outlook.kept as f64, m.head.min(outlook.kept) as f64)
        } else {
            (grown, previous)
        };
        cost += w * m
            .cache
            .call_cost(now.round() as usize + t, shared.round() as usize + t);
        previous = now;
    });
    cost / (1.0 + outlook.horizon.max(0.0))
}

/// Expected input cost per request going direct over the same requests (see [`Outlook`]):
///
/// `cost = call(raw, raw_prefix) + Σ_k w_k · call(raw + k·g, raw + (k − 1)·g)`
///
/// over `1 + horizon`, `g` the client's growth per request.
pub fn direct_per_turn(outlook: &Outlook) -> f64 {
    let m = &outlook.model;
    let mut cost = m
        .cache
        .call_cost(outlook.raw, outlook.raw_prefix.min(outlook.raw));
    let mut previous = outlook.raw as f64;
    let g = m.growth.max(0.0);
    each_turn(outlook.horizon, |w| {
        let now = previous + g;
        cost += w * m
            .cache
            .call_cost(now.round() as usize, previous.round() as usize);
        previous = now;
    });
    cost / (1.0 + outlook.horizon.max(0.0))
}

/// Calls `turn` with the weight of each turn `k = 1, 2, …` of a horizon of `horizon` turns (a
/// real number): 1, and the fraction left for the last.
fn each_turn(horizon: f64, mut turn: impl FnMut(f64)) {
    let mut k = 1.0;
    while k < horizon + 1.0 {
        turn((horizon - (k - 1.0)).min(1.0));
        k += 1.0;
    }
}

/// The smallest budget at which this conversation's forced cuts cost no more per request than
/// going direct (by the [`Outlook`]): at a budget `b` the conversation is cut when the request
/// the proxy forwards reaches `b` (going direct it is then `b` scaled as the client's request
/// is to the proxy's, `raw_per_managed`, with this turn's new tokens unchanged), down to
/// `kept(b)` tokens, and later cuts keep as much (a budget under that is never met); with a
/// `summary`, its marker holds one ([`with_summary_per_turn`]). `None` when no budget up to 64
/// times the model's pays.
pub fn smallest_paying_budget(
    outlook: &Outlook,
    raw_per_managed: f64,
    kept: impl Fn(usize) -> usize,
    summary: Option<&SummaryCall>,
) -> Option<usize> {
    let new = outlook.raw.saturating_sub(outlook.raw_prefix);
    // A budget under what its cut keeps cannot be met at all.
    let pays = |b: usize| {
        let raw = ((b as f64 * raw_per_managed.max(1.0)).round() as usize).max(b);
        let at = Outlook {
            model: CutModel {
                budget: b,
                ..outlook.model
            },
            kept: kept(b),
            raw,
            raw_prefix: raw.saturating_sub(new),
            ..*outlook
        };
        let with = match summary {
            Some(call) => with_summary_per_turn(kept(b), &at, call),
            None => with_proxy_per_turn(kept(b), &at),
        };
        kept(b) <= b && with <= direct_per_turn(&at)
    };
    let budget = outlook.model.budget.max(1);
    let (mut low, mut high) = (budget, budget);
    while !pays(high) {
        if high >= budget.saturating_mul(64) {
            return None;
        }
        low = high;
        high = high.saturating_mul(2);
    }
    // pays(high); not pays(low) unless low == high.
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if pays(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high)
}

/// A summary's own call to the summarizer, priced in full-price input tokens of the request's
/// model: what [`summary_pays`] weighs besides the tokens the summary adds to the requests it
/// rides in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SummaryCall {
    /// The summarizer's input: its instructions, the previous summary it merges and the span
    /// as it reads it (compacted), billed in full (a summarizer call shares no cached prefix
    /// with the conversation's).
    pub input: usize,
    /// The summary's expected tokens: written by the summarizer (billed at its output price),
    /// then carried in the marker of every later request.
    pub output: usize,
    /// One input token and one output token of the summarizer model, in full-price input
    /// tokens of the request's model (`ModelPrice::relative_cost`: a model missing from the
    /// price table is priced as the request's own, and one whose prices nobody knows with its
    /// output at `UNKNOWN_OUTPUT_RATIO` times its input).
    pub input_price: f64,
    pub output_price: f64,
}

impl SummaryCall {
    /// The call's cost: its input and its output, each at the summarizer model's price.
    pub fn cost(&self) -> f64 {
        self.input as f64 * self.input_price + self.output as f64 * self.output_price
    }
}

/// Expected cost per request through the proxy from a cut leaving `size` tokens whose marker
/// holds a summary (see [`summary_pays`]): [`with_proxy_per_turn`] with every request the
/// summary's `output` tokens larger (the cut's, the later ones', those later cuts keep: the
/// summary stays in the marker), plus the summarizer call spread over the same `1 + horizon`
/// requests.
pub fn with_summary_per_turn(size: usize, outlook: &Outlook, call: &SummaryCall) -> f64 {
    let with = Outlook {
        kept: outlook.kept + call.output,
        ..*outlook
    };
    with_proxy_per_turn(size + call.output, &with) + call.cost() / (1.0 + outlook.horizon.max(0.0))
}

/// Whether summarizing the span a cut moves out pays: the conversation's expected bill with
/// the summary stays at or under going direct's over the same requests ([`Outlook`]).
///
/// A summary buys the model a readable account of what was moved out, not tokens: the plain
/// marker already names every original, readable through `context_read`. So it is bought
/// only with what the cut saves, and the rule is the issue's: the proxy, its own calls
/// included, must not cost more than going direct. Derivation, over the outlook's `1 + H`
/// requests (`H` = `horizon`), in full-price input tokens of the request's model:
///
/// - **the summarizer call**, once: `input × input_price + output × output_price`
///   ([`SummaryCall::cost`]; uncached: it shares no prefix with the conversation);
/// - **the summary in the marker**: `output` more tokens in every request from the one that
///   places it. The request that places it writes them at the full rate (`1 + premium`), and
///   rewrites everything after the marker with them: at the cut that is the cut's own rewrite,
///   already in the outlook's first request; placed in a marker that stood before (a summary
///   made later, or ahead of the cut) it is that request's rewrite, priced the same way, the
///   request as forwarded taken as the outlook's first. Every later request reads them from
///   the cache at `cached_read_rate`; a later cut keeps the marker and its summary, so it
///   writes them again, and, the requests being larger, the budget forces it sooner. All of
///   it is [`with_proxy_per_turn`] with `size + output` and `kept + output`.
///
/// Summed: `cost_with = (1 + H)·with_proxy_per_turn(size + output) + call.cost()`, and the
/// summary pays when `cost_with ≤ (1 + H)·direct_per_turn` (both per request here:
/// [`with_summary_per_turn`] ≤ [`direct_per_turn`]). Otherwise the span goes behind the
/// plain marker.
///
/// Without caching (the `none` preset) both sides pay every token they send: a summary pays
/// when the tokens the cuts save over the horizon cover the summarizer call and the summary's
/// tokens in every request. With the summarizer's prices unknown, its call is priced as the
/// request's own model (`SummaryCall`'s prices): never free.
pub fn summary_pays(size: usize, outlook: &Outlook, call: &SummaryCall) -> bool {
    with_summary_per_turn(size, outlook, call) <= direct_per_turn(outlook)
}

/// A request whose run is moved out (a forced cut now, or a boundary standing), priced for
/// what follows: the warning that a budget costs more than going direct, and whether a
/// summary of the run pays ([`summary_pays`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Priced {
    /// A forced cut made now (else a boundary standing): the warning is about such a cut.
    pub cut: bool,
    /// The request as forwarded (the marker without a summary): the outlook's first.
    pub size: usize,
    /// The model's answers so far: the requests the conversation's growth is averaged over.
    pub answers: usize,
    pub outlook: Outlook,
    /// The client's request over the conversation as the proxy holds it before the move: a
    /// budget's client request is the budget scaled so ([`smallest_paying_budget`]).
    pub raw_per_managed: f64,
    /// The low watermark's share of the budget (`target / budget`).
    pub target_ratio: f64,
    /// What a later cut keeps at least: the request as forwarded.
    pub steady: usize,
}

impl Priced {
    /// The same conversation priced for a cut leaving `size` tokens of the `held` tokens the
    /// proxy holds, at a budget of `budget` (low watermark `target`): a summary made ahead of
    /// the cut it will be placed with is priced so, from a candidate cut made at another budget.
    pub fn at(&self, budget: usize, target: usize, held: usize, size: usize) -> Priced {
        let model = CutModel {
            budget,
            ..self.outlook.model
        };
        let steady = size;
        Priced {
            cut: false,
            size,
            outlook: Outlook {
                model,
                kept: target.max(steady),
                growth: held.saturating_sub(model.head) as f64 / self.answers.max(1) as f64,
                ..self.outlook
            },
            target_ratio: target as f64 / budget.max(1) as f64,
            steady,
            ..*self
        }
    }

    /// Tokens a later cut keeps at a budget of `b`: the low watermark, or the steady request
    /// when that is more.
    pub fn kept_at(&self, b: usize) -> usize {
        ((b as f64 * self.target_ratio) as usize).max(self.steady)
    }

    /// Whether this conversation costs more than going direct from here, by the [`Outlook`]
    /// (its marker holding a summary made by `call`, when one is), and then the smallest
    /// budget that pays.
    pub fn unpaid(&self, summary: Option<&SummaryCall>) -> Option<Unpaid> {
        let with = match summary {
            Some(call) => with_summary_per_turn(self.size, &self.outlook, call),
            None => with_proxy_per_turn(self.size, &self.outlook),
        };
        let direct = direct_per_turn(&self.outlook);
        (with > direct && direct > 0.0).then(|| Unpaid {
            ratio: with / direct,
            smallest_paying_budget: smallest_paying_budget(
                &self.outlook,
                self.raw_per_managed,
                |b| self.kept_at(b),
                summary,
            ),
        })
    }
}

/// Whether a lossless transform applies to some tool result (asked of `env`, which callers
/// cache by content, so a conversation seen before costs one hash per result).
pub fn has_pending_transform(adapter: &dyn Adapter, messages: &[Value], env: &dyn Env) -> bool {
    messages.iter().any(|m| {
        matches!(adapter.kind(m), Kind::ToolResult(_))
            && adapter
                .whole_text(m)
                .is_some_and(|text| env.lossless(text).is_some())
    })
}

/// What happened to one message.
#[derive(Debug, Clone, Default)]
struct Slot {
    /// Its replacement, when it changed.
    message: Option<Value>,
    /// The lossless form it was sent in, when one applied.
    lossless: Option<Arc<Lossless>>,
    truncated: bool,
    /// Its tokens before it was truncated (its lossless form's), when it was.
    untruncated: Option<usize>,
    compacted: bool,
}

impl Slot {
    /// Whether the message is sent in another form than it came.
    fn changed(&self) -> bool {
        self.compacted || self.truncated || self.lossless.is_some()
    }
}

/// The request being rebuilt.
#[derive(Clone)]
struct Work<'a> {
    input: &'a Input<'a>,
    env: &'a dyn Env,
    slots: Vec<Slot>,
    /// Per message: its tokens as it now stands.
    counts: Vec<usize>,
    writes: Vec<Write>,
    /// The decision recorded for this conversation's prefix.
    prior: Decision,
}

impl Work<'_> {
    fn total(&self) -> usize {
        self.input.fixed + self.counts.iter().sum::<usize>()
    }

    fn write(&mut self, reference: ContentRef, kind: ContentKind, source: Source, action: Action) {
        match self.writes.iter_mut().find(|w| w.reference == reference) {
            Some(w) => w.action = w.action.max(action),
            None => self.writes.push(Write {
                reference,
                kind,
                source,
                action,
            }),
        }
    }

    fn replace(&mut self, i: usize, message: Value) {
        self.counts[i] = self.env.count_message(&message);
        self.slots[i].message = Some(message);
    }

    fn is_compacted(&self, i: usize) -> bool {
        self.slots[i].compacted
    }

    /// Stage 0 on message `i`: the lossless form of a tool result, kept when it saves tokens.
    fn lossless(&mut self, i: usize) {
        let (input, message) = (self.input, &self.input.messages[i]);
        if !matches!(input.items[i].kind, Kind::ToolResult(_)) {
            return;
        }
        let Some(text) = input.adapter.whole_text(message) else {
            return;
        };
        let Some(lossless) = self.env.lossless(text) else {
            return;
        };
        let new = input.adapter.with_text(message, lossless.text.clone());
        let tokens = self.env.count_message(&new);
        if tokens >= self.counts[i] {
            return;
        }
        let action = if lossless.minified {
            Action::Minified
        } else {
            Action::Deduped
        };
        let reference = self.env.reference(text);
        self.write(
            reference,
            ContentKind::ToolResult,
            Source::MessageText(i),
            action,
        );
        self.counts[i] = tokens;
        self.slots[i].message = Some(new);
        self.slots[i].lossless = Some(lossless);
    }

    /// Stage 1 on message `i`: head and tail of its text as it now stands, never over `cap`.
    fn truncate(&mut self, i: usize, cap: usize, readback: &markers::Readback) {
        let (input, message) = (self.input, &self.input.messages[i]);
        let kind = match input.items[i].kind {
            Kind::ToolResult(_) => ContentKind::ToolResult,
            Kind::User => ContentKind::UserText,
            _ => return,
        };
        if self.counts[i] <= cap {
            return;
        }
        // Cut again (squeezed under a smaller cap): from the whole text, as at first sight.
        let tokens = self.slots[i].untruncated.unwrap_or(self.counts[i]);
        let Some(original) = input.adapter.text(message) else {
            return;
        };
        let text: &str = match &self.slots[i].lossless {
            Some(l) => &l.text,
            None => &original,
        };
        let reference = self.env.reference(&original);
        // The cut is estimated from the text's own characters per token; a text whose tokens
        // are unevenly spread may come out over the cap: cut again, smaller, until it fits
        // (the last attempt keeps only the marker).
        let mut keep = cap.saturating_sub(TRUNCATION_MARKER_TOKENS);
        let mut replacement = None;
        let mut last_got = None;
        for attempt in 0..TRUNCATION_ATTEMPTS {
            if attempt + 1 == TRUNCATION_ATTEMPTS {
                keep = 0;
            }
            let new = input.adapter.with_text(
                message,
                markers::truncated(text, tokens, keep, &reference, readback),
            );
            let got = self.env.count_message(&new);
            if got <= cap {
                replacement = Some(new);
                break;
            }
            // Aim below the cap by the overshoot and a little more; when the last step changed
            // nothing (the cut snaps to the same line breaks), by a few lines' worth.
            let over = got - cap;
            let mut step = over + over / 2 + 8;
            if last_got == Some(got) {
                step = step.max(keep / 16);
            }
            last_got = Some(got);
            keep = keep.saturating_sub(step);
        }
        let Some(new) = replacement else {
            return;
        };
        self.write(reference, kind, Source::MessageText(i), Action::Truncated);
        self.replace(i, new);
        self.slots[i].truncated = true;
        self.slots[i].untruncated = Some(tokens);
    }

    /// The tool results of `range` cut to at most `cap` tokens each ([`Squeeze`]).
    fn squeeze(&mut self, range: Range<usize>, cap: usize, readback: &markers::Readback) {
        for i in range {
            if matches!(self.input.items[i].kind, Kind::ToolResult(_)) {
                self.truncate(i, cap, readback);
            }
        }
    }

    /// Stages 0 and 1 on every message: the lossless transforms (when on), then the hard cap.
    fn first_sight(&mut self, settings: &Settings) {
        let n = self.slots.len();
        if settings.lossless {
            for i in 0..n {
                self.lossless(i);
            }
        }
        for i in 0..n {
            self.truncate(i, settings.truncate_tokens, &settings.readback);
        }
    }

    /// Whether message `i` is a tool result compaction would shrink.
    fn compactable(&self, i: usize, threshold: usize) -> bool {
        matches!(self.input.items[i].kind, Kind::ToolResult(_))
            && (self.counts[i] > threshold || self.slots[i].truncated)
            && self.input.adapter.has_text(&self.input.messages[i])
    }

    /// Stage 2 on message `i` (a compactable tool result): a preview of the original text.
    fn compact(&mut self, i: usize, settings: &Settings) {
        let (input, message) = (self.input, &self.input.messages[i]);
        let Some(text) = input.adapter.text(message) else {
            return;
        };
        let reference = self.env.reference(&text);
        let preview = markers::compacted(
            &text,
            self.input.counts[i],
            &reference,
            settings.preview_head_lines,
            settings.preview_tail_lines,
            &settings.readback,
        );
        let new = input.adapter.with_text(message, preview);
        self.write(
            reference,
            ContentKind::ToolResult,
            Source::MessageText(i),
            Action::Compacted,
        );
        self.replace(i, new);
        self.slots[i].compacted = true;
    }
}

/// Whether no decision can change this request: it is within budget, no message is over the
/// truncation or compaction thresholds, and no tool result has a lossless transform. The
/// caller may then skip the session lookup and [`run`] altogether.
///
/// The one case where [`run`] could still act is a conversation moved out earlier that is back
/// under budget, which needs the budget or mode to have changed between its requests.
pub fn nothing_to_do(
    adapter: &dyn Adapter,
    total: usize,
    per_message: &[usize],
    messages: &[Value],
    settings: &Settings,
    env: &dyn Env,
) -> bool {
    let largest = per_message.iter().copied().max().unwrap_or(0);
    settings.mode == Mode::Off
        || (total <= settings.budget
            && largest
                <= settings
                    .tool_result_max_tokens
                    .min(settings.truncate_tokens)
            && !(settings.lossless && has_pending_transform(adapter, messages, env)))
}

/// Whether the pinned head — the tools, the instructions and, with `pin_task`, the task: what
/// a cut never moves — takes more than half the budget, where rewriting the cached prefix
/// costs something. Such a conversation will be cut (the room past its head is smaller than the
/// head), and the proxy's tools, offered only once a marker names stored content, would then
/// change the request's `tools`, which come first in the prompt a provider's cache keys: the
/// whole head billed again at the first cut (on support-shaped traffic at a budget ~2k past
/// the head, that rebill alone made the bill 1.11× going direct at 10% cached reads; with the
/// tools there from the start, 0.93×). The route offers them from the conversation's first
/// request instead, when nothing is cached yet. The same answer for every request of a
/// conversation (its head and budget do not change), so the tools never come and go.
pub fn head_crowds_budget(input: &Input<'_>, settings: &Settings) -> bool {
    if settings.mode == Mode::Off || settings.cache.rebill_rate() <= 0.0 {
        return false;
    }
    let task = settings
        .pin_task
        .then(|| input.items.iter().position(|m| m.kind == Kind::User))
        .flatten();
    let head_end = input
        .items
        .iter()
        .enumerate()
        .position(|(i, m)| m.kind != Kind::Instructions && Some(i) != task)
        .unwrap_or(input.items.len());
    let head = input.fixed + input.counts[..head_end].iter().sum::<usize>();
    head.saturating_mul(2) > settings.budget
}

/// Attempts at cutting a text under the hard cap.
const TRUNCATION_ATTEMPTS: usize = 4;

/// Where the part of the conversation the model has not seen begins: the start of the unit
/// holding the first message after the last assistant message (so an assistant call whose
/// results came after it is unseen whole). 0 when the model has answered nothing yet; `n` when
/// the last message is the model's.
pub fn unseen_start(messages: &[Value], units: &[Range<usize>]) -> usize {
    let items = Chat.items(messages, &[], &[], None);
    unseen_start_of(&items, units)
}

/// [`unseen_start`] over items.
fn unseen_start_of(items: &[Item<'_>], units: &[Range<usize>]) -> usize {
    let n = items.len();
    match items.iter().rposition(|m| m.kind.is_assistant()) {
        None => 0,
        Some(a) => units.iter().find(|u| u.end > a + 1).map_or(n, |u| u.start),
    }
}

/// Where the recent window begins: at least `keep` messages, widened to whole units, and never
/// after the unseen part.
fn recent_start(units: &[Range<usize>], n: usize, keep: usize, unseen: usize) -> usize {
    let k = n.saturating_sub(keep);
    units
        .iter()
        .find(|u| u.end > k)
        .map_or(n, |u| u.start)
        .min(unseen)
}

/// Where `input`'s recent window begins with `settings` (see [`recent_start`]); 0 when the
/// conversation is not well formed.
pub fn recent_window_start(input: &Input<'_>, settings: &Settings) -> usize {
    let Ok(units) = model::units(&input.items) else {
        return 0;
    };
    let n = input.items.len();
    let unseen = unseen_start_of(&input.items, &units);
    recent_start(&units, n, settings.keep_recent, unseen)
}

/// Plans and applies context management to one request.
pub fn run(input: &Input<'_>, settings: &Settings, prior: Decision, env: &dyn Env) -> Outcome {
    let n = input.messages.len();
    let before = input.fixed + input.counts.iter().sum::<usize>();
    let unchanged = |report: Report| Outcome {
        messages: None,
        writes: Vec::new(),
        decision: prior,
        report,
        moved: None,
    };
    let mut report = Report {
        tokens_before: before,
        tokens_after: before,
        kept_prefix_tokens: input.unchanged_prefix_tokens(),
        ..Report::default()
    };
    if settings.mode == Mode::Off || n == 0 {
        return unchanged(report);
    }
    let units = match model::units(&input.items) {
        Ok(units) => units,
        Err(malformed) => {
            report.skipped = Some(Skipped::Malformed(malformed.to_string()));
            return unchanged(report);
        }
    };

    let mut work = Work {
        input,
        env,
        slots: vec![Slot::default(); n],
        counts: input.counts.to_vec(),
        writes: Vec::new(),
        prior,
    };

    work.first_sight(settings);
    // The prior squeeze, repeated exactly while it stands.
    let prior_squeeze = prior.squeeze.filter(|s| s.from < s.to && s.to <= n);
    if let Some(s) = prior_squeeze {
        work.squeeze(s.from..s.to, s.cap, &settings.readback);
    }

    // 2. Compact, with the boundary moving in batches, never into what the model has not seen.
    let unseen = unseen_start_of(&input.items, &units);
    let recent_start = recent_start(&units, n, settings.keep_recent, unseen);
    let mut decision = Decision {
        compact_before: prior.compact_before.min(unseen),
        offload_before: prior.offload_before.min(unseen),
        kept_user: None,
        squeeze: None,
    };
    // The first input message this request shows differently from the previous one.
    let mut first_rewritten = n;
    if settings.mode.compacts() {
        compact_before(&mut work, decision.compact_before, &(0..0), settings);
    }
    // Over budget as the prior decision leaves it, the prefix must change; under it, every
    // move is optional, and priced.
    let movable = settings
        .mode
        .offloads()
        .then(|| movable(&input.items, &units, settings, recent_start, unseen))
        .flatten();
    let (moved_end, moved_tokens) =
        movable.map_or((0, 0), |m| m.run_to(&work, &units, decision.offload_before));
    // What the prior decision moves out: compacting in there changes nothing sent.
    let prior_span = movable.map_or(0..0, |m| m.start..moved_end);
    // Whether the request refers to stored content as the prior decision leaves it (so the
    // proxy's tools go out with it already).
    let refers = moved_tokens > 0 || work.slots.iter().any(|s| s.compacted || s.truncated);
    // A run moved out is replaced by its marker (and summary): its room counts.
    let marker_room = match movable {
        Some(m) if moved_tokens > 0 => stand_in_room(&work, &(m.start..moved_end), settings),
        _ => 0,
    };
    let left = work.total() - moved_tokens + marker_room;
    let price = Price::of(input, settings, left, before, refers);
    if settings.mode.compacts() {
        let from = decision.compact_before;
        if let Some((moved, first)) =
            compaction_batch(&work, from..recent_start, &prior_span, settings, &price)
        {
            work = moved;
            decision.compact_before = recent_start;
            first_rewritten = first_rewritten.min(first);
        }
    }

    // 3. Move the oldest units out.
    let cut = movable.map_or_else(Cut::default, |m| {
        offload_span(
            &work,
            &units,
            m,
            settings,
            &price,
            input.ready_summary,
            &mut decision,
        )
    });
    let span = cut.span;
    if let Some(span) = &span {
        if decision.offload_before != prior.offload_before.min(unseen) {
            first_rewritten = first_rewritten.min(span.start);
        }
    }
    // What the run moved out takes away, its marker's room kept.
    let offload_before = decision.offload_before;
    let moved_net = |work: &Work<'_>| match (movable, &span) {
        (Some(m), Some(_)) => {
            let (end, freed) = m.run_to(work, &units, offload_before);
            freed.saturating_sub(stand_in_room(work, &(m.start..end), settings))
        }
        _ => 0,
    };
    if settings.mode.compacts() {
        let moved = moved_net(&work);
        let last = compact_to_unseen(&mut work, &mut decision, moved, unseen, &span, settings);
        first_rewritten = first_rewritten.min(last.unwrap_or(n));
    }
    // 4. Squeeze the round the model has not read when the request still does not fit. The
    // prior squeeze stands until its range is moved out (`assemble`): a squeezed result is
    // compactable at any size, as a truncated one is, so it stays squeezed under compaction.
    let standing = prior_squeeze;
    decision.squeeze = standing;
    let size = work.total().saturating_sub(moved_net(&work));
    if size > settings.budget {
        if let Some((squeeze, recut)) = squeeze_unseen(&mut work, unseen, size, standing, settings)
        {
            first_rewritten = first_rewritten.min(recut.unwrap_or(n));
            decision.squeeze = Some(squeeze);
        }
    }

    // An item the adapter cannot let go of in the span to move out: the request goes as it came.
    if let Some(why) = span.as_ref().and_then(|span| immovable_in(input, span)) {
        report.skipped = Some(Skipped::Immovable(why));
        return unchanged(report);
    }
    let kept_end = if price.answered_end == 0 {
        0
    } else {
        first_rewritten.min(price.answered_end)
    };
    report.rewrote_prefix = first_rewritten < price.answered_end;
    report.forced = price.forced;
    // The conversation as the proxy holds it before the move.
    let held = work.total();
    let unchanged_prefix = input.unchanged_prefix_tokens();
    let head = movable.map(|m| work.total_to(m.start));
    let mut outcome = assemble(work, span, decision, report, kept_end, &settings.readback);
    if let (Some(head), Some(_)) = (head, &outcome.moved) {
        let seen = Seen {
            held,
            forwarded: outcome.report.tokens_after,
            unchanged_prefix,
        };
        let model = cut
            .forced
            .unwrap_or_else(|| price.cut_model(head, settings));
        let priced = Priced {
            cut: cut.forced.is_some(),
            ..priced(&model, &seen, &price, settings)
        };
        if priced.cut {
            outcome.report.costlier_than_direct = priced.unpaid(None);
        }
        outcome.report.priced = Some(priced);
    }
    outcome
}

/// Stage 4: the tool results the model has not read (from `unseen`), when the request
/// (`size` tokens as it now stands) still does not fit the budget, cut to one common cap
/// ([`squeeze_cap`]), so parallel results share what the budget leaves. A squeeze still
/// `standing` (its results not yet moved out nor compacted) is merged: its range goes on to
/// the unseen round, at the smaller cap. Returns the squeeze made, and the first result the
/// model had read that it cut again.
fn squeeze_unseen(
    work: &mut Work<'_>,
    unseen: usize,
    size: usize,
    standing: Option<Squeeze>,
    settings: &Settings,
) -> Option<(Squeeze, Option<usize>)> {
    let n = work.slots.len();
    let input = work.input;
    let results: Vec<usize> = (unseen..n)
        .filter(|&i| {
            matches!(input.items[i].kind, Kind::ToolResult(_))
                && !work.slots[i].compacted
                && input.adapter.has_text(&input.messages[i])
        })
        .collect();
    let counts: Vec<usize> = results.iter().map(|&i| work.counts[i]).collect();
    let others = size.saturating_sub(counts.iter().sum::<usize>());
    let cap = squeeze_cap(&counts, settings.budget.saturating_sub(others))?;
    let (from, cap) = match standing {
        Some(s) => (s.from, s.cap.min(cap)),
        None => (unseen, cap),
    };
    let mut recut = None;
    for i in from..n {
        if matches!(input.items[i].kind, Kind::ToolResult(_)) && !work.slots[i].compacted {
            let before = work.counts[i];
            work.truncate(i, cap, &settings.readback);
            if i < unseen && work.counts[i] != before {
                recut.get_or_insert(i);
            }
        }
    }
    Some((Squeeze { from, to: n, cap }, recut))
}

/// The last resort while still over budget (`moved` tokens moved out of the work's total):
/// the compaction boundary moves up to what the model has not seen yet, recent window
/// included; then every compactable result before the boundary outside the moved-out `span`
/// is compacted. Returns the first message it rewrites.
fn compact_to_unseen(
    work: &mut Work<'_>,
    decision: &mut Decision,
    moved: usize,
    unseen: usize,
    span: &Option<Range<usize>>,
    settings: &Settings,
) -> Option<usize> {
    if work.total() - moved > settings.budget && unseen > decision.compact_before {
        decision.compact_before = unseen;
    }
    let span = span.clone().unwrap_or(0..0);
    compact_before(work, decision.compact_before, &span, settings)
}

/// Why an item of `span` must stay (the adapter's reason), when one must.
fn immovable_in(input: &Input<'_>, span: &Range<usize>) -> Option<String> {
    input.messages[span.clone()]
        .iter()
        .find_map(|m| input.adapter.immovable(m))
}

/// Stage 2's batch: the compactable results in `range` (outside the prior moved-out span)
/// compacted, when there are enough of them (or the request is over budget, or rewriting is
/// free) and the rewrite pays. Returns the new work and the first message it rewrites.
fn compaction_batch<'a>(
    work: &Work<'a>,
    range: Range<usize>,
    prior_span: &Range<usize>,
    settings: &Settings,
    price: &Price,
) -> Option<(Work<'a>, usize)> {
    let threshold = settings.tool_result_max_tokens;
    let end = range.end;
    let pending: usize = range
        .clone()
        .filter(|&i| !prior_span.contains(&i) && work.compactable(i, threshold))
        .map(|i| work.counts[i])
        .sum();
    if pending == 0 || !(price.forced || price.free || pending >= settings.compact_batch_tokens) {
        return None;
    }
    let mut moved = work.clone();
    let mut first = None;
    for i in range {
        if !prior_span.contains(&i) && moved.compactable(i, threshold) {
            first.get_or_insert(i);
            moved.compact(i, settings);
        }
    }
    let first = first.unwrap_or(end);
    let freed = work.total().saturating_sub(moved.total());
    let rebilled = moved.rebilled(first, price.answered_end);
    price
        .takes(freed, rebilled, moved.total_to(first), settings)
        .then_some((moved, first))
}

/// Compacts every compactable result before `boundary` not yet compacted nor in the moved-out
/// `span`; returns the first one it compacts.
fn compact_before(
    work: &mut Work<'_>,
    boundary: usize,
    span: &Range<usize>,
    settings: &Settings,
) -> Option<usize> {
    let mut first = None;
    for i in 0..boundary {
        if work.is_compacted(i) || span.contains(&i) {
            continue;
        }
        if work.compactable(i, settings.tool_result_max_tokens) {
            work.compact(i, settings);
            first.get_or_insert(i);
        }
    }
    first
}

/// What a prefix rewrite costs this request.
struct Price {
    /// The request is over budget: the rewrite is not optional.
    forced: bool,
    /// Nothing is cached (the cache is cold, the prefix too short, or the provider gives no
    /// discount): rewriting costs nothing more.
    free: bool,
    /// What the previous request held ends here ([`Input::answered_end`]).
    answered_end: usize,
    /// Further requests the rewrite must pay for itself over ([`horizon`]).
    horizon: f64,
    /// The model's answers so far: the requests the conversation has made.
    answers: usize,
    /// The request as the client sent it (what going direct costs).
    raw: usize,
    /// The proxy's tools' tokens that a rewrite referring to stored content would add: the
    /// request as the prior decision leaves it refers to none ([`with_tools_added`]).
    tools: usize,
}

impl Price {
    /// This request's price of a rewrite: `left` tokens as the prior decision leaves it (the
    /// room of its marker included),
    /// `before` as the client sent it; `refers` whether it then refers to stored content.
    fn of(
        input: &Input<'_>,
        settings: &Settings,
        left: usize,
        before: usize,
        refers: bool,
    ) -> Price {
        Price {
            tools: if refers {
                0
            } else {
                settings.tools_offer_tokens
            },
            forced: left > settings.budget,
            free: !input.cache_warm
                || before < settings.cache.min_cacheable_prefix
                || settings.cache.rebill_rate() <= 0.0,
            answered_end: input.answered_end(),
            horizon: horizon(&input.items, settings, left, before),
            answers: answers(&input.items),
            raw: before,
        }
    }
}

/// The further requests over which a rewrite now must pay: as many as the conversation has
/// made so far (the model's answers in it), at most `cache_horizon_turns`, and no more than
/// remain before the budget forces the next cut (the headroom left by `size`, the request as
/// the prior decision leaves it, over the conversation's growth per request, from `raw`, its
/// tokens as sent). A short conversation is not rewritten for savings it may never collect,
/// and a rewrite that the next cut would repeat waits for it.
pub fn horizon(items: &[Item<'_>], settings: &Settings, size: usize, raw: usize) -> f64 {
    let answers = answers(items);
    let mut h = settings.cache_horizon_turns.min(answers as f64);
    if answers > 0 && raw > 0 {
        let growth = raw as f64 / answers as f64;
        h = h.min(settings.budget.saturating_sub(size) as f64 / growth);
    }
    h
}

/// The model's answers in the conversation: the requests it has made so far.
fn answers(items: &[Item<'_>]) -> usize {
    items.iter().filter(|m| m.kind.is_assistant()).count()
}

impl Price {
    /// The cost model of a forced cut below a pinned head of `head` tokens: the conversation
    /// grew by what it holds past the head over its requests so far, and is priced over as
    /// many more, at most `cache_horizon_turns`.
    fn cut_model(&self, head: usize, settings: &Settings) -> CutModel {
        let growth = match self.answers {
            0 => 0.0,
            n => self.raw.saturating_sub(head) as f64 / n as f64,
        };
        CutModel {
            budget: settings.budget,
            head,
            growth,
            horizon: settings.cache_horizon_turns.min(self.answers as f64),
            cache: settings.cache,
            tools: self.tools,
        }
    }

    /// Whether a rewrite freeing `freed` tokens and billing `rebilled` again, `before` tokens
    /// in front of its first rewritten message, is taken (the proxy's tools it may bring
    /// priced in: [`with_tools_added`]).
    fn takes(&self, freed: usize, rebilled: usize, before: usize, settings: &Settings) -> bool {
        let (freed, rebilled) = with_tools_added(freed, rebilled, before, self.tools);
        self.forced
            || (freed > 0 && self.free)
            || rewrite_pays(freed, rebilled, &settings.cache, self.horizon)
    }
}

impl Work<'_> {
    /// Tokens before message `end` as they now stand, the tools and framing included.
    fn total_to(&self, end: usize) -> usize {
        self.input.fixed + self.counts[..end].iter().sum::<usize>()
    }

    /// Tokens from message `first` up to `end` as they now stand: what a rewrite at `first`
    /// bills again.
    fn rebilled(&self, first: usize, end: usize) -> usize {
        self.counts[first.min(end)..end].iter().sum()
    }
}

/// Where a moved-out run may stand: from unit `first` (starting at `start`, after the pinned
/// head: instructions and, with `pin_task`, everything up to the first user message) up to
/// `limit` (before the next instruction and the recent window), and, when the budget forces
/// a cut that no run within the window brings under it, up to `reach`: past the recent
/// window, up to the model's last answer (never the part it has not read, nor its last
/// answer, whose thinking the next turn needs). The run
/// may reach into the current turn, whole tool rounds of a long tool loop included; the latest
/// user message then stays ([`Work::lifted`]).
#[derive(Debug, Clone, Copy)]
struct Movable {
    first: usize,
    start: usize,
    limit: usize,
    reach: usize,
}

fn movable(
    items: &[Item<'_>],
    units: &[Range<usize>],
    settings: &Settings,
    recent_start: usize,
    unseen: usize,
) -> Option<Movable> {
    let is_instruction = |i: usize| items[i].kind == Kind::Instructions;
    // With `pin_task`, a conversation whose task has not come yet (no user message: tool
    // rounds after the instructions alone) is pinned whole: a run moved out now would be
    // pinned back into the head, the marker gone, when the first user message arrives.
    let pinned_end = match items.iter().position(|m| m.kind == Kind::User) {
        Some(task) if settings.pin_task => task + 1,
        None if settings.pin_task => items.len(),
        _ => 0,
    };
    let first = units
        .iter()
        .position(|u| u.start >= pinned_end && !is_instruction(u.start))?;
    let instruction = units[first..]
        .iter()
        .find(|u| is_instruction(u.start))
        .map_or(items.len(), |u| u.start);
    let last_answer = items
        .iter()
        .rposition(|m| m.kind.is_assistant())
        .and_then(|a| units.iter().find(|u| u.contains(&a)))
        .map_or(unseen, |u| u.start);
    Some(Movable {
        first,
        start: units[first].start,
        limit: instruction.min(recent_start),
        reach: instruction
            .min(last_answer)
            .min(unseen)
            .max(recent_start.min(instruction)),
    })
}

impl Movable {
    /// The run of whole units moved out up to `boundary` (at most the reach: a forced cut
    /// that went past the recent window stays there): where it ends, and the tokens it frees
    /// as they now stand (its [`Work::lifted`] message stays).
    fn run_to(&self, work: &Work<'_>, units: &[Range<usize>], boundary: usize) -> (usize, usize) {
        let mut end = self.start;
        for u in &units[self.first..] {
            if u.end > boundary.min(self.reach) {
                break;
            }
            end = u.end;
        }
        (end, work.freed(self.start..end))
    }
}

impl Work<'_> {
    /// The message a moved-out `span` keeps, right after the marker: the one the prior
    /// decision kept while its boundary stays (so the prefix does not change when the next
    /// turn begins), else the latest user message when the run reaches into its turn. So the
    /// latest user message is never moved out, and whole tool rounds of a long tool loop may
    /// go while the question they answer stays.
    fn lifted(&self, span: &Range<usize>) -> Option<usize> {
        let items = &self.input.items;
        let prior = self
            .prior
            .kept_user
            .filter(|_| span.end == self.prior.offload_before);
        let latest = || items.iter().rposition(|m| m.kind == Kind::User);
        prior
            .or_else(latest)
            .filter(|&i| span.contains(&i) && items[i].kind == Kind::User)
    }

    /// Tokens a run over `span` frees: its messages as they now stand, but its
    /// [`lifted`](Work::lifted) one.
    fn freed(&self, span: Range<usize>) -> usize {
        let kept = self.lifted(&span).map_or(0, |i| self.counts[i]);
        self.counts[span].iter().sum::<usize>() - kept
    }
}

/// Stage 3: chooses the run of whole units to move out and records it in `decision`. It keeps
/// the prior boundary; it goes to a ready summary's boundary when that pays; over budget, it
/// goes once, as deep as the [`CutModel`] finds cheapest between the shallowest cut that fits
/// and the low watermark (and gives its model in `forced`, for the warning).
fn offload_span(
    work: &Work<'_>,
    units: &[Range<usize>],
    at: Movable,
    settings: &Settings,
    price: &Price,
    ready: Option<ReadySummary>,
    decision: &mut Decision,
) -> Cut {
    let total = work.total();
    let (mut end, mut moved) = at.run_to(work, units, decision.offload_before);
    // A ready summary's boundary, when moving there pays. Its span was chosen as a cut down
    // to the target (of the request that asked for it): deep enough, when it brings this
    // request under the budget.
    let mut deep_enough = false;
    if let Some(ready) = ready.filter(|r| r.prefix_len > end) {
        let (e, m) = at.run_to(work, units, ready.prefix_len.min(at.limit));
        let freed = (m - moved).saturating_sub(ready.tokens);
        let rebilled = ready.tokens + work.rebilled(e, price.answered_end);
        let before = work.total_to(at.start);
        if e > end && price.takes(freed, rebilled, before, settings) {
            (end, moved) = (e, m);
            deep_enough = total - moved + ready.tokens <= settings.budget;
        }
    }
    // Over budget: once, at the depth the cut model prices lowest, from the shallowest cut
    // that fits the budget (its marker's room kept) down to the low watermark.
    let mut forced = None;
    if price.forced && !deep_enough {
        let kept_end = end;
        let room = cut_room(work, &at, total, settings);
        let fits = |moved: usize| total - moved + room <= settings.budget;
        // (end, moved) at every boundary that fits, and the deepest one in any case.
        let mut candidates = Vec::new();
        for u in units[at.first..].iter().skip_while(|u| u.end <= kept_end) {
            if u.end > at.reach || total - moved <= settings.target {
                break;
            }
            // Past the recent window only when no cut within it fits.
            if u.start == at.limit && !candidates.is_empty() {
                break;
            }
            moved = work.freed(at.start..u.end);
            end = u.end;
            if fits(moved) {
                candidates.push((end, moved));
            }
        }
        if candidates.last() != Some(&(end, moved)) {
            candidates.push((end, moved));
        }
        let model = price.cut_model(work.total_to(at.start), settings);
        // What each cut forwards: the kept messages and the marker (its size barely depends
        // on the run's; the deepest run's is counted once, for all).
        let messages = end - at.start - usize::from(work.lifted(&(at.start..end)).is_some());
        let marker = marker_tokens(work, messages, moved, &settings.readback);
        let sizes: Vec<usize> = candidates
            .iter()
            .map(|&(_, m)| total - m + marker)
            .collect();
        let chosen = cheapest_cut(&sizes, &model);
        end = candidates[chosen].0;
        // A cut that moves nothing more is none: nothing is paid for it.
        if end > kept_end {
            forced = Some(model);
        }
    }
    if end == at.start {
        return Cut { span: None, forced };
    }
    decision.offload_before = end;
    Cut {
        span: Some(at.start..end),
        forced,
    }
}

/// What stage 3 chose: the run moved out, and the model of its forced cut.
#[derive(Default)]
struct Cut {
    span: Option<Range<usize>>,
    /// The cut model of a forced cut that moves something, for the warning ([`unpaid_cut`]).
    forced: Option<CutModel>,
}

/// A request whose run is moved out as the engine made it, for [`priced`].
struct Seen {
    /// The conversation as the proxy holds it before the move: the client's request after the
    /// proxy's transforms and compactions.
    held: usize,
    /// The request forwarded.
    forwarded: usize,
    /// What the previous request held of the client's request, as sent.
    unchanged_prefix: usize,
}

/// The [`Outlook`] of a request whose run is moved out (the cut's model, or for a boundary
/// standing the model a cut now would have), from the request it forwards.
fn priced(model: &CutModel, seen: &Seen, price: &Price, settings: &Settings) -> Priced {
    let growth = seen.held.saturating_sub(model.head) as f64 / price.answers.max(1) as f64;
    // A later cut keeps what this one forwards (the same head and marker, a recent window of
    // as many messages), or goes down to the low watermark when the budget leaves room.
    let target_ratio = settings.target as f64 / settings.budget.max(1) as f64;
    let steady = seen.forwarded;
    let kept = ((settings.budget as f64 * target_ratio) as usize).max(steady);
    Priced {
        cut: false,
        size: seen.forwarded,
        answers: price.answers,
        outlook: Outlook {
            model: *model,
            kept,
            growth,
            raw: price.raw,
            raw_prefix: seen.unchanged_prefix,
            horizon: settings.cache_horizon_turns,
        },
        raw_per_managed: price.raw as f64 / seen.held.max(1) as f64,
        target_ratio,
        steady,
    }
}

/// The room a cut keeps in the budget for what stands in for the run it moves out:
/// `cut_reserve_tokens`, or more when the marker itself takes more than its share of it (a
/// wire counting markers higher), counted for the longest run the cut may move (`at`) of
/// `tokens` tokens (its reference's tokens allowed for).
fn cut_room(work: &Work<'_>, at: &Movable, tokens: usize, settings: &Settings) -> usize {
    let messages = at.reach.saturating_sub(at.start);
    let marker = marker_tokens(work, messages, tokens, &settings.readback) + REFERENCE_SLACK_TOKENS;
    settings.cut_reserve_tokens + marker.saturating_sub(super::settings::MARKER_RESERVE_TOKENS)
}

/// The room what stands in for the moved-out `span` takes: its marker, exactly as it will be
/// sent (its reference's tokens vary with its characters), and the summary that may be placed
/// in it (summaries on: `cut_reserve_tokens` beyond the marker's share).
fn stand_in_room(work: &Work<'_>, span: &Range<usize>, settings: &Settings) -> usize {
    let kept = work.lifted(span);
    let marker = moved_out_marker(work, span.clone(), kept, &settings.readback).tokens;
    marker
        + settings
            .cut_reserve_tokens
            .saturating_sub(super::settings::MARKER_RESERVE_TOKENS)
}

/// Tokens a reference may take beyond the stand-in's where a marker names it (three times).
const REFERENCE_SLACK_TOKENS: usize = 24;

/// Tokens of the marker standing for a run of `messages` messages of `tokens` tokens (its
/// reference stands in: every reference is as long).
fn marker_tokens(
    work: &Work<'_>,
    messages: usize,
    tokens: usize,
    readback: &markers::Readback,
) -> usize {
    let reference = ContentRef::of("");
    let text = markers::offloaded(messages, tokens, &reference, readback);
    work.env.count_message(&work.input.adapter.marker(text))
}

/// The marker standing for a moved-out run, and what it stores.
struct MovedOut {
    /// The run, one JSON message per line (what is stored).
    lines: String,
    reference: ContentRef,
    message: Value,
    tokens: usize,
}

/// The marker of the moved-out `span` (but its `kept` message, which stays after it).
fn moved_out_marker(
    work: &Work<'_>,
    span: Range<usize>,
    kept: Option<usize>,
    readback: &markers::Readback,
) -> MovedOut {
    let input = work.input;
    let moved: Vec<usize> = span.filter(|&i| Some(i) != kept).collect();
    let mut lines = String::new();
    for &i in &moved {
        lines.push_str(&input.adapter.line(&input.messages[i]));
        lines.push('\n');
    }
    let moved_tokens: usize = moved.iter().map(|&i| input.counts[i]).sum();
    let reference = work.env.reference(&lines);
    let message = input.adapter.marker(markers::offloaded(
        moved.len(),
        moved_tokens,
        &reference,
        readback,
    ));
    let tokens = work.env.count_message(&message);
    MovedOut {
        lines,
        reference,
        message,
        tokens,
    }
}

/// Builds the output messages and the final report.
fn assemble(
    mut work: Work<'_>,
    span: Option<Range<usize>>,
    mut decision: Decision,
    mut report: Report,
    kept_end: usize,
    readback: &markers::Readback,
) -> Outcome {
    let input = work.input;
    let mut kept = if kept_end > 0 { input.fixed } else { 0 };
    let n = input.messages.len();
    // The marker of the moved-out run, built once; a marker no smaller than what the run would
    // have sent saves nothing, and never makes a prompt larger: then the run stays.
    let mut kept_user = span.as_ref().and_then(|s| work.lifted(s));
    let mut marker = span
        .clone()
        .filter(|s| !s.is_empty())
        .map(|span| moved_out_marker(&work, span, kept_user, readback));
    if let (Some(m), Some(span)) = (&marker, &span) {
        if m.tokens >= work.freed(span.clone()) {
            marker = None;
            decision.offload_before = 0;
            kept_user = None;
        }
    }
    decision.kept_user = kept_user;
    let span = if marker.is_some() {
        span.unwrap_or(0..0)
    } else {
        0..0
    };
    // A squeeze whose results are all moved out is done with.
    if decision
        .squeeze
        .is_some_and(|s| span.start <= s.from && s.to <= span.end)
    {
        decision.squeeze = None;
    }
    // Moved out: the span but the message it keeps.
    let gone = |i: usize| span.contains(&i) && Some(i) != kept_user;
    let moved = (!span.is_empty()).then(|| span.clone());
    let mut out = Vec::with_capacity(n);
    // Unchanged messages are copied only when the request changes at all.
    let changes = moved.is_some() || work.slots.iter().any(Slot::changed);
    let mut tokens_after = input.fixed;
    for i in 0..n {
        if i == span.start {
            if let Some(MovedOut {
                lines,
                reference,
                message,
                tokens,
            }) = marker.take()
            {
                tokens_after += tokens;
                if i < kept_end {
                    kept += tokens;
                    report.marker_kept = true;
                }
                out.push(message);
                // The moved run holds these messages whole: their own writes are not needed,
                // unless a message left in place was changed with the same text (a content is
                // written once, for the first message that had it).
                let needed: std::collections::HashSet<ContentRef> = (0..n)
                    .filter(|j| !gone(*j) && work.slots[*j].changed())
                    .filter_map(|j| input.adapter.text(&input.messages[j]))
                    .map(|text| work.env.reference(&text))
                    .collect();
                work.writes.retain(|w| {
                    !matches!(w.source, Source::MessageText(i) if gone(i))
                        || needed.contains(&w.reference)
                });
                work.write(
                    reference,
                    ContentKind::Messages,
                    Source::Owned(lines),
                    Action::MovedOut,
                );
                report.offloaded = span.len() - usize::from(kept_user.is_some());
            }
        }
        if gone(i) {
            continue;
        }
        tokens_after += work.counts[i];
        if i < kept_end {
            kept += work.counts[i];
        }
        let slot = std::mem::take(&mut work.slots[i]);
        report.kept_refers_to_stored |= i < kept_end && (slot.compacted || slot.truncated);
        if slot.compacted {
            report.compacted += 1;
        } else {
            if slot.truncated {
                report.truncated += 1;
            }
            match &slot.lossless {
                Some(l) if l.minified => report.minified += 1,
                Some(_) => report.deduped += 1,
                None => {}
            }
        }
        if changes {
            out.push(slot.message.unwrap_or_else(|| input.messages[i].clone()));
        }
    }
    report.tokens_after = tokens_after;
    report.kept_prefix_tokens = kept;
    report.kept_refers_to_stored |= report.marker_kept;
    let changed =
        report.offloaded + report.truncated + report.compacted + report.minified + report.deduped
            > 0;
    Outcome {
        messages: changed.then_some(out),
        writes: work.writes,
        decision,
        report,
        moved,
    }
}

/// Counting with the real tokenizer and addressing with SHA-256, without extra caches.
impl Env for crate::tokens::Counter {
    fn count_message(&self, message: &Value) -> usize {
        crate::tokens::Counter::count_message(self, message)
    }

    fn reference(&self, text: &str) -> ContentRef {
        ContentRef::of(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::settings::ContextConfig;
    use crate::context::units::segment;
    use crate::tokens::{CountSettings, Counter, Encoding};
    use serde_json::json;

    fn counter() -> Counter {
        Counter::new(Encoding::O200kBase, CountSettings::default())
    }

    /// Small budgets and batches; OpenAI's prices without the minimum prefix, so these
    /// short conversations count as cached.
    fn settings(mode: Mode, budget: usize) -> Settings {
        let s = ContextConfig {
            max_context_tokens: Some(budget),
            keep_recent_messages: 2,
            tool_result_max_tokens: 200,
            truncate_tool_result_tokens: Some(2000),
            compact_batch_tokens: 1000,
            ..ContextConfig::default()
        }
        .resolve("gpt-4o", mode, &Default::default());
        Settings {
            cache: CachePricing {
                min_cacheable_prefix: 0,
                ..s.cache
            },
            ..s
        }
    }

    fn lines(n: usize) -> String {
        (0..n)
            .map(|i| format!("output line {i} of the command\n"))
            .collect()
    }

    fn tool_round(id: &str, result: String) -> [Value; 2] {
        [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": result}),
        ]
    }

    fn run_on(messages: &[Value], s: &Settings, prior: Decision) -> Outcome {
        let c = counter();
        let counts: Vec<usize> = messages.iter().map(|m| c.count_message(m)).collect();
        run(&Input::new(messages, &counts, 3), s, prior, &c)
    }

    #[test]
    fn the_squeeze_cap_is_the_largest_that_fits() {
        // Water-filling checked by hand: 100 stays whole, the others share what is left.
        assert_eq!(squeeze_cap(&[100, 5000, 5000], 2100), Some(1000));
        assert_eq!(squeeze_cap(&[100, 5000, 5000], 10_100), None);
        assert_eq!(squeeze_cap(&[100, 5000, 5000], 2101), Some(1000));
        assert_eq!(squeeze_cap(&[100, 5000, 5000], 2102), Some(1001));
        // Never under the floor, though the results then do not fit.
        assert_eq!(squeeze_cap(&[5000; 8], 100), Some(SQUEEZE_FLOOR_TOKENS));
        assert_eq!(squeeze_cap(&[], 0), None);
    }

    /// A round of parallel results the model has not read, too large for the budget together:
    /// each is cut to one common cap (head and tail, the whole text stored), and the request
    /// fits. Once the model has read them, the next request repeats them byte for byte.
    #[test]
    fn parallel_unseen_results_share_the_budget_and_stay_squeezed() {
        let c = counter();
        let mut messages = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "read the eight files"}),
        ];
        let calls: Vec<Value> = (0..8)
            .map(|k| json!({"id": format!("c{k}"), "type": "function", "function": {"name": "read", "arguments": "{}"}}))
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for k in 0..8 {
            let text: String = (0..300)
                .map(|l| format!("file {k} line {l}: let x{l} = {l};\n"))
                .collect();
            messages
                .push(json!({"role": "tool", "tool_call_id": format!("c{k}"), "content": text}));
        }
        let s = settings(Mode::Auto, 8000);
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.report.tokens_before > 2 * s.budget, "{:?}", out.report);
        assert!(out.report.tokens_after <= s.budget, "{:?}", out.report);
        let squeeze = out.decision.squeeze.expect("squeezed");
        assert_eq!((squeeze.from, squeeze.to), (2, 11));
        let sent = out.messages.clone().unwrap();
        let sizes: Vec<usize> = sent[3..].iter().map(|m| c.count_message(m)).collect();
        // One common cap: every result under it, none far below it.
        assert!(sizes.iter().all(|&t| t <= squeeze.cap), "{sizes:?}");
        assert!(sizes.iter().all(|&t| t * 2 > squeeze.cap), "{sizes:?}");
        // Every result's whole text is stored.
        for k in 3..11 {
            assert!(out
                .writes
                .iter()
                .any(|w| w.source == Source::MessageText(k) && w.action == Action::Truncated));
        }
        // The model answers: the squeezed results are repeated as they were sent.
        let mut next = messages.clone();
        next.push(json!({"role": "assistant", "content": "Read them."}));
        next.push(json!({"role": "user", "content": "now fix the bug"}));
        let again = run_on(&next, &s, out.decision);
        let resent = again.messages.unwrap();
        assert_eq!(&resent[..sent.len()], &sent[..]);
        assert_eq!(again.decision.squeeze, Some(squeeze));
        assert!(!again.report.rewrote_prefix);
    }

    /// A forced cut goes past the recent window when the older part alone cannot bring the
    /// request under the budget; the model's last answer and what it has not read stay.
    #[test]
    fn a_forced_cut_reaches_into_the_recent_window() {
        let mut messages = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "port the crate"}),
        ];
        for k in 0..6 {
            messages.extend(tool_round(&format!("c{k}"), lines(40)));
        }
        let s = Settings {
            keep_recent: 10,
            tool_result_max_tokens: 100_000,
            ..settings(Mode::Compress, 1200)
        };
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.report.tokens_before > s.budget);
        assert!(out.report.tokens_after <= s.budget, "{:?}", out.report);
        // The recent window began at message 4 (the last ten), and moving the one round before
        // it does not fit: the cut went past it.
        assert!(out.decision.offload_before > 4, "{:?}", out.decision);
        let sent = out.messages.unwrap();
        assert_eq!(sent.last(), messages.last());
        assert_eq!(sent[sent.len() - 2], messages[messages.len() - 2]);
    }

    /// Over budget with only a few short messages to move: their marker would be larger than
    /// they are, so they stay (the prompt is never made larger).
    #[test]
    fn a_marker_never_makes_the_prompt_larger() {
        let c = counter();
        let messages = [
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "task"}),
            json!({"role": "assistant", "content": "ok"}),
            json!({"role": "user", "content": "more"}),
            json!({"role": "assistant", "content": "sure"}),
            json!({"role": "user", "content": "last"}),
        ];
        let total = 3 + messages.iter().map(|m| c.count_message(m)).sum::<usize>();
        let out = run_on(
            &messages,
            &settings(Mode::Compress, total - 1),
            Decision::default(),
        );
        assert_eq!(out.report.offloaded, 0);
        assert!(out.report.tokens_after <= out.report.tokens_before);
        assert_eq!(out.decision.offload_before, 0);
        assert!(out.moved.is_none());
    }

    #[test]
    fn truncation_caps_the_current_turn_and_stores_the_whole() {
        let mut messages = vec![json!({"role": "user", "content": "run it"})];
        messages.extend(tool_round("c1", lines(3000)));
        let out = run_on(
            &messages,
            &settings(Mode::Compact, 1_000_000),
            Decision::default(),
        );
        let new = out.messages.unwrap();
        let text = new[2]["content"].as_str().unwrap();
        assert!(text.starts_with("output line 0"));
        assert!(text.contains("[context-proxy: truncated"));
        assert!(text.trim_end().ends_with("output line 2999 of the command"));
        assert!(counter().count_message(&new[2]) <= 2000);
        assert_eq!(out.report.actions(), "truncated=1");
        assert_eq!(out.writes.len(), 1);
        assert_eq!(out.writes[0].source, Source::MessageText(2));
        assert_eq!(out.writes[0].kind, ContentKind::ToolResult);
    }

    #[test]
    fn compaction_boundary_waits_for_a_batch() {
        // One old result worth ~800 tokens: below the 1000-token batch, so nothing moves.
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        messages.extend(tool_round("c1", lines(90)));
        messages.push(json!({"role": "assistant", "content": "ok"}));
        messages.push(json!({"role": "user", "content": "next"}));
        let s = settings(Mode::Compact, 1_000_000);
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.messages.is_none());
        assert_eq!(out.decision, Decision::default());
        // A second old result brings the pending savings over the batch: the boundary jumps
        // to the recent window and both are compacted at once.
        messages.extend(tool_round("c2", lines(90)));
        messages.push(json!({"role": "assistant", "content": "ok"}));
        messages.push(json!({"role": "user", "content": "again"}));
        let out = run_on(&messages, &s, Decision::default());
        assert_eq!(out.decision.compact_before, messages.len() - 2);
        assert_eq!(out.report.compacted, 2);
        let new = out.messages.unwrap();
        assert!(new[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("[context-proxy: tool result compacted"));
        assert_eq!(new[2]["tool_call_id"], "c1");
    }

    #[test]
    fn over_budget_moves_whole_old_units_out_but_never_the_latest_user_turn() {
        let mut messages = vec![json!({"role": "system", "content": "sys"})];
        for i in 0..20 {
            messages.push(
                json!({"role": "user", "content": format!("question {i} {}", "word ".repeat(100))}),
            );
            messages.extend(tool_round(&format!("c{i}"), format!("short answer {i}")));
        }
        messages.push(json!({"role": "user", "content": "final question"}));
        let s = settings(Mode::Auto, 1500);
        let out = run_on(&messages, &s, Decision::default());
        let new = out.messages.unwrap();
        assert_eq!(new[0], messages[0]);
        // The task (first user message) is pinned: the marker comes after it.
        assert_eq!(new[1], messages[1]);
        assert!(new[2]["content"]
            .as_str()
            .unwrap()
            .contains("earlier messages"));
        assert_eq!(new.last(), messages.last());
        assert!(segment(&new).is_ok());
        assert!(out.report.tokens_after <= s.budget, "{:?}", out.report);
        let moved = out
            .writes
            .iter()
            .find(|w| w.kind == ContentKind::Messages)
            .unwrap();
        let Source::Owned(lines) = &moved.source else {
            panic!("moved run not owned")
        };
        assert_eq!(lines.lines().count(), out.report.offloaded);
        // Re-running with the decision reproduces the same bytes.
        let again = run_on(&messages, &s, out.decision);
        assert_eq!(again.messages.unwrap(), new);
    }

    /// One prompt, then many tool rounds with large results: the rounds the model has read
    /// move out whole, the prompt (pinned) and the rounds it is reading stay.
    #[test]
    fn a_long_single_prompt_tool_loop_moves_old_rounds_out() {
        let mut messages = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "fix the build"}),
        ];
        for i in 0..40 {
            messages.extend(tool_round(&format!("c{i}"), lines(60)));
        }
        let s = settings(Mode::Auto, 4000);
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.report.tokens_before > 4 * s.budget, "{:?}", out.report);
        assert!(out.report.tokens_after <= s.budget, "{:?}", out.report);
        assert!(out.report.offloaded > 0, "{:?}", out.report);
        let new = out.messages.unwrap();
        assert_eq!(new[..2], messages[..2]);
        assert!(new[2]["content"]
            .as_str()
            .unwrap()
            .contains("earlier messages"));
        // The recent round (its result compacted, over budget) and the unseen one come last.
        assert_eq!(new[new.len() - 2..], messages[messages.len() - 2..]);
        assert_eq!(new[new.len() - 4], messages[messages.len() - 4]);
        assert!(segment(&new).is_ok());
        let moved = out
            .writes
            .iter()
            .find(|w| w.kind == ContentKind::Messages)
            .unwrap();
        let Source::Owned(stored) = &moved.source else {
            panic!("moved run not owned")
        };
        assert_eq!(stored.lines().count(), out.report.offloaded);
        // The next rounds extend the prefix until the budget forces the next cut.
        let (mut prior, mut previous, mut next) = (out.decision, new, messages.clone());
        for k in 40..44 {
            next.extend(tool_round(&format!("c{k}"), lines(5)));
            let again = run_on(&next, &s, prior);
            assert!(again.report.tokens_after <= s.budget, "{:?}", again.report);
            let sent = again.messages.unwrap();
            assert_eq!(again.decision.offload_before, prior.offload_before);
            assert_eq!(sent[..previous.len()], previous[..]);
            (prior, previous) = (again.decision, sent);
        }
    }

    /// In a later turn's long tool loop, the user message that opened the turn stays after the
    /// marker while older turns and the turn's old rounds move out.
    #[test]
    fn the_latest_user_message_stays_when_its_old_rounds_move_out() {
        let mut messages = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "first task"}),
            json!({"role": "assistant", "content": "done"}),
            json!({"role": "user", "content": "now the second task"}),
        ];
        for i in 0..30 {
            messages.extend(tool_round(&format!("c{i}"), lines(60)));
        }
        let s = settings(Mode::Auto, 4000);
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.report.tokens_after <= s.budget, "{:?}", out.report);
        let new = out.messages.unwrap();
        assert_eq!(new[..2], messages[..2]);
        assert!(new[2]["content"]
            .as_str()
            .unwrap()
            .contains("earlier messages"));
        assert_eq!(new[3], messages[3]);
        assert!(segment(&new).is_ok());
        let moved = out
            .writes
            .iter()
            .find(|w| w.kind == ContentKind::Messages)
            .unwrap();
        let Source::Owned(stored) = &moved.source else {
            panic!("moved run not owned")
        };
        assert!(!stored.contains("now the second task"));
        assert!(stored.contains("\"done\""));
        assert_eq!(stored.lines().count(), out.report.offloaded);
        assert_eq!(new.len(), messages.len() - out.report.offloaded + 1);
        // The same bytes again, and on the next turn the kept message still stands.
        assert_eq!(run_on(&messages, &s, out.decision).messages.unwrap(), new);
        let mut next = messages.clone();
        next.push(json!({"role": "assistant", "content": "fixed"}));
        next.push(json!({"role": "user", "content": "thanks"}));
        let again = run_on(&next, &s, out.decision);
        assert_eq!(again.messages.unwrap()[..new.len()], new[..]);
    }

    #[test]
    fn results_the_model_has_not_seen_are_never_compacted_or_moved() {
        // Eight parallel reads answered at once, far over budget: the model has not seen any.
        let mut messages = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "read them all"}),
        ];
        let calls: Vec<Value> = (0..8)
            .map(|k| json!({"id": format!("c{k}"), "type": "function", "function": {"name": "read_file", "arguments": "{}"}}))
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for k in 0..8 {
            messages.push(
                json!({"role": "tool", "tool_call_id": format!("c{k}"), "content": lines(150)}),
            );
        }
        let s = settings(Mode::Auto, 1500);
        let out = run_on(&messages, &s, Decision::default());
        assert_eq!(out.report.compacted + out.report.offloaded, 0);
        // Only squeezed, to the floor: head and tail of each, the whole text stored.
        assert_eq!(out.report.truncated, 8, "{:?}", out.report);
        assert!(out.writes.iter().all(|w| w.action == Action::Truncated));
        assert_eq!(
            out.decision.squeeze.map(|s| s.cap),
            Some(SQUEEZE_FLOOR_TOKENS)
        );
        // Once the model has answered, they are old results like any other.
        messages.push(json!({"role": "assistant", "content": "read"}));
        messages.push(json!({"role": "user", "content": "now fix it"}));
        let out = run_on(&messages, &s, Decision::default());
        assert!(
            out.report.compacted + out.report.offloaded > 0,
            "{:?}",
            out.report
        );
        assert!(out
            .writes
            .iter()
            .all(|w| w.action == Action::Compacted || w.action == Action::MovedOut));
    }

    #[test]
    fn truncation_never_exceeds_the_cap() {
        let c = counter();
        let texts = [
            lines(3000),
            (0..3000)
                .map(|i| format!("日本語のテキスト{i}と中文内容。\n"))
                .collect::<String>(),
            format!("{}{}", "a".repeat(40_000), "🚀 ".repeat(20_000)),
            (0..20_000).map(|i| format!("{i:x}")).collect::<String>(),
        ];
        for cap in [600, 1000, 2000, 5000] {
            let s = ContextConfig {
                max_context_tokens: Some(1_000_000),
                truncate_tool_result_tokens: Some(cap),
                tool_result_max_tokens: 200,
                ..ContextConfig::default()
            }
            .resolve("gpt-4o", Mode::Compact, &Default::default());
            for text in &texts {
                let mut messages = vec![json!({"role": "user", "content": "run it"})];
                messages.extend(tool_round("c1", text.clone()));
                let out = run_on(&messages, &s, Decision::default());
                let new = out.messages.unwrap();
                let got = c.count_message(&new[2]);
                assert!(got <= cap, "{got} > {cap}");
                assert!(got > cap / 2, "{got} far under {cap}: {}", &new[2]);
            }
        }
    }

    #[test]
    fn json_results_are_minified_and_the_original_stored() {
        let pretty = serde_json::to_string_pretty(&json!({"items": (0..60).map(|i| json!({"id": i, "name": format!("item {i}"), "price": 1.50})).collect::<Vec<_>>()})).unwrap();
        let mut messages = vec![json!({"role": "user", "content": "list"})];
        messages.extend(tool_round("c1", pretty.clone()));
        let s = settings(Mode::Auto, 1_000_000);
        let out = run_on(&messages, &s, Decision::default());
        assert_eq!(out.report.actions(), "minified=1");
        let new = out.messages.unwrap();
        let sent = new[2]["content"].as_str().unwrap();
        assert!(!sent.contains('\n'));
        assert!(sent.contains("\"price\":1.5}"));
        assert_eq!(out.writes.len(), 1);
        assert_eq!(out.writes[0].source, Source::MessageText(2));
        assert_eq!(out.writes[0].action, Action::Minified);
        assert!(out.report.tokens_after < out.report.tokens_before);
        // Off when the setting is.
        let s = Settings {
            lossless: false,
            ..s
        };
        assert!(run_on(&messages, &s, Decision::default())
            .messages
            .is_none());
    }

    #[test]
    fn rewrite_pays_weighs_the_horizon_against_the_rebilled_prefix() {
        let p = |rate: f64, premium: f64| CachePricing {
            cached_read_rate: rate,
            cache_write_premium: premium,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        // 50%: 1000 × 0.5 × 10 = 5000 against 9999 × 0.5 and 10001 × 0.5.
        assert!(rewrite_pays(1000, 9_999, &p(0.5, 0.0), 10.0));
        assert!(!rewrite_pays(1000, 10_001, &p(0.5, 0.0), 10.0));
        // Anthropic: 1000 × 0.1 × 10 = 1000 against 869 × 1.15 = 999.35 and 870 × 1.15.
        assert!(rewrite_pays(1000, 869, &p(0.1, 0.25), 10.0));
        assert!(!rewrite_pays(1000, 870, &p(0.1, 0.25), 10.0));
        // No discount: anything freed pays; nothing freed never does.
        assert!(rewrite_pays(1, 1_000_000, &CachePricing::NONE, 1.0));
        assert!(!rewrite_pays(0, 0, &CachePricing::NONE, 1.0));
    }

    fn anthropic_min(min_cacheable_prefix: usize) -> CachePricing {
        CachePricing {
            cached_read_rate: 0.1,
            cache_write_premium: 0.25,
            min_cacheable_prefix,
            cache_ttl_secs: 300,
        }
    }

    #[test]
    fn a_cut_is_priced_over_its_cycle_as_computed_by_hand() {
        let model = CutModel {
            budget: 1000,
            head: 300,
            growth: 100.0,
            horizon: 10.0,
            cache: anthropic_min(0),
            tools: 0,
        };
        // Cut to 600: the head read (30), the rest written (375); four turns until the next
        // cut, each reading the previous request and writing 100 new tokens.
        let by_hand =
            (30.0 + 375.0) + (60.0 + 125.0) + (70.0 + 125.0) + (80.0 + 125.0) + (90.0 + 125.0);
        assert!((cut_cost_per_turn(600, &model) - by_hand / 5.0).abs() < 1e-9);
        // A cut to 650 has 3.5 turns: the half turn weighs half.
        let by_hand = (30.0 + 437.5) + 190.0 + 200.0 + 210.0 + 0.5 * 220.0;
        assert!((cut_cost_per_turn(650, &model) - by_hand / 4.5).abs() < 1e-9);
        // The same cut bringing 50 tokens of the proxy's tools: the 650 tokens it sends are
        // all written (the tools lead the prompt), then each turn is 50 larger.
        let tools = CutModel { tools: 50, ..model };
        let by_hand = 812.5 + (65.0 + 125.0) + (75.0 + 125.0) + (85.0 + 125.0) + (95.0 + 125.0);
        assert!((cut_cost_per_turn(600, &tools) - by_hand / 5.0).abs() < 1e-9);
        // As a rewrite: 1,000 freed and 200 billed again behind 300 tokens become 950 freed
        // and 550 billed again.
        assert_eq!(with_tools_added(1000, 200, 300, 50), (950, 550));
        assert_eq!(with_tools_added(1000, 200, 300, 0), (1000, 200));
    }

    #[test]
    fn the_cut_stays_over_the_minimum_cacheable_prefix_when_that_is_cheaper() {
        // From a 1,500-token budget a cut to 900 would be under Anthropic's 1,024-token
        // minimum: every turn billed in full. Keeping 1,100 is cached from the next turn on.
        let sizes = [1400, 1300, 1200, 1100, 1000, 900];
        let model = |cache| CutModel {
            budget: 1500,
            head: 200,
            growth: 40.0,
            horizon: 10.0,
            cache,
            tools: 0,
        };
        assert_eq!(cheapest_cut(&sizes, &model(anthropic_min(1024))), 3);
        // DeepSeek caches from 64 tokens; without caching every token is billed anyway: as
        // deep as the low watermark goes.
        let deepseek = crate::pricing::Preset::parse("deepseek")
            .unwrap()
            .for_model("x");
        assert_eq!(cheapest_cut(&sizes, &model(deepseek)), 5);
        assert_eq!(cheapest_cut(&sizes, &model(CachePricing::NONE)), 5);
    }

    /// The outlook of a support conversation: a 3,600-token head at a budget of 5,400, the
    /// proxy's requests growing 200 tokens a turn, the client's 300.
    fn support_outlook(budget: usize, kept: usize) -> Outlook {
        Outlook {
            model: CutModel {
                budget,
                head: 3600,
                growth: 300.0,
                horizon: 3.0,
                cache: anthropic_min(1024),
                tools: 0,
            },
            kept,
            growth: 200.0,
            raw: 6000,
            raw_prefix: 5700,
            horizon: 10.0,
        }
    }

    #[test]
    fn both_sides_of_the_bill_are_priced_as_computed_by_hand() {
        let outlook = Outlook {
            horizon: 2.5,
            ..support_outlook(5000, 4700)
        };
        // Through the proxy: the cut to 4,800 (head read at 10%, 1,200 written at 125%), then
        // 5,000 (reads 4,800, writes 200), then over the budget: cut to 4,700 (head read,
        // 1,100 written), then half a turn at 4,900 (reads 4,700, writes 200).
        let by_hand = (360.0 + 1500.0) + (480.0 + 250.0) + (360.0 + 1375.0) + 0.5 * (470.0 + 250.0);
        assert!((with_proxy_per_turn(4800, &outlook) - by_hand / 3.5).abs() < 1e-9);
        // Going direct: 6,000 with 5,700 cached, then 6,300, 6,600 and half of 6,900, each
        // reading the previous request and writing 300 tokens.
        let by_hand = (570.0 + 375.0) + (600.0 + 375.0) + (630.0 + 375.0) + 0.5 * (660.0 + 375.0);
        assert!((direct_per_turn(&outlook) - by_hand / 3.5).abs() < 1e-9);
        // A cut that brings 50 tokens of the proxy's tools: nothing read on the cut (the tools
        // lead the prompt), then every request 50 larger with the tools read from the cache.
        let tools = Outlook {
            model: CutModel {
                tools: 50,
                ..outlook.model
            },
            ..outlook
        };
        let by_hand = 4850.0 * 1.25 + (485.0 + 250.0) + (365.0 + 1375.0) + 0.5 * (475.0 + 250.0);
        assert!((with_proxy_per_turn(4800, &tools) - by_hand / 3.5).abs() < 1e-9);
    }

    #[test]
    fn the_smallest_paying_budget_pays_and_one_token_less_does_not() {
        // The head and the recent turns leave 5,200 tokens at the deepest: a cut every turn
        // or so, each writing 1,600 tokens again.
        let kept = |b: usize| ((b as f64 * 0.6) as usize).max(5200);
        let pays = |b: usize| {
            let raw = (b as f64 * 1.2).round() as usize;
            let at = Outlook {
                raw,
                raw_prefix: raw - 300,
                ..support_outlook(b, kept(b))
            };
            kept(b) <= b && with_proxy_per_turn(kept(b), &at) <= direct_per_turn(&at)
        };
        let outlook = support_outlook(5400, kept(5400));
        assert!(!pays(5400));
        let b = smallest_paying_budget(&outlook, 1.2, kept, None).unwrap();
        assert!(b > 5400 && pays(b) && !pays(b - 1), "{b}");
        // The head alone over the budget: no budget under what the cut keeps is an answer.
        let over = support_outlook(5000, kept(5000));
        assert!(smallest_paying_budget(&over, 1.2, kept, None).unwrap() >= 5200);
        // A budget that pays is its own answer.
        let roomy = support_outlook(b + 1000, kept(b + 1000));
        assert_eq!(
            smallest_paying_budget(&roomy, 1.2, kept, None),
            Some(b + 1000)
        );
    }

    /// Old results worth a batch, and a long recent tail the move would bill again.
    fn batch_then_long_tail() -> Vec<Value> {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for k in 0..2 {
            messages.extend(tool_round(&format!("c{k}"), lines(90)));
        }
        for k in 0..20 {
            messages.push(json!({"role": "assistant", "content": format!("step {k} {}", "word ".repeat(150))}));
            messages.push(json!({"role": "user", "content": format!("ok {k}")}));
        }
        messages
    }

    #[test]
    fn an_optional_compaction_is_priced_and_free_when_the_cache_is_cold() {
        let messages = batch_then_long_tail();
        let c = counter();
        let counts: Vec<usize> = messages.iter().map(|m| c.count_message(m)).collect();
        let priced = |cache: CachePricing, warm: bool| {
            let s = Settings {
                cache,
                ..settings(Mode::Auto, 1_000_000)
            };
            let input = Input {
                cache_warm: warm,
                ..Input::new(&messages, &counts, 3)
            };
            run(&input, &s, Decision::default(), &c)
        };
        let anthropic = crate::pricing::Preset::parse("anthropic")
            .unwrap()
            .for_model("claude");
        // Over a 10-turn horizon, ~1200 freed tokens at 10% do not pay for the ~3500 tokens
        // after them billed again at 115%: the prefix stays.
        let kept = priced(anthropic, true);
        assert!(kept.messages.is_none(), "{:?}", kept.report);
        assert_eq!(kept.decision, Decision::default());
        assert!(!kept.report.rewrote_prefix);
        // Without a discount, or with a cold cache, the same move is free: taken.
        for out in [priced(CachePricing::NONE, true), priced(anthropic, false)] {
            assert_eq!(out.report.compacted, 2, "{:?}", out.report);
            assert!(out.report.rewrote_prefix);
            // Only the task is kept: the first compacted result is message 2.
            assert_eq!(out.report.kept_prefix_tokens, 3 + counts[0] + counts[1]);
        }
    }

    #[test]
    fn over_budget_cuts_once_down_to_the_target() {
        let mut messages = vec![json!({"role": "system", "content": "sys"})];
        for i in 0..40 {
            messages.push(
                json!({"role": "user", "content": format!("question {i} {}", "word ".repeat(100))}),
            );
            messages.extend(tool_round(&format!("c{i}"), format!("short answer {i}")));
        }
        messages.push(json!({"role": "user", "content": "final question"}));
        let s = settings(Mode::Auto, 3000);
        let out = run_on(&messages, &s, Decision::default());
        assert!(out.report.tokens_before > s.budget);
        // Down to the target (and the marker standing for the moved run).
        assert!(
            out.report.tokens_after <= s.target + 150,
            "{:?}",
            out.report
        );
        // The next turns, under budget, extend the prefix without moving anything.
        let mut next = messages.clone();
        let mut prior = out.decision;
        let mut previous = out.messages.unwrap();
        for k in 0..3 {
            next.push(json!({"role": "assistant", "content": format!("answer {k}")}));
            next.push(json!({"role": "user", "content": format!("more {k}")}));
            let again = run_on(&next, &s, prior);
            assert_eq!(again.decision, prior);
            assert!(!again.report.rewrote_prefix);
            let sent = again.messages.unwrap();
            assert_eq!(&sent[..previous.len()], &previous[..]);
            assert!(again.report.kept_prefix_tokens > 0);
            prior = again.decision;
            previous = sent;
        }
    }

    #[test]
    fn lossless_forms_are_the_same_from_first_sight() {
        let pretty = serde_json::to_string_pretty(
            &json!({"rows": (0..40).map(|i| json!({"i": i})).collect::<Vec<_>>()}),
        )
        .unwrap();
        let mut messages = vec![json!({"role": "user", "content": "list"})];
        messages.extend(tool_round("c1", pretty));
        let s = settings(Mode::Auto, 1_000_000);
        let first = run_on(&messages, &s, Decision::default()).messages.unwrap();
        messages.push(json!({"role": "assistant", "content": "done"}));
        messages.push(json!({"role": "user", "content": "thanks"}));
        let out = run_on(&messages, &s, Decision::default());
        assert!(!out.report.rewrote_prefix);
        assert_eq!(&out.messages.unwrap()[..first.len()], &first[..]);
    }

    #[test]
    fn compact_mode_never_moves_units_and_compress_mode_never_compacts() {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for i in 0..6 {
            messages.extend(tool_round(&format!("c{i}"), lines(100)));
        }
        messages.push(json!({"role": "user", "content": "next"}));
        let compact = run_on(
            &messages,
            &settings(Mode::Compact, 500),
            Decision::default(),
        );
        assert_eq!(compact.report.offloaded, 0);
        assert!(compact.report.compacted > 0);
        let compress = run_on(
            &messages,
            &settings(Mode::Compress, 500),
            Decision::default(),
        );
        assert_eq!(compress.report.compacted, 0);
        assert!(compress.report.offloaded > 0);
    }
}

#[cfg(test)]
mod content_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn has_text_content_agrees_with_content_text() {
        let cases = [
            json!({"content": "x"}),
            json!({"content": ""}),
            json!({"content": null}),
            json!({"content": []}),
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}),
            json!({"content": [{"type": "text"}]}),
            json!({"content": 5}),
            json!({}),
        ];
        for m in cases {
            assert_eq!(Chat.has_text(&m), content_text(&m).is_some(), "{m}");
        }
    }
}
