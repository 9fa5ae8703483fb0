//! The `/v1/context/…` routes through the real proxy: a session's statistics and stored
//! references, scoped to the caller's key, content read back by its own tenant only, erasure,
//! the admin token across tenants — all answered by the proxy, never forwarded — and the
//! `inspect` subcommand on the same store.

mod common;

use common::{assert_openai_error, Harness};
use context_proxy::auth::{key_tenant, KeyConfig};
use context_proxy::config::Config;
use context_proxy::mock::MockConfig;
use context_proxy::store::Backend;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn key(name: &str, secret: &str) -> KeyConfig {
    KeyConfig {
        name: name.into(),
        sha256: Sha256::digest(secret.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        models: vec![],
        upstreams: vec![],
        requests_per_minute: None,
        tokens_per_minute: None,
    }
}

fn setup(dir: &std::path::Path) -> impl FnOnce(&mut Config) {
    std::env::set_var("CP_INSPECT_TEST_UPSTREAM", "sk-upstream-own");
    std::env::set_var("CP_INSPECT_TEST_ADMIN", "admin-secret");
    let dir = dir.to_path_buf();
    move |c: &mut Config| {
        c.upstreams[0].api_key_env = Some("CP_INSPECT_TEST_UPSTREAM".into());
        c.keys = vec![key("alice", "sk-alice"), key("bob", "sk-bob")];
        c.auth.admin_token_env = Some("CP_INSPECT_TEST_ADMIN".into());
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

async fn call(h: &Harness, method: reqwest::Method, path: &str, key: &str) -> reqwest::Response {
    h.client
        .request(method, h.url(path))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .await
        .unwrap()
}

async fn get_json(h: &Harness, path: &str, key: &str) -> (u16, Value) {
    let resp = call(h, reqwest::Method::GET, path, key).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn sessions_are_inspected_read_and_erased_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), setup(dir.path())).await;
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "s1")
        .json(&conversation())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // Alice sees her session; Bob sees none.
    let (status, list) = get_json(&h, "/v1/context/sessions", "sk-alice").await;
    assert_eq!(status, 200);
    assert_eq!(
        list["data"],
        json!([{"id": "s1", "object": "context.session"}])
    );
    let (_, list) = get_json(&h, "/v1/context/sessions", "sk-bob").await;
    assert_eq!(list["data"], json!([]));

    // The session's statistics and what was stored.
    let (status, detail) = get_json(&h, "/v1/context/sessions/s1", "sk-alice").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["decisions"], 1);
    assert_eq!(detail["stored_refs"], 1);
    let stored = &detail["refs"][0];
    assert_eq!(stored["kind"], "tool_result");
    assert_eq!(stored["lines"], 600);
    assert!(stored["bytes"].as_u64().unwrap() > 10_000);
    assert!(stored["stored_at"].is_string());
    let reference = stored["ref"].as_str().unwrap().to_string();
    let (status, _) = get_json(&h, "/v1/context/sessions/s1", "sk-bob").await;
    assert_eq!(status, 404);

    // Content goes back to its own tenant only.
    let resp = call(
        &h,
        reqwest::Method::GET,
        &format!("/v1/context/refs/{reference}"),
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), numbered_lines("a.rs", 600));
    for (path, key) in [
        (format!("/v1/context/refs/{reference}"), "sk-bob"),
        ("/v1/context/refs/ctx_notareference".to_string(), "sk-alice"),
        (
            "/v1/context/refs/..%2F..%2Fetc%2Fpasswd".to_string(),
            "sk-alice",
        ),
    ] {
        let resp = call(&h, reqwest::Method::GET, &path, key).await;
        assert_eq!(resp.status(), 404, "{path}");
        assert_openai_error(&resp.bytes().await.unwrap());
    }
    // Without a key: 401.
    let resp = h
        .client
        .get(h.url("/v1/context/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    // The admin token sees every tenant, and names the tenant to read.
    let alice = key_tenant("alice");
    let (status, all) = get_json(&h, "/v1/context/sessions", "admin-secret").await;
    assert_eq!(status, 200);
    assert_eq!(
        all["data"],
        json!([{"id": "s1", "object": "context.session", "tenant": alice.as_str()}])
    );
    let path = format!("/v1/context/refs/{reference}?tenant={}", alice.as_str());
    let resp = call(&h, reqwest::Method::GET, &path, "admin-secret").await;
    assert_eq!(resp.status(), 200);
    // The admin token is no proxy key: it cannot chat.
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer admin-secret")
        .json(&conversation())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    // Bob cannot erase Alice's session; Alice can, and everything of it is gone.
    let resp = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/context/sessions/s1",
        "sk-bob",
    )
    .await;
    assert_eq!(resp.status(), 404);
    let resp = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/context/sessions/s1",
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 200);
    let erased: Value = resp.json().await.unwrap();
    assert_eq!(erased["deleted"], true);
    let (status, _) = get_json(&h, "/v1/context/sessions/s1", "sk-alice").await;
    assert_eq!(status, 404);
    let resp = call(
        &h,
        reqwest::Method::GET,
        &format!("/v1/context/refs/{reference}"),
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 404);
    let tenant_dir = dir.path().join(alice.as_str());
    assert!(!tenant_dir.join("s1").exists());

    // None of this reached the upstream: only the one chat request did.
    assert_eq!(h.mock.received().len(), 1);
}

#[tokio::test]
async fn the_inspect_subcommand_reads_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), setup(dir.path())).await;
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "cli-session")
        .json(&conversation())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    h.proxy.shutdown().await;

    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = {:?}\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
            .arg("inspect")
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let all = run(&[]);
    assert_eq!(all["data"][0]["id"], "cli-session");
    assert_eq!(all["data"][0]["tenant"], key_tenant("alice").as_str());
    let one = run(&["cli-session"]);
    assert_eq!(one["data"][0]["refs"][0]["kind"], "tool_result");
    assert_eq!(one["data"][0]["refs"][0]["lines"], 600);
}
