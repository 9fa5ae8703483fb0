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
//! As Claude Code does, the client marks only its newest block and sends a prompt that no
//! longer carries the mark as a string (it went as a text block with the mark): the same
//! message to a signature.
//!
//! Each request is accepted, the proxy saves tokens, and each forwarded request begins with
//! the messages the previous one forwarded (as a signature reads them).

mod common;

use common::redis::{RedisServer, TestRedis};
use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::context::adapter::messages::bound_hashes;
use context_proxy::context::adapter::messages_bound;
use context_proxy::context::settings::WindowEntry;
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
    proxy_with(mock, store, |c| edit_config(c, budget)).await
}

async fn proxy_with(
    mock: &MockUpstream,
    store: StoreConfig,
    edit: impl FnOnce(&mut Config),
) -> RunningServer {
    let mut config = common::config_for(&mock.base_url());
    config.store = store;
    // A store call that times out holds the request's changes back (or refuses it): the
    // loaded test machine has seen the fs store take over the default 2 s.
    config.store.op_timeout_ms = 10_000;
    edit(&mut config);
    RunningServer::start(config.validate().unwrap())
        .await
        .unwrap()
}

/// The embedded memory store.
fn memory_store() -> StoreConfig {
    StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    }
}

/// A private Redis (one a test may stop or restrict), and a store config on it.
async fn private_redis() -> (RedisServer, StoreConfig) {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = StoreConfig {
        backend: Backend::Redis,
        redis_url: server.url(),
        ..StoreConfig::default()
    };
    (server, store)
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
        Session::with("You are Claude Code.", "Read every file and summarize.")
    }

    /// A conversation with its own system prompt and task (a sub-agent's).
    fn with(system: &str, task: &str) -> Session {
        Session {
            body: json!({
                "model": MODEL,
                "max_tokens": 2048,
                "thinking": {"type": "adaptive"},
                "system": [
                    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328; cc_entrypoint=sdk-cli;"},
                    {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}
                ],
                "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": task}],
            }),
        }
    }

    /// Posts the session's request to `addr` as it stands: the status, `x-context-actions`
    /// and the answer's JSON.
    async fn post(&self, addr: std::net::SocketAddr) -> (u16, String, Value) {
        common::post_messages(addr, &self.body, BETAS, "bound-1").await
    }

    /// Sends the session's request to `addr`; the answer goes back into the conversation (a
    /// call's result follows it; a final answer is followed by `next_prompt`).
    async fn send(&mut self, addr: std::net::SocketAddr, t: usize, next_prompt: &str) -> Turn {
        self.send_with(addr, t, next_prompt, file).await
    }

    /// [`Session::send`], the result of call `t` being `result(t)`.
    async fn send_with(
        &mut self,
        addr: std::net::SocketAddr,
        t: usize,
        next_prompt: &str,
        result: impl Fn(usize) -> String,
    ) -> Turn {
        let sent_bytes = self.body.to_string().len();
        let (status, actions, answer) = self.post(addr).await;
        assert_eq!(status, 200, "request {t}: {actions}: {answer}");
        let content = answer["content"].clone();
        let messages = self.body["messages"].as_array_mut().unwrap();
        // Claude Code marks only its newest block, and sends a prompt that no longer carries
        // the mark as a string.
        for m in messages.iter_mut() {
            let user = m["role"] == "user";
            if let Some(blocks) = m["content"].as_array_mut() {
                for b in blocks.iter_mut() {
                    b.as_object_mut().unwrap().remove("cache_control");
                }
                if user && blocks.len() == 1 && blocks[0]["type"] == "text" {
                    let text = blocks[0]["text"].clone();
                    m["content"] = text;
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
                "tool_use_id": call["id"], "content": result(t), "cache_control": {"type": "ephemeral"}}]})),
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
    let memory = memory_store();
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

