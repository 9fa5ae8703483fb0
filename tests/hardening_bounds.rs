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

/// The real binary on `config`, started by `sh` after `limits` (e.g. `ulimit -f 64`), without
/// `RUST_LOG`; and the address it says it listens on.
fn spawn_limited(limits: &str, config: &std::path::Path) -> (std::process::Child, String) {
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
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first.trim().rsplit("http://").next().unwrap().to_string();
    (child, addr)
}

/// The value of the counter `name` (without `_total`) in the proxy's `/metrics` at `addr`.
async fn counter(addr: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let full = format!("{name}_total ");
    text.lines()
        .find_map(|l| l.strip_prefix(&full))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Sends SIGTERM to `child` and waits for it to exit.
fn terminate(child: &mut std::process::Child) {
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = child.wait();
}

#[tokio::test]
async fn a_recording_write_past_the_file_size_limit_leaves_no_torn_line_and_is_counted() {
    use context_proxy::corpus::recording;
    use serde_json::{json, Value};
    let mock = context_proxy::mock::MockUpstream::start(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let traffic = dir.path().join("traffic");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndrain_window_ms = 0\n[context]\nmode = \"off\"\n[store]\nbackend = \"memory\"\n\
             [record]\nenabled = true\ndir = \"{}\"\n[upstream]\nbase_url = \"{}\"\n",
            traffic.display(),
            mock.base_url()
        ),
    )
    .unwrap();
    // Files may grow to 64 blocks (32 or 64 KiB): a 200 KB message cannot be written whole.
    let (mut child, addr) = spawn_limited("ulimit -f 64", &config);
    let client = reqwest::Client::new();
    let chat = |messages: Value| {
        client
            .post(format!("http://{addr}/v1/chat/completions"))
            .json(&json!({"model": "gpt-4o", "messages": messages}))
            .send()
    };
    let small = json!({"role": "user", "content": "A first question."});
    let defined_by_the_failed_write = json!({"role": "user", "content": "Asked with a big file."});
    let big = json!({"role": "user", "content": "x".repeat(200_000)});
    let fits = chat(json!([small])).await.unwrap();
    let too_big = chat(json!([defined_by_the_failed_write, big]))
        .await
        .unwrap();
    assert_eq!(
        (fits.status().as_u16(), too_big.status().as_u16()),
        (200, 200)
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while counter(&addr, "context_proxy_recorder_write_errors").await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed write was not counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its message was not written: a later exchange that needs it must define it.
    let after = chat(json!([defined_by_the_failed_write])).await.unwrap();
    assert_eq!(after.status(), 200);
    assert_eq!(
        counter(&addr, "context_proxy_recorder_write_errors").await,
        1
    );
    terminate(&mut child);

    // Every line is whole JSON, and every exchange's messages resolve.
    let mut lines = 0;
    for file in std::fs::read_dir(&traffic).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "a torn last line");
        for line in text.lines() {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("a torn line ({e}): {:.120}", line));
            lines += 1;
        }
    }
    assert!(lines > 0);
    let read = recording::read(&traffic).unwrap();
    assert_eq!(read.skipped_lines, 0);
    assert_eq!(read.exchanges.len(), 2);
    for exchange in &read.exchanges {
        for m in exchange.request["messages"].as_array().unwrap() {
            assert!(m.is_object(), "a reference to a message never written: {m}");
        }
    }
    assert_eq!(
        read.exchanges[1].request["messages"][0]["content"],
        "Asked with a big file."
    );
}

