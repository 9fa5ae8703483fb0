//! The proxy's own tools on the Responses API, through the real proxy and the mock's strict
//! Responses API scripted to call them: offered as flat function tools after the client's when
//! a marker names a reference; the model's `function_call`s of them answered by the proxy and
//! hidden, in JSON and in live SSE (one `response.created`, `output_index` contiguous over the
//! client's items, one increasing `sequence_number`, unique item ids, exactly one terminal
//! event whose `output` is the client's items, usage summed); a mixed round gives the client
//! its own call and keeps the proxy's, with the reasoning bound to it, to put back byte for
//! byte next turn; after the last round the tools are withdrawn.

mod common;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::context::settings::WindowEntry;
use context_proxy::mock::{MockConfig, Reply};
use context_proxy::store::ContentRef;
use serde_json::{json, Value};
use std::collections::HashSet;

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

fn file_a() -> String {
    numbered_lines("a.rs", 600)
}

fn ref_a() -> String {
    ContentRef::of(&file_a()).as_str().to_string()
}

/// A Codex-shaped input whose large shell output gets moved out (the forwarded request then
/// names a reference), ending with a user question.
fn input() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read a.rs."}]}),
        json!({"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": "{\"cmd\":[\"cat\",\"a.rs\"]}"}),
        json!({"type": "function_call_output", "call_id": "call_a", "output": file_a()}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It defines compute-based values.", "annotations": []}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is on line 7 of a.rs?"}]}),
    ]
}

fn body(input: Vec<Value>, stream: bool) -> Value {
    json!({
        "model": "gpt-5",
        "instructions": "You are a coding agent.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "array", "items": {"type": "string"}}}, "required": ["cmd"], "additionalProperties": false}, "strict": true}],
        "reasoning": {"effort": "medium"},
        "include": ["reasoning.encrypted_content"],
        "store": false,
        "stream": stream,
        "prompt_cache_key": "thread-reload",
    })
}

fn managed(c: &mut Config) {
    c.context.keep_recent_messages = 2;
    c.context.compact_batch_tokens = 1000;
    c.context
        .model_windows
        .insert("gpt-5".into(), WindowEntry::Window(400_000));
}

async fn harness() -> Harness {
    Harness::start_with(MockConfig::default(), managed).await
}

fn read(r: &str, offset: usize, limit: usize) -> (String, Value) {
    (
        "context_read".into(),
        json!({"ref": r, "offset": offset, "limit": limit}),
    )
}

