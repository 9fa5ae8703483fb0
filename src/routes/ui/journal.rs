//! The `request` line of a session's journal: what the proxy did for one request, written by
//! the chat route's record phase when `[ui] enabled`, read back by the page. Older journals
//! (only `decision` and `stored` lines) stay readable: every field has a default, and a
//! journal without `request` lines shows its other lines.
//!
//! With `[ui] keep_messages`, the messages the client sent and those the model received are
//! stored as content (kind `messages`, addressed by their hash, so a turn sent twice is kept
//! once) and named in the line's `bodies`; erasing the session erases them
//! ([`crate::sessions::erase`] reads `bodies`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{ContentKind, SessionId, Store, Tenant};

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
    /// The route: `chat` for `/v1/chat/completions`.
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

/// The `messages` array of a request body, as JSON text, when it has one.
fn messages_of(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let messages = value.get("messages")?;
    messages.is_array().then(|| messages.to_string())
}

/// What a finished request leaves for the journal: the line and, when kept, the bodies.
pub struct Pending {
    pub tenant: Tenant,
    pub session: SessionId,
    pub line: RequestLine,
    /// The client's body, and the forwarded one when it differs, to keep (`keep_messages`).
    pub client_body: Option<bytes::Bytes>,
    pub forwarded_body: Option<bytes::Bytes>,
}

/// Stores the kept messages and appends the line. Failures only warn: the page is never a
/// reason for a request to fail, and this runs after the answer went out.
pub async fn write(store: &dyn Store, mut pending: Pending) {
    if let Some(client_body) = &pending.client_body {
        let (tenant, session) = (&pending.tenant, &pending.session);
        let client = keep(store, tenant, session, client_body).await;
        let forwarded = match &pending.forwarded_body {
            Some(body) => keep(store, tenant, session, body).await,
            None => client.clone(),
        };
        pending.line.bodies = Some(Bodies { client, forwarded });
    }
    let record = match serde_json::to_value(&pending.line) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the request's journal line");
            return;
        }
    };
    if let Err(e) = store
        .append_log(&pending.tenant, &pending.session, &record)
        .await
    {
        tracing::warn!(error = %e, "cannot append to the session log");
    }
}

/// Stores the `messages` of `body`; their reference, when stored.
async fn keep(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    body: &bytes::Bytes,
) -> Option<String> {
    let text = messages_of(body)?;
    match store
        .put_content(tenant, session, ContentKind::Messages, &text)
        .await
    {
        Ok(r) => Some(r.as_str().to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot keep a request's messages for the page");
            None
        }
    }
}
