//! End to end with the official Anthropic Python SDK as the client, through the proxy to the
//! strict mock: `messages.create`, `messages.stream` with its event helpers, a tool-use round,
//! extended thinking in a tool loop (the signed thinking block sent back and accepted), the
//! beta client (its `anthropic-beta` header), `count_tokens`, and an upstream error raised as the SDK's exception.
//!
//! The SDK comes from `.venv` (`scripts/test` installs it; `$CONTEXT_PROXY_PYTHON` overrides).

mod common;

use common::Harness;
use context_proxy::mock::Reply;
use serde_json::json;

#[tokio::test]
async fn official_anthropic_sdk_works_through_the_proxy() {
    let python = common::python_with(&["anthropic"], &["anthropic"]);
    let h = Harness::start().await;
    h.mock.push(Reply::text("Hello from the mock."));
    h.mock.push(Reply::text("Streamed hello."));
    h.mock.push(Reply::tool_calls(vec![(
        "read_file".into(),
        json!({"path": "README.md"}),
    )]));
    h.mock.push(Reply::text("The README is short."));
    h.mock.push(
        Reply::tool_calls(vec![("read_file".into(), json!({"path": "a.rs"}))])
            .thinking("I should read a.rs first."),
    );
    h.mock
        .push(Reply::text("a.rs defines a.").thinking("Now I know."));
    h.mock.push(Reply::text("beta hello"));
    h.mock.push(Reply::error(
        429,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}, "request_id": "req_x"}),
    ));
    let out = common::run_sdk_script(python, "anthropic_client.py", h.url("")).await;
    assert_eq!(out["text"], "Hello from the mock.");
    assert!(out["usage_input"].as_u64().unwrap() > 0);
    assert_eq!(out["stream_text"], "Streamed hello.");
    assert_eq!(out["stream_final_text"], "Streamed hello.");
    assert!(out["stream_usage_output"].as_u64().unwrap() > 0);
    assert_eq!(out["tool_use"], json!(["read_file", {"path": "README.md"}]));
    assert_eq!(out["after_tool"], "The README is short.");
    assert_eq!(out["thinking_kinds"], json!(["thinking", "tool_use"]));
    assert_eq!(out["thinking_text"], "I should read a.rs first.");
    assert_eq!(out["thinking_signed"], true);
    assert_eq!(out["thinking_tool_input"], json!({"path": "a.rs"}));
    assert_eq!(out["thinking_after"], json!(["thinking", "text"]));
    assert_eq!(out["beta_text"], "beta hello");
    assert!(out["count"].as_u64().unwrap() > 0);
    assert_eq!(out["rate_limit"], "rate_limit_error");

    let received = h.mock.received();
    let messages: Vec<_> = received
        .iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    assert_eq!(messages.len(), 8);
    // The client's key and Anthropic's headers pass byte for byte.
    // (This SDK sends its key as a bearer token.)
    assert_eq!(messages[0].headers["authorization"], "Bearer sk-ant-e2e");
    assert!(messages[0].headers.contains_key("anthropic-version"));
    assert_eq!(
        messages[6].headers["anthropic-beta"],
        "interleaved-thinking-2025-05-14"
    );
}
