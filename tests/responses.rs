//! `POST /v1/responses` through the real proxy, over real sockets, against the mock's strict
//! Responses API: a long Codex-shaped session is managed (tool outputs compacted or moved out,
//! every forwarded input valid by the mock's pairing rules, encrypted reasoning byte-exact),
//! the session comes from `prompt_cache_key` or Codex's headers, requests that depend on
//! server-side state or come compressed go as they came with the reason, the overflow error
//! (which states no limit) is retried under the size sent, a WebSocket upgrade gets 426, and
//! every other `/v1/responses/…` route is forwarded verbatim.

mod common;

use std::io::Read;

use common::Harness;
use context_proxy::context::settings::WindowEntry;
use context_proxy::context::Mode;
use context_proxy::mock::{MockConfig, Reply};
use serde_json::{json, Value};

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name}"))
        .to_str()
        .unwrap()
}

/// A Codex-like input of `turns` shell calls, each with a large output, reasoning before each
/// call, an `apply_patch` custom call in the middle, then a new user turn.
fn codex_input(turns: usize) -> Vec<Value> {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "make the tests pass"}]}),
    ];
    for t in 0..turns {
        input.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{t:04}\\u002b{}", "Zz9+".repeat(100))}));
        if t == turns / 2 {
            input.push(json!({"type": "custom_tool_call", "call_id": format!("call_p{t}"), "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"}));
            input.push(json!({"type": "custom_tool_call_output", "call_id": format!("call_p{t}"), "output": "Success."}));
            continue;
        }
        input.push(json!({"type": "function_call", "call_id": format!("call_{t}"), "name": "shell", "arguments": format!("{{\"cmd\":[\"cat\",\"src/file{t}.rs\"]}}")}));
        let output: String = (0..300)
            .map(|l| format!("{t}:{l} fn item_{l}() -> u32 {{ {l} }}\n"))
            .collect();
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{t}"), "output": output}));
    }
    input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now run them again"}]}));
    input
}

fn codex_body(input: Vec<Value>, stream: bool) -> Value {
    json!({
        "model": "small-model",
        "instructions": "You are Codex, a coding agent.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "array", "items": {"type": "string"}}}, "required": ["cmd"], "additionalProperties": false}, "strict": true},
                  {"type": "custom", "name": "apply_patch", "format": {"type": "text"}}],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-0199",
    })
}

async fn small_window() -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("small-model".into(), WindowEntry::Window(16_384));
    })
    .await
}

async fn post(h: &Harness, body: &Value) -> reqwest::Response {
    h.client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-client")
        .header("session-id", "thread-0199")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_long_codex_session_is_managed_and_stays_valid() {
    let h = small_window().await;
    let input = codex_input(30);
    h.mock.push(Reply::text("Done."));
    let resp = post(&h, &codex_body(input.clone(), false)).await;
    assert_eq!(resp.status(), 200, "{:?}", resp.headers());
    let actions = header(&resp, "x-context-actions").to_string();
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after < before, "{before} → {after} ({actions})");
    assert!(
        actions.contains("compacted") || actions.contains("offloaded"),
        "{actions}"
    );
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["output"][1]["content"][0]["text"], "Done.");

    // The mock, strict as the API, accepted it: the forwarded input has no orphan.
    let received = h.mock.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/v1/responses");
    let sent = received[0].json();
    let sent_input = sent["input"].as_array().unwrap();
    assert!(sent_input.len() <= input.len());
    // instructions, the client's tools and every other member are as the client sent them;
    // the proxy's read-back tools follow the client's (the markers name references).
    let tools = sent["tools"].as_array().unwrap();
    let client_tools = codex_body(input.clone(), false)["tools"].clone();
    assert_eq!(Value::from(tools[..2].to_vec()), client_tools);
    let offered: Vec<&str> = tools[2..]
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["context_read", "context_search"]);
    for key in [
        "instructions",
        "reasoning",
        "include",
        "prompt_cache_key",
        "store",
    ] {
        assert_eq!(sent[key], codex_body(input.clone(), false)[key], "{key}");
    }
    // Encrypted reasoning kept is byte-exact, escape included.
    let raw = String::from_utf8(received[0].body.to_vec()).unwrap();
    let kept_reasoning = sent_input
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .count();
    assert!(kept_reasoning > 0);
    assert_eq!(raw.matches("\\\\u002b").count(), kept_reasoning);
    // The task and the latest user turn are kept.
    assert_eq!(sent_input[1], input[1]);
    assert_eq!(sent_input.last(), input.last());
    // Every call's output follows it, and reasoning stays before its call.
    for (k, item) in sent_input.iter().enumerate() {
        if item["type"] == "reasoning" {
            let next = &sent_input[k + 1];
            let original = input.iter().position(|i| i == item).unwrap();
            assert_eq!(next, &input[original + 1]);
        }
    }
}

