//! What is particular to the redis backend: the key layout, expiry kept by the server (set and
//! refreshed on every write and read), locks expiring on the server, corrupt values reported.
//! Faults (Redis going away and coming back) are tested in `tests/redis.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Commands;

use super::test_server::TestRedis;
use super::*;
use crate::store::{open, Backend};

const DAY_SECS: i64 = 86_400;
/// Longest wait for the server to expire a key (it checks expired keys about every 100 ms, and
/// always on access).
const PATIENCE: Duration = Duration::from_secs(10);

async fn store(redis: &TestRedis, retention_days: u64) -> Arc<dyn Store> {
    let cfg = StoreConfig {
        backend: Backend::Redis,
        redis_url: redis.url.clone(),
        redis_key_prefix: redis.prefix.clone(),
        retention_days,
        ..StoreConfig::default()
    };
    open(&cfg).await.unwrap()
}

fn ids() -> (Tenant, SessionId, StateKey) {
    (
        Tenant::from_api_key(Some("sk-redis")),
        SessionId::parse("s1").unwrap(),
        StateKey::parse("k").unwrap(),
    )
}

#[tokio::test]
async fn keys_are_prefixed_and_hash_tagged_by_tenant() {
    let redis = TestRedis::start();
    let store = store(&redis, 30).await;
    let (t, s, k) = ids();
    let r = store
        .put_content(&t, &s, ContentKind::ToolResult, "content")
        .await
        .unwrap();
    store
        .append_log(&t, &s, &serde_json::json!({}))
        .await
        .unwrap();
    store.put_state(&t, &s, &k, b"v").await.unwrap();
    assert!(store
        .try_lock(&t, &s, &k, "holder", Duration::from_secs(60))
        .await
        .unwrap());
    let p = &redis.prefix;
    let mut keys = redis.keys();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("{p}:{{{t}}}:c:{r}"),
            format!("{p}:{{{t}}}:k:s1:k"),
            format!("{p}:{{{t}}}:l:s1"),
            format!("{p}:{{{t}}}:s:s1:k"),
        ]
    );
    let mut conn = redis.connection();
    let holder: String = conn.get(format!("{p}:{{{t}}}:k:s1:k")).unwrap();
    assert_eq!(holder, "holder");
    let stored: Vec<u8> = conn.get(format!("{p}:{{{t}}}:c:{r}")).unwrap();
    assert_eq!(stored, b"content");
}

#[tokio::test]
async fn every_key_expires_after_the_retention_and_reading_refreshes_it() {
    let redis = TestRedis::start();
    let store = store(&redis, 7).await;
    let (t, s, k) = ids();
    let r = store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    store
        .append_log(&t, &s, &serde_json::json!({}))
        .await
        .unwrap();
    store.put_state(&t, &s, &k, b"v").await.unwrap();
    let mut conn = redis.connection();
    let keys = redis.keys();
    assert_eq!(keys.len(), 3);
    let retention = 7 * DAY_SECS;
    for key in &keys {
        let ttl: i64 = conn.ttl(key).unwrap();
        assert!((retention - 5..=retention).contains(&ttl), "{key}: {ttl}");
        // As if days had passed.
        let _: bool = conn.expire(key, 100).unwrap();
    }
    assert!(store.get_content(&t, &r).await.unwrap().is_some());
    assert_eq!(store.read_log(&t, &s).await.unwrap().len(), 1);
    assert!(store.get_state(&t, &s, &k).await.unwrap().is_some());
    for key in &keys {
        let ttl: i64 = conn.ttl(key).unwrap();
        assert!((retention - 5..=retention).contains(&ttl), "{key}: {ttl}");
        let _: bool = conn.expire(key, 100).unwrap();
    }
    // Writing again refreshes too: the same content, a journal line, compare-and-set.
    store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    store
        .append_log(&t, &s, &serde_json::json!({}))
        .await
        .unwrap();
    assert!(store
        .compare_and_set_state(&t, &s, &k, Some(b"v"), b"w")
        .await
        .unwrap());
    for key in &keys {
        let ttl: i64 = conn.ttl(key).unwrap();
        assert!((retention - 5..=retention).contains(&ttl), "{key}: {ttl}");
    }
}

#[tokio::test]
async fn what_the_server_expired_is_gone() {
    let redis = TestRedis::start();
    let store = store(&redis, 30).await;
    let (t, s, k) = ids();
    let r = store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    store
        .append_log(&t, &s, &serde_json::json!({}))
        .await
        .unwrap();
    store.put_state(&t, &s, &k, b"v").await.unwrap();
    let mut conn = redis.connection();
    for key in redis.keys() {
        let _: bool = conn.pexpire(&key, 1).unwrap();
    }
    let deadline = Instant::now() + PATIENCE;
    while !redis.keys().is_empty() {
        assert!(Instant::now() < deadline, "keys left: {:?}", redis.keys());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.get_content(&t, &r).await.unwrap(), None);
    assert!(store.read_log(&t, &s).await.unwrap().is_empty());
    assert_eq!(store.get_state(&t, &s, &k).await.unwrap(), None);
    // Stored again from scratch.
    store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    assert_eq!(
        store.get_content(&t, &r).await.unwrap().as_deref(),
        Some("x")
    );
}

#[tokio::test]
async fn a_lock_expires_on_the_server() {
    let redis = TestRedis::start();
    let store = store(&redis, 30).await;
    let (t, s, name) = ids();
    let ttl = Duration::from_millis(100);
    let taken = Instant::now();
    assert!(store.try_lock(&t, &s, &name, "a", ttl).await.unwrap());
    let mut conn = redis.connection();
    let pttl: i64 = conn
        .pttl(format!("{}:{{{t}}}:k:s1:k", redis.prefix))
        .unwrap();
    assert!((1..=100).contains(&pttl), "{pttl}");
    // Poll until b gets it: never before the ttl, and soon after.
    let deadline = Instant::now() + PATIENCE;
    while !store.try_lock(&t, &s, &name, "b", ttl).await.unwrap() {
        assert!(Instant::now() < deadline, "the lock never expired");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(taken.elapsed() >= ttl, "{:?}", taken.elapsed());
    // A lock of a huge ttl is accepted (capped) and never expires in the test.
    assert!(store
        .try_lock(
            &t,
            &s,
            &StateKey::parse("long").unwrap(),
            "a",
            Duration::MAX
        )
        .await
        .unwrap());
}

#[tokio::test]
async fn content_changed_in_redis_is_reported_not_served() {
    let redis = TestRedis::start();
    let store = store(&redis, 30).await;
    let (t, s, _) = ids();
    let r = store
        .put_content(&t, &s, ContentKind::ToolResult, "original")
        .await
        .unwrap();
    let mut conn = redis.connection();
    let key = format!("{}:{{{t}}}:c:{r}", redis.prefix);
    let _: () = conn.set(&key, "edited").unwrap();
    let err = store.get_content(&t, &r).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let _: () = conn.set(&key, b"\xff\xfe".as_slice()).unwrap();
    assert!(store.get_content(&t, &r).await.is_err());
}
