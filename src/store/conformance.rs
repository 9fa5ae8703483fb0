//! The conformance suite: one set of tests every backend must pass, run against each one as
//! [`open_with_clock`] builds it (so through the timeout layer), with a [`ManualClock`] so that
//! retention is tested without sleeping. A new backend adds one `suite!` line.
//!
//! Redis measures time with its own clock, so the tests that move the clock (`clocked_suite!`)
//! run on memory and fs only; the redis module tests its server-side expiry itself. A subset
//! runs on a private three-node Redis Cluster too (`redis_cluster`).
//!
//! Backend-specific behaviour (the memory bound, the fs tree, crash leftovers, Redis faults) is
//! tested in the backend's own module.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use serde_json::json;

use super::redis::test_server::{unique_prefix, RedisCluster, TestRedis};
use super::{
    open_with_clock, Appended, Backend, ContentKind, ContentRef, LogLine, ManualClock, SessionId,
    StateKey, Store, StoreConfig, Tenant,
};

const DAY: Duration = Duration::from_secs(86_400);

/// A store under test, with its clock and what it lives in: a temporary directory (fs), a Redis
/// server or cluster (redis).
struct Harness {
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
    _redis: Option<TestRedis>,
    _cluster: Option<Arc<RedisCluster>>,
}

impl Harness {
    async fn memory() -> Harness {
        Harness::open(Backend::Memory, StoreConfig::default()).await
    }

    async fn fs() -> Harness {
        Harness::open(Backend::Fs, StoreConfig::default()).await
    }

    /// On `REDIS_URL`'s server or a private one, under a key prefix of its own.
    async fn redis() -> Harness {
        let redis = TestRedis::start();
        let cfg = StoreConfig {
            redis_url: redis.url.clone(),
            redis_key_prefix: redis.prefix.clone(),
            ..StoreConfig::default()
        };
        let mut h = Harness::open(Backend::Redis, cfg).await;
        h._redis = Some(redis);
        h
    }

    /// On a running private cluster, under a key prefix of its own.
    async fn redis_cluster(cluster: &Arc<RedisCluster>) -> Harness {
        let cfg = StoreConfig {
            redis_cluster_nodes: cluster.urls(),
            redis_key_prefix: unique_prefix(),
            ..StoreConfig::default()
        };
        let mut h = Harness::open(Backend::Redis, cfg).await;
        h._cluster = Some(Arc::clone(cluster));
        h
    }

    async fn open(backend: Backend, cfg: StoreConfig) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(SystemTime::now()));
        let cfg = StoreConfig {
            backend,
            path: dir.path().join("data"),
            op_timeout_ms: 30_000,
            ..cfg
        };
        let store = open_with_clock(&cfg, clock.clone()).await.unwrap();
        Harness {
            store,
            clock,
            _dir: dir,
            _redis: None,
            _cluster: None,
        }
    }
}

fn tenant(key: &str) -> Tenant {
    Tenant::from_api_key(Some(key))
}

fn session(id: &str) -> SessionId {
    SessionId::parse(id).unwrap()
}

fn key(k: &str) -> StateKey {
    StateKey::parse(k).unwrap()
}

macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            async fn harness() -> Harness {
                Harness::$backend().await
            }

            #[tokio::test]
            async fn round_trip_is_byte_exact() {
                super::round_trip_is_byte_exact(harness().await).await
            }
            #[tokio::test]
            async fn unusual_text_round_trips() {
                super::unusual_text_round_trips(harness().await).await
            }
            #[tokio::test]
            async fn same_content_has_the_same_ref() {
                super::same_content_has_the_same_ref(harness().await).await
            }
            #[tokio::test]
            async fn concurrent_writers_of_the_same_content_all_succeed() {
                super::concurrent_writers_of_the_same_content_all_succeed(harness().await).await
            }
            #[tokio::test]
            async fn tenants_are_isolated() {
                super::tenants_are_isolated(harness().await).await
            }
            #[tokio::test]
            async fn contains_content_answers_each_ref() {
                super::contains_content_answers_each_ref(harness().await).await
            }
            #[tokio::test]
            async fn what_was_never_stored_is_none() {
                super::what_was_never_stored_is_none(harness().await).await
            }
            #[tokio::test]
            async fn the_log_is_append_only_json_lines() {
                super::the_log_is_append_only_json_lines(harness().await).await
            }
            #[tokio::test]
            async fn a_batch_of_lines_appends_as_one_by_one() {
                super::a_batch_of_lines_appends_as_one_by_one(harness().await).await
            }
            #[tokio::test]
            async fn an_erased_session_refuses_lines_from_before_it() {
                super::an_erased_session_refuses_lines_from_before_it(harness().await).await
            }
            #[tokio::test]
            async fn a_batch_of_contents_is_stored_as_one_by_one() {
                super::a_batch_of_contents_is_stored_as_one_by_one(harness().await).await
            }
            #[tokio::test]
            async fn state_records_are_replaced_and_read_back() {
                super::state_records_are_replaced_and_read_back(harness().await).await
            }
            #[tokio::test]
            async fn compare_and_set_from_absent() {
                super::compare_and_set_from_absent(harness().await).await
            }
            #[tokio::test]
            async fn compare_and_set_with_a_wrong_expected_value_fails() {
                super::compare_and_set_with_a_wrong_expected_value_fails(harness().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn compare_and_set_under_contention_loses_nothing() {
                super::compare_and_set_under_contention_loses_nothing(harness().await).await
            }
            #[tokio::test]
            async fn a_lock_has_one_holder() {
                super::a_lock_has_one_holder(harness().await).await
            }
            #[tokio::test]
            async fn unlock_by_another_holder_does_nothing() {
                super::unlock_by_another_holder_does_nothing(harness().await).await
            }
            #[tokio::test]
            async fn ping_and_close() {
                super::ping_and_close(harness().await).await
            }
            #[tokio::test]
            async fn sessions_are_listed_and_erased() {
                super::sessions_are_listed_and_erased(harness().await, true).await
            }
            #[tokio::test]
            async fn sessions_keep_the_names_clients_give() {
                super::sessions_keep_the_names_clients_give(harness().await).await
            }
            #[test]
            fn arbitrary_strings_and_bytes_round_trip() {
                super::arbitrary_strings_and_bytes_round_trip(Harness::$backend)
            }
        }
    };
}

