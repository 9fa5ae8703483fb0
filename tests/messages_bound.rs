//! Claude Code on a model binding thinking to its prefix (`claude-sonnet-5-5`), without the
//! `drop_block` beta (Claude Code does not send it), through the proxy: every answer's thinking
//! is signed after the request as the proxy forwarded it, so what the proxy changed must be
//! repeated by every later request, by whichever process serves it. Sessions run live against
//! the strict mock (which checks every signature against its prefix) with large `Read` results
//! arriving every turn, truncated as they arrive:
//!
//! - alternating between two proxies on one real Redis;
//! - on an fs-backed proxy restarted mid-session;
//! - with the turn's results over the compaction threshold, compacted at the next turn
//!   boundary (the thinking after the edit removed), then repeated inside the tool loop.
//!
//! Each request is accepted, the proxy saves tokens, and each forwarded request begins with
//! the messages the previous one forwarded (as a signature reads them).

mod common;

use common::redis::TestRedis;
use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::context::adapter::messages::bound_hashes;
use context_proxy::mock::{rules, MockConfig, MockUpstream, Reply};
use context_proxy::store::{Backend, StoreConfig};
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-5-5";
const BETAS: &str =
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27";

fn file(t: usize) -> String {
    (0..400)
        .map(|l| format!("fn f{t}_{l}(x: u32) -> u32 {{ x + {l} }} // src/f{t}.rs:{l}\n"))
        .collect()
}

fn edit_config(config: &mut Config, budget: usize) {
    config.context.max_context_tokens = Some(budget);
    config.context.keep_recent_messages = 4;
    config.context.tool_result_max_tokens = 1_000;
    config.context.truncate_tool_result_tokens = Some(3_000);
}

async fn proxy(mock: &MockUpstream, store: StoreConfig, budget: usize) -> RunningServer {
    let mut config = common::config_for(&mock.base_url());
    config.store = store;
    edit_config(&mut config, budget);
    RunningServer::start(config.validate().unwrap())
        .await
        .unwrap()
}

/// What one request of a session got.
#[derive(Debug)]
struct Turn {
    actions: String,
    /// The body's size as the client sent it.
    sent_bytes: usize,
}

/// A Claude Code session: one prompt, then `turns` `Read` rounds and a final answer, then a
/// second prompt with `turns` more rounds (a turn boundary in the middle). `at(k)` is the
/// proxy serving request `k` (it may restart one in between).
struct Session {
    body: Value,
}

impl Session {
    fn new() -> Session {
        Session {
            body: json!({
                "model": MODEL,
                "max_tokens": 2048,
                "thinking": {"type": "adaptive"},
                "system": [
                    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=sdk-cli;"},
                    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
                ],
                "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "Read every file and summarize."}],
            }),
        }
    }

    /// Sends the session's request to `addr`; the answer goes back into the conversation (a
    /// call's result follows it; a final answer is followed by `next_prompt`).
    async fn send(&mut self, addr: std::net::SocketAddr, t: usize, next_prompt: &str) -> Turn {
        let sent_bytes = self.body.to_string().len();
        let resp = reqwest::Client::new()
            .post(format!("http://{addr}/v1/messages?beta=true"))
            .header("x-api-key", "sk-ant-test")
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", BETAS)
            .header("x-claude-code-session-id", "bound-1")
            .json(&self.body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        let actions = header("x-context-actions");
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "request {t}: {actions}: {answer}");
        let content = answer["content"].clone();
        let messages = self.body["messages"].as_array_mut().unwrap();
        // Claude Code marks only its newest block.
        for m in messages.iter_mut() {
            if let Some(blocks) = m["content"].as_array_mut() {
                for b in blocks {
                    b.as_object_mut().unwrap().remove("cache_control");
                }
            }
        }
        messages.push(json!({"role": "assistant", "content": content}));
        let call = content
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .cloned();
        match call {
            Some(call) => messages.push(json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": call["id"], "content": file(t), "cache_control": {"type": "ephemeral"}}]})),
            None => messages.push(json!({"role": "user", "content": [{"type": "text",
                "text": next_prompt, "cache_control": {"type": "ephemeral"}}]})),
        }
        Turn {
            actions,
            sent_bytes,
        }
    }
}

/// Scripts two prompts of `rounds` `Read` calls each, ended by a text answer.
fn script(mock: &MockUpstream, rounds: usize) {
    for prompt in 0..2 {
        for r in 0..rounds {
            mock.push(Reply::tool_calls(vec![(
                "Read".into(),
                json!({"file_path": format!("/repo/src/f{prompt}_{r}.rs")}),
            )]));
        }
        mock.push(Reply::text("They add numbers."));
    }
}

/// The `/v1/messages` bodies the mock received.
fn forwarded(mock: &MockUpstream) -> Vec<Value> {
    mock.received()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| r.json())
        .collect()
}

