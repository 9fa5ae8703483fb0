//! Compression benchmark: the sample agent traffic replayed turn by turn through context
//! management with the summarizer on (auto mode, default settings), the summarizer being the
//! mock upstream scripted with a fixed summary.
//!
//! Run with `cargo bench --bench summarize` (`BENCH_SESSIONS=n` replays the first n sessions
//! only; `BENCH_NO_SUMMARY=1` the same without summaries, to compare). Each request goes through the same plan → summary → apply steps as the chat route
//! (`src/routes/chat/settle.rs`), in process; between two requests of a session the harness waits
//! for the background summaries queued so far (an agent's turn takes seconds; the mock answers
//! in microseconds), with a deadline. Reported: input tokens forwarded against the original,
//! the background hit rate (requests whose moved-out span had its summary ready, among those
//! with a moved-out span), and how often the forwarded messages of a request begin with the
//! previous request's forwarded messages byte for byte.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use context_proxy::context::summary::SummarizerConfig;
use context_proxy::context::{ContextConfig, ContextManager, Mode, Route, SummaryPlan};
use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use context_proxy::store::{Backend, StoreConfig};
use context_proxy::summarizer::{Summarizer, Task};
use context_proxy::telemetry::summarizer_stats::Stats;
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use context_proxy::traffic::{generate, TrafficConfig};
use context_proxy::upstream::UpstreamConfig;
use context_proxy::upstream::Upstreams;
use serde_json::{json, Value};

