//! `context-proxy bench`: overhead of the proxy against calling the mock upstream directly,
//! measured in one run so both sides see the same machine noise.
//!
//! It starts the mock upstream and the proxy as child processes of the current executable
//! (so the proxy's RSS is its own), then for each scenario (a small request, a ~60k-token
//! request) and each concurrency (1, 32) runs the same load against the mock directly and
//! through the proxy, interleaved, and prints p50/p99 latency, requests per second, the CPU
//! time each process spent per request and the proxy's resident memory.
//!
//! All three processes share the machine's cores, so at high concurrency throughput is bound
//! by the CPU time of one request summed over the processes it crosses: the proxied path pays
//! for the proxy on top of the load generator and the mock. The CPU table says how much of the
//! direct throughput that leaves ("CPU-bound ratio").

mod cpu;
mod hostile;
mod load;

use std::net::SocketAddr;
use std::time::Duration;

use context_proxy_tokens::Encoding;
use serde_json::{json, Value};
use tracing::Instrument;

use crate::children::{spawn_proxy, spawn_self, ChildGuard};
use cpu::{CpuPerRequest, Processes};
use load::{run_load, LoadResult};

/// Options of the `bench` subcommand.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Multiplies the number of requests of every run (1.0 ≈ 1 minute on 2 cores).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Concurrency levels to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 32])]
    pub concurrency: Vec<usize>,
    /// Rounds per measurement: direct and proxied alternate, and the median round is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Config file for the proxy (default: none, so every setting has its default).
    #[arg(long, value_name = "FILE", default_value = "/dev/null")]
    pub proxy_config: std::path::PathBuf,
    /// Scenarios to run.
    #[arg(long, value_delimiter = ',', default_values_t = [Scenario::Small, Scenario::Large])]
    pub scenarios: Vec<Scenario>,
    /// The proxy binary to measure (default: this one), e.g. an older build to compare with.
    #[arg(long, value_name = "FILE")]
    pub proxy_exe: Option<std::path::PathBuf>,
    /// Instead of the scenarios: open this many silent TCP connections (and variants: part of
    /// the HTTP/2 preface, the h2c preface and no stream), then time a chat request and
    /// `/healthz` on new connections.
    #[arg(long, value_name = "N")]
    pub silent_sockets: Option<usize>,
    /// Instead of the scenarios: hold this many streaming chat requests open at once and read
    /// the proxy's peak memory.
    #[arg(long, value_name = "N")]
    pub streams: Option<usize>,
    /// With `--streams`: the mock's delay between two SSE events.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub stream_interval_ms: u64,
}

/// One request shape the benchmark sends.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// A short chat request (two messages).
    Small,
    /// A ~60k-token tool-using conversation.
    #[value(name = "60k")]
    Large,
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scenario::Small => "small",
            Scenario::Large => "60k",
        })
    }
}

/// The proxy and the mock under test, started as children of this process.
struct Target {
    mock: ChildGuard,
    mock_addr: SocketAddr,
    proxy: ChildGuard,
    proxy_addr: SocketAddr,
}

/// Starts the mock upstream (with `mock_args`) and the proxy in front of it (`proxy_exe`, or
/// this executable, with the config file `proxy_config`).
async fn start(
    proxy_exe: Option<&std::path::Path>,
    mock_args: &[&str],
    proxy_config: &str,
) -> std::io::Result<Target> {
    let mut args = vec!["mock-upstream", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(mock_args);
    let (mock, mock_addr) = spawn_self(&args)?;
    let upstream = format!("http://{mock_addr}/v1");
    let (proxy, proxy_addr) = spawn_proxy(
        proxy_exe,
        &[
            "--config",
            proxy_config,
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &upstream,
        ],
    )?;
    Ok(Target {
        mock,
        mock_addr,
        proxy,
        proxy_addr,
    })
}

/// Resident set size and its peak of process `pid`, in MiB (Linux /proc).
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A small chat request, as a typical short agent turn.
fn small_request() -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France? Answer in one word."}
        ]
    })
}

/// A request of about `tokens` tokens: a long tool-using conversation.
fn large_request(tokens: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    let mut count = 0;
    let mut i = 0;
    while count < tokens {
        let text = format!(
            "fn handler_{i}(request: &Request) -> Result<Response, Error> {{\n    let body = parse(&request.body)?; // step {i}\n    validate(&body).map_err(|e| Error::invalid(e, {i}))?;\n    Ok(Response::json(&body))\n}}\n"
        )
        .repeat(20);
        count += Encoding::O200kBase.count(&text);
        let id = format!("call_{i:06}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/h{i}.rs\"}}")}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
        i += 1;
    }
    messages.push(json!({"role": "user", "content": "Summarize the handlers."}));
    json!({"model": "gpt-4o", "messages": messages})
}

