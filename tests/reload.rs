//! Reload through the real proxy and the mock upstream scripted to call the proxy's tools:
//! the tools are offered when the forwarded request refers to stored content, the proxy answers
//! the calls and asks again, and the client never sees any of it — in JSON and in streams.

mod common;

use common::{sample, sse_data, Harness, WAIT};
use context_proxy::app::config::Config;
use context_proxy::mock::{Gate, MockConfig, Reply};
use context_proxy::store::ContentRef;
use serde_json::{json, Value};

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

fn file_a() -> String {
    numbered_lines("a.rs", 600)
}

fn file_b() -> String {
    numbered_lines("b.rs", 400)
}

/// A conversation whose two large tool results get compacted (so the request refers to
/// stored content), ending with a user question.
fn conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read both files."}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"b.rs\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "call_a", "content": file_a()}),
        json!({"role": "tool", "tool_call_id": "call_b", "content": file_b()}),
        json!({"role": "assistant", "content": "Both files define compute-based values."}),
        json!({"role": "user", "content": "What is on line 7 of a.rs?"}),
    ]
}

fn managed(c: &mut Config) {
    c.context.keep_recent_messages = 2;
    c.context.compact_batch_tokens = 1000;
}

async fn harness() -> Harness {
    Harness::start_with(MockConfig::default(), managed).await
}

fn ref_a() -> String {
    ContentRef::of(&file_a()).as_str().to_string()
}

fn ref_b() -> String {
    ContentRef::of(&file_b()).as_str().to_string()
}

fn read(r: &str, offset: usize, limit: usize) -> (String, Value) {
    (
        "context_read".into(),
        json!({"ref": r, "offset": offset, "limit": limit}),
    )
}