/// The tests that move the store's clock: for backends that measure time with it.
macro_rules! clocked_suite {
    ($backend:ident, $module:ident) => {
        mod $module {
            use super::*;

            async fn harness() -> Harness {
                Harness::$backend().await
            }

            #[tokio::test]
            async fn items_expire_after_the_retention_period() {
                super::items_expire_after_the_retention_period(harness().await).await
            }
            #[tokio::test]
            async fn reading_refreshes_retention() {
                super::reading_refreshes_retention(harness().await).await
            }
            #[tokio::test]
            async fn writing_again_refreshes_retention() {
                super::writing_again_refreshes_retention(harness().await).await
            }
            #[tokio::test]
            async fn compare_and_set_refreshes_retention() {
                super::compare_and_set_refreshes_retention(harness().await).await
            }
            #[tokio::test]
            async fn a_lock_expires_after_its_ttl() {
                super::a_lock_expires_after_its_ttl(harness().await).await
            }
        }
    };
}

suite!(memory);
suite!(fs);
suite!(redis);
clocked_suite!(memory, memory_clocked);
clocked_suite!(fs, fs_clocked);

/// A subset of the suite on a private Redis Cluster (three masters): every kind of item, the
/// scripts and the pipelines, each on keys of one tenant's slot. Fails, with the reason, when no
/// cluster can be started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(|| RedisCluster::start(3))
            .await
            .unwrap(),
    );
    round_trip_is_byte_exact(Harness::redis_cluster(&cluster).await).await;
    unusual_text_round_trips(Harness::redis_cluster(&cluster).await).await;
    concurrent_writers_of_the_same_content_all_succeed(Harness::redis_cluster(&cluster).await)
        .await;
    tenants_are_isolated(Harness::redis_cluster(&cluster).await).await;
    contains_content_answers_each_ref(Harness::redis_cluster(&cluster).await).await;
    sessions_are_listed_and_erased(Harness::redis_cluster(&cluster).await, true).await;
    sessions_keep_the_names_clients_give(Harness::redis_cluster(&cluster).await).await;
    the_log_is_append_only_json_lines(Harness::redis_cluster(&cluster).await).await;
    state_records_are_replaced_and_read_back(Harness::redis_cluster(&cluster).await).await;
    compare_and_set_from_absent(Harness::redis_cluster(&cluster).await).await;
    compare_and_set_under_contention_loses_nothing(Harness::redis_cluster(&cluster).await).await;
    a_lock_has_one_holder(Harness::redis_cluster(&cluster).await).await;
    unlock_by_another_holder_does_nothing(Harness::redis_cluster(&cluster).await).await;
    ping_and_close(Harness::redis_cluster(&cluster).await).await;
    // Many tenants: their keys spread over the cluster's slots, on every node.
    let h = Harness::redis_cluster(&cluster).await;
    for i in 0..64 {
        let t = tenant(&format!("sk-{i}"));
        let content = format!("tenant {i}");
        let r = h
            .store
            .put_content(&t, &session("s"), ContentKind::ToolResult, &content)
            .await
            .unwrap();
        assert_eq!(h.store.get_content(&t, &r).await.unwrap(), Some(content));
        h.store
            .append_log(&t, &session("s"), &json!({"refs": [r.as_str()]}))
            .await
            .unwrap();
    }
    // Every tenant's session is listed: the listing ran on every primary.
    let all = h.store.list_sessions(None).await.unwrap();
    assert_eq!(all.len(), 64, "{all:?}");
    for i in 0..64 {
        let t = tenant(&format!("sk-{i}"));
        assert!(all.contains(&(t, session("s"))), "tenant {i} not listed");
    }
    for node in &cluster.nodes {
        let mut conn = ::redis::Client::open(node.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: usize = ::redis::cmd("DBSIZE").query(&mut conn).unwrap();
        assert!(keys > 0, "node {} holds no key", node.url());
    }
}

