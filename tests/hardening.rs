//! Issue 12, hardening: what a hostile or broken client must not be able to do to the proxy.
//! Each test drives the real proxy on 127.0.0.1:0 in front of the mock upstream, mostly over
//! raw TCP, since an HTTP client would clean up what these tests need to send.

mod common;

use common::{assert_openai_error, Harness, WAIT};
use context_proxy::mock::MockConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` as raw bytes on a new connection and reads until the server closes it.
async fn raw_exchange(h: &Harness, request: &[u8]) -> String {
    let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, conn.read_to_end(&mut buf))
        .await
        .expect("the proxy did not answer in time")
        .unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

/// The status code and body of a raw HTTP/1.1 response.
fn status_and_body(response: &str) -> (u16, &str) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body)
}

#[tokio::test]
async fn paths_leaving_v1_are_refused_before_any_upstream_call() {
    std::env::set_var("CP_HARDEN_TRAVERSAL_KEY", "sk-proxy-own-key");
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.upstreams[0].api_key_env = Some("CP_HARDEN_TRAVERSAL_KEY".into());
        // No proxy keys: this test is about paths, which are refused before keys are checked.
        c.auth.open_relay = true;
    })
    .await;
    for path in [
        "/v1/../../x",
        "/v1/%2e%2e/%2e%2e/x",
        "/v1/%2E%2e/x",
        "/v1/models/../../../x",
        "/v1/.%2e/x",
        "/v1/..\\..\\x",
        "/v1/..",
        "/v1/%2e%2e",
        // Encoded separators: an nginx in front of the upstream would decode and resolve them.
        "/v1/models/..%2F..%2F..%2Fadmin",
        "/v1/models/..%2f..%2fadmin",
        "/v1/models/..%5Cadmin",
        "/v1/models/..%252F..%252Fadmin",
        "/v1/models/%252e%252e/%252e%252e/admin",
        "/v1/files/%2e%2e/models",
    ] {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-client\r\nConnection: close\r\n\r\n"
        );
        let response = raw_exchange(&h, request.as_bytes()).await;
        let (status, body) = status_and_body(&response);
        assert_eq!(status, 400, "{path}: {response}");
        let err = assert_openai_error(body.as_bytes());
        assert_eq!(err["code"], "invalid_path", "{path}: {err}");
    }
    assert!(
        h.mock.received().is_empty(),
        "a path leaving /v1/ reached the upstream: {:?}",
        h.mock
            .received()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
    // Dot segments that stay inside /v1/ are resolved, and the upstream sees the clean path.
    let response = raw_exchange(
        &h,
        b"GET /v1/files/../models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_and_body(&response).0, 200, "{response}");
    let received = h.mock.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/v1/models");
}

/// The real binary on `config`, started by `sh` after `limits` (e.g. `ulimit -n 64`), without
/// `RUST_LOG`, stderr kept when `keep_stderr`; and the address it says it listens on.
fn spawn_limited(
    limits: &str,
    config: &std::path::Path,
    keep_stderr: bool,
) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{limits}; exec \"$0\" --config \"$1\" --listen 127.0.0.1:0"
        ))
        .arg(env!("CARGO_BIN_EXE_context-proxy"))
        .arg(config)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(if keep_stderr {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();
    (child, addr)
}

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

#[tokio::test]
async fn silent_and_half_open_connections_are_closed_after_the_header_timeout() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.header_read_timeout_ms = 200;
    })
    .await;
    let h2c_preface: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let empty_settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    let openings: [(&str, Vec<u8>); 4] = [
        ("nothing", Vec::new()),
        ("part of the HTTP/2 preface", h2c_preface[..10].to_vec()),
        ("the h2c preface and no stream", h2c_preface.to_vec()),
        (
            "the h2c preface, SETTINGS and no stream",
            [h2c_preface, empty_settings].concat(),
        ),
    ];
    for (what, opening) in openings {
        let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
        conn.write_all(&opening).await.unwrap();
        let started = std::time::Instant::now();
        closed_by_server(&mut conn).await;
        eprintln!("{what}: closed after {:?}", started.elapsed());
    }
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.idle_timeout_ms = 200;
        // Far beyond the test's wait: the idle timeout alone must close the connection.
        c.server.header_read_timeout_ms = 600_000;
    })
    .await;
    let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
    // The scenario: a client that takes a moment before its request (within the head timeout),
    // then keeps the connection open and idle.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = closed_by_server(&mut conn).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn many_silent_sockets_do_not_stop_a_normal_request() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.header_read_timeout_ms = 100;
        c.server.max_connections = 16;
    })
    .await;
    let addr = h.proxy.addr();
    let resp = tokio::time::timeout(WAIT, async {
        let mut silent = Vec::new();
        for _ in 0..200 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let resp = h.client.get(h.url("/healthz")).send().await.unwrap();
        drop(silent);
        resp
    })
    .await
    .expect("a normal request waited behind silent sockets");
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn at_max_connections_silent_sockets_make_room_for_a_normal_request() {
    // The header timeout is far away: only closing an idle connection can make room.
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.header_read_timeout_ms = 600_000;
        c.server.max_connections = 8;
    })
    .await;
    let addr = h.proxy.addr();
    let partial_preface = &b"PRI * HTTP/2.0\r\n"[..];
    let mut silent = Vec::new();
    for i in 0..8 {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            conn.write_all(partial_preface).await.unwrap();
        }
        silent.push(conn);
    }
    let resp = tokio::time::timeout(WAIT, h.client.get(h.url("/healthz")).send())
        .await
        .expect("a normal request waited behind silent sockets")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let chat = tokio::time::timeout(
        WAIT,
        h.chat(&serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await
    .expect("a chat request waited behind silent sockets");
    assert_eq!(chat.status(), 200);
    // The oldest silent sockets were closed to make room.
    closed_by_server(&mut silent[0]).await;
}

/// Sends a request head promising `declared` body bytes, then `sent` of them, then nothing;
/// returns the answer read until the proxy closes the connection.
async fn stalled_body(
    h: &Harness,
    path: &str,
    content_type: &str,
    declared: usize,
    sent: usize,
) -> String {
    let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {declared}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&b"{".repeat(sent)).await.unwrap();
    String::from_utf8_lossy(&closed_by_server(&mut conn).await).into_owned()
}

#[tokio::test]
async fn a_body_that_stops_or_drips_gets_a_408() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.body_read_timeout_ms = 300;
        c.server.body_min_bytes_per_sec = 1000;
    })
    .await;
    // A body shorter than its Content-Length, on the chat route, a small JSON pass-through
    // route (read to find its model) and a streamed pass-through route.
    for (path, content_type) in [
        ("/v1/chat/completions", "application/json"),
        ("/v1/embeddings", "application/json"),
        ("/v1/files", "application/octet-stream"),
    ] {
        let answer = stalled_body(&h, path, content_type, 1000, 10).await;
        let (status, body) = status_and_body(&answer);
        assert_eq!(status, 408, "{path}: {answer}");
        let err = assert_openai_error(body.as_bytes());
        assert_eq!(err["code"], "body_read_timeout", "{path}: {err}");
    }

    // A body that keeps dripping, one byte every 20 ms (50 bytes/s, under the 1000 minimum).
    let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = tokio::time::timeout(WAIT, async {
        let mut buf = vec![0u8; 4096];
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(20));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if conn.write_all(b" ").await.is_err() {
                        break Vec::new();
                    }
                }
                n = conn.read(&mut buf) => break buf[..n.unwrap_or(0)].to_vec(),
            }
        }
    })
    .await
    .expect("a dripping body held the connection");
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status_and_body(&answer).0, 408, "{answer}");
    assert!(h.mock.received().is_empty());
}

/// An assistant message calling `n` tools, then their `n` results, in reverse order.
fn tool_chain(n: usize) -> Vec<serde_json::Value> {
    let calls: Vec<_> = (0..n)
        .map(|i| serde_json::json!({"id": format!("call_{i}"), "type": "function", "function": {"name": "f", "arguments": "{}"}}))
        .collect();
    let mut messages =
        vec![serde_json::json!({"role": "assistant", "content": null, "tool_calls": calls})];
    for i in (0..n).rev() {
        messages.push(serde_json::json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "r"}));
    }
    messages
}

/// The shortest of a few runs of `f`.
/// Segmenting stays correct at the size issue 12 measured; how fast it is (linear in the
/// number of calls) is a benchmark target, not a timed test: `cargo run --release --example
/// many_tool_calls` (BENCHMARKS.md).
#[test]
fn a_chain_of_40k_tool_calls_is_one_unit() {
    use context_proxy::context::units::segment;
    let large = tool_chain(40_000);
    assert_eq!(segment(&large).unwrap(), vec![0..large.len()]);
    let small = tool_chain(4_000);
    assert_eq!(segment(&small).unwrap(), vec![0..small.len()]);
}

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

