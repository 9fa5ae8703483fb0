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
/// Response header: what a summary did for this request (`hit`, `computed`, `fallback`).
pub const SUMMARY_HEADER: &str = "x-context-summary";

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
        ] {
            assert!(name.starts_with(super::CONTROL_HEADER_PREFIX), "{name}");
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }
}
