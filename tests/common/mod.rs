//! Shared set-up for the integration tests: the real proxy on 127.0.0.1:0 in front of the
//! project's mock upstream, and a plain HTTP client.

#![allow(dead_code)]

pub mod redis;

use std::time::Duration;

use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use context_proxy::upstream::UpstreamConfig;

/// Longest a test waits for something that should happen at once (a failure guard, not a sleep).
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Harness {
    pub mock: MockUpstream,
    pub proxy: RunningServer,
    pub client: reqwest::Client,
}

/// A config (validated, so `[upstream]` is folded in) whose single upstream is `base_url`,
/// listening on a free port. Validate it again after editing it.
pub fn config_for(base_url: &str) -> Config {
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.shutdown_grace_ms = 10_000;
    config.server.drain_window_ms = 0; // harden: tests that need a drain window set one
    config.store.backend = context_proxy::store::Backend::Memory;
    config.upstreams = vec![UpstreamConfig {
        base_url: base_url.to_string(),
        default: true,
        ..UpstreamConfig::default()
    }];
    config.validate().unwrap().into_inner()
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(MockConfig::default(), |_| {}).await
    }

    pub async fn start_with(mock: MockConfig, edit: impl FnOnce(&mut Config)) -> Harness {
        let mock = MockUpstream::start(mock).await.unwrap();
        let mut config = config_for(&mock.base_url());
        edit(&mut config);
        let config = config.validate().unwrap();
        let proxy = RunningServer::start(config).await.unwrap();
        Harness {
            mock,
            proxy,
            client: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy.addr(), path)
    }

    /// The proxy's `/metrics`, as scraped.
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one series of the proxy's `/metrics` (see [`series`]); 0 when absent.
    pub async fn metric(&self, name: &str) -> f64 {
        series(&self.metrics_text().await, name).unwrap_or(0.0)
    }

    /// GETs `path` of the proxy with `Authorization: Bearer <key>` (a proxy key, a client key or
    /// the admin token): the status and the body as JSON (`Null` when it is not JSON).
    pub async fn get_json(&self, path: &str, key: &str) -> (u16, serde_json::Value) {
        let resp = self
            .client
            .get(self.url(path))
            .header("authorization", format!("Bearer {key}"))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// POSTs `body` (sent as-is) to the proxy's chat-completions route.
    pub async fn chat_raw(&self, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.client
            .post(self.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-test-client")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn chat(&self, body: &serde_json::Value) -> reqwest::Response {
        self.chat_raw(body.to_string()).await
    }
}

/// An Anthropic Messages request of a coding agent that has read one file: the system prompt
/// apart, the call a `tool_use` block (`toolu_a`, `read_file`), `result` in its `tool_result`
/// block, the model's short answer and the next question.
pub fn messages_read_body(result: String) -> serde_json::Value {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are a coding agent.",
        "messages": [
            {"role": "user", "content": "Read the file."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.rs"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": result}]},
            {"role": "assistant", "content": "Read."},
            {"role": "user", "content": "What is on line 7?"}
        ]
    })
}

/// Asserts `body` is an OpenAI error with all four keys and returns its `error` object.
/// The value of one series in a `/metrics` text, named whole with its labels as the
/// exposition writes them (`context_proxy_calls_total{kind="reload"}`); `None` when absent.
pub fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

/// [`series`], which must be there.
pub fn sample(text: &str, name: &str) -> f64 {
    series(text, name).unwrap_or_else(|| panic!("{name} missing in\n{text}"))
}

