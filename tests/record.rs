//! Recording and replaying through the real proxy: a recording replayed into a fresh proxy
//! gives the same forwarded bodies; replay keeps each session's order under concurrency;
//! hashed recordings hold no original text.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::corpus::recording::{self, Exchange};
use context_proxy::mock::MockConfig;
use context_proxy::traffic::TrafficConfig;
use context_proxy_drive::replay::send::{drive, DriveOptions, Outcome};
use context_proxy_drive::replay::source::{self, Session};
use serde_json::{json, Value};

fn sample_sessions(n: usize) -> Vec<Session> {
    let cfg = TrafficConfig {
        seed: 7,
        sessions: n,
        max_turns: 12,
        max_result_bytes: 60_000,
        model: None,
    };
    let dir = tempfile::tempdir().unwrap();
    context_proxy::traffic::write_dir(dir.path(), &cfg, &context_proxy::traffic::generate(&cfg))
        .unwrap();
    source::load(dir.path()).unwrap()
}

/// Records into `dir`, with compaction forced early.
fn recording_to(dir: &Path, hash: bool) -> impl FnOnce(&mut Config) + '_ {
    move |c: &mut Config| {
        c.record.enabled = true;
        c.record.dir = dir.to_path_buf();
        c.record.hash_content = hash;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
        c.context.tool_result_max_tokens = 500;
    }
}

async fn replay(h: &Harness, sessions: Vec<Session>, concurrency: usize) -> Vec<Outcome> {
    let options = DriveOptions {
        url: h.url("/v1/chat/completions"),
        concurrency,
        rate: None,
        speed: None,
        max_gap: std::time::Duration::from_secs(1),
        duration: None,
        api_key: "sk-test-client".into(),
        run_id: String::new(),
        progress: false,
    };
    let outcomes = drive(&h.client, Arc::new(sessions), &options).await;
    for o in &outcomes {
        assert_eq!(o.status, 200, "{o:?}");
    }
    outcomes
}

/// What the upstream received, per session, in order.
fn forwarded_by_session(exchanges: &[Exchange]) -> Vec<Vec<Value>> {
    let mut by: HashMap<String, Vec<&Exchange>> = HashMap::new();
    for x in exchanges {
        by.entry(x.session.clone().unwrap()).or_default().push(x);
    }
    let mut sessions: Vec<Vec<Value>> = by
        .into_values()
        .map(|mut xs| {
            xs.sort_by_key(|x| x.at_ms);
            xs.iter().map(|x| x.upstream_body().clone()).collect()
        })
        .collect();
    sessions.sort_by_key(|s| s[0].to_string());
    sessions
}

#[tokio::test]
async fn a_replayed_recording_forwards_the_same_bodies() {
    let first = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), recording_to(first.path(), false)).await;
    let sessions = sample_sessions(4);
    let sent: usize = sessions.iter().map(|s| s.requests.len()).sum();
    replay(&h, sessions, 4).await;
    h.proxy.shutdown().await;
    let recorded = recording::read(first.path()).unwrap();
    assert_eq!(recorded.skipped_lines, 0);
    assert_eq!(recorded.exchanges.len(), sent);
    let rewritten = recorded
        .exchanges
        .iter()
        .filter(|x| x.forwarded.is_some())
        .count();
    assert!(rewritten > 0, "compaction never happened");
    let x = &recorded.exchanges[0];
    assert!(x.tenant.is_some() && x.total_ms.is_some() && x.tokens_before.is_some());
    assert!(x.response.as_ref().unwrap()["choices"][0]["message"].is_object());
    // Linear, not quadratic: each distinct message is stored once (one file here).
    let mut distinct = std::collections::HashSet::new();
    for x in &recorded.exchanges {
        for body in [Some(&x.request), x.forwarded.as_ref()]
            .into_iter()
            .flatten()
        {
            for m in body["messages"].as_array().unwrap() {
                distinct.insert(m.to_string());
            }
        }
    }
    let mut message_lines = 0;
    for e in std::fs::read_dir(first.path()).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        message_lines += text
            .lines()
            .filter(|l| l.starts_with("{\"t\":\"m\""))
            .count();
    }
    assert_eq!(message_lines, distinct.len());

    let second = tempfile::tempdir().unwrap();
    let h2 = Harness::start_with(MockConfig::default(), recording_to(second.path(), false)).await;
    let again = source::load(first.path()).unwrap();
    replay(&h2, again, 3).await;
    h2.proxy.shutdown().await;
    let replayed = recording::read(second.path()).unwrap();
    assert_eq!(
        forwarded_by_session(&replayed.exchanges),
        forwarded_by_session(&recorded.exchanges)
    );
}

