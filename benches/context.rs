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
//! as the proxy does: the lossless transforms alone, compaction, and auto mode with and
//! without them; then what the sample traffic's tool results look like (JSON documents,
//! repeated lines, trailing spaces, ANSI codes, CRLF). Part 3: the lossless transforms on
//! their own: cold cost on a 100 KB JSON result, and savings on tool results shaped like
//! real pretty-printed API answers and build logs (built here, not recorded traffic).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use context_proxy::context::engine::{self, Decision, Input};
use context_proxy::context::transforms;
use context_proxy::context::{ContextConfig, ContextManager, Mode, Settings};
use context_proxy::store::{Backend, Store, StoreConfig};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use context_proxy::traffic::{generate, AgentKind, TrafficConfig};
use serde_json::{json, Value};

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(steps) = std::env::var("CONTEXT_BENCH_STEPS") {
        runtime.block_on(run_steps(&steps));
        return;
    }
    println!("## Context management\n");
    runtime.block_on(planning());
    println!();
    savings();
    println!();
    shapes();
    println!();
    lossless_part();
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
    manager_with(ContextConfig::default()).await
}

async fn manager_with(config: ContextConfig) -> ContextManager {
    let store_cfg = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    let store: Arc<dyn Store> = context_proxy::store::open(&store_cfg)
        .await
        .expect("memory store");
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    ContextManager::new(config, counter, store)
}

/// Runs part 1's requests in the order `steps` names them (`cold`, `next`, `same`, comma
/// separated) and nothing else: under `valgrind --tool=callgrind` the difference between two
/// step lists is the instruction count of the steps one adds, the same on a busy machine
/// (BENCHMARKS.md, "instruction counts").
async fn run_steps(steps: &str) {
    let body = json!({"model": "gpt-4o", "messages": conversation(100_000)});
    let mut next = body.clone();
    if let Some(list) = next["messages"].as_array_mut() {
        list.push(json!({"role": "assistant", "content": "They all validate the request first."}));
        list.push(json!({"role": "user", "content": "And how do they respond?"}));
    }
    let tenant = context_proxy::store::Tenant::from_api_key(Some("sk-bench"));
    let m = manager().await;
    for step in steps.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut b = match step {
            "cold" => body.clone(),
            "next" | "same" => next.clone(),
            other => panic!("unknown step {other:?}: cold, next or same"),
        };
        black_box(m.manage(&tenant, None, &mut b, Mode::Auto, None).await);
    }
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
    let tenant = context_proxy::store::Tenant::from_api_key(Some("sk-bench"));
    println!(
        "Plan and apply (`ContextManager::manage`, memory store) on a {}-message, {tokens}-token conversation, budget {} (gpt-4o × 0.8):\n",
        body["messages"].as_array().map_or(0, Vec::len),
        ContextConfig::default()
            .resolve("gpt-4o", Mode::Auto, &Default::default())
            .budget
    );
    let (mut cold, mut warm, mut same, mut off) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut cold_plain = Vec::new();
    let mut actions = String::new();
    let mut reduced = (0, 0);
    for _ in 0..9 {
        // The same first sight with the lossless transforms off, alternating with the rest:
        // what trying them on every tool result costs.
        let plain = manager_with(ContextConfig {
            lossless: false,
            ..ContextConfig::default()
        })
        .await;
        let mut b = body.clone();
        let t = Instant::now();
        black_box(plain.manage(&tenant, None, &mut b, Mode::Auto, None).await);
        cold_plain.push(t.elapsed());
        let m = manager().await;
        let mut b = body.clone();
        let t = Instant::now();
        let managed = m.manage(&tenant, None, &mut b, Mode::Auto, None).await;
        cold.push(t.elapsed());
        actions = managed.report.actions();
        reduced = (managed.report.tokens_before, managed.report.tokens_after);
        black_box(managed);
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&tenant, None, &mut b, Mode::Auto, None).await);
        warm.push(t.elapsed());
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&tenant, None, &mut b, Mode::Auto, None).await);
        same.push(t.elapsed());
        let mut b = next.clone();
        let t = Instant::now();
        black_box(m.manage(&tenant, None, &mut b, Mode::Off, None).await);
        off.push(t.elapsed());
    }
    println!("| case | median |");
    println!("|---|---:|");
    println!("| cold: first sight, empty caches | {} |", ms(median(cold)));
    println!(
        "| cold, lossless transforms off | {} |",
        ms(median(cold_plain))
    );
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
    println!("| traffic | requests | tokens without proxy | lossless only: saved | compact: saved | auto: sent | saved | auto, lossless off: saved |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let kinds = [
        Some(AgentKind::Coding),
        Some(AgentKind::Research),
        Some(AgentKind::Support),
        None,
    ];
    for kind in kinds {
        // requests, before, then sent by: lossless only, compact, auto, auto without lossless.
        let mut requests = 0usize;
        let mut before = 0usize;
        let mut sent = [0usize; 4];
        for session in sessions.iter().filter(|s| kind.is_none_or(|k| s.kind == k)) {
            let fixed = 3 + counter
                .count_request(&json!({"messages": [], "tools": session.tools}))
                .tools;
            let counts: Vec<usize> = session
                .messages
                .iter()
                .map(|m| counter.count_message(m))
                .collect();
            let config = ContextConfig::default();
            let resolve = |mode| config.resolve(&session.model, mode, &Default::default());
            let variants: [Settings; 4] = [
                Settings {
                    budget: usize::MAX / 4,
                    target: usize::MAX / 4,
                    tool_result_max_tokens: usize::MAX / 4,
                    truncate_tokens: usize::MAX / 4,
                    ..resolve(Mode::Compact)
                },
                resolve(Mode::Compact),
                resolve(Mode::Auto),
                Settings {
                    lossless: false,
                    ..resolve(Mode::Auto)
                },
            ];
            for (slot, settings) in variants.iter().enumerate() {
                let mut prior = Decision::default();
                for &end in &session.request_ends {
                    let input = Input::new(&session.messages[..end], &counts[..end], fixed);
                    let outcome = engine::run(&input, settings, prior, &counter);
                    prior = outcome.decision;
                    if slot == 0 {
                        requests += 1;
                        before += outcome.report.tokens_before;
                    }
                    sent[slot] += outcome.report.tokens_after;
                }
            }
        }
        let name = kind.map_or("all".to_string(), |k| k.as_str().to_string());
        let saved = |sent: usize| 100.0 * (1.0 - sent as f64 / before.max(1) as f64);
        println!(
            "| {name} | {requests} | {before} | {:.2}% | {:.1}% | {} | {:.1}% | {:.1}% |",
            saved(sent[0]),
            saved(sent[1]),
            sent[2],
            saved(sent[2]),
            saved(sent[3])
        );
    }
    println!("\n(whole part measured in {})", ms(started.elapsed()));
}

