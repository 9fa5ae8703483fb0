//! Issue 19, hardening: the bounds a hostile client, model or recording must not break, each
//! through the real proxy (or the real binary) in front of the mock upstream: connections that
//! send their body slowly, a summary longer than its budget, the recorder on a full disk, the
//! session routes over a large journal, replay on a hostile recording.

mod common;

use std::time::Duration;

use common::{Harness, WAIT};
use context_proxy::mock::MockConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads from `conn` until the server closes it; panics if it stays open past `WAIT`.
async fn closed_by_server(conn: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(WAIT, async {
        // A reset counts as closed too.
        let _ = conn.read_to_end(&mut buf).await;
    })
    .await;
    assert!(read.is_ok(), "the proxy left the connection open");
    buf
}

/// A connection whose chat request promises 1,000 body bytes and sends one; returned once the
/// proxy has begun reading the body (it answers `100 Continue` when it first asks for it).
async fn stalled_upload(addr: std::net::SocketAddr) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-client\r\n\
          Content-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let expected = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut interim = vec![0u8; expected.len()];
    tokio::time::timeout(WAIT, conn.read_exact(&mut interim))
        .await
        .expect("the proxy never asked for the body")
        .unwrap();
    assert_eq!(&interim[..], expected);
    conn.write_all(b"{").await.unwrap();
    conn
}

#[tokio::test]
async fn at_max_connections_slow_bodies_make_room_for_a_normal_request() {
    // No timeout fires within the test: only evicting a slow upload can make room.
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.max_connections = 4;
        c.server.header_read_timeout_ms = 600_000;
        c.server.body_read_timeout_ms = 600_000;
    })
    .await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(stalled_upload(h.proxy.addr()).await);
    }
    let resp = tokio::time::timeout(WAIT, h.client.get(h.url("/healthz")).send())
        .await
        .expect("a normal request waited behind slow uploads")
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The upload waiting the longest was closed to make room, without an answer.
    assert!(closed_by_server(&mut slow[0]).await.is_empty());
    assert!(h.mock.received().is_empty());
}

#[tokio::test]
async fn at_shutdown_a_stalled_body_is_closed_at_once_and_answers_still_drain() {
    let h = Harness::start_with(
        MockConfig {
            latency: Duration::from_millis(300),
            ..MockConfig::default()
        },
        |c| {
            c.server.body_read_timeout_ms = 600_000;
            c.server.shutdown_grace_ms = 600_000;
        },
    )
    .await;
    let Harness {
        mock,
        mut proxy,
        client,
    } = h;
    let mut stalled = stalled_upload(proxy.addr()).await;
    // A request in flight: the upstream has it and takes its time to answer.
    let url = format!("http://{}/v1/chat/completions", proxy.addr());
    let answer = tokio::spawn(
        client
            .post(url)
            .header("authorization", "Bearer sk-test-client")
            .json(&serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
            .send(),
    );
    assert!(mock.wait_received(1, WAIT).await);
    proxy.begin_shutdown();
    // The stalled upload is closed without its 408, long before its body timeout.
    assert!(closed_by_server(&mut stalled).await.is_empty());
    tokio::time::timeout(WAIT, proxy.finished())
        .await
        .expect("the shutdown waited for a stalled body");
    let answer = answer.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
}
