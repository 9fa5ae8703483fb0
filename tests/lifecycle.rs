//! The server's life: health and readiness, header read timeout, and graceful shutdown that
//! drains in-flight streams.

mod common;

use std::time::Duration;

use common::{config_for, sse_data, Harness, WAIT};
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{Gate, MockConfig, MockUpstream, Reply};
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

/// The real binary with `config` (TOML), its stdin, stdout and stderr as given; its first
/// stdout line read: the address it listens on.
async fn start_binary(
    config: &str,
    listen: &str,
) -> (tokio::process::Child, String, tempfile::TempDir) {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--listen", listen, "--config"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut first = String::new();
    tokio::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .await
        .unwrap();
    let addr = first
        .trim()
        .rsplit("http://")
        .next()
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    (child, addr, dir)
}

fn signal(child: &tokio::process::Child, name: &str) {
    let pid = child.id().expect("the child is running").to_string();
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// A config whose drain window outlasts the test's patience: only a skipped window lets the
/// process end within `WAIT`.
const LONG_DRAIN: &str = "[server]\ndrain_window_ms = 600000\n[store]\nbackend = \"memory\"\n\
                          [upstream]\nbase_url = \"http://127.0.0.1:9/v1\"\n";

#[tokio::test]
async fn a_second_signal_ends_the_drain_window_at_once() {
    let (mut child, addr, _dir) = start_binary(LONG_DRAIN, "127.0.0.1:0").await;
    let client = reqwest::Client::new();
    signal(&child, "INT");
    // Draining: /readyz says so, and new connections are still served.
    let draining = tokio::time::timeout(WAIT, async {
        loop {
            let resp = reqwest::Client::new()
                .get(format!("http://{addr}/readyz"))
                .send()
                .await
                .unwrap();
            if resp.status() == 503 {
                break resp.text().await.unwrap();
            }
        }
    })
    .await
    .expect("/readyz never said draining");
    assert!(draining.contains("draining"), "{draining}");
    let health = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // The second Ctrl-C: no more waiting for the ten-minute window.
    signal(&child, "INT");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the proxy still waits out its drain window after a second SIGINT")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn ctrl_c_in_a_terminal_skips_the_drain_window() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, LONG_DRAIN).unwrap();
    // `script` runs the proxy on a pseudo-terminal: its stdin is a terminal, and a Ctrl-C
    // typed into it (the byte 0x03) becomes a SIGINT from the terminal's line discipline.
    let command = format!(
        "exec {} --listen 127.0.0.1:0 --config {}",
        env!("CARGO_BIN_EXE_context-proxy"),
        path.display()
    );
    let mut script = tokio::process::Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("`script` (util-linux) runs a command on a pseudo-terminal");
    let mut lines = tokio::io::BufReader::new(script.stdout.take().unwrap()).lines();
    tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on http://") {
                return;
            }
        }
        panic!("the proxy ended before it listened");
    })
    .await
    .expect("the proxy never said it listens");
    let mut stdin = script.stdin.take().unwrap();
    stdin.write_all(b"\x03").await.unwrap();
    stdin.flush().await.unwrap();
    let status = tokio::time::timeout(WAIT, script.wait())
        .await
        .expect("Ctrl-C in a terminal still waits out the drain window")
        .unwrap();
    assert!(status.success(), "{status}");
    drop(stdin);
}

#[tokio::test]
async fn a_restart_on_the_same_port_right_after_a_stop_binds() {
    let config = "[server]\ndrain_window_ms = 0\n[store]\nbackend = \"memory\"\n\
                  [upstream]\nbase_url = \"http://127.0.0.1:9/v1\"\n";
    let (mut child, addr, _dir) = start_binary(config, "127.0.0.1:0").await;
    // A keep-alive connection still open at the stop: the proxy closes it first, so its side
    // of it lingers in TIME_WAIT (or FIN_WAIT) on the listening port after the process ends.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    signal(&child, "TERM");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the proxy did not stop")
        .unwrap();
    assert!(status.success(), "{status}");
    // Started again on the same address at once: it binds and serves.
    let (again, same, _dir2) = start_binary(config, &addr).await;
    assert_eq!(same, addr);
    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    drop(conn);
    drop(again);
}
