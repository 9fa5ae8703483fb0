//! Proxy keys through the real proxy: when the upstream has a key of its own, clients must
//! present a key the proxy knows — refused before anything is stored or forwarded — each key
//! is its own tenant, and a key's allowed models and request budget are enforced.

mod common;

use common::{assert_openai_error, key, Harness};
use context_proxy::app::config::Config;
use context_proxy::auth::key_tenant;
use context_proxy::mock::MockConfig;
use context_proxy::store::{Backend, ContentRef, StoreConfig};
use serde_json::{json, Value};

/// An upstream with a key of its own (in `var`), a fs store under `dir`, and `keys`.
fn keyed(
    var: &'static str,
    dir: &std::path::Path,
    keys: Vec<context_proxy::auth::KeyConfig>,
) -> impl FnOnce(&mut Config) {
    std::env::set_var(var, "sk-upstream-own");
    let dir = dir.to_path_buf();
    move |c: &mut Config| {
        c.upstreams[0].api_key_env = Some(var.into());
        c.keys = keys;
        c.store.backend = Backend::Fs;
        c.store.path = dir;
        c.store.fsync = false;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    }
}

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

/// A conversation whose old tool result gets compacted (so something is stored).
fn conversation() -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": numbered_lines("a.rs", 600)},
        {"role": "assistant", "content": "Read."},
        {"role": "user", "content": "Now summarize it."}
    ]})
}