/// One measured run: latency and throughput, and what each process spent on the CPU.
#[derive(Debug, Clone, Copy)]
struct Round {
    load: LoadResult,
    cpu: CpuPerRequest,
}

impl Round {
    /// The round with the median p50 (rounds alternate between targets, so the median round
    /// is the least disturbed by a passing burst of noise).
    fn median(mut rounds: Vec<Round>) -> Round {
        rounds.sort_by(|a, b| a.load.p50_ms.total_cmp(&b.load.p50_ms));
        rounds[rounds.len() / 2]
    }
}

/// How often the mock is told to forget the requests it recorded while a run goes on.
const MOCK_RESET_INTERVAL: Duration = Duration::from_millis(50);

/// What every measured run uses: the processes to account, the load generator's client, and
/// the mock (to keep its request log short).
struct Bench {
    processes: Processes,
    client: reqwest::Client,
    mock: SocketAddr,
}

impl Bench {
    /// Runs one load and takes the CPU time of every process around it, keeping the mock's
    /// request log short meanwhile.
    async fn measure(
        &self,
        url: &str,
        body: &[u8],
        concurrency: usize,
        requests: usize,
    ) -> std::io::Result<Round> {
        let janitor = tokio::spawn(
            keep_mock_log_short(self.client.clone(), self.mock)
                .instrument(tracing::info_span!("mock_reset")),
        );
        let before = self.processes.snapshot();
        let load = run_load(&self.client, url, body, concurrency, requests).await;
        janitor.abort();
        settle(self.processes.proxy).await;
        let cpu = before.per_request(&self.processes.snapshot(), requests);
        Ok(Round { load: load?, cpu })
    }
}

/// How long the proxy must stay (almost) off the CPU for a run's work to count as done.
const SETTLE_WINDOW: Duration = Duration::from_millis(300);

/// Waits until the proxy has done the work a run left behind, so that its CPU time counts
/// it: with `[ui]` on, the page's journal lines are written up to `journal_flush_ms` (200 ms)
/// after their request. Done when the proxy spent under 2 ms on the CPU during a whole
/// [`SETTLE_WINDOW`] (longer than that interval); at most 5 s.
async fn settle(pid: u32) {
    let mut last = cpu::cpu_time(pid);
    for _ in 0..(5_000 / SETTLE_WINDOW.as_millis()) {
        tokio::time::sleep(SETTLE_WINDOW).await;
        let now = cpu::cpu_time(pid);
        match (last, now) {
            (Some(a), Some(b)) if b.saturating_sub(a) < Duration::from_millis(2) => return,
            (None, _) | (_, None) => return,
            _ => last = now,
        }
    }
}

/// Tells the mock to forget its recorded requests every [`MOCK_RESET_INTERVAL`] until aborted.
///
/// The mock keeps every request it receives, headers and body (for `GET /_mock/received`):
/// left alone, its memory grows by ~5 KB per small request and ~300 KB per 60k request, and
/// the page faults of that growth, not the serving, become a large and erratic part of its
/// CPU time (up to half of it in the direct small runs). Forgetting every 50 ms bounds the
/// log to a few MB at a cost of one control request per ~1000 measured ones.
async fn keep_mock_log_short(client: reqwest::Client, mock: SocketAddr) {
    let mut tick = tokio::time::interval(MOCK_RESET_INTERVAL);
    loop {
        tick.tick().await;
        if let Err(e) = reset_mock(&client, mock).await {
            tracing::warn!(error = %e, "cannot reset the mock's request log");
        }
    }
}

/// `POST /_mock/reset`: the mock forgets its recorded requests (and queued replies, of which
/// the benchmark has none).
async fn reset_mock(client: &reqwest::Client, mock: SocketAddr) -> std::io::Result<()> {
    let resp = client
        .post(format!("http://{mock}/_mock/reset"))
        .send()
        .await
        .map_err(std::io::Error::other)?;
    if !resp.status().is_success() {
        return Err(std::io::Error::other(format!(
            "POST /_mock/reset answered {}",
            resp.status()
        )));
    }
    Ok(())
}

struct Row {
    scenario: &'static str,
    concurrency: usize,
    direct: Round,
    proxied: Round,
}

