//! Every error the client can get: OpenAI shape, right status, a message a person can act
//! on; and an upstream's own errors relayed unchanged.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{assert_openai_error, config_for, Harness};
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, Reply};
use serde_json::json;

#[tokio::test]
async fn malformed_json_is_a_400_that_says_what_and_where() {
    let h = Harness::start().await;
    let resp = h.chat_raw("{\n  \"model\": \"gpt-4o\",\n  \"messages\": [\n    {\"role\": \"user\" \"content\": \"hi\"}\n  ]\n}").await;
    assert_eq!(resp.status(), 400);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(err["type"], "invalid_request_error");
    assert_eq!(err["code"], "invalid_json");
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains("line 4") && msg.contains("column"), "{msg}");
    assert!(msg.contains("expected `,` or `}`"), "{msg}");
    assert!(
        h.mock.received().is_empty(),
        "a broken request must not reach the upstream"
    );
}

#[tokio::test]
async fn bodies_that_are_not_objects_or_empty_get_clear_400s() {
    let h = Harness::start().await;
    for body in ["", "[]", "\"text\"", "null", "{\"model\":", "\u{feff}{}"] {
        let resp = h.chat_raw(body).await;
        assert_eq!(resp.status(), 400, "body {body:?}");
        assert_openai_error(&resp.bytes().await.unwrap());
    }
    let resp = h.chat_raw(vec![0xff_u8, 0xfe, 0x00, 0x7b]).await;
    assert_eq!(resp.status(), 400);
    assert_openai_error(&resp.bytes().await.unwrap());
}

#[tokio::test]
async fn body_over_the_limit_is_a_413_with_or_without_content_length() {
    let h = Harness::start_with(MockConfig::default(), |c| c.server.max_body_bytes = 1024).await;
    let big =
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x".repeat(4096)}]})
            .to_string();
    let resp = h.chat_raw(big.clone()).await;
    assert_eq!(resp.status(), 413);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert!(err["message"].as_str().unwrap().contains("max_body_bytes"));

    let chunks: Vec<Result<Bytes, std::io::Error>> = big
        .as_bytes()
        .chunks(100)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let resp = h
        .chat_raw(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .await;
    assert_eq!(resp.status(), 413);
    assert_openai_error(&resp.bytes().await.unwrap());
    assert!(h.mock.received().is_empty());
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let proxy = RunningServer::start(
        config_for(&format!("http://127.0.0.1:{port}/v1"))
            .validate()
            .unwrap(),
    )
    .await
    .unwrap();
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .json(&json!({"model": "gpt-4o", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(err["code"], "upstream_unreachable");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("upstream default"),
        "{err}"
    );
}

#[tokio::test]
async fn silent_upstream_is_a_504() {
    let h = Harness::start_with(
        MockConfig {
            latency: Duration::from_secs(30),
            ..MockConfig::default()
        },
        |c| c.upstreams[0].read_timeout_ms = 200,
    )
    .await;
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(resp.status(), 504);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(err["code"], "upstream_timeout");
    assert!(err["message"].as_str().unwrap().contains("read_timeout_ms"));
}

#[tokio::test]
async fn upstream_errors_reach_the_client_unchanged() {
    let h = Harness::start().await;
    let body = r#"{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    h.mock.push(Reply::raw(
        429,
        vec![
            ("content-type".into(), "application/json".into()),
            ("retry-after".into(), "7".into()),
        ],
        Bytes::from_static(body.as_bytes()),
    ));
    let overflow = json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
    h.mock.push(Reply::error(400, overflow.clone()));
    h.mock.push(Reply::raw(
        500,
        vec![("content-type".into(), "text/html".into())],
        Bytes::from_static(b"<html>oops</html>"),
    ));

    let req = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let resp = h.chat(&req).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    assert_eq!(resp.bytes().await.unwrap(), body.as_bytes());
    let resp = h.chat(&req).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap(), overflow);
    // Even an upstream's HTML error passes through as the upstream's own answer.
    let resp = h.chat(&req).await;
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.bytes().await.unwrap(), &b"<html>oops</html>"[..]);
}

#[tokio::test]
async fn unknown_paths_and_methods_get_openai_shaped_errors() {
    let h = Harness::start().await;
    let resp = h.client.get(h.url("/index.html")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert!(err["message"].as_str().unwrap().contains("/v1/"));
    let resp = h.client.post(h.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert_openai_error(&resp.bytes().await.unwrap());
}

#[tokio::test]
async fn a_messages_stream_that_falls_silent_ends_with_anthropics_error_event() {
    let h = Harness::start_with(
        MockConfig {
            chunk_interval: Duration::from_secs(5),
            ..MockConfig::default()
        },
        |c| c.upstreams[0].read_timeout_ms = 200,
    )
    .await;
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(
            &json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let request_id = resp.headers()["x-context-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    // The last event is Anthropic's `error` event, as the SDKs read it, not OpenAI's shape.
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let data = last.strip_prefix("event: error\ndata: ").expect(last);
    let event: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(event["type"], "error");
    assert_eq!(event["error"]["type"], "api_error");
    assert!(event["error"]["message"]
        .as_str()
        .unwrap()
        .contains("upstream default sent nothing for 200 ms"));
    assert_eq!(event["request_id"], request_id.as_str());
}
