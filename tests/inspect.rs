//! The `/v1/context/…` routes through the real proxy: a session's statistics and stored
//! references, scoped to the caller's key, content read back by its own tenant only, erasure,
//! the admin token across tenants — all answered by the proxy, never forwarded — and the
//! `inspect` subcommand on the same store.

mod common;

use common::{assert_openai_error, key, Harness};
use context_proxy::app::config::Config;
use context_proxy::auth::key_tenant;
use context_proxy::mock::MockConfig;
use context_proxy::store::Backend;
use serde_json::{json, Value};

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
    let (status, list) = h.get_json("/v1/context/sessions", "sk-alice").await;
    assert_eq!(status, 200);
    assert_eq!(
        list["data"],
        json!([{"id": "s1", "object": "context.session"}])
    );
    let (_, list) = h.get_json("/v1/context/sessions", "sk-bob").await;
    assert_eq!(list["data"], json!([]));

    // The session's statistics and what was stored.
    let (status, detail) = h.get_json("/v1/context/sessions/s1", "sk-alice").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["decisions"], 1);
    assert_eq!(detail["stored_refs"], 1);
    let stored = &detail["refs"][0];
    assert_eq!(stored["kind"], "tool_result");
    assert_eq!(stored["lines"], 600);
    assert!(stored["bytes"].as_u64().unwrap() > 10_000);
    assert!(stored["stored_at"].is_string());
    let reference = stored["ref"].as_str().unwrap().to_string();
    let (status, _) = h.get_json("/v1/context/sessions/s1", "sk-bob").await;
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
    let (status, all) = h.get_json("/v1/context/sessions", "admin-secret").await;
    assert_eq!(status, 200);
    assert_eq!(
        all["data"],
        json!([{"id": "s1", "object": "context.session", "tenant": alice.as_str(), "key": "alice"}])
    );
    let path = format!("/v1/context/refs/{reference}?tenant={}", alice.as_str());
    let resp = call(&h, reqwest::Method::GET, &path, "admin-secret").await;
    assert_eq!(resp.status(), 200);
    // A proxy key's name stands for its tenant; without a tenant the admin is told how to name one.
    let (status, detail) = h
        .get_json("/v1/context/sessions/s1?tenant=alice", "admin-secret")
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["key"], "alice");
    assert_eq!(detail["tenant"], alice.as_str());
    let (status, err) = h.get_json("/v1/context/sessions/s1", "admin-secret").await;
    assert_eq!(status, 400);
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("?tenant=") && message.contains("key name"),
        "{message}"
    );
    let (status, err) = h
        .get_json("/v1/context/sessions/s1?tenant=carol", "admin-secret")
        .await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"carol\""),
        "{err}"
    );
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
    let (status, _) = h.get_json("/v1/context/sessions/s1", "sk-alice").await;
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
            "[store]\nbackend = \"fs\"\npath = {:?}\n[[keys]]\nname = \"alice\"\nsha256 = \"{}\"\n",
            dir.path().display().to_string(),
            key("alice", "sk-alice").sha256
        ),
    )
    .unwrap();
    let inspect = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
            .arg("inspect")
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap()
    };
    let run = |args: &[&str]| {
        let out = inspect(args);
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
    assert_eq!(all["data"][0]["key"], "alice");
    let one = run(&["cli-session"]);
    assert_eq!(one["data"][0]["refs"][0]["kind"], "tool_result");
    assert_eq!(one["data"][0]["refs"][0]["lines"], 600);
    // A key's name stands for its tenant.
    let by_name = run(&["--tenant", "alice"]);
    assert_eq!(by_name["data"], all["data"]);
    // What is not there is said plainly.
    for (args, expected) in [
        (&["nosuch"][..], "no session \"nosuch\" in the store"),
        (
            &["--tenant", "carol"][..],
            "\"carol\" is neither a tenant id",
        ),
    ] {
        let out = inspect(args);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn a_session_is_found_by_the_name_the_client_gave() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), setup(dir.path())).await;
    let name = "Refactor Auth/2 \u{e9}t\u{e9}";
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-alice")
        .header(
            "x-context-session",
            reqwest::header::HeaderValue::from_bytes(name.as_bytes()).unwrap(),
        )
        .json(&conversation())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let (_, list) = h.get_json("/v1/context/sessions", "sk-alice").await;
    assert_eq!(
        list["data"],
        json!([{"id": name, "object": "context.session"}])
    );
    let path = "/v1/context/sessions/Refactor%20Auth%2F2%20%C3%A9t%C3%A9";
    let (status, detail) = h.get_json(path, "sk-alice").await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["id"], name);
    assert_eq!(detail["stored_refs"], 1);
    // Another spelling is another session.
    let (status, _) = h
        .get_json("/v1/context/sessions/refactor%20auth%2F2", "sk-alice")
        .await;
    assert_eq!(status, 404);
    h.proxy.shutdown().await;

    // The inspect subcommand finds it by the same name in the store.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = {:?}\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["inspect", "--config"])
        .arg(&config)
        .arg(name)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(found["data"][0]["id"], name);
    assert_eq!(found["data"][0]["refs"][0]["lines"], 600);

    // DELETE by the name erases it.
    let h = Harness::start_with(MockConfig::default(), setup(dir.path())).await;
    let resp = call(&h, reqwest::Method::DELETE, path, "sk-alice").await;
    assert_eq!(resp.status(), 200);
    let (_, list) = h.get_json("/v1/context/sessions", "sk-alice").await;
    assert_eq!(list["data"], json!([]));
}