#[tokio::test]
async fn a_second_turn_keeps_the_prefix_the_first_sent() {
    let h = small_window().await;
    let input = codex_input(30);
    h.mock.push(Reply::text("first"));
    h.mock.push(Reply::text("second"));
    let first = post(&h, &codex_body(input.clone(), false)).await;
    assert_eq!(first.status(), 200);
    first.bytes().await.unwrap();
    let mut longer = input.clone();
    longer.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "first", "annotations": []}]}));
    longer.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and once more"}]}));
    let second = post(&h, &codex_body(longer, false)).await;
    assert_eq!(second.status(), 200);
    let kept: usize = header(&second, "x-context-kept-prefix-tokens")
        .parse()
        .unwrap();
    assert!(kept > 0);
    second.bytes().await.unwrap();
    let received = h.mock.received();
    let a = received[0].json()["input"].as_array().unwrap().clone();
    let b = received[1].json()["input"].as_array().unwrap().clone();
    // The second request starts with what the first sent, before the first's last user turn.
    assert_eq!(&b[..a.len() - 1], &a[..a.len() - 1], "the prefix moved");
}

#[tokio::test]
async fn a_streamed_managed_request_relays_the_apis_events() {
    let h = small_window().await;
    h.mock.push(Reply::text("Streamed answer."));
    let resp = post(&h, &codex_body(codex_input(30), true)).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-context-actions") != "none");
    let text = resp.text().await.unwrap();
    assert!(text.starts_with("event: response.created\n"));
    assert!(text.contains("event: response.completed\n"));
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn an_upstream_error_event_mid_stream_becomes_the_one_response_failed() {
    let h = small_window().await;
    h.mock.push(common::responses_error_stream(
        "Half an",
        "server_error",
        "The model failed to finish.",
    ));
    // A short input: nothing to move out, no tool offered, the upstream's stream relayed.
    let resp = post(&h, &codex_body(codex_input(1), true)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let sent = h.mock.received()[0].json();
    assert!(!sent.to_string().contains("context_read"), "{sent}");
    let (events, last) = common::check_responses_stream(&text);
    assert!(!text.contains("event: error\n"), "{text}");
    assert_eq!(last["type"], "response.failed");
    // It takes the error event's place: the stream's id, the error's code and message.
    assert_eq!(last["sequence_number"], 5);
    assert_eq!(last["response"]["id"], "resp_e1");
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
    assert_eq!(
        last["response"]["error"]["message"],
        "The model failed to finish."
    );
    assert_eq!(events[4]["delta"], "Half an");
}

#[tokio::test]
async fn a_stream_that_stops_early_ends_with_response_failed() {
    let h = small_window().await;
    // The API's first events, then the connection closes: no terminal event.
    let created = json!({"type": "response.created", "sequence_number": 0,
        "response": {"id": "resp_s1", "object": "response", "status": "in_progress", "output": []}});
    let body = format!("event: response.created\ndata: {created}\n\n");
    h.mock.push(Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body.into(),
    ));
    let resp = post(&h, &codex_body(codex_input(1), true)).await;
    let text = resp.text().await.unwrap();
    let (_, last) = common::check_responses_stream(&text);
    assert_eq!(last["type"], "response.failed");
    assert_eq!(last["sequence_number"], 1);
    assert_eq!(last["response"]["id"], "resp_s1");
    assert_eq!(last["response"]["error"]["code"], "upstream_stream_error");
}

#[tokio::test]
async fn requests_on_server_side_state_or_compressed_go_as_they_came() {
    let h = small_window().await;
    let mut body = codex_body(codex_input(30), false);
    body["previous_response_id"] = json!("resp_123");
    let raw = body.to_string();
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    // The mock, holding no state, refuses it the way the API does; the client gets that.
    assert_eq!(resp.status(), 400);
    assert!(header(&resp, "x-context-actions").starts_with("unmanaged (previous_response_id"));
    assert_eq!(h.mock.received()[0].body, raw.as_bytes());

    let mut body = codex_body(codex_input(30), false);
    body["input"]
        .as_array_mut()
        .unwrap()
        .insert(2, json!({"type": "item_reference", "id": "msg_1"}));
    let raw = body.to_string();
    let resp = post(&h, &body).await;
    assert!(header(&resp, "x-context-actions").contains("item_reference"));
    assert_eq!(h.mock.received()[1].body, raw.as_bytes());

    // A body compressed otherwise than zstd is not read: forwarded as it came, its encoding
    // with it.
    let compressed = vec![0x1f, 0x8b, 8, 0, 1, 2, 3];
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(compressed.clone())
        .send()
        .await
        .unwrap();
    assert!(header(&resp, "x-context-actions").contains("Content-Encoding: gzip"));
    let received = &h.mock.received()[2];
    assert_eq!(received.body.to_vec(), compressed);
    assert_eq!(received.headers["content-encoding"], "gzip");
}

#[tokio::test]
async fn a_zstd_body_is_decoded_managed_and_forwarded_decoded() {
    let h = small_window().await;
    let body = codex_body(codex_input(30), false);
    let compressed = zstd::encode_all(body.to_string().as_bytes(), 3).unwrap();
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .header("content-encoding", "zstd")
        .body(compressed)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after < before, "managed: {before} -> {after}");
    let received = &h.mock.received()[0];
    assert!(received.headers.get("content-encoding").is_none());
    let sent = received.json();
    assert_eq!(
        sent["model"], "small-model",
        "the strict mock read it as JSON"
    );
    assert_eq!(sent["input"][0], body["input"][0]);
}

