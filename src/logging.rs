//! Logging setup: tracing, human-readable or JSON lines, filtered by the config's level or
//! `RUST_LOG`. Each request's lines carry its id through the `request` span.
//!
//! Nothing at info level or above contains an API key or message content.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber (once; later calls are ignored). Logs go to stderr so that
/// stdout carries only the listening address.
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match cfg.format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    // Already installed (tests start several servers in one process): keep the first.
    drop(result);
}