async fn round_trip_is_byte_exact(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let megabyte = "ab\u{4e2d}\u{1f600}\n".repeat(110_000);
    assert!(megabyte.len() >= 1 << 20);
    let contents = [
        "",
        "plain text",
        "\u{4e2d}\u{6587}\u{5185}\u{5bb9}\u{ff0c}\u{65e5}\u{672c}\u{8a9e}\u{3001}\u{d55c}\u{ad6d}\u{c5b4}",
        "emoji \u{1f469}\u{200d}\u{1f4bb} \u{1f680}\u{1f3f3}\u{fe0f}\u{200d}\u{1f308}",
        "line\r\nendings\rand\ttabs\n\n",
        "nul \0 and \u{feff}BOM and \u{7f}",
        "  leading and trailing spaces  ",
        megabyte.as_str(),
    ];
    for (i, content) in contents.into_iter().enumerate() {
        let kind = ContentKind::ALL[i % ContentKind::ALL.len()];
        let r = h.store.put_content(&t, &s, kind, content).await.unwrap();
        assert_eq!(r, ContentRef::of(content));
        let back = h.store.get_content(&t, &r).await.unwrap();
        assert!(back.as_deref() == Some(content), "content {i} changed");
    }
}

async fn unusual_text_round_trips(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    // A character from every plane that has assigned ones, and the edges of the ranges.
    let planes: String = [
        '\u{0}',
        '\u{7f}',
        '\u{80}',
        '\u{7ff}',
        '\u{800}',
        '\u{d7ff}',
        '\u{e000}',
        '\u{fffd}',
        '\u{ffff}',
        '\u{10000}',
        '\u{1f600}',
        '\u{20000}',
        '\u{2a6d6}',
        '\u{30000}',
        '\u{e0001}',
        '\u{f0000}',
        '\u{10fffd}',
        '\u{10ffff}',
    ]
    .iter()
    .collect();
    let eight_megabytes = "\u{1f680}\u{4e2d}x\n".repeat(1 << 20);
    assert!(eight_megabytes.len() >= 8 << 20);
    let contents = [
        planes.as_str(),
        // Text that looks like invalid UTF-8 or escapes, but is valid text.
        "\u{fffd}\u{fffd} replacement characters",
        "\\xff\\xfe \\ud800 \\u0000 %ff %C3%28 lone escapes as text",
        "\"quoted\" 'single' `back` {braces} [brackets] {tenant}:c:ctx_",
        "\u{202e}right-to-left override\u{202c} \u{200b}zero width",
        eight_megabytes.as_str(),
    ];
    for content in contents {
        let r = h
            .store
            .put_content(&t, &s, ContentKind::ToolResult, content)
            .await
            .unwrap();
        let back = h.store.get_content(&t, &r).await.unwrap();
        assert!(
            back.as_deref() == Some(content),
            "{:?}",
            content.chars().take(20).collect::<String>()
        );
        let value = content.as_bytes();
        h.store.put_state(&t, &s, &key("v"), value).await.unwrap();
        let back = h.store.get_state(&t, &s, &key("v")).await.unwrap();
        assert!(back.as_deref() == Some(value));
    }
    // A record of the journal holding all of it.
    let record = json!({ "planes": planes, "escapes": contents[2] });
    h.store.append_log(&t, &s, &record).await.unwrap();
    assert_eq!(h.store.read_log(&t, &s).await.unwrap(), [record]);
}

async fn same_content_has_the_same_ref(h: Harness) {
    let t = tenant("k");
    let a = h
        .store
        .put_content(&t, &session("s1"), ContentKind::ToolResult, "same")
        .await
        .unwrap();
    let b = h
        .store
        .put_content(&t, &session("s2"), ContentKind::UserText, "same")
        .await
        .unwrap();
    let c = h
        .store
        .put_content(&t, &session("s1"), ContentKind::ToolResult, "other")
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(
        h.store.get_content(&t, &a).await.unwrap().as_deref(),
        Some("same")
    );
}

async fn concurrent_writers_of_the_same_content_all_succeed(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let content = "\u{540c}\u{65f6}\u{5199}\u{5165} ".repeat(20_000);
    let writes = (0..8).map(|i| {
        let kind = ContentKind::ALL[i % ContentKind::ALL.len()];
        h.store.put_content(&t, &s, kind, &content)
    });
    for result in futures_util::future::join_all(writes).await {
        assert_eq!(result.unwrap(), ContentRef::of(&content));
    }
    let back = h.store.get_content(&t, &ContentRef::of(&content)).await;
    assert!(back.unwrap().as_deref() == Some(content.as_str()));
}