#[tokio::test]
async fn a_zstd_bomb_is_a_413_and_bad_zstd_a_400() {
    let h = Harness::start_with(MockConfig::default(), |c| c.server.max_body_bytes = 1 << 20).await;
    let send = |bytes: Vec<u8>| {
        h.client
            .post(h.url("/v1/responses"))
            .header("content-type", "application/json")
            .header("content-encoding", "zstd")
            .body(bytes)
            .send()
    };
    // 64 MiB of one byte compress to a few KiB. At level 1 the frame's window fits the 1 MiB
    // limit: decoded until the limit is passed. At level 19 it asks for a window over the
    // limit: refused before decoding.
    for level in [1, 19] {
        let bomb = zstd::encode_all(std::io::repeat(b' ').take(64 << 20), level).unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let resp = send(bomb).await.unwrap();
        let status = resp.status();
        let body = resp.bytes().await.unwrap();
        assert_eq!(
            status,
            413,
            "level {level}: {}",
            String::from_utf8_lossy(&body)
        );
        let error = common::assert_openai_error(&body);
        assert!(error["message"]
            .as_str()
            .unwrap()
            .contains("server.max_body_bytes"));
    }
    let resp = send(vec![0x28, 0xb5, 0x2f, 0xfd, 0, 1, 2, 3])
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let error = common::assert_openai_error(&resp.bytes().await.unwrap());
    assert!(error["message"].as_str().unwrap().contains("zstd"));
    assert!(h.mock.received().is_empty());
}

#[tokio::test]
async fn an_unknown_item_type_in_the_span_to_move_leaves_the_request_byte_identical() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("small-model".into(), WindowEntry::Window(8_192));
    })
    .await;
    let mut input = codex_input(30);
    input.insert(2, json!({"type": "future_item", "data": "new in 2027"}));
    let raw = codex_body(input, false).to_string();
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    let actions = header(&resp, "x-context-actions").to_string();
    assert!(actions.contains("future_item"), "{actions}");
    assert_eq!(h.mock.received()[0].body, raw.as_bytes());
}

#[tokio::test]
async fn an_overflow_without_a_stated_limit_is_retried_smaller() {
    // An unknown model: a large window assumed, the whole input sent.
    let mut body = codex_body(codex_input(12), false);
    body["model"] = json!("gpt-unknown");
    let probe = Harness::start().await;
    let probed: Value = post(&probe, &body).await.json().await.unwrap();
    let size = probed["usage"]["input_tokens"].as_u64().unwrap() as usize;
    // An upstream whose window is a little smaller: it says "too long", without a number.
    let h = Harness::start_with(
        MockConfig {
            context_limit: Some(size * 8 / 10),
            ..MockConfig::default()
        },
        |_| {},
    )
    .await;
    h.mock.push(Reply::text("fits now"));
    let resp = post(&h, &body).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["output"][1]["content"][0]["text"], "fits now");
    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    assert!(received[1].body.len() < received[0].body.len());
}