/// Two large file reads, then a question: auto mode compacts both results.
fn compactable() -> serde_json::Value {
    serde_json::json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": numbered_lines("a.rs", 600)},
        {"role": "tool", "tool_call_id": "call_b", "content": numbered_lines("b.rs", 400)},
        {"role": "assistant", "content": "Both files define values."},
        {"role": "user", "content": "Now summarize them."}
    ]})
}

/// The stored tool results under `dir`.
fn stored_results(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tool_result-"))
        })
        .collect()
}

/// Every file under `dir`.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                stack.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

#[tokio::test]
async fn content_lost_under_a_running_proxy_is_written_again() {
    content_lost_under_a_running_proxy_is_written_again_with(0).await;
}

/// Within `content_refresh_secs` of the last write too: the refs a request points to are
/// checked before it goes out, not only refreshed every minute.
#[tokio::test]
async fn content_lost_within_the_refresh_period_is_written_again_before_forwarding() {
    content_lost_under_a_running_proxy_is_written_again_with(3600).await;
}

async fn content_lost_under_a_running_proxy_is_written_again_with(refresh_secs: u64) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_for_config = data.clone();
    let h = Harness::start_with(MockConfig::default(), move |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = data_for_config;
        c.store.fsync = false;
        c.store.content_refresh_secs = refresh_secs;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    for round in 0..2 {
        let resp = h.chat(&compactable()).await;
        assert_eq!(resp.status(), 200);
        let actions = resp.headers()["x-context-actions"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(actions, "compacted=2", "round {round}");
        assert_eq!(
            stored_results(&data).len(),
            2,
            "round {round}: the markers point to nothing"
        );
        // The whole directory is deleted under the running proxy.
        std::fs::remove_dir_all(&data).unwrap();
    }
    // /readyz creates the root again too.
    let ready = h.client.get(h.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(data.is_dir());
}

/// A store the proxy cannot write (a read-only mount, files of another user) still serves
/// what it holds: refreshing a file's time is no reason to fail a read, nor to refuse to start.
#[tokio::test]
async fn a_store_that_cannot_be_written_still_serves_reads() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_for_config = data.clone();
    let h = Harness::start_with(MockConfig::default(), move |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = data_for_config;
        c.store.fsync = false;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let resp = h.chat(&compactable()).await;
    assert_eq!(resp.headers()["x-context-actions"], "compacted=2");
    let stored = h.mock.received().last().unwrap().json()["messages"][3]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let at = stored.find("ctx_").unwrap();
    let reference = stored[at..at + 28].to_string();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = \"{}\"\n[auth]\ninspect_by_client_key = true\n[upstream]\nbase_url = \"{}\"\n",
            data.display(),
            h.mock.base_url()
        ),
    )
    .unwrap();
    // A second proxy that may read the store but not write it: as root (whom permissions do
    // not stop) it runs as `nobody` over files it does not own; otherwise the files lose their
    // write permission.
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        .starts_with(b"0\n");
    let mode = if root { "a+rX" } else { "a-w" };
    let status = std::process::Command::new("chmod")
        .args(["-R", mode])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"));
    command
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if root {
        command.uid(65534).gid(65534);
    }
    let mut child = command.spawn().unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}/v1/context/refs/{reference}"))
        .header("authorization", "Bearer sk-test-client")
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    let ready = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .unwrap()
        .status();
    let _ = child.kill();
    let _ = child.wait();
    if !root {
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(dir.path())
            .status();
    }
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("a.rs line 1:"), "{body}");
    // It says it cannot write.
    assert_eq!(ready, 503);
}