/// Listing a tenant's (or every tenant's, with `all_tenants`) sessions, and erasing one:
/// its journal, state and the content named, nothing of another session or tenant.
async fn sessions_are_listed_and_erased(h: Harness, all_tenants: bool) {
    let (alice, bob) = (tenant("sk-alice"), tenant("sk-bob"));
    let (one, two) = (session("one"), session("two"));
    let store = &h.store;
    let r1 = store
        .put_content(
            &alice,
            &one,
            ContentKind::ToolResult,
            "first session's text",
        )
        .await
        .unwrap();
    store
        .append_log(&alice, &one, &json!({"refs": [r1.as_str()]}))
        .await
        .unwrap();
    store
        .put_state(&alice, &one, &key("decisions"), b"x")
        .await
        .unwrap();
    store
        .put_state(&alice, &one, &key("hidden"), b"y")
        .await
        .unwrap();
    let r2 = store
        .put_content(
            &alice,
            &two,
            ContentKind::ToolResult,
            "second session's text",
        )
        .await
        .unwrap();
    store
        .append_log(&alice, &two, &json!({"refs": [r2.as_str()]}))
        .await
        .unwrap();
    store
        .put_content(&bob, &one, ContentKind::ToolResult, "first session's text")
        .await
        .unwrap();
    store
        .append_log(&bob, &one, &json!({"who": "bob"}))
        .await
        .unwrap();

    let listed = store.list_sessions(Some(&alice)).await.unwrap();
    assert_eq!(
        listed,
        vec![(alice.clone(), one.clone()), (alice.clone(), two.clone())]
    );
    if all_tenants {
        let all = store.list_sessions(None).await.unwrap();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all.contains(&(bob.clone(), one.clone())));
    }

    let erased = store
        .erase_session(&alice, &one, std::slice::from_ref(&r1))
        .await
        .unwrap();
    assert!(erased >= 4, "{erased}");
    assert_eq!(store.get_content(&alice, &r1).await.unwrap(), None);
    assert!(store.read_log(&alice, &one).await.unwrap().is_empty());
    assert_eq!(
        store
            .get_state(&alice, &one, &key("decisions"))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.get_state(&alice, &one, &key("hidden")).await.unwrap(),
        None
    );
    assert_eq!(
        store.list_sessions(Some(&alice)).await.unwrap(),
        vec![(alice.clone(), two.clone())]
    );
    // The other session and the other tenant keep everything.
    assert!(store.get_content(&alice, &r2).await.unwrap().is_some());
    assert_eq!(store.read_log(&alice, &two).await.unwrap().len(), 1);
    assert!(store.get_content(&bob, &r1).await.unwrap().is_some());
    assert_eq!(store.read_log(&bob, &one).await.unwrap().len(), 1);
    // Erasing again finds nothing.
    assert_eq!(store.erase_session(&alice, &one, &[r1]).await.unwrap(), 0);
}

/// Session names as clients give them (capitals, spaces, separators of paths and keys, glob
/// characters, non-ASCII, what looks like an escape): each is its own session, listed under
/// its name, with its own content, journal, state and locks, and erased alone.
async fn sessions_keep_the_names_clients_give(h: Harness) {
    let t = tenant("sk-names");
    let names = [
        "My Session",
        "my session",
        "my%20session",
        "MY SESSION",
        "a/b",
        "a",
        "../../etc",
        "x:{y}:*",
        "[glob]?",
        "caf\u{e9} \u{1f680}",
        "_refs",
        ".hidden",
        "state",
    ];
    let store = &h.store;
    let mut refs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let s = session(name);
        assert_eq!(s.name(), *name);
        let text = format!("content of session {i}");
        let r = store
            .put_content(&t, &s, ContentKind::ToolResult, &text)
            .await
            .unwrap();
        store
            .append_log(&t, &s, &json!({"refs": [r.as_str()], "i": i}))
            .await
            .unwrap();
        store
            .put_state(&t, &s, &key("decisions"), i.to_string().as_bytes())
            .await
            .unwrap();
        assert!(store
            .try_lock(&t, &s, &key("summary"), "me", Duration::from_secs(60))
            .await
            .unwrap());
        refs.push(r);
    }
    let mut listed: Vec<String> = store
        .list_sessions(Some(&t))
        .await
        .unwrap()
        .into_iter()
        .map(|(_, s)| s.name().into_owned())
        .collect();
    listed.sort();
    let mut expected: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for (i, name) in names.iter().enumerate() {
        let s = session(name);
        let log = store.read_log(&t, &s).await.unwrap();
        assert_eq!(log.len(), 1, "{name:?}: {log:?}");
        assert_eq!(log[0]["i"], i, "{name:?}");
        assert_eq!(
            store.get_state(&t, &s, &key("decisions")).await.unwrap(),
            Some(i.to_string().into_bytes()),
            "{name:?}"
        );
        assert_eq!(
            store.get_content(&t, &refs[i]).await.unwrap(),
            Some(format!("content of session {i}"))
        );
    }
    // Erasing one name leaves the names that differ from it only in case or escaping.
    let gone = session("My Session");
    assert!(store.erase_session(&t, &gone, &refs[..1]).await.unwrap() >= 2);
    assert!(store.read_log(&t, &gone).await.unwrap().is_empty());
    for name in ["my session", "my%20session", "MY SESSION"] {
        assert_eq!(
            store.read_log(&t, &session(name)).await.unwrap().len(),
            1,
            "{name:?}"
        );
    }
    assert_eq!(
        store.list_sessions(Some(&t)).await.unwrap().len(),
        names.len() - 1
    );
}

async fn tenants_are_isolated(h: Harness) {
    let (alice, bob, anonymous) = (
        tenant("sk-alice"),
        tenant("sk-bob"),
        Tenant::from_api_key(None),
    );
    let s = session("shared-name");
    let r = h
        .store
        .put_content(&alice, &s, ContentKind::ToolResult, "alice's secret")
        .await
        .unwrap();
    h.store
        .append_log(&alice, &s, &json!({"who": "alice"}))
        .await
        .unwrap();
    h.store
        .put_state(&alice, &s, &key("k"), b"alice")
        .await
        .unwrap();
    for other in [&bob, &anonymous] {
        assert_eq!(h.store.get_content(other, &r).await.unwrap(), None);
        assert!(h.store.read_log(other, &s).await.unwrap().is_empty());
        assert_eq!(h.store.get_state(other, &s, &key("k")).await.unwrap(), None);
    }
    // Bob storing the same content gets the same ref, and his own copy.
    let rb = h
        .store
        .put_content(&bob, &s, ContentKind::ToolResult, "alice's secret")
        .await
        .unwrap();
    assert_eq!(rb, r);
    assert!(h.store.get_content(&bob, &r).await.unwrap().is_some());
    assert!(h.store.get_content(&anonymous, &r).await.unwrap().is_none());
}