/// What the sample traffic's tool results are made of: what a lossless transform could act on.
fn shapes() {
    let sessions = generate(&TrafficConfig::default());
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let (mut results, mut tokens) = (0usize, 0usize);
    let (mut json_docs, mut pretty, mut runs, mut trailing, mut ansi, mut crlf) =
        (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
    let (mut saved_min, mut saved_dedupe) = (0usize, 0usize);
    for session in &sessions {
        for m in &session.messages {
            if m["role"] != "tool" {
                continue;
            }
            let Some(text) = m["content"].as_str() else {
                continue;
            };
            results += 1;
            let t = counter.count_text(text);
            tokens += t;
            if serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object() || v.is_array()) {
                json_docs += 1;
                if let Some(min) = transforms::minify_json(text) {
                    pretty += 1;
                    saved_min += t.saturating_sub(counter.count_text(&min));
                }
            }
            if let Some((out, _)) = transforms::collapse_repeats(text) {
                runs += 1;
                saved_dedupe += t.saturating_sub(counter.count_text(&out));
            }
            trailing += usize::from(text.lines().any(|l| l.ends_with(' ') || l.ends_with('\t')));
            ansi += usize::from(text.contains('\u{1b}'));
            crlf += usize::from(text.contains("\r\n"));
        }
    }
    println!("Tool results of the sample traffic (every message of every session, each counted once): {results} results, {tokens} tokens.\n");
    println!("| shape | results | tokens a transform saves |");
    println!("|---|---:|---:|");
    println!("| whole JSON document | {json_docs} | |");
    println!("| … with whitespace to remove (minified) | {pretty} | {saved_min} |");
    println!(
        "| a run of ≥ {} identical lines (collapsed) | {runs} | {saved_dedupe} |",
        transforms::MIN_RUN
    );
    println!("| a line with trailing spaces or tabs | {trailing} | (no transform) |");
    println!("| ANSI escape codes | {ansi} | (no transform) |");
    println!("| CRLF line ends | {crlf} | (no transform) |");
}