/// A proxy key named `name` whose secret is `secret`, without limits.
pub fn key(name: &str, secret: &str) -> context_proxy::auth::KeyConfig {
    use sha2::{Digest, Sha256};
    context_proxy::auth::KeyConfig {
        name: name.into(),
        sha256: Sha256::digest(secret.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        models: vec![],
        upstreams: vec![],
        requests_per_minute: None,
        tokens_per_minute: None,
    }
}

/// Replays `lines` (one request body each) through the harness's proxy, in front of its mock,
/// as `context-proxy replay` does, with `args` after the traffic, target and mock.
pub async fn replay(
    h: &Harness,
    lines: &[serde_json::Value],
    args: &[&str],
) -> context_proxy_drive::replay::report::Report {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: context_proxy_drive::replay::ReplayArgs,
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traffic.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let (target, mock) = (h.url("/v1"), format!("http://{}", h.mock.addr()));
    let mut argv = vec![
        "replay",
        path.to_str().unwrap(),
        "--target",
        &target,
        "--mock",
        &mock,
        "--quiet",
    ];
    argv.extend_from_slice(args);
    let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
    context_proxy_drive::replay::replay(&cli.args)
        .await
        .unwrap()
}

pub fn assert_openai_error(body: &[u8]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "error body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let err = v
        .get("error")
        .unwrap_or_else(|| panic!("no `error` key: {v}"))
        .clone();
    for key in ["message", "type", "param", "code"] {
        assert!(err.get(key).is_some(), "error lacks {key}: {v}");
    }
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.len() > 10, "message too short to act on: {v}");
    err
}

/// The mock's `count_tokens` of the Messages request `body` (asked directly, not through the
/// proxy; `max_tokens` left out, as the endpoint wants, and the binding beta sent, which a
/// body with `thinking.block_binding` needs): the upstream's own count of what it got.
pub async fn messages_upstream_count(mock: &MockUpstream, body: &serde_json::Value) -> u64 {
    let mut counted = body.clone();
    counted.as_object_mut().unwrap().remove("max_tokens");
    let resp = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", context_proxy::mock::rules::BINDING_BETA)
        .json(&counted)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    v["input_tokens"].as_u64().unwrap()
}

/// The input tokens the mock bills for the Responses request `body` (asked directly, not
/// through the proxy; the mock's reply queue gets one text reply for it).
pub async fn billed_input_tokens(mock: &MockUpstream, body: &serde_json::Value) -> u64 {
    mock.push(context_proxy::mock::Reply::text("x"));
    let mut direct = body.clone();
    direct["stream"] = serde_json::json!(false);
    let resp = reqwest::Client::new()
        .post(format!("{}/responses", mock.base_url()))
        .json(&direct)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    v["usage"]["input_tokens"].as_u64().unwrap()
}

/// Splits an SSE body into the `data:` payloads, in order.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_string)
        .collect()
}

/// A Python from `.venv` (or `$CONTEXT_PROXY_PYTHON`) that imports every module of `modules`;
/// `.venv` is created and `packages` installed with pip when it does not.
pub fn python_with(modules: &[&str], packages: &[&str]) -> std::path::PathBuf {
    use std::process::Command;
    if let Ok(p) = std::env::var("CONTEXT_PROXY_PYTHON") {
        return std::path::PathBuf::from(p);
    }
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".venv/bin/python");
    let import = format!("import {}", modules.join(", "));
    let has = |py: &std::path::PathBuf| {
        Command::new(py)
            .args(["-c", &import])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !has(&python) {
        // Test binaries run in parallel and may all find `.venv` missing on a fresh checkout:
        // one creates it and installs under a lock (flock(1), util-linux), the others wait for
        // it and then find what they need.
        let ok = Command::new("flock")
            .arg(root.join(".venv.lock"))
            .args([
                "sh",
                "-c",
                r#"cd "$1" && shift && { [ -x .venv/bin/python ] || python3 -m venv .venv; } && .venv/bin/pip install --quiet "$@""#,
                "sh",
            ])
            .arg(&root)
            .args(packages)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "creating .venv and pip install {packages:?} failed");
    }
    assert!(has(&python), "{} cannot {import}", python.display());
    python
}

/// The directory holding the Node packages the tests need (`.node/node_modules`, as
/// `scripts/test --install` fills it, or `$CONTEXT_PROXY_NODE_MODULES`); `packages` are
/// installed there with npm when one is missing.
pub fn node_modules_with(packages: &[&str]) -> std::path::PathBuf {
    use std::process::Command;
    if let Ok(p) = std::env::var("CONTEXT_PROXY_NODE_MODULES") {
        return std::path::PathBuf::from(p);
    }
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".node");
    let modules = root.join("node_modules");
    if packages.iter().any(|p| !modules.join(p).exists()) {
        // Under a lock, as `.venv` above: parallel installs into one prefix clash.
        let ok = Command::new("flock")
            .arg(root.with_extension("lock"))
            .args([
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&root)
            .args(packages)
            .status()
            .unwrap()
            .success();
        assert!(ok, "npm install {packages:?} failed");
    }
    modules
}