#[tokio::test]
async fn a_websocket_upgrade_gets_426_and_other_routes_pass_verbatim() {
    let h = Harness::start().await;
    let resp = h
        .client
        .get(h.url("/v1/responses"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("openai-beta", "responses_websockets=2026-02-06")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 426);
    let body = resp.bytes().await.unwrap();
    let error = common::assert_openai_error(&body);
    assert_eq!(error["code"], "websocket_not_supported");
    assert!(h.mock.received().is_empty());

    for (method, path) in [
        ("GET", "/v1/responses/resp_1"),
        ("DELETE", "/v1/responses/resp_1"),
        ("GET", "/v1/responses/resp_1/input_items?limit=5"),
        ("POST", "/v1/responses/resp_1/cancel"),
        ("POST", "/v1/responses/input_tokens"),
    ] {
        let resp = h
            .client
            .request(method.parse().unwrap(), h.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{method} {path}");
        assert_eq!(header(&resp, "x-mock-echo"), "1");
        let echo: Value = resp.json().await.unwrap();
        assert_eq!(echo["method"], method);
        assert_eq!(echo["path"], path.split('?').next().unwrap());
    }
}

/// A Codex-shaped session of 45 turns (the full input resent every turn, `store:false`,
/// encrypted reasoning before every call, large shell outputs) on a small window: every
/// request the proxy forwards is accepted by the strict mock (no orphan, no dangling
/// reasoning), and the forwarded prefix moves only at a few compaction points.
#[tokio::test]
async fn a_45_turn_codex_session_stays_valid_and_its_prefix_stable() {
    let h = small_window().await;
    let settings = small_window_settings();
    let budget = settings.budget;
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "port the crate to the new API"}]}),
    ];
    let mut previous: Option<Vec<Value>> = None;
    let (mut rewrites, mut last_rewrite) = (0, None);
    for turn in 0..45 {
        h.mock.push(Reply::text(format!("turn {turn} done")));
        let resp = post(&h, &codex_body(input.clone(), false)).await;
        assert_eq!(resp.status(), 200, "turn {turn}");
        // One prompt, then one tool round per turn: the budget holds all the way.
        let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
        assert!(after <= budget, "turn {turn}: {after} over {budget}");
        resp.bytes().await.unwrap();
        let sent = h.mock.received().last().unwrap().json();
        let sent: Vec<Value> = sent["input"].as_array().unwrap().clone();
        if let Some(before) = &previous {
            // What the previous request sent, up to its last item (the new turn came after).
            let shared = before.len() - 1;
            if sent.len() < shared || sent[..shared] != before[..shared] {
                rewrites += 1;
                // A cut goes once down to the target (0.6 of the 9.8k budget, each round adding
                // about 2.5k): the turn after it extends its prefix unchanged.
                assert!(
                    last_rewrite.is_none_or(|at| turn >= at + 2),
                    "turn {turn}: the prefix moved again right after turn {last_rewrite:?}"
                );
                last_rewrite = Some(turn);
            }
        }
        previous = Some(sent);
        // The model's turn: reasoning, a shell call, its output; then the answer seen.
        input.push(json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{turn:04}{}", "Qx+/".repeat(60))}));
        input.push(json!({"type": "function_call", "call_id": format!("call_{turn}"), "name": "shell", "arguments": format!("{{\"cmd\":[\"cargo\",\"check\",\"-p\",\"m{turn}\"]}}")}));
        let output: String = (0..120)
            .map(|l| format!("warning[{turn}:{l}]: unused variable `x{l}` in m{turn}/src/lib.rs\n"))
            .collect();
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{turn}"), "output": output}));
    }
    assert_eq!(h.mock.received().len(), 45);
    assert!(
        rewrites > 0,
        "a 45-turn session on a 16k window was never managed"
    );
}

/// The settings the proxy resolves for `small-model` on [`small_window`].
fn small_window_settings() -> context_proxy::context::Settings {
    let mut cfg = context_proxy::context::ContextConfig::default();
    cfg.model_windows
        .insert("small-model".into(), WindowEntry::Window(16_384));
    cfg.resolve("small-model", Mode::Auto, &Default::default())
}

