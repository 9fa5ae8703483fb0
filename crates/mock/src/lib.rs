//! The mock upstream: the project's only fake, an HTTP server that answers like OpenAI's
//! chat-completions and Responses APIs and Anthropic's Messages API, key for key and event for
//! event (the facts it follows are in the repository's `docs/openai-wire.md`,
//! `docs/responses-wire.md` and `docs/messages-wire.md`), from replies a test scripts.
//! Integration tests run it in-process ([`MockUpstream`]); the end-to-end tests and the
//! benchmark run it as a process ([`cli::run`], `context-proxy mock-upstream`) and script it
//! over HTTP (`/_mock/*`).
//!
//! Code map: `server` accepts connections and owns the lifecycle; `routes` dispatches and
//! records; `chat` answers chat completions; `responses` the Responses API (`responses_wire`
//! writes its shapes); `messages` answers Anthropic Messages (`rules` the API's 400s,
//! `prompt_cache` its counting and caching, `anthropic` its shapes); `script` holds what tests
//! queue; `wire` writes the OpenAI chat shapes; `sse` streams events and detects clients that
//! leave; `reader` is the reader mode; `usage` counts tokens; `state` is what the handle and
//! the connections share; `body` is its response body type; `cli` is the command-line entry
//! point.
//!
//! It depends on nothing of the proxy but the token counter (`context-proxy-tokens`), through
//! that crate's public API: it plays the upstream, so it must not share the proxy's mistakes.

#![forbid(unsafe_code)]

mod anthropic;
mod body;
mod chat;
pub mod cli;
mod ctx;
mod messages;
mod prompt_cache;
pub mod reader;
mod responses;
mod responses_wire;
mod routes;
pub mod rules;
pub mod script;
mod server;
mod sse;
mod state;
pub mod usage;
mod wire;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub use chat::DEFAULT_REPLY_TEXT;
pub use cli::{run, MockArgs};
pub use messages::REF_PLACEHOLDER;
pub use script::{Completion, Gate, InvalidReply, Reply, ReplySpec, ToolCall};
pub use state::Received;

/// Response header of `GET /_mock/received`: how many older requests the log's bounds (10 000
/// requests, 256 MiB of bodies) dropped since the last reset; 0 when the log is whole.
pub const DROPPED_HEADER: &str = "x-mock-received-dropped";

/// How a mock behaves besides its scripted replies. The default answers at once, without limit.
#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// Fixed delay before answering any recorded request.
    pub latency: Duration,
    /// Extra delay per prompt token of a chat request (for benchmarks).
    pub latency_per_input_token: Duration,
    /// Above this many prompt tokens a chat request gets OpenAI's `context_length_exceeded` 400.
    pub context_limit: Option<usize>,
    /// Delay between two SSE events.
    pub chunk_interval: Duration,
    /// Reader mode: a recall question is answered only from what the request shows or what
    /// the proxy's tools give back ([`reader`]: `context_search` on chat completions,
    /// `context_read` on the Responses API), when no reply is scripted.
    pub reader: bool,
    /// Sent in the `x-mock-name` response header when not empty (routing tests use two mocks).
    pub name: String,
    /// Plays a Responses-compatible server that is not OpenAI (a vLLM or llama.cpp server):
    /// it knows no `compaction` nor `compaction_trigger` input item (the API's 400 for an
    /// unknown item type) and has no `POST /v1/responses/compact` (404).
    pub without_compaction: bool,
}

/// A running mock upstream. Dropping it stops it; [`MockUpstream::shutdown`] also waits until
/// every task has finished.
#[derive(Debug)]
pub struct MockUpstream {
    addr: SocketAddr,
    state: Arc<state::State>,
    handle: server::Handle,
}

impl MockUpstream {
    /// Starts a mock on `127.0.0.1` and a free port.
    pub async fn start(cfg: MockConfig) -> std::io::Result<MockUpstream> {
        MockUpstream::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), cfg).await
    }

    /// Starts a mock listening on `addr`.
    pub async fn bind(addr: SocketAddr, cfg: MockConfig) -> std::io::Result<MockUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(state::State::new());
        let handle = server::start(listener, state.clone(), cfg);
        Ok(MockUpstream {
            addr,
            state,
            handle,
        })
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`, the base URL a client or the proxy is pointed at.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a reply; chat requests take replies in order, and get
    /// [`DEFAULT_REPLY_TEXT`] when none is queued.
    pub fn push(&self, reply: Reply) {
        self.state.push_replies([reply]);
    }

    /// Number of queued replies not yet taken.
    pub fn pending_replies(&self) -> usize {
        self.state.pending_replies()
    }

    /// The requests received, on any path but `/_mock/*`, in order of arrival: all of them up
    /// to the 10,000 most recent (and 256 MiB of bodies), so a long-running mock stays bounded.
    pub fn received(&self) -> Vec<Received> {
        self.state.received()
    }

    /// Whether at least `n` requests have been received within `timeout`.
    pub async fn wait_received(&self, n: usize, timeout: Duration) -> bool {
        self.state.wait_received(n, timeout).await
    }

    /// Whether, within `timeout`, the client of a streamed response went away before the stream
    /// finished.
    pub async fn wait_stream_cancelled(&self, timeout: Duration) -> bool {
        self.state.wait_streams_cancelled(1, timeout).await
    }

    /// Streams whose client went away before every event was handed to the connection.
    pub fn streams_cancelled(&self) -> usize {
        self.state.streams_cancelled()
    }

    /// Streams whose every event, `[DONE]` included, was handed to the connection.
    pub fn streams_completed(&self) -> usize {
        self.state.streams_completed()
    }

    /// Whether at least `n` streams have completed within `timeout`. A client that has read
    /// `[DONE]` can be a moment ahead of the count: wait on it rather than reading it.
    pub async fn wait_streams_completed(&self, n: usize, timeout: Duration) -> bool {
        self.state.wait_streams_completed(n, timeout).await
    }

    /// Forgets queued replies, received requests and stream counts (as `POST /_mock/reset`).
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Stops accepting, closes every connection and waits until every task has finished.
    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }
}
