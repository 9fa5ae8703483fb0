//! Property tests of the engine over generated single-prompt tool loops (one user prompt, then
//! only tool rounds: parallel calls, tiny and huge results), on each wire's adapter, under a
//! small budget. Whatever the budget and the recent window: the managed conversation is well
//! formed (every call with all its results; on Responses every reasoning item before the item
//! it came before; on Messages the written request passes the strict mock's rules, the first
//! message the user's), the prompt and the round the model has not read go out as they came,
//! the output fits the budget whenever what must stay fits, and nothing is lost: every item
//! is sent as it came, or its text or its whole self is in the store.

use context_proxy::context::adapter::messages::{self, WriteRules};
use context_proxy::context::adapter::{Adapter, Chat, Messages, Responses};
use context_proxy::context::engine::{self, Decision, Env, Input, Outcome, Source};
use context_proxy::context::model::{units, Kind};
use context_proxy::context::{estimate, ContextConfig, Mode, Settings};
use context_proxy::mock::rules;
use context_proxy::store::ContentRef;
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use proptest::prelude::*;
use serde_json::{json, Value};

const PROMPT: &str = "Make the failing tests pass.";

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

/// Counts Messages items with the Messages estimate.
struct Estimate;

impl Env for Estimate {
    fn count_message(&self, message: &Value) -> usize {
        Messages.count_item(&counter(), message)
    }
    fn reference(&self, text: &str) -> ContentRef {
        ContentRef::of(text)
    }
}

/// Distinct text of about `size` bytes.
fn text(seed: usize, size: usize) -> String {
    const PIECES: [&str; 4] = [
        "error[E0308]: mismatched types at src/lib.rs:42:7\n",
        "The quick brown fox jumps over the lazy dog. ",
        "日本語のテキスト。",
        "{\"key\": [1, 2, 3]}\n",
    ];
    let mut out = format!("[{seed}] ");
    let mut i = seed;
    while out.len() < size {
        out.push_str(PIECES[i % PIECES.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// A round: the sizes of its parallel calls' results.
type Round = Vec<usize>;

fn round() -> impl Strategy<Value = Round> {
    let size = prop_oneof![3 => 1usize..300, 3 => 300usize..3000, 1 => 3000usize..20_000];
    prop::collection::vec(size, 1..4)
}

fn chat(rounds: &[Round]) -> Vec<Value> {
    let mut out = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": PROMPT}),
    ];
    for (r, sizes) in rounds.iter().enumerate() {
        let calls: Vec<Value> = (0..sizes.len())
            .map(|c| json!({"id": format!("call_{r}_{c}"), "type": "function", "function": {"name": "run", "arguments": "{}"}}))
            .collect();
        out.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for (c, n) in sizes.iter().enumerate() {
            out.push(json!({"role": "tool", "tool_call_id": format!("call_{r}_{c}"), "content": text(r * 10 + c, *n)}));
        }
    }
    out
}

fn responses(rounds: &[Round]) -> Vec<Value> {
    let mut out = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: workspace-write"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}),
    ];
    for (r, sizes) in rounds.iter().enumerate() {
        out.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{r:04}")}));
        for c in 0..sizes.len() {
            out.push(json!({"type": "function_call", "call_id": format!("call_{r}_{c}"), "name": "shell", "arguments": "{}"}));
        }
        for (c, n) in sizes.iter().enumerate() {
            out.push(json!({"type": "function_call_output", "call_id": format!("call_{r}_{c}"), "output": text(r * 10 + c, *n)}));
        }
    }
    out
}

/// A Messages body as Claude Code sends it: signed thinking opening every assistant message.
fn messages_body(rounds: &[Round], model: &str) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    });
    for (r, sizes) in rounds.iter().enumerate() {
        let mut content = vec![rules::signed_thinking(&body, &format!("round {r}"))];
        content.extend((0..sizes.len()).map(|c| json!({"type": "tool_use", "id": format!("toolu_{r}_{c}"), "name": "Bash", "input": {}})));
        let results: Vec<Value> = sizes
            .iter()
            .enumerate()
            .map(|(c, n)| json!({"type": "tool_result", "tool_use_id": format!("toolu_{r}_{c}"), "content": text(r * 10 + c, *n)}))
            .collect();
        let list = body["messages"].as_array_mut().unwrap();
        list.push(json!({"role": "assistant", "content": content}));
        list.push(json!({"role": "user", "content": results}));
    }
    body
}