/// Claude Code's sub-agents share the session header of the agent that started them: two
/// conversations of one session, interleaved request by request, each repeat their own edits.
#[tokio::test]
async fn a_sub_agent_in_the_same_session_keeps_its_own_record() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let memory = memory_store();
    let server = proxy(&mock, memory, 60_000).await;
    let rounds = 4;
    for r in 0..2 * rounds {
        mock.push(Reply::tool_calls(vec![(
            "Read".into(),
            json!({"file_path": format!("/repo/src/g{r}.rs")}),
        )]));
    }
    mock.push(Reply::text("Done."));
    mock.push(Reply::text("Done."));
    let mut main = Session::new();
    let mut sub = Session::with("You are a sub-agent of Claude Code.", "Find the tests.");
    let mut actions = Vec::new();
    for k in 0..=rounds {
        actions.push(main.send(server.addr(), 2 * k, "Next.").await.actions);
        actions.push(sub.send(server.addr(), 2 * k + 1, "Next.").await.actions);
    }
    let truncated = actions.iter().filter(|a| a.contains("truncated")).count();
    assert!(truncated >= 2 * rounds - 2, "{actions:#?}");
    for (k, body) in forwarded(&mock).iter().enumerate() {
        assert_eq!(rules::check_messages(body), Ok(()), "request {k}");
    }
}

/// `n` lines of a source file, as `Read` returns them.
fn lines(t: usize, n: usize) -> String {
    (0..n)
        .map(|l| format!("fn f{t}_{l}(x: u32) -> u32 {{ x + {l} }} // src/f{t}.rs:{l}\n"))
        .collect()
}

/// Every `/v1/messages` request the mock received was accepted by its rules (each thinking
/// signature checked against what came before it).
fn all_accepted(mock: &MockUpstream) {
    for (k, body) in forwarded(mock).iter().enumerate() {
        assert_eq!(rules::check_messages(body), Ok(()), "request {k}");
    }
}

/// Redis stops mid-session. The conversation was edited (each large result truncated as it
/// arrived), so its thinking is bound to messages the client does not have, and the proxy can
/// no longer read what it forwarded: it answers a retryable error in Anthropic's shape, which
/// says what to do, and sends nothing (the client's bytes would be refused as "bound to a
/// different conversation").
#[tokio::test]
async fn a_store_gone_mid_session_refuses_an_edited_conversation() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let (mut redis, store) = private_redis().await;
    let server = proxy(&mock, store, 60_000).await;
    script(&mock, 6);
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..3 {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    let truncated = turns
        .iter()
        .filter(|t| t.actions.contains("truncated"))
        .count();
    assert_eq!(truncated, 2, "{turns:#?}");
    redis.kill();
    let (status, actions, answer) = session.post(server.addr()).await;
    assert_eq!(status, 503, "{actions}: {answer}");
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["error"]["type"], "overloaded_error", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("bound to a different conversation") && message.contains("Retry"),
        "{message}"
    );
    assert_eq!(forwarded(&mock).len(), 3, "the request was not forwarded");
    all_accepted(&mock);
}

/// A relay in front of a Redis that can stop passing on what clients send (`hold`) and go on
/// again (`release`): a store that does not answer, for as long as a test says.
struct Gate {
    addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
}

