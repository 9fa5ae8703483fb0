//! The page in a real browser: Debian's chromium driven by Playwright for Python
//! (`tests/e2e/ui_browser.py`; `scripts/test` installs both, nothing downloads a browser). A
//! compacting proxy in front of the mock serves a scripted session with a reload round and a
//! hostile tool result (and the same conversation on the Responses API); the script logs in
//! and checks what a person would: the session listed with the right figures and costs in
//! dollars, the list filtered by model and by time, the reload round, a new request appearing
//! live, the marker where the content was and its reference opening the original, paged, on
//! the three routes (chat completions, Responses, Anthropic Messages), a 100 000-line tool
//! result opened a page at a time, the proxy's hidden round after the last message the
//! model received; that no
//! script of the content runs (dialogs and console errors are listened for); that another
//! key sees nothing of it, not even a row; that erasure removes it; and how fast a 500-turn
//! session's page first renders.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{key, messages_read_body, Harness, WAIT};
use context_proxy::app::config::Config;
use context_proxy::auth::key_tenant;
use context_proxy::mock::{MockConfig, Reply};
use context_proxy::store::{Backend, ContentRef, SessionId, StoreConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const HOSTILE: &str = "<script>alert('xss')</script> <img src=x onerror=alert(2)> \
     <a href=\"javascript:alert(3)\">click</a> [stored as ctx_aaaaaaaaaaaaaaaaaaaaaaaa]";

fn file_a() -> String {
    let mut text = format!("{HOSTILE}\n");
    for i in 1..=3000 {
        text.push_str(&format!(
            "a.rs line {i}: let value_{i} = compute({i}) * 2;\n"
        ));
    }
    text
}

fn messages() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read the file."}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "call_a", "content": file_a()}),
        json!({"role": "assistant", "content": "Read."}),
        json!({"role": "user", "content": "What is on line 7?"}),
    ]
}

/// [`messages`] as a Responses API request: the instructions apart, the call and its output
/// as items.
fn responses_body() -> Value {
    json!({
        "model": "gpt-4o",
        "instructions": "You are a coding agent.",
        "store": false,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read the file."}]},
            {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{\"path\":\"a.rs\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": file_a()},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Read."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is on line 7?"}]}
        ]
    })
}

/// A tool result of 100 000 lines.
fn huge_result() -> String {
    (1..=100_000)
        .map(|i| format!("log line {i}: ok\n"))
        .collect()
}