fn names_of_tools(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The proxy's tool names must not appear anywhere in what the client receives.
fn assert_invisible(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for name in ["context_read", "context_search"] {
        assert!(!text.contains(name), "the client saw {name}: {text}");
    }
}

/// The assistant's text in a JSON answer or an event stream.
fn answer_text(bytes: &[u8], stream: bool) -> String {
    let text = String::from_utf8_lossy(bytes);
    if !stream {
        let v: Value = serde_json::from_str(&text).unwrap();
        return v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
    }
    sse_data(&text)
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let c: Value = serde_json::from_str(d).unwrap();
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// The prompt tokens the mock bills for `body` (asked directly, not through the proxy).
async fn billed_prompt(h: &Harness, body: &Value) -> u64 {
    h.mock.push(Reply::text("x"));
    let mut direct = body.clone();
    direct["stream"] = json!(false);
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", h.mock.base_url()))
        .json(&direct)
        .send()
        .await
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    v["usage"]["prompt_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn json_single_read_is_answered_by_the_proxy_and_hidden() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 5, 3)]));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=1,calls=1,failed=0"
    );
    // Read whole, the answer carries the upstream's cached tokens summed over both calls
    // (checked below against what the mock's prompt cache read).
    let cached: u64 = resp.headers()["x-context-upstream-cached-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Both calls on the bill: the request, and the round after it, priced.
    assert_eq!(
        resp.headers()["x-context-upstream-calls"],
        "forwarded=1,reload=1,retry=0,summarizer=0"
    );
    let cost: f64 = resp.headers()["x-context-cost-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let sent: f64 = resp.headers()["x-context-tokens-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The round resends the request (cached at most at half price) and adds its own.
    assert!(cost > 1.5 * sent && cost < 2.5 * sent, "{cost} for {sent}");
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Line 7 computes value_7."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    let first = received[0].json();
    // The tools come after the client's (none here), and the markers name them.
    assert_eq!(names_of_tools(&first), ["context_read", "context_search"]);
    assert!(first.to_string().contains(&ref_a()));
    let second = received[1].json();
    let messages = second["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(
        messages[n - 2]["tool_calls"][0]["function"]["name"],
        "context_read"
    );
    let result = messages[n - 1]["content"].as_str().unwrap();
    assert!(
        result.starts_with(&format!("[context_read {}: lines 5–7 of 600.", ref_a())),
        "{result}"
    );
    assert!(result.contains("a.rs line 7: let value_7"), "{result}");
    assert!(!result.contains("a.rs line 8:"), "{result}");
    assert_eq!(
        messages[n - 1]["tool_call_id"],
        messages[n - 2]["tool_calls"][0]["id"]
    );

    // usage covers both upstream calls.
    let first_prompt = billed_prompt(&h, &first).await;
    let expected = first_prompt + billed_prompt(&h, &second).await;
    assert_eq!(body["usage"]["prompt_tokens"].as_u64().unwrap(), expected);
    // The first call found nothing cached; the round repeats the request (its tools and
    // messages, all of the prompt but the reply primer), which OpenAI's cache reads from 1024
    // tokens up in steps of 128.
    let repeated = first_prompt - 3;
    assert!(repeated >= 1024, "{repeated}");
    assert_eq!(cached, 1024 + (repeated - 1024) / 128 * 128);
}

#[tokio::test]
async fn nothing_is_offered_when_nothing_is_stored() {
    let h = harness().await;
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-context-reload").is_none());
    let sent = h.mock.received()[0].json();
    assert!(sent.get("tools").is_none(), "{sent}");
}

#[tokio::test]
async fn stream_single_read_continues_the_same_response_live() {
    let h = harness().await;
    h.mock.push(Reply::text_and_tool_calls(
        "Let me look. ",
        vec![read(&ref_a(), 7, 1)],
    ));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    let resp = h
        .chat(
            &json!({"model": "gpt-4o", "messages": conversation(), "stream": true,
                      "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    // The headers leave before the round: its calls are not known yet, and not claimed.
    assert_eq!(
        resp.headers()["x-context-upstream-calls"],
        "forwarded=1,retry=0,summarizer=0"
    );
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // One response: every chunk has the first round's id, created and model.
    let id = &chunks[0]["id"];
    assert!(chunks
        .iter()
        .all(|c| &c["id"] == id && c["created"] == chunks[0]["created"]));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Let me look. Line 7 computes value_7.");
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0].get("finish_reason"))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("stop")]);
    // One usage chunk, last, summed over both rounds.
    let usage: Vec<&Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1);
    assert!(chunks.last().unwrap()["usage"].is_object());
    let received = h.mock.received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[1].json()["stream"], true);
    let expected =
        billed_prompt(&h, &received[0].json()).await + billed_prompt(&h, &received[1].json()).await;
    assert_eq!(
        usage[0]["usage"]["prompt_tokens"].as_u64().unwrap(),
        expected
    );
}

#[tokio::test]
async fn parallel_calls_and_several_rounds() {
    let h = harness().await;
    h.mock.push(Reply::tool_calls(vec![
        read(&ref_a(), 1, 2),
        ("context_search".into(), json!({"pattern": "b.rs line 7:"})),
    ]));
    h.mock.push(Reply::tool_calls(vec![read(&ref_b(), 7, 1)]));
    h.mock.push(Reply::text("Found it."));
    for stream in [false, true] {
        if stream {
            h.mock.push(Reply::tool_calls(vec![
                read(&ref_a(), 1, 2),
                ("context_search".into(), json!({"pattern": "b.rs line 7:"})),
            ]));
            h.mock.push(Reply::tool_calls(vec![read(&ref_b(), 7, 1)]));
            h.mock.push(Reply::text("Found it."));
        }
        let resp = h
            .chat(&json!({"model": "gpt-4o", "messages": conversation(), "stream": stream}))
            .await;
        assert_eq!(resp.status(), 200);
        if !stream {
            assert_eq!(
                resp.headers()["x-context-reload"],
                "rounds=2,calls=3,failed=0"
            );
        }
        let bytes = resp.bytes().await.unwrap();
        assert_invisible(&bytes);
        assert_eq!(answer_text(&bytes, stream), "Found it.");
    }
    let received = h.mock.received();
    assert_eq!(received.len(), 6);
    for third in [&received[2], &received[5]] {
        let body = third.json();
        let messages = body["messages"].as_array().unwrap();
        let results: Vec<&str> = messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str())
            .filter(|c| c.starts_with("[context_"))
            .collect();
        assert_eq!(results.len(), 3, "{results:?}");
        assert!(
            results[1].contains(&format!("{}:7: b.rs line 7:", ref_b())),
            "{}",
            results[1]
        );
        assert!(results[2].contains("b.rs line 7: let value_7"));
    }
}