impl Gate {
    async fn start(redis: &str) -> Gate {
        let target = redis.trim_start_matches("redis://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, watch) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut from_client, to_client) = client.into_split();
                let (from_server, mut to_server) = server.into_split();
                let mut gate = watch.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if gate.wait_for(|open| *open).await.is_err()
                            || to_server.write_all(&buf[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let (mut from_server, mut to_client) = (from_server, to_client);
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
            }
        });
        Gate { addr, open }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn hold(&self) {
        self.open.send_replace(false);
    }

    fn release(&self) {
        self.open.send_replace(true);
    }
}

/// The store stops answering mid-session (what clients send to Redis held back) in an edited
/// conversation: the record's read times out (`store.op_timeout_ms`), which is handled as a
/// failed read: a retryable 503 saying why and what to do, nothing forwarded. Once the store
/// answers again the session goes on, every request accepted.
#[tokio::test]
async fn a_record_read_that_times_out_refuses_an_edited_conversation() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let (redis, _) = private_redis().await;
    let gate = Gate::start(&redis.url()).await;
    let store = StoreConfig {
        backend: Backend::Redis,
        redis_url: gate.url(),
        ..StoreConfig::default()
    };
    let server = proxy_with(&mock, store, |c| {
        edit_config(c, 60_000);
        c.store.op_timeout_ms = 3_000;
    })
    .await;
    script(&mock, 6);
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..3 {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    assert!(turns[1].actions.contains("truncated"), "{turns:#?}");
    gate.hold();
    let (status, actions, answer) = session.post(server.addr()).await;
    gate.release();
    assert_eq!(status, 503, "{actions}: {answer}");
    assert_eq!(answer["error"]["type"], "overloaded_error", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("did not finish within")
            && message.contains("bound to a different conversation")
            && message.contains("Retry"),
        "{message}"
    );
    assert_eq!(forwarded(&mock).len(), 3, "the request was not forwarded");
    for k in 3..6 {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    assert_eq!(forwarded(&mock).len(), 6);
    all_accepted(&mock);
}

/// Redis stops mid-session in a conversation the proxy never edited (its results are small):
/// what the client sends is what every signature was made after, so it goes as it came, and
/// `x-context-actions` says why it was not managed.
#[tokio::test]
async fn a_store_gone_before_any_edit_lets_the_conversation_through_as_sent() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let (mut redis, store) = private_redis().await;
    let server = proxy(&mock, store, 60_000).await;
    script(&mock, 6);
    let mut session = Session::new();
    let small = |t| lines(t, 12);
    let mut turns = Vec::new();
    for k in 0..3 {
        turns.push(session.send_with(server.addr(), k, "Next.", small).await);
    }
    assert!(turns.iter().all(|t| t.actions == "none"), "{turns:#?}");
    redis.kill();
    let turn = session.send_with(server.addr(), 3, "Next.", small).await;
    assert_eq!(
        turn.actions,
        format!(
            "skipped (unmanaged: {})",
            messages_bound::UNREADABLE_UNEDITED
        )
    );
    assert_eq!(forwarded(&mock).len(), 4);
    all_accepted(&mock);
}

/// The store refuses writes for one request (Redis denies `SET`): what that request removed
/// cannot be stored, nor what it forwards recorded, so it sends the form the record kept
/// (its new result whole) and says why. Once the store takes writes again the session goes
/// on, every request accepted: none repeats a form that was never forwarded.
#[tokio::test]
async fn a_store_that_takes_no_writes_holds_the_changes_back() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let (redis, store) = private_redis().await;
    let server = proxy(&mock, store, 60_000).await;
    let rounds = 6;
    script(&mock, rounds);
    let acl = |rule: &str| {
        let mut conn = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rule)
            .query::<()>(&mut conn)
            .unwrap();
    };
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..3 {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    acl("-set");
    let held = session.send(server.addr(), 3, "Now the tests.").await;
    acl("+set");
    assert!(held.actions.starts_with("skipped (unmanaged: "), "{held:?}");
    let sent = forwarded(&mock);
    let last = sent[3]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["content"][0]["content"],
        file(2),
        "the new result went whole"
    );
    turns.push(held);
    for k in 4..2 * (rounds + 1) {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    all_accepted(&mock);
    let truncated = turns
        .iter()
        .filter(|t| t.actions.contains("truncated"))
        .count();
    assert!(truncated >= turns.len() / 2, "{turns:#?}");
}

/// The engine plans nothing for a request (it asks for less room for its answer, so the
/// result truncated when it arrived now fits), but the model's latest thinking was signed
/// after the truncated form: the record's form goes again, not the client's bytes, and
/// `x-context-actions` says `repeated`.
#[tokio::test]
async fn when_nothing_is_planned_the_recorded_form_goes() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let memory = memory_store();
    let server = proxy_with(&mock, memory, |c| {
        c.context
            .model_windows
            .insert(MODEL.into(), WindowEntry::Window(30_000));
        c.context.tool_result_max_tokens = 8_000;
        c.context.keep_recent_messages = 4;
    })
    .await;
    script(&mock, 3);
    let mut session = Session::new();
    let result = |t| lines(t, 300);
    session.body["max_tokens"] = json!(20_000);
    let mut turns = Vec::new();
    for k in 0..2 {
        turns.push(session.send_with(server.addr(), k, "Next.", result).await);
    }
    assert!(turns[1].actions.contains("truncated"), "{turns:#?}");
    session.body["max_tokens"] = json!(2_000);
    let turn = session.send_with(server.addr(), 2, "Next.", result).await;
    let sent = forwarded(&mock);
    let (before, now) = (bound_hashes(&sent[1]), bound_hashes(&sent[2]));
    assert_eq!(&now[..before.len()], &before[..], "{turn:?}");
    // Not the client's bytes, and no change of its own: said so.
    assert_eq!(turn.actions, "repeated");
    all_accepted(&mock);
}