async fn post(h: &Harness, body: &Value) -> reqwest::Response {
    h.client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-client")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The proxy's tool names appear nowhere in what the client receives.
fn assert_invisible(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for name in ["context_read", "context_search"] {
        assert!(!text.contains(name), "the client saw {name}: {text}");
    }
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn json_a_read_is_answered_by_the_proxy_and_hidden() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 5, 3)]));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let resp = post(&h, &body(input(), false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=1,calls=1,failed=0"
    );
    assert_eq!(
        resp.headers()["x-context-upstream-calls"],
        "forwarded=1,reload=1,retry=0,summarizer=0"
    );
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    // The client's items only: the answer's reasoning and message.
    let kinds: Vec<&str> = answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "message"]);
    assert_eq!(
        answer["output"][1]["content"][0]["text"],
        "Line 7 computes value_7."
    );
    assert_eq!(tool_names(&answer), ["shell"]);

    // The upstream was offered the flat tools after the client's, then got the round back.
    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    let first = received[0].json();
    assert_eq!(
        tool_names(&first),
        ["shell", "context_read", "context_search"]
    );
    assert_eq!(first["tools"][1]["strict"], false);
    assert!(first.to_string().contains(&ref_a()));
    let second = received[1].json();
    let items = second["input"].as_array().unwrap();
    let n = items.len();
    assert_eq!(items[n - 3]["type"], "reasoning");
    assert_eq!(items[n - 2]["type"], "function_call");
    assert_eq!(items[n - 2]["name"], "context_read");
    assert_eq!(items[n - 1]["type"], "function_call_output");
    assert_eq!(items[n - 1]["call_id"], items[n - 2]["call_id"]);
    let output = items[n - 1]["output"].as_str().unwrap();
    assert!(
        output.starts_with(&format!("[context_read {}: lines 5–7 of 600", ref_a())),
        "{output}"
    );
    assert!(output.contains("a.rs line 7: let value_7"));

    // Usage summed over both upstream calls.
    let expected = common::billed_input_tokens(&h.mock, &first).await
        + common::billed_input_tokens(&h.mock, &second).await;
    assert_eq!(answer["usage"]["input_tokens"], expected);
    assert!(answer["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    assert!(answer["usage"]["output_tokens_details"].is_object());
}

#[tokio::test]
async fn nothing_is_offered_when_nothing_is_stored() {
    let h = harness().await;
    h.mock.push(Reply::text("Hi."));
    let short = vec![json!({"role": "user", "content": "hello"})];
    let resp = post(&h, &body(short.clone(), false)).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-context-reload").is_none());
    let received = h.mock.received();
    assert_eq!(tool_names(&received[0].json()), ["shell"]);
}

#[tokio::test]
async fn stream_a_read_continues_one_response_live() {
    let h = harness().await;
    h.mock.push(Reply::text_and_tool_calls(
        "Let me look.",
        vec![read(&ref_a(), 7, 1)],
    ));
    h.mock
        .push(Reply::text("Line 7 computes value_7.").stream_chunks(4));
    let resp = post(&h, &body(input(), true)).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let (events, last) = common::check_responses_stream(&text);
    assert_eq!(last["type"], "response.completed");
    // Each round's reasoning and text (the mock reasons before the text, so the reasoning
    // goes with the text, not with the proxy's call after it); never the proxy's call.
    let output = last["response"]["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["reasoning", "message", "reasoning", "message"],
        "{text}"
    );
    let said: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(said, "Let me look.Line 7 computes value_7.");
    assert_eq!(tool_names(&last["response"]), ["shell"]);
    assert_eq!(tool_names(&events[0]["response"]), ["shell"]);

    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    let (first, second) = (received[0].json(), received[1].json());
    let expected = common::billed_input_tokens(&h.mock, &first).await
        + common::billed_input_tokens(&h.mock, &second).await;
    assert_eq!(last["response"]["usage"]["input_tokens"], expected);
}

/// Turn 1 of a mixed round: the model reads back and calls the client's tool in one answer.
async fn mixed_turn(h: &Harness, stream: bool) -> Vec<Value> {
    h.mock.push(Reply::tool_calls(vec![
        read(&ref_a(), 7, 1),
        ("shell".into(), json!({"cmd": ["cargo", "test"]})),
    ]));
    let resp = post(h, &body(input(), stream)).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let output = if stream {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let (_, last) = common::check_responses_stream(&text);
        last["response"]["output"].clone()
    } else {
        serde_json::from_slice::<Value>(&bytes).unwrap()["output"].clone()
    };
    output.as_array().unwrap().clone()
}

async fn mixed_round_restored_next_turn(stream: bool) {
    let h = harness().await;
    let got = mixed_turn(&h, stream).await;
    // The client's call only; the reasoning before the proxy's call went with it.
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["type"], "function_call");
    assert_eq!(got[0]["name"], "shell");
    let call_id = got[0]["call_id"].as_str().unwrap().to_string();
    let upstream_turn1 = h.mock.received()[0].json();

    // Turn 2 and turn 3: the client sends its history back with its own output.
    let mut next = input();
    next.extend(got.iter().cloned());
    next.push(json!({"type": "function_call_output", "call_id": call_id, "output": "12 passed"}));
    let mut restored = Vec::new();
    for reply in ["All 12 tests pass.", "Still passing."] {
        h.mock.push(Reply::text(reply));
        let resp = post(&h, &body(next.clone(), stream)).await;
        assert_eq!(resp.status(), 200);
        let bytes = resp.bytes().await.unwrap();
        assert_invisible(&bytes);
        let received = h.mock.received();
        let sent = received.last().unwrap().json();
        let items = sent["input"].as_array().unwrap().clone();
        let at = items
            .iter()
            .position(|i| i["name"] == "context_read")
            .expect("the proxy's call put back");
        // reasoning, the proxy's call, the client's call, the proxy's output, the client's.
        let run: Vec<String> = items[at - 1..at + 4].iter().map(Value::to_string).collect();
        assert!(run[0].contains("\"type\":\"reasoning\""), "{run:?}");
        assert!(run[0].contains("\"encrypted_content\":\"gAAAAB"), "{run:?}");
        assert_eq!(items[at + 1]["call_id"], call_id.as_str());
        assert_eq!(items[at + 2]["type"], "function_call_output");
        assert_eq!(items[at + 2]["call_id"], items[at]["call_id"]);
        assert!(items[at + 2]["output"]
            .as_str()
            .unwrap()
            .contains("a.rs line 7: let value_7"));
        assert_eq!(items[at + 3]["output"], "12 passed");
        restored.push(run);
    }
    // The reasoning and the call put back are the ones the model wrote in turn 1 (its answer
    // is not recorded, but its reasoning is derived from the turn's serial: the mock checks
    // that every reasoning item it gets back is one it sent).
    assert!(!upstream_turn1
        .to_string()
        .contains("context_read\",\"arguments"));
    // Put back byte for byte, the same on every later turn.
    assert_eq!(restored[0], restored[1]);
}

