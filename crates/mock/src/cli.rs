//! The mock as a process: its command-line options ([`MockArgs`]) and [`run`], which serves until
//! SIGINT or SIGTERM. The end-to-end tests start it, read the one line it prints to learn its
//! address, and script it over `/_mock/*`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use super::{MockConfig, MockUpstream};

/// Options of the mock upstream process.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct MockArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Fixed delay before answering, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Extra delay per prompt token, in microseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_per_token_us: u64,
    /// Prompt tokens above which a chat request gets `context_length_exceeded`.
    #[arg(long)]
    pub context_limit: Option<usize>,
    /// Delay between SSE events, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub chunk_interval_ms: u64,
    /// Name sent in the `x-mock-name` response header.
    #[arg(long, default_value = "mock")]
    pub name: String,
    /// Reader mode: answer recall questions only from what the request shows (see `reader`).
    #[arg(long)]
    pub reader: bool,
    /// Play a Responses server that is not OpenAI: no `compaction`/`compaction_trigger` items,
    /// no `/v1/responses/compact`.
    #[arg(long)]
    pub without_compaction: bool,
}

impl MockArgs {
    /// The configuration these options describe.
    pub fn config(&self) -> MockConfig {
        MockConfig {
            latency: Duration::from_millis(self.latency_ms),
            latency_per_input_token: Duration::from_micros(self.latency_per_token_us),
            context_limit: self.context_limit,
            chunk_interval: Duration::from_millis(self.chunk_interval_ms),
            name: self.name.clone(),
            reader: self.reader,
            without_compaction: self.without_compaction,
        }
    }
}

/// Starts the mock, prints `mock upstream listening on http://ADDR` on stdout, and serves until
/// SIGINT or SIGTERM.
pub async fn run(args: MockArgs) -> std::io::Result<()> {
    let mock = MockUpstream::bind(args.listen, args.config()).await?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "mock upstream listening on http://{}", mock.addr())?;
        stdout.flush()?;
    }
    let signalled = shutdown_signal().await;
    mock.shutdown().await;
    signalled
}

/// Resolves on SIGINT or SIGTERM.
#[cfg(unix)]
async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted,
        _ = terminate.recv() => Ok(()),
    }
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
async fn shutdown_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let defaults = Cli::parse_from(["mock"]).mock;
        assert_eq!(defaults.listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(defaults.context_limit, None);
        assert_eq!(defaults.config().latency, Duration::ZERO);

        let args = Cli::parse_from([
            "mock",
            "--listen",
            "127.0.0.1:0",
            "--latency-ms",
            "5",
            "--latency-per-token-us",
            "7",
            "--context-limit",
            "100",
            "--chunk-interval-ms",
            "3",
            "--name",
            "b",
        ])
        .mock;
        let config = args.config();
        assert_eq!(config.latency, Duration::from_millis(5));
        assert_eq!(config.latency_per_input_token, Duration::from_micros(7));
        assert_eq!(config.context_limit, Some(100));
        assert_eq!(config.chunk_interval, Duration::from_millis(3));
        assert_eq!(config.name, "b");
    }
}