async fn contains_content_answers_each_ref(h: Harness) {
    let (alice, bob, s) = (tenant("sk-alice"), tenant("sk-bob"), session("s"));
    assert!(h
        .store
        .contains_content(&alice, &[])
        .await
        .unwrap()
        .is_empty());
    let stored = h
        .store
        .put_content(&alice, &s, ContentKind::ToolResult, "kept")
        .await
        .unwrap();
    let never = ContentRef::of("never stored");
    let refs = [never.clone(), stored.clone(), never.clone(), stored.clone()];
    assert_eq!(
        h.store.contains_content(&alice, &refs).await.unwrap(),
        [false, true, false, true]
    );
    // Another tenant's content is not there for bob.
    assert_eq!(
        h.store.contains_content(&bob, &refs).await.unwrap(),
        [false; 4]
    );
    // Erased with its session: gone.
    h.store
        .erase_session(&alice, &s, std::slice::from_ref(&stored))
        .await
        .unwrap();
    assert_eq!(
        h.store.contains_content(&alice, &[stored]).await.unwrap(),
        [false]
    );
}

async fn what_was_never_stored_is_none(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let never = ContentRef::of("never stored");
    assert_eq!(h.store.get_content(&t, &never).await.unwrap(), None);
    assert_eq!(h.store.get_state(&t, &s, &key("k")).await.unwrap(), None);
    assert!(h.store.read_log(&t, &s).await.unwrap().is_empty());
}

async fn items_expire_after_the_retention_period(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let r = h
        .store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    h.store.append_log(&t, &s, &json!({"n": 1})).await.unwrap();
    h.store.put_state(&t, &s, &key("k"), b"v").await.unwrap();
    h.clock.advance(30 * DAY);
    assert_eq!(
        h.store
            .contains_content(&t, std::slice::from_ref(&r))
            .await
            .unwrap(),
        [false]
    );
    assert_eq!(h.store.get_content(&t, &r).await.unwrap(), None);
    assert!(h.store.read_log(&t, &s).await.unwrap().is_empty());
    assert_eq!(h.store.get_state(&t, &s, &key("k")).await.unwrap(), None);
    // An expired journal starts afresh rather than coming back to life.
    h.store.append_log(&t, &s, &json!({"n": 2})).await.unwrap();
    assert_eq!(h.store.read_log(&t, &s).await.unwrap(), [json!({"n": 2})]);
    // Expired content can be stored again.
    h.store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    assert_eq!(
        h.store.get_content(&t, &r).await.unwrap().as_deref(),
        Some("x")
    );
}

async fn reading_refreshes_retention(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let r = h
        .store
        .put_content(&t, &s, ContentKind::ToolResult, "x")
        .await
        .unwrap();
    h.store.append_log(&t, &s, &json!({"n": 1})).await.unwrap();
    h.store.put_state(&t, &s, &key("k"), b"v").await.unwrap();
    for _ in 0..3 {
        h.clock.advance(20 * DAY);
        assert!(h.store.get_content(&t, &r).await.unwrap().is_some());
        assert_eq!(h.store.read_log(&t, &s).await.unwrap().len(), 1);
        assert!(h
            .store
            .get_state(&t, &s, &key("k"))
            .await
            .unwrap()
            .is_some());
    }
    h.clock.advance(30 * DAY);
    assert_eq!(h.store.get_content(&t, &r).await.unwrap(), None);
    assert!(h.store.read_log(&t, &s).await.unwrap().is_empty());
    assert_eq!(h.store.get_state(&t, &s, &key("k")).await.unwrap(), None);
}

async fn writing_again_refreshes_retention(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let r = ContentRef::of("x");
    for _ in 0..3 {
        h.store
            .put_content(&t, &s, ContentKind::ToolResult, "x")
            .await
            .unwrap();
        h.store.append_log(&t, &s, &json!({})).await.unwrap();
        h.clock.advance(20 * DAY);
    }
    assert!(h.store.get_content(&t, &r).await.unwrap().is_some());
    assert_eq!(h.store.read_log(&t, &s).await.unwrap().len(), 3);
}

