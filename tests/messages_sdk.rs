//! End to end with the official Anthropic Python SDK as the client, through the proxy to the
//! strict mock: `messages.create`, `messages.stream` with its event helpers, a tool-use round,
//! extended thinking in a tool loop (the signed thinking block sent back and accepted), the
//! beta client (its `anthropic-beta` header), `count_tokens`, and an upstream error raised as the SDK's exception;
//! and the proxy's own read-back tools under a small budget, never seen by the SDK.
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

/// The proxy's own tools with the SDK: compaction forced by a small budget, the mock scripted
/// to read the stored a.rs back (`$ref`), in `messages.create` and `messages.stream`; the SDK
/// sees no injected tool or block, gets the needle and the usage of both upstream calls, and
/// its next turn (the merged message sent back) reaches the mock with the upstream transcript.
#[tokio::test]
async fn official_anthropic_sdk_never_sees_the_proxys_read_back() {
    let python = common::python_with(&["anthropic"], &["anthropic"]);
    let h = Harness::start_with(context_proxy::mock::MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(4_000);
        c.context.keep_recent_messages = 2;
    })
    .await;
    let read = || {
        Reply::tool_calls(vec![(
            "context_read".into(),
            json!({"ref": context_proxy::mock::REF_PLACEHOLDER, "offset": 75, "limit": 5}),
        )])
        .thinking("I need line 77.")
    };
    let found = || Reply::text("Line 77 holds NEEDLE-4217.").thinking("Found it.");
    for _ in 0..2 {
        h.mock.push(read());
        h.mock.push(found());
    }
    h.mock.push(Reply::text("You are welcome."));
    let out = common::run_sdk_script_with(
        python,
        "anthropic_client.py",
        vec![h.url(""), "reload".into()],
    )
    .await;
    for prefix in ["", "stream_"] {
        assert_eq!(
            out[format!("{prefix}kinds")],
            json!(["thinking", "thinking", "text"])
        );
        assert!(out[format!("{prefix}text")]
            .as_str()
            .unwrap()
            .contains("NEEDLE-4217"));
    }
    assert_eq!(out["stop_reason"], "end_turn");
    assert_eq!(out["stream_starts"], json!([0, 1, 2]));
    assert_eq!(
        out["stream_events"],
        json!({"message_start": 1, "message_delta": 1, "message_stop": 1})
    );
    assert_eq!(out["after"], "You are welcome.");

    let sent: Vec<Vec<u8>> = h
        .mock
        .received()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| r.body.to_vec())
        .collect();
    assert_eq!(sent.len(), 5);
    // Usage: both upstream calls of each answer.
    let expected = common::messages_usage(&sent[..2], vec![read(), found()]).await;
    assert_eq!(common::messages_prompt_and_output(&out["usage"]), expected);
    assert_eq!(
        common::messages_prompt_and_output(&out["stream_usage"]),
        expected
    );
    // The read really happened, and the next turn carries it back to the model.
    let round_two = String::from_utf8_lossy(&sent[1]);
    assert!(round_two.contains("NEEDLE-4217"));
    let next: serde_json::Value = serde_json::from_slice(&sent[4]).unwrap();
    let uses: Vec<&str> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(uses, ["Read", "Read", "context_read"]);
}