#[tokio::test]
async fn json_mixed_round_gives_the_client_its_call_and_restores_the_proxys() {
    mixed_round_restored_next_turn(false).await;
}

#[tokio::test]
async fn stream_mixed_round_gives_the_client_its_call_and_restores_the_proxys() {
    mixed_round_restored_next_turn(true).await;
}

/// A model that calls the proxy's tool every time, with `max_rounds = 1`.
async fn relentless(stream: bool) -> (Harness, reqwest::Response) {
    let h = Harness::start_with(MockConfig::default(), |c| {
        managed(c);
        c.context.reload.max_rounds = 1;
    })
    .await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 1, 1)]));
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 2, 1)]));
    let resp = post(&h, &body(input(), stream)).await;
    (h, resp)
}

#[tokio::test]
async fn after_the_last_round_the_tools_are_withdrawn_json() {
    let (h, resp) = relentless(false).await;
    assert_eq!(resp.status(), 502);
    let body = resp.bytes().await.unwrap();
    let error = common::assert_openai_error(&body);
    assert_eq!(error["code"], "tool_loop_exhausted");
    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    assert_eq!(tool_names(&received[1].json()), ["shell"]);
}

#[tokio::test]
async fn after_the_last_round_the_tools_are_withdrawn_stream() {
    let (h, resp) = relentless(true).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let (_, last) = common::check_responses_stream(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["error"]["code"], "tool_loop_exhausted");
    assert_eq!(h.mock.received().len(), 2);
}

#[tokio::test]
async fn an_upstream_failure_in_round_two_ends_the_stream_with_response_failed() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 7, 1)]));
    h.mock.push(Reply::error(
        500,
        json!({"error": {"message": "The server had an error.", "type": "server_error", "param": null, "code": "server_error"}}),
    ));
    let resp = post(&h, &body(input(), true)).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    let (_, last) = common::check_responses_stream(std::str::from_utf8(&bytes).unwrap());
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
    assert_eq!(
        last["response"]["error"]["message"],
        "The server had an error."
    );
}

#[tokio::test]
async fn an_upstream_error_event_in_round_two_becomes_the_one_response_failed() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 7, 1)]));
    h.mock.push(common::responses_error_stream(
        "Line 7",
        "rate_limit_exceeded",
        "Rate limit reached. Please try again in 2s.",
    ));
    let resp = post(&h, &body(input(), true)).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = std::str::from_utf8(&bytes).unwrap();
    let (events, last) = common::check_responses_stream(text);
    assert!(!text.contains("event: error\n"), "{text}");
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        last["response"]["error"]["message"],
        "Rate limit reached. Please try again in 2s."
    );
    // The first round's identity, not the failing round's.
    assert_eq!(last["response"]["id"], events[0]["response"]["id"]);
    assert_ne!(last["response"]["id"], "resp_e1");
    assert_eq!(h.mock.received().len(), 2);
}