/// The node of `cluster` that holds the keys of `tenant` under `prefix`.
fn node_of(cluster: &common::redis::RedisCluster, prefix: &str, tenant: &str) -> Option<usize> {
    cluster.nodes.iter().position(|node| {
        let mut conn = redis::Client::open(node.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:{{{tenant}}}:*"))
            .query(&mut conn)
            .unwrap();
        !keys.is_empty()
    })
}

/// On a three-node Redis Cluster, two keys whose tenants live on different primaries: each key
/// sees its own sessions only, the admin token lists both tenants' (the listing runs on every
/// primary), and erasure by the admin token removes a session from its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_the_admin_token_lists_every_tenant() {
    let cluster = tokio::task::spawn_blocking(|| common::redis::RedisCluster::start(3))
        .await
        .unwrap();
    let prefix = common::redis::unique_prefix();
    let dir = tempfile::tempdir().unwrap();
    let (urls, key_prefix) = (cluster.urls(), prefix.clone());
    let h = Harness::start_with(MockConfig::default(), move |c: &mut Config| {
        setup(dir.path())(c);
        c.store.backend = Backend::Redis;
        c.store.redis_cluster_nodes = urls;
        c.store.redis_key_prefix = key_prefix;
    })
    .await;
    for (key, session) in [("sk-alice", "a1"), ("sk-bob", "b1"), ("sk-bob", "b2")] {
        let resp = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("authorization", format!("Bearer {key}"))
            .header("x-context-session", session)
            .json(&conversation())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let (alice, bob) = (key_tenant("alice"), key_tenant("bob"));
    let (on_alice, on_bob) = (
        node_of(&cluster, &prefix, alice.as_str()),
        node_of(&cluster, &prefix, bob.as_str()),
    );
    assert!(on_alice.is_some() && on_bob.is_some());
    assert_ne!(
        on_alice, on_bob,
        "both tenants are on one node: pick other key names"
    );

    let (_, list) = h.get_json("/v1/context/sessions", "sk-alice").await;
    assert_eq!(
        list["data"],
        json!([{"id": "a1", "object": "context.session"}])
    );
    let (_, list) = h.get_json("/v1/context/sessions", "sk-bob").await;
    assert_eq!(
        list["data"],
        json!([
            {"id": "b1", "object": "context.session"},
            {"id": "b2", "object": "context.session"}
        ])
    );
    let (status, all) = h.get_json("/v1/context/sessions", "admin-secret").await;
    assert_eq!(status, 200, "{all}");
    let mut listed: Vec<(String, String)> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["tenant"].as_str().unwrap().into(),
                s["id"].as_str().unwrap().into(),
            )
        })
        .collect();
    listed.sort();
    let mut expected = vec![
        (alice.as_str().to_string(), "a1".to_string()),
        (bob.as_str().to_string(), "b1".to_string()),
        (bob.as_str().to_string(), "b2".to_string()),
    ];
    expected.sort();
    assert_eq!(listed, expected);

    // The admin erases one of Bob's sessions; Alice cannot touch Bob's other one.
    let path = format!("/v1/context/sessions/b1?tenant={}", bob.as_str());
    let resp = call(&h, reqwest::Method::DELETE, &path, "admin-secret").await;
    assert_eq!(resp.status(), 200);
    let resp = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/context/sessions/b2",
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 404);
    let (_, list) = h.get_json("/v1/context/sessions", "sk-bob").await;
    assert_eq!(
        list["data"],
        json!([{"id": "b2", "object": "context.session"}])
    );
    let (_, all) = h.get_json("/v1/context/sessions", "admin-secret").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 2, "{all}");
    // Nothing of b1 is left on Bob's node but its tombstone (the erasure's time, which a
    // journal line of before it is refused against): its journal, state and content are gone.
    let node = &cluster.nodes[on_bob.unwrap()];
    let mut conn = redis::Client::open(node.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:{{{}}}:*b1*", bob.as_str()))
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, [format!("{prefix}:{{{}}}:e:b1", bob.as_str())]);
    h.proxy.shutdown().await;
}

