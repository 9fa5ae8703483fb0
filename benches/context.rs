//! Context management benchmark.
//!
//! Run with `cargo bench --bench context`. Plain `std::time` timing, medians of several runs;
//! every input is generated here or by the project's traffic generator (seed 42).
//!
//! Part 1: a 200-message, ~128k-token coding-agent conversation through
//! `ContextManager::manage` (the whole plan-and-apply phase: counting, identify, decision
//! lookup, engine, store writes, new body): cold (fresh caches, nothing recorded), warm (the
//! next request of the same conversation, one new message), and `off` (what pass-through
//! costs in the same phase). Part 2: tokens saved on the sample agent traffic, replaying every
//! request of every session through the engine with decisions carried from request to request
//! as the proxy does, with compaction alone and in auto mode.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use context_proxy::context::engine::{self, Decision, Input};
use context_proxy::context::{ContextConfig, ContextManager, Mode};
use context_proxy::store::{Backend, Store, StoreConfig};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use context_proxy::traffic::{generate, AgentKind, TrafficConfig};
use http::HeaderMap;
use serde_json::{json, Value};

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("## Context management\n");
    runtime.block_on(planning());
    println!();
    savings();
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A 200-message coding session of about `target` tokens: tool results of varied size.
fn conversation(target: usize) -> Vec<Value> {
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let mut messages =
        vec![json!({"role": "system", "content": "You are a coding agent. Use the tools."})];
    let per_round = target / 66;
    for i in 0..66 {
        messages.push(json!({"role": "user", "content": format!("Step {i}: open the next module and check the handler.")}));
        let id = format!("call_{i:04}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/m{i}.rs\"}}")}}
        ]}));
        let mut text = String::new();
        let mut line = 1;
        // Sizes vary: most results are a few thousand tokens, some much larger, some tiny.
        let want = match i % 6 {
            0 => per_round * 3,
            1 | 2 => per_round / 10,
            _ => per_round * 9 / 10,
        };
        while counter.count_text(&text) < want {
            for _ in 0..20 {
                text.push_str(&format!(
                    "{line:>5}\tpub fn handler_{i}_{line}(req: &Request) -> Result<Response> {{ validate(req)?; Ok(respond(req, {line})) }}\n"
                ));
                line += 1;
            }
        }
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    }
    messages
        .push(json!({"role": "user", "content": "Summarize what the handlers have in common."}));
    messages
}

async fn manager() -> ContextManager {
    let store_cfg = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    let store: Arc<dyn Store> = context_proxy::store::open(&store_cfg)
        .await
        .expect("memory store");
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    ContextManager::new(ContextConfig::default(), counter, store)
}

async fn planning() {
    let messages = conversation(100_000);
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let tokens: usize = messages
        .iter()
        .map(|m| counter.count_message(&m.clone()))
        .sum();
    let body = json!({"model": "gpt-4o", "messages": messages});
    let mut next = body.clone();
    if let Some(list) = next["messages"].as_array_mut() {
        list.push(json!({"role": "assistant", "content": "They all validate the request first."}));
        list.push(json!({"role": "user", "content": "And how do they respond?"}));
    }
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer sk-bench".parse().expect("header"));
    println!(
        "Plan and apply (`ContextManager::manage`, memory store) on a {}-message, {tokens}-token conversation, budget {} (gpt-4o × 0.8):\n",
        body["messages"].as_array().map_or(0, Vec::len),
        ContextConfig::default()
            .resolve("gpt-4o", Mode::Auto, &Default::default())
            .budget
    );
    let (mut cold, mut warm, mut same, mut off) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut actions = String::new();
    let mut reduced = (0, 0);
    for _ in 0..9 {
        let m = manager().await;
        let mut b = body.clone();
        let t = Instant::now();
        let managed = m.manage(&headers, &mut b, Mode::Auto, None).await;
        cold.push(t.elapsed());
        actions = managed.report.actions();
        reduced = (managed.report.tokens_before, managed.report.tokens_after);
        black_box(managed);
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&headers, &mut b, Mode::Auto, None).await);
        warm.push(t.elapsed());
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&headers, &mut b, Mode::Auto, None).await);
        same.push(t.elapsed());
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&headers, &mut b, Mode::Off, None).await);
        off.push(t.elapsed());
    }
    println!("| case | median |");
    println!("|---|---:|");
    println!("| cold: first sight, empty caches | {} |", ms(median(cold)));
    println!(
        "| warm: next request, one new turn | {} |",
        ms(median(warm))
    );
    println!("| warm: same request again | {} |", ms(median(same)));
    println!("| mode off (pass-through) | {} |", ms(median(off)));
    println!("\nactions: {actions}; tokens {} → {}", reduced.0, reduced.1);
}

fn savings() {
    let started = Instant::now();
    let sessions = generate(&TrafficConfig::default());
    let generated = started.elapsed();
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    println!(
        "Tokens sent upstream for every request of the sample traffic ({} sessions, {} requests; seed 42, generated in {}), default [context] settings, decisions carried from request to request:\n",
        sessions.len(),
        sessions.iter().map(|s| s.request_count()).sum::<usize>(),
        ms(generated)
    );
    println!("| traffic | requests | tokens without proxy | compact: sent | saved | auto: sent | saved |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let kinds = [
        Some(AgentKind::Coding),
        Some(AgentKind::Research),
        Some(AgentKind::Support),
        None,
    ];
    for kind in kinds {
        let mut row = (0usize, 0usize, 0usize, 0usize);
        for session in sessions.iter().filter(|s| kind.is_none_or(|k| s.kind == k)) {
            let fixed = 3 + counter
                .count_request(&json!({"messages": [], "tools": session.tools}))
                .tools;
            let counts: Vec<usize> = session
                .messages
                .iter()
                .map(|m| counter.count_message(m))
                .collect();
            for (slot, mode) in [(1, Mode::Compact), (2, Mode::Auto)] {
                let settings =
                    ContextConfig::default().resolve(&session.model, mode, &Default::default());
                let mut prior = Decision::default();
                for &end in &session.request_ends {
                    let input = Input {
                        messages: &session.messages[..end],
                        counts: &counts[..end],
                        fixed,
                    };
                    let outcome = engine::run(&input, &settings, prior, &counter);
                    prior = outcome.decision;
                    if slot == 1 {
                        row.0 += 1;
                        row.1 += outcome.report.tokens_before;
                        row.2 += outcome.report.tokens_after;
                    } else {
                        row.3 += outcome.report.tokens_after;
                    }
                }
            }
        }
        let name = kind.map_or("all".to_string(), |k| k.as_str().to_string());
        let saved = |sent: usize| 100.0 * (1.0 - sent as f64 / row.1.max(1) as f64);
        println!(
            "| {name} | {} | {} | {} | {:.1}% | {} | {:.1}% |",
            row.0,
            row.1,
            row.2,
            saved(row.2),
            row.3,
            saved(row.3)
        );
    }
    println!("\n(whole part measured in {})", ms(started.elapsed()));
}