#[tokio::test]
async fn after_the_last_round_the_model_answers_without_the_tools() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        managed(c);
        c.context.reload.max_rounds = 2;
    })
    .await;
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 1, 1)]));
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 2, 1)]));
    h.mock.push(Reply::text("Enough."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=2,calls=2,failed=0"
    );
    let received = h.mock.received();
    assert_eq!(received.len(), 3);
    assert_eq!(names_of_tools(&received[1].json()).len(), 2);
    // The client sent no tools: the last request has none at all.
    assert!(received[2].json().get("tools").is_none());
}

#[tokio::test]
async fn bad_calls_are_tool_errors_and_the_client_still_gets_its_answer() {
    let h = harness().await;
    let foreign = ContentRef::of("someone else's secret").as_str().to_string();
    h.mock.push(Reply::tool_calls(vec![
        ("context_read".into(), json!({"ref": foreign})),
        ("context_read".into(), json!({"ref": "../../etc/passwd"})),
        ("context_read".into(), json!("{not json")),
        (
            "context_read".into(),
            json!({"ref": ref_a(), "offset": 9999}),
        ),
        ("context_search".into(), json!({"pattern": "/(unclosed/"})),
    ]));
    h.mock.push(Reply::text("Sorry."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=1,calls=5,failed=5"
    );
    let second = h.mock.received()[1].json();
    let results: Vec<String> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .take(5)
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    for r in &results {
        assert!(r.starts_with("error: "), "{r}");
    }
    let all = results.join("\n");
    assert!(all.contains("nothing is stored under"));
    assert!(all.contains("is not a reference"));
    assert!(all.contains("arguments must be a JSON object"));
    assert!(all.contains("past the end"));
    assert!(all.contains("not a valid regular expression"));
}

#[tokio::test]
async fn mixed_calls_give_the_client_its_own_and_restore_the_proxys_next_turn() {
    for stream in [false, true] {
        let h = harness().await;
        let mut request = json!({"model": "gpt-4o", "messages": conversation(), "stream": stream,
            "tools": [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]});
        h.mock.push(Reply::tool_calls(vec![
            read(&ref_a(), 7, 1),
            ("run_tests".into(), json!({"suite": "unit"})),
        ]));
        let resp = h.chat(&request).await;
        assert_eq!(resp.status(), 200);
        let bytes = resp.bytes().await.unwrap();
        assert_invisible(&bytes);
        // What the client assembled: one call, its own, at index 0.
        let (message, ids) = if stream {
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            let mut calls: Vec<Value> = Vec::new();
            for d in sse_data(&text).iter().filter(|d| *d != "[DONE]") {
                let c: Value = serde_json::from_str(d).unwrap();
                for tc in c["choices"][0]["delta"]["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    assert_eq!(tc["index"], 0, "{tc}");
                    if tc.get("id").is_some() {
                        calls.push(tc.clone());
                    }
                }
            }
            assert_eq!(calls.len(), 1);
            let id = calls[0]["id"].as_str().unwrap().to_string();
            let message = json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "run_tests", "arguments": "{\"suite\":\"unit\"}"}}]});
            (message, vec![id])
        } else {
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            let message = body["choices"][0]["message"].clone();
            assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
            let calls = message["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0]["function"]["name"], "run_tests");
            (
                message.clone(),
                vec![calls[0]["id"].as_str().unwrap().to_string()],
            )
        };
        // The client sends its result; the proxy puts its own call back in front of it.
        let messages = request["messages"].as_array_mut().unwrap();
        messages.push(message);
        messages.push(json!({"role": "tool", "tool_call_id": ids[0], "content": "12 passed"}));
        request["stream"] = json!(false);
        h.mock
            .push(Reply::text("Tests pass; line 7 computes value_7."));
        let resp = h.chat(&request).await;
        assert_eq!(resp.status(), 200);
        assert_invisible(&resp.bytes().await.unwrap());
        let received = h.mock.received();
        let restored = received.last().unwrap().json();
        let m = restored["messages"].as_array().unwrap();
        let k = m
            .iter()
            .position(|x| x.to_string().contains("run_tests") && x["role"] == "assistant")
            .expect("the client's call");
        assert_eq!(m[k]["tool_calls"][0]["function"]["name"], "context_read");
        assert_eq!(m[k]["tool_calls"][1]["function"]["name"], "run_tests");
        assert_eq!(m[k + 1]["tool_call_id"], m[k]["tool_calls"][0]["id"]);
        assert!(m[k + 1]["content"]
            .as_str()
            .unwrap()
            .contains("a.rs line 7:"));
        assert_eq!(m[k + 2]["content"], "12 passed");
        // And the same bytes again on the next turn (prompt cache).
        let messages = request["messages"].as_array_mut().unwrap();
        messages
            .push(json!({"role": "assistant", "content": "Tests pass; line 7 computes value_7."}));
        messages.push(json!({"role": "user", "content": "Thanks."}));
        h.mock.push(Reply::text("You're welcome."));
        assert_eq!(h.chat(&request).await.status(), 200);
        let again = h.mock.received().last().unwrap().json();
        let a = again["messages"].as_array().unwrap();
        for i in 0..=k + 2 {
            assert_eq!(
                serde_json::to_string(&a[i]).unwrap(),
                serde_json::to_string(&m[i]).unwrap(),
                "message {i} changed"
            );
        }
    }
}

