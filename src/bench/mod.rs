//! `context-proxy bench`: overhead of the proxy against calling the mock upstream directly,
//! measured in one run so both sides see the same machine noise.
//!
//! It starts the mock upstream and the proxy as child processes of the current executable
//! (so the proxy's RSS is its own), then for each scenario (a small request, a ~60k-token
//! request) and each concurrency (1, 32) runs the same load against the mock directly and
//! through the proxy, interleaved, and prints p50/p99 latency, requests per second and the
//! proxy's resident memory.

mod load;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use crate::tokens::Encoding;
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
}

/// A child process that is killed when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` on the current executable and reads the `… listening on http://ADDR` line.
fn spawn_self(args: &[&str]) -> std::io::Result<(ChildGuard, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected first line {line:?}")))?;
    Ok((guard, addr))
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

struct Row {
    scenario: &'static str,
    concurrency: usize,
    direct: LoadResult,
    proxied: LoadResult,
}

/// Runs the benchmark and prints the table.
pub async fn run(args: BenchArgs) -> std::io::Result<()> {
    let (_mock, mock_addr) = spawn_self(&["mock-upstream", "--listen", "127.0.0.1:0"])?;
    let upstream = format!("http://{mock_addr}/v1");
    let (proxy, proxy_addr) = spawn_self(&[
        "--config",
        "/dev/null",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
    ])?;
    let pid = proxy.0.id();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .map_err(std::io::Error::other)?;
    // Let the proxy settle, then take its idle memory.
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

    let large = large_request(60_000);
    let large_tokens = Encoding::O200kBase.count(&large.to_string());
    let scenarios: [(&'static str, Value, usize); 2] =
        [("small", small_request(), 4000), ("60k tokens", large, 300)];
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
            let mut direct_rounds = Vec::new();
            let mut proxied_rounds = Vec::new();
            for _ in 0..args.rounds.max(1) {
                direct_rounds
                    .push(run_load(&client, &direct_url, &body, concurrency, requests).await?);
                proxied_rounds
                    .push(run_load(&client, &proxy_url, &body, concurrency, requests).await?);
            }
            rows.push(Row {
                scenario: name,
                concurrency,
                direct: LoadResult::median_round(direct_rounds),
                proxied: LoadResult::median_round(proxied_rounds),
            });
        }
    }
    let (rss, peak) = rss_mib(pid);
    print_report(&rows, idle_rss, rss, peak, large_tokens);
    Ok(())
}

fn print_report(rows: &[Row], idle_rss: f64, rss: f64, peak: f64, large_tokens: usize) {
    println!("context-proxy bench: direct to the mock upstream vs through the proxy (non-streaming chat completions)");
    println!("the 60k scenario's body is {large_tokens} o200k tokens");
    println!();
    println!(
        "| scenario | conc | direct p50 ms | direct p99 ms | direct req/s | proxy p50 ms | proxy p99 ms | proxy req/s | added p50 ms | added p99 ms | throughput |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.0} | {:+.3} | {:+.3} | {:.0}% |",
            r.scenario,
            r.concurrency,
            r.direct.p50_ms,
            r.direct.p99_ms,
            r.direct.rps,
            r.proxied.p50_ms,
            r.proxied.p99_ms,
            r.proxied.rps,
            r.proxied.p50_ms - r.direct.p50_ms,
            r.proxied.p99_ms - r.direct.p99_ms,
            100.0 * r.proxied.rps / r.direct.rps,
        );
    }
    println!();
    println!("proxy RSS: idle {idle_rss:.1} MiB, after the runs {rss:.1} MiB, peak {peak:.1} MiB");
}