/// Runs `tests/e2e/<script>` with Node, the packages of `modules` and the proxy's `base` URL,
/// off the runtime's threads, and reads the JSON object it prints.
pub async fn run_node_script(
    modules: std::path::PathBuf,
    script: &str,
    base: String,
) -> serde_json::Value {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(script);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .env("NODE_PATH", modules)
            .arg(script)
            .arg(base)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        output.status.success(),
        "Node client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Runs `tests/e2e/<script>` with `python` and the proxy's `base` URL, off the runtime's
/// threads, and reads the JSON object it prints; fails with its output when it fails.
#[allow(dead_code)]
pub async fn run_sdk_script(
    python: std::path::PathBuf,
    script: &str,
    base: String,
) -> serde_json::Value {
    run_sdk_script_with(python, script, vec![base]).await
}

/// [`run_sdk_script`] with the script's arguments `args` (the base URL first).
#[allow(dead_code)]
pub async fn run_sdk_script_with(
    python: std::path::PathBuf,
    script: &str,
    args: Vec<String>,
) -> serde_json::Value {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(script);
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(args)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        output.status.success(),
        "SDK client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The usage the mock reports for these Messages request bodies, asked of a mock of its own
/// (so the totals do not depend on a prompt cache) with `replies` queued, summed: (prompt, as
/// input + cache writes + cache reads; output).
#[allow(dead_code)]
pub async fn messages_usage(
    bodies: &[Vec<u8>],
    replies: Vec<context_proxy::mock::Reply>,
) -> (u64, u64) {
    let mock = MockUpstream::start(context_proxy::mock::MockConfig::default())
        .await
        .unwrap();
    for r in replies {
        mock.push(r);
    }
    let client = reqwest::Client::new();
    let (mut prompt, mut output) = (0, 0);
    for body in bodies {
        let mut body: serde_json::Value = serde_json::from_slice(body).unwrap();
        body["stream"] = serde_json::Value::Bool(false);
        let v: serde_json::Value = client
            .post(format!("{}/messages", mock.base_url()))
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let (p, o) = messages_prompt_and_output(&v["usage"]);
        prompt += p;
        output += o;
    }
    (prompt, output)
}

/// A Messages `usage`: (input + cache writes + cache reads, output).
#[allow(dead_code)]
pub fn messages_prompt_and_output(usage: &serde_json::Value) -> (u64, u64) {
    let prompt = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|k| usage[k].as_u64().unwrap_or(0))
    .sum();
    (prompt, usage["output_tokens"].as_u64().unwrap_or(0))
}

#[allow(dead_code)]
/// The events of a Responses stream, each checked against the rules the SDK helpers and Codex
/// depend on; returns the terminal event.
pub fn check_responses_stream(text: &str) -> (Vec<serde_json::Value>, serde_json::Value) {
    let mut events = Vec::new();
    for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let kind = frame
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("a frame without `event:`: {frame}"));
        let data = frame
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("a frame without `data:`: {frame}"));
        let event: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["type"], kind, "{frame}");
        events.push(event);
    }
    assert!(!events.is_empty());
    assert_eq!(events[0]["type"], "response.created", "{text}");
    let count = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(count("response.created"), 1, "{text}");
    assert!(count("response.in_progress") <= 1, "{text}");
    // One sequence, from 0, by one.
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i as u64, "{text}");
    }
    // Items: added in order 0, 1, …; every item event refers to an added item; ids unique.
    let mut added = 0u64;
    let mut ids = std::collections::HashSet::new();
    let mut done_items = Vec::new();
    for event in &events {
        let Some(index) = event["output_index"].as_u64() else {
            continue;
        };
        if event["type"] == "response.output_item.added" {
            assert_eq!(index, added, "{text}");
            added += 1;
            let id = event["item"]["id"].as_str().unwrap().to_string();
            assert!(ids.insert(id), "an item id twice: {text}");
        } else {
            assert!(index < added, "an event of an item never added: {text}");
        }
        if event["type"] == "response.output_item.done" {
            done_items.push(event["item"].clone());
        }
    }
    // Exactly one terminal event, the last.
    let terminal = [
        "response.completed",
        "response.failed",
        "response.incomplete",
    ];
    let ends: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| terminal.contains(&e["type"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(ends.len(), 1, "{text}");
    let last = events.last().unwrap().clone();
    assert!(terminal.contains(&last["type"].as_str().unwrap()), "{text}");
    // Its output is the items the client got, in order; its id the stream's.
    assert_eq!(
        last["response"]["output"],
        serde_json::Value::Array(done_items),
        "{text}"
    );
    assert_eq!(last["response"]["id"], events[0]["response"]["id"]);
    (events, last)
}

/// A streamed Responses answer that fails mid-way the way the API reports it: a message item
/// begun and `said` streamed, then an `error` event with `code` and `message`, then the end.
#[allow(dead_code)]
pub fn responses_error_stream(said: &str, code: &str, message: &str) -> Reply {
    let item = serde_json::json!({"id": "msg_e1", "type": "message", "status": "in_progress", "content": [], "role": "assistant"});
    let response = serde_json::json!({"id": "resp_e1", "object": "response", "created_at": 1_767_000_000u64, "status": "in_progress", "model": "gpt-5", "output": [], "usage": null});
    let events = [
        serde_json::json!({"type": "response.created", "response": response}),
        serde_json::json!({"type": "response.in_progress", "response": response}),
        serde_json::json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
        serde_json::json!({"type": "response.content_part.added", "item_id": "msg_e1", "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_e1", "output_index": 0, "content_index": 0, "delta": said, "logprobs": []}),
        serde_json::json!({"type": "error", "code": code, "message": message, "param": null}),
    ];
    let body: String = events
        .into_iter()
        .enumerate()
        .map(|(n, mut event)| {
            event["sequence_number"] = n.into();
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap()
            )
        })
        .collect();
    Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body.into(),
    )
}