/// The events the API sends besides items — a background response's `response.queued`, the
/// reasoning summaries' parts and deltas — pass through the proxy's rounds once and renumbered:
/// the first round's `created`, `queued` and `in_progress` only, each summary event with its
/// item's `output_index` as the client numbers it.
#[tokio::test]
async fn lifecycle_and_summary_events_pass_once_and_renumbered() {
    let h = harness().await;
    h.mock.push(Reply::text_and_tool_calls(
        "Let me look.",
        vec![read(&ref_a(), 7, 1)],
    ));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let mut request = body(input(), true);
    request["background"] = json!(true);
    request["store"] = json!(true);
    request["reasoning"]["summary"] = json!("auto");
    let resp = post(&h, &request).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = std::str::from_utf8(&bytes).unwrap();
    let (events, last) = common::check_responses_stream(text);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        [
            "response.created",
            "response.queued",
            "response.in_progress"
        ],
        "{text}"
    );
    for once in ["response.queued", "response.in_progress"] {
        assert_eq!(kinds.iter().filter(|k| **k == once).count(), 1, "{text}");
    }
    assert_eq!(events[0]["response"]["status"], "queued");
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["background"], true);
    // Each round's reasoning is shown with its summary (it reasons for the text after it).
    let output = last["response"]["output"].as_array().unwrap();
    let kinds_out: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds_out, ["reasoning", "message", "reasoning", "message"]);
    for (index, item) in output.iter().enumerate() {
        if item["type"] != "reasoning" {
            continue;
        }
        let summary = item["summary"][0]["text"].as_str().unwrap();
        let streamed: String = events
            .iter()
            .filter(|e| {
                e["type"] == "response.reasoning_summary_text.delta"
                    && e["output_index"] == index as u64
            })
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(streamed, summary, "{text}");
        assert!(events
            .iter()
            .any(|e| e["type"] == "response.reasoning_summary_part.done"
                && e["output_index"] == index as u64
                && e["item_id"] == item["id"]));
    }
    // Round one's summary spoke of the proxy's call: it is the reasoning before the text, so
    // the call itself is never named to the client (`assert_invisible` above).
    assert_eq!(h.mock.received().len(), 2);
}

/// A streamed answer made of `items`, as the API sends one: `response.created`,
/// `response.in_progress`, each item added then done, `response.completed` with them all.
fn stream_of(items: &[Value]) -> Reply {
    let response = json!({"id": "resp_t1", "object": "response", "created_at": 1_767_000_000u64,
        "status": "in_progress", "model": "gpt-5", "output": [], "usage": null});
    let mut events = vec![
        json!({"type": "response.created", "response": response}),
        json!({"type": "response.in_progress", "response": response}),
    ];
    for (n, item) in items.iter().enumerate() {
        events.push(json!({"type": "response.output_item.added", "output_index": n, "item": item}));
        events.push(json!({"type": "response.output_item.done", "output_index": n, "item": item}));
    }
    let mut done = response.clone();
    done["status"] = json!("completed");
    done["output"] = json!(items);
    done["usage"] = json!({"input_tokens": 900, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 10}, "total_tokens": 930});
    events.push(json!({"type": "response.completed", "response": done}));
    let body: String = events
        .into_iter()
        .enumerate()
        .map(|(n, mut event)| {
            event["sequence_number"] = n.into();
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap()
            )
        })
        .collect();
    Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body.into(),
    )
}