async fn the_log_is_append_only_json_lines(h: Harness) {
    let (t, s1, s2) = (tenant("k"), session("s1"), session("s2"));
    let records = [
        json!({"event": "offload", "ref": ContentRef::of("x").as_str(), "tokens": 1200}),
        json!({"event": "summary", "text": "line one\nline two \u{4e2d}\u{6587} \u{1f680}"}),
        json!("a bare string"),
        json!({"nested": {"z": 1, "a": [1, 2, {"b": null}]}}),
    ];
    let mut expected = Vec::new();
    for record in &records {
        h.store.append_log(&t, &s1, record).await.unwrap();
        expected.push(record.clone());
        assert_eq!(h.store.read_log(&t, &s1).await.unwrap(), expected);
    }
    h.store
        .append_log(&t, &s2, &json!({"other": true}))
        .await
        .unwrap();
    assert_eq!(h.store.read_log(&t, &s1).await.unwrap(), records);
    assert_eq!(
        h.store.read_log(&t, &s2).await.unwrap(),
        [json!({"other": true})]
    );
    // Pages: the newest first, then back from a cursor; each as the whole journal has it.
    let page = |before, limit| h.store.read_log_page(&t, &s1, before, limit);
    let newest = page(None, 3).await.unwrap();
    assert_eq!((newest.first_index, newest.total), (1, 4));
    assert_eq!(newest.records, records[1..]);
    let older = page(Some(newest.first_index), 3).await.unwrap();
    assert_eq!((older.first_index, older.total), (0, 4));
    assert_eq!(older.records, records[..1]);
    assert_eq!(page(Some(3), 2).await.unwrap().records, records[1..3]);
    assert_eq!(page(Some(99), 1).await.unwrap().records, records[3..]);
    assert!(page(Some(0), 5).await.unwrap().records.is_empty());
    let none = h.store.read_log_page(&t, &session("none"), None, 5).await;
    assert_eq!(none.unwrap(), crate::store::LogPage::default());
    // Key order is kept (serde_json's `preserve_order`).
    let back = &h.store.read_log(&t, &s1).await.unwrap()[3];
    let keys: Vec<_> = back["nested"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["z", "a"]);
}

/// `append_logs` of records serialized by the caller leaves the journal `append_log` would,
/// record by record, in order, after what was there (a string's newline stays in its line); an
/// empty batch leaves it alone.
async fn a_batch_of_lines_appends_as_one_by_one(h: Harness) {
    let (t, s, other) = (tenant("k"), session("s"), session("other"));
    h.store.append_log(&t, &s, &json!({"n": 0})).await.unwrap();
    let batch = [
        json!({"n": 1, "text": "two\nlines \u{1f680}"}),
        json!({"n": 2}),
        json!("a bare string"),
    ];
    let lines = batch.iter().map(|r| LogLine::of(r).unwrap()).collect();
    // The journal's records after the batch: what numbers its lines.
    let appended = h.store.append_logs(&t, &s, lines, None).await.unwrap();
    assert_eq!(appended, Appended::Records(4));
    for (t, s) in [(&t, &s), (&t, &other)] {
        let none = h.store.append_logs(t, s, Vec::new(), None).await.unwrap();
        assert_eq!(none, Appended::Records(0));
    }
    h.store.append_log(&t, &s, &json!({"n": 3})).await.unwrap();
    let one = vec![LogLine::of(&json!({"n": 4})).unwrap()];
    let appended = h.store.append_logs(&t, &s, one, None).await.unwrap();
    assert_eq!(appended, Appended::Records(6));
    let mut expected = vec![json!({"n": 0})];
    expected.extend(batch.iter().cloned());
    expected.push(json!({"n": 3}));
    expected.push(json!({"n": 4}));
    assert_eq!(h.store.read_log(&t, &s).await.unwrap(), expected);
    let page = h.store.read_log_page(&t, &s, None, 2).await.unwrap();
    assert_eq!((page.first_index, page.total), (4, 6));
    assert_eq!(page.records, expected[4..]);
    assert!(h.store.read_log(&t, &other).await.unwrap().is_empty());
}

/// An erased session keeps a tombstone: lines written before the erasure are refused (with
/// its time), later ones start the journal afresh; the tombstone is no session of the list.
async fn an_erased_session_refuses_lines_from_before_it(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    h.store.append_log(&t, &s, &json!({"n": 0})).await.unwrap();
    let before = SystemTime::now() - Duration::from_secs(60);
    h.store.erase_session(&t, &s, &[]).await.unwrap();
    assert!(h.store.list_sessions(Some(&t)).await.unwrap().is_empty());
    let line = || vec![LogLine::of(&json!({"n": 1})).unwrap()];
    let refused = h.store.append_logs(&t, &s, line(), Some(before)).await;
    let Appended::Erased(at) = refused.unwrap() else {
        panic!("a line of before the erasure was appended");
    };
    assert!(at >= before, "{at:?}");
    assert!(h.store.read_log(&t, &s).await.unwrap().is_empty());
    assert!(h.store.list_sessions(Some(&t)).await.unwrap().is_empty());
    // Another session of the tenant, and lines of after the erasure, are appended.
    let other = h
        .store
        .append_logs(&t, &session("o"), line(), Some(before))
        .await;
    assert_eq!(other.unwrap(), Appended::Records(1));
    let after = SystemTime::now() + Duration::from_secs(60);
    let appended = h.store.append_logs(&t, &s, line(), Some(after)).await;
    assert_eq!(appended.unwrap(), Appended::Records(1));
    assert_eq!(h.store.read_log(&t, &s).await.unwrap(), [json!({"n": 1})]);
    assert_eq!(h.store.list_sessions(Some(&t)).await.unwrap().len(), 2);
}

