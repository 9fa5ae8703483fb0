//! The official OpenAI Python SDK's Responses API (`responses.create`, `responses.stream`)
//! through the proxy, against the mock's strict Responses API: a long Codex-like input is
//! managed on the way (the client sees only the mock's answer), a function call round trips,
//! and the stream helper, which checks the event order, assembles the streamed answer.

mod common;

use common::Harness;
use context_proxy::context::settings::WindowEntry;
use context_proxy::mock::{MockConfig, Reply};
use serde_json::{json, Value};

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

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

/// A small budget: the 600-line output (about 10,000 tokens) does not fit, so the proxy must
/// take it out of the context; `keep_recent_messages` and the batch stay at their defaults
/// (the output is among the recent messages: nothing else would move it).
fn small_budget(c: &mut context_proxy::app::config::Config) {
    c.context.max_context_tokens = Some(SMALL_BUDGET);
}

const SMALL_BUDGET: usize = 4_000;

/// The mock in reader mode: it answers "Recall the needles: port" with what it sees, reading
/// every reference the input names with `context_read` while the needle is not shown.
fn reader() -> MockConfig {
    MockConfig {
        reader: true,
        ..MockConfig::default()
    }
}

/// One SDK call (`create` or `stream`) of `sdk_responses_reload.*`: the upstream was sent the
/// request with the proxy's tools and without the needle, then the read answered with it; the
/// answer holds the needle; the usage the client saw is every upstream call's.
async fn assert_read_back(h: &Harness, sent: &[Value], text: &Value, usage: &Value) {
    assert_eq!(text, "port=7411", "the answer holds the needle");
    assert_eq!(sent.len(), 2, "one read, one answer");
    let names: Vec<&str> = sent[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shell", "context_read", "context_search"]);
    assert!(
        !sent[0].to_string().contains("NEEDLE port=7411"),
        "the needle was taken out of the context"
    );
    let last = sent[1]["input"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "function_call_output");
    assert!(last["output"]
        .as_str()
        .unwrap()
        .contains("NEEDLE port=7411"));
    let mut billed = 0;
    for body in sent {
        billed += common::billed_input_tokens(&h.mock, body).await;
    }
    assert_eq!(usage["input_tokens"], billed);
    assert!(usage["output_tokens"].as_u64().unwrap() > 0);
    assert!(usage["input_tokens_details"]["cached_tokens"].is_u64());
}

/// What both SDKs' runs of `sdk_responses_reload.*` must show.
async fn assert_sdk_read_back(h: &Harness, out: &Value) {
    assert_eq!(out["create_reload"], "rounds=1,calls=1,failed=0");
    let tokens = &out["create_tokens"];
    assert!(
        tokens[0].as_u64().unwrap() > SMALL_BUDGET as u64
            && tokens[1].as_u64().unwrap() <= SMALL_BUDGET as u64,
        "the budget forced it: {tokens}"
    );
    assert_eq!(out["create_types"], json!(["message"]));
    assert_eq!(out["create_tools"], json!(["shell"]));
    assert_eq!(out["stream_types"], json!(["message"]));
    let events = out["stream_events"].as_array().unwrap();
    assert_eq!(events[0], "response.created");
    assert_eq!(events.last().unwrap(), "response.completed");
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(received.len(), 4);
    assert_read_back(h, &received[..2], &out["create_text"], &out["create_usage"]).await;
    assert_read_back(
        h,
        &received[2..4],
        &out["stream_text"],
        &out["stream_usage"],
    )
    .await;
}

#[tokio::test]
async fn the_python_sdk_reads_back_through_the_proxy_unseen() {
    let python = common::python_with(&["openai"], &["openai"]);
    let h = Harness::start_with(reader(), small_budget).await;
    let out = common::run_sdk_script(python, "sdk_responses_reload.py", h.url("/v1")).await;
    assert_sdk_read_back(&h, &out).await;
}

#[tokio::test]
async fn the_node_sdk_reads_back_through_the_proxy_unseen() {
    let modules = common::node_modules_with(&["openai"]);
    let h = Harness::start_with(reader(), small_budget).await;
    let out = common::run_node_script(modules, "sdk_responses_reload.cjs", h.url("/v1")).await;
    assert_sdk_read_back(&h, &out).await;
}

#[tokio::test]
async fn the_python_stream_helper_ends_cleanly_on_an_upstream_error_event() {
    let python = common::python_with(&["openai"], &["openai"]);
    let h = Harness::start_with(MockConfig::default(), small_budget).await;
    // A plain managed stream: nothing moved out, nothing offered, the upstream's relayed.
    h.mock.push(common::responses_error_stream(
        "Line",
        "server_error",
        "The model failed.",
    ));
    // The proxy's tool loop: round one reads back, round two fails.
    let r = context_proxy::store::ContentRef::of(&numbered_lines("a.rs", 600));
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": r.as_str(), "offset": 7, "limit": 1}),
    )]));
    h.mock.push(common::responses_error_stream(
        "Line 7",
        "rate_limit_exceeded",
        "Rate limit reached. Please try again in 2s.",
    ));
    let out = common::run_sdk_script(python, "sdk_responses_failed.py", h.url("/v1")).await;
    for (run, code, message) in [
        ("plain", "server_error", "The model failed."),
        (
            "loop",
            "rate_limit_exceeded",
            "Rate limit reached. Please try again in 2s.",
        ),
    ] {
        let seen = &out[run];
        let events: Vec<&str> = seen["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert_eq!(events[0], "response.created", "{run}: {seen}");
        assert_eq!(*events.last().unwrap(), "response.failed", "{run}: {seen}");
        assert!(!events.contains(&"error"), "{run}: {seen}");
        assert_eq!(seen["error"], json!([code, message]), "{run}");
        assert_eq!(seen["status"], "failed");
        assert_eq!(seen["same_id"], true);
        assert!(
            seen["final"]
                .as_str()
                .unwrap()
                .starts_with("raised: Didn't receive a `response.completed` event"),
            "{run}: {seen}"
        );
    }
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(received.len(), 3);
    let names = |body: &Value| body["tools"].as_array().unwrap().len();
    assert_eq!(
        names(&received[0]),
        1,
        "the plain stream offered the proxy's tools"
    );
    assert_eq!(names(&received[1]), 3);
}