/// Two users of one tenant whose conversations begin alike (one derived session), on a server
/// that numbers calls predictably: what the proxy hid in one user's conversation is never put
/// into the other's request.
#[tokio::test]
async fn a_hidden_exchange_returns_only_to_its_own_conversation() {
    use context_proxy::mock::{Completion, ToolCall};
    let h = harness().await;
    let tools = json!([{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]);
    let predictable = |calls: Vec<(&str, String, Value)>| {
        Reply::Completion(Completion {
            content: None,
            tool_calls: calls
                .into_iter()
                .map(|(id, name, arguments)| ToolCall {
                    id: Some(id.into()),
                    name,
                    arguments,
                })
                .collect(),
            content_chunks: None,
            thinking: None,
        })
    };
    // The first user's model reads its file back and runs the tests: the read is hidden.
    let mut first = conversation();
    first[3]["content"] = json!(format!("SECRET-OF-THE-FIRST-USER\n{}", file_a()));
    let secret_ref = ContentRef::of(first[3]["content"].as_str().unwrap())
        .as_str()
        .to_string();
    let (name, arguments) = read(&secret_ref, 1, 1);
    h.mock.push(predictable(vec![
        ("call_0", name, arguments),
        ("call_1", "run_tests".into(), json!({})),
    ]));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": first, "tools": tools}))
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_1"
    );
    let hidden_read = h.mock.received().last().unwrap().json();
    assert!(hidden_read.to_string().contains("SECRET-OF-THE-FIRST-USER"));

    // The second user: same beginning, another file, and the same predictable call id.
    let mut second = conversation();
    second[6]["content"] = json!("What is on line 9 of a.rs?");
    second.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]}));
    second.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "3 failed"}));
    h.mock.push(Reply::text("Three tests fail."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": second, "tools": tools}))
        .await;
    assert_eq!(resp.status(), 200);
    let forwarded = h.mock.received().last().unwrap().json();
    let text = forwarded.to_string();
    assert!(
        !text.contains("SECRET-OF-THE-FIRST-USER"),
        "the first user's hidden read reached the second user's request: {text}"
    );
    let m = forwarded["messages"].as_array().unwrap();
    let k = m.len() - 2;
    assert_eq!(m[k]["tool_calls"].as_array().unwrap().len(), 1, "{}", m[k]);
    assert_eq!(m[k + 1]["content"], "3 failed");

    // The first user's own next turn still gets its read back in place.
    let mut next = first.clone();
    next.push(body["choices"][0]["message"].clone());
    next.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "12 passed"}));
    h.mock.push(Reply::text("All pass."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": next, "tools": tools}))
        .await;
    assert_eq!(resp.status(), 200);
    let forwarded = h.mock.received().last().unwrap().json();
    let m = forwarded["messages"].as_array().unwrap();
    let k = m
        .iter()
        .position(|x| x["role"] == "assistant" && x.to_string().contains("run_tests"))
        .unwrap();
    assert_eq!(m[k]["tool_calls"][0]["id"], "call_0");
    assert!(m[k + 1]["content"]
        .as_str()
        .unwrap()
        .contains("SECRET-OF-THE-FIRST-USER"));
}

/// The proxy's tool definitions go out with the request: `x-context-tokens-after` counts them
/// (it is the proxy's exact count of the body it forwarded), and the budget keeps room for
/// them, so a request whose compacted messages just fit still fits with the tools added.
#[tokio::test]
async fn the_injected_tools_are_counted_and_fit_in_the_budget() {
    use context_proxy::tokens::{CountSettings, Counter, Encoding};
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let tokens_after = |resp: &reqwest::Response| -> usize {
        resp.headers()["x-context-tokens-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let request = json!({"model": "gpt-4o", "messages": conversation()});
    let h = harness().await;
    h.mock.push(Reply::text("ok"));
    let resp = h.chat(&request).await;
    assert_eq!(resp.status(), 200);
    let forwarded = h.mock.received().last().unwrap().json();
    assert_eq!(
        names_of_tools(&forwarded),
        ["context_read", "context_search"]
    );
    assert_eq!(tokens_after(&resp), counter.count_request(&forwarded).total);
    // The same messages without the tools: what the proxy forwards minus its definitions.
    let mut bare = forwarded.clone();
    bare.as_object_mut().unwrap().remove("tools");
    let messages_only = counter.count_request(&bare).total;
    assert!(
        tokens_after(&resp) > messages_only + 100,
        "{} vs {messages_only}",
        tokens_after(&resp)
    );

    // A budget the compacted messages fit in, but not with the tools added.
    let budget = messages_only + 50;
    let h = Harness::start_with(MockConfig::default(), move |c| {
        managed(c);
        c.context.max_context_tokens = Some(budget);
    })
    .await;
    h.mock.push(Reply::text("ok"));
    let resp = h.chat(&request).await;
    assert_eq!(resp.status(), 200);
    let forwarded = h.mock.received().last().unwrap().json();
    let sent = counter.count_request(&forwarded).total;
    assert_eq!(tokens_after(&resp), sent);
    assert!(
        sent <= budget,
        "forwarded {sent} tokens against a budget of {budget}: {:?}",
        resp.headers()["x-context-actions"]
    );
}

#[tokio::test]
async fn a_client_tool_of_the_same_name_makes_the_proxys_take_another() {
    let h = harness().await;
    let request = json!({"model": "gpt-4o", "messages": conversation(),
        "tools": [{"type": "function", "function": {"name": "context_read", "parameters": {"type": "object"}}}]});
    h.mock.push(Reply::tool_calls(vec![(
        "proxy_context_read".into(),
        json!({"ref": ref_a(), "offset": 7, "limit": 1}),
    )]));
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"path": "x"}),
    )]));
    let resp = h.chat(&request).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    // The client's own context_read reaches it; the proxy's, under another name, does not.
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "context_read"
    );
    assert!(!body.to_string().contains("proxy_context_read"));
    let first = h.mock.received()[0].json();
    assert_eq!(
        names_of_tools(&first),
        ["context_read", "proxy_context_read", "context_search"]
    );
    // The markers name the proxy's tool by the name it has in this request.
    let markers = first["messages"].to_string();
    assert!(markers.contains("Call proxy_context_read {"), "{markers}");
    assert!(!markers.contains("Call context_read {"), "{markers}");
    let second = h.mock.received()[1].json();
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(last["content"].as_str().unwrap().contains("a.rs line 7:"));
}

