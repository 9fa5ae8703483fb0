//! One prompt, then a long tool loop (60 rounds with large results) under a small budget,
//! through the real proxy against the strict mock, on each wire: chat completions, the
//! Responses API and Anthropic Messages (with signed thinking, as Claude Code sends it). Every
//! forwarded request is accepted by the mock and fits the budget by the route's own count; the
//! older rounds of the one turn are moved out whole (the prompt stays); between cuts each
//! forwarded conversation repeats the previous one byte for byte, and a cut is never followed
//! by another on the next turn; the moved rounds are read back by `context_read` through the
//! marker's reference. On a model binding thinking to the prefix the loop is cut only when the
//! client's betas allow `drop_block`; otherwise the cut is held back, saying so.

mod common;

use common::Harness;
use context_proxy::context::adapter::{Adapter, Chat, Messages, Responses};
use context_proxy::mock::{rules, MockConfig, Reply};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use serde_json::{json, Value};

const ROUNDS: usize = 60;
/// Twelve rounds' worth: the recent window (three rounds) and the unseen round leave room
/// for a cut to last several rounds.
const BUDGET: usize = 12_000;
const PROMPT: &str = "Port the crate to the new API and make the tests pass.";

/// The large result of round `i`: 40 distinct lines (about 900 tokens).
fn output(i: usize) -> String {
    (0..40)
        .map(|l| {
            format!("round {i} line {l}: warning: unused variable `x{l}` in m{i}/src/lib.rs\n")
        })
        .collect()
}

/// What differs between the wires.
struct Wire {
    path: &'static str,
    /// The body after `rounds` tool rounds.
    body: fn(rounds: usize) -> Value,
    /// The conversation's list in a body.
    list: &'static str,
    /// The route's count of a body.
    count: fn(&Value) -> usize,
}

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

fn chat_body(rounds: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": PROMPT}),
    ];
    for i in 0..rounds {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": "shell", "arguments": format!("{{\"cmd\":\"cargo check -p m{i}\"}}")}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": output(i)}),
        );
    }
    json!({
        "model": "gpt-4o",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}],
    })
}

fn responses_body(rounds: usize) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}),
    ];
    for i in 0..rounds {
        input.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{i:04}{}", "Qx+/".repeat(40))}));
        input.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "shell", "arguments": format!("{{\"cmd\":[\"cargo\",\"check\",\"-p\",\"m{i}\"]}}")}));
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": output(i)}));
    }
    json!({
        "model": "gpt-5",
        "instructions": "You are Codex, a coding agent.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "array", "items": {"type": "string"}}}}, "strict": false}],
        "store": false,
        "stream": false,
        "include": ["reasoning.encrypted_content"],
    })
}

fn messages_body(rounds: usize) -> Value {
    messages_body_for("claude-sonnet-4-5", rounds)
}

fn messages_body_for(model: &str, rounds: usize) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "You are Claude Code, a coding agent."}],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    });
    for i in 0..rounds {
        // Each assistant message opens with thinking signed as the upstream signs it.
        let thinking = rules::signed_thinking(&body, &format!("Check m{i} next."));
        let list = body["messages"].as_array_mut().unwrap();
        list.push(json!({"role": "assistant", "content": [thinking,
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": format!("cargo check -p m{i}")}}]}));
        list.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": output(i)}]}));
    }
    body
}

const CHAT: Wire = Wire {
    path: "/v1/chat/completions",
    body: chat_body,
    list: "messages",
    count: |b| Chat.count(&counter(), b).total,
};

const RESPONSES: Wire = Wire {
    path: "/v1/responses",
    body: responses_body,
    list: "input",
    count: |b| Responses.count(&counter(), b).total,
};

const MESSAGES: Wire = Wire {
    path: "/v1/messages",
    body: messages_body,
    list: "messages",
    count: |b| Messages.count(&counter(), b).total,
};

async fn harness() -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(BUDGET);
    })
    .await
}

/// A recent window (45 items) larger than the budget by itself: only a cut that reaches into
/// it fits.
async fn harness_with_a_wide_window() -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(BUDGET);
        c.context.keep_recent_messages = 45;
    })
    .await
}

