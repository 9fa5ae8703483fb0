//! Reload with real client libraries: the official OpenAI Python SDK's
//! `client.chat.completions.stream()` assembles consistent tool calls when the model reads back
//! through the proxy and calls the client's tool in the same answer, and an OpenAI Agents SDK
//! run in which the model reads back and then calls a client tool completes, on chat
//! completions and on the Agents SDK's default model, the Responses API. None ever sees the
//! proxy's tools (the scripts check every event and item they receive).
//!
//! Needs `.venv` with `openai` and `openai-agents` (`.ci/run` installs them; this test installs
//! them when missing).

mod common;

use common::Harness;
use context_proxy::mock::{MockConfig, Reply};
use context_proxy::store::ContentRef;
use serde_json::json;

fn lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

#[tokio::test]
async fn real_client_libraries_never_see_the_proxys_tools() {
    let python = common::python_with(&["openai", "agents"], &["openai", "openai-agents"]);
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let ref_a = ContentRef::of(&lines("a.rs", 600)).as_str().to_string();
    let read_a = || {
        (
            "context_read".to_string(),
            json!({"ref": ref_a, "offset": 7, "limit": 1}),
        )
    };
    // chat.completions.stream(): one answer calling the proxy's tool and the client's.
    h.mock.push(Reply::tool_calls(vec![
        read_a(),
        ("read_file".into(), json!({"path": "c.rs"})),
    ]));
    // The Agents SDK run: read a.rs, read b.rs, read back line 7 (the proxy answers), run the
    // tests, answer.
    h.mock.push(Reply::tool_calls(vec![(
        "read_file".into(),
        json!({"path": "a.rs"}),
    )]));
    h.mock.push(Reply::tool_calls(vec![(
        "read_file".into(),
        json!({"path": "b.rs"}),
    )]));
    h.mock.push(Reply::tool_calls(vec![read_a()]));
    h.mock
        .push(Reply::tool_calls(vec![("run_tests".into(), json!({}))]));
    h.mock
        .push(Reply::text("Line 7 computes value_7; 12 tests pass."));

    let seen = common::run_sdk_script(python, "sdk_reload.py", h.url("/v1")).await;
    assert_eq!(
        seen["stream_calls"],
        json!([["read_file", {"path": "c.rs"}]])
    );
    assert_eq!(
        seen["agent_output"],
        "Line 7 computes value_7; 12 tests pass."
    );
    assert_eq!(
        seen["agent_calls"],
        json!([["read_file", "a.rs"], ["read_file", "b.rs"], ["run_tests"]])
    );

    // What the upstream saw: the proxy's call answered with the stored line each time.
    let received = h.mock.received();
    let answered: Vec<String> = received
        .iter()
        .flat_map(|r| r.json()["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .filter(|c| c.starts_with("[context_read"))
        .collect();
    assert!(
        answered
            .iter()
            .any(|c| c.contains("a.rs line 7: let value_7")),
        "{answered:?}"
    );
}

/// An Agents SDK Agent on its default model (the Responses API) with function tools: the model
/// reads two files, reads a line of the first back through the proxy (taken out of the context
/// by then: the two files do not fit the small budget; `keep_recent_messages` at its default),
/// runs the tests and answers; the agent never sees the proxy's tool, and its usage is every
/// upstream call's.
#[tokio::test]
async fn an_agent_on_the_responses_api_reads_back_unseen() {
    let python = common::python_with(&["openai", "agents"], &["openai", "openai-agents"]);
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(4_000);
    })
    .await;
    let ref_a = ContentRef::of(&lines("a.rs", 600)).as_str().to_string();
    for path in ["a.rs", "b.rs"] {
        h.mock.push(Reply::tool_calls(vec![(
            "read_file".into(),
            json!({ "path": path }),
        )]));
    }
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": ref_a, "offset": 7, "limit": 1}),
    )]));
    h.mock
        .push(Reply::tool_calls(vec![("run_tests".into(), json!({}))]));
    h.mock
        .push(Reply::text("Line 7 computes value_7; 12 tests pass."));

    let seen = common::run_sdk_script(python, "agents_responses_reload.py", h.url("/v1")).await;
    assert_eq!(
        seen["agent_output"],
        "Line 7 computes value_7; 12 tests pass."
    );
    assert_eq!(
        seen["agent_calls"],
        json!([["read_file", "a.rs"], ["read_file", "b.rs"], ["run_tests"]])
    );
    // Four model responses for the agent, five upstream calls: the read-back was the proxy's.
    assert_eq!(seen["responses"], 4);
    let received = h.mock.received();
    assert_eq!(received.len(), 5);
    assert!(received.iter().all(|r| r.path == "/v1/responses"));
    let line_300 = "a.rs line 300: let value_300";
    assert!(
        !received[2].json().to_string().contains(line_300),
        "the budget took a.rs out of the context before the read-back"
    );
    let answered: Vec<String> = received
        .iter()
        .flat_map(|r| r.json()["input"].as_array().cloned().unwrap_or_default())
        .filter(|i| i["type"] == "function_call_output")
        .filter_map(|i| i["output"].as_str().map(str::to_string))
        .filter(|o| o.starts_with("[context_read"))
        .collect();
    assert!(
        answered
            .iter()
            .any(|o| o.contains("a.rs line 7: let value_7")),
        "{answered:?}"
    );
    // The agent's usage is the five upstream calls'.
    let bodies: Vec<serde_json::Value> = received.iter().map(|r| r.json()).collect();
    let mut billed = 0;
    for body in &bodies {
        billed += common::billed_input_tokens(&h.mock, body).await;
    }
    assert_eq!(seen["input_tokens"], billed);
}
