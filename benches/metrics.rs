//! What recording the metrics of one request costs, on one thread and on two contending ones:
//! the router's part (in-flight gauge, request counter and histogram) and the chat record
//! phase's (four histograms, per-model counters, actions), as the proxy calls them.
//!
//! `cargo bench --bench metrics`: medians of 9 runs of 200 000 requests each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use context_proxy::telemetry::metrics::{route_of, ChatSample, Metrics, UpstreamName};
use context_proxy::wire::Usage;

fn one_request(m: &Metrics, upstream: &UpstreamName, usage: &Usage, model: &str) {
    let in_flight = m.in_flight();
    m.chat_response_started();
    drop(in_flight);
    m.record_request(
        route_of("/v1/chat/completions"),
        http::StatusCode::OK,
        Some(upstream),
        Duration::from_micros(900),
    );
    m.record_chat(&ChatSample {
        route: "chat",
        model: Some(model),
        upstream: &upstream.0,
        tokens_before: 1200,
        tokens_after: 800,
        kept_prefix_tokens: 0,
        truncated: 0,
        compacted: 2,
        offloaded: 0,
        reloaded: 0,
        repeated: false,
        upstream_calls: 1,
        usage: Some(usage),
        store_error: None,
        proxy: Some(Duration::from_micros(120)),
        upstream_wait: Some(Duration::from_micros(700)),
        first_byte: Some(Duration::from_micros(850)),
        total: Some(Duration::from_micros(1000)),
    });
}

fn run(threads: usize, requests: usize) -> f64 {
    let m = Arc::new(Metrics::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let m = m.clone();
            s.spawn(move || {
                let upstream = UpstreamName("openai".into());
                let usage = Usage {
                    prompt_tokens: 800,
                    completion_tokens: 20,
                    total_tokens: 820,
                    cached_tokens: Some(512),
                    cache_creation_tokens: None,
                    raw: serde_json::Map::new(),
                };
                let models = ["gpt-4o", "gpt-4o-mini", "o3"];
                for i in 0..requests / threads {
                    one_request(&m, &upstream, &usage, models[(i + t) % 3]);
                }
            });
        }
    });
    started.elapsed().as_secs_f64() * 1e9 / requests as f64
}

fn main() {
    let requests = 200_000;
    for threads in [1, 2] {
        let mut ns: Vec<f64> = (0..9).map(|_| run(threads, requests)).collect();
        ns.sort_by(f64::total_cmp);
        println!(
            "threads {threads}: {:.0} ns per request (median of 9; min {:.0}, max {:.0})",
            ns[4], ns[0], ns[8]
        );
    }
}