/// The size of a forwarded body by the route's own count: on Messages the upstream's
/// (`count_tokens`), elsewhere the proxy's tokenizer.
async fn forwarded_tokens(h: &Harness, wire: &Wire, sent: &Value) -> usize {
    if wire.path == "/v1/messages" {
        common::messages_upstream_count(&h.mock, sent).await as usize
    } else {
        (wire.count)(sent)
    }
}

async fn post(h: &Harness, wire: &Wire, body: &Value) -> reqwest::Response {
    h.client
        .post(h.url(wire.path))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-client")
        .header("x-api-key", "sk-test-client")
        .header("anthropic-version", "2023-06-01")
        .header("x-context-session", "one-long-loop")
        .body(body.to_string())
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

/// The reference a marker in `text` names.
fn marker_ref(text: &str) -> Option<String> {
    let at = text.find("earlier messages")?;
    let from = at + text[at..].find("stored as ctx_")? + "stored as ".len();
    let id: String = text[from..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    Some(id)
}

/// Replays the loop one round at a time and checks every forwarded request; returns the last
/// body the client sent and the reference the last forwarded request's marker names.
async fn replay(h: &Harness, wire: &Wire) -> (Value, String) {
    let mut previous: Option<Vec<Value>> = None;
    let (mut cuts, mut last_cut) = (0, None);
    let mut last = (Value::Null, String::new());
    for k in 0..=ROUNDS {
        let body = (wire.body)(k);
        let resp = post(h, wire, &body).await;
        let (status, actions) = (resp.status(), header(&resp, "x-context-actions"));
        let text = resp.text().await.unwrap();
        // The strict mock accepted it: pairing, reasoning, thinking, first message.
        assert_eq!(status, 200, "round {k}: {actions}: {text}");
        assert!(!actions.starts_with("skipped"), "round {k}: {actions}");
        let sent = h.mock.received().last().unwrap().json();
        if wire.path == "/v1/messages" {
            assert_eq!(rules::check_messages(&sent), Ok(()), "round {k}");
        }
        // It fits the budget by the route's own count, the proxy's tools included.
        let tokens = forwarded_tokens(h, wire, &sent).await;
        assert!(
            tokens <= BUDGET,
            "round {k}: {tokens} over {BUDGET} ({actions})"
        );
        let list = sent[wire.list].as_array().unwrap().clone();
        // The prompt is pinned: it goes out as it came, right after the head.
        let prompt = list.iter().position(|m| m.to_string().contains(PROMPT));
        assert!(
            prompt.is_some_and(|p| p <= 1),
            "round {k}: the prompt moved"
        );
        if let Some(before) = &previous {
            // What the previous request held, but its newest item, is repeated byte for byte
            // unless this request cut; a cut is never followed by another on the next round.
            let shared = before.len() - 1;
            if list.len() < shared || list[..shared] != before[..shared] {
                cuts += 1;
                assert!(
                    last_cut.is_none_or(|at| k >= at + 2),
                    "round {k}: cut again right after round {last_cut:?}"
                );
                last_cut = Some(k);
            }
        }
        if let Some(r) = list.iter().find_map(|m| marker_ref(&m.to_string())) {
            last = (body, r);
        }
        previous = Some(list);
    }
    let unmanaged = (wire.count)(&(wire.body)(ROUNDS));
    assert!(
        unmanaged > 4 * BUDGET,
        "the loop is only {unmanaged} tokens"
    );
    assert!(cuts > 0, "the loop was never cut");
    // Cut once and deep: far fewer cuts than rounds.
    assert!(cuts * 3 <= ROUNDS, "{cuts} cuts in {ROUNDS} rounds");
    assert!(!last.1.is_empty(), "no marker in the forwarded requests");
    last
}

/// The model reads the moved rounds back: the proxy answers its `context_read` of the
/// marker's reference with the stored messages, round 0's result among them.
async fn read_back(h: &Harness, wire: &Wire, body: &Value, reference: &str) {
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": reference, "offset": 1, "limit": 12}),
    )]));
    h.mock.push(Reply::text("Round 0 warned about x5."));
    let before = h.mock.received().len();
    let resp = post(h, wire, body).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-context-reload").starts_with("rounds=1"));
    let text = resp.text().await.unwrap();
    assert!(
        !text.contains("context_read"),
        "the client saw the proxy's call"
    );
    let received = h.mock.received();
    assert_eq!(received.len(), before + 2);
    let second = received[before + 1].json().to_string();
    assert!(
        second.contains("round 0 line 5: warning"),
        "the read did not bring round 0 back"
    );
}