#[tokio::test]
async fn readyz_is_degraded_when_the_store_cannot_write() {
    let mock = context_proxy::mock::MockUpstream::start(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = \"{}\"\n[upstream]\nbase_url = \"{}\"\n",
            dir.path().join("data").display(),
            mock.base_url()
        ),
    )
    .unwrap();
    // Like a full disk: no file may grow (RLIMIT_FSIZE 0; SIGXFSZ ignored, so writes fail).
    let (mut child, addr) = spawn_limited("trap '' XFSZ; ulimit -f 0", &config, false);
    let resp = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("degraded"), "{body}");
}

#[tokio::test]
async fn json_too_costly_to_parse_is_refused_before_parsing() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.max_json_elements = 1000;
        c.server.max_json_depth = 16;
    })
    .await;
    let many = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],"x":[{}0]}}"#,
        "0,".repeat(2000)
    );
    let resp = h.chat_raw(many).await;
    assert_eq!(resp.status(), 413);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("max_json_elements"),
        "{err}"
    );

    let deep = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],"x":{}{}}}"#,
        "[".repeat(20),
        "]".repeat(20)
    );
    let resp = h.chat_raw(deep).await;
    assert_eq!(resp.status(), 400);
    let err = assert_openai_error(&resp.bytes().await.unwrap());
    assert_eq!(err["code"], "json_too_deep", "{err}");
    assert!(h.mock.received().is_empty());

    // Within the limits, the same shapes pass.
    let fine = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],"x":{}{}}}"#,
        "[".repeat(10),
        "]".repeat(10)
    );
    assert_eq!(h.chat_raw(fine).await.status(), 200);
}

