//! The server's life: health and readiness, header read timeout, and graceful shutdown that
//! drains in-flight streams.

mod common;

use std::time::Duration;

use common::{config_for, sse_data, Harness, WAIT};
use context_proxy::mock::{Gate, MockConfig, MockUpstream, Reply};
use context_proxy::server::RunningServer;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn healthz_and_readyz_answer_200() {
    let h = Harness::start().await;
    for path in ["/healthz", "/readyz"] {
        let resp = h.client.get(h.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(resp.headers().contains_key("x-context-request-id"));
    }
}

#[tokio::test]
async fn slow_headers_are_cut_by_the_header_read_timeout() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.header_read_timeout_ms = 200
    })
    .await;
    let mut conn = tokio::net::TcpStream::connect(h.proxy.addr())
        .await
        .unwrap();
    conn.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Never finish the headers: the server must close the connection by itself.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(WAIT, conn.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "the connection stayed open past the header read timeout"
    );
    assert!(h.mock.received().is_empty());
}

#[tokio::test]
async fn shutdown_drains_an_in_flight_stream_and_refuses_new_connections() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let mut proxy = RunningServer::start(config_for(&mock.base_url()).validate().unwrap())
        .await
        .unwrap();
    let addr = proxy.addr();
    let gate = Gate::new();
    mock.push(Reply::text("alpha beta gamma").hold_after(1, gate.clone()));
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let first = tokio::time::timeout(WAIT, body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.is_empty());

    proxy.begin_shutdown();
    // The listener closes: a new connection is refused (retry until the accept loop has exited).
    let refused = tokio::time::timeout(WAIT, async {
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        refused.is_ok(),
        "the listener still accepts during shutdown"
    );

    // The stream in flight still completes, whole.
    gate.open();
    let mut text = String::from_utf8(first.to_vec()).unwrap();
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    tokio::time::timeout(WAIT, proxy.finished())
        .await
        .expect("server finishes once drained");
}

#[tokio::test]
async fn shutdown_cuts_streams_that_outlive_the_grace_period() {
    let mock = MockUpstream::start(MockConfig::default()).await.unwrap();
    let mut config = config_for(&mock.base_url());
    config.server.shutdown_grace_ms = 100;
    let mut proxy = RunningServer::start(config.validate().unwrap())
        .await
        .unwrap();
    let gate = Gate::new(); // never opened
    mock.push(Reply::text("held forever").hold_after(1, gate));
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .json(&json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    tokio::time::timeout(WAIT, body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    proxy.begin_shutdown();
    tokio::time::timeout(WAIT, proxy.finished())
        .await
        .expect("grace period bounds the shutdown");
    // The client sees the stream end early, not hang, and is told why in a last event in the
    // OpenAI error shape (the stream was cut between two events).
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        let mut rest = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            rest.extend_from_slice(&chunk);
        }
        rest
    })
    .await
    .expect("the stream ends");
    let rest = String::from_utf8(rest).unwrap();
    let last = rest
        .trim_end()
        .rsplit("\n\n")
        .next()
        .and_then(|e| e.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no final event in {rest:?}"));
    let event: Value = serde_json::from_str(last).unwrap();
    assert_eq!(event["error"]["code"], "server_shutting_down", "{event}");
    assert!(event["error"]["message"].is_string());
}
