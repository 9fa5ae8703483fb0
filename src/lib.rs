//! `context-proxy`: an OpenAI-compatible reverse proxy that manages the context of tool-using
//! agents. The binary (`main.rs`) parses the command line and calls into this library.
//!
//! The request path: [`server`] accepts connections → [`router`] names the request and picks a
//! handler → [`chat`] (the proxy's own phases) or [`passthrough`] (verbatim) → [`upstream`]
//! sends it → [`relay`] streams the answer back. Errors become responses in [`error`].

#![forbid(unsafe_code)]

pub mod bench;
pub mod body;
pub mod chat;
pub mod config;
pub mod context;
pub mod error;
pub mod headers;
pub mod logging;
pub mod metrics;
pub mod mock;
pub mod passthrough;
pub mod relay;
pub mod reload;
pub mod request_body;
pub mod response;
pub mod router;
pub mod server;
pub mod state;
pub mod store;
pub mod tokens;
pub mod traffic;
pub mod upstream;