/// A reasoning item after the last call of a round that called only the proxy's tools reasons
/// toward the proxy's exchange: upstream, what follows it is the proxy's `function_call_output`.
/// Shown to the client it would stand in the client's history before items it was not made
/// with, so it stays hidden with the exchange; the upstream gets it back byte for byte.
#[tokio::test]
async fn a_reasoning_item_ending_a_proxy_only_round_stays_hidden() {
    let h = harness().await;
    let said = json!({"type": "message", "id": "msg_t1", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}]});
    let args = json!({"ref": ref_a(), "offset": 7, "limit": 1}).to_string();
    let call = json!({"type": "function_call", "id": "fc_t1", "status": "completed",
        "call_id": "call_t1", "name": "context_read", "arguments": args});
    let trailing = json!({"type": "reasoning", "id": "rs_trailing", "summary": [],
        "encrypted_content": "gAAAAB-trailing-reasoning"});
    h.mock
        .push(stream_of(&[said.clone(), call.clone(), trailing.clone()]));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let resp = post(&h, &body(input(), true)).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(!text.contains("rs_trailing"), "{text}");
    assert!(!text.contains("gAAAAB-trailing"), "{text}");
    let (_, last) = common::check_responses_stream(text);
    assert_eq!(last["type"], "response.completed");
    let output = last["response"]["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["message", "reasoning", "message"], "{text}");
    assert_eq!(output[0], said);

    // Upstream, round two continues the model's transcript: the reasoning in its place, then
    // the proxy's output (the strict mock checks the reasoning is followed by an item).
    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    let second = received[1].json();
    let items = second["input"].as_array().unwrap();
    let n = items.len();
    assert_eq!(items[n - 4], said);
    assert_eq!(items[n - 3], call);
    assert_eq!(items[n - 2], trailing);
    assert_eq!(items[n - 1]["type"], "function_call_output");
    assert_eq!(items[n - 1]["call_id"], "call_t1");
}

#[tokio::test]
async fn after_the_tools_are_withdrawn_the_client_gets_the_answers_text() {
    for stream in [false, true] {
        let h = Harness::start_with(MockConfig::default(), |c| {
            managed(c);
            c.context.reload.max_rounds = 1;
        })
        .await;
        h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 1, 1)]));
        h.mock.push(Reply::text_and_tool_calls(
            "Line 7 computes value_7.",
            vec![read(&ref_a(), 2, 1)],
        ));
        let resp = post(&h, &body(input(), stream)).await;
        assert_eq!(resp.status(), 200);
        let bytes = resp.bytes().await.unwrap();
        assert_invisible(&bytes);
        let output = if stream {
            let (_, last) = common::check_responses_stream(std::str::from_utf8(&bytes).unwrap());
            assert_eq!(last["type"], "response.completed");
            last["response"]["output"].clone()
        } else {
            serde_json::from_slice::<Value>(&bytes).unwrap()["output"].clone()
        };
        let texts: Vec<&str> = output
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "message")
            .map(|i| i["content"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["Line 7 computes value_7."], "stream: {stream}");
        // The withdrawn call was not run: two upstream calls, the second without the tools.
        let received = h.mock.received();
        assert_eq!(received.len(), 2);
        assert_eq!(tool_names(&received[1].json()), ["shell"]);
    }
}

#[tokio::test]
async fn a_bad_call_is_a_tool_error_the_model_reads() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": "../../etc/passwd"}),
    )]));
    h.mock.push(Reply::text("I could not read it."));
    let resp = post(&h, &body(input(), false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=1,calls=1,failed=1"
    );
    assert_invisible(&resp.bytes().await.unwrap());
    let received = h.mock.received();
    let second = received[1].json();
    let last = second["input"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "function_call_output");
    assert!(last["output"]
        .as_str()
        .unwrap()
        .starts_with("error: \"../../etc/passwd\" is not a reference"));
}

/// What the client got of an answer, ids left out (each run's ids are the mock's own): each
/// item's type and what it says or calls.
fn said(output: &[Value]) -> Vec<String> {
    output
        .iter()
        .map(|i| match i["type"].as_str().unwrap() {
            "message" => format!("message: {}", i["content"][0]["text"]),
            "function_call" => format!("call: {} {}", i["name"], i["arguments"]),
            kind => kind.to_string(),
        })
        .collect()
}

