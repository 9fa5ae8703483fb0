//! Every upstream call on the bill, end to end: a session replayed through the real proxy
//! (`replay`, as its command runs it) whose first request waits for a summary and whose second
//! makes a round of the proxy's own tools; the replay's report prices each kind of call, and
//! the proxy counts the same calls in its metrics. A second session is refused once as too
//! long and retried smaller: the retry on the headers, metrics, journal and report, the
//! refused call at no cost. The mock plays the model in reader mode: it
//! writes the summary the summarizer asks for, and searches the stored originals for a needle
//! it cannot see (the replay resets the mock, so no reply can be queued beforehand). The
//! expected bill is computed here by hand: each call's tokens by the tokenizer, the prices
//! written out from the price table (DeepSeek: cached reads at 10% from 64 tokens; gpt-4o-mini
//! against gpt-4o: $0.15 in and $0.60 out per 1M against $2.50 in).

mod common;

use common::Harness;
use context_proxy::context::Mode;
use context_proxy::mock::reader::{needle_line, QUESTION};
use context_proxy::mock::MockConfig;
use context_proxy::tokens::{Counter, Encoding};
use serde_json::{json, Value};

/// Turn `i`: the user's step, a tool call, its result (~400 tokens; the first holds a needle),
/// the model's answer.
fn turn(i: usize) -> Vec<Value> {
    let mut result: String = (0..25)
        .map(|l| format!("fn item_{i}_{l}() -> u32 {{ {l} }} // from src/f{i}.rs line {l}\n"))
        .collect();
    if i == 0 {
        result.push_str(&needle_line("PORT", "8443"));
    }
    vec![
        json!({"role": "user", "content": format!("Continue with step {i}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}),
        json!({"role": "assistant", "content": format!("Step {i} done: src/f{i}.rs read.")}),
    ]
}

/// The request after `k` turns, ending with the user's `last`.
fn request(k: usize, last: &str) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Task: fix the parser in src/parse.rs."}),
    ];
    for i in 0..k {
        messages.extend(turn(i));
    }
    messages.push(json!({"role": "user", "content": last}));
    json!({"session": "s", "model": "gpt-4o", "messages": messages,
           "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]})
}

/// `context_proxy_<name>_total{kind="<kind>"}` from the proxy's `/metrics`.
async fn metric(h: &Harness, name: &str, kind: &str) -> f64 {
    h.metric(&format!("context_proxy_{name}_total{{kind=\"{kind}\"}}"))
        .await
}

#[tokio::test]
async fn a_replay_with_a_reload_round_and_a_summary_bills_every_call_as_computed_by_hand() {
    let reader = MockConfig {
        reader: true,
        ..MockConfig::default()
    };
    let h = Harness::start_with(reader, |c| {
        c.upstreams[0].cache_pricing = Some("deepseek".into());
        c.context.mode = Mode::Compress;
        c.context.max_context_tokens = Some(3_000);
        c.context.keep_recent_messages = 2;
        let s = &mut c.context.summarizer;
        s.enabled = true;
        s.model = Some("gpt-4o-mini".into());
        s.min_freed_tokens = 300;
        s.max_summary_tokens = 300;
        s.max_input_tokens = 8_000;
        s.timeout_ms = 5_000;
        // No summary ahead of time: the only summarizer call is the one the request waits for.
        s.soft_ratio = 1.0;
    })
    .await;
    // The second request extends the first by the model's answer and the user's question, as
    // a client resends its conversation.
    let first = request(12, "Continue with step 12.");
    let mut second = first.clone();
    let m = second["messages"].as_array_mut().unwrap();
    m.push(json!({"role": "assistant", "content": "On it."}));
    m.push(json!({"role": "user", "content": format!("{QUESTION} PORT")}));
    let report = replay(&h, &[first, second]).await;
    assert_eq!(report.requests, 2);
    assert_eq!(report.reload_rounds, 1);
    assert_eq!(report.status.get("200"), Some(&2));

    // What the upstream received: the summarizer's call, the first request, the second, and
    // the round of the proxy's search.
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(received.len(), 4, "{received:#?}");
    let (summarize, first, second, round) =
        (&received[0], &received[1], &received[2], &received[3]);
    assert_eq!(summarize["model"], "gpt-4o-mini");
    let messages = |b: &Value| b["messages"].as_array().unwrap().clone();
    // Each call of the conversation extends the one before it, tools and all.
    assert_eq!(first["tools"], second["tools"]);
    assert_eq!(second["tools"], round["tools"]);
    assert!(messages(second).starts_with(&messages(first)));
    assert!(messages(round).starts_with(&messages(second)));
    assert_eq!(messages(round).len(), messages(second).len() + 2);

    // By hand. Tokens of each call and of the prefix it repeats (the tools, then the previous
    // call's messages).
    let c = Counter::new(Encoding::O200kBase, Default::default());
    let tokens = |b: &Value| c.count_request(b).total as f64;
    let prefix = |b: &Value, of: &Value| {
        (c.count_request(b).tools
            + messages(of)
                .iter()
                .map(|m| c.count_message(m))
                .sum::<usize>()) as f64
    };
    let (t1, t2, t3) = (tokens(first), tokens(second), tokens(round));
    let (p2, p3) = (prefix(second, first), prefix(round, second));
    assert!(p2 > 64.0 && p3 > 64.0);
    // DeepSeek: the repeated prefix at 10%, the rest in full; without caching, all in full.
    let forwarded = t1 + (0.1 * p2 + (t2 - p2));
    // The round also pays for the model's call of the proxy's search, which the client never
    // saw: gpt-4o's $10.00 out against $2.50 in.
    let hidden = c.count_message(&messages(round)[messages(second).len()]) as f64;
    let reload = 0.1 * p3 + (t3 - p3) + hidden * 4.0;
    // The summary: its input as sent, its output as the mock counted it (the text it wrote,
    // placed in the first request), at gpt-4o-mini's prices in gpt-4o's input units.
    let placed = messages(first)
        .iter()
        .find_map(|m| {
            let text = m["content"].as_str()?;
            Some(text[text.find("## Task overview")?..].to_string())
        })
        .expect("the summary is placed");
    let (s_in, s_out) = (
        tokens(summarize),
        Encoding::O200kBase.count(placed.trim_end()) as f64,
    );
    let summary = (s_in * 0.15 + s_out * 0.60) / 2.50;

    let with = report.with_proxy.as_ref().unwrap();
    let kind = |k: &str| {
        with.by_kind
            .get(k)
            .unwrap_or_else(|| panic!("no {k}: {with:?}"))
    };
    assert_eq!(with.upstream_calls, 4);
    assert_eq!(
        (
            kind("forwarded").calls,
            kind("reload").calls,
            kind("summarizer").calls
        ),
        (2, 1, 1)
    );
    assert!(!with.by_kind.contains_key("retry"));
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.max(1.0);
    for (k, deepseek, none) in [
        ("forwarded", forwarded, t1 + t2),
        ("reload", reload, t3 + hidden * 4.0),
        ("summarizer", summary, summary),
    ] {
        let cost = &kind(k).cost;
        assert!(
            close(cost["deepseek"], deepseek),
            "{k}: {} by the report, {deepseek} by hand",
            cost["deepseek"]
        );
        assert!(
            close(cost["none"], none),
            "{k}: {} by the report, {none} by hand",
            cost["none"]
        );
    }
    assert!(close(with.cost["deepseek"], forwarded + reload + summary));
    assert!(close(
        with.cost["none"],
        t1 + t2 + t3 + hidden * 4.0 + summary
    ));

    // The proxy counted the same calls, priced with its own count of what it sent (the
    // tokenizer's, but it counts its tool definitions apart from the client's) and the
    // summarizer's usage as the mock reported it: within 2% of the trace.
    for (k, calls, cost) in [
        ("forwarded", 2.0, forwarded),
        ("reload", 1.0, reload),
        ("retry", 0.0, 0.0),
        ("summarizer", 1.0, summary),
    ] {
        assert_eq!(metric(&h, "calls", k).await, calls, "{k}");
        let by_proxy = metric(&h, "call_cost_tokens", k).await;
        assert!(
            (by_proxy - cost).abs() <= 0.02 * cost,
            "{k}: the proxy says {by_proxy}, the trace {cost}"
        );
    }
}

/// Replays `lines` (one request body each) through the harness's proxy, as the command does.
async fn replay(h: &Harness, lines: &[Value]) -> context_proxy_drive::replay::report::Report {
    let args = ["--concurrency", "1", "--api-key", "sk-test-client"];
    common::replay(h, lines, &args).await
}

/// The request lines of `session`'s journal, as the context API shows them to its key.
async fn journal_calls(h: &Harness, session: &str) -> Vec<Value> {
    let path = format!("/v1/context/sessions/{session}");
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        let (_, detail) = h.get_json(&path, "sk-test-client").await;
        let mut lines = Vec::new();
        let mut stack = vec![&detail];
        while let Some(v) = stack.pop() {
            match v {
                Value::Object(o) if o.get("event").and_then(Value::as_str) == Some("request") => {
                    lines.push(v.clone())
                }
                Value::Object(o) => stack.extend(o.values()),
                Value::Array(a) => stack.extend(a.iter()),
                _ => {}
            }
        }
        if !lines.is_empty() {
            return lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no request line: {detail}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The upstream refuses a request as too long once: the proxy learns its limit and retries
/// the request smaller. The refused call is on the bill as made and costs nothing (a provider
/// bills an answer's usage, and a refusal has none); the retry is billed like any call. The
/// response headers, the metrics, the page's journal and the replay's report all say so, and
/// their figures are the arithmetic done here: each call's tokens by the tokenizer, priced at
/// DeepSeek's terms (cached reads at 10% from 64 tokens; the retry's `tools` gained the proxy's,
/// which lead the cached prompt, so it reads nothing from the cache).
#[tokio::test]
async fn a_request_refused_as_too_long_is_not_billed_and_its_retry_is() {
    let limited = MockConfig {
        context_limit: Some(6_000),
        ..MockConfig::default()
    };
    // The journal is read back through the context API, which a proxy key opens: the proxy
    // holds the upstream's key, and the client presents its own proxy key.
    std::env::set_var("CP_COST_BILL_UPSTREAM", "sk-upstream-own");
    let h = Harness::start_with(limited, |c| {
        c.upstreams[0].cache_pricing = Some("deepseek".into());
        c.upstreams[0].api_key_env = Some("CP_COST_BILL_UPSTREAM".into());
        c.keys = vec![common::key("client", "sk-test-client")];
        c.ui.enabled = true;
    })
    .await;
    // A model the proxy knows no window of (128k assumed): it forwards the second request
    // whole, and the mock refuses it.
    let body = |k: usize, last: &str| {
        let mut b = request(k, last);
        b["model"] = json!("self-hosted-model");
        b
    };
    // The first request is the conversation's first: nothing before it to read from a cache.
    let first = body(0, "Continue with step 0.");
    let second = body(16, "Continue with step 16.");
    let report = replay(&h, &[first.clone(), second.clone()]).await;
    assert_eq!(report.requests, 2);
    assert_eq!(report.status.get("200"), Some(&2));

    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(received.len(), 3, "{received:#?}");
    let (one, refused, retry) = (&received[0], &received[1], &received[2]);
    let c = Counter::new(Encoding::O200kBase, Default::default());
    let tokens = |b: &Value| c.count_request(b).total;
    assert!(tokens(refused) > 6_000 && tokens(retry) <= 6_000);
    assert_eq!(refused["messages"], second["messages"]);
    assert_ne!(
        retry["tools"], one["tools"],
        "the retry offers the proxy's tools"
    );
    // By hand: the first call in full (nothing before it), the refused one free, the retry in
    // full (its prompt starts with tools the first call did not have).
    let (t1, t3) = (tokens(one) as f64, tokens(retry) as f64);
    let with = report.with_proxy.as_ref().unwrap();
    assert_eq!(with.upstream_calls, 3);
    let kind = |k: &str| {
        with.by_kind
            .get(k)
            .unwrap_or_else(|| panic!("no {k}: {with:?}"))
    };
    assert_eq!((kind("forwarded").calls, kind("retry").calls), (2, 1));
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.max(1.0);
    for (k, cost) in [("forwarded", t1), ("retry", t3)] {
        let by_report = kind(k).cost["deepseek"];
        assert!(
            close(by_report, cost),
            "{k}: {by_report} by the report, {cost} by hand"
        );
    }
    assert!(close(with.cost["deepseek"], t1 + t3));

    // The proxy's metrics: the same calls, its own count within 2%; the refused call free.
    assert_eq!(metric(&h, "calls", "forwarded").await, 2.0);
    assert_eq!(metric(&h, "calls", "retry").await, 1.0);
    for (k, cost) in [("forwarded", t1), ("retry", t3)] {
        let by_proxy = metric(&h, "call_cost_tokens", k).await;
        assert!(
            (by_proxy - cost).abs() <= 0.02 * cost,
            "{k}: the proxy says {by_proxy}, the trace {cost}"
        );
    }

    // The journal: the second request's line holds both calls, the refused one marked.
    let session = report.sessions.first().cloned().unwrap_or_default();
    // The replay names its sessions `replay-<its process id>-<session>`.
    let named = format!("replay-{}-{session}", std::process::id());
    let lines = journal_calls(&h, &named).await;
    let calls: Vec<Value> = lines
        .iter()
        .filter_map(|l| l["calls"].as_array().filter(|c| c.len() == 2).cloned())
        .next()
        .unwrap_or_else(|| panic!("no line with two calls: {lines:#?}"));
    assert_eq!(calls[0]["kind"], "forwarded");
    assert_eq!(calls[0]["refused"], true);
    assert_eq!(calls[1]["kind"], "retry");
    assert!(calls[1].get("refused").is_none());
    let retried = calls[1]["tokens"].as_f64().unwrap();
    assert!((retried - t3).abs() <= 0.02 * t3, "{retried} against {t3}");

    // The headers of one such request: both calls counted, the cost the retry's alone, as
    // DeepSeek prices what the headers say it sent (another model: its limit is not known
    // yet, so it is refused once too).
    let mut other = second.clone();
    other["model"] = json!("other-model");
    let resp = h.chat(&other).await;
    assert_eq!(resp.status(), 200);
    let header = |name: &str| resp.headers()[name].to_str().unwrap().to_string();
    assert_eq!(
        header("x-context-upstream-calls"),
        "forwarded=1,reload=0,retry=1,summarizer=0"
    );
    let after: f64 = header("x-context-tokens-after").parse().unwrap();
    let kept: f64 = header("x-context-kept-prefix-tokens").parse().unwrap();
    let cost: f64 = header("x-context-cost-tokens").parse().unwrap();
    let deepseek = if kept >= 64.0 {
        kept * 0.1 + (after - kept)
    } else {
        after
    };
    assert!(
        (cost - deepseek).abs() <= 0.1,
        "{cost} by the header, {deepseek} by hand"
    );
    assert!(after <= 6_000.0);
    assert_eq!(metric(&h, "calls", "retry").await, 2.0);
}
