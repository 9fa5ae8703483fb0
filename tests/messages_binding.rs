//! A Claude-Code-shaped session run live (each request carries the answers the strict mock
//! gave, their thinking signed after what the proxy forwarded) on a model that binds thinking
//! to the conversation before it, under a budget that forces the proxy to act: with the
//! client's `anthropic-beta` allowing `drop_block` the proxy edits and asks the API to drop
//! the thinking its edits invalidate; without it the proxy edits only after the last thinking
//! block and repeats its edits — and either way the strict mock, which checks every signature
//! against its prefix (and drops what `drop_block` drops), accepts every request. Large results arrive every turn, as Claude Code's `Read`s do, so a change the
//! proxy made to a new result would have to be repeated by every later request.

mod common;

use common::Harness;
use context_proxy::mock::{rules, MockConfig, Reply};
use context_proxy::routes::messages::BINDING_BETA;
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-5-5";

fn file(t: usize) -> String {
    (0..160)
        .map(|l| format!("fn f{t}_{l}(x: u32) -> u32 {{ x + {l} }} // src/f{t}.rs:{l}\n"))
        .collect()
}

/// Runs `turns` `Read` rounds, then a final answer; returns each `/v1/messages` answer's
/// status and `x-context-actions`, and the bodies the mock received.
async fn live_session(h: &Harness, betas: &str, turns: usize) -> Vec<(u16, String)> {
    let mut body = json!({
        "model": MODEL,
        "max_tokens": 2048,
        "thinking": {"type": "adaptive"},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Read every file and summarize."}],
    });
    for t in 0..turns {
        h.mock.push(Reply::tool_calls(vec![(
            "Read".into(),
            json!({"file_path": format!("/repo/src/f{t}.rs")}),
        )]));
    }
    h.mock.push(Reply::text("They add numbers."));
    let mut seen = Vec::new();
    for t in 0..=turns {
        let (status, actions, answer) =
            common::post_messages(h.proxy.addr(), &body, betas, "binding-1").await;
        seen.push((status, actions.clone()));
        assert_eq!(status, 200, "turn {t}: {actions}: {answer}");
        if t == turns {
            break;
        }
        // The answer goes back as it came; the breakpoint moves to the newest block.
        let content = answer["content"].clone();
        let id = content
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .unwrap()["id"]
            .clone();
        let messages = body["messages"].as_array_mut().unwrap();
        for m in messages.iter_mut() {
            if let Some(blocks) = m["content"].as_array_mut() {
                for b in blocks {
                    b.as_object_mut().unwrap().remove("cache_control");
                }
            }
        }
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result",
            "tool_use_id": id, "content": file(t), "cache_control": {"type": "ephemeral"}}]}));
    }
    seen
}

async fn harness() -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(12_000);
        c.context.keep_recent_messages = 4;
        c.context.tool_result_max_tokens = 1_000;
        c.context.truncate_tool_result_tokens = Some(2_000);
    })
    .await
}

fn forwarded(h: &Harness) -> Vec<Value> {
    h.mock
        .received()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| r.json())
        .collect()
}

#[tokio::test]
async fn with_the_binding_beta_edits_happen_and_every_request_is_accepted() {
    let h = harness().await;
    let betas = format!("claude-code-20250219,interleaved-thinking-2025-05-14,{BINDING_BETA}");
    let seen = live_session(&h, &betas, 10).await;
    let edited = seen
        .iter()
        .filter(|(_, a)| {
            a.contains("compacted") || a.contains("offloaded") || a.contains("truncated")
        })
        .count();
    assert!(edited >= 3, "{seen:?}");
    assert!(
        seen.iter().all(|(_, a)| !a.starts_with("skipped")),
        "{seen:?}"
    );
    let sent = forwarded(&h);
    // The edits asked the API to drop the thinking they invalidated.
    assert!(sent
        .iter()
        .any(|b| b["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block"));
    for (k, b) in sent.iter().enumerate() {
        assert!(
            context_proxy::context::adapter::messages::breakpoints(b) <= 4,
            "request {k}"
        );
    }
}

/// Without the beta (Claude Code sends none) the proxy still edits, where no thinking block
/// follows the edit (each result as it arrives), and repeats its edits in every later request
/// (`tests/messages_bound.rs` across replicas and restarts): never asks for `drop_block`.
#[tokio::test]
async fn without_the_beta_edits_after_the_last_thinking_are_made_and_repeated() {
    let h = harness().await;
    let seen = live_session(
        &h,
        "claude-code-20250219,interleaved-thinking-2025-05-14",
        10,
    )
    .await;
    let truncated = seen.iter().filter(|(_, a)| a.contains("truncated")).count();
    assert!(truncated >= 5, "{seen:?}");
    assert!(
        seen.iter().all(|(_, a)| !a.starts_with("skipped")),
        "{seen:?}"
    );
    // The strict mock checked every signature against what was forwarded.
    for b in forwarded(&h) {
        assert_eq!(rules::check_messages(&b), Ok(()));
        assert!(b["thinking"].get("block_binding").is_none());
    }
}
