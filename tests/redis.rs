//! The redis store when Redis fails: every call fails within its timeout (no hang) while the
//! server is away, and works again once it is back, without reopening the store; a store opened
//! while Redis is down opens anyway, its ping fails until Redis starts, then succeeds; a proxy
//! started while Redis is down serves requests and reports not ready (`/readyz` 503) until
//! Redis starts. Each test
//! runs its own `redis-server` on a free port (`REDIS_URL` is not used: these tests kill it).

mod common;

use std::time::{Duration, Instant};

use common::redis::RedisServer;
use context_proxy::store::{
    open, Backend, ContentKind, SessionId, StateKey, Store, StoreConfig, StoreError, Tenant,
};

/// The store's `op_timeout_ms` in these tests; a failing call must return well within it.
const OP_TIMEOUT_MS: u64 = 1_500;
/// Longest a test waits for the store to reconnect after Redis is back.
const PATIENCE: Duration = Duration::from_secs(20);

fn config(url: String) -> StoreConfig {
    StoreConfig {
        backend: Backend::Redis,
        redis_url: url,
        redis_connect_timeout_ms: 500,
        redis_response_timeout_ms: 1_000,
        op_timeout_ms: OP_TIMEOUT_MS,
        ..StoreConfig::default()
    }
}

fn ids() -> (Tenant, SessionId, StateKey) {
    (
        Tenant::from_api_key(Some("sk-fault")),
        SessionId::parse("s").unwrap(),
        StateKey::parse("k").unwrap(),
    )
}

/// Runs every kind of call once; all must fail, each within the op timeout.
async fn assert_every_call_fails_in_time(store: &dyn Store) {
    let (t, s, k) = ids();
    let r = context_proxy::store::ContentRef::of("x");
    let started = Instant::now();
    let limit = Duration::from_millis(OP_TIMEOUT_MS + 500);
    macro_rules! fails {
        ($call:expr) => {{
            let at = Instant::now();
            let result = $call.await;
            assert!(
                result.is_err(),
                "{} succeeded with Redis down",
                stringify!($call)
            );
            assert!(
                at.elapsed() < limit,
                "{} took {:?}",
                stringify!($call),
                at.elapsed()
            );
            result.err().unwrap()
        }};
    }
    let err: StoreError = fails!(store.put_content(&t, &s, ContentKind::ToolResult, "x"));
    assert!(
        matches!(err, StoreError::Redis { .. } | StoreError::Timeout { .. }),
        "{err}"
    );
    fails!(store.get_content(&t, &r));
    fails!(store.append_log(&t, &s, &serde_json::json!({})));
    fails!(store.read_log(&t, &s));
    fails!(store.put_state(&t, &s, &k, b"v"));
    fails!(store.get_state(&t, &s, &k));
    fails!(store.compare_and_set_state(&t, &s, &k, None, b"v"));
    fails!(store.try_lock(&t, &s, &k, "h", Duration::from_secs(1)));
    fails!(store.unlock(&t, &s, &k, "h"));
    fails!(store.ping());
    assert!(started.elapsed() < 10 * limit);
}

/// Polls `ping` until it succeeds (the store reconnecting by itself), within [`PATIENCE`].
async fn wait_until_ready(store: &dyn Store) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match store.ping().await {
            Ok(()) => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the store did not reconnect within {PATIENCE:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_store_works(store: &dyn Store, content: &str) {
    let (t, s, k) = ids();
    let r = store
        .put_content(&t, &s, ContentKind::ToolResult, content)
        .await
        .unwrap();
    assert_eq!(
        store.get_content(&t, &r).await.unwrap().as_deref(),
        Some(content)
    );
    store
        .put_state(&t, &s, &k, content.as_bytes())
        .await
        .unwrap();
    store
        .append_log(&t, &s, &serde_json::json!({"c": content}))
        .await
        .unwrap();
}

#[tokio::test]
async fn calls_fail_fast_while_redis_is_away_and_work_again_when_it_is_back() {
    let mut server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let store = open(&config(server.url())).await.unwrap();
    store.ping().await.unwrap();
    assert_store_works(&*store, "before").await;

    server = tokio::task::spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();
    assert_every_call_fails_in_time(&*store).await;
    // Failing twice is the same: no call waits on the first failure.
    assert_every_call_fails_in_time(&*store).await;

    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    wait_until_ready(&*store).await;
    // A fresh server (no persistence): what was stored before is gone, the store works.
    assert_store_works(&*store, "after").await;
    let (t, _, _) = ids();
    let before = context_proxy::store::ContentRef::of("before");
    assert_eq!(store.get_content(&t, &before).await.unwrap(), None);
    drop(server);
}

#[tokio::test]
async fn a_store_opened_while_redis_is_down_opens_and_connects_when_redis_starts() {
    let port = RedisServer::free_port();
    let store = open(&config(format!("redis://127.0.0.1:{port}")))
        .await
        .expect("opening must not need Redis");
    assert!(store.ping().await.is_err());
    assert_every_call_fails_in_time(&*store).await;

    let server = tokio::task::spawn_blocking(move || RedisServer::start_on(port))
        .await
        .unwrap();
    wait_until_ready(&*store).await;
    assert_store_works(&*store, "late start").await;
    drop(server);
}

#[tokio::test]
async fn a_store_on_a_cluster_that_is_down_opens_too() {
    let ports = [RedisServer::free_port(), RedisServer::free_port()];
    let cfg = StoreConfig {
        redis_cluster_nodes: ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect(),
        ..config(String::new())
    };
    let store = open(&cfg).await.expect("opening must not need Redis");
    assert!(store.ping().await.is_err());
}

#[tokio::test]
async fn a_proxy_started_while_redis_is_down_serves_and_becomes_ready_when_redis_starts() {
    let port = RedisServer::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let h = common::Harness::start_with(context_proxy::mock::MockConfig::default(), |c| {
        c.store = config(url);
    })
    .await;
    let readyz = || async {
        h.client
            .get(h.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(readyz().await, 503);
    assert_eq!(
        h.client
            .get(h.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Requests are served all the same (fail-open), forwarded as they came.
    let body = serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "hello"}
    ]})
    .to_string();
    assert_eq!(h.chat_raw(body).await.status(), 200);

    let server = tokio::task::spawn_blocking(move || RedisServer::start_on(port))
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while readyz().await != 200 {
        assert!(Instant::now() < deadline, "/readyz never became 200");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(server);
}

/// A conversation with two large tool results the proxy compacts.
fn compactable() -> serde_json::Value {
    let lines = |name: &str, n: usize| -> String {
        (1..=n)
            .map(|i| format!("{name} line {i}: let value_{i} = compute({i}) * 2;\n"))
            .collect()
    };
    serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": lines("a.rs", 600)},
        {"role": "tool", "tool_call_id": "call_b", "content": lines("b.rs", 400)},
        {"role": "assistant", "content": "Both files define values."},
        {"role": "user", "content": "Now summarize them."}
    ]})
}

