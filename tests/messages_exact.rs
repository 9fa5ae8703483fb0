//! The upstream's exact count near a decision (`count_tokens_margin`), through the real proxy
//! against the strict mock, whose `count_tokens` counts as it bills (its model of Claude's
//! tokenizer: another BPE than the proxy's estimate): a request the estimate puts just over
//! the budget but the upstream just under it goes whole, one the estimate puts just under but
//! the upstream over is cut, and without the setting the estimate decides; a request the
//! model's window cannot hold by the upstream's count is refused by the proxy itself in
//! Anthropic's wording, which the official SDK raises as `BadRequestError`.

mod common;

use common::Harness;
use context_proxy::context::adapter::{Adapter, Messages};
use context_proxy::context::settings::WindowEntry;
use context_proxy::mock::{MockConfig, Reply};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use serde_json::{json, Value};

/// A Claude Code session of `turns` `Read` rounds whose results are `file(t)`, then a plain
/// user turn.
fn session(turns: usize, file: impl Fn(usize) -> String) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test."})];
    for t in 0..turns {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use",
            "id": format!("toolu_{t:03}"), "name": "Read",
            "input": {"file_path": format!("/repo/src/f{t}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": format!("toolu_{t:03}"), "content": file(t)}]}));
    }
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "What else?"}));
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": "You are Claude Code.",
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
        "messages": messages,
    })
}

/// Rust source: the proxy's estimate (o200k × 1.25) counts it higher than the mock's model of
/// Claude (cl100k × 1.15).
fn code(t: usize) -> String {
    (0..100)
        .map(|l| format!("fn f{t}_{l}() -> u32 {{ {l} }} // src/f{t}.rs:{l}\n"))
        .collect()
}

/// Hindi prose: `o200k_base` reads Devanagari in far fewer tokens than `cl100k_base`, so the
/// mock counts it higher than the proxy's estimate.
fn hindi(t: usize) -> String {
    (0..40)
        .map(|l| format!("पंक्ति {t}-{l}: यह फ़ाइल परीक्षण के लिए लिखी गई है और इसमें कोई त्रुटि नहीं है।\n"))
        .collect()
}

/// The proxy's estimate of `body` (what `x-context-tokens-before` says).
fn estimate(body: &Value) -> usize {
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    Messages.count(&counter, body).total
}

