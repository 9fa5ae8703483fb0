//! End to end with the official OpenAI Python SDK as the client: plain and streamed replies,
//! tool calls (plain and streamed, assembled by the SDK), and an upstream error surfacing as
//! the SDK's typed exception.
//!
//! The SDK comes from a virtualenv: `$CONTEXT_PROXY_PYTHON` if set, else `.venv/bin/python`,
//! which this test creates (`python3 -m venv .venv && pip install openai`) when missing.

mod common;

use common::Harness;
use context_proxy::mock::Reply;
use serde_json::json;

#[tokio::test]
async fn official_python_sdk_works_through_the_proxy() {
    let python = common::python_with(&["openai"], &["openai"]);
    let h = Harness::start().await;
    h.mock.push(Reply::text("Hello from the mock."));
    h.mock.push(Reply::text("Streamed hello."));
    h.mock.push(Reply::tool_calls(vec![(
        "read_file".into(),
        json!({"path": "README.md"}),
    )]));
    h.mock.push(Reply::tool_calls(vec![
        ("read_file".into(), json!({"path": "a.rs"})),
        ("read_file".into(), json!({"path": "b.rs"})),
    ]));
    h.mock.push(Reply::error(
        429,
        json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
    ));
    let out = common::run_sdk_script(python, "sdk_client.py", h.url("/v1")).await;
    assert_eq!(out["text"], "Hello from the mock.");
    assert!(out["usage_prompt"].as_u64().unwrap() > 0);
    assert_eq!(out["stream_text"], "Streamed hello.");
    assert!(out["stream_usage_total"].as_u64().unwrap() > 0);
    assert_eq!(
        out["tool_calls"],
        json!([["read_file", {"path": "README.md"}]])
    );
    assert_eq!(
        out["stream_tool_calls"],
        json!([["read_file", {"path": "a.rs"}], ["read_file", {"path": "b.rs"}]])
    );
    assert_eq!(out["rate_limit"], "rate_limit_exceeded");

    let received = h.mock.received();
    assert_eq!(received.len(), 5);
    assert_eq!(received[0].headers["authorization"], "Bearer sk-e2e");
    assert_eq!(
        received[2].json()["tools"][0]["function"]["name"],
        "read_file"
    );
    assert_eq!(
        received[1].json()["stream_options"],
        json!({"include_usage": true})
    );
}
