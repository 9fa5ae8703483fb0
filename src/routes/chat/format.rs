//! What differs between the routes that run the managed phases of this module: the wire
//! format of the conversation, the upstream path, where a conversation's identity comes from
//! when the client names no session, and why a request must go unmanaged. Everything else —
//! parse, identify, plan, apply, forward, the retry, respond, record — is the same code for
//! every route; `CHAT` is chat completions' format, `routes::responses` has the Responses
//! API's, `routes::messages` Anthropic Messages' (and its `count_tokens`).

use http::HeaderMap;
use serde_json::Value;

use crate::context::adapter::messages::WriteRules;
use crate::context::adapter::Wire;
use crate::routes::tool_loop::LoopWire;

/// A managed route's format.
#[derive(Debug)]
pub struct Format {
    /// The route's name in logs, the page's journal and the recorder (`chat`, `responses`,
    /// `messages`, `count_tokens`).
    pub name: &'static str,
    /// The conversation's wire format (its adapter).
    pub wire: Wire,
    /// The upstream path, after the upstream's base URL (`/chat/completions`).
    pub path: &'static str,
    /// The session hint when the client sent no `x-context-session`.
    pub session_hint: fn(&HeaderMap, &Value) -> Option<String>,
    /// Why a request must go as it came, judged from its headers before its body is read (a
    /// compressed body), or `None`.
    pub unmanaged_head: fn(&HeaderMap) -> Option<String>,
    /// Why a parsed request must go as it came (it depends on state the proxy cannot see),
    /// or `None`.
    pub unmanaged_body: fn(&Value) -> Option<String>,
    /// The context limit an overflow error implies when it states none: the tokens the
    /// request was sent with, when the body is this format's "too long" error.
    pub implied_limit: fn(&[u8], usize) -> Option<usize>,
    /// The format's side of the tool loop, when the proxy's own tools are offered on it.
    pub tool_loop: Option<&'static dyn LoopWire>,
    /// How a decision is written back: `None` serializes the changed body (chat, Responses);
    /// `Some` writes it into the client's bytes under these rules, judged from the request's
    /// headers and body (Messages: untouched messages spliced, thinking and breakpoints kept).
    pub write_rules: fn(&HeaderMap, &Value) -> Option<WriteRules>,
    /// The client reads errors in Anthropic's shape: a stream failing mid-way ends with
    /// Anthropic's `error` event (else OpenAI's).
    pub anthropic_errors: bool,
    /// Where the upstream counts a request exactly, asked near the budget and the window
    /// (`exact.rs`; Anthropic's `count_tokens`), when the upstream's `count_tokens_margin` is
    /// set.
    pub exact_count: Option<&'static super::exact::ExactCount>,
    /// What each request forwards is remembered per conversation when its model binds
    /// thinking blocks to what they follow (Anthropic Messages; not `count_tokens`, whose
    /// count no answer follows): the next request's changes are judged against it.
    pub remembers_forwarded: bool,
}

/// Writes a decision by serializing the changed body.
pub fn serialized(_: &HeaderMap, _: &Value) -> Option<WriteRules> {
    None
}

fn none_from_headers(_: &HeaderMap, _: &Value) -> Option<String> {
    None
}

/// Every request can be read: none goes unmanaged for its headers.
pub fn managed_head(_: &HeaderMap) -> Option<String> {
    None
}

/// Every parsed request can be managed.
pub fn managed_body(_: &Value) -> Option<String> {
    None
}

/// An overflow error implies no limit (it states one, or none at all).
pub fn no_implied_limit(_: &[u8], _: usize) -> Option<usize> {
    None
}

/// Chat completions (`POST /v1/chat/completions`): the session is `x-context-session` or the
/// conversation's opening; every request is managed.
pub const CHAT: Format = Format {
    name: "chat",
    wire: Wire::Chat,
    path: "/chat/completions",
    session_hint: none_from_headers,
    unmanaged_head: managed_head,
    unmanaged_body: managed_body,
    implied_limit: no_implied_limit,
    tool_loop: Some(&super::loop_wire::ChatLoop),
    write_rules: serialized,
    anthropic_errors: false,
    exact_count: None,
    remembers_forwarded: false,
};