#[tokio::test]
async fn chat_a_long_single_prompt_tool_loop_holds_the_budget() {
    let h = harness().await;
    let (body, reference) = replay(&h, &CHAT).await;
    read_back(&h, &CHAT, &body, &reference).await;
}

#[tokio::test]
async fn responses_a_long_single_prompt_tool_loop_holds_the_budget() {
    let h = harness().await;
    let (body, reference) = replay(&h, &RESPONSES).await;
    read_back(&h, &RESPONSES, &body, &reference).await;
}

#[tokio::test]
async fn messages_a_long_single_prompt_tool_loop_holds_the_budget() {
    let h = harness().await;
    let (body, reference) = replay(&h, &MESSAGES).await;
    read_back(&h, &MESSAGES, &body, &reference).await;
}

/// With a recent window larger than the budget, the forced cut goes into it (up to the round
/// the model has not read) and lasts: every request fits, and between cuts each repeats the
/// previous one byte for byte.
#[tokio::test]
async fn chat_a_forced_cut_reaches_into_the_recent_window_and_lasts() {
    let h = harness_with_a_wide_window().await;
    let (body, reference) = replay(&h, &CHAT).await;
    read_back(&h, &CHAT, &body, &reference).await;
}

#[tokio::test]
async fn responses_a_forced_cut_reaches_into_the_recent_window_and_lasts() {
    let h = harness_with_a_wide_window().await;
    let (body, reference) = replay(&h, &RESPONSES).await;
    read_back(&h, &RESPONSES, &body, &reference).await;
}

#[tokio::test]
async fn messages_a_forced_cut_reaches_into_the_recent_window_and_lasts() {
    let h = harness_with_a_wide_window().await;
    let (body, reference) = replay(&h, &MESSAGES).await;
    read_back(&h, &MESSAGES, &body, &reference).await;
}

/// Parallel reads the model has not seen yet.
const READS: usize = 8;

/// A file of `tokens`-ish tokens: numbered lines, every one distinct.
fn file(k: usize) -> String {
    (0..150)
        .map(|l| {
            format!("m{k}.rs line {l}: pub fn handler_{k}_{l}(req: &Request) -> u32 {{ {l} }}\n")
        })
        .collect()
}

/// The line of file `k` a squeeze removes (from the middle).
fn middle_line(k: usize) -> String {
    format!("m{k}.rs line 75: pub fn handler_{k}_75")
}

