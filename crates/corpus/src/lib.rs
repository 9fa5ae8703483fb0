//! The agent-traffic corpus format: chat-completions sessions stored once with the points at
//! which the agent sent a request, and the directory of files that holds a corpus.
//!
//! The sample-traffic generator (`context-proxy-traffic`) writes corpora in this format and the
//! benchmarks read them; a recorder of real traffic inside the proxy can write the same files.
//!
//! - `session.rs` — [`Session`]: one conversation's messages, stored once, and the end of each
//!   request in them; the request bodies it stands for; the invariants every session satisfies.
//! - `dir.rs` — a corpus on disk (`session-<id>.json` files and an `index.json` with statistics)
//!   and [`stats`].
//! - `recording.rs` — recorded traffic: exchanges appended to JSONL files by the proxy's
//!   recorder, each message stored once per file; [`recording::read`] puts them back.
//!
//! Pure data and file I/O: no network, no clock, no randomness; the same sessions always give
//! byte-identical files.

#![forbid(unsafe_code)]

mod dir;
pub mod recording;
mod responses;
mod session;

use serde::{Deserialize, Serialize};

pub use dir::{
    file_name, load_dir, read_index, stats, write_dir, CorpusIndex, CorpusStats, IndexEntry,
    Origin, SizeBucket, FORMAT_VERSION,
};
pub use session::{with_newest_marked, Session};

/// The kind of agent a session comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// Reads source files (up to hundreds of KB), runs tests and commands, edits code.
    Coding,
    /// Searches the web and reads long pages, several at a time.
    Research,
    /// Answers a shop's customers in many short turns with small lookups.
    Support,
}

impl AgentKind {
    pub const ALL: [AgentKind; 3] = [AgentKind::Coding, AgentKind::Research, AgentKind::Support];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Coding => "coding",
            AgentKind::Research => "research",
            AgentKind::Support => "support",
        }
    }
}

/// The API a session's requests are written for (a session file's `wire`; absent: chat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wire {
    /// Chat completions: `messages` (`POST /v1/chat/completions`).
    #[default]
    Chat,
    /// The Responses API the way Codex sends it: `instructions` and `input` items, `store`
    /// false, the whole input every turn (`POST /v1/responses`).
    Responses,
    /// Anthropic Messages the way Claude Code sends it: Messages' `messages` (content blocks,
    /// `tool_use` / `tool_result`), the other top-level fields in the session's `fields`
    /// (`POST /v1/messages`).
    Messages,
}

impl Wire {
    pub fn is_chat(&self) -> bool {
        *self == Wire::Chat
    }
}

impl std::fmt::Display for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_serialize_in_lower_case() {
        assert_eq!(
            serde_json::to_string(&AgentKind::Research).unwrap(),
            "\"research\""
        );
        assert_eq!(AgentKind::Support.to_string(), "support");
    }
}
