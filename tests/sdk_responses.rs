//! The official OpenAI Python SDK's Responses API (`responses.create`, `responses.stream`)
//! through the proxy, against the mock's strict Responses API: a long Codex-like input is
//! managed on the way (the client sees only the mock's answer), a function call round trips,
//! and the stream helper, which checks the event order, assembles the streamed answer.

mod common;

use common::Harness;
use context_proxy::context::settings::WindowEntry;
use context_proxy::mock::{MockConfig, Reply};
use serde_json::json;

#[tokio::test]
async fn the_python_sdk_speaks_responses_through_the_proxy() {
    let python = common::python_with(&["openai"], &["openai"]);
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("small-model".into(), WindowEntry::Window(16_384));
    })
    .await;
    h.mock.push(Reply::text("It is a Rust proxy."));
    h.mock.push(Reply::tool_calls(vec![(
        "read_file".into(),
        json!({"path": "README.md"}),
    )]));
    h.mock.push(Reply::text("The README names it."));
    h.mock.push(Reply::text("Streamed: the tests pass."));
    let out = common::run_sdk_script(python, "sdk_responses.py", h.url("/v1")).await;
    let actions = out["actions"].as_str().unwrap();
    assert!(
        actions.contains("compacted") || actions.contains("offloaded"),
        "{actions}"
    );
    assert_eq!(out["text"], "It is a Rust proxy.");
    assert_eq!(out["reasoning_sealed"], json!([true]));
    assert_eq!(out["call"], json!(["read_file", {"path": "README.md"}]));
    assert_eq!(out["followed"], "The README names it.");
    assert_eq!(out["stream_text"], "Streamed: the tests pass.");
    assert_eq!(out["stream_final"], "Streamed: the tests pass.");
    assert!(out["stream_usage"].as_u64().unwrap() > 0);

    let received = h.mock.received();
    assert_eq!(received.len(), 4);
    // The managed request reached the strict mock smaller than the SDK sent it.
    let sent = received[0].json();
    assert!(sent["input"].as_array().unwrap().len() < 2 + 24 * 3 + 1);
    assert_eq!(sent["prompt_cache_key"], "sdk-thread");
    assert_eq!(received[0].headers["authorization"], "Bearer sk-e2e");
    assert_eq!(received[3].json()["stream"], true);
}
