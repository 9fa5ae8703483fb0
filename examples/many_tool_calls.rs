//! Issue 12's target "50k tool calls are handled in under 100 ms" (BENCHMARKS.md, "Many tool
//! calls in one message").
//!
//! A body of one user turn, one assistant message with 50 000 tool calls and their 50 000
//! results, then a question (about 5 MB), through the request path's work as the chat route
//! does it: the JSON measured from its bytes (`check_json_shape`), parsed
//! (`ChatRequest::parse`), then identify → plan → apply (`ContextManager::manage`: counting,
//! the engine, store writes, the new body serialized), in auto mode with the default
//! `[context]` settings and the memory store; and in mode off (`ChatRequest::peek` only).
//!
//! Run: `cargo run --release --example many_tool_calls [CALLS]`. Medians of `RUNS` runs; "cold"
//! builds a new manager each run (empty count cache), "warm" reuses one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use context_proxy::context::{ContextConfig, ContextManager, Mode};
use context_proxy::http::request_body::check_json_shape;
use context_proxy::routes::chat::ChatRequest;
use context_proxy::server::ServerConfig;
use context_proxy::store::{Backend, Store, StoreConfig};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use serde_json::json;

const RUNS: usize = 9;

fn body(calls: usize) -> Bytes {
    let tool_calls: Vec<_> = (0..calls)
        .map(|i| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": "stat", "arguments": "{}"}}))
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Stat every file."}),
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
    ];
    for i in 0..calls {
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "ok"}));
    }
    messages.push(json!({"role": "user", "content": "Which failed?"}));
    Bytes::from(json!({"model": "gpt-4o", "messages": messages}).to_string())
}

async fn manager() -> ContextManager {
    let store: Arc<dyn Store> = context_proxy::store::open(&StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    })
    .await
    .expect("memory store");
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    ContextManager::new(ContextConfig::default(), counter, store)
}

/// The chat route's work on `raw` in `mode`; returns the bytes that would be forwarded.
async fn handle(manager: &ContextManager, raw: &Bytes, mode: Mode) -> usize {
    if mode == Mode::Off {
        if let Some(peeked) = ChatRequest::peek(raw.clone()) {
            return peeked.raw.len();
        }
    }
    check_json_shape(raw, &ServerConfig::default().body_limits()).expect("within the JSON limits");
    let mut request = ChatRequest::parse(raw.clone()).expect("valid");
    let managed = manager
        .manage(
            &context_proxy::store::Tenant::from_api_key(None),
            None,
            &mut request.body,
            mode,
            Some(Encoding::O200kBase),
        )
        .await;
    managed.body.map_or(raw.len(), |b| b.len())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000);
    let raw = body(calls);
    println!(
        "{calls} tool calls and results, body {:.2} MB",
        raw.len() as f64 / 1e6
    );
    let warm = manager().await;
    let mut out = 0;
    let (mut cold_t, mut warm_t, mut off_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let fresh = manager().await;
        let started = Instant::now();
        out = handle(&fresh, &raw, Mode::Auto).await;
        cold_t.push(started.elapsed());
        let started = Instant::now();
        handle(&warm, &raw, Mode::Auto).await;
        warm_t.push(started.elapsed());
        let started = Instant::now();
        handle(&warm, &raw, Mode::Off).await;
        off_t.push(started.elapsed());
    }
    println!("| path | median of {RUNS} | fastest |");
    println!("|---|---:|---:|");
    for (name, times) in [
        ("auto, cold (new manager)", cold_t),
        ("auto, warm (same manager)", warm_t),
        ("off (peek only)", off_t),
    ] {
        let fastest = *times.iter().min().expect("runs");
        println!("| {name} | {} | {} |", ms(median(times)), ms(fastest));
    }
    println!("forwarded body: {out} bytes");
}
