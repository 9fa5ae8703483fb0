//! The `context-proxy` binary: parses the command line, loads the config, and serves (or runs
//! one of the tool subcommands). All the work is in the library.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use context_proxy::app::config::{Config, ValidConfig};
use context_proxy::mock::{MockConfig, MockUpstream};
use context_proxy::server::Stop;
use tracing::Instrument;

/// OpenAI-compatible reverse proxy that manages the context of tool-using agents.
///
/// Point an app's OpenAI base URL at it (e.g. OPENAI_BASE_URL=http://127.0.0.1:8080/v1). It
/// forwards every request to the configured upstream and prints the address it listens on.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    /// Config file (TOML). Without it, ./config.toml is used when present, else the defaults.
    #[arg(long, short = 'c', value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Address to listen on; overrides server.listen.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Base URL of the default upstream (e.g. https://api.openai.com/v1); overrides its base_url.
    #[arg(long, value_name = "URL", conflicts_with = "demo")]
    upstream: Option<String>,
    /// Record every chat-completions exchange into DIR (turns `[record]` on, sets its dir).
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Offline demo: also start the built-in mock upstream and send everything to it.
    #[arg(long)]
    demo: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mock upstream: an OpenAI-compatible stand-in for tests, demos and benchmarks.
    MockUpstream(context_proxy::mock::MockArgs),
    /// Measure the proxy's overhead against calling the mock upstream directly.
    Bench(context_proxy_drive::bench::BenchArgs),
    /// Write the sample agent traffic (seeded, deterministic) that the context benchmark plans
    /// over.
    GenTraffic(context_proxy::traffic::GenTrafficArgs),
    /// Send recorded or sample traffic again (to the proxy, and directly to the upstream with
    /// --compare) and report latency, tokens, prefix stability and cost under prompt caching.
    Replay(Box<context_proxy_drive::replay::ReplayArgs>),
    /// Plant needle facts deep in sample sessions' tool outputs, drive them through the proxy
    /// and ask for every needle: reachability (mock in reader mode) or recall (a real model).
    Probe(context_proxy_drive::fidelity::ProbeArgs),
    /// Check that a running proxy is healthy (GET /healthz answers 200): exit status 0, else 1.
    Healthcheck(context_proxy::app::healthcheck::HealthcheckArgs),
    /// Check a config file (default: --config, else ./config.toml, else the defaults) with
    /// its CONTEXT_PROXY_<SECTION>__<KEY> environment overrides, and print the effective
    /// configuration with secrets masked. Exit status 1 and the key at fault when it is wrong.
    CheckConfig {
        /// The config file.
        file: Option<PathBuf>,
    },
    /// Print what the configured store holds, as JSON: every tenant's sessions, or one session
    /// (its statistics, journal and stored references).
    Inspect {
        /// Only this tenant: its id, as the listing shows it, or a proxy key's name.
        #[arg(long)]
        tenant: Option<String>,
        /// The session to show.
        session: Option<String>,
    },
}

/// The process's environment variables that are valid Unicode (for the config overrides).
fn env_vars() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// The config file to read: `--config`, else `./config.toml` when present, else none.
fn config_path(cli: &Cli) -> Option<PathBuf> {
    cli.config.clone().or_else(|| {
        let local = PathBuf::from("config.toml");
        local.exists().then_some(local)
    })
}

fn load_config(cli: &Cli) -> anyhow::Result<ValidConfig> {
    // The file, then the CONTEXT_PROXY_<SECTION>__<KEY> environment overrides.
    let mut config = Config::load_with_env(config_path(cli).as_deref(), env_vars())?;
    if let Some(listen) = cli.listen {
        config.server.listen = listen;
    }
    if let Some(dir) = &cli.record {
        config.record.enabled = true;
        config.record.dir = dir.clone();
    }
    let mut config = config.validate()?;
    if let Some(url) = &cli.upstream {
        let mut edited = config.into_inner();
        let default = edited.upstreams.iter().position(|u| u.default).unwrap_or(0);
        edited.upstreams[default].base_url = url.clone();
        config = edited.validate()?;
    }
    Ok(config)
}

