//! The response half: reading what the upstream answers, in both shapes.
//!
//! - [`sse`]: an incremental event-stream reader that gives each event's fields and its exact
//!   raw bytes, so events can be relayed, dropped or rewritten one by one.
//!
//! Everything here is pure: bytes and JSON in, values out; no I/O, no clock. It shares nothing
//! with the mock upstream's wire code, so the two cannot agree on a mistake.

pub mod sse;

pub use sse::{Event, Events, SseConfig, SseError, SseReader};

#[cfg(test)]
mod fixtures;
