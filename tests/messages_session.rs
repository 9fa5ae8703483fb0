//! A Claude-Code-shaped session of 60+ requests (`gen-traffic --shape claude-code`: a long
//! marked system prompt after the attribution line, 16 tools, signed thinking on every assistant
//! message, large `Read`/`Bash` results, the breakpoint moving to the newest block) replayed
//! through the real proxy with a small budget, against the strict mock: every forwarded request
//! is accepted (pairing, breakpoints ≤ 4, thinking signatures), fits the budget by the
//! upstream's own count, carries only thinking blocks the
//! client sent, `count_tokens` answers the size of what is forwarded, and between the proxy's
//! rare edit points each forwarded request repeats the previous one's messages byte for byte.

mod common;

use common::Harness;
use context_proxy::context::adapter::{Adapter, Messages};
use context_proxy::mock::{rules, MockConfig};
use context_proxy::traffic::{claude_code, TrafficConfig};
use serde_json::Value;

const BUDGET: usize = 24_000;

fn session() -> context_proxy::corpus::Session {
    let cfg = TrafficConfig {
        seed: 11,
        sessions: 1,
        max_turns: 64,
        max_result_bytes: 16_000,
        model: None,
    };
    let s = claude_code::generate_session(&cfg, 0, &rules::signed_thinking);
    s.validate().unwrap();
    s
}

async fn post(h: &Harness, path: &str, body: Vec<u8>) -> reqwest::Response {
    h.client
        .post(h.url(path))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        )
        .header("x-claude-code-session-id", "cc-session-1")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

fn thinking_blocks(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "thinking" || b["type"] == "redacted_thinking")
        .map(|b| b.to_string())
        .collect()
}

/// The bytes of every message of a forwarded body but its last (which carries the moving
/// breakpoint).
fn settled_messages(raw: &[u8]) -> Vec<Vec<u8>> {
    let spans = Messages.spans(raw).unwrap();
    let n = spans.items.len();
    spans.items[..n.saturating_sub(1)]
        .iter()
        .map(|r| raw[r.clone()].to_vec())
        .collect()
}

#[tokio::test]
async fn a_60_turn_claude_code_session_stays_valid_under_a_small_budget() {
    let s = session();
    assert!(s.request_count() >= 60, "{}", s.request_count());
    assert!(s.is_messages() && s.mark_newest);
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(BUDGET);
        c.context.keep_recent_messages = 6;
    })
    .await;
    let mut edits = 0;
    let mut managed = 0;
    let mut previous: Option<Vec<Vec<u8>>> = None;
    for k in 0..s.request_count() {
        let body = s.request_body(k);
        let client: Value = serde_json::from_slice(&body).unwrap();
        let resp = post(&h, "/v1/messages?beta=true", body.clone()).await;
        let actions = resp
            .headers()
            .get("x-context-actions")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        assert_eq!(resp.status(), 200, "request {k}: {actions}");
        assert!(!actions.starts_with("skipped"), "request {k}: {actions}");
        resp.bytes().await.unwrap();
        let received = h.mock.received();
        let forwarded = received.last().unwrap();
        let sent = forwarded.json();
        assert_eq!(rules::check_messages(&sent), Ok(()), "request {k}");
        assert!(context_proxy::context::adapter::messages::breakpoints(&sent) <= 4);
        // Thinking blocks go out only as the client sent them (none re-written).
        let own = thinking_blocks(&client);
        for block in thinking_blocks(&sent) {
            assert!(
                own.contains(&block),
                "request {k}: a thinking block changed"
            );
        }
        // The system prompt and the client's tools, the cached head, go out as they came;
        // after them come only the proxy's own tools, once a marker names stored content.
        assert_eq!(sent["system"], client["system"]);
        let theirs = client["tools"].as_array().unwrap();
        let tools = sent["tools"].as_array().unwrap();
        assert_eq!(&tools[..theirs.len()], &theirs[..], "request {k}");
        for added in &tools[theirs.len()..] {
            let name = added["name"].as_str().unwrap_or("");
            assert!(
                ["context_read", "context_search"].contains(&name),
                "request {k}: the proxy added the tool {name}"
            );
        }
        if forwarded.body != body {
            managed += 1;
        }
        // The upstream's own count of what it got is within the budget (the proxy counts
        // with an estimate that errs high, corrected from each answer's usage), every time: a
        // forced cut goes past the recent window, and a round of parallel results the model
        // has not read shares what the budget leaves.
        let tokens = common::messages_upstream_count(&h.mock, &sent).await;
        let held = sent["messages"].as_array().unwrap().len();
        assert!(
            tokens <= BUDGET as u64,
            "request {k}: {tokens} over {BUDGET} with {held} messages ({actions})"
        );
        let settled = settled_messages(&forwarded.body);
        if let Some(before) = &previous {
            // The previous request's messages, but its newest (the moving breakpoint).
            let repeated = before.len() <= settled.len() && settled[..before.len()] == before[..];
            if !repeated {
                edits += 1;
            }
        }
        previous = Some(settled);

        // count_tokens on this very request answers the size of what was forwarded.
        if k % 10 == 9 {
            let mut count_body = client.clone();
            count_body.as_object_mut().unwrap().remove("max_tokens");
            let resp = post(
                &h,
                "/v1/messages/count_tokens",
                serde_json::to_vec(&count_body).unwrap(),
            )
            .await;
            assert_eq!(resp.status(), 200);
            let counted: Value = resp.json().await.unwrap();
            let mut sent_counted = sent.clone();
            sent_counted.as_object_mut().unwrap().remove("max_tokens");
            let direct: Value = h
                .client
                .post(format!("{}/messages/count_tokens", h.mock.base_url()))
                .header("anthropic-version", "2023-06-01")
                .json(&sent_counted)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(
                counted["input_tokens"], direct["input_tokens"],
                "request {k}"
            );
        }
    }
    let requests = s.request_count();
    assert!(managed > requests / 2, "{managed} of {requests} managed");
    // Edits are rare: between them every forwarded prefix is byte-identical. (This session is
    // mostly one task's tool loop: its older rounds are moved out, once and deep, whenever the
    // budget forces a cut.)
    assert!(edits * 5 <= requests, "{edits} edit points in {requests}");
}