/// At a turn boundary the upstream says the prompt is too long: the proxy learns the limit and
/// retries with a cut (allowed there, the thinking after it removed). The answer is signed
/// after the retried form, so the next request repeats that form, not the first attempt's.
#[tokio::test]
async fn an_overflow_retry_is_what_the_next_request_repeats() {
    let mock = MockUpstream::start(MockConfig {
        context_limit: Some(9_500),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let memory = memory_store();
    let server = proxy(&mock, memory, 200_000).await;
    let rounds = 6;
    for r in 0..rounds {
        mock.push(Reply::tool_calls(vec![(
            "Read".into(),
            json!({"file_path": format!("/repo/src/f{r}.rs")}),
        )]));
    }
    mock.push(Reply::text("They add numbers."));
    mock.push(Reply::tool_calls(vec![(
        "Read".into(),
        json!({"file_path": "/repo/tests/a.rs"}),
    )]));
    mock.push(Reply::text("The tests pass."));
    let mut session = Session::new();
    let result = |t| lines(t, 40);
    let prompt = format!("Now the tests. {}", "Consider this case too. ".repeat(400));
    let mut turns = Vec::new();
    for k in 0..=rounds {
        turns.push(session.send_with(server.addr(), k, &prompt, result).await);
    }
    assert_eq!(forwarded(&mock).len(), rounds + 1, "{turns:#?}");
    // The turn boundary: refused as too long, then retried with a cut.
    let boundary = session
        .send_with(server.addr(), rounds + 1, "Next.", result)
        .await;
    let sent = forwarded(&mock);
    assert_eq!(sent.len(), rounds + 3, "{boundary:?}");
    let retried = &sent[rounds + 2];
    assert!(
        retried.to_string().len() < sent[rounds + 1].to_string().len(),
        "{boundary:?}"
    );
    // The next request, inside the tool loop, begins with the retried form.
    let next = session
        .send_with(server.addr(), rounds + 2, "Next.", result)
        .await;
    let sent = forwarded(&mock);
    assert_eq!(sent.len(), rounds + 4, "{next:?}");
    let (before, now) = (bound_hashes(retried), bound_hashes(&sent[rounds + 3]));
    assert_eq!(&now[..before.len()], &before[..], "{next:?}");
    all_accepted(&mock);
}

/// The messages `body` holds.
fn messages(body: &Value) -> &Vec<Value> {
    body["messages"].as_array().unwrap()
}

/// Rewinds in an edited conversation: a client retries from an earlier point inside a tool
/// loop (a prefix of what the record covers); then, as Claude Code's Esc Esc, goes back to
/// its second prompt and says something else, goes on along that branch (its results
/// truncated too), then comes back to the first branch and goes on there. Each request sends
/// the record's form of the messages it kept (the proxy's truncations repeated), every one is
/// accepted by the strict mock (before, the retry's earlier results went whole: "bound to a
/// different conversation"), and the branch left is found again.
#[tokio::test]
async fn a_rewind_then_a_new_branch_then_a_rewind_back_are_all_accepted() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let memory = memory_store();
    let server = proxy(&mock, memory, 60_000).await;
    let rounds = 3;
    let read = |name: &str| Reply::tool_calls(vec![("Read".into(), json!({"file_path": name}))]);
    // Branch A: the first prompt's rounds, its answer, the second prompt's rounds.
    script(&mock, rounds);
    let mut session = Session::new();
    let mut turns = Vec::new();
    let mut before_second_prompt = None;
    for k in 0..2 * rounds + 1 {
        if k == rounds + 1 {
            before_second_prompt = Some(session.body.clone());
        }
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    let branch_a = session.body.clone();
    let a_sent = forwarded(&mock);
    let a_last = a_sent.last().unwrap().clone();
    // A retry from the second prompt's second result: fewer messages than the record covers.
    let mut retried = branch_a.clone();
    let upto = 4 * rounds - 1;
    retried["messages"].as_array_mut().unwrap().truncate(upto);
    session.body = retried;
    mock.push(read("/repo/src/again.rs"));
    turns.push(session.send(server.addr(), 30, "Thanks.").await);
    let retry = forwarded(&mock).last().unwrap().clone();
    assert_eq!(
        bound_hashes(&retry)[..],
        bound_hashes(&a_last)[..upto],
        "the retry repeats the record's form of what it kept"
    );
    assert_ne!(retry["messages"][4], branch_a["messages"][4]);
    // Rewound to the second prompt, which now says something else.
    let mut rewound = before_second_prompt.unwrap();
    let last = rewound["messages"]
        .as_array_mut()
        .unwrap()
        .last_mut()
        .unwrap();
    last["content"][0]["text"] = json!("Now the docs.");
    session.body = rewound;
    for r in 0..rounds {
        mock.push(read(&format!("/repo/docs/d{r}.md")));
    }
    mock.push(Reply::text("The docs are fine."));
    let first_b = a_sent.len() + 1;
    for k in 0..=rounds {
        turns.push(session.send(server.addr(), 10 + k, "Thanks.").await);
    }
    // The rewind's request: the second prompt's branch point in the form A forwarded.
    let sent = forwarded(&mock);
    let kept = rounds + 2;
    assert_eq!(
        bound_hashes(&sent[first_b])[..kept],
        bound_hashes(&a_sent[rounds + 1])[..kept],
        "the rewind repeats the truncations before it"
    );
    assert!(
        messages(&sent[first_b]).len() < messages(&a_last).len(),
        "{}",
        sent[first_b]
    );
    // Back to branch A, which goes on.
    session.body = branch_a;
    mock.push(Reply::text("The tests pass."));
    let back = session.send(server.addr(), 20, "Thanks.").await;
    let sent = forwarded(&mock);
    let back_sent = sent.last().unwrap();
    let before = bound_hashes(&a_last);
    assert_eq!(
        bound_hashes(back_sent)[..before.len()],
        before[..],
        "{back:?}: branch A's form"
    );
    turns.push(back);
    all_accepted(&mock);
    let truncated = turns
        .iter()
        .filter(|t| t.actions.contains("truncated"))
        .count();
    assert!(truncated >= 2 * rounds, "{turns:#?}");
}

/// `x-context-mode: off` on one request of an edited conversation: the client's bytes would be
/// refused (its thinking was signed after the proxy's truncations), so the form forwarded
/// before goes, nothing new changed (the request's new result whole), and
/// `x-context-actions: off,repeated` says so; the strict mock accepts it.
#[tokio::test]
async fn mode_off_on_an_edited_conversation_repeats_the_recorded_form() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let memory = memory_store();
    let server = proxy(&mock, memory, 60_000).await;
    script(&mock, 6);
    let mut session = Session::new();
    let mut turns = Vec::new();
    for k in 0..3 {
        turns.push(session.send(server.addr(), k, "Now the tests.").await);
    }
    assert!(turns[1].actions.contains("truncated"), "{turns:#?}");
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/messages?beta=true", server.addr()))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", BETAS)
        .header("x-claude-code-session-id", "bound-1")
        .header("x-context-mode", "off")
        .json(&session.body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let actions = resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!((status, actions.as_str()), (200, "off,repeated"));
    let sent = forwarded(&mock);
    let (before, now) = (bound_hashes(&sent[2]), bound_hashes(&sent[3]));
    assert_eq!(now[..before.len()], before[..], "the recorded form");
    let last = messages(&sent[3]).last().unwrap();
    assert_eq!(
        last["content"][0]["content"],
        file(2),
        "nothing new changed"
    );
    all_accepted(&mock);
}
