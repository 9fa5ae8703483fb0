//! The load generator: `concurrency` workers share one pooled client and send `requests`
//! POSTs in total, each timed from send to the last byte of the response.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Latency percentiles and throughput of one run.
#[derive(Debug, Clone, Copy)]
pub struct LoadResult {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rps: f64,
}

/// Sends `requests` POSTs of `body` to `url` from `concurrency` workers.
pub async fn run_load(
    client: &reqwest::Client,
    url: &str,
    body: &[u8],
    concurrency: usize,
    requests: usize,
) -> std::io::Result<LoadResult> {
    let body = Bytes::copy_from_slice(body);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, body, next) =
            (client.clone(), url.to_string(), body.clone(), next.clone());
        workers.spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let t = Instant::now();
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-bench")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(std::io::Error::other)?;
                let status = resp.status();
                resp.bytes().await.map_err(std::io::Error::other)?;
                if !status.is_success() {
                    return Err(std::io::Error::other(format!("{url} answered {status}")));
                }
                latencies.push(t.elapsed());
            }
            Ok::<_, std::io::Error>(latencies)
        });
    }
    let mut all: Vec<Duration> = Vec::with_capacity(requests);
    while let Some(joined) = workers.join_next().await {
        all.extend(joined.map_err(std::io::Error::other)??);
    }
    let elapsed = started.elapsed();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    Ok(LoadResult {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        rps: all.len() as f64 / elapsed.as_secs_f64(),
    })
}