async fn post(h: &Harness, path: &str, auth: Option<&str>, body: &Value) -> reqwest::Response {
    let mut req = h.client.post(h.url(path)).json(body);
    if let Some(key) = auth {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    req.send().await.unwrap()
}

fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    files_under(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

#[tokio::test]
async fn missing_or_wrong_key_is_401_and_nothing_is_forwarded_or_stored() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(
        MockConfig::default(),
        keyed(
            "CP_AUTH_TEST_KEY_401",
            dir.path(),
            vec![key("alice", "sk-alice")],
        ),
    )
    .await;
    for auth in [None, Some("sk-wrong"), Some("")] {
        let resp = post(&h, "/v1/chat/completions", auth, &conversation()).await;
        assert_eq!(resp.status(), 401, "{auth:?}");
        let error = assert_openai_error(&resp.bytes().await.unwrap());
        assert_eq!(error["code"], "invalid_api_key");
        let resp = post(
            &h,
            "/v1/embeddings",
            auth,
            &json!({"model": "e", "input": "x"}),
        )
        .await;
        assert_eq!(resp.status(), 401, "{auth:?}");
        let resp = h.client.get(h.url("/v1/models")).send().await.unwrap();
        assert_eq!(resp.status(), 401);
    }
    assert!(h.mock.received().is_empty());
    assert_eq!(files_under(dir.path()), 0, "something was stored");

    // The right key goes through, with the upstream's own key in place of the client's.
    let resp = post(
        &h,
        "/v1/chat/completions",
        Some("sk-alice"),
        &conversation(),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        h.mock.received()[0].headers["authorization"],
        "Bearer sk-upstream-own"
    );
    assert!(files_under(dir.path()) > 0);
}

#[tokio::test]
async fn each_key_is_its_own_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(
        MockConfig::default(),
        keyed(
            "CP_AUTH_TEST_KEY_TENANT",
            dir.path(),
            vec![key("alice", "sk-alice"), key("bob", "sk-bob")],
        ),
    )
    .await;
    let resp = post(
        &h,
        "/v1/chat/completions",
        Some("sk-alice"),
        &conversation(),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let sent = h.mock.received()[0].json();
    let text = sent["messages"][3]["content"].as_str().unwrap().to_string();
    let start = text.find("ctx_").expect("compacted with a reference");
    let reference: ContentRef = text[start..start + 28].parse().unwrap();

    let store = context_proxy::store::open(&StoreConfig {
        backend: Backend::Fs,
        path: dir.path().to_path_buf(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let alice = store
        .get_content(&key_tenant("alice"), &reference)
        .await
        .unwrap();
    assert!(alice.is_some_and(|c| c.starts_with("a.rs line 1:")));
    assert_eq!(
        store
            .get_content(&key_tenant("bob"), &reference)
            .await
            .unwrap(),
        None
    );
    // Not under the hash of the key itself either: the tenant is the key's, not the bearer's.
    let raw = context_proxy::store::Tenant::from_api_key(Some("sk-alice"));
    assert_eq!(store.get_content(&raw, &reference).await.unwrap(), None);
    store.close().await;
}

#[tokio::test]
async fn allowed_models_are_enforced_with_a_403_naming_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = key("mini-only", "sk-mini");
    limited.models = vec!["gpt-4o-mini*".into()];
    let h = Harness::start_with(
        MockConfig::default(),
        keyed("CP_AUTH_TEST_KEY_MODELS", dir.path(), vec![limited]),
    )
    .await;
    let resp = post(&h, "/v1/chat/completions", Some("sk-mini"), &conversation()).await;
    assert_eq!(resp.status(), 403);
    let error = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(error["code"], "model_not_allowed");
    assert!(error["message"].as_str().unwrap().contains("\"gpt-4o\""));
    // Pass-through routes too, once their model is known.
    let resp = post(
        &h,
        "/v1/embeddings",
        Some("sk-mini"),
        &json!({"model": "text-embedding-3-small", "input": "x"}),
    )
    .await;
    assert_eq!(resp.status(), 403);
    // A body whose model the proxy does not read (chunked) is refused too; a request without a
    // body (listing the models) is not.
    let chunks = futures_util::stream::iter([Ok::<_, std::io::Error>(
        br#"{"model":"o3","input":"x"}"#.to_vec(),
    )]);
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("authorization", "Bearer sk-mini")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert!(h.mock.received().is_empty());
    let resp = h
        .client
        .get(h.url("/v1/models"))
        .header("api-key", "sk-mini")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The proxy key itself never reaches the upstream, in either header.
    let got = &h.mock.received()[0];
    assert_eq!(got.headers["authorization"], "Bearer sk-upstream-own");
    assert!(got.headers.get("api-key").is_none());
    h.mock.reset();

    let mut body = conversation();
    body["model"] = json!("gpt-4o-mini");
    let resp = post(&h, "/v1/chat/completions", Some("sk-mini"), &body).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn requests_per_minute_budget_gives_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = key("slow", "sk-slow");
    limited.requests_per_minute = Some(2);
    let h = Harness::start_with(
        MockConfig::default(),
        keyed(
            "CP_AUTH_TEST_KEY_RPM",
            dir.path(),
            vec![limited, key("free", "sk-free")],
        ),
    )
    .await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let resp = post(&h, "/v1/chat/completions", Some("sk-slow"), &body).await;
        assert_eq!(resp.status(), 200);
    }
    let resp = post(&h, "/v1/chat/completions", Some("sk-slow"), &body).await;
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    let error = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(error["code"], "rate_limit_exceeded");
    assert!(error["message"].as_str().unwrap().contains("\"slow\""));
    assert_eq!(h.mock.received().len(), 2);
    // Another key has its own budget.
    let resp = post(&h, "/v1/chat/completions", Some("sk-free"), &body).await;
    assert_eq!(resp.status(), 200);
}

#[test]
fn an_upstream_key_without_proxy_keys_is_a_startup_error_unless_open_relay() {
    let mut config = common::config_for("http://127.0.0.1:9/v1");
    config.upstreams[0].api_key_env = Some("SOME_KEY".into());
    let err = config.clone().validate().unwrap_err().to_string();
    assert!(err.contains("open_relay"), "{err}");
    config.auth.open_relay = true;
    config.clone().validate().unwrap();
    config.auth.open_relay = false;
    config.keys = vec![key("k", "sk-k")];
    config.validate().unwrap();
}

#[tokio::test]
async fn a_refused_model_does_not_spend_the_request_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = key("slow", "sk-slow");
    limited.requests_per_minute = Some(2);
    limited.models = vec!["gpt-4o*".into()];
    let h = Harness::start_with(
        MockConfig::default(),
        keyed("CP_AUTH_TEST_KEY_RPM403", dir.path(), vec![limited]),
    )
    .await;
    let refused = json!({"model": "o3", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..5 {
        let resp = post(&h, "/v1/chat/completions", Some("sk-slow"), &refused).await;
        assert_eq!(resp.status(), 403);
    }
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let resp = post(&h, "/v1/chat/completions", Some("sk-slow"), &body).await;
        assert_eq!(resp.status(), 200);
    }
    let resp = post(&h, "/v1/chat/completions", Some("sk-slow"), &body).await;
    assert_eq!(resp.status(), 429);
}

#[tokio::test]
async fn concurrent_requests_cannot_all_spend_the_same_token_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = key("tpm", "sk-tpm");
    limited.tokens_per_minute = Some(2_000);
    let h = Harness::start_with(
        MockConfig::default(),
        keyed("CP_AUTH_TEST_KEY_TPM", dir.path(), vec![limited]),
    )
    .await;
    // About 600 prompt tokens each, plus 200 for the answer they ask room for.
    let text = "the quick brown fox jumps over the lazy dog ".repeat(60);
    let body = json!({"model": "gpt-4o", "max_tokens": 200, "messages": [{"role": "user", "content": text}]});
    let sends = (0..30).map(|_| post(&h, "/v1/chat/completions", Some("sk-tpm"), &body));
    let statuses: Vec<u16> = futures_util::future::join_all(sends)
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    // 2,000 tokens admit three of them (the third takes the budget into debt), not thirty.
    assert!((1..=3).contains(&passed), "{passed} passed: {statuses:?}");
    assert_eq!(h.mock.received().len(), passed);
}

#[tokio::test]
async fn a_token_debt_locks_a_key_out_for_at_most_one_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut limited = key("tpm", "sk-tpm");
    limited.tokens_per_minute = Some(1_000);
    let h = Harness::start_with(
        MockConfig::default(),
        keyed("CP_AUTH_TEST_KEY_DEBT", dir.path(), vec![limited]),
    )
    .await;
    // One request of about 6,000 tokens is admitted on a full budget and leaves it in debt.
    let text = "the quick brown fox jumps over the lazy dog ".repeat(600);
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]});
    let resp = post(&h, "/v1/chat/completions", Some("sk-tpm"), &body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    // The debt is at most one window: the next request is told to retry within a minute.
    let resp = post(&h, "/v1/chat/completions", Some("sk-tpm"), &body).await;
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
}