/// `put_contents` stores what `put_content` would, each under its reference, in order: one
/// already stored is only refreshed, the same content twice in a batch is one item, and
/// another tenant reads none of it.
async fn a_batch_of_contents_is_stored_as_one_by_one(h: Harness) {
    let (t, s) = (tenant("k"), session("s"));
    let before = h
        .store
        .put_content(&t, &s, ContentKind::Messages, "[1]")
        .await
        .unwrap();
    let batch = vec![
        "[1]".to_string(),
        "[\"two\\nlines \u{1f680}\"]".to_string(),
        "[1]".to_string(),
    ];
    let refs = h
        .store
        .put_contents(&t, &s, ContentKind::Messages, batch.clone())
        .await
        .unwrap();
    assert_eq!(refs.len(), batch.len());
    assert_eq!(refs[0], before);
    assert_eq!(refs[0], refs[2]);
    for (r, content) in refs.iter().zip(&batch) {
        assert_eq!(*r, ContentRef::of(content));
        assert_eq!(
            h.store.get_content(&t, r).await.unwrap().as_deref(),
            Some(content.as_str())
        );
        assert_eq!(
            h.store.get_content(&tenant("other"), r).await.unwrap(),
            None
        );
    }
    let none = h
        .store
        .put_contents(&t, &s, ContentKind::Messages, Vec::new())
        .await
        .unwrap();
    assert!(none.is_empty());
}

async fn state_records_are_replaced_and_read_back(h: Harness) {
    let (t, s1, s2) = (tenant("k"), session("s1"), session("s2"));
    let binary: Vec<u8> = (0..=255).collect();
    h.store
        .put_state(&t, &s1, &key("a"), b"first")
        .await
        .unwrap();
    h.store
        .put_state(&t, &s1, &key("b"), &binary)
        .await
        .unwrap();
    h.store.put_state(&t, &s1, &key("e"), b"").await.unwrap();
    h.store
        .put_state(&t, &s1, &key("a"), b"second")
        .await
        .unwrap();
    let get = |s: SessionId, k: &'static str| {
        let (store, t) = (h.store.clone(), t.clone());
        async move { store.get_state(&t, &s, &key(k)).await.unwrap() }
    };
    assert_eq!(get(s1.clone(), "a").await.as_deref(), Some(&b"second"[..]));
    assert_eq!(get(s1.clone(), "b").await, Some(binary));
    assert_eq!(get(s1.clone(), "e").await, Some(Vec::new()));
    assert_eq!(get(s2, "a").await, None);
}

async fn compare_and_set_from_absent(h: Harness) {
    let (t, s, k) = (tenant("k"), session("s"), key("cas"));
    assert!(h
        .store
        .compare_and_set_state(&t, &s, &k, None, b"first")
        .await
        .unwrap());
    assert_eq!(
        h.store.get_state(&t, &s, &k).await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    // There is a record now: "absent" no longer matches.
    assert!(!h
        .store
        .compare_and_set_state(&t, &s, &k, None, b"second")
        .await
        .unwrap());
    assert_eq!(
        h.store.get_state(&t, &s, &k).await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    // An empty record is a record, not an absent one.
    let e = key("empty");
    assert!(h
        .store
        .compare_and_set_state(&t, &s, &e, None, b"")
        .await
        .unwrap());
    assert!(!h
        .store
        .compare_and_set_state(&t, &s, &e, None, b"x")
        .await
        .unwrap());
    assert!(h
        .store
        .compare_and_set_state(&t, &s, &e, Some(b""), b"x")
        .await
        .unwrap());
    // Another tenant's record of the same name is not this one.
    assert!(h
        .store
        .compare_and_set_state(&tenant("other"), &s, &k, None, b"theirs")
        .await
        .unwrap());
}

async fn compare_and_set_with_a_wrong_expected_value_fails(h: Harness) {
    let (t, s, k) = (tenant("k"), session("s"), key("cas"));
    h.store.put_state(&t, &s, &k, b"value").await.unwrap();
    for wrong in [&b"other"[..], b"valu", b"value ", b""] {
        assert!(!h
            .store
            .compare_and_set_state(&t, &s, &k, Some(wrong), b"new")
            .await
            .unwrap());
        assert_eq!(
            h.store.get_state(&t, &s, &k).await.unwrap().as_deref(),
            Some(&b"value"[..])
        );
    }
    assert!(!h
        .store
        .compare_and_set_state(&t, &s, &key("never"), Some(b"value"), b"new")
        .await
        .unwrap());
    assert_eq!(
        h.store.get_state(&t, &s, &key("never")).await.unwrap(),
        None
    );
    let binary: Vec<u8> = (0..=255).rev().collect();
    assert!(h
        .store
        .compare_and_set_state(&t, &s, &k, Some(b"value"), &binary)
        .await
        .unwrap());
    assert_eq!(h.store.get_state(&t, &s, &k).await.unwrap(), Some(binary));
}

async fn compare_and_set_under_contention_loses_nothing(h: Harness) {
    const WRITERS: usize = 16;
    let (t, s, k) = (tenant("k"), session("s"), key("counter"));
    let tasks = (0..WRITERS).map(|_| {
        let (store, t, s, k) = (h.store.clone(), t.clone(), s.clone(), k.clone());
        tokio::spawn(async move {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let current = store.get_state(&t, &s, &k).await.unwrap();
                let n: usize = match &current {
                    Some(bytes) => std::str::from_utf8(bytes).unwrap().parse().unwrap(),
                    None => 0,
                };
                let next = (n + 1).to_string();
                let replaced = store
                    .compare_and_set_state(&t, &s, &k, current.as_deref(), next.as_bytes())
                    .await
                    .unwrap();
                if replaced {
                    return attempts;
                }
            }
        })
    });
    let attempts: usize = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|attempts| attempts.unwrap())
        .sum();
    assert!(attempts >= WRITERS);
    let last = h.store.get_state(&t, &s, &k).await.unwrap();
    assert_eq!(last, Some(WRITERS.to_string().into_bytes()));
}

