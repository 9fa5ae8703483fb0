//! The proxy's own tools on `/v1/messages`, through the real proxy and the strict mock scripted
//! to call `context_read`: offered as Anthropic tools after the client's (no breakpoint added)
//! when a marker names a reference; the model's calls answered by the proxy and hidden, in JSON
//! and in live SSE (one `message_start`, contiguous indexes, one `message_delta` and
//! `message_stop`, usage summed); the upstream transcript put back byte for byte on the next
//! turn; mixed rounds (the proxy's and the client's calls in one answer); the last round.

mod common;

use common::Harness;
use context_proxy::mock::{MockConfig, Reply};
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5";
const NEEDLE: &str = "NEEDLE-4217";

/// A file whose line 77 holds the needle.
fn file(name: &str) -> String {
    (1..=300)
        .map(|i| {
            if i == 77 && name == "a.rs" {
                format!("{name} line {i}: const SECRET: &str = \"{NEEDLE}\";\n")
            } else {
                format!("{name} line {i}: let value_{i} = compute({i}) * 2;\n")
            }
        })
        .collect()
}

/// A coding conversation: two large `Read` results (compacted under the small budget), a
/// marked system prompt and tool, ending with a question about line 77.
fn conversation(stream: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Read a.rs and b.rs."})];
    for (i, name) in ["a.rs", "b.rs"].iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("toolu_read{i}"), "name": "Read", "input": {"path": name}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_read{i}"), "content": file(name)}]}));
    }
    messages
        .push(json!({"role": "assistant", "content": [{"type": "text", "text": "Both read."}]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "text", "text": "What is on line 77 of a.rs?", "cache_control": {"type": "ephemeral"}}]}));
    json!({
        "model": MODEL,
        "max_tokens": 2048,
        "stream": stream,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"}}],
        "messages": messages,
    })
}

async fn harness(max_rounds: usize) -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(4_000);
        c.context.keep_recent_messages = 2;
        c.context.reload.max_rounds = max_rounds;
    })
    .await
}

async fn post(h: &Harness, body: &Value) -> (u16, Vec<u8>) {
    post_to(h, "/v1/messages", body).await
}

