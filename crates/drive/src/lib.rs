//! `context-proxy-drive`: the tools that drive a running proxy from outside, as its clients do,
//! and report what they saw. Each is a subcommand of the `context-proxy` binary; none is part
//! of the proxy library, and this crate does not depend on it (Cargo forbids the cycle): what
//! both need is in leaf crates (`contract`: the header names, `pricing`: the price table,
//! `corpus`: the traffic formats, `tokens`, and the `mock` upstream).
//!
//! - [`bench`] — `context-proxy bench`: the proxy's overhead (latency, CPU per request, memory)
//!   against calling the mock upstream directly, and the hostile-client targets;
//! - [`replay`] — `context-proxy replay`: recorded or sample traffic sent again, with latency,
//!   tokens, prefix stability and the cost under prompt caching;
//! - [`fidelity`] — `context-proxy probe`: needle facts planted in tool outputs, asked for at
//!   the end (can the model still reach what the proxy compacted?);
//! - [`demo`] — what `context-proxy --demo` shows: a scripted long session through the proxy,
//!   turn by turn;
//! - [`children`] — the mock and the proxy as child processes of this executable.

#![forbid(unsafe_code)]

pub mod bench;
pub mod children;
pub mod demo;
pub mod fidelity;
pub mod replay;