fn settings(budget: usize, keep: usize) -> Settings {
    let cfg = ContextConfig {
        max_context_tokens: Some(budget),
        keep_recent_messages: keep,
        ..ContextConfig::default()
    };
    cfg.resolve("gpt-4o", Mode::Auto, &Default::default())
}

/// The checks every wire shares, over the engine's `outcome` for `items` (counted `counts`,
/// `fixed` outside them): the prompt and the unseen round as they came, nothing lost, the
/// budget met whenever what must stay fits.
fn shared_checks(
    adapter: &dyn Adapter,
    items: &[Value],
    counts: &[usize],
    fixed: usize,
    outcome: &Outcome,
    s: &Settings,
) -> Result<(), TestCaseError> {
    let kinds = adapter.items(items, counts, &[], None);
    let unit_list = units(&kinds).unwrap();
    let out = outcome.messages.clone().unwrap_or_else(|| items.to_vec());
    // The prompt is pinned.
    let prompt = items
        .iter()
        .position(|m| m.to_string().contains(PROMPT))
        .unwrap();
    prop_assert!(out.contains(&items[prompt]), "the prompt was moved out");
    // What the model has not read (the last round) goes as it came but for the hard cap.
    let last_call = kinds.iter().rposition(|m| m.kind.is_assistant()).unwrap();
    let unseen = unit_list
        .iter()
        .find(|u| u.contains(&last_call))
        .unwrap()
        .start;
    let moved: String = outcome
        .writes
        .iter()
        .filter_map(|w| match &w.source {
            Source::Owned(lines) => Some(lines.as_str()),
            Source::MessageText(_) => None,
        })
        .collect();
    for (i, item) in items.iter().enumerate() {
        let rewritten = outcome
            .writes
            .iter()
            .any(|w| w.source == Source::MessageText(i));
        if i >= unseen {
            let truncated = rewritten && adapter.text(item).is_some();
            prop_assert!(out.contains(item) || truncated, "unseen item {} changed", i);
        }
        // Nothing lost: sent as it came, its text stored, or its whole self stored.
        let stored = moved.lines().any(|l| l == adapter.line(item));
        prop_assert!(
            out.contains(item) || rewritten || stored,
            "item {} is lost",
            i
        );
    }
    // Fits whenever what must stay fits: the head, a marker and the round the model has not
    // read (a forced cut goes past the recent window), each of its results squeezed to the
    // floor at most.
    let capped = |i: usize| match kinds[i].kind {
        Kind::ToolResult(_) => counts[i].min(engine::SQUEEZE_FLOOR_TOKENS),
        _ => counts[i],
    };
    let must_stay: usize = (0..=prompt).chain(unseen..items.len()).map(capped).sum();
    if fixed + must_stay + 300 <= s.budget {
        prop_assert!(
            outcome.report.tokens_after <= s.budget,
            "{} over {} though {} must stay",
            outcome.report.tokens_after,
            s.budget,
            must_stay
        );
    }
    Ok(())
}

