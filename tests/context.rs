//! Context management through the real proxy and mock upstream: what the upstream receives,
//! what the client is told in headers, what the store holds, and what happens when the store
//! fails.

mod common;

use std::path::Path;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::mock::MockConfig;
use context_proxy::store::{Backend, ContentRef, StoreConfig, Tenant};
use serde_json::{json, Value};

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

fn with_store(dir: &Path) -> impl FnOnce(&mut Config) + '_ {
    move |c: &mut Config| {
        c.store.backend = Backend::Fs;
        c.store.path = dir.to_path_buf();
        c.store.fsync = false;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    }
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

fn refs_in(text: &str) -> Vec<String> {
    text.match_indices("ctx_")
        .map(|(i, _)| text[i..i + 28].to_string())
        .collect()
}

#[tokio::test]
async fn old_tool_results_are_compacted_and_stored_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), with_store(dir.path())).await;
    let messages = conversation();
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after * 5 < before, "{before} → {after}");
    assert_eq!(header(&resp, "x-context-actions"), "compacted=2");

    let sent = h.mock.received()[0].json();
    let got = sent["messages"].as_array().unwrap();
    assert_eq!(got.len(), messages.len());
    for i in [3, 4] {
        let text = got[i]["content"].as_str().unwrap();
        assert!(
            text.starts_with("[context-proxy: tool result compacted"),
            "{text}"
        );
        assert_eq!(got[i]["tool_call_id"], messages[i]["tool_call_id"]);
        // The full result is in the store under the client's tenant, byte for byte.
        let reference: ContentRef = refs_in(text)[0].parse().unwrap();
        let store = context_proxy::store::open(&StoreConfig {
            backend: Backend::Fs,
            path: dir.path().to_path_buf(),
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let tenant = Tenant::from_api_key(Some("sk-test-client"));
        let stored = store
            .get_content(&tenant, &reference)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored, messages[i]["content"].as_str().unwrap());
        // Another tenant cannot read it.
        let other = Tenant::from_api_key(Some("sk-someone-else"));
        assert_eq!(store.get_content(&other, &reference).await.unwrap(), None);
        store.close().await;
    }
    // Everything else went through untouched.
    for i in [0, 1, 2, 5, 6] {
        assert_eq!(got[i], messages[i]);
    }
}

#[tokio::test]
async fn the_compacted_prefix_is_byte_stable_across_turns() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), with_store(dir.path())).await;
    let mut messages = conversation();
    let first_resp = h
        .chat(&json!({"model": "gpt-4o", "messages": messages}))
        .await;
    let first_id = header(&first_resp, "x-context-request-id");
    messages.push(json!({"role": "assistant", "content": "Summary: two modules."}));
    messages.push(json!({"role": "user", "content": "Thanks. Anything else?"}));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    let received = h.mock.received();
    let first = received[0].json()["messages"].as_array().unwrap().clone();
    let second = received[1].json()["messages"].as_array().unwrap().clone();
    // The second request starts with exactly the bytes of the first.
    let first_bytes: Vec<String> = first.iter().map(Value::to_string).collect();
    let second_bytes: Vec<String> = second[..first.len()].iter().map(Value::to_string).collect();
    assert_eq!(first_bytes, second_bytes);
    // The session log recorded what was stored and the decision once, both by the first
    // request (the second reused them), each line with a timestamp and the request id.
    let logs: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.ends_with("context.jsonl"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let text = std::fs::read_to_string(&logs[0]).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["stored", "decision"], "{text}");
    for line in &lines {
        assert_eq!(line["request_id"], first_id.as_str(), "{line}");
        assert!(line["ts"].as_str().unwrap().ends_with('Z'), "{line}");
    }
    let stored: Vec<&str> = lines[0]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["action"].as_str().unwrap())
        .collect();
    assert_eq!(stored, ["compacted", "compacted"], "{text}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn mode_off_forwards_byte_identical_and_bad_modes_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), with_store(dir.path())).await;
    let body = json!({"model": "gpt-4o", "messages": conversation()}).to_string();
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("x-context-mode", "off")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-context-actions"), "off");
    assert!(
        resp.headers().get("x-context-tokens-before").is_none(),
        "off does not count"
    );
    assert_eq!(&h.mock.received()[0].body[..], body.as_bytes());

    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("x-context-mode", "aggressive")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err = common::assert_openai_error(&resp.bytes().await.unwrap());
    assert!(err["message"].as_str().unwrap().contains("x-context-mode"));
}