#[tokio::test]
async fn bodies_over_the_in_flight_budget_get_503_with_retry_after() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.max_body_bytes = 1500;
        c.server.max_body_bytes_in_flight = 2000;
    })
    .await;
    // One request holds 1500 bytes of the budget while its body is still coming.
    let mut holder = TcpStream::connect(h.proxy.addr()).await.unwrap();
    holder
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1500\r\n\r\n{")
        .await
        .unwrap();
    let body = serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x".repeat(900)}]});
    // Poll: the holder's head may not be read yet when the first attempt arrives.
    let refused = tokio::time::timeout(WAIT, async {
        loop {
            let resp = h.chat(&body).await;
            if resp.status() == 503 {
                return resp;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the budget was never spent");
    assert_eq!(refused.headers()["retry-after"], "1");
    let err = assert_openai_error(&refused.bytes().await.unwrap());
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("max_body_bytes_in_flight"),
        "{err}"
    );

    // The holder leaves: its bytes come back, and the same request goes through.
    drop(holder);
    let served = tokio::time::timeout(WAIT, async {
        loop {
            if h.chat(&body).await.status() == 200 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(served.is_ok(), "the budget was not given back");
}

/// Peak resident memory (VmHWM, kB) of the proxy binary after it handled one chat request with
/// a body of `elements` tiny JSON values, under `server` config lines, in context `mode`, in
/// front of `upstream`; and the status it answered.
async fn peak_rss_kb(elements: usize, server: &str, mode: &str, upstream: &str) -> (u64, u16) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[server]\n{server}\n[context]\nmode = \"{mode}\"\n[store]\nbackend = \"memory\"\n[upstream]\nbase_url = \"{upstream}\"\n"),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();
    let body = tiny_values_body(elements);
    let status = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    let status_file = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let hwm = status_file
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    (hwm, status)
}

#[tokio::test]
async fn a_32_mib_body_of_tiny_values_no_longer_takes_gigabytes() {
    // 16 million values in just under 32 MiB (server.max_body_bytes), in a managed mode (the
    // body is parsed into a DOM unless the limits refuse it first).
    let elements = 16_000_000;
    let unlimited = "max_json_elements = 1000000000\nmax_json_depth = 1000\nmax_body_bytes_in_flight = 100000000000";
    let nowhere = closed_upstream();
    let (before, before_status) = peak_rss_kb(elements, unlimited, "auto", &nowhere).await;
    let (after, after_status) = peak_rss_kb(elements, "", "auto", &nowhere).await;
    // With no element limit, the in-flight budget alone refuses it: it counts what the body
    // would cost once parsed (80 bytes a value), far more than its 32 MiB.
    let budget_only = "max_json_elements = 1000000000\nmax_json_depth = 1000";
    let (budgeted, budgeted_status) = peak_rss_kb(elements, budget_only, "auto", &nowhere).await;
    eprintln!(
        "peak RSS, 32 MiB body of 16M values: unlimited {} MiB (status {before_status}), default limits {} MiB (status {after_status}), in-flight budget only {} MiB (status {budgeted_status})",
        before / 1024,
        after / 1024,
        budgeted / 1024
    );
    assert_eq!(after_status, 413);
    assert!(after * 4 < before, "before {before} kB, after {after} kB");
    assert_eq!(budgeted_status, 503);
    assert!(
        budgeted * 4 < before,
        "before {before} kB, budgeted {budgeted} kB"
    );
}

#[tokio::test]
async fn mode_off_forwards_a_32_mib_body_of_tiny_values_without_a_dom() {
    // Mode off only peeks at the model: no DOM, so no element limit is needed, and the whole
    // body reaches the upstream.
    let elements = 16_000_000;
    let (sink, received) = body_sink();
    let (peak, status) = peak_rss_kb(elements, "", "off", &sink).await;
    let body_bytes = tiny_values_body(elements).len() as u64;
    eprintln!(
        "peak RSS, mode off, 32 MiB body of 16M values forwarded: {} MiB ({:.1}x the body)",
        peak / 1024,
        (peak * 1024) as f64 / body_bytes as f64
    );
    assert_eq!(status, 200);
    assert_eq!(received.join().unwrap(), body_bytes);
    assert!(
        peak * 1024 < 8 * body_bytes,
        "peak {peak} kB for a body of {body_bytes} bytes"
    );
}

/// An upstream address where nothing listens.
fn closed_upstream() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}/v1", closed.local_addr().unwrap())
}

/// An upstream that takes one HTTP/1.1 request, answers `200 {}` and says how many body bytes
/// it read (counted, not kept).
fn body_sink() -> (String, std::thread::JoinHandle<u64>) {
    use std::io::{BufRead, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let thread = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut length = 0u64;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let read = std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink()).unwrap();
        let mut stream = stream;
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            .unwrap();
        read
    });
    (base, thread)
}

