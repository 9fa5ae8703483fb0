//! Two proxy replicas sharing one Redis: a conversation compacted through replica A continues
//! through replica B, which reuses A's decision (the upstream sees byte-identical earlier
//! messages, and the decision is recorded once), and what A offloaded is readable from the
//! shared store.

mod common;

use common::redis::TestRedis;
use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, MockUpstream};
use context_proxy::store::{Backend, ContentRef, SessionId, StoreConfig, Tenant};
use serde_json::{json, Value};

const API_KEY: &str = "sk-replicas";
const SESSION: &str = "shared-conversation";
/// The admin token of the replicas with the page.
const ADMIN: &str = "admin-replicas";

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2; // 日本語 ✓\n"))
        .collect()
}

/// A coding-agent conversation: two large file reads, then a question.
fn conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read both files."}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"b.rs\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "call_a", "content": numbered_lines("a.rs", 600)}),
        json!({"role": "tool", "tool_call_id": "call_b", "content": numbered_lines("b.rs", 400)}),
        json!({"role": "assistant", "content": "Both files define compute-based values."}),
        json!({"role": "user", "content": "Now summarize them."}),
    ]
}

fn store_config(redis: &TestRedis) -> StoreConfig {
    StoreConfig {
        backend: Backend::Redis,
        redis_url: redis.url.clone(),
        redis_key_prefix: redis.prefix.clone(),
        ..StoreConfig::default()
    }
}

async fn replica(mock: &MockUpstream, redis: &TestRedis) -> RunningServer {
    let mut config: Config = common::config_for(&mock.base_url());
    config.store = store_config(redis);
    config.context.keep_recent_messages = 2;
    config.context.compact_batch_tokens = 1000;
    RunningServer::start(config.validate().unwrap())
        .await
        .unwrap()
}

