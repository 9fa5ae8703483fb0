//! Property tests of the engine over Responses API conversations (the Responses adapter), with
//! the real tokenizer, over generated Codex-like inputs: developer and user messages, reasoning
//! items with encrypted content before messages and calls, parallel function calls, custom
//! tool calls (`apply_patch`), local shell calls answered by `function_call_output`, shell
//! calls, server-side tool items, huge and tiny outputs. Whatever the budget and mode, a
//! managed input never holds an orphan call or output, never separates a reasoning item from
//! the item it came before, and never changes an `encrypted_content`, a `call_id` or a kept
//! call.

use std::collections::HashSet;

use context_proxy::context::adapter::{Adapter, Responses};
use context_proxy::context::engine::{self, Decision, Input};
use context_proxy::context::model::units;
use context_proxy::context::{ContextConfig, Mode, Settings};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use proptest::prelude::*;
use serde_json::{json, Value};

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

/// Text of about `size` characters.
fn text(seed: usize, size: usize) -> String {
    const PIECES: [&str; 4] = [
        "fn main() { println!(\"hello\"); }\n",
        "The quick brown fox jumps over the lazy dog. ",
        "日本語のテキスト。",
        "{\"key\": [1, 2, 3]}\n",
    ];
    // Unique per seed: equal items would make the checks below ambiguous.
    let mut out = format!("[{seed}] ");
    let mut i = seed;
    while out.len() < size {
        out.push_str(PIECES[i % PIECES.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

#[derive(Debug, Clone)]
enum Turn {
    User(usize),
    /// An assistant message, with a reasoning item before it or not.
    Assistant(usize, bool),
    /// Parallel function calls with their outputs' sizes, a reasoning item first or not.
    Calls(Vec<usize>, bool),
    /// An `apply_patch` custom tool call and its output.
    Patch(usize),
    /// A local shell call answered by a function_call_output.
    LocalShell(usize),
    /// A shell call and its output.
    Shell(usize),
    /// A server-side web search (no output).
    WebSearch,
}

fn turn() -> impl Strategy<Value = Turn> {
    let size = prop_oneof![3 => 1usize..200, 2 => 200usize..4000, 1 => 4000usize..30_000];
    prop_oneof![
        3 => size.clone().prop_map(Turn::User),
        2 => ((1usize..400), any::<bool>()).prop_map(|(n, r)| Turn::Assistant(n, r)),
        4 => (prop::collection::vec(size.clone(), 1..4), any::<bool>()).prop_map(|(s, r)| Turn::Calls(s, r)),
        1 => size.clone().prop_map(Turn::Patch),
        1 => size.clone().prop_map(Turn::LocalShell),
        1 => size.prop_map(Turn::Shell),
        1 => Just(Turn::WebSearch),
    ]
}

fn reasoning(n: usize) -> Value {
    // Real ones run to kilobytes of base64.
    let sealed: String = (0..800)
        .map(|k| char::from(b"AZaz09+/"[(n * 7 + k) % 8]))
        .collect();
    json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{n:08}{sealed}=")})
}

/// The input items of a conversation of `turns`, opening with a developer and a user message.
fn conversation(turns: &[Turn]) -> Vec<Value> {
    let mut items = vec![
        json!({"role": "developer", "content": "<permissions>sandboxed</permissions>"}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the failing test"}]}),
    ];
    for (t, turn) in turns.iter().enumerate() {
        let call_id = |k: usize| format!("call_{t}_{k}");
        match turn {
            Turn::User(n) => items.push(json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text(t * 13, *n)}]})),
            Turn::Assistant(n, with_reasoning) => {
                if *with_reasoning {
                    items.push(reasoning(t));
                }
                items.push(json!({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": text(t * 13 + 1, *n), "annotations": []}]}));
            }
            Turn::Calls(sizes, with_reasoning) => {
                if *with_reasoning {
                    items.push(reasoning(t));
                }
                for k in 0..sizes.len() {
                    items.push(
                        json!({"type": "function_call", "call_id": call_id(k), "name": "shell",
                        "arguments": format!("{{\"cmd\":\"cat file{k}.rs\"}}")}),
                    );
                }
                // Outputs in reverse order: pairing is by call_id.
                for (k, size) in sizes.iter().enumerate().rev() {
                    items.push(
                        json!({"type": "function_call_output", "call_id": call_id(k),
                        "output": text(t * 13 + 2 + k, *size)}),
                    );
                }
            }
            Turn::Patch(n) => {
                items.push(
                    json!({"type": "custom_tool_call", "call_id": call_id(0), "name": "apply_patch",
                    "input": "*** Begin Patch\n*** Update File: a.rs\n*** End Patch"}),
                );
                items.push(
                    json!({"type": "custom_tool_call_output", "call_id": call_id(0),
                    "output": text(t * 13 + 6, *n)}),
                );
            }
            Turn::LocalShell(n) => {
                items.push(
                    json!({"type": "local_shell_call", "call_id": call_id(0), "status": "completed",
                    "action": {"type": "exec", "command": ["bash", "-lc", "ls"], "env": {}}}),
                );
                items.push(
                    json!({"type": "function_call_output", "call_id": call_id(0),
                    "output": text(t * 13 + 7, *n)}),
                );
            }
            Turn::Shell(n) => {
                items.push(json!({"type": "shell_call", "call_id": call_id(0), "action": {"commands": ["ls"]}}));
                items.push(json!({"type": "shell_call_output", "call_id": call_id(0),
                    "output": [{"type": "input_text", "text": text(t * 13 + 8, *n)}]}));
            }
            Turn::WebSearch => items.push(json!({"type": "web_search_call", "status": "completed",
                "action": {"type": "search", "query": "rust"}})),
        }
    }
    items
}

fn settings(mode: Mode, budget: usize, keep_recent: usize) -> Settings {
    let cfg = ContextConfig {
        max_context_tokens: Some(budget),
        keep_recent_messages: keep_recent,
        tool_result_max_tokens: 300,
        truncate_tool_result_tokens: Some(6000),
        compact_batch_tokens: 1500,
        ..ContextConfig::default()
    };
    cfg.resolve("gpt-5", mode, &Default::default())
}

fn call_id(item: &Value) -> Option<&str> {
    item.get("call_id").and_then(Value::as_str)
}

fn is_call(item: &Value) -> bool {
    matches!(
        item["type"].as_str(),
        Some("function_call" | "custom_tool_call" | "local_shell_call" | "shell_call")
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn managed_inputs_stay_valid(
        turns in prop::collection::vec(turn(), 1..24),
        budget in 800usize..40_000,
        keep in 0usize..8,
        mode in prop_oneof![Just(Mode::Compact), Just(Mode::Compress), Just(Mode::Auto)],
    ) {
        let items = conversation(&turns);
        let c = counter();
        let body = json!({"model": "gpt-5", "instructions": "You are Codex.", "input": items});
        let count = Responses.count(&c, &body);
        prop_assert_eq!(count.per_message.len(), items.len());
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        let input = Input::read(&Responses, &items, &count.per_message, &count.message_hashes, fixed);
        let s = settings(mode, budget, keep);
        let outcome = engine::run(&input, &s, Decision::default(), &c);
        let Some(out) = &outcome.messages else { return Ok(()) };

        // No orphan call or output, no reasoning item without the item after it.
        let out_items = Responses.items(out, &[], &[], None);
        prop_assert!(units(&out_items).is_ok(), "malformed output: {:?}", units(&out_items));

        // Every reasoning item is followed by the very item that followed it in the input.
        for (k, item) in out.iter().enumerate() {
            if item["type"] == "reasoning" {
                let at = items.iter().position(|i| i == item).expect("a reasoning item is kept whole");
                prop_assert_eq!(out.get(k + 1), items.get(at + 1), "reasoning separated from its item");
            }
        }
        // And every item kept that came after a reasoning item still has it right before it.
        for (k, item) in out.iter().enumerate() {
            let Some(at) = items.iter().position(|i| i == item) else { continue };
            if at > 0 && items[at - 1]["type"] == "reasoning" {
                prop_assert!(k > 0 && out[k - 1] == items[at - 1], "an item lost its reasoning");
            }
        }
        // Encrypted content, calls and call ids are kept byte for byte (value for value).
        let originals: HashSet<String> = items.iter().map(Value::to_string).collect();
        for item in out {
            if item.get("encrypted_content").is_some() || is_call(item) {
                prop_assert!(originals.contains(&item.to_string()), "changed: {}", item);
            }
        }
        let in_ids: HashSet<&str> = items.iter().filter_map(call_id).collect();
        let out_calls: Vec<&str> = out.iter().filter(|i| is_call(i)).filter_map(call_id).collect();
        let out_ids: HashSet<&str> = out.iter().filter_map(call_id).collect();
        prop_assert!(out_ids.is_subset(&in_ids));
        // A call kept keeps its output and an output kept keeps its call.
        for id in &out_ids {
            prop_assert!(out_calls.contains(id), "output {} without its call", id);
        }
        // The latest user message is never moved out (only the hard cap may shorten it): the
        // last user message sent that is not a marker is it. Older rounds of its turn may go.
        let last_user = items.iter().rposition(|i| i["role"] == "user").unwrap();
        let is_marker = |i: &Value| i.to_string().contains("earlier messages");
        let latest_sent = out.iter().rev().find(|i| i["role"] == "user" && !is_marker(i));
        prop_assert!(
            latest_sent.is_some_and(|i| *i == items[last_user]
                || i.to_string().contains("[context-proxy: truncated")),
            "the latest user message was moved out"
        );
        // What the model has not read (after its last answer) goes as it came, in shape.
        let kinds = Responses.items(&items, &[], &[], None);
        let unseen = kinds.iter().rposition(|m| m.kind.is_assistant()).map_or(0, |a| a + 1);
        let after = items.len() - unseen;
        prop_assert!(out.len() >= after);
        let shape = |i: &Value| (i["type"].clone(), i["call_id"].clone(), i["role"].clone());
        let kept: Vec<_> = out[out.len() - after..].iter().map(shape).collect();
        let sent: Vec<_> = items[unseen..].iter().map(shape).collect();
        prop_assert!(kept == sent, "the unseen part changed shape");
    }
}

#[test]
fn an_unknown_item_in_the_span_to_move_leaves_the_request_alone() {
    let mut turns: Vec<Turn> = (0..12).map(|_| Turn::Calls(vec![3000], true)).collect();
    turns.push(Turn::User(20));
    let mut items = conversation(&turns);
    items.insert(2, json!({"type": "brand_new_item", "payload": "x"}));
    let c = counter();
    let body = json!({"model": "gpt-5", "input": items});
    let count = Responses.count(&c, &body);
    let fixed = count.total - count.per_message.iter().sum::<usize>();
    let input = Input::read(&Responses, &items, &count.per_message, &[], fixed);
    let outcome = engine::run(
        &input,
        &settings(Mode::Auto, 1200, 2),
        Decision::default(),
        &c,
    );
    assert!(outcome.messages.is_none());
    let why = outcome.report.skipped.unwrap().to_string();
    assert!(why.contains("brand_new_item"), "{why}");
    // Without it the same conversation is moved out.
    items.remove(2);
    let count = Responses.count(&c, &json!({"model": "gpt-5", "input": items}));
    let input = Input::read(&Responses, &items, &count.per_message, &[], fixed);
    let outcome = engine::run(
        &input,
        &settings(Mode::Auto, 1200, 2),
        Decision::default(),
        &c,
    );
    assert!(outcome.report.offloaded > 0, "{:?}", outcome.report);
}
