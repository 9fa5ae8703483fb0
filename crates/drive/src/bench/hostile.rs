//! `bench --silent-sockets N` and `bench --streams N`: issue 12's targets, measured against the
//! proxy as a child process in front of the mock upstream.
//!
//! - Silent sockets: N TCP connections that send nothing (or part of the HTTP/2 preface, or the
//!   whole h2c preface and no stream) are opened and accepted, then a normal
//!   `/v1/chat/completions` request and a `GET /healthz`, each on a new connection, are timed.
//! - Streams: N streaming chat requests are held open at once (the mock paces its events), every
//!   one must end with `data: [DONE]`; the proxy's peak memory (`VmHWM`) is read after them.
//!
//! Both need more file descriptors than the usual soft limit of 1 024: the soft limit of this
//! process is raised to its hard limit first (`prlimit`), and the children inherit it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{rss_mib, small_request, start};

/// Raises this process's soft limit on open files to its hard limit; returns the new limit.
fn raise_fd_limit() -> std::io::Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let hard = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|h| h.parse::<u64>().ok())
        .ok_or_else(|| std::io::Error::other("no hard limit on open files in /proc/self/limits"))?;
    let status = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={hard}:{hard}"),
        ])
        .status()?;
    if !status.success() {
        return Err(std::io::Error::other("prlimit failed"));
    }
    Ok(hard)
}

/// Opens `n` connections to `addr` that send `opening` and nothing else, quickly: from 64
/// tasks at once, spread over source addresses 127.0.0.2–127.0.0.65 so that no address runs
/// short of ephemeral ports (one address's range fills up and connects slow down).
async fn open_silent(
    addr: SocketAddr,
    n: usize,
    opening: &'static [u8],
) -> std::io::Result<Vec<TcpStream>> {
    const TASKS: usize = 64;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let count = n / TASKS + usize::from(t < n % TASKS);
        tasks.spawn(async move {
            let source = SocketAddr::from(([127, 0, 0, 2 + t as u8], 0));
            let mut sockets = Vec::with_capacity(count);
            for _ in 0..count {
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(source)?;
                let mut s = socket.connect(addr).await?;
                if !opening.is_empty() {
                    s.write_all(opening).await?;
                }
                sockets.push(s);
            }
            Ok::<_, std::io::Error>(sockets)
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.map_err(std::io::Error::other)??);
    }
    Ok(all)
}

/// Open file descriptors of process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A client that opens a new connection for every request.
fn fresh_client() -> std::io::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(std::io::Error::other)
}

/// Times one chat request and one `/healthz`, each on a new connection; `None` when either
/// failed or took over `limit`.
async fn time_requests(
    addr: SocketAddr,
    limit: Duration,
) -> std::io::Result<(Option<Duration>, Option<Duration>)> {
    let client = fresh_client()?;
    let body = serde_json::to_vec(&small_request()).map_err(std::io::Error::other)?;
    let timed = |request: reqwest::RequestBuilder| async move {
        let started = Instant::now();
        match tokio::time::timeout(limit, async {
            let resp = request.send().await.ok()?;
            let ok = resp.status().is_success();
            resp.bytes().await.ok()?;
            ok.then_some(())
        })
        .await
        {
            Ok(Some(())) => Some(started.elapsed()),
            _ => None,
        }
    };
    let chat = timed(
        client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body),
    )
    .await;
    let health = timed(client.get(format!("http://{addr}/healthz"))).await;
    Ok((chat, health))
}

fn show(d: Option<Duration>, limit: Duration) -> String {
    d.map_or_else(
        || format!("> {} s (failed)", limit.as_secs()),
        |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
    )
}