/// A Codex-shaped Responses request: its thread id as `prompt_cache_key` and `session-id`,
/// a large shell output the proxy moves out.
fn codex_request() -> Value {
    json!({
        "model": "gpt-5",
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read a.rs."}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-inspect"},
            {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": "{\"cmd\":[\"cat\",\"a.rs\"]}"},
            {"type": "function_call_output", "call_id": "call_a", "output": numbered_lines("a.rs", 600)},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Read.", "annotations": []}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Now summarize it."}]}
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}, "strict": false}],
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-codex-thread",
    })
}

/// A Responses session (named by Codex's thread id, no `x-context-session`) is inspected,
/// read back and erased like a chat session, over HTTP and with the `inspect` subcommand.
#[tokio::test]
async fn a_responses_session_is_inspected_read_and_erased() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), setup(dir.path())).await;
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("authorization", "Bearer sk-alice")
        .header("session-id", "019a-codex-thread")
        .json(&codex_request())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let actions = resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(actions.contains("compacted"), "{actions}");

    let (status, list) = h.get_json("/v1/context/sessions", "sk-alice").await;
    assert_eq!(status, 200);
    assert_eq!(
        list["data"],
        json!([{"id": "019a-codex-thread", "object": "context.session"}])
    );
    let (_, list) = h.get_json("/v1/context/sessions", "sk-bob").await;
    assert_eq!(list["data"], json!([]));
    let (status, detail) = h
        .get_json("/v1/context/sessions/019a-codex-thread", "sk-alice")
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["decisions"], 1);
    assert_eq!(detail["stored_refs"], 1);
    assert_eq!(detail["refs"][0]["kind"], "tool_result");
    assert_eq!(detail["refs"][0]["lines"], 600);
    assert!(detail["last_tokens_after"].as_u64() < detail["last_tokens_before"].as_u64());
    let reference = detail["refs"][0]["ref"].as_str().unwrap().to_string();
    // The forwarded request named that reference; the stored text is the output, byte exact.
    assert!(h.mock.received()[0].json().to_string().contains(&reference));
    let resp = call(
        &h,
        reqwest::Method::GET,
        &format!("/v1/context/refs/{reference}"),
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), numbered_lines("a.rs", 600));
    let resp = call(
        &h,
        reqwest::Method::GET,
        &format!("/v1/context/refs/{reference}"),
        "sk-bob",
    )
    .await;
    assert_eq!(resp.status(), 404);

    // The `inspect` subcommand reads the same session from the store.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = {:?}\n[[keys]]\nname = \"alice\"\nsha256 = \"{}\"\n",
            dir.path().display().to_string(),
            key("alice", "sk-alice").sha256
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["inspect", "--config"])
        .arg(&config)
        .arg("019a-codex-thread")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let one: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(one["data"][0]["id"], "019a-codex-thread");
    assert_eq!(one["data"][0]["key"], "alice");
    assert_eq!(one["data"][0]["refs"][0]["ref"], reference.as_str());

    // Erased: the session and its content are gone.
    let resp = call(
        &h,
        reqwest::Method::DELETE,
        "/v1/context/sessions/019a-codex-thread",
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 200);
    let (status, _) = h
        .get_json("/v1/context/sessions/019a-codex-thread", "sk-alice")
        .await;
    assert_eq!(status, 404);
    let resp = call(
        &h,
        reqwest::Method::GET,
        &format!("/v1/context/refs/{reference}"),
        "sk-alice",
    )
    .await;
    assert_eq!(resp.status(), 404);
    assert_eq!(h.mock.received().len(), 1);
}
