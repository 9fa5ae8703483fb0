//! `context-proxy`: an OpenAI-compatible reverse proxy that manages the context of tool-using
//! agents. The binary (`main.rs`) parses the command line and calls into this library.
//!
//! The request path: [`server`] accepts connections and its router names the request →
//! [`routes`] answers it (`chat`, the proxy's own phases; `passthrough`, verbatim) →
//! [`upstream`] sends it and relays the answer back. Errors become responses in
//! [`http::error`].
//!
//! The modules stand in layers (ARCHITECTURE.md; `tests/layers.rs` holds them): leaves
//! ([`wire`], [`ids`], [`telemetry`], [`glob`], [`service`] and the leaf crates), adapters ([`store`],
//! [`upstream`], [`http`]), the domain ([`context`], [`proxy_tools`], [`auth`], [`sessions`],
//! [`summarizer`], [`recorder`]), routes and the server ([`routes`], [`server`]), and the
//! composition root ([`app`]). An import points down, never up, and never in a circle.
//!
//! Leaves the proxy shares with its tools, and the dev tooling, live in crates of their own
//! under `crates/` and are re-exported here: [`tokens`] (token counting), [`pricing`] (the
//! providers' prompt-caching prices), [`contract`] (the names of the proxy's own headers),
//! [`corpus`] (the agent-traffic corpus format), [`mock`] (the mock upstream) and [`traffic`]
//! (the sample-traffic generator). The tools that drive a running proxy (`bench`, `replay`,
//! `probe`, the demo's session) are the `context-proxy-drive` crate, which only the binary
//! uses: the library does not contain them.

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
pub mod ids;
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