/// `bench --silent-sockets N`.
pub async fn silent_sockets(
    n: usize,
    proxy_exe: Option<&std::path::Path>,
    proxy_config: &str,
) -> std::io::Result<()> {
    let limit = raise_fd_limit()?;
    println!("open files limit raised to {limit}; {n} silent sockets per opening");
    let target = start(proxy_exe, &[], proxy_config).await?;
    let addr = target.proxy_addr;
    let pid = target.proxy.id();
    let wait = Duration::from_secs(20);
    // Warm: the first counted request loads the BPE tables.
    let (chat, health) = time_requests(addr, wait).await?;
    println!("| opening | sockets opened | accepted by the proxy | chat request | /healthz |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| (none: warm-up) | 0 | 0 | {} | {} |",
        show(chat, wait),
        show(health, wait)
    );
    let h2c_preface: &'static [u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let openings: [(&str, &'static [u8]); 3] = [
        ("nothing", b""),
        ("part of the HTTP/2 preface", &h2c_preface[..10]),
        ("the h2c preface, no stream", h2c_preface),
    ];
    for (what, opening) in openings {
        let base_fds = open_fds(pid);
        let opened_at = Instant::now();
        let sockets = open_silent(addr, n, opening).await?;
        let open_time = opened_at.elapsed();
        // Until the proxy has accepted them all (or the limit closed some to make room).
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_fds(pid) < base_fds + n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let accepted = open_fds(pid).saturating_sub(base_fds);
        let mut chats = Vec::new();
        let mut healths = Vec::new();
        for _ in 0..5 {
            let (chat, health) = time_requests(addr, wait).await?;
            chats.push(chat);
            healths.push(health);
        }
        let median = |mut v: Vec<Option<Duration>>| {
            v.sort_by_key(|d| d.unwrap_or(Duration::MAX));
            v[v.len() / 2]
        };
        println!(
            "| {what} | {n} in {:.1} s | {accepted} | {} | {} |",
            open_time.as_secs_f64(),
            show(median(chats), wait),
            show(median(healths), wait)
        );
        drop(sockets);
        // Let the proxy see them closed before the next opening.
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_fds(pid) > base_fds + 16 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!("(chat request and /healthz: median of 5, each on a new connection, after the sockets are open)");
    Ok(())
}

/// `bench --streams N`.
pub async fn streams(
    n: usize,
    interval_ms: u64,
    proxy_exe: Option<&std::path::Path>,
    proxy_config: &str,
) -> std::io::Result<()> {
    let limit = raise_fd_limit()?;
    let interval = interval_ms.to_string();
    let target = start(proxy_exe, &["--chunk-interval-ms", &interval], proxy_config).await?;
    let addr = target.proxy_addr;
    let pid = target.proxy.id();
    let url = format!("http://{addr}/v1/chat/completions");
    let mut body = small_request();
    body["stream"] = serde_json::Value::Bool(true);
    let body = bytes::Bytes::from(serde_json::to_vec(&body).map_err(std::io::Error::other)?);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .map_err(std::io::Error::other)?;
    // Warm: the BPE tables.
    let one = |client: reqwest::Client, url: String, body: bytes::Bytes| async move {
        let sent = Instant::now();
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(std::io::Error::other)?;
        let ok = resp.status().is_success();
        let text = resp.bytes().await.map_err(std::io::Error::other)?;
        let complete = ok && text.ends_with(b"data: [DONE]\n\n");
        Ok::<_, std::io::Error>((sent, sent.elapsed(), complete))
    };
    one(client.clone(), url.clone(), body.clone()).await?;
    let (_, warm_hwm) = rss_mib(pid);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(one(client.clone(), url.clone(), body.clone()));
    }
    let mut spans = Vec::with_capacity(n);
    let mut complete = 0;
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(std::io::Error::other)? {
            Ok((sent, total, ok)) => {
                complete += usize::from(ok);
                let from = sent.duration_since(started);
                spans.push((from, from + total));
            }
            Err(_) => failed += 1,
        }
    }
    let elapsed = started.elapsed();
    // Most streams open at one time.
    let mut edges: Vec<(Duration, i64)> =
        spans.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    edges.sort();
    let (mut open, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        open += step;
        most = most.max(open);
    }
    let (rss, hwm) = rss_mib(pid);
    println!("open files limit {limit}; mock paces events every {interval_ms} ms");
    println!("| streams | complete (ended with [DONE]) | failed | most open at once | wall time | proxy RSS after warm-up (peak) | proxy peak RSS (VmHWM) | proxy RSS after |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {n} | {complete} | {failed} | {most} | {:.2} s | {warm_hwm:.1} MiB | {hwm:.1} MiB | {rss:.1} MiB |",
        elapsed.as_secs_f64()
    );
    if complete != n {
        return Err(std::io::Error::other(format!(
            "{} of {n} streams did not complete",
            n - complete
        )));
    }
    Ok(())
}
