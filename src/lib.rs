//! `context-proxy`: an OpenAI-compatible reverse proxy that manages the context of tool-using
//! agents. The binary (`main.rs`) parses the command line and calls into this library.
//!
//! The request path: [`server`] accepts connections → [`router`] names the request and picks a
//! handler → [`chat`] (the proxy's own phases) or [`passthrough`] (verbatim) → [`upstream`]
//! sends it → [`relay`] streams the answer back. Errors become responses in [`error`].
//!
//! Leaves the proxy shares with its tools, and the dev tooling, live in crates of their own
//! under `crates/` and are re-exported here under their old paths: [`tokens`] (token
//! counting), [`pricing`] (the providers' prompt-caching prices), [`contract`] (the names of
//! the proxy's own headers), [`corpus`] (the agent-traffic corpus format), [`mock`] (the mock
//! upstream) and [`traffic`] (the sample-traffic generator). The tools that drive a running
//! proxy (`bench`, `replay`, `probe`, the demo's session) are the `context-proxy-drive` crate,
//! which only the binary uses: the library does not contain them.

#![forbid(unsafe_code)]

/// mimalloc for every binary built on this library (the proxy, its examples, benches and
/// tests): many small JSON values are allocated per request and freed together, where glibc's
/// malloc spent a fifth of the time of a 50k-tool-call request (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod app;
pub mod auth;
pub mod context;
pub mod glob;
pub mod http;
pub mod proxy_tools;
pub mod recorder;
pub mod routes;
pub mod server;
pub mod service;
pub mod sessions;
pub mod store;
pub mod summarizer;
pub mod telemetry;
pub mod upstream;
pub mod wire;

pub use context_proxy_contract as contract;
pub use context_proxy_corpus as corpus;
pub use context_proxy_mock as mock;
pub use context_proxy_pricing as pricing;
pub use context_proxy_tokens as tokens;
pub use context_proxy_traffic as traffic;