#[tokio::test]
async fn not_offered_with_tool_choice_none_or_several_choices() {
    let h = harness().await;
    for extra in [json!({"tool_choice": "none"}), json!({"n": 2})] {
        let mut request = json!({"model": "gpt-4o", "messages": conversation()});
        for (k, v) in extra.as_object().unwrap() {
            request[k] = v.clone();
        }
        let resp = h.chat(&request).await;
        assert_eq!(resp.status(), 200);
        let sent = h.mock.received().last().unwrap().json();
        assert!(
            names_of_tools(&sent).is_empty(),
            "{extra}: {:?}",
            names_of_tools(&sent)
        );
        assert_eq!(sent.get("tool_choice"), request.get("tool_choice"));
    }
    // A forced client tool stays forced; the proxy's tools are still there for later turns.
    let forced = json!({"model": "gpt-4o", "messages": conversation(),
        "tools": [{"type": "function", "function": {"name": "run_tests"}}],
        "tool_choice": {"type": "function", "function": {"name": "run_tests"}}});
    assert_eq!(h.chat(&forced).await.status(), 200);
    let sent = h.mock.received().last().unwrap().json();
    assert_eq!(sent["tool_choice"], forced["tool_choice"]);
    assert_eq!(
        names_of_tools(&sent),
        ["run_tests", "context_read", "context_search"]
    );
}