/// `{"model":…,"messages":[…],"x":[0,0,…]}` with `elements` zeros.
fn tiny_values_body(elements: usize) -> String {
    let mut body = String::with_capacity(elements * 2 + 100);
    body.push_str(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"x":["#);
    for _ in 1..elements {
        body.push_str("0,");
    }
    body.push_str("0]}");
    body
}

#[tokio::test]
async fn errors_name_the_upstream_never_its_address() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let proxy = context_proxy::app::serve::RunningServer::start(
        common::config_for(&format!("http://127.0.0.1:{port}/v1"))
            .validate()
            .unwrap(),
    )
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let chat = client
        .post(format!("http://{}/v1/chat/completions", proxy.addr()))
        .json(&serde_json::json!({"model": "gpt-4o", "messages": []}))
        .send()
        .await
        .unwrap();
    let models = client
        .get(format!("http://{}/v1/models", proxy.addr()))
        .send()
        .await
        .unwrap();
    for resp in [chat, models] {
        assert_eq!(resp.status(), 502);
        let err = assert_openai_error(&resp.bytes().await.unwrap());
        let message = err["message"].as_str().unwrap();
        assert!(message.contains("upstream default"), "{message}");
        assert!(
            !message.contains("127.0.0.1") && !message.contains(&port.to_string()),
            "the upstream's address reached the client: {message}"
        );
    }
}

#[tokio::test]
async fn the_proxys_control_headers_are_not_forwarded() {
    let h = Harness::start().await;
    let body =
        serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let chat = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("x-context-session", "s-1")
        .header("x-context-mode", "off")
        .header("x-context-request-id", "r-1")
        .header("x-contextual", "kept")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let models = h
        .client
        .get(h.url("/v1/models"))
        .header("x-context-session", "s-1")
        .header("x-contextual", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    for received in h.mock.received() {
        let names: Vec<&str> = received.headers.keys().map(|k| k.as_str()).collect();
        assert!(
            !names.iter().any(|n| n.starts_with("x-context-")),
            "{}: {names:?}",
            received.path
        );
        assert!(names.contains(&"x-contextual"), "{names:?}");
    }
}

#[tokio::test]
async fn client_request_ids_are_kept_only_when_short_and_plain() {
    let h = Harness::start().await;
    let id_for = |given: String| {
        let h = &h;
        async move {
            let resp = h
                .client
                .get(h.url("/healthz"))
                .header("x-context-request-id", given)
                .send()
                .await
                .unwrap();
            resp.headers()["x-context-request-id"]
                .to_str()
                .unwrap()
                .to_string()
        }
    };
    assert_eq!(id_for("run-7_a.b:c".into()).await, "run-7_a.b:c");
    for bad in [
        "a\"b".to_string(),
        "{\"x\":1}".to_string(),
        "a/b".to_string(),
        "x".repeat(65),
    ] {
        let got = id_for(bad.clone()).await;
        assert_ne!(got, bad);
        assert!(got.starts_with("req_"), "{got}");
    }
}

#[tokio::test]
async fn at_shutdown_readyz_is_503_while_new_connections_are_still_served() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.drain_window_ms = 60_000;
    })
    .await;
    let mut proxy = h.proxy;
    proxy.begin_shutdown();
    let addr = proxy.addr();
    let client = reqwest::Client::new();
    let draining = tokio::time::timeout(WAIT, async {
        loop {
            let resp = client
                .get(format!("http://{addr}/readyz"))
                .send()
                .await
                .unwrap();
            if resp.status() == 503 {
                return resp.text().await.unwrap();
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("/readyz never said draining");
    assert!(draining.contains("draining"), "{draining}");
    // Still accepting and serving, on new connections too.
    let fresh = reqwest::Client::new();
    let resp = fresh
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        fresh
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_request_the_client_leaves_is_logged_as_cancelled() {
    use std::io::BufRead;
    use std::sync::Arc;
    let mock = context_proxy::mock::MockUpstream::start(MockConfig {
        latency: std::time::Duration::from_secs(30),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndrain_window_ms = 0\n[log]\nformat = \"json\"\nlevel = \"info\"\n[store]\nbackend = \"memory\"\n[upstream]\nbase_url = \"{}\"\n",
            mock.base_url()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_context-proxy"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    conn.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-context-request-id: leaving-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // Leave once the upstream has the request (the proxy is waiting for its answer).
    assert!(mock.wait_received(1, WAIT).await);
    drop(conn);
    // The proxy notices the client left and logs it. The child is killed after WAIT at the
    // latest, which ends its stderr, so a missing line fails the test instead of hanging it.
    let stderr = child.stderr.take().unwrap();
    let child = Arc::new(std::sync::Mutex::new(child));
    let killer = {
        let child = Arc::clone(&child);
        tokio::spawn(async move {
            tokio::time::sleep(WAIT).await;
            let _ = child.lock().unwrap().kill();
        })
    };
    let cancelled_line = tokio::task::spawn_blocking(move || {
        let mut stderr = std::io::BufReader::new(stderr);
        let mut line = String::new();
        loop {
            line.clear();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            if line.contains("\"cancelled\"") {
                return Some(line);
            }
        }
    })
    .await
    .unwrap();
    killer.abort();
    {
        let mut child = child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
    let cancelled_line = cancelled_line.expect("no log line for the cancelled request");
    let line: serde_json::Value = serde_json::from_str(cancelled_line.trim()).unwrap();
    let text = line.to_string();
    assert!(text.contains("leaving-1"), "{text}");
    assert!(text.contains("duration_ms"), "{text}");
}

#[tokio::test]
async fn a_body_failing_mid_way_names_the_upstream_never_its_address() {
    // An upstream that sends one whole event of a chunked answer, then drops the connection.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = upstream.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = upstream.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 65536];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\na\r\ndata: {}\n\n\r\n")
                .await;
        }
    });
    let proxy = context_proxy::app::serve::RunningServer::start(
        common::config_for(&format!("http://127.0.0.1:{port}/v1"))
            .validate()
            .unwrap(),
    )
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for path in ["/v1/chat/completions", "/v1/embeddings"] {
        let resp = client
            .post(format!("http://{}{path}", proxy.addr()))
            .json(&serde_json::json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&resp.bytes().await.unwrap_or_default()).into_owned();
        assert!(text.contains("upstream default"), "{path}: {text}");
        assert!(
            !text.contains("127.0.0.1") && !text.contains(&port.to_string()),
            "{path}: the upstream's address reached the client: {text}"
        );
    }
    server.abort();
}

#[tokio::test]
async fn out_of_file_descriptors_is_a_rate_limited_log_line_and_service_resumes() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[server]\nheader_read_timeout_ms = 300\ndrain_window_ms = 0\n[log]\nformat = \"json\"\nlevel = \"info\"\n[context]\nmode = \"off\"\n[store]\nbackend = \"memory\"\n[upstream]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
    )
    .unwrap();
    // 64 file descriptors: the proxy runs out of them long before 150 connections.
    let (mut child, addr) = spawn_limited("ulimit -n 64", &config, true);
    let mut silent = Vec::new();
    for _ in 0..150 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    // The silent connections are closed after the header timeout, and the proxy serves again.
    let client = reqwest::Client::new();
    let served = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(resp) = client.get(format!("http://{addr}/healthz")).send().await {
                if resp.status() == 200 {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    drop(silent);
    let _ = child.kill();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let _ = child.wait();
    assert!(served.is_ok(), "the proxy did not serve again: {log}");
    // Eviction now starts at the open files limit, so accepts rarely fail at all; when they
    // do, the log says so at most every 5 s.
    let accept_lines = log.lines().filter(|l| l.contains("accept failed")).count();
    assert!(
        accept_lines <= 2,
        "{accept_lines} lines about failed accepts: {log}"
    );
}

#[tokio::test]
async fn idle_http2_connections_are_closed_after_the_idle_timeout() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.idle_timeout_ms = 200;
    })
    .await;
    let stream = TcpStream::connect(h.proxy.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let request = http::Request::get(format!("http://{}/healthz", h.proxy.addr()))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(request).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    // Nothing more is sent: the proxy ends the connection by itself.
    let ended = tokio::time::timeout(WAIT, conn).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection stayed open");
}

/// Sends the compactable conversation with `key`, and returns the status and `x-context-actions`.
async fn chat_as(h: &Harness, key: &str) -> (u16, String) {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&compactable())
        .send()
        .await
        .unwrap();
    let actions = resp
        .headers()
        .get("x-context-actions")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (resp.status().as_u16(), actions)
}

async fn metrics_text(h: &Harness) -> String {
    let resp = h.client.get(h.url("/metrics")).send().await.unwrap();
    resp.text().await.unwrap()
}

#[tokio::test]
async fn a_key_the_upstream_refuses_leaves_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = data;
        c.store.fsync = false;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let refused = || {
        context_proxy::mock::Reply::error(
            401,
            serde_json::json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
        )
    };
    // Five requests with keys the upstream refuses: each was compacted (so content was stored
    // before the upstream answered), and each leaves nothing behind.
    for n in 0..5 {
        h.mock.push(refused());
        let (status, actions) = chat_as(&h, &format!("sk-wrong-{n}")).await;
        assert_eq!(status, 401);
        assert_eq!(actions, "compacted=2", "request {n} was managed");
        assert_eq!(files_under(dir.path()), Vec::<std::path::PathBuf>::new());
    }
    assert_eq!(h.mock.received().len(), 5);
    assert!(metrics_text(&h)
        .await
        .contains("context_proxy_rejected_key_items_erased_total "));
    // A key the upstream accepted once keeps what it stored when a later answer is a 403 (a
    // model it may not use, say): its content can serve its other sessions.
    let (status, _) = chat_as(&h, "sk-good").await;
    assert_eq!(status, 200);
    let kept = stored_results(dir.path()).len();
    assert_eq!(kept, 2);
    h.mock.push(context_proxy::mock::Reply::error(
        403,
        serde_json::json!({"error": {"message": "not allowed", "type": "invalid_request_error", "param": null, "code": null}}),
    ));
    let (status, _) = chat_as(&h, "sk-good").await;
    assert_eq!(status, 403);
    assert_eq!(stored_results(dir.path()).len(), kept);
}

