//! Tests of the mock upstream itself, over real HTTP with reqwest: the OpenAI shapes it writes
//! (JSON and SSE), the context limit, verbatim errors and raw replies, the echo route, the control
//! API, client-disconnect detection, gates, latency, h2c and shutdown.

use std::time::{Duration, Instant};

use bytes::Bytes;
use context_proxy_mock::{Gate, MockConfig, MockUpstream, Reply, DEFAULT_REPLY_TEXT};
use context_proxy_tokens::Encoding;
use serde_json::{json, Value};

/// Failure guard for every wait: generous, never reached when things work.
const GUARD: Duration = Duration::from_secs(10);
/// How long a test watches for something that must not happen.
const QUIET: Duration = Duration::from_millis(300);

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn h2c_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap()
}

async fn start() -> MockUpstream {
    MockUpstream::start(MockConfig::default()).await.unwrap()
}

fn chat_body(model: &str, user: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a test."},
            {"role": "user", "content": user}
        ],
        "stream": stream,
    })
}

async fn post_chat(
    client: &reqwest::Client,
    mock: &MockUpstream,
    body: &Value,
) -> reqwest::Response {
    client
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn json_of(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

fn keys(value: &Value) -> Vec<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("{value} is not an object"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Reads SSE events from a response as they arrive.
struct SseReader {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl SseReader {
    fn new(response: reqwest::Response) -> SseReader {
        assert_eq!(header(&response, "content-type"), "text/event-stream");
        SseReader {
            response,
            buffer: Vec::new(),
        }
    }

    /// The data of the next event; `None` at the end of the body.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let event = String::from_utf8(event).unwrap();
                let data = event
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("event without `data: `: {event:?}"));
                return Some(data.trim_end_matches('\n').to_string());
            }
            match self.response.chunk().await.unwrap() {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => {
                    assert!(self.buffer.is_empty(), "trailing bytes {:?}", self.buffer);
                    return None;
                }
            }
        }
    }

    /// Every remaining chunk, checking that the stream ends with `[DONE]` and nothing after.
    async fn rest(mut self) -> Vec<Value> {
        let mut chunks = Vec::new();
        loop {
            let data = self.next().await.expect("stream ended without [DONE]");
            if data == "[DONE]" {
                assert_eq!(self.next().await, None, "data after [DONE]");
                return chunks;
            }
            chunks.push(serde_json::from_str(&data).unwrap());
        }
    }
}

/// Checks what every chunk of a stream shares and returns the shared id.
fn check_common(chunks: &[Value], model: &str) -> String {
    let first = &chunks[0];
    let id = first["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    assert!(first["created"].as_u64().unwrap() > 1_600_000_000);
    for chunk in chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert_eq!(chunk["id"], first["id"], "{chunk}");
        assert_eq!(chunk["created"], first["created"], "{chunk}");
        assert_eq!(chunk["model"], model, "{chunk}");
        assert_eq!(chunk["system_fingerprint"], first["system_fingerprint"]);
        assert_eq!(chunk["service_tier"], "default");
    }
    id
}

fn delta(chunk: &Value) -> &Value {
    &chunk["choices"][0]["delta"]
}

#[tokio::test]
async fn json_text_reply_has_openais_shape_and_real_token_counts() {
    let mock = MockUpstream::start(MockConfig {
        name: "alpha".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    mock.push(Reply::text("Hello, world."));
    let response = post_chat(
        &client(),
        &mock,
        &chat_body("gpt-4.1-mini", "Say hi", false),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "content-type"), "application/json");
    assert_eq!(header(&response, "x-mock-name"), "alpha");
    let body = json_of(response).await;

    assert_eq!(
        keys(&body),
        [
            "id",
            "object",
            "created",
            "model",
            "choices",
            "usage",
            "service_tier",
            "system_fingerprint"
        ]
    );
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-4.1-mini");
    assert_eq!(body["service_tier"], "default");
    assert!(body["system_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("fp_"));
    assert_eq!(
        body["choices"],
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello, world.", "refusal": null, "annotations": []},
            "logprobs": null,
            "finish_reason": "stop"
        }])
    );
    let enc = Encoding::for_model("gpt-4.1-mini");
    let prompt = enc.count("You are a test.") + enc.count("Say hi") + 2 * 3 + 3;
    let completion = enc.count("Hello, world.");
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        })
    );
}