/// The loop replayed one round at a time, each request planned with the decision the previous
/// one left: every request checked as above, and while the decision stays, each repeats the
/// previous one byte for byte (a cut, or a squeeze of a round the model had not read, lasts);
/// the decision moves in batches, not on every round.
fn replayed(
    adapter: &dyn Adapter,
    rounds: &[Round],
    requests: impl Fn(usize) -> (Vec<Value>, Vec<usize>, usize),
    env: &dyn Env,
    s: &Settings,
) -> Result<(), TestCaseError> {
    let mut prior = Decision::default();
    let mut previous: Option<Vec<Value>> = None;
    let (mut moves, mut added, mut last_total) = (0, 0, 0);
    for k in 1..=rounds.len() {
        let (items, counts, fixed) = requests(k);
        let input = Input::read(adapter, &items, &counts, &[], fixed);
        let outcome = engine::run(&input, s, prior, env);
        shared_checks(adapter, &items, &counts, fixed, &outcome, s)?;
        let out = outcome.messages.clone().unwrap_or_else(|| items.clone());
        let total = outcome.report.tokens_before;
        added += total.saturating_sub(last_total);
        last_total = total;
        if outcome.decision == prior {
            if let Some(prev) = &previous {
                prop_assert!(out.len() >= prev.len());
                for (i, (a, b)) in prev.iter().zip(&out).enumerate() {
                    prop_assert_eq!(a, b, "round {}: item {} changed without a move", k, i);
                }
            }
        } else {
            moves += 1;
        }
        prior = outcome.decision;
        previous = Some(out);
    }
    let bound = 2 + added / (s.budget - s.target).max(1);
    prop_assert!(moves <= bound, "{} moves, bound {}", moves, bound);
    Ok(())
}