/// Tokens before and after (the proxy's headers), the completion tokens of every call (the
/// usage the client got) and the cost of every upstream call the request made, in full-price
/// input tokens (`x-context-cost-tokens`: the forwarded request and the proxy's tool rounds).
async fn chat(h: &Harness, messages: &[Value]) -> (usize, usize, u64, f64) {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "s-browser")
        .json(&json!({"model": "gpt-4o", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let figure = |name: &str| resp.headers()[name].to_str().unwrap().parse().unwrap();
    let (before, after) = (
        figure("x-context-tokens-before"),
        figure("x-context-tokens-after"),
    );
    let cost: f64 = resp.headers()[context_proxy::contract::COST_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
    (before, after, completion, cost)
}

/// The list's cost cells for a session's first request, as the page must compute them: without
/// the proxy, the client's input under the upstream's caching terms (nothing cached yet); with
/// it, every call the request made as the proxy billed it to the client (`cost_with`, in
/// full-price input tokens); at gpt-4o's list prices, plus the answer's tokens; in dollars.
fn first_turn_costs(sent: usize, cost_with: f64, completion: u64) -> (String, String) {
    use context_proxy::pricing::{openai_for_model, ModelPrice};
    use context_proxy::routes::ui::chart::usd;
    let terms = openai_for_model("gpt-4o");
    let list = ModelPrice::of("gpt-4o").unwrap();
    let dollars = |units: f64| usd(list.dollars(units, completion));
    (dollars(terms.call_cost(sent, 0)), dollars(cost_with))
}

/// Waits until the journal of `session` has its `turns`-th request line.
async fn wait_turns(h: &Harness, session: &str, turns: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let html = h
            .client
            .get(h.url(&format!("/ui/session?s={session}")))
            .header("authorization", "Bearer sk-alice")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if html.contains(&format!("id=\"turn-{turns}\"")) {
            return;
        }
        assert!(Instant::now() < deadline, "no turn {turns} in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A 500-turn session's journal, as the record phase writes it.
async fn big_session(store: &StoreConfig) {
    let store = context_proxy::store::open(store).await.unwrap();
    let tenant = key_tenant("alice");
    let session = SessionId::parse("big-500").unwrap();
    for turn in 1..=500usize {
        let before = 2_000 + turn * 900;
        let after = before.min(60_000 + (turn % 40) * 900);
        let line = json!({
            "ts": format!("2026-11-26T01:{:02}:{:02}.000Z", turn / 60 % 60, turn % 60),
            "request_id": format!("req_{turn}"), "event": "request", "route": "chat",
            "model": "gpt-4o", "upstream": "default", "status": 200, "mode": "auto",
            "tokens_before": before, "tokens_after": after,
            "kept_prefix_tokens": after.saturating_sub(1_500),
            "actions": if after < before { "compacted=3" } else { "minified=1" },
            "prompt_tokens": after, "cached_tokens": after / 2, "completion_tokens": 120,
            "proxy_ms": 1.2, "ttfb_ms": 240.0, "latency_ms": 900.0,
            "upstream_calls": 1, "reload_rounds": u32::from(turn % 50 == 0),
            "reload_calls": u32::from(turn % 50 == 0),
        });
        store.append_log(&tenant, &session, &line).await.unwrap();
    }
}

/// A session of another model, last active three hours ago: what the list's filters by model
/// and by time leave out.
async fn older_mini_session(store: &StoreConfig) {
    let store = context_proxy::store::open(store).await.unwrap();
    let at = std::time::SystemTime::now() - Duration::from_secs(3 * 3600);
    let line = json!({
        "ts": context_proxy::context::writer::rfc3339(at),
        "request_id": "req_mini", "event": "request", "route": "chat",
        "model": "gpt-4o-mini", "upstream": "default", "status": 200, "mode": "auto",
        "tokens_before": 1_000, "tokens_after": 1_000, "actions": "none",
        "prompt_tokens": 1_000, "completion_tokens": 10, "upstream_calls": 1,
    });
    let session = SessionId::parse("mini-older").unwrap();
    store
        .append_log(&key_tenant("alice"), &session, &line)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_page_in_a_real_browser() {
    let python = common::python_with(&["playwright"], &["playwright"]);
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Debian's chromium is needed (scripts/test installs it)"
    );
    std::env::set_var("CP_UI_BROWSER_UPSTREAM", "sk-upstream-own");
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().to_path_buf();
    let mut h = Harness::start_with(MockConfig::default(), |c: &mut Config| {
        c.upstreams[0].api_key_env = Some("CP_UI_BROWSER_UPSTREAM".into());
        c.keys = vec![key("alice", "sk-alice"), key("bob", "sk-bob")];
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
        c.store.backend = Backend::Fs;
        c.store.path = store_dir;
        c.store.fsync = false;
        c.ui.enabled = true;
        c.ui.poll_ms = 250;
    })
    .await;
    h.client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": ref_a, "offset": 8, "limit": 3}),
    )]));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let mut conversation = messages();
    let (sent, forwarded, completion, billed) = chat(&h, &conversation).await;
    let (cost_without, cost_with) = first_turn_costs(sent, billed, completion);
    assert!(completion > 0);
    assert_ne!(cost_without, cost_with);
    assert!(forwarded < sent, "the session was compacted");
    wait_turns(&h, "s-browser", 1).await;
    // The same conversation on the Responses API, in a session of its own.
    h.mock.push(Reply::text("Line 7."));
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "responses-ui")
        .json(&responses_body())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    wait_turns(&h, "responses-ui", 1).await;
    // The same conversation on Anthropic Messages, in a session of its own.
    h.mock.push(Reply::text("Line 7."));
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("x-api-key", "sk-alice")
        .header("anthropic-version", "2023-06-01")
        .header("x-context-session", "messages-ui")
        .json(&messages_read_body(file_a()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    wait_turns(&h, "messages-ui", 1).await;
    // A tool result of 100 000 lines, compacted: it must open a page at a time.
    let mut huge = messages();
    huge[3]["content"] = json!(huge_result());
    h.mock.push(Reply::text("ok"));
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "huge-ui")
        .json(&json!({"model": "gpt-4o", "messages": huge}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    wait_turns(&h, "huge-ui", 1).await;
    let store = StoreConfig {
        backend: Backend::Fs,
        path: dir.path().to_path_buf(),
        fsync: false,
        ..StoreConfig::default()
    };
    big_session(&store).await;
    older_mini_session(&store).await;

    let cfg = json!({
        "base": format!("http://{}", h.proxy.addr()),
        "key": "sk-alice",
        "other_key": "sk-bob",
        "session": "s-browser",
        "turns": 1,
        "tokens_sent": sent,
        "tokens_forwarded": forwarded,
        "cost_without": cost_without,
        "cost_with": cost_with,
        "reload_text": "a.rs line 7: let value_7",
        "ref": ref_a,
        "ref_line": "a.rs line 7: let value_7",
        "fake_ref": "ctx_aaaaaaaaaaaaaaaaaaaaaaaa",
        "hostile_visible": ["<script>alert('xss')</script>", "<img src=x onerror=alert(2)>", "javascript:alert(3)"],
        "big_session": "big-500",
        "older_session": "mini-older",
        "responses_session": "responses-ui",
        "messages_session": "messages-ui",
        "huge_session": "huge-ui",
        "huge_ref": ContentRef::of(&huge_result()).as_str(),
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/ui_browser.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .arg(cfg.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut result = None;
    let run = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == "NEED live" {
                // A new request of the session while its page is open.
                h.mock.push(Reply::text("Done."));
                conversation
                    .push(json!({"role": "assistant", "content": "Line 7 computes value_7."}));
                conversation.push(json!({"role": "user", "content": "Thanks. Anything else?"}));
                chat(&h, &conversation).await;
                stdin.write_all(b"sent\n").await.unwrap();
            } else if let Some(r) = line.strip_prefix("RESULT ") {
                result = Some(serde_json::from_str::<Value>(r).unwrap());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser script took over two minutes");
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "the browser script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result = result.expect("the script printed its result");
    assert_eq!(result["live_turns"], 2, "{result}");
    let fcp = result["big_fcp_ms"].as_f64().unwrap();
    eprintln!(
        "500-turn session page: first contentful paint {fcp:.0} ms, response end {} ms",
        result["big_response_end_ms"]
    );
    assert!(
        fcp < 1_000.0,
        "a 500-turn session's page first renders in {fcp} ms"
    );
}
