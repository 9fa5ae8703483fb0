//! Streaming: events relayed live as the upstream sends them, untouched, and a client that
//! goes away cancels the upstream request. Also HTTP/2 (h2c) on the same port.

mod common;

use common::{sse_data, Harness, WAIT};
use context_proxy::mock::{Gate, MockConfig, Reply};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn stream_request() -> Value {
    json!({
        "model": "gpt-4o",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Say four words."}]
    })
}

#[tokio::test]
async fn first_event_arrives_before_the_upstream_sends_the_last() {
    let h = Harness::start().await;
    let gate = Gate::new();
    h.mock
        .push(Reply::text("one two three four").hold_after(2, gate.clone()));
    let resp = h.chat(&stream_request()).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = resp.bytes_stream();
    // The mock holds the rest of the stream until the gate opens: whatever arrives now was
    // relayed while the upstream was still mid-stream.
    let mut early = String::new();
    while sse_data(&early).len() < 2 {
        let chunk = tokio::time::timeout(WAIT, body.next())
            .await
            .expect("first events in time");
        early.push_str(std::str::from_utf8(&chunk.unwrap().unwrap()).unwrap());
    }
    assert_eq!(
        h.mock.streams_completed(),
        0,
        "upstream finished before the client saw anything"
    );
    let first: Value = serde_json::from_str(&sse_data(&early)[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    gate.open();
    let mut all = early;
    while let Some(chunk) = body.next().await {
        all.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events = sse_data(&all);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "one two three four");
}

#[tokio::test]
async fn stream_bytes_are_relayed_untouched() {
    let h = Harness::start().await;
    // Azure-style first chunk with empty choices, an obfuscation field, usage:null chunks,
    // an unknown event field, a comment line and CRLF-free framing: all must pass as they are.
    let upstream = concat!(
        ": keep-alive comment\n\n",
        "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\",\"prompt_filter_results\":[{\"prompt_index\":0}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"hm\"},\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"x1\"}\n\n",
        "event: vendor\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n",
        "data: [DONE]\n\n"
    );
    h.mock.push(Reply::raw(
        200,
        vec![(
            "content-type".into(),
            "text/event-stream; charset=utf-8".into(),
        )],
        bytes::Bytes::from_static(upstream.as_bytes()),
    ));
    let resp = h.chat(&stream_request()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap(), upstream.as_bytes());
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_stream() {
    let h = Harness::start_with(
        MockConfig {
            chunk_interval: std::time::Duration::from_millis(5),
            ..MockConfig::default()
        },
        |_| {},
    )
    .await;
    let long_text = "word ".repeat(2000);
    h.mock.push(Reply::text(long_text).stream_chunks(2000));
    let resp = h.chat(&stream_request()).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let first = tokio::time::timeout(WAIT, body.next())
        .await
        .expect("first chunk in time");
    assert!(!first.unwrap().unwrap().is_empty());
    drop(body); // the client goes away mid-stream
    assert!(
        h.mock.wait_stream_cancelled(WAIT).await,
        "the mock never saw the connection close"
    );
    assert_eq!(h.mock.streams_completed(), 0);
}

#[tokio::test]
async fn tool_call_stream_passes_through_with_fragments_and_indices() {
    let h = Harness::start().await;
    h.mock.push(Reply::tool_calls(vec![
        (
            "read_file".into(),
            json!({"path": "src/main.rs", "lines": [1, 200]}),
        ),
        (
            "run_command".into(),
            json!({"cmd": "cargo test -- --nocapture"}),
        ),
    ]));
    let resp = h.chat(&stream_request()).await;
    let text = resp.text().await.unwrap();
    let mut args = [String::new(), String::new()];
    let mut names = [String::new(), String::new()];
    let mut finish = None;
    for data in sse_data(&text) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        if let Some(reason) = v["choices"][0]["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
        for call in v["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                names[i].push_str(name);
            }
            args[i].push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(names, ["read_file", "run_command"]);
    assert_eq!(
        serde_json::from_str::<Value>(&args[0]).unwrap(),
        json!({"path": "src/main.rs", "lines": [1, 200]})
    );
    assert_eq!(
        serde_json::from_str::<Value>(&args[1]).unwrap(),
        json!({"cmd": "cargo test -- --nocapture"})
    );
    assert_eq!(finish.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn h2c_serves_chat_and_streams() {
    let h = Harness::start().await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = client
        .post(h.url("/v1/chat/completions"))
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    let resp = client
        .post(h.url("/v1/chat/completions"))
        .json(&stream_request())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let events = sse_data(&resp.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
}
