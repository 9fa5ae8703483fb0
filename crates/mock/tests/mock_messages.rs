//! Tests of the mock's Anthropic Messages side over real HTTP: the JSON and SSE shapes, the
//! thinking signatures round-tripping, the prompt cache in `usage`, `count_tokens`, the context
//! limit's wording and the error shape.

use context_proxy_mock::{MockConfig, MockUpstream, Reply};
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(mock: &MockUpstream, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "sk-ant-test")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

fn request(messages: Value) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "You are a coding agent. ".repeat(300),
                    "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read a file",
                   "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        "messages": messages,
    })
}

/// The events of an SSE body as `(name, data)`.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (head, data) = e.split_once('\n').unwrap();
            let name = head.strip_prefix("event: ").unwrap().to_string();
            (
                name,
                serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_tool_loop_with_thinking_round_trips_through_the_rules() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    mock.push(
        Reply::tool_calls(vec![("Read".into(), json!({"path": "/src/main.rs"}))])
            .thinking("I should read the file."),
    );
    mock.push(Reply::text("It prints hello.").thinking("Now I know."));
    let first = vec![json!({"role": "user", "content": "what does main.rs do?"})];
    let response = post(&mock, "/messages?beta=true", &request(json!(first))).await;
    assert_eq!(response.status(), 200);
    let message: Value = response.json().await.unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["stop_reason"], "tool_use");
    let content = message["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], "I should read the file.");
    assert!(content[0]["signature"]
        .as_str()
        .unwrap()
        .starts_with("EqMock"));
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["input"], json!({"path": "/src/main.rs"}));
    let usage = &message["usage"];
    assert!(
        usage["cache_creation_input_tokens"].as_u64().unwrap() > 1_000,
        "{usage}"
    );
    assert_eq!(usage["cache_read_input_tokens"], 0);

    // The client sends the answer back as it came, with the result: accepted, and the system
    // prompt is read from the cache.
    let id = content[1]["id"].as_str().unwrap();
    let mut messages = first.clone();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": "fn main() { println!(\"hello\") }"}]}));
    let mut body = request(json!(messages));
    body["stream"] = json!(true);
    let response = post(&mock, "/messages", &body).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = events(&response.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert!(names.contains(&"ping"));
    assert!(events
        .iter()
        .any(|(_, d)| d["delta"]["type"] == "signature_delta"));
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    let start = &events[0].1["message"]["usage"];
    assert!(
        start["cache_read_input_tokens"].as_u64().unwrap() > 1_000,
        "{start}"
    );
    let text: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "It prints hello.");

    // The same history with the latest thinking changed: refused as the API does.
    let mut changed = messages.clone();
    changed[1]["content"][0]["thinking"] = json!("I should read it.");
    let response = post(&mock, "/messages", &request(json!(changed))).await;
    assert_eq!(response.status(), 400);
    assert!(response.headers().contains_key("request-id"));
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cannot be modified"));
    assert!(error["request_id"].as_str().unwrap().starts_with("req_"));
    // Refused requests take no reply.
    assert_eq!(mock.pending_replies(), 0);
}

#[tokio::test]
async fn count_tokens_counts_what_messages_bills() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let body = request(json!([{"role": "user", "content": "hello there"}]));
    let counted: Value = post(&mock, "/messages/count_tokens", &body)
        .await
        .json()
        .await
        .unwrap();
    let n = counted["input_tokens"].as_u64().unwrap();
    let message: Value = post(&mock, "/messages", &body).await.json().await.unwrap();
    let u = &message["usage"];
    let billed = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|k| u[k].as_u64().unwrap())
    .sum::<u64>();
    assert_eq!(n, billed);
}

#[tokio::test]
async fn over_the_limit_the_prompt_is_too_long() {
    let mock = MockUpstream::start(MockConfig {
        context_limit: Some(500),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let body = request(json!([{"role": "user", "content": "hello"}]));
    let response = post(&mock, "/messages", &body).await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("prompt is too long: ") && message.ends_with(" tokens > 500 maximum"),
        "{message}"
    );
    // Without anthropic-version: refused.
    let response = client()
        .post(format!("{}/messages", mock.base_url()))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error["error"]["message"],
        "anthropic-version: header is required"
    );
}

#[tokio::test]
async fn a_scripted_read_back_names_the_reference_the_request_shows() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let placeholder = context_proxy_mock::REF_PLACEHOLDER;
    for _ in 0..2 {
        mock.push(Reply::tool_calls(vec![(
            "context_read".into(),
            json!({"ref": placeholder, "offset": 3}),
        )]));
    }
    let marker = "[context-proxy: stored as ctx_abcdefghijklmnopqrstuvw2. Call context_read]";
    let messages = json!([{"role": "user", "content": marker}]);
    let answer: Value = post(&mock, "/messages", &request(messages))
        .await
        .json()
        .await
        .unwrap();
    let call = answer["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        call["input"],
        json!({"ref": "ctx_abcdefghijklmnopqrstuvw2", "offset": 3})
    );
    // Without a reference in the messages, the placeholder stays as written.
    let plain = json!([{"role": "user", "content": "no marker; ctx_short"}]);
    let answer: Value = post(&mock, "/messages", &request(plain))
        .await
        .json()
        .await
        .unwrap();
    let call = answer["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(call["input"]["ref"], placeholder);
}