#[tokio::test]
async fn an_upstream_error_in_round_two_reaches_the_client() {
    let h = harness().await;
    let error = json!({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}});
    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 1, 1)]));
    h.mock.push(Reply::error(429, error.clone()));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.json::<Value>().await.unwrap(), error);

    h.mock.push(Reply::tool_calls(vec![read(&ref_a(), 1, 1)]));
    h.mock.push(Reply::error(429, error.clone()));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation(), "stream": true}))
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let last = sse_data(&text).last().cloned().unwrap();
    let event: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(event["error"]["code"], "rate_limit_exceeded");
    assert_invisible(text.as_bytes());
}

#[tokio::test]
async fn a_client_that_leaves_during_a_round_stops_the_loop() {
    let h = harness().await;
    let gate = Gate::new();
    h.mock.push(Reply::text_and_tool_calls(
        "Checking. ",
        vec![read(&ref_a(), 1, 1)],
    ));
    h.mock
        .push(Reply::text("never seen in full").hold_after(2, gate.clone()));
    let mut resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation(), "stream": true}))
        .await;
    assert_eq!(resp.status(), 200);
    // Read until round two has started (its first events arrive), then leave.
    let mut seen = String::new();
    while !seen.contains("never") {
        let chunk = tokio::time::timeout(WAIT, resp.chunk())
            .await
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    drop(resp);
    assert!(
        h.mock.wait_stream_cancelled(WAIT).await,
        "round two was not cancelled"
    );
    gate.open();
}

/// A model that keeps calling the proxy's tools after they were withdrawn: the bound of the
/// loop holds whatever it does. Ten such answers are queued; with `max_rounds = 2` the proxy
/// makes exactly three upstream calls (the first, then one per round) and never runs a call
/// made after the tools were taken away.
async fn relentless(stream: bool, text: Option<&str>) -> (Harness, reqwest::Response) {
    let h = Harness::start_with(MockConfig::default(), |c| {
        managed(c);
        c.context.reload.max_rounds = 2;
    })
    .await;
    for n in 1..=10 {
        let call = vec![read(&ref_a(), n, 1)];
        h.mock.push(match text {
            Some(text) => Reply::text_and_tool_calls(text, call),
            None => Reply::tool_calls(call),
        });
    }
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation(), "stream": stream}))
        .await;
    (h, resp)
}

/// The `context_proxy_chat_upstream_calls` histogram's sum and count.
async fn upstream_calls_metric(h: &Harness) -> (f64, u64) {
    let text = h.metrics_text().await;
    (
        sample(
            &text,
            "context_proxy_chat_upstream_calls_sum{route=\"chat\"}",
        ),
        sample(
            &text,
            "context_proxy_chat_upstream_calls_count{route=\"chat\"}",
        ) as u64,
    )
}

