//! Summaries of moved-out spans through the real proxy: the mock upstream answers the client's
//! requests, a second mock (a named upstream) plays the summarizer, recognisable by its system
//! prompt. Also the retry after the upstream says the context is too long.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{Harness, WAIT};
use context_proxy::app::config::Config;
use context_proxy::context::summary::PROMPT_OPENING;
use context_proxy::context::Mode;
use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

const SUMMARY: &str = "## Task overview\nFix the parser in src/parse.rs.\n\n## Current state\nRead src/f0.rs.\n\n\
## Important discoveries\nitem_0_3 returns 3.\n\n## Next steps\nRead the rest.\n\n## Context to preserve\nNone.";

struct Setup {
    h: Harness,
    summarizer: MockUpstream,
}

async fn start(summarizer: MockConfig, edit: impl FnOnce(&mut Config)) -> Setup {
    start_with(MockConfig::default(), summarizer, edit).await
}

async fn start_with(
    main: MockConfig,
    summarizer: MockConfig,
    edit: impl FnOnce(&mut Config),
) -> Setup {
    let summarizer = MockUpstream::start(summarizer).await.unwrap();
    let base = summarizer.base_url();
    let h = Harness::start_with(main, |c| {
        c.upstreams.push(UpstreamConfig {
            name: "summ".into(),
            base_url: base,
            models: vec!["summarizer-*".into()],
            ..UpstreamConfig::default()
        });
        c.context.mode = Mode::Compress;
        c.context.max_context_tokens = Some(3_000);
        c.context.keep_recent_messages = 2;
        let s = &mut c.context.summarizer;
        s.enabled = true;
        s.upstream = Some("summ".into());
        s.model = Some("summarizer-1".into());
        s.min_freed_tokens = 300;
        s.max_summary_tokens = 300;
        s.max_input_tokens = 8_000;
        s.timeout_ms = 5_000;
        edit(c);
    })
    .await;
    Setup { h, summarizer }
}