/// Every forwarded request was accepted by the rules, and inside a tool loop begins with what
/// the previous one forwarded (as a thinking signature reads it); the proxy saved tokens.
fn check_session(mock: &MockUpstream, turns: &[Turn]) {
    let sent = forwarded(mock);
    assert_eq!(sent.len(), turns.len());
    for (k, body) in sent.iter().enumerate() {
        assert_eq!(rules::check_messages(body), Ok(()), "request {k}");
        assert!(body["thinking"].get("block_binding").is_none());
    }
    for k in 1..sent.len() {
        let before = bound_hashes(&sent[k - 1]);
        let now = bound_hashes(&sent[k]);
        let last = sent[k]["messages"].as_array().unwrap().last().unwrap();
        let in_loop = last["content"][0]["type"] == "tool_result";
        if in_loop {
            assert_eq!(
                &now[..before.len()],
                &before[..],
                "request {k} rewrote the loop"
            );
        }
    }
    let truncated = turns
        .iter()
        .filter(|t| t.actions.contains("truncated"))
        .count();
    assert!(truncated >= turns.len() / 2, "{turns:#?}");
    let before: usize = turns.iter().map(|t| t.sent_bytes).sum();
    let after: usize = sent.iter().map(|b| b.to_string().len()).sum();
    assert!(
        after * 10 < before * 6,
        "{after} of {before} bytes: {turns:#?}"
    );
    assert!(
        turns.iter().all(|t| !t.actions.starts_with("skipped")),
        "{turns:#?}"
    );
}

#[tokio::test]
async fn two_replicas_on_one_redis_repeat_each_others_edits() {
    let redis = TestRedis::start();
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let store = StoreConfig {
        backend: Backend::Redis,
        redis_url: redis.url.clone(),
        redis_key_prefix: redis.prefix.clone(),
        ..StoreConfig::default()
    };
    let a = proxy(&mock, store.clone(), 60_000).await;
    let b = proxy(&mock, store, 60_000).await;
    let rounds = 6;
    script(&mock, rounds);
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..2 * (rounds + 1) {
        let addr = if k % 2 == 0 { a.addr() } else { b.addr() };
        turns.push(session.send(addr, k, "Now the tests.").await);
    }
    check_session(&mock, &turns);
}

#[tokio::test]
async fn an_fs_proxy_restarted_mid_session_repeats_its_edits() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let store = StoreConfig {
        backend: Backend::Fs,
        path: dir.path().to_path_buf(),
        ..StoreConfig::default()
    };
    let rounds = 6;
    script(&mock, rounds);
    let mut session = Session::new();
    let mut turns = Vec::new();
    let mut server = proxy(&mock, store.clone(), 60_000).await;
    for k in 0..2 * (rounds + 1) {
        if k == 4 || k == 10 {
            server.shutdown().await;
            server = proxy(&mock, store.clone(), 60_000).await;
        }
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    check_session(&mock, &turns);
}

/// At the turn boundary the older results, truncated as they came, are compacted: an edit
/// before thinking blocks, allowed there (no tool loop is open) with those blocks removed; the
/// next turn's loop repeats it.
#[tokio::test]
async fn older_results_are_compacted_at_the_turn_boundary_and_repeated_in_the_loop() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let memory = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    // Over budget from the fifth result on: the loop cannot be cut, the turn boundary can.
    let server = proxy(&mock, memory, 16_000).await;
    let rounds = 6;
    script(&mock, rounds);
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..2 * (rounds + 1) {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    check_session(&mock, &turns);
    let boundary = &turns[rounds + 1];
    assert!(boundary.actions.contains("compacted"), "{turns:#?}");
    let sent = forwarded(&mock);
    let thinking = |b: &Value| {
        b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "thinking")
            .count()
    };
    assert!(
        thinking(&sent[rounds + 1]) < rounds + 1,
        "{}",
        sent[rounds + 1]
    );
}
