//! `POST /v1/messages` through the real proxy on chat's phases, against the strict mock: the
//! retry after "prompt is too long" under the limit it states; the estimate corrected per
//! session by each answer's usage (the mock models Claude's tokenizer with another BPE); a
//! summary placed as a user text block; the metrics and the recorder with Anthropic's cache
//! fields and an assembled stream.

mod common;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::context::Mode;
use context_proxy::mock::{rules, MockConfig, MockUpstream, Reply};
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

/// A Claude Code session ([`common::claude_code_session`]) of `Read` results whose lines
/// all differ.
fn session(model: &str, turns: usize, thinking: bool) -> Value {
    common::claude_code_session(model, turns, thinking, |t| {
        (0..120)
            .map(|l| format!("fn f{t}_{l}() -> u32 {{ {l} }} // src/f{t}.rs:{l}\n"))
            .collect()
    })
}

async fn post(h: &Harness, session: &str, body: &Value) -> reqwest::Response {
    h.client
        .post(h.url("/v1/messages"))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header("x-claude-code-session-id", session)
        .json(body)
        .send()
        .await
        .unwrap()
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

fn tokens(resp: &reqwest::Response, name: &str) -> usize {
    header(resp, name).parse().unwrap()
}

/// The prompt the mock billed: input + cache writes + cache reads.
fn billed(answer: &Value) -> usize {
    let u = &answer["usage"];
    [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|k| u[*k].as_u64().unwrap() as usize)
    .sum()
}

#[tokio::test]
async fn prompt_too_long_teaches_the_limit_and_the_retry_fits_under_it() {
    let h = Harness::start_with(
        MockConfig {
            context_limit: Some(8_000),
            ..MockConfig::default()
        },
        |c| {
            c.context.max_context_tokens = Some(100_000);
            c.context.keep_recent_messages = 4;
        },
    )
    .await;
    h.mock.push(Reply::text("Fixed."));
    let body = session("claude-sonnet-4-5", 20, false);
    let resp = post(&h, "s-overflow", &body).await;
    assert_eq!(resp.status(), 200, "{}", header(&resp, "x-context-actions"));
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["content"][0]["text"], "Fixed.");
    let received = h.mock.received();
    assert_eq!(received.len(), 2, "one refusal, one retry");
    // The retry is smaller than what was refused.
    assert!(received[1].body.len() < received[0].body.len());
    let retried = received[1].json();
    assert_eq!(rules::check_messages(&retried), Ok(()));
    assert!(billed(&answer) <= 8_000, "{}", billed(&answer));
    assert_eq!(retried["system"], body["system"]);

    assert_eq!(
        answer["usage"]["output_tokens"].as_u64().map(|n| n > 0),
        Some(true)
    );
}

#[tokio::test]
async fn a_second_refusal_reaches_the_client_in_anthropics_shape() {
    let h = Harness::start_with(
        MockConfig {
            context_limit: Some(50),
            ..MockConfig::default()
        },
        |_| {},
    )
    .await;
    let body = session("claude-sonnet-4-5", 20, false);
    let resp = post(&h, "s-refused", &body).await;
    assert_eq!(resp.status(), 400);
    let error: Value = resp.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("prompt is too long: ") && message.ends_with(" tokens > 50 maximum"),
        "{message}"
    );
}

/// A harness whose only reason to cut is the budget.
async fn budget_only(budget: usize) -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(budget);
        c.context.keep_recent_messages = 4;
        c.context.tool_result_max_tokens = 100_000;
    })
    .await
}

#[tokio::test]
async fn each_answers_usage_corrects_the_sessions_estimate() {
    let big = session("claude-sonnet-4-5", 8, false);
    let small = session("claude-sonnet-4-5", 1, false);
    // What the default estimate says of the big request, and what the mock bills for it.
    let (estimate, actual) = {
        let h = budget_only(1_000_000).await;
        let resp = post(&h, "s-probe", &big).await;
        assert_eq!(header(&resp, "x-context-actions"), "none");
        let estimate = tokens(&resp, "x-context-tokens-after");
        let answer: Value = resp.json().await.unwrap();
        (estimate, billed(&answer))
    };
    // o200k_base x 1.25 errs high against the modelled Claude count, and by more than the
    // margin a learned factor keeps.
    assert!(
        actual as f64 * 1.06 < estimate as f64,
        "{estimate} vs {actual}"
    );
    let budget = (estimate + actual * 106 / 100) / 2;
    let h = budget_only(budget).await;

    // A session never answered is counted with the default factor: over the budget, cut.
    let resp = post(&h, "s-fresh", &big).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(tokens(&resp, "x-context-tokens-before"), estimate);
    assert!(tokens(&resp, "x-context-tokens-after") < budget);

    // A session whose first answer taught its factor: the same request fits, sent as it came.
    let resp = post(&h, "s-taught", &small).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let resp = post(&h, "s-taught", &big).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-context-actions"), "none");
    let received = h.mock.received();
    assert_eq!(received[2].json(), big);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(billed(&answer), actual);
}

