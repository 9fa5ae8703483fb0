//! Store figures for BENCHMARKS.md ("Redis store").
//!
//! 1. Round trip: `put_content` of a 10 KB text then `get_content` of it, one at a time, on the
//!    chosen backend (`redis`, `fs` or `memory`), through the store as the proxy opens it:
//!    p50/p99 of the put, the get and the pair.
//! 2. Redis only: memory per stored session. The real proxy (in this process, in front of the
//!    in-process mock upstream, store on Redis) replays the first sessions of the sample traffic
//!    (`gen-traffic`, seed 42), every request in order; `INFO memory`'s `used_memory` before
//!    and after (the round trips' keys deleted first), over the number of sessions. The keys
//!    are deleted afterwards.
//!
//! Run: `cargo run --release --example store_roundtrip -- redis [SESSIONS]`, with `REDIS_URL`
//! (default `redis://127.0.0.1:6379`). Keys go under the prefix `bench-<pid>`.

use std::error::Error;
use std::time::{Duration, Instant};

use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, MockUpstream};
use context_proxy::store::{Backend, ContentKind, SessionId, Store, StoreConfig, Tenant};
use context_proxy::traffic::{generate_session, TrafficConfig};
use context_proxy::upstream::UpstreamConfig;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const WARM_UP: usize = 200;
const ROUND_TRIPS: usize = 5_000;
const CONTENT_BYTES: usize = 10 * 1024;
const DEFAULT_SESSIONS: usize = 12;

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let backend = args.next().unwrap_or_else(|| "redis".into());
    let sessions: usize = match args.next() {
        Some(n) => n.parse()?,
        None => DEFAULT_SESSIONS,
    };
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let dir = tempfile_dir()?;
    let cfg = StoreConfig {
        backend: match backend.as_str() {
            "redis" => Backend::Redis,
            "fs" => Backend::Fs,
            "memory" => Backend::Memory,
            other => return Err(format!("unknown backend {other:?}: redis, fs or memory").into()),
        },
        path: dir.clone(),
        redis_url,
        redis_key_prefix: format!("bench-{}", std::process::id()),
        ..StoreConfig::default()
    };
    let store = context_proxy::store::open(&cfg).await?;
    store.ping().await?;
    round_trips(&*store, &backend).await?;
    store.close().await;
    delete_keys_if_redis(&cfg).await?;
    if cfg.backend == Backend::Redis {
        let cfg = StoreConfig {
            redis_key_prefix: format!("{}-sessions", cfg.redis_key_prefix),
            ..cfg
        };
        let measured = memory_per_session(&cfg, sessions).await;
        delete_keys_if_redis(&cfg).await?;
        measured?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn round_trips(store: &dyn Store, backend: &str) -> Result<()> {
    let tenant = Tenant::from_api_key(Some("sk-bench"));
    let session = SessionId::parse("bench")?;
    let filler = "let value = compute(request.body, 42); // 日本語 ✓\n".repeat(CONTENT_BYTES / 50);
    let (mut puts, mut gets, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..WARM_UP + ROUND_TRIPS {
        // Distinct content each time, so every put is a first write.
        let mut content = format!("{i:08}\n{filler}");
        content.truncate(CONTENT_BYTES);
        let started = Instant::now();
        let r = store
            .put_content(&tenant, &session, ContentKind::ToolResult, &content)
            .await?;
        let put = started.elapsed();
        let back = store.get_content(&tenant, &r).await?;
        let pair = started.elapsed();
        if back.as_deref() != Some(content.as_str()) {
            return Err(format!("round trip {i} did not give the content back").into());
        }
        if i >= WARM_UP {
            puts.push(put);
            gets.push(pair - put);
            pairs.push(pair);
        }
    }
    println!(
        "Store round trip, {backend}: {ROUND_TRIPS} × (put_content of {CONTENT_BYTES} bytes, then get_content), one at a time, after {WARM_UP} warm-up pairs\n"
    );
    println!("| call | p50 | p99 | max |\n|---|---:|---:|---:|");
    for (name, samples) in [("put", puts), ("get", gets), ("put + get", pairs)] {
        let (p50, p99, max) = percentiles(samples);
        println!("| {name} | {} | {} | {} |", us(p50), us(p99), us(max));
    }
    println!();
    Ok(())
}

async fn memory_per_session(cfg: &StoreConfig, sessions: usize) -> Result<()> {
    let client = redis::Client::open(cfg.redis_url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse()?;
    config.store = cfg.clone();
    config.upstreams = vec![UpstreamConfig {
        base_url: mock.base_url(),
        default: true,
        ..UpstreamConfig::default()
    }];
    let proxy = RunningServer::start(config.validate()?).await?;
    let http = reqwest::Client::new();
    let before = used_memory(&mut redis).await?;
    let traffic = TrafficConfig::default();
    let (mut requests, mut sent_bytes, started) = (0, 0, Instant::now());
    for index in 0..sessions {
        let session = generate_session(&traffic, index);
        for k in 0..session.request_count() {
            let body = session.request_body(k);
            sent_bytes += body.len();
            let resp = http
                .post(format!("http://{}/v1/chat/completions", proxy.addr()))
                .header("authorization", "Bearer sk-bench-traffic")
                .header("x-context-session", format!("s{}", session.id))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await?;
            if !resp.status().is_success() {
                return Err(format!("{} request {k}: {}", session.id, resp.status()).into());
            }
            resp.bytes().await?;
            requests += 1;
            mock.reset();
        }
    }
    let elapsed = started.elapsed();
    proxy.shutdown().await;
    let after = used_memory(&mut redis).await?;
    let keys = count_keys(&mut redis, &cfg.redis_key_prefix).await?;
    let added = after.saturating_sub(before);
    println!(
        "Redis memory per stored session: the proxy (default [context], store on Redis) replayed sessions 0..{sessions} of the sample traffic (seed 42): {requests} requests, {:.1} MB sent, in {:.1} s\n",
        sent_bytes as f64 / 1e6,
        elapsed.as_secs_f64()
    );
    println!("| what | value |\n|---|---:|");
    println!("| used_memory before | {} |", mib(before));
    println!("| used_memory after | {} |", mib(after));
    println!(
        "| keys stored | {keys} ({:.0} per session) |",
        keys as f64 / sessions.max(1) as f64
    );
    println!(
        "| added per session | {} |",
        mib(added / sessions.max(1) as u64)
    );
    println!();
    Ok(())
}

async fn used_memory(redis: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

async fn count_keys(redis: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Result<usize> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(redis)
        .await?;
    Ok(keys.len())
}

async fn delete_keys_if_redis(cfg: &StoreConfig) -> Result<()> {
    if cfg.backend != Backend::Redis {
        return Ok(());
    }
    let prefix = &cfg.redis_key_prefix;
    let client = redis::Client::open(cfg.redis_url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut redis)
        .await?;
    for chunk in keys.chunks(500) {
        redis::cmd("DEL")
            .arg(chunk)
            .query_async::<()>(&mut redis)
            .await?;
    }
    Ok(())
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).copied().unwrap_or_default()
    };
    (at(0.5), at(0.99), at(1.0))
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A fresh directory for the fs backend.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("store-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
