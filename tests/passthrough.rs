//! Lossless forwarding: unknown fields both ways, byte-identical bodies, verbatim non-chat
//! routes, header handling and model routing, through the real proxy and the mock upstream.

mod common;

use bytes::Bytes;
use common::{config_for, Harness, WAIT};
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

const FULL_REQUEST: &str = include_str!("fixtures/full_request.json");

#[tokio::test]
async fn full_openai_request_reaches_upstream_byte_identical() {
    let h = Harness::start().await;
    let resp = h.chat_raw(FULL_REQUEST).await;
    assert_eq!(resp.status(), 200);
    let received = h.mock.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert_eq!(
        received[0].body,
        Bytes::from_static(FULL_REQUEST.as_bytes())
    );
    // And the parsed view still has every field, in order.
    let sent: Value = serde_json::from_str(FULL_REQUEST).unwrap();
    assert_eq!(received[0].json(), sent);
    let keys_sent: Vec<_> = sent.as_object().unwrap().keys().collect();
    let got = received[0].json();
    let keys_got: Vec<_> = got.as_object().unwrap().keys().collect();
    assert_eq!(keys_sent, keys_got);
}

#[tokio::test]
async fn odd_but_valid_json_is_forwarded_byte_identical() {
    let h = Harness::start().await;
    let bodies: [&[u8]; 4] = [
        b"  {\"messages\" : [ {\"role\":\"user\",\"content\":\"\\u0068i\"} ] ,\n\t\"model\":\"gpt-4o\"}  \n",
        br#"{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"seed":123456789012345678901234567890,"temperature":1.0000000000000000001}"#,
        br#"{"model":"gpt-4o","model":"gpt-4o-mini","messages":[{"role":"user","content":"dup keys"}]}"#,
        "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"日本語 😀 \\ud83d\\ude00\"}]}".as_bytes(),
    ];
    // Managed (parsed, nothing to change) and mode off (only peeked at for the model).
    for mode in ["auto", "off"] {
        for body in bodies {
            let resp = h
                .client
                .post(h.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("x-context-mode", mode)
                .body(body.to_vec())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{}", String::from_utf8_lossy(body));
        }
    }
    let received = h.mock.received();
    assert_eq!(received.len(), 2 * bodies.len());
    for (body, got) in bodies.iter().chain(&bodies).zip(&received) {
        assert_eq!(&got.body[..], *body);
    }
}

#[tokio::test]
async fn mode_off_still_answers_malformed_json_with_its_position() {
    let h = Harness::start().await;
    for body in [
        &b"{\"model\":\"gpt-4o\",\n \"messages\": [}"[..],
        b"[\"gpt-4o\"]",
    ] {
        let resp = h
            .client
            .post(h.url("/v1/chat/completions"))
            .header("x-context-mode", "off")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let err = common::assert_openai_error(&resp.bytes().await.unwrap());
        let message = err["message"].as_str().unwrap().to_string();
        if body.starts_with(b"{") {
            assert!(message.contains("line 2"), "{message}");
        } else {
            assert!(message.contains("not an array"), "{message}");
        }
    }
    assert!(h.mock.received().is_empty());
}

#[tokio::test]
async fn unknown_response_fields_reach_the_client_unchanged() {
    let h = Harness::start().await;
    let upstream_body = r#"{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":"thought","vendor_field":{"a":[1,2]}},"finish_reason":"stop","logprobs":null,"stop_reason":42}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_cache_hit_tokens":0},"x_vendor":true}"#;
    h.mock.push(Reply::raw(
        200,
        vec![
            ("content-type".into(), "application/json".into()),
            ("x-upstream-custom".into(), "yes".into()),
        ],
        Bytes::from_static(upstream_body.as_bytes()),
    ));
    let resp = h
        .chat(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-upstream-custom"], "yes");
    assert_eq!(resp.bytes().await.unwrap(), upstream_body.as_bytes());
}

#[tokio::test]
async fn non_chat_routes_are_forwarded_verbatim() {
    let h = Harness::start().await;
    // A JSON body (read to route by model), with query and custom headers.
    let body = r#"{"input":["a","b"],"model":"text-embedding-3-small","encoding_format":"float"}"#;
    let resp = h
        .client
        .post(h.url("/v1/embeddings?x=1&y=%20two"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-client")
        .header("openai-organization", "org-1")
        .header("x-custom", "v1")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-echo"], "1");
    let echo: Value = resp.json().await.unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/v1/embeddings");
    assert_eq!(echo["query"], "x=1&y=%20two");
    assert_eq!(echo["body"], body);

    // A streamed body without Content-Length, on another method.
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"part one, ")),
        Ok(Bytes::from_static(b"part two")),
    ];
    let resp = h
        .client
        .put(h.url("/v1/files/file-1/content"))
        .header("content-type", "application/octet-stream")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let resp = h
        .client
        .delete(h.url("/v1/models/ft-model?force=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = h.client.get(h.url("/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let models: Value = resp.json().await.unwrap();
    assert_eq!(models["object"], "list");

    let received = h.mock.received();
    assert_eq!(received.len(), 4);
    let embeddings = &received[0];
    assert_eq!(embeddings.headers["authorization"], "Bearer sk-client");
    assert_eq!(embeddings.headers["openai-organization"], "org-1");
    assert_eq!(embeddings.headers["x-custom"], "v1");
    assert_eq!(&embeddings.body[..], body.as_bytes());
    assert_eq!(
        (received[1].method.as_str(), received[1].path.as_str()),
        ("PUT", "/v1/files/file-1/content")
    );
    assert_eq!(&received[1].body[..], b"part one, part two");
    assert_eq!(
        (received[2].method.as_str(), received[2].query.as_deref()),
        ("DELETE", Some("force=true"))
    );
    assert_eq!(
        (received[3].method.as_str(), received[3].path.as_str()),
        ("GET", "/v1/models")
    );
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded_and_authorization_is() {
    let h = Harness::start().await;
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-client-key")
        .header("connection", "x-hop-only")
        .header("x-hop-only", "secret")
        .header("x-end-to-end", "kept")
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = &h.mock.received()[0];
    assert_eq!(got.headers["authorization"], "Bearer sk-client-key");
    assert_eq!(got.headers["x-end-to-end"], "kept");
    assert!(got.headers.get("x-hop-only").is_none());
}

#[tokio::test]
async fn configured_upstream_key_replaces_the_clients() {
    std::env::set_var("CONTEXT_PROXY_TEST_KEY_REPLACE", "sk-from-env");
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.upstreams[0].api_key_env = Some("CONTEXT_PROXY_TEST_KEY_REPLACE".into());
        // No proxy keys here: this test is about the header replacement alone.
        c.auth.open_relay = true;
    })
    .await;
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        h.mock.received()[0].headers["authorization"],
        "Bearer sk-from-env"
    );
}

#[tokio::test]
async fn requests_are_routed_by_model_pattern_with_a_default() {
    let openai = MockUpstream::start(MockConfig {
        name: "openai".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let local = MockUpstream::start(MockConfig {
        name: "local".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut config = config_for(&local.base_url());
    config.upstreams = vec![
        UpstreamConfig {
            name: "openai".into(),
            base_url: openai.base_url(),
            models: vec!["gpt-4o*".into(), "o?-*".into()],
            ..UpstreamConfig::default()
        },
        UpstreamConfig {
            name: "local".into(),
            base_url: local.base_url(),
            default: true,
            ..UpstreamConfig::default()
        },
    ];
    let proxy = RunningServer::start(config.validate().unwrap())
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let cases = [
        ("gpt-4o-mini", "openai"),
        ("o3-mini", "openai"),
        ("llama3.1:8b", "local"),
        ("gpt-4", "local"),
    ];
    // Mode off reads the model without parsing the body into a DOM: routed the same.
    for mode in ["auto", "off"] {
        for (model, expected) in cases {
            let resp = client
                .post(&url)
                .header("x-context-mode", mode)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}], "model": model}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(
                resp.headers()["x-mock-name"],
                expected,
                "model {model}, {mode}"
            );
        }
    }
    // A body without a model goes to the default upstream.
    let resp = client
        .post(&url)
        .json(&json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-mock-name"], "local");
    // Non-chat JSON routes are routed by their model too.
    let resp = client
        .post(format!("http://{}/v1/embeddings", proxy.addr()))
        .json(&json!({"model": "gpt-4o-embed", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-mock-name"], "openai");
    assert!(openai.wait_received(5, WAIT).await);
    assert_eq!(openai.received().len(), 5);
    assert_eq!(local.received().len(), 5);
}

#[tokio::test]
async fn chat_answers_come_uncompressed_other_routes_keep_accept_encoding() {
    let h = Harness::start().await;
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("accept-encoding", "gzip, deflate")
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = h
        .client
        .get(h.url("/v1/models"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let received = h.mock.received();
    assert!(received[0].headers.get("accept-encoding").is_none());
    assert_eq!(received[1].headers["accept-encoding"], "gzip");
}