async fn serve(config: ValidConfig, demo: bool, cli_config: Option<PathBuf>) -> anyhow::Result<()> {
    let _log = context_proxy::telemetry::logging::init(&config.log);
    let store_outlives_process = config.store.backend != context_proxy::store::Backend::Memory;
    // In the demo the mock lives as long as the proxy serves.
    let (config, _mock) = if demo {
        let mock = MockUpstream::bind("127.0.0.1:0".parse()?, MockConfig::default()).await?;
        tracing::info!(upstream = %mock.base_url(), "demo: serving with the built-in mock upstream");
        let mut edited = config.into_inner();
        // One person's proxy: the demo's own key inspects its session, as the demo shows.
        edited.auth.inspect_by_client_key = true;
        for upstream in &mut edited.upstreams {
            upstream.base_url = mock.base_url();
            upstream.api_key_env = None;
        }
        (edited.validate()?, Some(mock))
    } else {
        (config, None)
    };
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let server = context_proxy::app::serve::bind(config).await?;
    let addr = server.local_addr();
    // Listen for signals before saying we listen: a Ctrl-C right after must not kill the
    // process outright.
    let signals = Signals::new().context("cannot listen for SIGINT and SIGTERM")?;
    print_listening("context-proxy", addr)?;
    // The demo's scripted session runs beside the server, which keeps serving after it.
    let shown = demo.then(|| {
        let inspect = inspect_command(cli_config, store_outlives_process);
        tokio::spawn(
            async move {
                if let Err(e) = context_proxy_drive::demo::run(addr, inspect.as_deref()).await {
                    tracing::error!(error = %e, "demo: the scripted session stopped");
                }
            }
            .instrument(tracing::info_span!("demo")),
        )
    });
    let (stop, stops) = tokio::sync::mpsc::unbounded_channel();
    let signals = tokio::spawn(
        forward_signals(
            signals,
            stop,
            std::io::stdin().is_terminal(),
            shown.as_ref().map(tokio::task::JoinHandle::abort_handle),
        )
        .instrument(tracing::info_span!("signals")),
    );
    server.serve_until(stops).await;
    signals.abort();
    if let Some(shown) = shown {
        shown.abort();
    }
    Ok(())
}

/// The command that prints the demo's session from the store (none for the `memory` store,
/// which ends with the process).
fn inspect_command(config: Option<PathBuf>, store_outlives_process: bool) -> Option<String> {
    let config = config.map_or(String::new(), |c| format!(" --config {}", c.display()));
    let session = context_proxy_drive::demo::SESSION;
    store_outlives_process.then(|| {
        format!(
            "cargo run --release --{config} inspect {session}    \
             (or: context-proxy{config} inspect {session})"
        )
    })
}

fn print_listening(what: &str, addr: SocketAddr) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{what} listening on http://{addr}")?;
    out.flush().context("cannot write to stdout")
}

/// Turns every SIGINT and SIGTERM into a [`Stop`] for the server, until the server is gone.
/// The first SIGINT from a terminal (`interactive`: stdin is one) skips the drain window:
/// nobody balances load over a proxy started by hand. Each further signal cuts the current
/// step of the shutdown short.
async fn forward_signals(
    mut signals: Signals,
    stop: tokio::sync::mpsc::UnboundedSender<Stop>,
    interactive: bool,
    demo: Option<tokio::task::AbortHandle>,
) {
    loop {
        let interrupt = signals.next().await;
        // The demo sends no more requests to a proxy that is stopping.
        if let Some(demo) = &demo {
            demo.abort();
        }
        let kind = if interrupt && interactive {
            Stop::Now
        } else {
            Stop::Drain
        };
        tracing::info!(
            signal = if interrupt { "SIGINT" } else { "SIGTERM" },
            "shutdown signal received"
        );
        if stop.send(kind).is_err() {
            return;
        }
    }
}

/// The process's SIGINT and SIGTERM.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal: true for SIGINT (Ctrl-C), false for SIGTERM.
    async fn next(&mut self) -> bool {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => true,
                _ = self.terminate.recv() => false,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            true
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => {
            let config = load_config(&cli)?;
            runtime(config.server.worker_threads)?.block_on(serve(
                config,
                cli.demo,
                cli.config.clone(),
            ))
        }
        Some(Command::MockUpstream(args)) => {
            Ok(runtime(0)?.block_on(context_proxy::mock::run(args))?)
        }
        Some(Command::Bench(args)) => {
            Ok(runtime(0)?.block_on(context_proxy_drive::bench::run(args))?)
        }
        // Claude Code sessions carry thinking signed as the mock upstream signs it.
        Some(Command::GenTraffic(args)) => Ok(context_proxy::traffic::run(
            args,
            &context_proxy::mock::rules::signed_thinking,
        )?),
        Some(Command::Replay(args)) => {
            Ok(runtime(0)?.block_on(context_proxy_drive::replay::run(*args))?)
        }
        Some(Command::Probe(args)) => {
            Ok(runtime(0)?.block_on(context_proxy_drive::fidelity::run(args))?)
        }
        Some(Command::Healthcheck(args)) => Ok(context_proxy::app::healthcheck::run(&args)?),
        Some(Command::CheckConfig { ref file }) => {
            let path = file.clone().or_else(|| config_path(&cli));
            let vars: Vec<(String, String)> = env_vars().collect();
            let (_, report) = context_proxy::app::check_config::check(path.as_deref(), &vars)?;
            print!("{report}");
            Ok(())
        }
        Some(Command::Inspect {
            ref tenant,
            ref session,
        }) => {
            let config = load_config(&cli)?;
            let out = runtime(1)?.block_on(context_proxy::app::inspect::run_cli(
                &config,
                tenant.as_deref(),
                session.as_deref(),
            ))?;
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
    }
}

/// The async runtime for `worker_threads` (`server.worker_threads`): 0 is one worker per core,
/// 1 the current-thread runtime, n a multi-thread runtime with n workers.
fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match worker_threads {
        0 => tokio::runtime::Builder::new_multi_thread(),
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
