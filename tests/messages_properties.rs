//! Property tests of the Anthropic Messages adapter over generated Claude-Code-shaped
//! conversations: the pure engine decides with a small budget, the adapter writes the decision
//! back into the original bytes, and the result must be a request the strict mock accepts —
//! at most four breakpoints (never more than the client sent), thinking blocks untouched,
//! tool_use/tool_result pairing valid, the first message a user message — with every message
//! left whole copied byte for byte. A request the adapter cannot write safely goes unmanaged,
//! and only for the reasons it may.

use context_proxy::context::adapter::messages::{self, Unmanaged, WriteRules};
use context_proxy::context::adapter::{Adapter, Messages};
use context_proxy::context::engine::{self, Decision, Env, Input};
use context_proxy::context::estimate;
use context_proxy::context::{ContextConfig, Mode, Settings};
use context_proxy::mock::rules;
use context_proxy::store::ContentRef;
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Counts items with the Messages estimate.
struct Estimate;

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

impl Env for Estimate {
    fn count_message(&self, message: &Value) -> usize {
        Messages.count_item(&counter(), message)
    }
    fn reference(&self, text: &str) -> ContentRef {
        ContentRef::of(text)
    }
}

fn text(seed: u64, size: usize) -> String {
    const PIECES: [&str; 5] = [
        "fn main() { println!(\"hello\"); }\n",
        "The quick brown fox jumps over the lazy dog. ",
        "日本語のテキストと中文内容。",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}\n",
        "    at module.function (file.rs:42:7)\n",
    ];
    let mut out = String::new();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(PIECES[(x % PIECES.len() as u64) as usize]);
    }
    out
}

#[derive(Debug, Clone)]
enum Turn {
    /// A user question answered by assistant text.
    Chat(usize, usize),
    /// A round of tool calls with their result sizes, and text after the results.
    Tools(Vec<usize>, bool),
    /// A server tool used inside one assistant message.
    Server(usize),
}

fn turn() -> impl Strategy<Value = Turn> {
    let size = prop_oneof![3 => 1usize..300, 2 => 300usize..6000];
    prop_oneof![
        2 => (1usize..400, 1usize..400).prop_map(|(a, b)| Turn::Chat(a, b)),
        4 => (prop::collection::vec(size, 1..4), any::<bool>()).prop_map(|(s, t)| Turn::Tools(s, t)),
        1 => (1usize..2000).prop_map(Turn::Server),
    ]
}