async fn compare_and_set_refreshes_retention(h: Harness) {
    let (t, s, k) = (tenant("k"), session("s"), key("cas"));
    h.store.put_state(&t, &s, &k, b"0").await.unwrap();
    let mut current = b"0".to_vec();
    for i in 1..=3 {
        h.clock.advance(20 * DAY);
        let next = i.to_string().into_bytes();
        assert!(h
            .store
            .compare_and_set_state(&t, &s, &k, Some(&current), &next)
            .await
            .unwrap());
        current = next;
    }
    h.clock.advance(20 * DAY);
    assert_eq!(h.store.get_state(&t, &s, &k).await.unwrap(), Some(current));
    // An expired record is absent.
    h.clock.advance(30 * DAY);
    assert!(h
        .store
        .compare_and_set_state(&t, &s, &k, None, b"again")
        .await
        .unwrap());
}

const LOCK_TTL: Duration = Duration::from_secs(60);

async fn a_lock_has_one_holder(h: Harness) {
    let (t, s, name) = (tenant("k"), session("s"), key("compress"));
    assert!(h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    // Taking it again extends it.
    assert!(h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    // Other names, sessions and tenants are other locks.
    assert!(h
        .store
        .try_lock(&t, &s, &key("other"), "b", LOCK_TTL)
        .await
        .unwrap());
    assert!(h
        .store
        .try_lock(&t, &session("s2"), &name, "b", LOCK_TTL)
        .await
        .unwrap());
    assert!(h
        .store
        .try_lock(&tenant("other"), &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    // A lock is not a state record.
    assert_eq!(h.store.get_state(&t, &s, &name).await.unwrap(), None);
    h.store.unlock(&t, &s, &name, "a").await.unwrap();
    assert!(h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    // Many contenders at once: exactly one wins.
    let contenders = (0..16).map(|i| {
        let (store, t, s) = (h.store.clone(), t.clone(), s.clone());
        async move {
            store
                .try_lock(&t, &s, &key("race"), &format!("h{i}"), LOCK_TTL)
                .await
                .unwrap()
        }
    });
    let won = futures_util::future::join_all(contenders).await;
    assert_eq!(won.iter().filter(|&&won| won).count(), 1, "{won:?}");
}

async fn unlock_by_another_holder_does_nothing(h: Harness) {
    let (t, s, name) = (tenant("k"), session("s"), key("compress"));
    assert!(h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    h.store.unlock(&t, &s, &name, "b").await.unwrap();
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    // Unlocking what nobody holds is fine too.
    h.store.unlock(&t, &s, &key("free"), "b").await.unwrap();
    h.store.unlock(&t, &s, &name, "a").await.unwrap();
    h.store.unlock(&t, &s, &name, "a").await.unwrap();
    assert!(h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
}

async fn a_lock_expires_after_its_ttl(h: Harness) {
    let (t, s, name) = (tenant("k"), session("s"), key("compress"));
    assert!(h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    h.clock.advance(LOCK_TTL - Duration::from_secs(1));
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    // The holder extends it.
    assert!(h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
    h.clock.advance(LOCK_TTL - Duration::from_secs(1));
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    h.clock.advance(Duration::from_secs(1));
    assert!(h
        .store
        .try_lock(&t, &s, &name, "b", LOCK_TTL)
        .await
        .unwrap());
    // The former holder's unlock no longer touches it.
    h.store.unlock(&t, &s, &name, "a").await.unwrap();
    assert!(!h
        .store
        .try_lock(&t, &s, &name, "a", LOCK_TTL)
        .await
        .unwrap());
}

async fn ping_and_close(h: Harness) {
    h.store.ping().await.unwrap();
    h.store.close().await;
    h.store.ping().await.unwrap();
    let (t, s) = (tenant("k"), session("s"));
    let r = h
        .store
        .put_content(&t, &s, ContentKind::ToolResult, "after close")
        .await
        .unwrap();
    assert!(h.store.get_content(&t, &r).await.unwrap().is_some());
}

fn arbitrary_strings_and_bytes_round_trip<F, Fut>(make: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Harness>,
{
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let h = runtime.block_on(make());
    let (t, s) = (tenant("k"), session("s"));
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    proptest!(config, |(content in any::<String>(), value in proptest::collection::vec(any::<u8>(), 0..512))| {
        runtime.block_on(async {
            let r = h.store.put_content(&t, &s, ContentKind::ToolResult, &content).await.unwrap();
            prop_assert_eq!(h.store.get_content(&t, &r).await.unwrap(), Some(content.clone()));
            h.store.put_state(&t, &s, &key("v"), &value).await.unwrap();
            prop_assert_eq!(h.store.get_state(&t, &s, &key("v")).await.unwrap(), Some(value.clone()));
            let record = json!({ "text": content });
            h.store.append_log(&t, &s, &record).await.unwrap();
            let log = h.store.read_log(&t, &s).await.unwrap();
            prop_assert_eq!(log.last(), Some(&record));
            Ok::<(), TestCaseError>(())
        })?;
    });
}