async fn chat(proxy: &RunningServer, messages: &[Value]) -> reqwest::Response {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("x-context-session", SESSION)
        .json(&json!({"model": "gpt-4o", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

fn actions(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-context-actions")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_conversation_moves_between_replicas_and_keeps_its_prefix() {
    let redis = tokio::task::spawn_blocking(TestRedis::start).await.unwrap();
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let a = replica(&mock, &redis).await;
    let b = replica(&mock, &redis).await;

    let mut messages = conversation();
    let first = chat(&a, &messages).await;
    assert_eq!(actions(&first), "compacted=2");
    messages.push(json!({"role": "assistant", "content": "Summary: two modules."}));
    messages.push(json!({"role": "user", "content": "Thanks. Anything else?"}));
    chat(&b, &messages).await;

    let received = mock.received();
    assert_eq!(received.len(), 2);
    let through_a = received[0].json()["messages"].as_array().unwrap().clone();
    let through_b = received[1].json()["messages"].as_array().unwrap().clone();
    // B forwarded exactly the bytes A forwarded, then the new turn.
    let a_bytes: Vec<String> = through_a.iter().map(Value::to_string).collect();
    let b_bytes: Vec<String> = through_b[..through_a.len()]
        .iter()
        .map(Value::to_string)
        .collect();
    assert_eq!(a_bytes, b_bytes);
    assert_eq!(through_b.len(), messages.len());

    // One store on the same Redis and prefix sees what A did: the decision recorded once (B
    // reused it rather than deciding again), the offloaded results byte-exact.
    let store = context_proxy::store::open(&store_config(&redis))
        .await
        .unwrap();
    let tenant = Tenant::from_api_key(Some(API_KEY));
    let session = SessionId::parse(SESSION).unwrap();
    let journal = store.read_log(&tenant, &session).await.unwrap();
    let decisions = journal.iter().filter(|r| r["event"] == "decision").count();
    assert_eq!(decisions, 1, "{journal:?}");
    for i in [3, 4] {
        let text = through_a[i]["content"].as_str().unwrap();
        let at = text.find("ctx_").unwrap();
        let reference: ContentRef = text[at..at + 28].parse().unwrap();
        let stored = store.get_content(&tenant, &reference).await.unwrap();
        assert_eq!(stored.as_deref(), messages[i]["content"].as_str());
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A replica with the page on, whose journal lines wait (an hour) until something reads them.
async fn page_replica(mock: &MockUpstream, redis: &TestRedis) -> RunningServer {
    let mut config: Config = common::config_for(&mock.base_url());
    config.store = store_config(redis);
    config.ui.enabled = true;
    config.ui.journal_flush_ms = 60_000;
    std::env::set_var("CP_REPLICAS_ADMIN", ADMIN);
    config.auth.admin_token_env = Some("CP_REPLICAS_ADMIN".into());
    RunningServer::start(config.validate().unwrap())
        .await
        .unwrap()
}

/// A short conversation of `session`, its turn `n`.
async fn page_turn(proxy: &RunningServer, session: &str, n: usize) {
    let messages = [
        json!({"role": "user", "content": format!("Hello from {session}.")}),
        json!({"role": "assistant", "content": "Hi."}),
        json!({"role": "user", "content": format!("Turn {n}.")}),
    ];
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("x-context-session", session)
        .json(&json!({"model": "gpt-4o", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
}

/// Has the replica's journal writer write what waits (opening the page does).
async fn open_page(proxy: &RunningServer) {
    let resp = reqwest::Client::new()
        .get(format!("http://{}/ui/", proxy.addr()))
        .header("authorization", format!("Bearer {ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Two replicas each hold a line of the same new sessions, then write them at once: both
/// may build a session's first summary from the journal, which holds both lines. Each
/// summary counts every line of its journal once (the summary numbers the records it sums).
#[tokio::test]
async fn the_pages_summaries_count_each_line_once_across_replicas() {
    let redis = tokio::task::spawn_blocking(TestRedis::start).await.unwrap();
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let a = page_replica(&mock, &redis).await;
    let b = page_replica(&mock, &redis).await;
    let sessions: Vec<String> = (0..12).map(|i| format!("page-{i}")).collect();
    for (i, session) in sessions.iter().enumerate() {
        page_turn(&a, session, 2 * i).await;
        page_turn(&b, session, 2 * i + 1).await;
    }
    tokio::join!(open_page(&a), open_page(&b));
    let store = context_proxy::store::open(&store_config(&redis))
        .await
        .unwrap();
    let tenant = Tenant::from_api_key(Some(API_KEY));
    let terms = context_proxy::pricing::PRESETS[0].1;
    let pricing = move |_: &str, _: Option<&str>| terms;
    for session in &sessions {
        let session = SessionId::parse(session).unwrap();
        let journal = store.read_log(&tenant, &session).await.unwrap();
        assert_eq!(journal.len(), 2, "{journal:?}");
        let kept =
            context_proxy::sessions::journal::summary(store.as_ref(), &tenant, &session, &pricing)
                .await
                .unwrap();
        assert_eq!(
            (kept.totals.turns, kept.records),
            (2, Some(2)),
            "{session:?}: {kept:?}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A line queued on one replica when another erases its session does not bring the session
/// back: the erasure leaves a tombstone the writer's append checks. A request after the
/// erasure starts the session again.
#[tokio::test]
async fn an_erasure_on_one_replica_drops_the_lines_queued_on_another() {
    let redis = tokio::task::spawn_blocking(TestRedis::start).await.unwrap();
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let a = page_replica(&mock, &redis).await;
    let b = page_replica(&mock, &redis).await;
    page_turn(&a, "erased", 1).await;
    open_page(&a).await;
    // The second line waits in A when B erases the session.
    page_turn(&a, "erased", 2).await;
    let tenant = Tenant::from_api_key(Some(API_KEY));
    let resp = reqwest::Client::new()
        .delete(format!(
            "http://{}/v1/context/sessions/erased?tenant={tenant}",
            b.addr()
        ))
        .header("authorization", format!("Bearer {ADMIN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    open_page(&a).await;
    let store = context_proxy::store::open(&store_config(&redis))
        .await
        .unwrap();
    let session = SessionId::parse("erased").unwrap();
    assert!(store.read_log(&tenant, &session).await.unwrap().is_empty());
    assert!(store.list_sessions(Some(&tenant)).await.unwrap().is_empty());
    page_turn(&a, "erased", 3).await;
    open_page(&a).await;
    let journal = store.read_log(&tenant, &session).await.unwrap();
    assert_eq!(journal.len(), 1, "{journal:?}");
    a.shutdown().await;
    b.shutdown().await;
}