/// A conversation as Claude Code sends it: the attribution line and a marked system prompt,
/// tools, a `system`-role message after the task, thinking on every assistant message (signed
/// as the mock signs it), a marker on the newest block; it ends at a plain turn or inside a
/// tool loop.
fn build(model: &str, turns: &[Turn], thinking: bool, open_loop: bool, seed: u64) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 4096,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=00000;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}},
                  {"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]},
            {"role": "system", "content": "<env>cwd: /repo</env>"}
        ],
    });
    if thinking {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    }
    let mut call = 0;
    let push = |body: &mut Value, m: Value| body["messages"].as_array_mut().unwrap().push(m);
    let assistant = |body: &Value, mut content: Vec<Value>, k: usize| {
        if thinking {
            content.insert(0, rules::signed_thinking(body, &format!("thought {k}")));
        }
        json!({"role": "assistant", "content": content})
    };
    for (k, t) in turns.iter().enumerate() {
        let s = seed.wrapping_add(k as u64 * 7919);
        // Every assistant message follows a user message.
        let last_role = body["messages"].as_array().unwrap().last().unwrap()["role"].clone();
        if last_role == "assistant" {
            push(&mut body, json!({"role": "user", "content": text(s, 20)}));
        }
        match t {
            Turn::Chat(q, a) => {
                if k > 0 {
                    push(&mut body, json!({"role": "user", "content": text(s, *q)}));
                }
                let m = assistant(
                    &body,
                    vec![json!({"type": "text", "text": text(s ^ 1, *a)})],
                    k,
                );
                push(&mut body, m);
            }
            Turn::Tools(sizes, trailing) => {
                let ids: Vec<String> = sizes
                    .iter()
                    .map(|_| {
                        call += 1;
                        format!("toolu_{call:04}")
                    })
                    .collect();
                let uses: Vec<Value> = ids.iter().map(|id| json!({"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": "/a.rs"}})).collect();
                let m = assistant(&body, uses, k);
                push(&mut body, m);
                let mut results: Vec<Value> = ids.iter().zip(sizes).map(|(id, n)| json!({"type": "tool_result", "tool_use_id": id, "content": text(s ^ *n as u64, *n)})).collect();
                if *trailing {
                    results.push(json!({"type": "text", "text": "<system-reminder>keep going</system-reminder>"}));
                }
                push(&mut body, json!({"role": "user", "content": results}));
                let m = assistant(&body, vec![json!({"type": "text", "text": "Done."})], k);
                push(&mut body, m);
            }
            Turn::Server(n) => {
                if k > 0 {
                    push(
                        &mut body,
                        json!({"role": "user", "content": "search the web"}),
                    );
                }
                let m = assistant(
                    &body,
                    vec![
                        json!({"type": "server_tool_use", "id": format!("srvtoolu_{k}"), "name": "web_search", "input": {"query": "rust"}}),
                        json!({"type": "web_search_tool_result", "tool_use_id": format!("srvtoolu_{k}"), "content": [{"type": "web_search_result", "url": "https://x", "title": "x", "encrypted_content": text(s, *n)}]}),
                        json!({"type": "text", "text": "Found it."}),
                    ],
                    k,
                );
                push(&mut body, m);
            }
        }
    }
    if open_loop {
        call += 1;
        let id = format!("toolu_{call:04}");
        let m = assistant(
            &body,
            vec![
                json!({"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "cargo test"}}),
            ],
            999,
        );
        push(&mut body, m);
        push(
            &mut body,
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": text(seed, 500), "cache_control": {"type": "ephemeral"}}]}),
        );
    } else {
        push(
            &mut body,
            json!({"role": "user", "content": [{"type": "text", "text": "What next?", "cache_control": {"type": "ephemeral"}}]}),
        );
    }
    body
}

fn settings(budget: usize) -> Settings {
    let cfg = ContextConfig {
        max_context_tokens: Some(budget),
        keep_recent_messages: 4,
        tool_result_max_tokens: 200,
        compact_batch_tokens: 500,
        ..ContextConfig::default()
    };
    cfg.resolve("claude-sonnet-4-5", Mode::Auto, &Default::default())
}

/// The thinking blocks of a request, in order.
fn thinking_blocks(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn written_requests_keep_the_apis_rules(
        turns in prop::collection::vec(turn(), 1..14),
        thinking in any::<bool>(),
        open_loop in any::<bool>(),
        binding in any::<bool>(),
        drop_block in any::<bool>(),
        budget in 800usize..20_000,
        seed in any::<u64>(),
    ) {
        let model = if binding { "claude-opus-5-5" } else { "claude-sonnet-4-5" };
        let body = build(model, &turns, thinking, open_loop, seed);
        prop_assert_eq!(rules::check_messages(&body), Ok(()), "the generated request is valid");
        let raw = serde_json::to_vec_pretty(&body).unwrap();
        let payloads = Messages.payloads(&body).unwrap();
        let counts: Vec<usize> = payloads.iter().map(|p| Estimate.count_message(p)).collect();
        let fixed = estimate::fixed_tokens(&body);
        let input = Input::read(&Messages, &payloads, &counts, &[], fixed);
        let outcome = engine::run(&input, &settings(budget), Decision::default(), &Estimate);
        let Some(items) = outcome.messages else { return Ok(()) };
        // A conversation the proxy sees for the first time: its thinking was signed after
        // the client's bytes, so every change is an edit.
        let rules_in = WriteRules { binds_thinking: messages::binds_thinking(model), drop_block_allowed: drop_block, repeats_forwarded: false };
        match messages::write_bytes(&raw, &body, &payloads, &items, rules_in) {
            Ok(written) => {
                let out: Value = serde_json::from_slice(&written.body).expect("the new body is JSON");
                prop_assert_eq!(rules::check_messages(&out), Ok(()), "the strict mock accepts it");
                prop_assert!(messages::breakpoints(&out) <= messages::breakpoints(&body));
                prop_assert!(messages::breakpoints(&out) <= messages::MAX_BREAKPOINTS);
                // Thinking blocks: unchanged and in order (those moved out or removed gone).
                let before = thinking_blocks(&body);
                let after = thinking_blocks(&out);
                let mut rest = before.iter();
                prop_assert!(after.iter().all(|b| rest.any(|o| o == b)), "a subsequence");
                prop_assert!(after.len() + written.thinking_removed <= before.len());
                // The latest assistant message came through byte for byte.
                let spans = Messages.spans(&raw).unwrap();
                let originals = body["messages"].as_array().unwrap();
                let latest = originals.iter().rposition(|m| m["role"] == "assistant").unwrap();
                let latest_bytes = &raw[spans.items[latest].clone()];
                prop_assert!(written.body.windows(latest_bytes.len()).any(|w| w == latest_bytes));
                // Every message that came back unchanged has its original bytes.
                let out_spans = Messages.spans(&written.body).unwrap();
                for (k, m) in out["messages"].as_array().unwrap().iter().enumerate() {
                    if let Some(i) = originals.iter().position(|o| o == m) {
                        if m["role"] != "user" || originals.iter().filter(|o| *o == m).count() == 1 {
                            prop_assert_eq!(
                                String::from_utf8_lossy(&written.body[out_spans.items[k].clone()]),
                                String::from_utf8_lossy(&raw[spans.items[i].clone()])
                            );
                        }
                    }
                }
                // Everything outside `messages` is as it came (but `thinking` with drop_block).
                let mut a = body.clone();
                let mut b = out.clone();
                a["messages"] = Value::Null;
                b["messages"] = Value::Null;
                if written.drop_block {
                    prop_assert!(binding && drop_block);
                    prop_assert_eq!(&b["thinking"]["block_binding"]["prefix_mismatch_behavior"], "drop_block");
                    b["thinking"] = a["thinking"].clone();
                }
                prop_assert_eq!(a, b);
            }
            Err(Unmanaged::LatestThinking | Unmanaged::OpenToolLoop | Unmanaged::BoundThinking) => {
                prop_assert!(binding && thinking && !drop_block);
            }
            Err(other) => prop_assert!(false, "unexpected refusal: {other}"),
        }
    }
}
