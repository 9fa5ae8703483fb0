//! Session state shared by several replicas: two context managers (two proxies) on one store,
//! taking turns on the same conversation. Each must reuse the other's decisions, so every
//! earlier message is byte-identical from one request to the next whichever replica answers,
//! and no decision either records is lost.

use std::sync::Arc;

use context_proxy::context::{ContextConfig, ContextManager, Mode};
use context_proxy::store::{self, Backend, StateKey, Store, StoreConfig, Tenant};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use serde_json::{json, Value};

fn manager(store: Arc<dyn Store>) -> ContextManager {
    let config = ContextConfig {
        keep_recent_messages: 2,
        compact_batch_tokens: 5_000,
        tool_result_max_tokens: 200,
        ..ContextConfig::default()
    };
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    ContextManager::new(config, counter, store)
}

fn tool_output(turn: usize) -> String {
    (0..120)
        .map(|i| format!("turn {turn} line {i}: status=ok value={}\n", i * turn))
        .collect()
}

/// The conversation after `turns` tool rounds, ending with a user message.
fn conversation(turns: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are an agent."}),
        json!({"role": "user", "content": "Check every service."}),
    ];
    for t in 0..turns {
        let id = format!("call_{t}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "status", "arguments": format!("{{\"n\":{t}}}")}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": tool_output(t)}));
    }
    messages
}

async fn forwarded(m: &ContextManager, session: &str, messages: &[Value]) -> Vec<Value> {
    let mut body = json!({"model": "gpt-4o", "messages": messages});
    let tenant = Tenant::from_api_key(Some("sk-replicas"));
    let managed = m
        .manage(&tenant, Some(session), &mut body, Mode::Compact, None)
        .await;
    assert!(!managed.fail_open, "{:?}", managed.report);
    body["messages"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn two_replicas_taking_turns_keep_the_prefix_byte_identical() {
    let cfg = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    let shared = store::open(&cfg).await.unwrap();
    let replicas = [manager(shared.clone()), manager(shared.clone())];
    let headers = "replica-test";

    let mut previous: Vec<Value> = Vec::new();
    let mut compactions = 0;
    for turn in 1..=24 {
        // Alternate replicas, sometimes twice in a row on the same one.
        let replica = &replicas[(turn * 7 / 3) % 2];
        let out = forwarded(replica, headers, &conversation(turn)).await;
        let compacted = out
            .iter()
            .filter(|m| m["content"].as_str().is_some_and(|c| c.contains("ctx_")))
            .count();
        if compacted < previous.len() {
            // Boundaries only move forward: whatever was compacted stays compacted.
            let before = previous
                .iter()
                .filter(|m| m["content"].as_str().is_some_and(|c| c.contains("ctx_")))
                .count();
            assert!(
                compacted >= before,
                "turn {turn}: compaction went backwards"
            );
        }
        // Every message the previous request showed is shown again byte for byte, except where
        // the boundary moved in this very request (then earlier messages may only get smaller).
        let common = previous.len().min(out.len());
        let same_prefix = (0..common).take_while(|&i| previous[i] == out[i]).count();
        if same_prefix < common {
            compactions += 1;
            for i in same_prefix..common {
                let (was, now) = (&previous[i], &out[i]);
                if was == now {
                    continue;
                }
                assert!(
                    now["content"].as_str().is_some_and(|c| c.contains("ctx_"))
                        && !was["content"].as_str().is_some_and(|c| c.contains("ctx_")),
                    "turn {turn}: message {i} changed without being newly compacted: {was} → {now}"
                );
            }
        }
        previous = out;
    }
    assert!(
        compactions >= 2,
        "the boundary should have moved in batches: {compactions}"
    );
    assert!(
        compactions <= 12,
        "the boundary moved almost every turn: {compactions}"
    );
}

#[tokio::test]
async fn decisions_of_two_replicas_are_all_kept() {
    let cfg = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    let shared = store::open(&cfg).await.unwrap();
    let (a, b) = (manager(shared.clone()), manager(shared.clone()));
    let headers = "branches";

    // Three branches of one session (they differ from their first user message on), decided
    // by A, then B, then A again: A must not write back a stale view that drops B's decision.
    let branch = |tag: &str| {
        let mut c = conversation(10);
        c[1] = json!({"role": "user", "content": format!("Check every service ({tag}).")});
        c.push(json!({"role": "user", "content": "Go on."}));
        c
    };
    let out_a = forwarded(&a, headers, &branch("a")).await;
    let out_b = forwarded(&b, headers, &branch("b")).await;
    let out_c = forwarded(&a, headers, &branch("c")).await;

    let id = a
        .identify(
            Tenant::from_api_key(Some("sk-replicas")),
            Some(headers),
            &json!({"messages": branch("a")}),
        )
        .unwrap();
    let key = StateKey::parse("decisions").unwrap();
    let state = shared
        .get_state(&id.tenant, &id.session, &key)
        .await
        .unwrap()
        .expect("decisions recorded");
    let entries: Vec<Value> = serde_json::from_slice(&state).unwrap();
    assert_eq!(entries.len(), 3, "a decision was lost: {entries:?}");
    // Each replica reproduces the other's output for every branch.
    assert_eq!(forwarded(&b, headers, &branch("a")).await, out_a);
    assert_eq!(forwarded(&a, headers, &branch("b")).await, out_b);
    assert_eq!(forwarded(&b, headers, &branch("c")).await, out_c);
}