#[tokio::test]
async fn after_a_restart_a_refusal_keeps_what_an_accepted_key_stored() {
    let dir = tempfile::tempdir().unwrap();
    let start = || {
        let data = dir.path().to_path_buf();
        Harness::start_with(MockConfig::default(), move |c| {
            c.store.backend = context_proxy::store::Backend::Fs;
            c.store.path = data;
            c.store.fsync = false;
            c.context.keep_recent_messages = 2;
            c.context.compact_batch_tokens = 1000;
        })
    };
    let h = start().await;
    let (status, actions) = chat_as(&h, "sk-good").await;
    assert_eq!((status, actions.as_str()), (200, "compacted=2"));
    let stored = files_under(dir.path());
    assert_eq!(stored_results(dir.path()).len(), 2);
    drop(h);
    // A new process on the same store has not seen this key accepted. Its first answer is a
    // 403 (a model the key may not use, say): the session was served before, so what it
    // stored stays, state and journal included.
    let h = start().await;
    h.mock.push(context_proxy::mock::Reply::error(
        403,
        serde_json::json!({"error": {"message": "not allowed", "type": "invalid_request_error", "param": null, "code": null}}),
    ));
    let (status, actions) = chat_as(&h, "sk-good").await;
    assert_eq!((status, actions.as_str()), (403, "compacted=2"));
    let after = files_under(dir.path());
    for file in &stored {
        assert!(after.contains(file), "{} was erased", file.display());
    }
}