/// A 2-space pretty-printed JSON answer of a REST API listing `n` issues, as `gh api` or
/// `curl … | jq .` print them.
fn api_json(n: usize) -> String {
    const LABELS: [&str; 5] = ["bug", "billing", "p1", "export", "needs-triage"];
    let items: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "url": format!("https://api.github.com/repos/acme/billing/issues/{}", 4000 + i),
                "id": 2_100_000_000u64 + i as u64 * 7919,
                "node_id": format!("I_kwDOJ{:08x}", i * 2654435761usize % 0xffff_ffff),
                "number": 4000 + i,
                "title": format!("Invoice export fails for accounts with {} currencies", i % 7 + 2),
                "user": {"login": format!("dev{}", i % 13), "id": 100_000 + i % 13, "type": "User", "site_admin": false},
                "labels": [{"id": 1_000 + i % 5, "name": LABELS[i % 5], "color": "d73a4a", "default": i % 5 == 0}],
                "state": if i % 3 == 0 { "closed" } else { "open" },
                "locked": false,
                "assignee": null,
                "comments": i % 9,
                "created_at": format!("2025-0{}-{:02}T1{}:0{}:00Z", i % 9 + 1, i % 28 + 1, i % 10, i % 10),
                "updated_at": format!("2025-0{}-{:02}T1{}:3{}:00Z", i % 9 + 1, i % 28 + 1, i % 10, i % 10),
                "author_association": "MEMBER",
                "body": format!("Steps: export invoices for account {}.\nExpected: CSV. Got: 500.", 90_000 + i),
                "reactions": {"total_count": i % 4, "+1": i % 4, "-1": 0, "laugh": 0, "hooray": 0},
            })
        })
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_default()
}

/// A build-and-test log with the repetition real tools print (retries, progress, warnings).
fn build_log(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        out.push_str(&format!("   Compiling crate-{i} v0.{}.{}\n", i % 9, i % 4));
        if i % 10 == 3 {
            for _ in 0..12 {
                out.push_str("warning: unused import: `std::collections::HashMap`\n");
            }
        }
        if i % 25 == 7 {
            for _ in 0..30 {
                out.push_str("Waiting for file lock on package cache\n");
            }
        }
    }
    for t in 0..n {
        out.push_str(&format!("test module_{}::case_{t} ... ok\n", t % 17));
    }
    out.push_str("test result: ok. all passed; 0 failed\n");
    out
}

fn lossless_part() {
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    // Cold cost on a 100 KB pretty-printed JSON result.
    let mut doc = api_json(1);
    let mut n = 1;
    while doc.len() < 100_000 {
        n += 1;
        doc = api_json(n);
    }
    let mut transform = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        black_box(transforms::lossless(black_box(&doc)));
        transform.push(t.elapsed());
    }
    let min = transforms::lossless(&doc)
        .map(|l| l.text)
        .unwrap_or_default();
    println!(
        "Lossless transforms, cold (median of 21): a {} KB pretty-printed JSON result ({} issues, {} tokens → {} minified, {} KB): {} (validate with serde_json, copy tokens; the proxy counts the minified text once more and caches both by content).\n",
        doc.len() / 1000,
        n,
        counter.count_text(&doc),
        counter.count_text(&min),
        min.len() / 1000,
        ms(median(transform)),
    );
    println!("Savings on tool results shaped like real ones (built here; not recorded traffic):\n");
    println!("| result | tokens | after lossless | saved |");
    println!("|---|---:|---:|---:|");
    let cases = [
        (
            "REST API answer, 2-space pretty JSON (20 issues)",
            api_json(20),
        ),
        (
            "build and test log with retries and repeated warnings",
            build_log(200),
        ),
    ];
    for (name, text) in cases {
        let before = counter.count_text(&text);
        let after = transforms::lossless(&text).map_or(before, |l| counter.count_text(&l.text));
        println!(
            "| {name} | {before} | {after} | {:.1}% |",
            100.0 * (1.0 - after as f64 / before.max(1) as f64)
        );
    }
}
