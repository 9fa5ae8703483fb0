//! The mock's Responses API over real HTTP: the `response` object, the SSE events of a
//! streamed response in the API's order with one sequence counter, reasoning items with
//! encrypted content, custom tool calls, the prompt cache in `cached_tokens`, and the API's
//! 400s (pairing, context window).

use context_proxy_mock::{MockConfig, MockUpstream, Reply};
use serde_json::{json, Value};

async fn post(mock: &MockUpstream, body: &Value) -> reqwest::Response {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}/responses", mock.base_url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The events of an SSE body as (event name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            let (head, data) = frame.split_once('\n').unwrap();
            let name = head.strip_prefix("event: ").unwrap().to_string();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name, data)
        })
        .collect()
}

fn codex_like(input: Value) -> Value {
    json!({
        "model": "gpt-5",
        "instructions": "You are a coding agent.",
        "input": input,
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}, "strict": false},
            {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
        ],
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": false,
        "prompt_cache_key": "thread-1",
    })
}

#[tokio::test]
async fn json_response_has_the_apis_shape() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    mock.push(Reply::text_and_tool_calls(
        "Running it.",
        vec![
            ("shell".into(), json!({"cmd": "ls"})),
            (
                "apply_patch".into(),
                json!("*** Begin Patch\n*** End Patch"),
            ),
        ],
    ));
    let response = post(&mock, &codex_like(json!("list the files"))).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(body["store"], false);
    assert_eq!(body["prompt_cache_key"], "thread-1");
    let output = body["output"].as_array().unwrap();
    let types: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["reasoning", "message", "function_call", "custom_tool_call"]
    );
    assert!(output[0]["encrypted_content"]
        .as_str()
        .unwrap()
        .starts_with("gAAAAB"));
    assert_eq!(output[1]["content"][0]["text"], "Running it.");
    assert_eq!(output[2]["arguments"], r#"{"cmd":"ls"}"#);
    assert!(output[2]["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(output[3]["input"], "*** Begin Patch\n*** End Patch");
    let usage = &body["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 10);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        usage["total_tokens"],
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
}

#[tokio::test]
async fn streamed_response_follows_the_event_order() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    mock.push(Reply::text_and_tool_calls(
        "Let me look.",
        vec![("shell".into(), json!({"cmd": "cat README.md"}))],
    ));
    let mut body = codex_like(json!([{"role": "user", "content": "read it"}]));
    body["stream"] = json!(true);
    let response = post(&mock, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    assert!(!text.contains("[DONE]"));
    let events = events(&text);
    for (n, (name, data)) in events.iter().enumerate() {
        assert_eq!(&data["type"], name);
        assert_eq!(data["sequence_number"], n, "{name}");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    // Codex asks for reasoning summaries (`summary: "auto"`): the reasoning item streams one.
    let summary: Vec<&str> = names[3..]
        .iter()
        .copied()
        .take_while(|n| n.starts_with("response.reasoning_summary"))
        .collect();
    assert_eq!(summary[0], "response.reasoning_summary_part.added");
    assert!(summary[1..summary.len() - 2]
        .iter()
        .all(|n| *n == "response.reasoning_summary_text.delta"));
    assert_eq!(
        summary[summary.len() - 2..],
        [
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done"
        ]
    );
    let names: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !n.starts_with("response.reasoning_summary"))
        .collect();
    let expected_start = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ];
    assert_eq!(names[..6], expected_start);
    assert_eq!(names.last(), Some(&"response.completed"));
    // Every item opened is closed, in output_index order.
    let added: Vec<u64> = events
        .iter()
        .filter(|(n, _)| n == "response.output_item.added")
        .map(|(_, d)| d["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(added, [0, 1, 2]);
    let arguments: String = events
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(arguments, r#"{"cmd":"cat README.md"}"#);
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"].as_array().unwrap().len(), 3);
    assert!(completed["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["usage"], Value::Null);
}

#[tokio::test]
async fn a_repeated_prefix_is_reported_cached() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let long = "word ".repeat(2000);
    let first = codex_like(json!([{"role": "user", "content": long}]));
    let body: Value = post(&mock, &first).await.json().await.unwrap();
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], 0);
    let second = codex_like(json!([
        {"role": "user", "content": long},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more"}]));
    let body: Value = post(&mock, &second).await.json().await.unwrap();
    let cached = body["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let input = body["usage"]["input_tokens"].as_u64().unwrap();
    assert!(cached >= 1024 && cached < input, "{cached} of {input}");
    assert_eq!((cached - 1024) % 128, 0);
}

#[tokio::test]
async fn the_apis_refusals() {
    let mock = MockUpstream::start(MockConfig {
        context_limit: Some(500),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let orphan = codex_like(json!([
        {"role": "user", "content": "x"},
        {"type": "function_call_output", "call_id": "call_gone", "output": "r"}]));
    let response = post(&mock, &orphan).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "No tool call found for function call output with call_id call_gone."
    );
    let too_long = codex_like(json!("word ".repeat(1000)));
    let response = post(&mock, &too_long).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    assert_eq!(body["error"]["param"], "input");
    assert_eq!(mock.pending_replies(), 0);
}

/// A mock playing a Responses server that is not OpenAI knows no compaction: the trigger and
/// a compaction item are unknown item types (the API's 400), `/responses/compact` a 404;
/// everything else is served as usual.
#[tokio::test]
async fn without_compaction_the_trigger_is_an_unknown_item_type() {
    let mock = MockUpstream::start(MockConfig {
        without_compaction: true,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let user = json!({"role": "user", "content": "go"});
    for (item, at) in [
        (json!({"type": "compaction_trigger"}), 1),
        (
            json!({"type": "compaction", "encrypted_content": "gAAAABx"}),
            0,
        ),
    ] {
        let input = if at == 1 {
            json!([user, item])
        } else {
            json!([item, user])
        };
        let response = post(&mock, &codex_like(input)).await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.unwrap();
        let kind = item["type"].as_str().unwrap();
        assert_eq!(error["error"]["code"], "invalid_value");
        assert_eq!(error["error"]["param"], format!("input[{at}]"));
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("Invalid value: '{kind}'. Supported values are:")),
            "{message}"
        );
        let (_, supported) = message.split_once("Supported values are:").unwrap();
        assert!(!supported.contains("compaction"), "{message}");
        assert!(supported.contains("'function_call_output'"), "{message}");
    }
    let compact = reqwest::Client::new()
        .post(format!("{}/responses/compact", mock.base_url()))
        .json(&json!({"model": "gpt-5", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(compact.status(), 404);
    // A turn without compaction is answered.
    mock.push(Reply::text("ok"));
    let response = post(&mock, &codex_like(json!([user]))).await;
    assert_eq!(response.status(), 200);
}
