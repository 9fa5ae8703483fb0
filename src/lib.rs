//! `context-proxy`: an OpenAI-compatible reverse proxy that manages the context of tool-using
//! agents. The binary (`main.rs`) parses the command line and calls into this library; the
//! request path is `server` → `router` → `chat` (phases) or `passthrough`.

#![forbid(unsafe_code)]

pub mod body;
pub mod config;
pub mod error;
pub mod tokens;
pub mod traffic;