async fn post_to(h: &Harness, path: &str, body: &Value) -> (u16, Vec<u8>) {
    let resp = h
        .client
        .post(h.url(path))
        .header("x-api-key", "sk-ant-reload")
        .header("x-context-session", "reload-session")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

/// The bodies the mock received on `/v1/messages`, raw.
fn forwarded(h: &Harness) -> Vec<Vec<u8>> {
    h.mock
        .received()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .map(|r| r.body.to_vec())
        .collect()
}

fn parse(raw: &[u8]) -> Value {
    serde_json::from_slice(raw).unwrap()
}

/// The reference the forwarded request's marker names for a.rs.
fn reference_of_a(body: &[u8]) -> String {
    let text = std::str::from_utf8(body).unwrap();
    let marker = text.find("a.rs line 1:").map_or(text, |at| &text[..at]);
    let at = marker.rfind("ctx_").expect("a marker names a reference");
    marker[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// A first request of the conversation: the mock answers plainly; returns the reference the
/// forwarded request names and checks the tools were offered as Anthropic's.
async fn warm_up(h: &Harness) -> String {
    h.mock.push(Reply::text("Let me check."));
    let (status, _) = post(h, &conversation(false)).await;
    assert_eq!(status, 200);
    let sent = forwarded(h).pop().unwrap();
    let body = parse(&sent);
    let names: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Read", "context_read", "context_search"]);
    assert!(body["tools"][1]["input_schema"]["properties"]["ref"].is_object());
    // The client's three breakpoints, no more: the tools add none.
    assert_eq!(
        std::str::from_utf8(&sent)
            .unwrap()
            .matches("cache_control")
            .count(),
        3
    );
    reference_of_a(&sent)
}

fn read(reference: &str) -> Vec<(String, Value)> {
    vec![(
        "context_read".into(),
        json!({"ref": reference, "offset": 75, "limit": 5}),
    )]
}

/// The events of an SSE body, parsed.
fn events(bytes: &[u8]) -> Vec<Value> {
    common::sse_data(std::str::from_utf8(bytes).unwrap())
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The message a client assembles from `events` (the SDK's accumulation, by index).
fn assembled(events: &[Value]) -> Value {
    let mut message = Value::Null;
    let mut blocks: Vec<Value> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    for e in events {
        match e["type"].as_str().unwrap() {
            "message_start" => message = e["message"].clone(),
            "content_block_start" => {
                assert_eq!(e["index"].as_u64().unwrap() as usize, blocks.len());
                blocks.push(e["content_block"].clone());
                inputs.push(String::new());
            }
            "content_block_delta" => {
                let i = e["index"].as_u64().unwrap() as usize;
                assert!(i < blocks.len(), "a delta for a block never started");
                let d = &e["delta"];
                for (kind, key) in [
                    ("text_delta", "text"),
                    ("thinking_delta", "thinking"),
                    ("signature_delta", "signature"),
                ] {
                    if d["type"] == kind {
                        let old = blocks[i][key].as_str().unwrap_or("").to_string();
                        blocks[i][key] = Value::from(old + d[key].as_str().unwrap());
                    }
                }
                if d["type"] == "input_json_delta" {
                    inputs[i].push_str(d["partial_json"].as_str().unwrap());
                }
            }
            "message_delta" => {
                message["stop_reason"] = e["delta"]["stop_reason"].clone();
                message["usage"] = e["usage"].clone();
            }
            _ => {}
        }
    }
    for (b, input) in blocks.iter_mut().zip(inputs) {
        if !input.is_empty() {
            b["input"] = serde_json::from_str(&input).unwrap();
        }
    }
    message["content"] = Value::Array(blocks);
    message
}

/// The answer as the client holds it, from a JSON body or a stream (checking the stream's
/// shape: one start, one delta, one stop last).
fn answer(bytes: &[u8], stream: bool) -> Value {
    let text = String::from_utf8_lossy(bytes);
    assert!(
        !text.contains("context_read"),
        "the client saw the proxy's tool: {text}"
    );
    if !stream {
        return parse(bytes);
    }
    let events = events(bytes);
    let count = |t: &str| events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(count("message_start"), 1);
    assert_eq!(count("message_delta"), 1);
    assert_eq!(count("message_stop"), 1);
    assert_eq!(events.last().unwrap()["type"], "message_stop");
    assert!(count("ping") >= 1, "ping is forwarded");
    assembled(&events)
}

fn types(message: &Value) -> Vec<String> {
    message["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap().to_string())
        .collect()
}

/// The next turn: the conversation, the client's answer as it got it, `after`.
fn next_turn(stream: bool, got: &Value, after: Value) -> Value {
    let mut body = conversation(stream);
    let messages = body["messages"].as_array_mut().unwrap();
    // The question's breakpoint moves to the newest message, as Claude Code does.
    messages.last_mut().unwrap()["content"][0]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    messages.push(json!({"role": "assistant", "content": got["content"]}));
    messages.push(after);
    body
}

async fn single_round(stream: bool) {
    let h = harness(4).await;
    let reference = warm_up(&h).await;
    let first = Reply::tool_calls(read(&reference)).thinking("I must read line 77.");
    let second = Reply::text(format!("Line 77 holds {NEEDLE}.")).thinking("Found it.");
    h.mock.push(first.clone());
    h.mock.push(second.clone());
    let (status, bytes) = post(&h, &conversation(stream)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let got = answer(&bytes, stream);
    assert_eq!(types(&got), ["thinking", "thinking", "text"]);
    assert!(got["content"][2]["text"].as_str().unwrap().contains(NEEDLE));
    assert_eq!(got["stop_reason"], "end_turn");
    assert_eq!(got["content"][0]["thinking"], "I must read line 77.");
    assert!(got["content"][1]["signature"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));

    let sent = forwarded(&h);
    assert_eq!(sent.len(), 3);
    // Round two carries the model's message as it came (thinking signed) and the read.
    let round_two = parse(&sent[2]);
    let m = round_two["messages"].as_array().unwrap();
    let (a1, u1) = (&m[m.len() - 2], &m[m.len() - 1]);
    assert_eq!(a1["content"][1]["name"], "context_read");
    assert_eq!(u1["content"][0]["tool_use_id"], a1["content"][1]["id"]);
    assert!(u1["content"][0]["content"]
        .as_str()
        .unwrap()
        .contains(NEEDLE));
    // Usage: both upstream calls.
    let expected = common::messages_usage(&sent[1..], vec![first, second.clone()]).await;
    assert_eq!(common::messages_prompt_and_output(&got["usage"]), expected);

    // Next turn: the upstream transcript goes back in place of the merged message, byte for
    // byte as round two sent it, and the strict mock accepts it.
    h.mock.push(Reply::text("You are welcome."));
    let body = next_turn(stream, &got, json!({"role": "user", "content": "Thanks."}));
    let (status, bytes) = post(&h, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let sent = forwarded(&h);
    let turn = sent.last().unwrap();
    let text = std::str::from_utf8(turn).unwrap();
    assert!(
        text.contains(&format!("{a1},{u1},")),
        "the hidden round is not back byte for byte: {text}"
    );
    let turn = parse(turn);
    let m = turn["messages"].as_array().unwrap();
    let at = m.iter().position(|x| x == a1).unwrap();
    assert_eq!(&m[at + 1], u1);
    assert_eq!(types(&m[at + 2]), ["thinking", "text"]);
    assert_eq!(m[at + 2]["content"][0]["thinking"], "Found it.");
    assert_eq!(m[at + 3], json!({"role": "user", "content": "Thanks."}));
    assert!(turn["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "context_read"));

    // count_tokens is asked about that same body: the transcript put back, the tools offered.
    let mut counted = body.clone();
    counted.as_object_mut().unwrap().remove("stream");
    let (status, _) = post_to(&h, "/v1/messages/count_tokens", &counted).await;
    assert_eq!(status, 200);
    let asked = h
        .mock
        .received()
        .into_iter()
        .rfind(|r| r.path == "/v1/messages/count_tokens")
        .unwrap();
    let asked = parse(&asked.body);
    assert_eq!(asked["messages"], turn["messages"]);
    assert_eq!(asked["tools"], turn["tools"]);
}

/// The calls of a JSON answer read whole are all on its bill: the request and the round.
#[tokio::test]
async fn json_a_read_round_is_on_the_bill() {
    let h = harness(4).await;
    let reference = warm_up(&h).await;
    h.mock
        .push(Reply::tool_calls(read(&reference)).thinking("I must read line 77."));
    h.mock
        .push(Reply::text(format!("Line 77 holds {NEEDLE}.")).thinking("Found it."));
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("x-api-key", "sk-ant-reload")
        .header("x-context-session", "reload-session")
        .header("anthropic-version", "2023-06-01")
        .json(&conversation(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-upstream-calls"],
        "forwarded=1,reload=1,retry=0,summarizer=0"
    );
    let cost: f64 = resp.headers()["x-context-cost-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(cost > 0.0);
}

#[tokio::test]
async fn json_a_read_round_is_hidden_and_put_back_next_turn() {
    single_round(false).await;
}

#[tokio::test]
async fn stream_a_read_round_is_hidden_live_and_put_back_next_turn() {
    single_round(true).await;
}

async fn mixed_round(stream: bool) {
    let h = harness(4).await;
    let reference = warm_up(&h).await;
    let mut calls = read(&reference);
    calls.push(("Read".into(), json!({"path": "c.rs"})));
    h.mock
        .push(Reply::text_and_tool_calls("Reading both.", calls).thinking("Two reads."));
    let (status, bytes) = post(&h, &conversation(stream)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let got = answer(&bytes, stream);
    assert_eq!(types(&got), ["thinking", "text", "tool_use"]);
    assert_eq!(got["content"][2]["name"], "Read");
    assert_eq!(got["stop_reason"], "tool_use");
    assert_eq!(
        forwarded(&h).len(),
        2,
        "a mixed round goes back to the client"
    );

    // The client answers its own call; the proxy's result opens that message again.
    let own = got["content"][2]["id"].as_str().unwrap().to_string();
    h.mock.push(Reply::text(format!("{NEEDLE} it is.")));
    let body = next_turn(
        stream,
        &got,
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": own, "content": "fn c() {}"}]}),
    );
    let (status, bytes) = post(&h, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let turn = parse(forwarded(&h).last().unwrap());
    let m = turn["messages"].as_array().unwrap();
    let a = &m[m.len() - 2];
    assert_eq!(types(a), ["thinking", "text", "tool_use", "tool_use"]);
    let results = m.last().unwrap()["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], a["content"][2]["id"]);
    assert!(results[0]["content"].as_str().unwrap().contains(NEEDLE));
    assert_eq!(results[1]["tool_use_id"], own.as_str());
}

#[tokio::test]
async fn json_mixed_round_gives_the_client_its_call_and_restores_the_proxys() {
    mixed_round(false).await;
}

#[tokio::test]
async fn stream_mixed_round_gives_the_client_its_call_and_restores_the_proxys() {
    mixed_round(true).await;
}

async fn last_round(stream: bool) {
    let h = harness(1).await;
    let reference = warm_up(&h).await;
    h.mock
        .push(Reply::tool_calls(read(&reference)).thinking("Read it."));
    h.mock.push(
        Reply::text_and_tool_calls("Line 77 is a constant.", read(&reference))
            .thinking("Once more?"),
    );
    let (status, bytes) = post(&h, &conversation(stream)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let got = answer(&bytes, stream);
    assert_eq!(types(&got), ["thinking", "thinking", "text"]);
    assert_eq!(got["stop_reason"], "end_turn");
    // One round answered, then the call after it dropped: no third upstream call.
    assert_eq!(forwarded(&h).len(), 3);
    // The next turn is still accepted: the dropped call is not put back.
    h.mock.push(Reply::text("ok"));
    let body = next_turn(stream, &got, json!({"role": "user", "content": "Go on."}));
    let (status, bytes) = post(&h, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
}

#[tokio::test]
async fn json_after_the_last_round_a_call_of_the_proxys_tools_is_dropped() {
    last_round(false).await;
}

#[tokio::test]
async fn stream_after_the_last_round_a_call_of_the_proxys_tools_is_dropped() {
    last_round(true).await;
}

async fn nothing_left(stream: bool) {
    let h = harness(1).await;
    let reference = warm_up(&h).await;
    h.mock.push(Reply::tool_calls(read(&reference)));
    h.mock.push(Reply::tool_calls(read(&reference)));
    let mut body = conversation(stream);
    body.as_object_mut().unwrap().remove("thinking");
    let (status, bytes) = post(&h, &body).await;
    let text = String::from_utf8_lossy(&bytes).to_string();
    assert!(!text.contains("context_read"), "{text}");
    let error = if stream {
        assert_eq!(status, 200);
        let events = events(&bytes);
        let last = events.last().unwrap().clone();
        assert_eq!(events.iter().filter(|e| e["type"] == "error").count(), 1);
        assert!(events.iter().all(|e| e["type"] != "message_stop"));
        last
    } else {
        assert_eq!(status, 502, "{text}");
        parse(&bytes)
    };
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("round"));
}

#[tokio::test]
async fn json_nothing_left_after_the_last_round_is_an_error_in_anthropics_shape() {
    nothing_left(false).await;
}

#[tokio::test]
async fn stream_nothing_left_after_the_last_round_is_an_error_event_in_anthropics_shape() {
    nothing_left(true).await;
}

async fn error_in_round_two(stream: bool) {
    let h = harness(4).await;
    let reference = warm_up(&h).await;
    h.mock
        .push(Reply::tool_calls(read(&reference)).thinking("Read it."));
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_x"});
    h.mock.push(Reply::error(529, overloaded.clone()));
    let (status, bytes) = post(&h, &conversation(stream)).await;
    let text = String::from_utf8_lossy(&bytes).to_string();
    assert!(!text.contains("context_read"), "{text}");
    if stream {
        // The stream had begun: the upstream's error is its last event.
        assert_eq!(status, 200);
        let events = events(&bytes);
        assert_eq!(events.first().unwrap()["type"], "message_start");
        assert_eq!(
            events.last().unwrap(),
            &json!({"type": "error", "error": overloaded["error"]})
        );
        assert!(events.iter().all(|e| e["type"] != "message_stop"));
    } else {
        assert_eq!(status, 529);
        assert_eq!(parse(&bytes), overloaded);
    }
}

#[tokio::test]
async fn json_an_upstream_error_in_round_two_reaches_the_client() {
    error_in_round_two(false).await;
}

#[tokio::test]
async fn stream_an_upstream_error_in_round_two_ends_the_stream_in_anthropics_shape() {
    error_in_round_two(true).await;
}

/// A hidden round answered in JSON: the client's answer, and round two's last two messages
/// (the model's call of the proxy's tool and its result).
async fn one_hidden_round(h: &Harness) -> (Value, Value, Value) {
    let reference = warm_up(h).await;
    h.mock
        .push(Reply::tool_calls(read(&reference)).thinking("I must read line 77."));
    h.mock
        .push(Reply::text(format!("Line 77 holds {NEEDLE}.")).thinking("Found it."));
    let (status, bytes) = post(h, &conversation(false)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let got = answer(&bytes, false);
    let round_two = parse(&forwarded(h)[2]);
    let m = round_two["messages"].as_array().unwrap();
    (got, m[m.len() - 2].clone(), m[m.len() - 1].clone())
}

/// The client's next request asks for no tool call: the transcript put back still holds the
/// proxy's call, so its tools are defined (the model cannot call them), and the strict mock
/// accepts the request.
#[tokio::test]
async fn with_tool_choice_none_the_restored_round_keeps_its_tools() {
    let h = harness(4).await;
    let (got, a1, u1) = one_hidden_round(&h).await;
    h.mock.push(Reply::text("Summary."));
    let mut body = next_turn(
        false,
        &got,
        json!({"role": "user", "content": "Summarize."}),
    );
    body["tool_choice"] = json!({"type": "none"});
    let (status, bytes) = post(&h, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let turn = parse(forwarded(&h).last().unwrap());
    let m = turn["messages"].as_array().unwrap();
    assert!(m.contains(&a1) && m.contains(&u1), "the round is put back");
    let names: Vec<&str> = turn["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Read", "context_read", "context_search"]);
    assert_eq!(turn["tool_choice"], json!({"type": "none"}));
}

/// The client's next request takes every name the proxy's read tool could have: the round's
/// call could not be defined, so the round is not put back and the client's messages go as
/// they came.
#[tokio::test]
async fn when_the_proxys_tools_cannot_be_defined_the_round_is_not_put_back() {
    let h = harness(4).await;
    let (got, a1, _) = one_hidden_round(&h).await;
    h.mock.push(Reply::text("Done."));
    let mut body = next_turn(false, &got, json!({"role": "user", "content": "Thanks."}));
    for name in [
        "context_read",
        "proxy_context_read",
        "context_proxy_read",
        "stored_context_read",
    ] {
        body["tools"].as_array_mut().unwrap().push(
            json!({"name": name, "description": "the client's", "input_schema": {"type": "object"}}),
        );
    }
    let (status, bytes) = post(&h, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let turn = parse(forwarded(&h).last().unwrap());
    assert!(!turn["messages"].as_array().unwrap().contains(&a1));
    assert_eq!(turn["tools"], body["tools"]);
}

/// With the proxy's tools offered, `x-context-tokens-after` is the estimate of what was
/// forwarded, the tools' definitions counted as the estimate counts the client's own (within
/// a token of rounding).
#[tokio::test]
async fn the_tokens_after_count_the_offered_tools_as_the_estimate_does() {
    use context_proxy::context::adapter::{Adapter, Messages};
    use context_proxy::tokens::{CountSettings, Counter, Encoding};
    let h = harness(4).await;
    h.mock.push(Reply::text("Let me check."));
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("x-api-key", "sk-ant-reload")
        .header("x-context-session", "reload-tokens")
        .header("anthropic-version", "2023-06-01")
        .json(&conversation(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let after: usize = resp.headers()["x-context-tokens-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let sent = parse(&forwarded(&h).pop().unwrap());
    assert!(sent["tools"].as_array().unwrap().len() == 3);
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let estimate = Messages.count(&counter, &sent).total;
    assert!(after.abs_diff(estimate) <= 1, "{after} vs {estimate}");
}
