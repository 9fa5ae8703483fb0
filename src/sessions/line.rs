//! The `request` line of a session's journal: what the proxy did for one request, as the
//! page shows it. Built by the record phase, written by the journal writer
//! ([`super::journal`]), read by the page's views ([`super::view`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest part of a reload call's answer kept in the line, in characters.
pub const RESULT_PREVIEW_CHARS: usize = 2_000;
/// Most reload calls kept in one line (the counts stay exact).
pub const MAX_CALLS_KEPT: usize = 32;

/// One call of the proxy's own tools, as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReloadCall {
    /// The round it was made in, from 1.
    pub round: u32,
    pub tool: String,
    /// Its arguments as the model wrote them (clipped).
    pub arguments: String,
    pub ok: bool,
    /// Lines of stored content the answer held.
    pub lines: usize,
    /// The start of the answer ([`RESULT_PREVIEW_CHARS`]).
    pub result: String,
    /// The answer was longer than `result`.
    pub clipped: bool,
}

/// What one request's record phase knows, as a journal line (`"event": "request"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestLine {
    pub ts: String,
    pub request_id: String,
    pub event: String,
    /// The route: `chat` for `/v1/chat/completions`, `responses` for `/v1/responses`,
    /// `messages` for `/v1/messages`.
    pub route: String,
    pub model: Option<String>,
    pub upstream: String,
    pub status: u16,
    pub mode: String,
    pub stream: bool,
    /// Tokens of the request as the client sent it and as forwarded (the proxy's count).
    pub tokens_before: usize,
    pub tokens_after: usize,
    /// Tokens at the start of the forwarded request the previous one also had.
    pub kept_prefix_tokens: usize,
    /// Tokens at the start of the client's request its previous request also had: the prefix
    /// a provider's cache would have read without the proxy ([`crate::tokens::shared_prefix`],
    /// the replay's computation, set by the journal writer). `None` when the previous request
    /// is not known (the session's first, a line older than this field): the previous
    /// request's whole count stands for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_shared_tokens: Option<usize>,
    /// Whether a message the previous request had sent was rewritten.
    pub rewrote_prefix: bool,
    /// `minified=2,compacted=1`, `none`, or `skipped (why)`.
    pub actions: String,
    /// What a summary did for this request (`hit`, `computed`, `fallback`).
    pub summary: Option<String>,
    /// The upstream's usage, summed over every call the request made.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Milliseconds from the request's arrival: the proxy's own work, the first byte to the
    /// client, the end of the answer.
    pub proxy_ms: Option<f64>,
    pub ttfb_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub upstream_calls: u32,
    pub reload_rounds: u32,
    pub reload_calls: u32,
    /// The calls themselves (at most [`MAX_CALLS_KEPT`]).
    pub reloads: Vec<ReloadCall>,
    /// The stored content the forwarded request refers to (its markers' references).
    pub refs: Vec<String>,
    /// The kept messages, when `[ui] keep_messages`.
    pub bodies: Option<Bodies>,
    /// Every upstream call the request made, by kind, with what each sent: the forwarded
    /// request, rounds of the proxy's tools, a retry, the summarizer's calls it waited for
    /// (what the page's cost with the proxy adds up; empty in lines written before it).
    #[serde(skip_serializing_if = "crate::pricing::Bill::is_empty")]
    pub calls: crate::pricing::Bill,
}

/// The references of one request's kept messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bodies {
    /// The `messages` the client sent.
    pub client: Option<String>,
    /// The `messages` of the first upstream call (the client's when nothing changed).
    pub forwarded: Option<String>,
}

impl RequestLine {
    /// The line of a journal record, when it is a `request` line.
    pub fn of(record: &Value) -> Option<RequestLine> {
        if record.get("event")? != "request" {
            return None;
        }
        serde_json::from_value(record.clone()).ok()
    }
}