#[tokio::test]
async fn a_model_calling_withdrawn_tools_gets_an_error_not_another_round_json() {
    let (h, resp) = relentless(false, None).await;
    assert_eq!(resp.status(), 502);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let error = common::assert_openai_error(&bytes);
    assert_eq!(error["code"], "tool_loop_exhausted");
    assert!(error["message"].as_str().unwrap().contains("max_rounds"));
    assert_eq!(h.mock.received().len(), 3);
    assert_eq!(h.mock.pending_replies(), 7);
    assert_eq!(upstream_calls_metric(&h).await, (3.0, 1));
}

#[tokio::test]
async fn a_model_calling_withdrawn_tools_gets_an_error_not_another_round_stream() {
    let (h, resp) = relentless(true, None).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let data = sse_data(&text);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "tool_loop_exhausted", "{text}");
    assert_eq!(h.mock.received().len(), 3);
    assert_eq!(h.mock.pending_replies(), 7);
}

#[tokio::test]
async fn after_the_tools_are_withdrawn_the_client_gets_the_answers_text() {
    for stream in [false, true] {
        let (h, resp) = relentless(stream, Some("From what I read: value_7.")).await;
        assert_eq!(resp.status(), 200);
        let bytes = resp.bytes().await.unwrap();
        assert_invisible(&bytes);
        // Every round's text, JSON as a stream shows it.
        assert_eq!(
            answer_text(&bytes, stream),
            "From what I read: value_7.".repeat(3)
        );
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        if stream {
            let data = sse_data(&text);
            assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
            let finishes: Vec<Value> = data[..data.len() - 1]
                .iter()
                .map(|d| serde_json::from_str::<Value>(d).unwrap())
                .filter_map(|c| c["choices"][0].get("finish_reason").cloned())
                .filter(|f| !f.is_null())
                .collect();
            assert_eq!(finishes, [json!("stop")]);
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            assert!(v["choices"][0]["message"].get("tool_calls").is_none());
        }
        assert_eq!(h.mock.received().len(), 3);
    }
}

#[tokio::test]
async fn one_answer_runs_a_bounded_number_of_the_proxys_calls() {
    let h = harness().await;
    let calls: Vec<(String, Value)> = (1..=40).map(|n| read(&ref_a(), n, 1)).collect();
    h.mock.push(Reply::tool_calls(calls));
    h.mock.push(Reply::text("Done."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-context-reload"],
        "rounds=1,calls=16,failed=24"
    );
    let next = h.mock.received()[1].json();
    let results: Vec<&str> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .skip(2)
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(results.len(), 40);
    assert!(results[..16].iter().all(|r| r.contains("a.rs line")));
    assert!(results[16..]
        .iter()
        .all(|r| r.starts_with("error: not run: at most 16 calls")));
}

#[tokio::test]
async fn a_huge_pattern_or_ref_is_not_echoed_into_the_next_request() {
    let h = harness().await;
    let huge = "x".repeat(1_000_000);
    h.mock.push(Reply::tool_calls(vec![
        ("context_search".into(), json!({"pattern": huge})),
        ("context_read".into(), json!({"ref": huge})),
        (
            "context_search".into(),
            json!({"pattern": format!("/{}(/", "y".repeat(900))}),
        ),
    ]));
    h.mock.push(Reply::text("Done."));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation()}))
        .await;
    assert_eq!(resp.status(), 200);
    let next = h.mock.received()[1].json();
    let results: Vec<&str> = next["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .skip(2)
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(results.len(), 3);
    for r in results {
        assert!(r.starts_with("error: "), "{r}");
        assert!(r.len() < 600, "{} bytes: {}", r.len(), &r[..200]);
    }
}

#[tokio::test]
async fn a_stream_that_stops_inside_the_proxys_call_ends_with_an_error_event() {
    let h = harness().await;
    // Role, then the first fragment of a context_read call, then a clean end: no finish
    // reason, no [DONE].
    let chunk = |delta: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
        )
    };
    let body = chunk(json!({"role": "assistant", "content": null}))
        + &chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_r", "type": "function",
                                         "function": {"name": "context_read", "arguments": "{\"ref\""}}]}),
        );
    h.mock.push(Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body.into(),
    ));
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": conversation(), "stream": true}))
        .await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_invisible(&bytes);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_stream_error", "{text}");
    assert_eq!(h.mock.received().len(), 1);
}