/// Posts a Messages `body` to the proxy at `addr` as Claude Code sends it
/// (`/v1/messages?beta=true`, its key, version, `betas` and session header `session`): the
/// status, `x-context-actions` and the answer's JSON.
pub async fn post_messages(
    addr: std::net::SocketAddr,
    body: &serde_json::Value,
    betas: &str,
    session: &str,
) -> (u16, String, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/messages?beta=true"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", betas)
        .header("x-claude-code-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let actions = resp
        .headers()
        .get("x-context-actions")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, actions, resp.json().await.unwrap())
}

/// A Claude Code session: the attribution line and a marked system prompt, tools, `turns`
/// rounds of `Read` calls whose results are `file(round)`, thinking on every assistant message (signed as
/// the mock signs), the newest block marked; it ends with a plain user turn.
pub fn claude_code_session(
    model: &str,
    turns: usize,
    thinking: bool,
    file: impl Fn(usize) -> String,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=00000;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}],
    });
    if thinking {
        body["thinking"] = serde_json::json!({"type": "enabled", "budget_tokens": 1024});
    }
    let push = |body: &mut serde_json::Value, m: serde_json::Value| {
        body["messages"].as_array_mut().unwrap().push(m)
    };
    for t in 0..turns {
        let mut content = vec![
            serde_json::json!({"type": "tool_use", "id": format!("toolu_{t:03}"), "name": "Read", "input": {"file_path": format!("/repo/src/f{t}.rs")}}),
        ];
        if thinking {
            content.insert(
                0,
                context_proxy::mock::rules::signed_thinking(&body, &format!("read file {t}")),
            );
        }
        push(
            &mut body,
            serde_json::json!({"role": "assistant", "content": content}),
        );
        let file = file(t);
        push(
            &mut body,
            serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t:03}"), "content": file}]}),
        );
    }
    let mut last = vec![serde_json::json!({"type": "text", "text": "The test passes now."})];
    if thinking {
        last.insert(
            0,
            context_proxy::mock::rules::signed_thinking(&body, "done"),
        );
    }
    push(
        &mut body,
        serde_json::json!({"role": "assistant", "content": last}),
    );
    push(
        &mut body,
        serde_json::json!({"role": "user", "content": [
        {"type": "text", "text": "Thanks. What else?", "cache_control": {"type": "ephemeral"}}]}),
    );
    body
}