/// Runs the benchmark and prints the table.
pub async fn run(args: BenchArgs) -> std::io::Result<()> {
    let proxy_config = args.proxy_config.to_string_lossy();
    let proxy_exe = args.proxy_exe.as_deref();
    if let Some(n) = args.silent_sockets {
        return hostile::silent_sockets(n, proxy_exe, &proxy_config).await;
    }
    if let Some(n) = args.streams {
        return hostile::streams(n, args.stream_interval_ms, proxy_exe, &proxy_config).await;
    }
    let Target {
        mock,
        mock_addr,
        proxy,
        proxy_addr,
    } = start(proxy_exe, &[], &proxy_config).await?;
    let pid = proxy.id();
    // Before any request: the process, its runtime and its clients, no tokenizer tables yet.
    let (start_rss, _) = rss_mib(pid);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(std::io::Error::other)?;
    let bench = Bench {
        processes: Processes {
            bench: std::process::id(),
            mock: mock.id(),
            proxy: pid,
        },
        client: client.clone(),
        mock: mock_addr,
    };
    // Let the proxy settle (the first chat request loads the BPE tables), then take its idle
    // memory.
    let warm = serde_json::to_vec(&small_request()).map_err(std::io::Error::other)?;
    run_load(
        &client,
        &format!("http://{proxy_addr}/v1/chat/completions"),
        &warm,
        1,
        50,
    )
    .await?;
    let (idle_rss, _) = rss_mib(pid);

    let mut scenarios: Vec<(&'static str, Value, usize)> = Vec::new();
    let mut large_tokens = None;
    if args.scenarios.contains(&Scenario::Small) {
        scenarios.push(("small", small_request(), 4000));
    }
    if args.scenarios.contains(&Scenario::Large) {
        let large = large_request(60_000);
        large_tokens = Some(Encoding::O200kBase.count(&large.to_string()));
        scenarios.push(("60k tokens", large, 300));
    }
    let mut rows = Vec::new();
    for (name, body, base_requests) in &scenarios {
        let body = serde_json::to_vec(body).map_err(std::io::Error::other)?;
        for &concurrency in &args.concurrency {
            let requests = ((*base_requests as f64)
                * args.scale
                * if concurrency > 1 { 2.0 } else { 1.0 }) as usize;
            let requests = requests.max(concurrency * 4);
            let direct_url = format!("http://{mock_addr}/v1/chat/completions");
            let proxy_url = format!("http://{proxy_addr}/v1/chat/completions");
            // Warm both paths (connection pools, allocator), then alternate rounds.
            run_load(&client, &direct_url, &body, concurrency, concurrency * 4).await?;
            run_load(&client, &proxy_url, &body, concurrency, concurrency * 4).await?;
            reset_mock(&client, mock_addr).await?;
            let mut direct_rounds = Vec::new();
            let mut proxied_rounds = Vec::new();
            for _ in 0..args.rounds.max(1) {
                let direct = bench.measure(&direct_url, &body, concurrency, requests);
                direct_rounds.push(direct.await?);
                let proxied = bench.measure(&proxy_url, &body, concurrency, requests);
                proxied_rounds.push(proxied.await?);
            }
            rows.push(Row {
                scenario: name,
                concurrency,
                direct: Round::median(direct_rounds),
                proxied: Round::median(proxied_rounds),
            });
        }
    }
    let (rss, peak) = rss_mib(pid);
    print_report(&rows, [start_rss, idle_rss, rss, peak], large_tokens);
    Ok(())
}

/// `rss`: at start, idle after the first requests, after the runs, peak (MiB).
fn print_report(rows: &[Row], rss: [f64; 4], large_tokens: Option<usize>) {
    let [start_rss, idle_rss, after_rss, peak] = rss;
    println!("context-proxy bench: direct to the mock upstream vs through the proxy (non-streaming chat completions)");
    if let Some(tokens) = large_tokens {
        println!("the 60k scenario's body is {tokens} o200k tokens");
    }
    println!();
    println!(
        "| scenario | conc | direct p50 ms | direct p99 ms | direct req/s | proxy p50 ms | proxy p99 ms | proxy req/s | added p50 ms | added p99 ms | throughput |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (d, p) = (&r.direct.load, &r.proxied.load);
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.0} | {:+.3} | {:+.3} | {:.0}% |",
            r.scenario,
            r.concurrency,
            d.p50_ms,
            d.p99_ms,
            d.rps,
            p.p50_ms,
            p.p99_ms,
            p.rps,
            p.p50_ms - d.p50_ms,
            p.p99_ms - d.p99_ms,
            100.0 * p.rps / d.rps,
        );
    }
    println!();
    println!("CPU time per request, µs (all threads, user + kernel):");
    println!();
    println!(
        "| scenario | conc | direct: bench | mock | total | proxied: bench | mock | proxy | total | CPU-bound ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (d, p) = (&r.direct.cpu, &r.proxied.cpu);
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% |",
            r.scenario,
            r.concurrency,
            d.bench_us,
            d.mock_us,
            d.bench_us + d.mock_us,
            p.bench_us,
            p.mock_us,
            p.proxy_us,
            p.total_us(),
            100.0 * (d.bench_us + d.mock_us) / p.total_us(),
        );
    }
    println!();
    println!(
        "proxy RSS: at start {start_rss:.1} MiB, idle after the first requests {idle_rss:.1} MiB (BPE tables load on the first counted request), after the runs {after_rss:.1} MiB, peak {peak:.1} MiB"
    );
}
