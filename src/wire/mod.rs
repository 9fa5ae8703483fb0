//! The response half: reading what the upstream answers, in both shapes.
//!
//! - [`sse`]: an incremental event-stream reader that gives each event's fields and its exact
//!   raw bytes, so events can be relayed, dropped or rewritten one by one.
//! - [`accumulate`]: a chat completion assembled from stream chunks (or read from a JSON body)
//!   into one view, with the tool calls reported as they start.
//! - [`hide`]: the proxy's own tool calls dropped from a stream's chunks, the others renumbered.
//! - [`usage`]: the upstream's token usage, summed over several calls and written back.
//! - [`usage_tap`]: the usage of an answer of either shape, read as it streams past.
//! - [`anthropic`]: Anthropic Messages: its error shape, the usage of its answers.
//! - [`responses`]: the Responses API's stream endings: one terminal event, an upstream
//!   `error` event turned into the `response.failed` that ends the stream.
//! - [`messages`]: a Messages answer assembled from its events, the proxy's calls hidden from
//!   the client and the rest renumbered over the tool loop's rounds.
//!
//! Everything here is pure: bytes and JSON in, values out; no I/O, no clock. It shares nothing
//! with the mock upstream's wire code, so the two cannot agree on a mistake.

pub mod accumulate;
pub mod anthropic;
pub mod error;
pub mod hide;
pub mod messages;
pub mod responses;
pub mod sse;
pub mod usage;
pub mod usage_tap;

pub use accumulate::{
    ChatAccumulator, Choice, ChunkError, Completion, ShapeError, ToolCall, ToolCallDelta,
};
pub use hide::{Filtered, ToolCallFilter};
pub use sse::{data_event, Event, Events, SseConfig, SseError, SseReader};
pub use usage::Usage;
pub use usage_tap::{TapConfig, UsageTap};

#[cfg(test)]
mod fixtures;