const SUMMARY: &str = "## Task overview\nThe agent's task, its success criteria and constraints.\n\n\
## Current state\nFiles read and edited so far: src/lib.rs, src/main.rs; ids call_0001…\n\n\
## Important discoveries\nThe build failed with error[E0308] and was fixed by changing the return type.\n\n\
## Next steps\nRun the tests, then report.\n\n## Context to preserve\nThe user prefers small commits.";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let started = Instant::now();
    let mut sessions = generate(&TrafficConfig::default());
    if let Some(n) = std::env::var("BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        sessions.truncate(n);
    }
    let summ = MockUpstream::start(MockConfig::default())
        .await
        .expect("mock");
    for _ in 0..20_000 {
        summ.push(Reply::text(SUMMARY));
    }
    let upstreams = Upstreams::new(
        &[UpstreamConfig {
            name: "summ".into(),
            base_url: summ.base_url(),
            ..UpstreamConfig::default()
        }],
        |_| None,
    )
    .expect("upstreams");
    let upstream = upstreams.route(None).clone();
    let store = context_proxy::store::open(&StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    })
    .await
    .expect("store");
    let summarizer_config = SummarizerConfig {
        enabled: true,
        model: Some("summarizer".into()),
        ..SummarizerConfig::default()
    };
    let config = ContextConfig {
        summarizer: summarizer_config.clone(),
        ..ContextConfig::default()
    };
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let manager = ContextManager::new(config, counter, store.clone());
    let stats = Arc::new(Stats::default());
    let summarizer = Summarizer::start(summarizer_config, store, None, stats.clone());

    // BENCH_NO_SUMMARY=1: the same replay without summaries (the marker only), to compare.
    let summarize = std::env::var_os("BENCH_NO_SUMMARY").is_none();
    let (mut requests, mut original, mut forwarded) = (0usize, 0usize, 0usize);
    let (mut hits, mut computed, mut fallbacks) = (0usize, 0usize, 0usize);
    // Spans whose summary was not asked for: it would not pay (the marker alone).
    let mut unpaid = 0usize;
    let (mut misses_over_budget, mut misses_priced, mut misses_other) = (0usize, 0usize, 0usize);
    let (mut pairs, mut same_prefix) = (0usize, 0usize);
    for session in &sessions {
        let mut previous: Option<Vec<Value>> = None;
        for &end in &session.request_ends {
            let mut body = json!({
                "model": session.model,
                "messages": &session.messages[..end],
                "tools": session.tools,
            });
            let identity = manager.identify(
                context_proxy::store::Tenant::from_api_key(None),
                Some(&session.id),
                &body,
            );
            let route = Route {
                summarize,
                ..Route::default()
            };
            let mut plan = manager
                .plan(identity.as_ref(), &mut body, Mode::Auto, &route)
                .await;
            let task = |job| Task {
                identity: identity.clone().expect("identity"),
                job,
                upstream: upstream.clone(),
                authorization: None,
                model: session.model.clone(),
                bill: None,
            };
            match std::mem::take(&mut plan.summary) {
                SummaryPlan::None => {}
                SummaryPlan::Hit => hits += 1,
                SummaryPlan::Unpaid { ahead } => unpaid += usize::from(!ahead),
                SummaryPlan::Ahead(job) => {
                    summarizer.enqueue(task(job));
                }
                SummaryPlan::Missing(job) if !job.blocking => {
                    summarizer.enqueue(task(job));
                    fallbacks += 1;
                }
                SummaryPlan::Missing(job) => {
                    let deadline = tokio::time::Instant::now() + summarizer.timeout();
                    match summarizer.obtain(&task(job), deadline).await {
                        Ok((text, _)) if manager.place_summary(&mut plan, &text) => computed += 1,
                        _ => fallbacks += 1,
                    }
                }
            }
            let managed = manager.apply(identity.as_ref(), plan, &mut body, "").await;
            requests += 1;
            original += managed.report.tokens_before;
            forwarded += managed.report.tokens_after;
            let sent = body["messages"].as_array().cloned().unwrap_or_default();
            if let Some(prev) = previous.take() {
                pairs += 1;
                if sent.len() >= prev.len() && sent[..prev.len()] == prev[..] {
                    same_prefix += 1;
                } else {
                    match (managed.report.forced, managed.report.rewrote_prefix) {
                        (true, _) => misses_over_budget += 1,
                        (false, true) => misses_priced += 1,
                        (false, false) => misses_other += 1,
                    }
                }
            }
            previous = Some(sent);
            background_idle(&stats).await;
        }
    }
    let pct = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    println!(
        "prefix misses: {misses_over_budget} cuts forced by the budget, {misses_priced} priced moves under it, {misses_other} other (a summary placed in the marker)\n"
    );
    let with_span = hits + computed + fallbacks + unpaid;
    println!(
        "## Compression on the sample traffic ({} sessions, {requests} requests, {:.1} s)\n",
        sessions.len(),
        started.elapsed().as_secs_f64()
    );
    println!("| figure | value |\n|---|---:|");
    println!("| input tokens without proxy | {original} |");
    println!(
        "| input tokens forwarded | {forwarded} ({:.1}% below) |",
        100.0 - pct(forwarded, original)
    );
    println!(
        "| requests with a moved-out span | {with_span}: summary ready {hits}, waited for {computed}, marker only {fallbacks}, not worth a summary {unpaid} |"
    );
    println!("| background hit rate | {:.1}% |", pct(hits, with_span));
    println!(
        "| forwarded prefix byte-identical to the previous request's | {same_prefix} / {pairs} ({:.1}%) |",
        pct(same_prefix, pairs)
    );
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "| summarizer calls | {} (tokens in {}, out {}; background started {}, completed {}, failed {}) |",
        load(&stats.calls),
        load(&stats.tokens_in),
        load(&stats.tokens_out),
        load(&stats.background_started),
        load(&stats.background_completed),
        load(&stats.background_failed)
    );
}

/// Waits until every background summary queued so far has ended (deadline 10 s).
async fn background_idle(stats: &Stats) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let started = stats.background_started.load(Ordering::Relaxed);
        let ended = stats.background_completed.load(Ordering::Relaxed)
            + stats.background_failed.load(Ordering::Relaxed);
        if ended >= started || Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