/// The mock's count of `body`, asked of it directly.
async fn upstream_count(h: &Harness, body: &Value) -> usize {
    let mut counted = body.clone();
    counted.as_object_mut().unwrap().remove("max_tokens");
    let answer: Value = h
        .client
        .post(format!("{}/messages/count_tokens", h.mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .json(&counted)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["input_tokens"].as_u64().unwrap() as usize
}

async fn harness(budget: usize, margin: f64) -> Harness {
    Harness::start_with(MockConfig::default(), move |c| {
        c.context.max_context_tokens = Some(budget);
        c.context.keep_recent_messages = 4;
        // The budget is the only reason to cut.
        c.context.tool_result_max_tokens = 100_000;
        c.upstreams[0].count_tokens_margin = margin;
    })
    .await
}

/// Sends `body` to `/v1/messages`; the `x-context-actions` header and the body the mock got
/// on `/v1/messages`.
async fn send(h: &Harness, session: &str, body: &Value) -> (String, Value) {
    h.mock.push(Reply::text("ok"));
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("x-context-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    let actions = resp
        .headers()
        .get("x-context-actions")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert_eq!(resp.status(), 200, "{actions}");
    resp.bytes().await.unwrap();
    let sent = h
        .mock
        .received()
        .into_iter()
        .rev()
        .find(|r| r.path == "/v1/messages")
        .unwrap()
        .json();
    (actions, sent)
}

fn count_calls(h: &Harness) -> usize {
    h.mock
        .received()
        .iter()
        .filter(|r| r.path == "/v1/messages/count_tokens")
        .count()
}

#[tokio::test]
async fn just_over_the_budget_by_the_estimate_but_under_by_the_upstreams_count_goes_whole() {
    let body = session(12, code);
    let probe = harness(1_000_000, 0.0).await;
    let (estimated, counted) = (estimate(&body), upstream_count(&probe, &body).await);
    assert!(estimated > counted, "{estimated} vs {counted}");
    let budget = (estimated + counted) / 2;

    // By the estimate alone the request is over its budget: cut.
    let (actions, sent) = send(&harness(budget, 0.0).await, "a", &body).await;
    assert!(sent["messages"] != body["messages"], "{actions}");

    // The upstream counts it under the budget: forwarded whole, after one count.
    let h = harness(budget, 0.1).await;
    let (actions, sent) = send(&h, "b", &body).await;
    assert!(sent["messages"] == body["messages"], "{actions}");
    assert_eq!(count_calls(&h), 1);
    // The count was asked with the fields count_tokens takes, and the client's headers.
    let asked = h
        .mock
        .received()
        .into_iter()
        .find(|r| r.path == "/v1/messages/count_tokens")
        .unwrap();
    assert!(asked.json().get("max_tokens").is_none());
    assert_eq!(asked.headers["x-api-key"], "sk-ant-test");
}

#[tokio::test]
async fn just_under_the_budget_by_the_estimate_but_over_by_the_upstreams_count_is_cut() {
    let body = session(12, hindi);
    let probe = harness(1_000_000, 0.0).await;
    let (estimated, counted) = (estimate(&body), upstream_count(&probe, &body).await);
    // 5% over the estimate: near enough to ask, under the upstream's count.
    let budget = estimated * 105 / 100;
    assert!(counted > budget, "{estimated} vs {counted}");

    let (actions, sent) = send(&harness(budget, 0.0).await, "a", &body).await;
    assert!(sent["messages"] == body["messages"], "{actions}");

    let h = harness(budget, 0.1).await;
    let (actions, sent) = send(&h, "b", &body).await;
    assert!(sent["messages"] != body["messages"], "{actions}");
    assert!(
        actions.contains("compacted") || actions.contains("offloaded"),
        "{actions}"
    );
    assert_eq!(
        context_proxy::mock::rules::check_messages(&sent),
        Ok(()),
        "{actions}"
    );
}

#[tokio::test]
async fn far_from_the_budget_nothing_is_asked() {
    let body = session(3, code);
    let h = harness(1_000_000, 0.1).await;
    let (_, sent) = send(&h, "c", &body).await;
    assert!(sent["messages"] == body["messages"]);
    assert_eq!(count_calls(&h), 0);
}

/// A pinned head larger than the model's window: the proxy cannot make the request fit, the
/// upstream's count of what it would forward confirms it, and the SDK gets Anthropic's
/// overflow error from the proxy, which forwarded nothing.
#[tokio::test]
async fn an_overflow_the_proxy_finds_itself_reaches_the_sdk_in_anthropics_wording() {
    let python = common::python_with(&["anthropic"], &["anthropic"]);
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("claude-tiny-*".into(), WindowEntry::Window(6_000));
        c.upstreams[0].count_tokens_margin = 0.1;
    })
    .await;
    let out = common::run_sdk_script(python, "anthropic_overflow.py", h.url("")).await;
    assert_eq!(out["error"], "BadRequestError", "{out}");
    assert_eq!(out["status"], 400);
    assert_eq!(out["type"], "invalid_request_error");
    let message = out["message"].as_str().unwrap();
    let counted: usize = message
        .strip_prefix("prompt is too long: ")
        .and_then(|m| m.strip_suffix(" tokens > 6000 maximum"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    // The figure is the upstream's count of what would have gone.
    let asked = h.mock.received();
    assert!(asked.iter().all(|r| r.path == "/v1/messages/count_tokens"));
    let last = asked.last().unwrap().json();
    assert_eq!(upstream_count(&h, &last).await, counted);
    assert!(counted > 6_000);
}

/// Within the window by the upstream's count (the estimate errs high), the request goes.
#[tokio::test]
async fn near_the_window_but_inside_it_by_the_upstreams_count_goes() {
    let body = session(6, code);
    let probe = harness(1_000_000, 0.0).await;
    let (estimated, counted) = (estimate(&body), upstream_count(&probe, &body).await);
    let window = (estimated + counted) / 2;
    let h = Harness::start_with(MockConfig::default(), move |c| {
        c.context
            .model_windows
            .insert("claude-sonnet-4-5".into(), WindowEntry::Window(window));
        c.context.max_context_tokens = Some(1_000_000);
        c.upstreams[0].count_tokens_margin = 0.1;
    })
    .await;
    let (_, sent) = send(&h, "d", &body).await;
    assert!(sent["messages"] == body["messages"]);
    assert_eq!(
        count_calls(&h),
        1,
        "the estimate is over the window: counted"
    );
}