#[tokio::test]
async fn replay_keeps_each_sessions_order_under_concurrency() {
    let h = Harness::start().await;
    let sessions = sample_sessions(9);
    // The proxy keeps its x-context-* headers to itself: a session is known by its opening
    // messages, which differ from one sample session to the next.
    let opening = |body: &Value| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        Value::Array(messages.into_iter().take(2).collect()).to_string()
    };
    let counts: HashMap<String, usize> = sessions
        .iter()
        .map(|s| {
            let first: Value = serde_json::from_slice(&s.requests[0].body).unwrap();
            (opening(&first), s.requests.len())
        })
        .collect();
    assert_eq!(counts.len(), sessions.len(), "two sessions open alike");
    let outcomes = replay(&h, sessions, 8).await;
    assert_eq!(outcomes.len(), counts.values().sum::<usize>());
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    for r in h.mock.received() {
        let session = opening(&r.json());
        let messages = r.json()["messages"].as_array().unwrap().len();
        seen.entry(session).or_default().push(messages);
    }
    assert_eq!(seen.len(), counts.len());
    for (session, lengths) in seen {
        assert_eq!(lengths.len(), counts[&session]);
        assert!(
            lengths.windows(2).all(|w| w[0] < w[1]),
            "{session} out of order: {lengths:?}"
        );
    }
}

#[tokio::test]
async fn hashed_recordings_hold_no_original_text() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), recording_to(dir.path(), true)).await;
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "zebra-system-prompt"},
        {"role": "user", "content": "walrus question about pelicans"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\":\"flamingo.rs\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ocelot ".repeat(2000)},
    ], "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]});
    for stream in [false, true] {
        let mut b = body.clone();
        b["stream"] = json!(stream);
        let resp = h.chat(&b).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    h.proxy.shutdown().await;
    let mut text = String::new();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        text.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    for word in [
        "zebra",
        "walrus",
        "pelican",
        "flamingo",
        "ocelot",
        "sk-test",
        "default reply",
    ] {
        assert!(!text.contains(word), "{word} in the recording");
    }
    let read = recording::read(dir.path()).unwrap();
    assert_eq!(read.exchanges.len(), 2);
    let m = &read.exchanges[0].request["messages"];
    assert_eq!(m[1]["role"], "user");
    assert_eq!(m[1]["content"].as_str().unwrap().len(), 30);
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "read_file");
    assert_eq!(m[3]["content"].as_str().unwrap().len(), 14_000);
}

/// The replay's own report through the proxy: it finds every forwarded call of every session
/// at the mock (the proxy keeps its `x-context-*` headers, so sessions are named by a header
/// it forwards), and prices each session with and without the proxy.
#[tokio::test]
async fn the_replay_report_finds_each_sessions_calls_behind_the_proxy() {
    let h = Harness::start().await;
    let mut lines = Vec::new();
    for s in ["a", "b"] {
        let mut messages = vec![json!({"role": "user", "content": format!("task {s}")})];
        for k in 0..3 {
            lines.push(json!({"session": s, "model": "gpt-4o", "messages": messages}));
            messages.push(json!({"role": "assistant", "content": format!("answer {k}")}));
            messages.push(json!({"role": "user", "content": format!("more {k}")}));
        }
    }
    let report = common::replay(&h, &lines, &[]).await;
    let with = report.with_proxy.as_ref().unwrap();
    assert_eq!(with.upstream_calls, 6);
    assert_eq!(with.per_session.len(), 2);
    assert!(with.per_session.iter().all(|s| s.upstream_calls == 3));
    // Unchanged by the proxy: the same bill, session by session.
    assert_eq!(with.prefix_stability, 1.0);
    for (a, b) in report
        .without_proxy
        .per_session
        .iter()
        .zip(&with.per_session)
    {
        assert_eq!(a.cost, b.cost);
    }
    assert_eq!(report.sessions.len(), 2);
}

#[tokio::test]
async fn an_answer_the_client_read_whole_is_recorded_complete() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), recording_to(dir.path(), false)).await;
    // Unmanaged (mode off) and managed, JSON and streamed: each read whole by the client.
    for (mode, stream) in [
        ("off", false),
        ("auto", false),
        ("off", true),
        ("auto", true),
    ] {
        let resp = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("authorization", "Bearer sk-test-client")
            .header("x-context-mode", mode)
            .json(&serde_json::json!({"model": "gpt-4o", "stream": stream,
                                      "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    h.proxy.shutdown().await;
    let recorded = recording::read(dir.path()).unwrap();
    assert_eq!(recorded.exchanges.len(), 4);
    for x in &recorded.exchanges {
        assert_eq!(x.end, "complete", "{} {}", x.mode, x.request);
    }
}
