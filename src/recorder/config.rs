//! The `[record]` section: whether and where the proxy records its chat-completions traffic.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Traffic recording (`context-proxy --record DIR` turns it on too).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordConfig {
    /// Record every chat-completions exchange.
    pub enabled: bool,
    /// Directory of the recording files (created if missing).
    pub dir: PathBuf,
    /// Replace message texts by same-length hashes (roles, tool names, sizes kept): traffic
    /// that can be shared without its content.
    pub hash_content: bool,
    /// Exchanges waiting to be written; when full, new ones are dropped and counted
    /// (`record_dropped`), so writing never slows a request down.
    pub queue_capacity: usize,
    /// Largest response body kept per exchange, in bytes; a larger one is recorded without it.
    pub max_response_bytes: usize,
    /// A recording file larger than this is closed and a new one begun, in bytes.
    pub max_file_bytes: u64,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            enabled: false,
            dir: PathBuf::from("./recordings"),
            hash_content: false,
            queue_capacity: 1024,
            max_response_bytes: 4 * 1024 * 1024,
            max_file_bytes: 256 * 1024 * 1024,
        }
    }
}

impl RecordConfig {
    /// Checks the keys with constraints; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.queue_capacity == 0 {
            return Err("record.queue_capacity must be at least 1".into());
        }
        if self.max_file_bytes == 0 {
            return Err("record.max_file_bytes must be at least 1".into());
        }
        if self.enabled && self.dir.as_os_str().is_empty() {
            return Err("record.dir must not be empty when record.enabled".into());
        }
        Ok(())
    }
}
