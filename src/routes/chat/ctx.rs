//! The per-request context every phase of a managed route (chat completions, the Responses
//! API) reads and fills in.

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderValue};

use super::ChatRequest;
use crate::context::{Identity, Managed, Mode};
use crate::upstream::{Upstream, UpstreamRequest};

/// One request on its way through the phases.
pub struct ChatCtx {
    /// What differs between the managed routes (the wire format, the upstream path, …).
    pub format: &'static super::Format,
    /// Why the request goes as it came although its context would be managed (shown in
    /// `x-context-actions`).
    pub unmanaged: Option<String>,
    /// The request id (`x-context-request-id`), also on every log line of the request.
    pub request_id: HeaderValue,
    /// The client's request headers, until `forward` takes them for the upstream request.
    pub headers: HeaderMap,
    /// The client's query string, sent on as it came.
    pub query: Option<String>,
    /// The request as the client sent it (raw bytes and JSON); `apply` rewrites the JSON.
    pub request: ChatRequest,
    /// The upstream serving the request's model.
    pub upstream: Arc<Upstream>,
    /// Context management mode for this request.
    pub mode: Mode,
    /// Tenant and session, when the context is managed and the body has messages.
    pub identity: Option<Identity>,
    /// What `plan` decided, until `apply` carries it out.
    pub plan: Option<crate::context::Plan>,
    /// What `apply` did: the new body (if any) and the report for headers and metrics.
    pub managed: Managed,
    /// The upstream request as built by `forward`, ready to be sent again.
    pub outgoing: Option<UpstreamRequest>,
    /// Whether (and under which names) the proxy's tools can be offered in this request.
    pub offer: crate::proxy_tools::Offer,
    /// The tokens the proxy's tool definitions add when offered (kept free in the budget).
    pub offer_tokens: usize,
    /// Set when the proxy offered its own tools: what the tool loop needs.
    pub reload: Option<crate::routes::tool_loop::Reload>,
    /// The JSON body differs from the raw bytes beyond what `managed.body` holds (hidden
    /// exchanges put back, tools added): `forward` serializes it.
    pub body_changed: bool,
    /// Hidden exchanges of the proxy's tools put back into the conversation.
    pub restored: usize,
    /// Stored content the client's input names already (the proxy's sealed compaction items,
    /// expanded into their markers): the proxy's tools are offered to read it.
    pub named_refs: Vec<crate::store::ContentRef>,
    /// The client's bytes, when hidden rounds were put back into `request`'s (Anthropic
    /// Messages): what the next hidden round is keyed by.
    pub client_raw: Option<bytes::Bytes>,
    /// Rounds, calls and upstream calls of the tool loop (shared with a streaming loop's task).
    pub stats: Arc<crate::routes::tool_loop::LoopStats>,
    pub timings: Timings,
    /// Who sent it (`crate::auth`): its tenant, and its key's token budget to charge.
    pub caller: Option<crate::auth::Caller>,
    /// Tokens reserved against the key's per-minute budget before forwarding (settled by
    /// `record` against the answer's usage).
    pub reserved_tokens: u64,
    /// The request's `model`, kept for the record phase (the tool loop takes the body).
    pub model: Option<String>,
    /// What a summary did for this request (`x-context-summary`: hit, computed, fallback,
    /// unpaid).
    pub summary: Option<&'static str>,
    /// A smaller budget for a second plan, after the upstream said the context is too long.
    pub budget_override: Option<usize>,
    /// The request's size against its budget and window before planning, when the format and
    /// the upstream ask for exact counts near them (`exact.rs`).
    pub sizing: Option<crate::context::Sizing>,
    /// The upstream's tokens per estimated token, from its exact count of this request.
    pub exact_scale: Option<f64>,
    /// The client's request as prefix parts, for the page's cost without the proxy (kept
    /// only with `[ui]`).
    pub client_parts: Option<crate::tokens::Parts>,
}

/// When each step of the request happened.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// The request head arrived.
    pub received: Instant,
    /// `apply` finished: the proxy's own work before forwarding ends here.
    pub planned: Option<Instant>,
    /// The upstream's response headers arrived.
    pub upstream_headers: Option<Instant>,
    /// The first body byte was relayed to the client.
    pub first_byte: Option<Instant>,
    /// The response body ended (or the client left).
    pub done: Option<Instant>,
}

impl ChatCtx {
    pub fn new(
        request_id: HeaderValue,
        parts: http::request::Parts,
        request: ChatRequest,
        upstream: Arc<Upstream>,
        received: Instant,
        format: &'static super::Format,
    ) -> ChatCtx {
        ChatCtx {
            format,
            unmanaged: None,
            request_id,
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers,
            request,
            upstream,
            mode: Mode::Off,
            identity: None,
            plan: None,
            managed: Managed::off(),
            outgoing: None,
            offer: crate::proxy_tools::Offer::NotOffered(crate::proxy_tools::NotOffered::Disabled),
            offer_tokens: 0,
            reload: None,
            body_changed: false,
            restored: 0,
            named_refs: Vec::new(),
            client_raw: None,
            stats: Arc::default(),
            timings: Timings {
                received,
                planned: None,
                upstream_headers: None,
                first_byte: None,
                done: None,
            },
            caller: None,
            reserved_tokens: 0,
            model: None,
            summary: None,
            budget_override: None,
            sizing: None,
            exact_scale: None,
            client_parts: None,
        }
    }

    /// The request id as text (it is visible ASCII by construction).
    pub fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }
}
