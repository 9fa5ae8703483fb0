//! The proxy's contract with its clients, as names: the headers a client sends to steer the
//! proxy and the headers it reads back to see what the proxy did. The proxy (which writes and
//! reads them) and its tools that drive it from outside (`context-proxy-drive`: the demo,
//! `bench`, `replay`, `probe`) take the names from here, so they cannot drift apart.
//!
//! No code, no dependencies: a leaf every crate of the workspace may use.

#![forbid(unsafe_code)]

/// Request headers starting with this are the proxy's own and never forwarded.
pub const CONTROL_HEADER_PREFIX: &str = "x-context-";

/// Request header naming the session (the conversation); without it the proxy derives one
/// from the conversation's first messages.
pub const SESSION_HEADER: &str = "x-context-session";
/// Request header choosing the mode for one request (`off`, `compact`, `compress`, `auto`).
pub const MODE_HEADER: &str = "x-context-mode";

/// Response header carrying the request id (also on every log line of the request); a client's
/// own id is kept when it is a valid one. The upstream's own `x-request-id` is relayed
/// untouched.
pub const REQUEST_ID_HEADER: &str = "x-context-request-id";
/// Response header: the prompt tokens of the request as it came, by the proxy's count.
pub const TOKENS_BEFORE_HEADER: &str = "x-context-tokens-before";
/// Response header: the prompt tokens of the request as it was forwarded.
pub const TOKENS_AFTER_HEADER: &str = "x-context-tokens-after";
/// Response header: what was done, e.g. `minified=3,compacted=12,offloaded=8`, or `none`.
pub const ACTIONS_HEADER: &str = "x-context-actions";
/// Response header: tokens of the forwarded request the previous request of the conversation
/// also had, byte for byte (the cached prefix the proxy kept), by the proxy's count.
pub const KEPT_PREFIX_HEADER: &str = "x-context-kept-prefix-tokens";
/// Response header: rounds and calls of the proxy's own tools answered for this request
/// (`rounds=…,calls=…,failed=…`; JSON answers: a stream's headers leave before its rounds).
pub const RELOAD_HEADER: &str = "x-context-reload";
/// Response header: `usage.prompt_tokens_details.cached_tokens` the upstream reported, summed
/// over its calls (JSON answers the proxy read whole for its tools; a stream's headers, and a
/// relayed answer's, leave before its usage).
pub const UPSTREAM_CACHED_HEADER: &str = "x-context-upstream-cached-tokens";
/// Response header: what a summary did for this request (`hit`, `computed`, `fallback`, or
/// `unpaid`: not asked for, it would cost more than going direct saves).
pub const SUMMARY_HEADER: &str = "x-context-summary";
/// Response header: the upstream calls made for a managed request by kind
/// (`forwarded=1,reload=2,retry=0,summarizer=1`): the request, rounds of the proxy's own
/// tools, the retry after "context too long", the summarizer's calls it waited for. The calls
/// made before the headers left: a JSON answer's are all of them; a stream's headers leave
/// before its tool rounds (HTTP/1.1 clients read no trailers), so there `reload` is left out
/// (`forwarded=1,retry=0,summarizer=0`) and the rounds are counted in the metrics
/// (`context_proxy_calls_total`) and the page's journal.
pub const UPSTREAM_CALLS_HEADER: &str = "x-context-upstream-calls";
/// Response header: what those calls cost, in full-price input tokens of the request's model
/// under its upstream's cache prices (a summary at its model's list prices, output included),
/// one decimal; the same calls as [`UPSTREAM_CALLS_HEADER`].
pub const COST_HEADER: &str = "x-context-cost-tokens";

#[cfg(test)]
mod tests {
    #[test]
    fn every_header_is_the_proxys_own_and_lowercase() {
        for name in [
            super::SESSION_HEADER,
            super::MODE_HEADER,
            super::REQUEST_ID_HEADER,
            super::TOKENS_BEFORE_HEADER,
            super::TOKENS_AFTER_HEADER,
            super::ACTIONS_HEADER,
            super::KEPT_PREFIX_HEADER,
            super::RELOAD_HEADER,
            super::UPSTREAM_CACHED_HEADER,
            super::SUMMARY_HEADER,
            super::UPSTREAM_CALLS_HEADER,
            super::COST_HEADER,
        ] {
            assert!(name.starts_with(super::CONTROL_HEADER_PREFIX), "{name}");
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }
}