/// The client's items of one answer (JSON, or the stream's `response.completed`), with the
/// stream's rules checked; the ids unique.
async fn client_items(resp: reqwest::Response, stream: bool) -> Vec<Value> {
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let output = if stream {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let (events, last) = common::check_responses_stream(&text);
        // Every item the stream showed is in the final output, in the same order.
        let done: Vec<Value> = events
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| e["item"].clone())
            .collect();
        assert_eq!(json!(done), last["response"]["output"]);
        last["response"]["output"].clone()
    } else {
        serde_json::from_slice::<Value>(&bytes).unwrap()["output"].clone()
    };
    let output = output.as_array().unwrap().clone();
    let ids: HashSet<&str> = output.iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(ids.len(), output.len(), "unique item ids: {output:?}");
    output
}

/// A harness whose first answer says "Let me look." and reads line 7 back.
async fn harness_after_a_look() -> Harness {
    let h = harness().await;
    h.mock.push(Reply::text_and_tool_calls(
        "Let me look.",
        vec![read(&ref_a(), 7, 1)],
    ));
    h
}

/// One rule for the text of earlier rounds: a stream has shown it already (it cannot be
/// unsent), so the JSON answer holds the earlier rounds' items too, in order; both modes give
/// the client the same items.
#[tokio::test]
async fn json_and_sse_give_the_client_the_same_items_of_every_round() {
    let mut seen = Vec::new();
    for stream in [false, true] {
        let h = harness_after_a_look().await;
        h.mock.push(Reply::text_and_tool_calls(
            "Line 7 next.",
            vec![read(&ref_a(), 8, 1)],
        ));
        h.mock.push(Reply::text("Line 7 computes value_7."));
        let output = client_items(post(&h, &body(input(), stream)).await, stream).await;
        assert_eq!(h.mock.received().len(), 3);
        seen.push(said(&output));
    }
    assert_eq!(
        seen[0],
        [
            "reasoning",
            "message: \"Let me look.\"",
            "reasoning",
            "message: \"Line 7 next.\"",
            "reasoning",
            "message: \"Line 7 computes value_7.\""
        ]
    );
    assert_eq!(seen[0], seen[1], "JSON and SSE differ");
}

/// A mixed round after a round of text: the client gets the earlier text and its own call, in
/// JSON as in SSE, and next turn the proxy's call goes back in its place after that text.
#[tokio::test]
async fn a_mixed_round_after_text_is_restored_in_place_in_json_and_sse() {
    let mut seen = Vec::new();
    for stream in [false, true] {
        let h = harness_after_a_look().await;
        h.mock.push(Reply::tool_calls(vec![
            read(&ref_a(), 8, 1),
            ("shell".into(), json!({"cmd": ["cargo", "test"]})),
        ]));
        let got = client_items(post(&h, &body(input(), stream)).await, stream).await;
        seen.push(said(&got));
        let call = got.last().unwrap();
        let mut next = input();
        next.extend(got.iter().cloned());
        next.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "12 passed"}));
        h.mock.push(Reply::text("All 12 tests pass."));
        let resp = post(&h, &body(next, stream)).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        let sent = h.mock.received().last().unwrap().json();
        let items = sent["input"].as_array().unwrap();
        let at = items
            .iter()
            .position(|i| i["name"] == "context_read")
            .expect("the proxy's call put back");
        assert_eq!(
            items[at - 2]["content"][0]["text"],
            "Let me look.",
            "{stream}"
        );
        assert_eq!(items[at - 1]["type"], "reasoning");
        assert_eq!(items[at + 1]["call_id"], call["call_id"]);
        assert_eq!(items[at + 2]["call_id"], items[at]["call_id"]);
        assert_eq!(items[at + 3]["output"], "12 passed");
    }
    assert_eq!(
        seen[0],
        [
            "reasoning",
            "message: \"Let me look.\"",
            "call: \"shell\" \"{\\\"cmd\\\":[\\\"cargo\\\",\\\"test\\\"]}\""
        ]
    );
    assert_eq!(seen[0], seen[1], "JSON and SSE differ");
}
