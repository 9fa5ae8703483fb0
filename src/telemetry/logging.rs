//! Logging setup: tracing, human-readable or JSON lines, filtered by the config's level or
//! `RUST_LOG`. Each request's lines carry its id through the `request` span.
//!
//! Lines are formatted on the thread that logs them and written to stderr by one background
//! thread through a buffer, so a request never waits for a `write(2)` and under load many
//! lines leave in one write. Nothing is dropped: when the queue is full, logging waits.
//!
//! Nothing at info level or above contains an API key or message content.

use std::io::IsTerminal;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use serde::{Deserialize, Serialize};

/// Lines that may wait for the writer thread before logging blocks (~0.1 s of backlog at 20k
/// requests/s; the writer drains far faster). The queue's slots are allocated up front:
/// tracing-appender's default of 128 000 lines costs 4 MiB of RSS, and 8192 (a 256 KiB block)
/// left glibc's allocator holding ~10 MiB more after large requests (BENCHMARKS.md).
const QUEUED_LINES: usize = 2048;

/// Keeps the log writer running; dropping it writes out what is still queued and stops it.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: Option<WorkerGuard>,
}

/// Installs the global subscriber (once; later calls are ignored). Logs go to stderr so that
/// stdout carries only the listening address; colours only when stderr is a terminal.
pub fn init(cfg: &LogConfig) -> LogGuard {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(QUEUED_LINES)
        .lossy(false)
        .thread_name("log-writer")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    let result = match cfg.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    // Already installed (tests start several servers in one process): keep the first, and
    // let this writer go.
    LogGuard {
        _writer: result.ok().map(|()| guard),
    }
}

/// The `[log]` section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `context_proxy=debug`; `RUST_LOG` overrides it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}