/// Runs `context-proxy replay` with `args` under the shell limits `limits`; its exit status
/// and stderr. Fails the test when it runs past `WAIT`.
async fn replay_cli(limits: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("{limits}; exec \"$0\" replay --quiet \"$@\""))
        .arg(env!("CARGO_BIN_EXE_context-proxy"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(WAIT, command.output())
        .await
        .expect("replay did not end")
        .unwrap();
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A recording line of one exchange of session `s` at `at_ms` whose messages are `messages`
/// (message ids).
fn exchange_line(at_ms: u64, messages: serde_json::Value) -> String {
    let exchange = context_proxy::corpus::recording::Exchange {
        at_ms,
        request_id: format!("req-{at_ms}"),
        session: Some("s".into()),
        request: serde_json::json!({"model": "gpt-4o", "messages": messages}),
        status: 200,
        end: "complete".into(),
        ..Default::default()
    };
    let mut line = serde_json::json!({"t": "x"});
    line.as_object_mut().unwrap().extend(
        serde_json::to_value(exchange)
            .unwrap()
            .as_object()
            .unwrap()
            .clone(),
    );
    line.to_string()
}

/// A line defining message `id` as a user message saying `text`.
fn message_line(id: &str, text: &str) -> String {
    serde_json::json!({"t": "m", "id": id, "m": {"role": "user", "content": text}}).to_string()
}

#[tokio::test]
async fn replay_refuses_a_recording_that_expands_past_its_bound() {
    // 1.1 MB on disk: a 100 KB message, then ten exchanges referring to it 25,000 times each
    // (25 GB once put back).
    let dir = tempfile::tempdir().unwrap();
    let mut text = message_line("a", &"x".repeat(100_000));
    text.push('\n');
    let refs = serde_json::Value::Array(vec![serde_json::json!("a"); 25_000]);
    for i in 0..10 {
        text.push_str(&exchange_line(i, refs.clone()));
        text.push('\n');
    }
    assert!(text.len() < 1_200_000);
    let file = dir.path().join("traffic-1-1-0000.jsonl");
    std::fs::write(&file, text).unwrap();
    // Under 4 GB of address space: expanding it all would abort the process.
    let (status, stderr) = replay_cli(
        "ulimit -v 4000000",
        &[file.to_str().unwrap(), "--target", "http://127.0.0.1:9/v1"],
    )
    .await;
    assert!(!status.success());
    assert!(
        stderr.contains("once their message references are put back"),
        "{status}: {stderr}"
    );
}

#[tokio::test]
async fn replay_waits_at_most_the_max_gap_between_recorded_requests() {
    let h = common::Harness::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Two requests of one session, the second recorded 30,000 years after the first.
    let text = [
        message_line("a", "First."),
        exchange_line(1_000, serde_json::json!(["a"])),
        message_line("b", "Much later."),
        exchange_line(1_000_000_000_000_000, serde_json::json!(["a", "b"])),
    ]
    .join("\n");
    let file = dir.path().join("traffic-1-1-0000.jsonl");
    std::fs::write(&file, text + "\n").unwrap();
    let target = h.url("/v1");
    let (status, stderr) = replay_cli(
        "true",
        &[
            file.to_str().unwrap(),
            "--target",
            &target,
            "--speed",
            "1",
            "--max-gap",
            "0.05",
        ],
    )
    .await;
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(h.mock.received().len(), 2);
}

#[tokio::test]
async fn replay_refuses_a_fifo_and_a_dead_target_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    // A FIFO named like a recording file, and a FIFO given as the path: never opened.
    let fifo = dir.path().join("traffic-1-1-0000.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for path in [dir.path(), fifo.as_path()] {
        let (status, stderr) = replay_cli(
            "true",
            &[path.to_str().unwrap(), "--target", "http://127.0.0.1:9/v1"],
        )
        .await;
        assert!(!status.success());
        assert!(stderr.contains("cannot read the traffic"), "{stderr}");
    }
    // Nothing listens at the target: a non-zero exit that says so.
    let jsonl = dir.path().join("bodies.jsonl");
    std::fs::write(
        &jsonl,
        "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n",
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let (status, stderr) = replay_cli("true", &[jsonl.to_str().unwrap(), "--target", &dead]).await;
    assert!(!status.success());
    assert!(stderr.contains("is anything listening there?"), "{stderr}");
}

/// Peak resident memory (VmHWM, kB) of process `pid`.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The files named `name` under `dir`.
fn files_named(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_named(&path, name));
        } else if path.file_name().is_some_and(|n| n == name) {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn a_large_journal_is_read_a_page_at_a_time_and_listings_are_paginated() {
    use serde_json::{json, Value};
    let mock = context_proxy::mock::MockUpstream::start(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::env::set_var("CP_BOUNDS_TEST_ADMIN", "admin-secret");
    std::fs::write(
        &config,
        format!(
            "[server]\ndrain_window_ms = 0\n[auth]\nadmin_token_env = \"CP_BOUNDS_TEST_ADMIN\"\n\
             [context]\nkeep_recent_messages = 2\ncompact_batch_tokens = 1000\n\
             [store]\nbackend = \"fs\"\npath = \"{}\"\nfsync = false\n[upstream]\nbase_url = \"{}\"\n",
            dir.path().join("data").display(),
            mock.base_url()
        ),
    )
    .unwrap();
    let (mut child, addr) = spawn_limited("true", &config);
    let client = reqwest::Client::new();
    let lines: String = (1..=600)
        .map(|i| format!("line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect();
    for session in ["a", "b", "big"] {
        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("authorization", "Bearer sk-client")
            .header("x-context-session", session)
            .json(&json!({"model": "gpt-4o", "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Read the file."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_a", "content": lines},
                {"role": "assistant", "content": "Read."},
                {"role": "user", "content": "Now summarize it."}
            ]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let admin = |path: String| {
        client
            .get(format!("http://{addr}{path}"))
            .header("authorization", "Bearer admin-secret")
            .send()
    };

    // Listings come a page at a time, in the OpenAI list shape.
    let first: Value = admin("/v1/context/sessions?limit=2".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids = |list: &Value| -> Vec<String> {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&first), ["a", "b"], "{first}");
    assert_eq!(
        (&first["has_more"], &first["last_id"]),
        (&json!(true), &json!("b"))
    );
    let rest: Value = admin("/v1/context/sessions?limit=2&after=b".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ids(&rest), ["big"]);
    assert_eq!(rest["has_more"], false);
    let tenant = rest["data"][0]["tenant"].as_str().unwrap().to_string();
    let too_many = admin("/v1/context/sessions?limit=1001".into())
        .await
        .unwrap();
    assert_eq!(too_many.status(), 400);

    // Each session has a journal; "big"'s grows to 20 MB of records of many small values.
    let journals = files_named(&dir.path().join("data"), "context.jsonl");
    assert_eq!(journals.len(), 3);
    let numbers: Vec<u32> = (0..200).collect();
    let record = |i: usize| {
        json!({"event": "decision", "ts": format!("t{i}"), "tokens_before": i, "n": numbers})
            .to_string()
    };
    let mut sizes = Vec::new();
    for session in ["a", "b", "big"] {
        let detail: Value = admin(format!("/v1/context/sessions/{session}?tenant={tenant}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sizes.push(detail["journal_total"].as_u64().unwrap_or(0));
    }
    assert!(sizes.iter().all(|&n| n > 0), "{sizes:?}");
    // Every journal grows alike (which file is "big"'s is the store's business).
    let original = sizes[2] as usize;
    let mut text = String::new();
    let mut n = 0;
    while text.len() < 20_000_000 {
        text.push_str(&record(n));
        text.push('\n');
        n += 1;
    }
    for path in &journals {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }
    let before = peak_rss_kb(child.id());
    let resp = admin(format!("/v1/context/sessions/big?tenant={tenant}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let newest: Value = resp.json().await.unwrap();
    let after = peak_rss_kb(child.id());
    let total = original + n;
    assert_eq!(newest["journal_total"], total);
    assert_eq!(newest["journal"].as_array().unwrap().len(), 100);
    assert_eq!(newest["journal_first"], total - 100);
    assert_eq!(newest["has_more"], true);
    assert_eq!(newest["last_at"], format!("t{}", n - 1));
    assert_eq!(newest["journal"][99]["ts"], format!("t{}", n - 1));
    // The page before it, ending where it began.
    let older: Value = admin(format!(
        "/v1/context/sessions/big?tenant={tenant}&limit=10&before={}",
        total - 100
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(older["journal_first"], total - 110);
    assert_eq!(older["journal"][9]["ts"], format!("t{}", n - 101));
    assert_eq!(older["last_at"], format!("t{}", n - 1));
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("peak RSS {before} kB before the detail route, {after} kB after");
    // Reading the whole 20 MB journal into JSON values took hundreds of MB.
    assert!(
        after.saturating_sub(before) < 100_000,
        "peak RSS grew from {before} kB to {after} kB"
    );
}