/// Turn `i`: the user's step, a tool call, its result (~400 tokens), the model's answer.
fn turn(i: usize) -> Vec<Value> {
    let mut result = String::new();
    for l in 0..25 {
        result.push_str(&format!(
            "fn item_{i}_{l}() -> u32 {{ {l} }} // from src/f{i}.rs line {l}\n"
        ));
    }
    vec![
        json!({"role": "user", "content": format!("Continue with step {i}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}),
        json!({"role": "assistant", "content": format!("Step {i} done: src/f{i}.rs read.")}),
    ]
}

/// The request after `k` turns: the opening, the turns, and the next step's user message.
fn request(k: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Task: fix the parser in src/parse.rs."}),
    ];
    for i in 0..k {
        messages.extend(turn(i));
    }
    messages.push(json!({"role": "user", "content": format!("Continue with step {k}.")}));
    json!({"model": "gpt-4o", "messages": messages, "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]})
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

/// The counter `name` from the proxy's `/metrics`.
async fn metric(h: &Harness, name: &str) -> u64 {
    h.metric(&format!("context_proxy_summary_{name}_total"))
        .await as u64
}

/// Waits (with a deadline) until every background summary queued has ended.
async fn background_idle(h: &Harness) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let started = metric(h, "background_started").await;
        let ended = metric(h, "background_completed").await + metric(h, "background_failed").await;
        if ended >= started {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "background summaries never ended"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn summarizer_requests(m: &MockUpstream) -> Vec<Value> {
    m.received()
        .iter()
        .map(|r| r.json())
        .filter(|b| {
            b["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.starts_with(PROMPT_OPENING))
        })
        .collect()
}

/// The reference named by a marker (`ctx_…`).
fn marker_ref(text: &str) -> String {
    let at = text.find("ctx_").unwrap();
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[tokio::test]
async fn summaries_are_placed_once_and_reused_byte_for_byte() {
    let s = start(MockConfig::default(), |_| {}).await;
    for _ in 0..40 {
        s.summarizer.push(Reply::text(SUMMARY));
    }
    let mut labels = Vec::new();
    for k in 1..=20 {
        let resp = s.h.chat(&request(k)).await;
        assert_eq!(resp.status(), 200);
        labels.push(header(&resp, "x-context-summary"));
        resp.bytes().await.unwrap();
        background_idle(&s.h).await;
    }
    let hits = labels
        .iter()
        .filter(|l| l.as_deref() == Some("hit"))
        .count();
    assert!(hits >= 8, "{labels:?}");
    assert!(
        !labels.iter().any(|l| l.as_deref() == Some("fallback")),
        "{labels:?}"
    );

    // Every summary message is the same bytes for the same span.
    let mut by_ref: HashMap<String, String> = HashMap::new();
    let forwarded: Vec<Value> = s.h.mock.received().iter().map(|r| r.json()).collect();
    let mut with_summary = 0;
    for body in &forwarded {
        let m = &body["messages"][2];
        let text = m["content"].as_str().unwrap_or("");
        if !text.starts_with("[context-proxy:") {
            continue;
        }
        assert!(text.contains("## Task overview\nFix the parser"), "{text}");
        with_summary += 1;
        let prior = by_ref
            .entry(marker_ref(text))
            .or_insert_with(|| text.to_string());
        assert_eq!(prior, text);
    }
    assert!(with_summary >= hits);

    // Each prefix summarized once; later calls merge the previous summary.
    let calls = summarizer_requests(&s.summarizer);
    assert!(!calls.is_empty());
    assert_eq!(calls.len(), s.summarizer.received().len());
    let inputs: HashSet<String> = calls
        .iter()
        .map(|b| b["messages"][1]["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(inputs.len(), calls.len(), "a prefix was summarized twice");
    for b in &calls[1..] {
        assert!(b["messages"][1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Previous summary:"));
        assert_eq!(b["model"], "summarizer-1");
    }

    // The originals stay readable: the model reads the moved-out span back.
    let last = forwarded.last().unwrap();
    let reference = marker_ref(last["messages"][2]["content"].as_str().unwrap());
    s.h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": reference}),
    )]));
    s.h.mock.push(Reply::text("Read it."));
    let resp = s.h.chat(&request(21)).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let after = s.h.mock.received();
    let read_back = after.last().unwrap().json();
    let tool = read_back["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("Continue with step 0."),
        "{tool}"
    );
}

#[tokio::test]
async fn an_over_budget_request_waits_for_its_summary_then_the_next_reuses_it() {
    let s = start(MockConfig::default(), |c| {
        c.context.summarizer.soft_ratio = 1.0
    })
    .await;
    s.summarizer.push(Reply::text(SUMMARY));
    let resp = s.h.chat(&request(12)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-context-summary").as_deref(),
        Some("computed")
    );
    let after: usize = header(&resp, "x-context-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after <= 3_000, "{after}");
    resp.bytes().await.unwrap();
    let first = s.h.mock.received()[0].json();
    let placed = first["messages"][2]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(placed.ends_with(SUMMARY));

    let resp = s.h.chat(&request(13)).await;
    assert_eq!(header(&resp, "x-context-summary").as_deref(), Some("hit"));
    resp.bytes().await.unwrap();
    let second = s.h.mock.received()[1].json();
    assert_eq!(second["messages"][2]["content"].as_str().unwrap(), placed);
    assert_eq!(s.summarizer.received().len(), 1);
}

#[tokio::test]
async fn by_default_the_request_s_model_and_upstream_summarize_with_the_client_s_key() {
    let s = start(MockConfig::default(), |c| {
        c.context.summarizer.soft_ratio = 1.0;
        c.context.summarizer.upstream = None;
        c.context.summarizer.model = None;
    })
    .await;
    s.h.mock.push(Reply::text(SUMMARY));
    let resp = s.h.chat(&request(12)).await;
    assert_eq!(
        header(&resp, "x-context-summary").as_deref(),
        Some("computed")
    );
    resp.bytes().await.unwrap();
    let received = s.h.mock.received();
    assert_eq!(received.len(), 2);
    let call = received[0].json();
    assert!(call["messages"][0]["content"]
        .as_str()
        .unwrap()
        .starts_with(PROMPT_OPENING));
    assert_eq!(call["model"], "gpt-4o");
    assert_eq!(
        received[0].headers["authorization"],
        "Bearer sk-test-client"
    );
    // The named summarizer upstream was not used.
    assert!(s.summarizer.received().is_empty());
}

#[tokio::test]
async fn concurrent_requests_of_one_conversation_summarize_once() {
    let slow = MockConfig {
        latency: Duration::from_millis(200),
        ..MockConfig::default()
    };
    let s = start(slow, |c| c.context.summarizer.soft_ratio = 1.0).await;
    for _ in 0..8 {
        s.summarizer.push(Reply::text(SUMMARY));
    }
    let body = request(12);
    let mut all = Vec::new();
    for _ in 0..6 {
        all.push(s.h.chat(&body));
    }
    let answers = futures_util::future::join_all(all).await;
    for resp in answers {
        assert_eq!(resp.status(), 200);
        let label = header(&resp, "x-context-summary").unwrap();
        assert!(label == "computed" || label == "hit", "{label}");
    }
    assert_eq!(s.summarizer.received().len(), 1);
}

/// A failing summarizer leaves the marker: nothing lost, nothing cached, the client served.
async fn falls_back(s: &Setup) {
    let resp = s.h.chat(&request(12)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-context-summary").as_deref(),
        Some("fallback")
    );
    resp.bytes().await.unwrap();
    let sent = s.h.mock.received().last().unwrap().json();
    let marker = sent["messages"][2]["content"].as_str().unwrap();
    assert!(marker.starts_with("[context-proxy:") && !marker.contains("## Task overview"));
    // The moved-out span is stored: the model can read it back.
    s.h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": marker_ref(marker)}),
    )]));
    s.h.mock.push(Reply::text("ok"));
    let resp = s.h.chat(&request(12)).await;
    resp.bytes().await.unwrap();
    let read = s.h.mock.received().last().unwrap().json();
    let tool = read["messages"].as_array().unwrap().last().unwrap().clone();
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("Continue with step 0."),
        "{tool}"
    );
}

#[tokio::test]
async fn a_garbage_answer_is_retried_once_then_falls_back() {
    let s = start(MockConfig::default(), |c| {
        c.context.summarizer.soft_ratio = 1.0
    })
    .await;
    s.summarizer
        .push(Reply::text("Sure! Here is a summary: it went well."));
    s.summarizer.push(Reply::text(""));
    falls_back(&s).await;
    assert_eq!(s.summarizer.received().len(), 2);
    assert_eq!(metric(&s.h, "malformed").await, 2);
}

#[tokio::test]
async fn a_summarizer_error_falls_back_and_is_not_retried_at_once() {
    let s = start(MockConfig::default(), |c| {
        c.context.summarizer.soft_ratio = 1.0
    })
    .await;
    s.summarizer.push(Reply::error(
        500,
        json!({"error": {"message": "boom", "type": "server_error"}}),
    ));
    falls_back(&s).await;
    // Backing off: the second request did not call the summarizer again.
    assert_eq!(s.summarizer.received().len(), 1);
    assert!(metric(&s.h, "fallbacks").await >= 2);
}

#[tokio::test]
async fn a_slow_summarizer_times_out_and_falls_back() {
    let slow = MockConfig {
        latency: Duration::from_secs(5),
        ..MockConfig::default()
    };
    let s = start(slow, |c| {
        c.context.summarizer.soft_ratio = 1.0;
        c.context.summarizer.timeout_ms = 200;
    })
    .await;
    s.summarizer.push(Reply::text(SUMMARY));
    let started = std::time::Instant::now();
    falls_back(&s).await;
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(metric(&s.h, "timeouts").await, 1);
}

#[tokio::test]
async fn a_background_summary_is_used_by_the_next_request() {
    let s = start(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(4_000)
    })
    .await;
    s.summarizer.push(Reply::text(SUMMARY));
    // Over the soft watermark (2,800), under the budget: forwarded as it is.
    let resp = s.h.chat(&request(6)).await;
    assert_eq!(header(&resp, "x-context-summary"), None);
    let before: usize = header(&resp, "x-context-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(before > 2_800 && before <= 4_000, "{before}");
    resp.bytes().await.unwrap();
    background_idle(&s.h).await;
    assert_eq!(metric(&s.h, "background_completed").await, 1);
    let resp = s.h.chat(&request(7)).await;
    assert_eq!(header(&resp, "x-context-summary").as_deref(), Some("hit"));
    let after: usize = header(&resp, "x-context-tokens-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after < before, "{after} {before}");
}

#[tokio::test]
async fn context_length_errors_are_retried_once_with_a_smaller_budget() {
    let limited = MockConfig {
        context_limit: Some(2_500),
        ..MockConfig::default()
    };
    let s = start_with(limited, MockConfig::default(), |c| {
        c.context.mode = Mode::Auto;
        c.context.max_context_tokens = None;
        c.context.summarizer.enabled = false;
    })
    .await;
    // A self-hosted model the proxy knows nothing of: a small limit is believable (for a model
    // it knows, one below 1/32 of its window is not learned).
    let mut body = request(10);
    body["model"] = json!("local-model");
    body["max_tokens"] = json!(100);
    let resp = s.h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(s.h.mock.received().len(), 2);
    // Learned: the next request fits at once.
    let mut body = request(11);
    body["model"] = json!("local-model");
    body["max_tokens"] = json!(100);
    let resp = s.h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(s.h.mock.received().len(), 3);
    // A stream: the error comes before the first event.
    let mut body = request(12);
    body["model"] = json!("local-model");
    body["max_tokens"] = json!(100);
    body["stream"] = json!(true);
    s.h.mock.push(Reply::error(400, json!({"error": {"code": 400, "message": "the request exceeds the available context size", "type": "exceed_context_size_error", "n_prompt_tokens": 3000, "n_ctx": 2000}})));
    let resp = s.h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(s.h.mock.received().len(), 5);
}

#[tokio::test]
async fn each_wording_of_too_long_triggers_one_retry() {
    for error in [
        json!({"error": {"message": "This model's maximum context length is 3000 tokens. However, your messages resulted in 5000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        json!({"error": {"code": 400, "message": "the request exceeds the available context size", "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 3000}}),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 5000 tokens > 3000 maximum"}}),
    ] {
        let s = start(MockConfig::default(), |c| {
            c.context.mode = Mode::Auto;
            c.context.max_context_tokens = None;
            c.context.summarizer.enabled = false;
        })
        .await;
        s.h.mock.push(Reply::error(400, error.clone()));
        // Still too long: the upstream's own error reaches the client unchanged.
        s.h.mock.push(Reply::error(400, error.clone()));
        let mut body = request(10);
        body["max_tokens"] = json!(100);
        let resp = s.h.chat(&body).await;
        assert_eq!(resp.status(), 400);
        let got: Value = resp.json().await.unwrap();
        assert_eq!(got, error);
        let sent = s.h.mock.received();
        assert_eq!(sent.len(), 2, "{error}");
        assert!(sent[1].body.len() < sent[0].body.len() / 2, "{error}");
    }
}

/// Two replicas (two summarizers, one store): the store's lock lets one call the model; the
/// other finds its summary.
#[tokio::test]
async fn two_replicas_sharing_a_store_summarize_a_prefix_once() {
    use context_proxy::store::{Backend, StoreConfig};
    let store = context_proxy::store::open(&StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    replicas_summarize_once(store).await;
}

/// The same with the replicas' store on Redis (the lock and the summaries record in Redis).
#[tokio::test]
async fn two_replicas_on_one_redis_summarize_a_prefix_once() {
    use context_proxy::store::{Backend, StoreConfig};
    let redis = tokio::task::spawn_blocking(common::redis::TestRedis::start)
        .await
        .unwrap();
    let store = context_proxy::store::open(&StoreConfig {
        backend: Backend::Redis,
        redis_url: redis.url.clone(),
        redis_key_prefix: redis.prefix.clone(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    replicas_summarize_once(store).await;
}

async fn replicas_summarize_once(store: std::sync::Arc<dyn context_proxy::store::Store>) {
    use context_proxy::context::summary::SummarizerConfig;
    use context_proxy::context::SummaryJob;
    use context_proxy::summarizer::{Source, Summarizer, Task};
    let mock = MockUpstream::start(MockConfig {
        latency: Duration::from_millis(300),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    mock.push(Reply::text(SUMMARY));
    mock.push(Reply::text(SUMMARY));
    let upstreams = context_proxy::upstream::Upstreams::new(
        &[UpstreamConfig {
            base_url: mock.base_url(),
            ..UpstreamConfig::default()
        }],
        |_| None,
    )
    .unwrap();
    let config = SummarizerConfig {
        enabled: true,
        ..SummarizerConfig::default()
    };
    let replicas: Vec<_> = (0..2)
        .map(|_| Summarizer::start(config.clone(), store.clone(), None, Default::default()))
        .collect();
    let body = request(3);
    let manager = context_proxy::context::ContextManager::new(
        Default::default(),
        context_proxy::tokens::Counter::new(
            context_proxy::tokens::Encoding::O200kBase,
            Default::default(),
        ),
        store.clone(),
    );
    let task = Task {
        identity: manager
            .identify(
                context_proxy::store::Tenant::from_api_key(None),
                None,
                &body,
            )
            .unwrap(),
        job: SummaryJob {
            prefix_len: 6,
            prefix_hash: format!("{:032x}", 42u128),
            previous: None,
            span: "[user]\nContinue with step 0.\n".into(),
            blocking: true,
            encoding: context_proxy::tokens::Encoding::O200kBase,
        },
        upstream: upstreams.route(None).clone(),
        authorization: None,
        model: "gpt-4o".into(),
        bill: None,
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let (a, b) = tokio::join!(
        replicas[0].obtain(&task, deadline),
        replicas[1].obtain(&task, deadline)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.0, b.0);
    let mut sources = [a.1, b.1];
    sources.sort_by_key(|s| *s == Source::Computed);
    assert_eq!(sources, [Source::Cached, Source::Computed]);
    assert_eq!(mock.received().len(), 1);
    for r in &replicas {
        context_proxy::service::Service::stop(&**r).await;
    }
}

#[tokio::test]
async fn a_summary_over_its_budget_is_cut_before_it_is_remembered_or_injected() {
    use context_proxy::tokens::Encoding;
    let s = start(MockConfig::default(), |c| {
        c.context.summarizer.soft_ratio = 1.0
    })
    .await;
    // A summarizer that ignores its max_tokens: 890 KB of summary.
    let filler = "Also remember this detail about the parser and its many tests. ".repeat(14_200);
    let huge = format!("{SUMMARY}\n{filler}");
    assert!(huge.len() > 890_000);
    s.summarizer.push(Reply::text(huge));
    for k in [12, 13] {
        let resp = s.h.chat(&request(k)).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    // The summarizer was asked for at most max_summary_tokens, and was called once.
    let calls = summarizer_requests(&s.summarizer);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["max_tokens"], 300);
    // Computed, then remembered: both requests carry the same summary, cut to its budget
    // and marked.
    let forwarded: Vec<Value> = s.h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(forwarded.len(), 2);
    for body in &forwarded {
        let text = body["messages"][2]["content"].as_str().unwrap();
        let (_, summary) = text
            .split_once("Summary of the messages moved out:\n\n")
            .unwrap_or_else(|| panic!("no summary placed: {text:.200}"));
        let tokens = Encoding::O200kBase.count(summary);
        assert!(tokens <= 300, "{tokens} tokens injected");
        assert!(
            summary.starts_with("## Task overview\nFix the parser"),
            "{summary:.200}"
        );
        assert!(summary.ends_with("max_summary_tokens]"), "{summary}");
    }
    assert_eq!(metric(&s.h, "cut").await, 1);
}