#[tokio::test]
async fn without_proxy_keys_inspection_needs_the_admin_token() {
    // No upstream key, so no proxy keys: clients with no key, or the same placeholder, are one
    // tenant. They must not see one another's sessions.
    let compacting = |c: &mut Config| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    };
    let h = Harness::start_with(MockConfig::default(), compacting).await;
    let resp = post(&h, "/v1/chat/completions", Some("EMPTY"), &conversation()).await;
    assert_eq!(resp.status(), 200);
    for auth in [Some("EMPTY"), None, Some("sk-other")] {
        let mut req = h.client.get(h.url("/v1/context/sessions"));
        if let Some(key) = auth {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 403, "{auth:?}");
        let error = assert_openai_error(&resp.bytes().await.unwrap());
        assert_eq!(error["code"], "admin_token_required");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("admin_token_env"));
    }
    // With an admin token configured, that token inspects; the placeholder still cannot.
    std::env::set_var("CP_AUTH_TEST_ADMIN_KEYLESS", "admin-keyless");
    let h = Harness::start_with(MockConfig::default(), |c| {
        compacting(c);
        c.auth.admin_token_env = Some("CP_AUTH_TEST_ADMIN_KEYLESS".into());
    })
    .await;
    let resp = post(&h, "/v1/chat/completions", Some("EMPTY"), &conversation()).await;
    assert_eq!(resp.status(), 200);
    let (status, _) = h.get_json("/v1/context/sessions", "EMPTY").await;
    assert_eq!(status, 403);
    let (status, all) = h.get_json("/v1/context/sessions", "admin-keyless").await;
    assert_eq!(status, 200);
    assert_eq!(all["data"].as_array().unwrap().len(), 1, "{all}");
}