proptest! {
    // Each case plans every request of its loop.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn chat_loops_fit_every_round_and_cuts_last(
        rounds in prop::collection::vec(round(), 1..30),
        budget in 1_500usize..30_000,
        keep in 0usize..12,
    ) {
        let c = counter();
        let requests = |k: usize| {
            let items = chat(&rounds[..k]);
            let counts: Vec<usize> = items.iter().map(|m| c.count_message(m)).collect();
            (items, counts, 3)
        };
        replayed(&Chat, &rounds, requests, &c, &settings(budget, keep))?;
    }

    #[test]
    fn responses_loops_fit_every_round_and_cuts_last(
        rounds in prop::collection::vec(round(), 1..30),
        budget in 1_500usize..30_000,
        keep in 0usize..12,
    ) {
        let c = counter();
        let requests = |k: usize| {
            let items = responses(&rounds[..k]);
            let body = json!({"model": "gpt-5", "instructions": "You are Codex.", "input": items});
            let count = Responses.count(&c, &body);
            let fixed = count.total - count.per_message.iter().sum::<usize>();
            (items, count.per_message, fixed)
        };
        replayed(&Responses, &rounds, requests, &c, &settings(budget, keep))?;
    }

    #[test]
    fn messages_loops_fit_every_round_and_cuts_last(
        rounds in prop::collection::vec(round(), 1..30),
        budget in 1_500usize..30_000,
        keep in 0usize..12,
    ) {
        let requests = |k: usize| {
            let body = messages_body(&rounds[..k], "claude-sonnet-4-5");
            let items = Messages.payloads(&body).unwrap().into_owned();
            let counts: Vec<usize> = items.iter().map(|p| Estimate.count_message(p)).collect();
            (items, counts, estimate::fixed_tokens(&body))
        };
        replayed(&Messages, &rounds, requests, &Estimate, &settings(budget, keep))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn chat_loops_stay_valid_fit_and_lose_nothing(
        rounds in prop::collection::vec(round(), 1..50),
        budget in 1_500usize..30_000,
        keep in 0usize..8,
    ) {
        let items = chat(&rounds);
        let c = counter();
        let counts: Vec<usize> = items.iter().map(|m| c.count_message(m)).collect();
        let input = Input::read(&Chat, &items, &counts, &[], 3);
        let s = settings(budget, keep);
        let outcome = engine::run(&input, &s, Decision::default(), &c);
        if let Some(out) = &outcome.messages {
            let kinds = Chat.items(out, &[], &[], None);
            prop_assert!(units(&kinds).is_ok(), "malformed: {:?}", units(&kinds));
        }
        shared_checks(&Chat, &items, &counts, 3, &outcome, &s)?;
    }

    #[test]
    fn responses_loops_stay_valid_fit_and_lose_nothing(
        rounds in prop::collection::vec(round(), 1..50),
        budget in 1_500usize..30_000,
        keep in 0usize..8,
    ) {
        let items = responses(&rounds);
        let c = counter();
        let body = json!({"model": "gpt-5", "instructions": "You are Codex.", "input": items});
        let count = Responses.count(&c, &body);
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        let input = Input::read(&Responses, &items, &count.per_message, &[], fixed);
        let s = settings(budget, keep);
        let outcome = engine::run(&input, &s, Decision::default(), &c);
        if let Some(out) = &outcome.messages {
            let kinds = Responses.items(out, &[], &[], None);
            prop_assert!(units(&kinds).is_ok(), "malformed: {:?}", units(&kinds));
            // Every reasoning item is followed by the item that followed it.
            for (k, item) in out.iter().enumerate() {
                if item["type"] == "reasoning" {
                    let at = items.iter().position(|i| i == item).unwrap();
                    prop_assert_eq!(out.get(k + 1).map(|i| &i["call_id"]), items.get(at + 1).map(|i| &i["call_id"]));
                }
            }
        }
        shared_checks(&Responses, &items, &count.per_message, fixed, &outcome, &s)?;
    }

    #[test]
    fn messages_loops_stay_valid_fit_and_lose_nothing(
        rounds in prop::collection::vec(round(), 1..40),
        budget in 1_500usize..30_000,
        keep in 0usize..8,
        binding in any::<bool>(),
        drop_block in any::<bool>(),
    ) {
        let model = if binding { "claude-opus-5-5" } else { "claude-sonnet-4-5" };
        let body = messages_body(&rounds, model);
        prop_assert_eq!(rules::check_messages(&body), Ok(()), "the generated request is valid");
        let raw = serde_json::to_vec(&body).unwrap();
        let payloads = Messages.payloads(&body).unwrap();
        let counts: Vec<usize> = payloads.iter().map(|p| Estimate.count_message(p)).collect();
        let fixed = estimate::fixed_tokens(&body);
        let input = Input::read(&Messages, &payloads, &counts, &[], fixed);
        let s = settings(budget, keep);
        let outcome = engine::run(&input, &s, Decision::default(), &Estimate);
        shared_checks(&Messages, &payloads, &counts, fixed, &outcome, &s)?;
        let Some(items) = &outcome.messages else { return Ok(()) };
        let rules_in = WriteRules {
            binds_thinking: messages::binds_thinking(model),
            drop_block_allowed: drop_block,
            // The first request of the conversation: every edit is new.
            repeats_forwarded: false,
        };
        match messages::write_bytes(&raw, &body, &payloads, items, rules_in) {
            Ok(written) => {
                let out: Value = serde_json::from_slice(&written.body).unwrap();
                // The strict mock's rules: pairing, thinking, breakpoints, first message.
                prop_assert_eq!(rules::check_messages(&out), Ok(()));
                prop_assert_eq!(&out["messages"][0], &body["messages"][0]);
                if written.drop_block {
                    prop_assert!(binding && drop_block);
                } else {
                    // No thinking block was stripped from the open loop.
                    prop_assert_eq!(written.thinking_removed, 0);
                }
            }
            // On a model binding thinking to the prefix, an edit before the open loop's latest
            // assistant message is refused unless the API may drop the block.
            Err(messages::Unmanaged::LatestThinking | messages::Unmanaged::BoundThinking) => {
                prop_assert!(binding && !drop_block)
            }
            Err(other) => prop_assert!(false, "unexpected refusal: {other}"),
        }
    }
}

/// A case the chat property found: a tiny budget, a cut, then rounds whose results the model
/// has not read yet squeezed beside the cut's marker; every request fits.
#[test]
fn a_squeeze_beside_a_marker_fits() {
    let rounds: Vec<Round> = vec![
        vec![212, 194],
        vec![6],
        vec![75, 2454, 7062],
        vec![78, 94],
        vec![1386],
        vec![150],
        vec![6],
        vec![177, 94],
        vec![332],
        vec![942],
        vec![57, 4444],
        vec![843, 257],
        vec![720],
        vec![51, 104],
    ];
    let c = counter();
    let requests = |k: usize| {
        let items = chat(&rounds[..k]);
        let counts: Vec<usize> = items.iter().map(|m| c.count_message(m)).collect();
        (items, counts, 3)
    };
    replayed(&Chat, &rounds, requests, &c, &settings(1967, 2)).unwrap();
}