/// The references the last forwarded request's messages point to.
fn forwarded_refs(h: &common::Harness) -> Vec<context_proxy::store::ContentRef> {
    let text = h.mock.received().last().unwrap().json()["messages"].to_string();
    let mut refs: Vec<_> = text
        .match_indices("ctx_")
        .filter_map(|(at, _)| context_proxy::store::ContentRef::parse(text.get(at..at + 28)?).ok())
        .collect();
    refs.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    refs.dedup();
    refs
}

/// A proxy on the Redis at `url` that compacts `compactable()` and stores its content again
/// only once an hour (so what a request finds lost is found by the check before forwarding).
async fn compacting_on(url: String) -> common::Harness {
    common::Harness::start_with(context_proxy::mock::MockConfig::default(), |c| {
        c.store = config(url);
        c.store.content_refresh_secs = 3600;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await
}

/// Redis flushed (or restarted empty, or evicting) under a running proxy: the next request
/// writes what it points to again before it goes out, long before `content_refresh_secs`.
#[tokio::test]
async fn content_flushed_from_redis_is_written_again_before_forwarding() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let h = compacting_on(url.clone()).await;
    let store = open(&config(url.clone())).await.unwrap();
    let tenant = Tenant::from_api_key(Some("sk-test-client"));
    for round in 0..2 {
        let resp = h.chat(&compactable()).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-context-actions"],
            "compacted=2",
            "round {round}"
        );
        let refs = forwarded_refs(&h);
        assert_eq!(refs.len(), 2, "round {round}");
        assert_eq!(
            store.contains_content(&tenant, &refs).await.unwrap(),
            [true, true],
            "round {round}: the forwarded markers point to nothing"
        );
        let mut conn = ::redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = ::redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    drop(server);
}

/// With Redis down, content written moments ago cannot be checked: the request goes out as
/// the client sent it rather than with markers that may point at nothing.
#[tokio::test]
async fn with_redis_down_recently_written_refs_are_not_forwarded() {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let url = server.url();
    let h = compacting_on(url.clone()).await;
    let resp = h.chat(&compactable()).await;
    assert_eq!(resp.headers()["x-context-actions"], "compacted=2");
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.kill();
        server
    })
    .await
    .unwrap();
    let resp = h.chat(&compactable()).await;
    assert_eq!(resp.status(), 200);
    let forwarded = h.mock.received().last().unwrap().json();
    assert_eq!(forwarded, compactable(), "{:?}", resp.headers());
    drop(server);
}

/// A Redis that accepts connections and never answers: a request's store calls together wait
/// at most `op_timeout_ms`, then it is served as it came — not delayed once per store call.
#[tokio::test]
async fn a_hung_redis_delays_a_request_by_one_timeout_not_one_per_call() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            // Held open, never read from nor answered.
            if held_tx.send(conn).is_err() {
                break;
            }
        }
    });
    let h = common::Harness::start_with(context_proxy::mock::MockConfig::default(), |c| {
        c.store = config(format!("redis://{addr}"));
        c.store.op_timeout_ms = OP_TIMEOUT_MS;
        c.store.redis_connect_timeout_ms = 4 * OP_TIMEOUT_MS;
        c.store.redis_response_timeout_ms = 4 * OP_TIMEOUT_MS;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let started = Instant::now();
    let resp = h.chat(&compactable()).await;
    let elapsed = started.elapsed();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.mock.received().last().unwrap().json(), compactable());
    // It would take three timeouts without the shared budget (the hidden calls, the decision,
    // the write); one, and room for a loaded machine, with it.
    assert!(
        elapsed < Duration::from_millis(2 * OP_TIMEOUT_MS),
        "the request waited {elapsed:?} on a hung store"
    );
    held_rx.close();
}