/// What one request of `compactable()` stores: the two results it compacts.
fn compacted_bytes() -> u64 {
    compactable()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().len() as u64)
        .sum()
}

#[tokio::test]
async fn a_daily_write_quota_forwards_the_request_unmanaged_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    // A tenant may store 1.5 times what one request stores per day, all tenants together 2.5
    // times.
    let one = compacted_bytes();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = data;
        c.store.fsync = false;
        c.store.tenant_quota_bytes_per_day = one * 3 / 2;
        c.store.quota_bytes_per_day = one * 5 / 2;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let original = compactable().to_string();
    let (status, actions) = chat_as(&h, "sk-a").await;
    assert_eq!((status, actions.as_str()), (200, "compacted=2"));
    // The same content again is already stored: refreshing it is free.
    let (status, actions) = chat_as(&h, "sk-a").await;
    assert_eq!((status, actions.as_str()), (200, "compacted=2"));
    // Tenant b stores its own copy; tenant c would take the store over its total.
    let (_, actions) = chat_as(&h, "sk-b").await;
    assert_eq!(actions, "compacted=2");
    let stored = stored_results(dir.path()).len();
    let (status, actions) = chat_as(&h, "sk-c").await;
    assert_eq!(status, 200, "fail-open: the request is still served");
    assert_eq!(actions, "skipped (store quota exceeded: store)");
    assert_eq!(stored_results(dir.path()).len(), stored, "nothing stored");
    let received = h.mock.received();
    let last: serde_json::Value = serde_json::from_slice(&received.last().unwrap().body).unwrap();
    assert_eq!(last.to_string(), original, "forwarded as it came");
    let text = metrics_text(&h).await;
    assert!(
        text.contains(r#"context_proxy_store_quota_exceeded_total{scope="store"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_request_whose_store_write_fails_costs_no_quota() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let one = compacted_bytes();
    let data_for_config = data.clone();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = data_for_config;
        c.store.fsync = false;
        // Room for one request's content a day, not two.
        c.store.tenant_quota_bytes_per_day = one * 3 / 2;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    // A file where the store's root was: nothing can be written (nor the root made again).
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::write(&data, "not a directory").unwrap();
    let (status, actions) = chat_as(&h, "sk-a").await;
    assert_eq!(
        (status, actions.as_str()),
        (200, "skipped (store unavailable)")
    );
    // The store is back: the failed request took none of the day's quota.
    std::fs::remove_file(&data).unwrap();
    let (status, actions) = chat_as(&h, "sk-a").await;
    assert_eq!((status, actions.as_str()), (200, "compacted=2"));
    assert_eq!(stored_results(&data).len(), 2);
}

#[tokio::test]
async fn a_tenant_over_its_own_quota_is_served_unmanaged() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.tenant_quota_bytes_per_day = 1_000;
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    let (status, actions) = chat_as(&h, "sk-a").await;
    assert_eq!(status, 200);
    assert_eq!(actions, "skipped (store quota exceeded: tenant)");
    let text = metrics_text(&h).await;
    assert!(
        text.contains(r#"context_proxy_store_quota_exceeded_total{scope="tenant"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_rewritten_request_keeps_every_number_as_it_was_written() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
    })
    .await;
    // Numbers f64 cannot hold, or would print differently: integers beyond 64 bits, an exponent
    // (its spelling normalised to `e+`, its digits kept), one beyond f64's range, trailing
    // zeros. Each as sent, and as it must reach the upstream.
    let numbers = [
        (
            "seed",
            "123456789012345678901234567890",
            "123456789012345678901234567890",
        ),
        ("x_scale", "1E2", "1e+2"),
        ("x_huge", "1e400", "1e+400"),
        (
            "x_negative",
            "-18446744073709551617",
            "-18446744073709551617",
        ),
        ("temperature", "0.50", "0.50"),
    ];
    let mut body = compactable().to_string();
    body.pop(); // the closing brace
    for (key, sent, _) in numbers {
        body.push_str(&format!(",\"{key}\":{sent}"));
    }
    body.push('}');
    let resp = h.chat_raw(body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-context-actions"], "compacted=2");
    let forwarded = String::from_utf8(h.mock.received()[0].body.to_vec()).unwrap();
    for (key, _, number) in numbers {
        assert!(
            forwarded.contains(&format!("\"{key}\":{number}")),
            "{key} became something else in {}",
            forwarded
                .find(&format!("\"{key}\""))
                .map_or("(missing)", |at| &forwarded
                    [at..(at + 60).min(forwarded.len())])
        );
    }
}

#[tokio::test]
async fn a_lone_surrogate_escape_is_legal_json_and_forwarded_as_it_came() {
    let h = Harness::start().await;
    let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"half a pair: \ud83d, then text"}]}"#;
    let resp = h.chat_raw(body.to_vec()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(&h.mock.received()[0].body[..], &body[..]);
}