#[tokio::test]
async fn a_generated_codex_session_replays_valid_with_a_stable_prefix() {
    // gen-traffic --shape codex: the whole input every turn, store false, encrypted reasoning,
    // shell and apply_patch calls; replayed through the proxy on a small window.
    let cfg = context_proxy::traffic::TrafficConfig {
        seed: 11,
        sessions: 1,
        max_turns: 45,
        max_result_bytes: 20_000,
        model: None,
    };
    let session = context_proxy::traffic::generate_codex_session(&cfg, 0);
    assert!(session.request_count() >= 40);
    let h = small_window().await;
    let mut previous: Option<Vec<Value>> = None;
    let (mut rewrites, mut managed) = (0, 0);
    for k in 0..session.request_count() {
        let mut body = session.request(k);
        body["stream"] = json!(false);
        let resp = post(&h, &body).await;
        let status = resp.status();
        let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
        let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
        let text = resp.text().await.unwrap();
        // The strict mock accepted every forwarded input (pairing, reasoning, item types).
        assert_eq!(status, 200, "request {k}: {text}");
        managed += usize::from(after < before);
        let sent = h.mock.received().last().unwrap().json();
        assert_eq!(sent["instructions"], body["instructions"]);
        let sent: Vec<Value> = sent["input"].as_array().unwrap().clone();
        if let Some(before) = &previous {
            if sent.len() < before.len() || sent[..before.len()] != before[..] {
                rewrites += 1;
            }
        }
        previous = Some(sent);
    }
    assert!(
        managed > 0,
        "a 40-turn Codex session on a 16k window was never managed"
    );
    assert!(
        rewrites * 4 <= session.request_count(),
        "the prefix moved {rewrites} times in {} requests",
        session.request_count()
    );
}

/// `codex_input` as Codex 0.171 sends it: every item with its `id` (the ids the API gave, or
/// Codex's own for the messages it writes) and the messages with
/// `internal_chat_message_metadata_passthrough` (its turn and content kinds).
fn codex_0_171_input(turns: usize) -> Vec<Value> {
    let mut input = codex_input(turns);
    for (n, item) in input.iter_mut().enumerate() {
        let prefix = match item["type"].as_str().unwrap() {
            "message" => "msg",
            "reasoning" => "rs",
            "function_call" => "fc",
            "custom_tool_call" => "ctc",
            _ => continue,
        };
        item["id"] = json!(format!("{prefix}_0199a{n:043}"));
        if prefix == "msg" {
            item["internal_chat_message_metadata_passthrough"] = json!({
                "turn_id": format!("0199a-turn-{}", n / 7),
                "content_item_kinds": ["environments.environment_context"],
                "create_time": 1788214171.128268,
            });
        }
    }
    input
}

/// Item ids and Codex's metadata field: the request is managed like any other, every item the
/// proxy keeps reaches the upstream byte-identical (id and metadata included), the items it
/// writes itself (markers, summaries) carry no id, so no id is ever sent twice (the mock
/// refuses a duplicate as the API does); the same for a compaction and the turn after it.
#[tokio::test]
async fn codex_0_171_ids_and_metadata_are_kept_and_never_duplicated() {
    let h = small_window().await;
    let input = codex_0_171_input(30);
    h.mock.push(Reply::text("Done."));
    let resp = post(&h, &codex_body(input.clone(), false)).await;
    assert_eq!(resp.status(), 200);
    let actions = header(&resp, "x-context-actions").to_string();
    assert!(
        actions.contains("compacted") || actions.contains("offloaded"),
        "{actions}"
    );
    resp.bytes().await.unwrap();
    let sent = h.mock.received()[0].json();
    let sent_input = sent["input"].as_array().unwrap();
    let by_id = |id: &Value| input.iter().find(|i| i["id"] == *id);
    let mut ids = std::collections::HashSet::new();
    let mut kept = 0;
    for item in sent_input {
        let Some(id) = item["id"].as_str() else {
            // A tool output (Codex sends them without an id), or written by the proxy: a
            // marker or a summary, never with an id.
            if item["type"] == "message" {
                let text = item["content"].as_str().unwrap_or_default();
                assert!(text.starts_with("[context-proxy"), "{item}");
            } else {
                assert!(item["call_id"].is_string(), "{item}");
            }
            continue;
        };
        assert!(ids.insert(id.to_string()), "id {id} sent twice");
        let original =
            by_id(&item["id"]).unwrap_or_else(|| panic!("an id not the client's: {item}"));
        if item["type"] == "message" || item["type"] == "reasoning" {
            assert_eq!(item, original, "changed");
            kept += 1;
        }
    }
    assert!(kept >= 3, "{sent}");
    assert_eq!(
        sent_input[1]["internal_chat_message_metadata_passthrough"],
        input[1]["internal_chat_message_metadata_passthrough"]
    );
    let raw = String::from_utf8(h.mock.received()[0].body.to_vec()).unwrap();
    assert!(raw.contains(
        r#""internal_chat_message_metadata_passthrough":{"turn_id":"0199a-turn-0","content_item_kinds":["environments.environment_context"],"create_time":1788214171.128268}"#
    ));
}