/// The body after one round of `READS` parallel reads, then `more` small rounds.
fn parallel_body(wire: &Wire, more: usize) -> Value {
    let mut body = (wire.body)(0);
    match wire.path {
        "/v1/chat/completions" => {
            let list = body["messages"].as_array_mut().unwrap();
            let calls: Vec<Value> = (0..READS)
                .map(|k| json!({"id": format!("read_{k}"), "type": "function", "function": {"name": "shell", "arguments": format!("{{\"cmd\":\"cat m{k}.rs\"}}")}}))
                .collect();
            list.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for k in 0..READS {
                list.push(json!({"role": "tool", "tool_call_id": format!("read_{k}"), "content": file(k)}));
            }
            for i in 0..more {
                list.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{i}"), "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"cargo check\"}"}}]}));
                list.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": format!("ok {i}")}));
            }
        }
        "/v1/responses" => {
            let list = body["input"].as_array_mut().unwrap();
            list.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{}", "Rd+/".repeat(40))}));
            for k in 0..READS {
                list.push(json!({"type": "function_call", "call_id": format!("read_{k}"), "name": "shell", "arguments": format!("{{\"cmd\":[\"cat\",\"m{k}.rs\"]}}")}));
            }
            for k in 0..READS {
                list.push(json!({"type": "function_call_output", "call_id": format!("read_{k}"), "output": file(k)}));
            }
            for i in 0..more {
                list.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{i:04}{}", "Qx+/".repeat(40))}));
                list.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "shell", "arguments": "{\"cmd\":[\"cargo\",\"check\"]}"}));
                list.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": format!("ok {i}")}));
            }
        }
        _ => {
            let thinking = rules::signed_thinking(&body, "Read the modules.");
            let calls = (0..READS).map(|k| json!({"type": "tool_use", "id": format!("toolu_read_{k}"), "name": "Bash", "input": {"command": format!("cat m{k}.rs")}}));
            let content: Vec<Value> = std::iter::once(thinking).chain(calls).collect();
            let list = body["messages"].as_array_mut().unwrap();
            list.push(json!({"role": "assistant", "content": content}));
            let results: Vec<Value> = (0..READS)
                .map(|k| json!({"type": "tool_result", "tool_use_id": format!("toolu_read_{k}"), "content": file(k)}))
                .collect();
            list.push(json!({"role": "user", "content": results}));
            for i in 0..more {
                let thinking = rules::signed_thinking(&body, &format!("Check {i}."));
                let list = body["messages"].as_array_mut().unwrap();
                list.push(json!({"role": "assistant", "content": [thinking,
                    {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": "cargo check"}}]}));
                list.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": format!("ok {i}")}]}));
            }
        }
    }
    body
}

/// The references the truncation markers in `text` name, in order.
fn truncated_refs(text: &str) -> Vec<String> {
    text.match_indices("truncated: ")
        .filter_map(|(at, _)| {
            let from = at + text[at..].find("stored as ctx_")? + "stored as ".len();
            Some(
                text[from..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect(),
            )
        })
        .collect()
}

/// A round of parallel reads larger than the budget, which the model has not read yet: every
/// result is cut to one share of the budget (none left whole while another is cut to
/// nothing), the request fits by the route's own count, and the model reads each result's
/// middle back through `context_read`. The next requests repeat the squeezed results byte for
/// byte.
async fn parallel_reads_share_the_budget(wire: &Wire) {
    let h = harness().await;
    let body = parallel_body(wire, 0);
    let raw = (wire.count)(&body);
    assert!(raw > 2 * BUDGET, "the round is only {raw} tokens");
    let resp = post(&h, wire, &body).await;
    let actions = header(&resp, "x-context-actions");
    assert_eq!(resp.status(), 200, "{actions}");
    resp.bytes().await.unwrap();
    let sent = h.mock.received().last().unwrap().json();
    if wire.path == "/v1/messages" {
        assert_eq!(rules::check_messages(&sent), Ok(()));
    }
    let tokens = forwarded_tokens(&h, wire, &sent).await;
    assert!(tokens <= BUDGET, "{tokens} over {BUDGET} ({actions})");
    let first = sent[wire.list].as_array().unwrap().clone();
    let text = serde_json::to_string(&first).unwrap();
    // Every result is cut, and keeps its head and its tail.
    let mut references: Vec<String> = Vec::new();
    for k in 0..READS {
        assert!(
            !text.contains(&middle_line(k)),
            "result {k} went whole ({actions})"
        );
        assert!(
            text.contains(&format!("m{k}.rs line 0:")),
            "result {k} lost its head"
        );
        assert!(
            text.contains(&format!("m{k}.rs line 149:")),
            "result {k} lost its tail"
        );
    }
    for item in &first {
        references.extend(truncated_refs(&item.to_string()));
    }
    references.dedup();
    assert_eq!(references.len(), READS, "{references:?}");

    // The model reads every result's middle back, in one round of parallel calls.
    let calls = references
        .iter()
        .map(|r| {
            (
                "context_read".to_string(),
                json!({"ref": r, "offset": 73, "limit": 6}),
            )
        })
        .collect();
    h.mock.push(Reply::tool_calls(calls));
    h.mock.push(Reply::text("Read them all."));
    let before = h.mock.received().len();
    let resp = post(&h, wire, &body).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-context-reload").starts_with("rounds=1"));
    resp.bytes().await.unwrap();
    let received = h.mock.received();
    assert_eq!(received.len(), before + 2);
    let second = received[before + 1].json().to_string();
    for k in 0..READS {
        assert!(
            second.contains(&middle_line(k)),
            "result {k} was not read back"
        );
    }

    // The model has read them: the next request repeats the squeezed results as they were
    // sent, and later ones too, until a boundary moves (the squeeze left the budget little
    // room to grow in: the next cut compacts or moves them out).
    let squeezed: Vec<Value> = first
        .iter()
        .filter(|m| !truncated_refs(&m.to_string()).is_empty())
        .cloned()
        .collect();
    let mut moved = false;
    for more in 1..=4 {
        let resp = post(&h, wire, &parallel_body(wire, more)).await;
        assert_eq!(resp.status(), 200);
        let actions = header(&resp, "x-context-actions");
        moved |= actions.contains("offloaded=") || actions.contains("compacted=");
        resp.bytes().await.unwrap();
        let sent = h.mock.received().last().unwrap().json();
        let tokens = forwarded_tokens(&h, wire, &sent).await;
        assert!(tokens <= BUDGET, "round {more}: {tokens} over {BUDGET}");
        let list = sent[wire.list].as_array().unwrap().clone();
        if more == 1 {
            let shared = first.len() - 1;
            assert_eq!(&list[..shared], &first[..shared]);
        }
        for item in &squeezed {
            assert!(
                list.contains(item) || moved,
                "round {more}: a squeezed result changed ({actions})"
            );
        }
    }
}

#[tokio::test]
async fn chat_parallel_reads_over_the_budget_share_it() {
    parallel_reads_share_the_budget(&CHAT).await;
}

#[tokio::test]
async fn responses_parallel_reads_over_the_budget_share_it() {
    parallel_reads_share_the_budget(&RESPONSES).await;
}

#[tokio::test]
async fn messages_parallel_reads_over_the_budget_share_it() {
    parallel_reads_share_the_budget(&MESSAGES).await;
}

/// On a model that binds each thinking block to everything before it, moving out rounds of the
/// open loop would invalidate the latest assistant message's thinking, which the loop needs:
/// the cut is held back (only what follows the last thinking block may change), unless the
/// client's betas let the proxy ask the API to drop invalidated blocks; then the loop is cut
/// and fits.
#[tokio::test]
async fn messages_a_binding_model_cuts_the_loop_only_with_drop_block() {
    const MODEL: &str = "claude-opus-5-5";
    for beta in [None, Some("thinking-binding-controls-2026-08-01")] {
        let h = harness().await;
        let mut managed = 0;
        for k in 0..30 {
            let body = messages_body_for(MODEL, k);
            let mut req = h
                .client
                .post(h.url("/v1/messages"))
                .header("x-api-key", "sk-ant-test")
                .header("anthropic-version", "2023-06-01")
                .header("x-context-session", "binding-loop");
            if let Some(beta) = beta {
                req = req.header("anthropic-beta", beta);
            }
            let resp = req.json(&body).send().await.unwrap();
            let actions = header(&resp, "x-context-actions");
            assert_eq!(resp.status(), 200, "round {k}: {actions}");
            resp.bytes().await.unwrap();
            let sent = h.mock.received().last().unwrap().json();
            if (MESSAGES.count)(&body) <= BUDGET {
                continue;
            }
            match beta {
                None => {
                    // Nothing before the last thinking block changes: held back, or nothing
                    // to change after it.
                    assert_eq!(rules::check_messages(&sent), Ok(()), "round {k}");
                    assert!(sent["thinking"].get("block_binding").is_none());
                    assert!(
                        actions.contains("held_back=thinking") || actions.starts_with("skipped"),
                        "round {k}: {actions}"
                    );
                }
                Some(_) => {
                    assert_eq!(rules::check_messages(&sent), Ok(()), "round {k}");
                    assert_eq!(
                        sent["thinking"]["block_binding"]["prefix_mismatch_behavior"],
                        "drop_block"
                    );
                    let tokens = (MESSAGES.count)(&sent);
                    assert!(tokens <= BUDGET, "round {k}: {tokens} over {BUDGET}");
                    managed += 1;
                }
            }
        }
        assert_eq!(managed > 0, beta.is_some());
    }
}