/// OpenAI's prompt cache, as the mock plays it: the longest prefix of tools and messages seen
/// before, 0 under 1024 tokens, then in steps of 128; in JSON and in the stream's usage chunk.
#[tokio::test]
async fn the_prefix_seen_before_is_reported_as_cached_tokens() {
    let mock = start().await;
    let c = client();
    let enc = Encoding::for_model("gpt-4o");
    let long = "the quick brown fox jumps over the lazy dog ".repeat(150);
    let system_tokens = enc.count(&long) + 3;
    assert!(system_tokens > 1024 + 128);
    let body = |user: &str, stream: bool| {
        let mut body = chat_body("gpt-4o", user, stream);
        body["messages"][0]["content"] = json!(long);
        body
    };
    let cached = |usage: &Value| {
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let first = json_of(post_chat(&c, &mock, &body("one", false)).await).await;
    assert_eq!(cached(&first["usage"]), 0, "nothing seen before");
    // Another question after the same system message: its prefix is cached, in steps of 128.
    let second = json_of(post_chat(&c, &mock, &body("two", false)).await).await;
    let expected = 1024 + (system_tokens - 1024) / 128 * 128;
    assert_eq!(cached(&second["usage"]), expected as u64);
    assert!(cached(&second["usage"]) < second["usage"]["prompt_tokens"].as_u64().unwrap());
    // The same in a stream's usage chunk.
    let mut streamed = body("three", true);
    streamed["stream_options"] = json!({"include_usage": true});
    let text = post_chat(&c, &mock, &streamed).await.text().await.unwrap();
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
        .unwrap();
    assert_eq!(cached(&usage), expected as u64);
    // A different head: nothing cached.
    let other = json_of(post_chat(&c, &mock, &chat_body("gpt-4o", "one", false)).await).await;
    assert_eq!(cached(&other["usage"]), 0);
}

#[tokio::test]
async fn json_tool_calls_reply() {
    let mock = start().await;
    let args = json!({"path": "/tmp/a.txt", "lines": [1, 2]});
    mock.push(Reply::tool_calls(vec![
        ("read_file".into(), args.clone()),
        ("broken".into(), json!("{\"not\": json")),
    ]));
    let body =
        json_of(post_chat(&client(), &mock, &chat_body("gpt-4o", "read", false)).await).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(
        keys(message),
        ["role", "content", "tool_calls", "refusal", "annotations"]
    );
    assert_eq!(message["content"], Value::Null);
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    for call in calls {
        assert_eq!(keys(call), ["id", "type", "function"]);
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
    }
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    assert_eq!(calls[0]["function"]["name"], "read_file");
    let sent: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(sent, args);
    assert_eq!(calls[1]["function"]["arguments"], "{\"not\": json");
}

#[tokio::test]
async fn tool_call_ids_are_deterministic_per_script() {
    async fn ids() -> Vec<Value> {
        let mock = start().await;
        let client = client();
        let mut ids = Vec::new();
        for _ in 0..2 {
            mock.push(Reply::tool_calls(vec![("f".into(), json!({}))]));
            let body =
                json_of(post_chat(&client, &mock, &chat_body("gpt-4o", "x", false)).await).await;
            ids.push(body["choices"][0]["message"]["tool_calls"][0]["id"].clone());
            ids.push(body["id"].clone());
        }
        ids
    }
    let first = ids().await;
    assert_eq!(first, ids().await);
    assert_ne!(first[0], first[2], "two answers reused a call id");
    assert_ne!(first[1], first[3], "two answers reused a completion id");
}

#[tokio::test]
async fn replies_are_taken_in_order_then_the_default() {
    let mock = start().await;
    let client = client();
    mock.push(Reply::text("first"));
    mock.push(Reply::text("second"));
    // Requests on other paths do not take replies.
    let models = client
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    let mut contents = Vec::new();
    for _ in 0..3 {
        let body = json_of(post_chat(&client, &mock, &chat_body("gpt-4o", "x", false)).await).await;
        contents.push(body["choices"][0]["message"]["content"].clone());
    }
    assert_eq!(
        contents,
        [json!("first"), json!("second"), json!(DEFAULT_REPLY_TEXT)]
    );
    assert_eq!(mock.pending_replies(), 0);
}

#[tokio::test]
async fn streamed_text_is_split_into_word_chunks() {
    let mock = start().await;
    let text = "The quick brown fox jumps over the lazy dog.";
    mock.push(Reply::text(text));
    let response = post_chat(&client(), &mock, &chat_body("gpt-4o-mini", "x", true)).await;
    assert_eq!(response.status(), 200);
    let chunks = SseReader::new(response).rest().await;
    check_common(&chunks, "gpt-4o-mini");

    assert_eq!(
        *delta(&chunks[0]),
        json!({"role": "assistant", "content": "", "refusal": null})
    );
    let content: Vec<&str> = chunks[1..chunks.len() - 1]
        .iter()
        .map(|chunk| {
            assert_eq!(keys(delta(chunk)), ["content"]);
            delta(chunk)["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(content.len(), 9, "one chunk per word: {content:?}");
    assert_eq!(content.concat(), text);
    let last = chunks.last().unwrap();
    assert_eq!(*delta(last), json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    for chunk in &chunks {
        assert!(
            chunk.get("usage").is_none(),
            "usage without include_usage: {chunk}"
        );
        let choices = chunk["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 1);
        assert_eq!(
            keys(&choices[0]),
            ["index", "delta", "logprobs", "finish_reason"]
        );
    }
    for chunk in &chunks[..chunks.len() - 1] {
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
    }
    assert!(mock.wait_streams_completed(1, GUARD).await);
    assert_eq!(mock.streams_cancelled(), 0);
}

#[tokio::test]
async fn streamed_parallel_tool_calls_with_usage() {
    let mock = start().await;
    let read_args = json!({"path": "/var/log/app/server.log", "offset": 120, "limit": 40});
    let search_args = json!({"pattern": "fn main", "ref": "ctx_7f3a"});
    mock.push(Reply::tool_calls(vec![
        ("context_read".into(), read_args.clone()),
        ("context_search".into(), search_args.clone()),
    ]));
    let mut body = chat_body("gpt-4o", "look it up", true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = SseReader::new(post_chat(&client(), &mock, &body).await)
        .rest()
        .await;
    check_common(&chunks, "gpt-4o");

    let (usage_chunk, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    for chunk in chunks {
        assert_eq!(chunk["usage"], Value::Null, "{chunk}");
        assert!(chunk.as_object().unwrap().contains_key("usage"));
    }
    assert_eq!(
        *delta(&chunks[0]),
        json!({"role": "assistant", "content": "", "refusal": null})
    );
    let (finish, calls) = chunks[1..].split_last().unwrap();
    assert_eq!(*delta(finish), json!({}));
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");

    // Per call: a head with id, type, name and "" arguments, then only argument fragments.
    let mut seen: Vec<(String, String, Vec<String>)> = Vec::new();
    for chunk in calls {
        assert_eq!(keys(delta(chunk)), ["tool_calls"], "{chunk}");
        let parts = delta(chunk)["tool_calls"].as_array().unwrap();
        assert_eq!(parts.len(), 1);
        let part = &parts[0];
        let index = part["index"].as_u64().unwrap() as usize;
        if part.get("id").is_some() {
            assert_eq!(index, seen.len(), "calls must start in index order");
            assert_eq!(keys(part), ["index", "id", "type", "function"]);
            assert_eq!(part["type"], "function");
            assert_eq!(part["function"]["arguments"], "");
            let id = part["id"].as_str().unwrap();
            assert!(id.starts_with("call_"));
            let name = part["function"]["name"].as_str().unwrap();
            seen.push((id.to_string(), name.to_string(), Vec::new()));
        } else {
            assert_eq!(
                index + 1,
                seen.len(),
                "fragment for a call that is not the current one"
            );
            assert_eq!(keys(part), ["index", "function"]);
            assert_eq!(keys(&part["function"]), ["arguments"]);
            seen[index]
                .2
                .push(part["function"]["arguments"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(seen.len(), 2);
    assert_ne!(seen[0].0, seen[1].0);
    for ((_, name, fragments), (want_name, want_args)) in seen.iter().zip([
        ("context_read", &read_args),
        ("context_search", &search_args),
    ]) {
        assert_eq!(name, want_name);
        assert!(fragments.len() > 1, "arguments in one fragment");
        let joined: Value = serde_json::from_str(&fragments.concat()).unwrap();
        assert_eq!(&joined, want_args);
    }

    let enc = Encoding::for_model("gpt-4o");
    let completion = enc.count("context_read")
        + enc.count(&read_args.to_string())
        + enc.count("context_search")
        + enc.count(&search_args.to_string());
    let usage = &usage_chunk["usage"];
    assert_eq!(usage["completion_tokens"], completion);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion as u64
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn stream_chunks_gives_exactly_n_content_chunks() {
    let mock = start().await;
    mock.push(Reply::text("abcdefghij").stream_chunks(4));
    mock.push(Reply::text("ab").stream_chunks(5));
    let client = client();
    for (n, text) in [(4, "abcdefghij"), (5, "ab")] {
        let chunks =
            SseReader::new(post_chat(&client, &mock, &chat_body("gpt-4o", "x", true)).await)
                .rest()
                .await;
        let content: Vec<&str> = chunks
            .iter()
            .filter_map(|chunk| delta(chunk).get("content"))
            .skip(1) // the role chunk's ""
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(content.len(), n);
        assert_eq!(content.concat(), text);
    }
}

#[tokio::test]
async fn context_limit_gives_openais_exact_error_without_taking_a_reply() {
    let enc = Encoding::for_model("gpt-4o");
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Count these tokens, please."}]});
    let tokens = enc.count("Count these tokens, please.") + 3 + 3;

    let over = MockUpstream::start(MockConfig {
        context_limit: Some(tokens - 1),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    over.push(Reply::text("kept"));
    let response = post_chat(&client(), &over, &body).await;
    assert_eq!(response.status(), 400);
    assert_eq!(header(&response, "content-type"), "application/json");
    let expected = format!(
        r#"{{"error":{{"message":"This model's maximum context length is {} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}}}"#,
        tokens - 1
    );
    assert_eq!(response.text().await.unwrap(), expected);
    assert_eq!(over.pending_replies(), 1, "a refused request took a reply");
    assert_eq!(
        over.received().len(),
        1,
        "refused requests are recorded too"
    );

    let at_limit = MockUpstream::start(MockConfig {
        context_limit: Some(tokens),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(post_chat(&client(), &at_limit, &body).await.status(), 200);
}

#[tokio::test]
async fn upstream_errors_are_sent_verbatim_even_for_streams() {
    let mock = start().await;
    let error = json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}});
    mock.push(Reply::error(429, error.clone()));
    let response = post_chat(&client(), &mock, &chat_body("gpt-4o", "x", true)).await;
    assert_eq!(response.status(), 429);
    assert_eq!(header(&response, "content-type"), "application/json");
    assert_eq!(
        response.bytes().await.unwrap(),
        error.to_string().as_bytes()
    );
}

#[tokio::test]
async fn raw_replies_are_sent_verbatim() {
    let mock = start().await;
    mock.push(Reply::raw(
        502,
        vec![
            ("content-type".into(), "text/html".into()),
            ("x-upstream".into(), "edge-3".into()),
        ],
        Bytes::from_static(b"<html>Bad gateway</html>"),
    ));
    let response = post_chat(&client(), &mock, &chat_body("gpt-4o", "x", false)).await;
    assert_eq!(response.status(), 502);
    assert_eq!(header(&response, "content-type"), "text/html");
    assert_eq!(header(&response, "x-upstream"), "edge-3");
    assert_eq!(response.bytes().await.unwrap(), "<html>Bad gateway</html>");
}

#[tokio::test]
async fn malformed_chat_bodies_get_a_400_and_are_recorded() {
    let mock = start().await;
    mock.push(Reply::text("kept"));
    let response = client()
        .post(format!("{}/chat/completions", mock.base_url()))
        .body("{\"model\": \"gpt-4o\", \"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = json_of(response).await;
    assert_eq!(keys(&body["error"]), ["message", "type", "param", "code"]);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(mock.pending_replies(), 1);
    assert_eq!(mock.received()[0].json(), Value::Null);
}

#[tokio::test]
async fn other_paths_echo_the_request() {
    let mock = start().await;
    let body = "not json \u{1F600}";
    let response = client()
        .put(format!(
            "http://{}/v1/files/abc?purpose=batch&x=1",
            mock.addr()
        ))
        .header("x-custom", "kept as is")
        .header("authorization", "Bearer sk-test")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "x-mock-echo"), "1");
    let echo = json_of(response).await;
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["path"], "/v1/files/abc");
    assert_eq!(echo["query"], "purpose=batch&x=1");
    assert_eq!(echo["headers"]["x-custom"], "kept as is");
    assert_eq!(echo["headers"]["authorization"], "Bearer sk-test");
    assert_eq!(echo["body"], body);

    let received = mock.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].method, "PUT");
    assert_eq!(received[0].path, "/v1/files/abc");
    assert_eq!(received[0].query.as_deref(), Some("purpose=batch&x=1"));
    assert_eq!(received[0].headers["x-custom"], "kept as is");
    assert_eq!(received[0].body, body.as_bytes());
}

#[tokio::test]
async fn chat_requests_are_recorded_byte_for_byte() {
    let mock = start().await;
    // Odd spacing and key order must survive.
    let raw = "{ \"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],  \"model\":\"gpt-4o\",\"zeta\":1 }";
    let response = client()
        .post(format!(
            "{}/chat/completions?api-version=2024-10-21",
            mock.base_url()
        ))
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(mock.wait_received(1, GUARD).await);
    let received = &mock.received()[0];
    assert_eq!(received.body, raw.as_bytes());
    assert_eq!(received.path, "/v1/chat/completions");
    assert_eq!(received.query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(received.json()["zeta"], 1);
}

#[tokio::test]
async fn models_are_listed_in_openais_shape() {
    let mock = start().await;
    let list = json_of(
        client()
            .get(format!("{}/models", mock.base_url()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().unwrap();
    assert!(data.iter().any(|m| m["id"] == "gpt-4o"));
    for model in data {
        assert_eq!(keys(model), ["id", "object", "created", "owned_by"]);
        assert_eq!(model["object"], "model");
    }
}

#[tokio::test]
async fn control_api_scripts_lists_and_resets() {
    let mock = start().await;
    let client = client();
    let control = |path: &str| format!("http://{}/_mock/{path}", mock.addr());

    let replies = json!([
        {"text": "scripted"},
        {"tool_calls": [{"name": "f", "arguments": {"a": 1}}]},
        {"error": {"status": 503, "body": {"error": {"message": "overloaded", "type": "server_error", "param": null, "code": null}}}}
    ]);
    let queued = client
        .post(control("replies"))
        .body(replies.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 200);
    assert_eq!(json_of(queued).await, json!({"queued": 3, "pending": 3}));

    let bad = client
        .post(control("replies"))
        .body(r#"[{"txt": "typo"}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(json_of(bad).await["error"]["message"]
        .as_str()
        .unwrap()
        .contains("txt"));
    assert_eq!(
        mock.pending_replies(),
        3,
        "a rejected batch queued something"
    );

    let first = json_of(post_chat(&client, &mock, &chat_body("gpt-4o", "1", false)).await).await;
    assert_eq!(first["choices"][0]["message"]["content"], "scripted");
    let second = json_of(post_chat(&client, &mock, &chat_body("gpt-4o", "2", false)).await).await;
    assert_eq!(
        second["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    let third = post_chat(&client, &mock, &chat_body("gpt-4o", "3", false)).await;
    assert_eq!(third.status(), 503);

    let received = json_of(client.get(control("received")).send().await.unwrap()).await;
    let received = received.as_array().unwrap();
    assert_eq!(received.len(), 3, "control requests must not be recorded");
    for (i, request) in received.iter().enumerate() {
        assert_eq!(
            keys(request),
            ["method", "path", "query", "headers", "body"]
        );
        assert_eq!(request["method"], "POST");
        assert_eq!(request["path"], "/v1/chat/completions");
        assert_eq!(request["query"], Value::Null);
        let body: Value = serde_json::from_str(request["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["messages"][1]["content"], (i + 1).to_string());
    }

    mock.push(Reply::text("forgotten"));
    let reset = client.post(control("reset")).send().await.unwrap();
    assert_eq!(reset.status(), 200);
    assert!(mock.received().is_empty());
    assert_eq!(mock.pending_replies(), 0);
    let after = json_of(post_chat(&client, &mock, &chat_body("gpt-4o", "x", false)).await).await;
    assert_eq!(
        after["choices"][0]["message"]["content"],
        DEFAULT_REPLY_TEXT
    );

    let unknown = client.get(control("nope")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn every_response_names_its_mock() {
    let a = MockUpstream::start(MockConfig {
        name: "a".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let b = MockUpstream::start(MockConfig {
        name: "b".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let client = client();
    for (mock, name) in [(&a, "a"), (&b, "b")] {
        let chat = post_chat(&client, mock, &chat_body("gpt-4o", "x", true)).await;
        assert_eq!(header(&chat, "x-mock-name"), name);
        let echo = client
            .get(format!("http://{}/anything", mock.addr()))
            .send()
            .await
            .unwrap();
        assert_eq!(header(&echo, "x-mock-name"), name);
    }
    let unnamed = start().await;
    let response = client
        .get(format!("{}/models", unnamed.base_url()))
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("x-mock-name").is_none());
}

#[tokio::test]
async fn client_leaving_mid_stream_is_detected() {
    let mock = MockUpstream::start(MockConfig {
        chunk_interval: Duration::from_millis(2),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    mock.push(Reply::text("a long answer ".repeat(50)).stream_chunks(5_000));
    let mut reader =
        SseReader::new(post_chat(&client(), &mock, &chat_body("gpt-4o", "x", true)).await);
    for _ in 0..3 {
        assert!(reader.next().await.is_some());
    }
    drop(reader);
    assert!(
        mock.wait_stream_cancelled(GUARD).await,
        "cancellation not detected"
    );
    assert_eq!(mock.streams_completed(), 0);
}

#[tokio::test]
async fn client_leaving_while_held_is_detected_over_http1_and_h2c() {
    for client in [client(), h2c_client()] {
        let mock = start().await;
        let gate = Gate::new();
        mock.push(Reply::text("one two three four").hold_after(2, gate.clone()));
        let response = post_chat(&client, &mock, &chat_body("gpt-4o", "x", true)).await;
        let version = response.version();
        let mut reader = SseReader::new(response);
        assert!(reader.next().await.is_some());
        assert!(reader.next().await.is_some());
        drop(reader);
        assert!(
            mock.wait_stream_cancelled(GUARD).await,
            "held stream's client left unnoticed over {version:?}"
        );
        assert_eq!(mock.streams_completed(), 0);
    }
}

#[tokio::test]
async fn held_stream_waits_for_its_gate() {
    let mock = start().await;
    let gate = Gate::new();
    let text = "alpha beta gamma delta";
    mock.push(Reply::text(text).hold_after(3, gate.clone()));
    let mut reader =
        SseReader::new(post_chat(&client(), &mock, &chat_body("gpt-4o", "x", true)).await);
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(serde_json::from_str::<Value>(&reader.next().await.unwrap()).unwrap());
    }
    assert!(
        reader.buffer.is_empty(),
        "more than 3 events before the gate opened"
    );
    let early = tokio::time::timeout(QUIET, reader.response.chunk()).await;
    assert!(early.is_err(), "data arrived while held: {early:?}");
    assert_eq!(mock.streams_completed(), 0);

    gate.open();
    let after = reader.rest().await;
    let content: String = before
        .iter()
        .chain(&after)
        .filter_map(|chunk| delta(chunk)["content"].as_str())
        .collect();
    assert_eq!(content, text);
    assert!(mock.wait_streams_completed(1, GUARD).await);
    assert_eq!(mock.streams_cancelled(), 0);
}

#[tokio::test]
async fn held_json_reply_starts_only_when_the_gate_opens() {
    let mock = start().await;
    let gate = Gate::new();
    mock.push(Reply::text("late").hold_after(0, gate.clone()));
    let request = {
        let client = client();
        let url = format!("{}/chat/completions", mock.base_url());
        tokio::spawn(async move {
            let response = client
                .post(url)
                .body(chat_body("gpt-4o", "x", false).to_string())
                .send()
                .await
                .unwrap();
            json_of(response).await
        })
    };
    assert!(mock.wait_received(1, GUARD).await);
    let mut request = request;
    assert!(
        tokio::time::timeout(QUIET, &mut request).await.is_err(),
        "answered before the gate opened"
    );
    gate.open();
    let body = tokio::time::timeout(GUARD, request).await.unwrap().unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "late");
}

#[tokio::test]
async fn latency_delays_answers() {
    let enc = Encoding::for_model("gpt-4o");
    let fixed = Duration::from_millis(150);
    let mock = MockUpstream::start(MockConfig {
        latency: fixed,
        latency_per_input_token: Duration::from_millis(2),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let body = chat_body("gpt-4o", &"word ".repeat(50), false);
    let tokens = enc.count("You are a test.") + enc.count(&"word ".repeat(50)) + 9;
    let started = Instant::now();
    assert_eq!(post_chat(&client(), &mock, &body).await.status(), 200);
    let elapsed = started.elapsed();
    let expected = fixed + Duration::from_millis(2) * tokens as u32;
    assert!(elapsed >= expected, "{elapsed:?} < {expected:?}");
}

#[tokio::test]
async fn serves_h2c() {
    let mock = start().await;
    let client = h2c_client();
    let models = client
        .get(format!("{}/models", mock.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(models.version(), reqwest::Version::HTTP_2);
    assert_eq!(models.status(), 200);
    mock.push(Reply::text("over h2"));
    let response = post_chat(&client, &mock, &chat_body("gpt-4o", "x", true)).await;
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let chunks = SseReader::new(response).rest().await;
    check_common(&chunks, "gpt-4o");
    assert!(mock.wait_streams_completed(1, GUARD).await);
}

#[tokio::test]
async fn wait_received_times_out_when_nothing_comes() {
    let mock = start().await;
    assert!(!mock.wait_received(1, Duration::from_millis(20)).await);
}

#[tokio::test]
async fn bind_listens_where_asked() {
    let mock = MockUpstream::bind("127.0.0.1:0".parse().unwrap(), MockConfig::default())
        .await
        .unwrap();
    assert_eq!(mock.base_url(), format!("http://{}/v1", mock.addr()));
    let taken = MockUpstream::bind(mock.addr(), MockConfig::default()).await;
    assert_eq!(taken.unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
}

#[tokio::test]
async fn shutdown_stops_serving_and_ends_held_streams() {
    let mock = start().await;
    let gate = Gate::new();
    mock.push(Reply::text("never finished").hold_after(1, gate));
    let client = client();
    let mut reader =
        SseReader::new(post_chat(&client, &mock, &chat_body("gpt-4o", "x", true)).await);
    assert!(reader.next().await.is_some());
    let addr = mock.addr();
    tokio::time::timeout(GUARD, mock.shutdown())
        .await
        .expect("shutdown did not finish");
    assert!(
        reader.response.chunk().await.is_err(),
        "held stream ended cleanly after shutdown"
    );
    let refused = client.get(format!("http://{addr}/v1/models")).send().await;
    assert!(refused.unwrap_err().is_connect());
}