#[tokio::test]
async fn a_write_past_the_file_size_limit_does_not_end_the_process() {
    use serde_json::{json, Value};
    let mock = context_proxy::mock::MockUpstream::start(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"fs\"\npath = \"{}\"\n[upstream]\nbase_url = \"{}\"\n",
            dir.path().join("data").display(),
            mock.base_url()
        ),
    )
    .unwrap();
    // Files may grow to 64 KiB: storing a larger tool result raises SIGXFSZ (not trapped here).
    let (mut child, addr) = spawn_limited("ulimit -f 64", &config, false);
    // A pretty-printed JSON result goes out minified; its 300 KB original must be stored.
    let items: Vec<Value> = (0..3000)
        .map(|i| json!({"id": i, "name": format!("item number {i}"), "tags": ["a", "b"]}))
        .collect();
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "List the items."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "api", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": serde_json::to_string_pretty(&items).unwrap()}
    ]});
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer sk-test-client")
        .json(&body)
        .send()
        .await;
    let health = client.get(format!("http://{addr}/healthz")).send().await;
    let exited = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(exited.is_none(), "the proxy ended: {exited:?}");
    // Served unmanaged (the store write failed: fail open), and still serving.
    let resp = resp.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .contains("store unavailable"));
    assert_eq!(health.unwrap().status(), 200);
}

#[tokio::test]
async fn readyz_is_degraded_on_a_nearly_full_disk_and_says_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = dir.path().join("data");
        c.store.fsync = false;
        // More than any disk has free: the probe's small write succeeds, the margin does not.
        c.store.min_free_bytes = u64::MAX / 2;
    })
    .await;
    let resp = h.client.get(h.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    // The answer is public: no path of the store, no error text.
    assert_eq!(resp.text().await.unwrap(), r#"{"status":"degraded"}"#);
    // With the margin met, ready.
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = dir.path().join("data");
        c.store.fsync = false;
        c.store.min_free_bytes = 1;
    })
    .await;
    let resp = h.client.get(h.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_lives_the_idle_timeout_not_the_header_timeout() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.header_read_timeout_ms = 200;
        c.server.idle_timeout_ms = 5_000;
    })
    .await;
    let mut conn = TcpStream::connect(h.proxy.addr()).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    conn.write_all(request).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // The idle time advertised is the idle timeout.
    assert!(
        first
            .to_ascii_lowercase()
            .contains("keep-alive: timeout=5\r\n"),
        "{first}"
    );
    // The scenario: the client's pool reuses the connection after more than the header timeout
    // (aiohttp keeps connections 15 s; the header timeout is 10 s by default).
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    conn.write_all(request).await.unwrap();
    let n = tokio::time::timeout(WAIT, conn.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let second = String::from_utf8_lossy(&buf[..n]);
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "the reused connection was closed: {second:?}"
    );
}

#[tokio::test]
async fn the_in_flight_budget_counts_what_a_body_costs_once_parsed() {
    use context_proxy::mock::{Gate, Reply};
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.server.max_body_bytes = 1 << 20;
        c.server.max_body_bytes_in_flight = 8 << 20;
    })
    .await;
    // 60,000 empty objects: about 180 KB of bytes, several MB once parsed.
    let body = format!(
        r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],"metadata_blobs":[{}{{}}]}}"#,
        "{},".repeat(60_000)
    );
    let gate = Gate::new();
    h.mock.push(Reply::text("held").hold_after(0, gate.clone()));
    let held = {
        let body = body.clone();
        let url = h.url("/v1/chat/completions");
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    assert!(h.mock.wait_received(1, WAIT).await);
    // While the first is held upstream, a second such body does not fit what is left.
    let resp = h.chat_raw(body.clone()).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    gate.open();
    assert_eq!(held.await.unwrap(), 200);
    // Then it does.
    let resp = h.chat_raw(body).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn at_the_open_files_limit_idle_connections_are_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    // Silent connections are not closed by any timeout within the test: only eviction frees
    // room, and max_connections (10,000) is far above what 64 descriptors allow.
    std::fs::write(
        &config,
        "[server]\nheader_read_timeout_ms = 600000\nidle_timeout_ms = 600000\ndrain_window_ms = 0\n[context]\nmode = \"off\"\n[store]\nbackend = \"memory\"\n[upstream]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
    )
    .unwrap();
    let (mut child, addr) = spawn_limited("ulimit -n 64", &config, false);
    let mut silent = Vec::new();
    for _ in 0..150 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    let served = tokio::time::timeout(WAIT, async {
        reqwest::Client::new()
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    })
    .await;
    drop(silent);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        served
            .expect("a normal request waited behind silent sockets")
            .ok(),
        Some(200)
    );
}