#[tokio::test]
async fn a_summary_is_placed_as_a_user_text_block() {
    let summarizer = MockUpstream::start(MockConfig::default()).await.unwrap();
    let summary = "## Task overview\nFix the failing test.\n\n## Current state\nRead f0..f9.\n\n\
        ## Important discoveries\nf3 prints line 3.\n\n## Next steps\nRun the tests.\n\n\
        ## Context to preserve\nNone.";
    for _ in 0..4 {
        summarizer.push(Reply::text(summary));
    }
    let base = summarizer.base_url();
    let h = Harness::start_with(MockConfig::default(), |c: &mut Config| {
        c.upstreams.push(UpstreamConfig {
            name: "summ".into(),
            base_url: base,
            models: vec!["summarizer-*".into()],
            ..UpstreamConfig::default()
        });
        c.context.mode = Mode::Compress;
        c.context.max_context_tokens = Some(8_000);
        c.context.keep_recent_messages = 4;
        let s = &mut c.context.summarizer;
        s.enabled = true;
        s.upstream = Some("summ".into());
        s.model = Some("summarizer-1".into());
        s.min_freed_tokens = 300;
        s.max_summary_tokens = 300;
        s.max_input_tokens = 8_000;
        s.timeout_ms = 5_000;
    })
    .await;
    let body = session("claude-sonnet-4-5", 24, false);
    let resp = post(&h, "s-summary", &body).await;
    assert_eq!(resp.status(), 200, "{}", header(&resp, "x-context-actions"));
    assert_eq!(header(&resp, "x-context-summary"), "computed");
    let forwarded = h.mock.received()[0].json();
    assert_eq!(rules::check_messages(&forwarded), Ok(()));
    let messages = forwarded["messages"].as_array().unwrap();
    let placed = messages
        .iter()
        .find(|m| {
            m["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("## Task overview\nFix the failing test."))
        })
        .expect("no summary forwarded");
    assert_eq!(placed["role"], "user");
    assert_eq!(placed["content"][0]["type"], "text");
    assert!(placed["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[context-proxy:"));
    assert_eq!(messages[0]["role"], "user");
    // The summarizer read the span as text: calls and results, no JSON blocks.
    let asked = summarizer.received()[0].json();
    let span = asked["messages"][1]["content"].as_str().unwrap();
    assert!(span.contains("call toolu_000 Read("), "{span}");
    assert!(span.contains("(result of toolu_000)"), "{span}");
}

#[tokio::test]
async fn metrics_and_the_recorder_see_anthropics_cache_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let h = Harness::start_with(MockConfig::default(), |c: &mut Config| {
        c.record.enabled = true;
        c.record.dir = path;
    })
    .await;
    let mut body = session("claude-sonnet-4-5", 8, false);
    body["stream"] = json!(true);
    for _ in 0..2 {
        let resp = post(&h, "s-recorded", &body).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let received = h.mock.received();
    assert_eq!(received[0].body, received[1].body);
    // The first request wrote the marked prefix, the second read it.
    let model = "{model=\"claude-sonnet-4-5\"}";
    let created = format!("context_proxy_upstream_cache_creation_tokens_total{model}");
    assert!(h.metric(&created).await > 1_000.0);
    let read = format!("context_proxy_upstream_cached_tokens_total{model}");
    assert!(h.metric(&read).await > 1_000.0);
    h.proxy.shutdown().await;
    let recorded = context_proxy::corpus::recording::read(dir.path()).unwrap();
    assert_eq!(recorded.exchanges.len(), 2);
    for x in &recorded.exchanges {
        assert_eq!(x.route.as_deref(), Some("messages"));
        let response = x.response.as_ref().unwrap();
        assert_eq!(response["type"], "message");
        assert!(response["content"][0]["text"].is_string(), "{response}");
        assert!(response["usage"]["cache_read_input_tokens"].is_u64());
    }
}