#[tokio::test]
async fn a_failing_store_means_the_request_goes_out_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let h = Harness::start_with(MockConfig::default(), with_store(&data)).await;
    // The store's directory disappears under it and a file takes its place.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::write(&data, b"not a directory").unwrap();
    let body = json!({"model": "gpt-4o", "messages": conversation()}).to_string();
    let resp = h.chat_raw(body.clone()).await;
    assert_eq!(resp.status(), 200);
    assert!(
        header(&resp, "x-context-actions").contains("store unavailable"),
        "{}",
        header(&resp, "x-context-actions")
    );
    assert_eq!(&h.mock.received()[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn a_failing_store_with_on_error_closed_is_a_503_and_nothing_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let h = Harness::start_with(MockConfig::default(), |c| {
        with_store(&data)(c);
        c.store.on_error = context_proxy::store::OnError::Closed;
    })
    .await;
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::write(&data, b"not a directory").unwrap();
    let body = json!({"model": "gpt-4o", "messages": conversation()}).to_string();
    let resp = h.chat_raw(body).await;
    assert_eq!(resp.status(), 503);
    let err = common::assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(err["code"], "store_unavailable");
    assert!(
        err["message"].as_str().unwrap().contains("store.on_error"),
        "{err}"
    );
    assert!(h.mock.received().is_empty());
    // A request that needs no store still goes through.
    let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(h.chat(&small).await.status(), 200);
}

#[tokio::test]
async fn a_malformed_conversation_is_forwarded_as_it_came() {
    let h = Harness::start().await;
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "x".repeat(200_000)},
        {"role": "tool", "tool_call_id": "orphan", "content": "y".repeat(200_000)},
        {"role": "user", "content": "go"}
    ]})
    .to_string();
    let resp = h.chat_raw(body.clone()).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-context-actions").starts_with("skipped (malformed"));
    assert_eq!(&h.mock.received()[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn over_budget_conversations_move_old_units_out_and_stay_valid() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(3000);
        c.context.keep_recent_messages = 2;
    })
    .await;
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for i in 0..30 {
        messages.push(json!({"role": "user", "content": format!("Question {i}: {}", "tell me more about the weather ".repeat(20))}));
        messages.push(json!({"role": "assistant", "content": format!("Answer {i}: {}", "it is sunny and warm today ".repeat(20))}));
    }
    messages.push(json!({"role": "user", "content": "Last question?"}));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 3000, "after {after}");
    assert!(header(&resp, "x-context-actions").contains("offloaded="));
    let sent = h.mock.received()[0].json();
    let got = sent["messages"].as_array().unwrap();
    assert_eq!(got[0], messages[0]);
    // The task stays, the marker for the moved run comes right after it.
    assert_eq!(got[1], messages[1]);
    assert!(got[2]["content"]
        .as_str()
        .unwrap()
        .contains("earlier messages"));
    assert_eq!(got.last().unwrap(), messages.last().unwrap());
}

#[tokio::test]
async fn metrics_compare_the_proxy_count_with_the_upstream_usage() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    let billed = resp.json::<Value>().await.unwrap()["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    let text = h.metrics_text().await;
    let metric = |name: &str| common::sample(&text, name);
    assert_eq!(metric("context_proxy_chat_requests_total"), 1.0);
    assert_eq!(metric("context_proxy_context_rewritten_total"), 1.0);
    assert_eq!(metric("context_proxy_usage_samples_total"), 1.0);
    let after = metric("context_proxy_tokens_after_total");
    assert_eq!(
        metric("context_proxy_usage_diff_tokens_sum"),
        billed as f64 - after
    );
}
