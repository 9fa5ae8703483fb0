//! Compaction on the Responses API through the real proxy, the way Codex asks for it: a
//! streaming (or JSON) `POST /v1/responses` whose final input item is a `compaction_trigger`,
//! and `POST /v1/responses/compact`. The proxy answers both with its summarizer (a second mock,
//! recognisable by its prompt) and a `compaction` item it seals; the next turn's sealed item is
//! expanded into the summary before the strict mock (which cannot read it, as OpenAI could not)
//! sees it. Also the 400s, a sealed item of another key, OpenAI's own compaction left alone,
//! and `native_compaction` forwarding it all to an upstream that compacts itself.

mod common;

use common::{assert_openai_error, sse_data, Harness};
use context_proxy::app::config::Config;
use context_proxy::context::compaction::SEAL_PREFIX;
use context_proxy::context::summary::PROMPT_OPENING;
use context_proxy::context::Mode;
use context_proxy::mock::{Gate, MockConfig, MockUpstream, Reply};
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

const SUMMARY: &str =
    "## Task overview\nMake the tests in tests/parse.rs pass.\n\n## Current state\n\
src/parse.rs fixed (off-by-one at line 42).\n\n## Important discoveries\ncargo test -p parse \
shows 3 failures before the fix.\n\n## Next steps\nRun the whole suite.\n\n## Context to preserve\n\
The user wants small commits.";

struct Setup {
    h: Harness,
    summarizer: MockUpstream,
}

async fn start(edit: impl FnOnce(&mut Config)) -> Setup {
    start_on(MockConfig::default(), edit).await
}

/// [`start`] in front of an upstream mock configured as `mock`.
async fn start_on(mock: MockConfig, edit: impl FnOnce(&mut Config)) -> Setup {
    let summarizer = MockUpstream::start(MockConfig::default()).await.unwrap();
    let base = summarizer.base_url();
    let h = Harness::start_with(mock, |c| {
        c.upstreams.push(UpstreamConfig {
            name: "summ".into(),
            base_url: base,
            models: vec!["summarizer-*".into()],
            ..UpstreamConfig::default()
        });
        c.context.mode = Mode::Auto;
        let s = &mut c.context.summarizer;
        s.enabled = true;
        s.upstream = Some("summ".into());
        s.model = Some("summarizer-1".into());
        s.timeout_ms = 5_000;
        edit(c);
    })
    .await;
    Setup { h, summarizer }
}

/// A short Codex-shaped history: the task, a shell call with its output, an apply_patch.
fn history() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "make the tests in tests/parse.rs pass"}]}),
        json!({"type": "reasoning", "summary": [], "encrypted_content": "gAAAABreasoning1"}),
        json!({"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\":[\"cargo\",\"test\"]}"}),
        json!({"type": "function_call_output", "call_id": "call_1", "output": "test result: FAILED. 3 failed"}),
        json!({"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin Patch\n*** Update File: src/parse.rs\n*** End Patch"}),
        json!({"type": "custom_tool_call_output", "call_id": "call_p", "output": "Success."}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed the off-by-one.", "annotations": []}]}),
    ]
}

fn body(input: Vec<Value>, stream: bool) -> Value {
    json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}, "strict": false}],
        "store": false,
        "stream": stream,
        "prompt_cache_key": "thread-1",
        "include": ["reasoning.encrypted_content"],
    })
}

fn with_trigger(mut input: Vec<Value>) -> Vec<Value> {
    input.push(json!({"type": "compaction_trigger"}));
    input
}

impl Setup {
    /// A `POST /v1/responses` of `input` (in [`body`]) under key `sk-a`.
    async fn turn(&self, input: Vec<Value>, stream: bool) -> reqwest::Response {
        post(&self.h, "/v1/responses", &body(input, stream), "sk-a").await
    }

    /// [`Setup::turn`] as JSON: its answer, parsed.
    async fn turn_json(&self, input: Vec<Value>) -> Value {
        self.turn(input, false).await.json().await.unwrap()
    }

    /// A `POST /v1/responses/compact` of `request` under key `sk-a`.
    async fn compact(&self, request: &Value) -> reqwest::Response {
        post(&self.h, "/v1/responses/compact", request, "sk-a").await
    }
}

async fn post(h: &Harness, path: &str, body: &Value, key: &str) -> reqwest::Response {
    h.client
        .post(h.url(path))
        .header("authorization", format!("Bearer {key}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The summarizer requests the summarizer mock received.
fn summarizer_calls(s: &Setup) -> usize {
    s.summarizer
        .received()
        .iter()
        .filter(|r| {
            r.json()["messages"][0]["content"]
                .as_str()
                .is_some_and(|p| p.starts_with(PROMPT_OPENING))
        })
        .count()
}

/// The events of a Responses SSE body, parsed.
fn events(text: &str) -> Vec<Value> {
    sse_data(text)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The items of the `response.output_item.done` events of an SSE body.
fn items_done(text: &str) -> Vec<Value> {
    events(text)
        .into_iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["item"].clone())
        .collect()
}

/// The events of a compaction the proxy streams, in order.
const STREAMED_COMPACTION: [&str; 5] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.completed",
];

fn assert_sealed(item: &Value) {
    assert_eq!(item["type"], "compaction", "{item}");
    let sealed = item["encrypted_content"].as_str().unwrap();
    assert!(sealed.starts_with(SEAL_PREFIX), "{sealed}");
    assert!(item["id"].as_str().unwrap().starts_with("cmp_"));
}

#[tokio::test]
async fn a_compaction_trigger_gets_one_sealed_item_streamed_then_expanded_next_turn() {
    let s = start(|_| {}).await;
    s.summarizer.push(Reply::text(SUMMARY));
    let resp = s.turn(with_trigger(history()), true).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .starts_with("compaction"));
    let text = resp.text().await.unwrap();
    let events = events(&text);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, STREAMED_COMPACTION);
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], n, "{e}");
    }
    assert!(text.contains("event: response.completed\n"));
    let item = events[3]["item"].clone();
    assert_sealed(&item);
    let completed = &events[4]["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"], json!([item]));
    assert_eq!(completed["store"], false);
    let usage = &completed["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap())
    );
    // The upstream never saw the trigger; the summarizer was asked once, about the history.
    assert!(s.h.mock.received().is_empty());
    assert_eq!(summarizer_calls(&s), 1);
    let asked = s.summarizer.received()[0].json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        asked.contains("make the tests in tests/parse.rs pass"),
        "{asked}"
    );
    assert!(
        asked.contains("call_1 shell({\"cmd\":[\"cargo\",\"test\"]})"),
        "{asked}"
    );
    assert!(asked.contains("test result: FAILED"), "{asked}");
    assert!(
        !asked.contains("workspace-write"),
        "instructions are not summarized: {asked}"
    );

    // The same request again, as JSON: the same item, no second summary.
    let resp = s.turn(with_trigger(history()), false).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"], json!([item]));
    assert_eq!(summarizer_calls(&s), 1, "a summary is never computed twice");

    // Next turn, as Codex builds it: the user messages kept, the compaction item, new work.
    let next = vec![
        history()[1].clone(),
        item.clone(),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now run the whole suite"}]}),
    ];
    s.h.mock.push(Reply::text("Running it."));
    let resp = s.turn(next, false).await;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    let sent = s.h.mock.received()[0].json();
    let expanded = &sent["input"][1];
    assert_eq!(expanded["role"], "user");
    let text = expanded["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("src/parse.rs fixed (off-by-one at line 42)"),
        "{text}"
    );
    assert!(
        text.contains("ctx_"),
        "the marker names the stored originals: {text}"
    );
    assert!(!sent.to_string().contains(SEAL_PREFIX));
    assert_eq!(sent["input"][0], history()[1]);

    // A second compaction merges the first summary into the new one.
    s.summarizer.push(Reply::text(
        SUMMARY.replace("Run the whole suite.", "Commit."),
    ));
    let again = with_trigger(vec![
        history()[1].clone(),
        item.clone(),
        json!({"role": "user", "content": "now run the whole suite"}),
    ]);
    let v: Value = s.turn_json(again).await;
    assert_sealed(&v["output"][0]);
    assert_ne!(v["output"][0], item);
    let asked = s.summarizer.received()[1].json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        asked.starts_with("Previous summary:\n\n## Task overview"),
        "{asked}"
    );
    assert!(
        asked.contains("now run the whole suite") && !asked.contains("test result: FAILED"),
        "{asked}"
    );
}

#[tokio::test]
async fn responses_compact_keeps_the_user_messages_and_seals_the_rest() {
    let s = start(|_| {}).await;
    s.summarizer.push(Reply::text(SUMMARY));
    let request =
        json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "input": history()});
    let resp = s.compact(&request).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "response.compaction");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0], history()[1]);
    assert_sealed(&output[1]);
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert!(s.h.mock.received().is_empty());
    // The window it returned is a valid input for the next turn.
    let mut next = output.clone();
    next.push(json!({"role": "user", "content": "go on"}));
    let resp = s.turn(next, false).await;
    assert_eq!(resp.status(), 200);
    let sent = s.h.mock.received()[0].json();
    assert!(sent["input"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("## Task overview"));
}

#[tokio::test]
async fn a_misplaced_or_second_trigger_and_a_sealed_item_of_another_key_are_400s() {
    let s = start(|_| {}).await;
    let mut misplaced = history();
    misplaced.insert(2, json!({"type": "compaction_trigger"}));
    let twice = with_trigger(with_trigger(history()));
    for input in [misplaced, twice] {
        let resp = s.turn(input, true).await;
        assert_eq!(resp.status(), 400);
        let error = assert_openai_error(&resp.bytes().await.unwrap());
        assert_eq!(error["type"], "invalid_request_error");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("compaction_trigger"),
            "{error}"
        );
    }
    // A sealed item made for key a, presented with key b; then one changed by a byte.
    s.summarizer.push(Reply::text(SUMMARY));
    let v: Value = s.turn_json(with_trigger(history())).await;
    let item = v["output"][0].clone();
    let next = vec![item.clone(), json!({"role": "user", "content": "go on"})];
    let resp = post(&s.h, "/v1/responses", &body(next, false), "sk-b").await;
    assert_eq!(resp.status(), 400);
    let error = assert_openai_error(&resp.bytes().await.unwrap());
    assert!(
        error["message"].as_str().unwrap().contains("input[0]"),
        "{error}"
    );
    let mut changed = item.clone();
    let content = changed["encrypted_content"].as_str().unwrap().to_owned();
    let last = if content.ends_with('a') { "b" } else { "a" };
    changed["encrypted_content"] = json!(format!("{}{last}", &content[..content.len() - 1]));
    let resp = s
        .turn(
            vec![changed, json!({"role": "user", "content": "go on"})],
            false,
        )
        .await;
    assert_eq!(resp.status(), 400);
    assert!(
        s.h.mock.received().is_empty(),
        "nothing unreadable reaches the upstream"
    );
}

#[tokio::test]
async fn an_openai_compaction_item_goes_as_it_came() {
    let s = start(|_| {}).await;
    let input = vec![
        json!({"role": "user", "content": "make the tests pass"}),
        json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAABopenai\u{2b}=="}),
        json!({"role": "user", "content": "go on"}),
    ];
    let raw = body(input, false).to_string();
    s.h.mock.push(Reply::text("ok"));
    let resp =
        s.h.client
            .post(s.h.url("/v1/responses"))
            .header("authorization", "Bearer sk-a")
            .header("content-type", "application/json")
            .body(raw.clone())
            .send()
            .await
            .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(s.h.mock.received()[0].body, raw.as_bytes());
}

#[tokio::test]
async fn native_compaction_forwards_both_to_an_upstream_that_compacts_itself() {
    let s = start(|c| c.upstreams[0].native_compaction = true).await;
    let resp = s.turn(with_trigger(history()), true).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .contains("natively"));
    let done = items_done(&resp.text().await.unwrap());
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["type"], "compaction");
    let native = done[0].clone();
    assert!(native["encrypted_content"]
        .as_str()
        .unwrap()
        .starts_with("gAAAAB"));
    assert_eq!(
        s.h.mock.received()[0].json()["input"],
        json!(with_trigger(history()))
    );

    let request = json!({"model": "gpt-5-codex", "input": history()});
    let resp = s.compact(&request).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "response.compaction");
    assert!(v["output"][1]["encrypted_content"]
        .as_str()
        .unwrap()
        .starts_with("gAAAAB"));
    assert_eq!(s.h.mock.received()[1].path, "/v1/responses/compact");
    assert_eq!(summarizer_calls(&s), 0);

    // The upstream reads its own item back on the next turn.
    s.h.mock.push(Reply::text("ok"));
    let next = vec![
        history()[1].clone(),
        native,
        json!({"role": "user", "content": "go on"}),
    ];
    let resp = s.turn(next, false).await;
    assert_eq!(resp.status(), 200);
}

/// A Responses upstream that is not OpenAI (a vLLM or llama.cpp server) knows no compaction:
/// the mock plays one. The proxy serves the trigger and `/responses/compact` itself, so such
/// an upstream never sees a compaction item, and the next turn's sealed item reaches it as
/// the summary message.
fn without_compaction() -> MockConfig {
    MockConfig {
        without_compaction: true,
        ..MockConfig::default()
    }
}

#[tokio::test]
async fn an_upstream_without_compaction_never_sees_the_trigger() {
    let s = start_on(without_compaction(), |_| {}).await;
    s.summarizer.push(Reply::text(SUMMARY));
    s.summarizer.push(Reply::text(SUMMARY));
    let resp = s.turn(with_trigger(history()), true).await;
    assert_eq!(resp.status(), 200);
    let done = items_done(&resp.text().await.unwrap());
    assert_eq!(done.len(), 1);
    let sealed = done[0].clone();
    assert_sealed(&sealed);
    let request = json!({"model": "gpt-5-codex", "input": history()});
    let resp = s.compact(&request).await;
    assert_eq!(resp.status(), 200);
    let compacted: Value = resp.json().await.unwrap();
    assert_sealed(compacted["output"].as_array().unwrap().last().unwrap());
    assert!(s.h.mock.received().is_empty(), "the upstream was asked");

    // Next turn: the sealed item goes as the summary message; the upstream accepts it.
    s.h.mock.push(Reply::text("Running the suite."));
    let next = vec![
        history()[1].clone(),
        sealed,
        json!({"role": "user", "content": "go on"}),
    ];
    let resp = s.turn(next, false).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["output"][0]["content"][0]["text"],
        "Running the suite."
    );
    let received = s.h.mock.received();
    assert_eq!(received.len(), 1);
    let sent = received[0].json();
    let text = sent.to_string();
    assert!(!text.contains("compaction"), "{text}");
    assert!(text.contains("off-by-one at line 42"), "{text}");
}

/// With `native_compaction` the operator says the upstream compacts itself; when it cannot,
/// the client gets the upstream's own error, unchanged, and no summary is made.
#[tokio::test]
async fn native_compaction_on_an_upstream_without_it_gives_the_client_its_error() {
    let s = start_on(without_compaction(), |c| {
        c.upstreams[0].native_compaction = true;
    })
    .await;
    for stream in [false, true] {
        let resp = s.turn(with_trigger(history()), stream).await;
        assert_eq!(resp.status(), 400);
        let error = assert_openai_error(&resp.bytes().await.unwrap());
        assert_eq!(error["code"], "invalid_value");
        assert_eq!(error["param"], format!("input[{}]", history().len()));
        assert!(error["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid value: 'compaction_trigger'."));
    }
    let request = json!({"model": "gpt-5-codex", "input": history()});
    let resp = s.compact(&request).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
    assert_eq!(s.h.mock.received().len(), 3);
    assert_eq!(summarizer_calls(&s), 0);
}

/// How a summary can fail to come: the summarizer's error, its timeout, or none configured.
#[derive(Debug, Clone, Copy)]
enum NoSummary {
    Error,
    Timeout,
    NotConfigured,
}

/// Compaction never fails open onto an upstream without compaction: when no summary can be
/// had, the trigger (SSE and JSON) and `/responses/compact` are still answered by the proxy,
/// with one item sealed around the marker alone; the next turn expands it into the marker
/// message, and the model reads the moved-out originals back with `context_read`.
#[tokio::test]
async fn without_a_summary_the_item_is_sealed_around_the_marker_alone() {
    let needle = "NEEDLE port=7411";
    let mut moved = history();
    moved[4]["output"] = json!(format!("test result: FAILED. 3 failed\n{needle}\n"));
    for cause in [
        NoSummary::Error,
        NoSummary::Timeout,
        NoSummary::NotConfigured,
    ] {
        let mock = MockConfig {
            reader: true,
            ..without_compaction()
        };
        let s = start_on(mock, |c| match cause {
            NoSummary::NotConfigured => c.context.summarizer.enabled = false,
            NoSummary::Timeout => c.context.summarizer.timeout_ms = 200,
            NoSummary::Error => {}
        })
        .await;
        let gate = Gate::new();
        let failure = Reply::error(
            500,
            json!({"error": {"message": "down", "type": "server_error", "param": null, "code": null}}),
        );
        match cause {
            NoSummary::Error => s.summarizer.push(failure),
            NoSummary::Timeout => s.summarizer.push(failure.hold_after(0, gate.clone())),
            NoSummary::NotConfigured => {}
        }

        let resp = s.turn(with_trigger(moved.clone()), true).await;
        assert_eq!(resp.status(), 200, "{cause:?}");
        let actions = resp.headers()["x-context-actions"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            actions.starts_with("compaction (marker only: "),
            "{cause:?}: {actions}"
        );
        let events = events(&resp.text().await.unwrap());
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, STREAMED_COMPACTION, "{cause:?}");
        let item = events[3]["item"].clone();
        assert_sealed(&item);
        assert_eq!(events[4]["response"]["output"], json!([item]));

        let v: Value = s.turn_json(with_trigger(moved.clone())).await;
        assert_eq!(v["output"].as_array().unwrap().len(), 1, "{cause:?}: {v}");
        assert_sealed(&v["output"][0]);

        let request = json!({"model": "gpt-5-codex", "input": moved.clone()});
        let resp = s.compact(&request).await;
        assert_eq!(resp.status(), 200, "{cause:?}");
        let compacted: Value = resp.json().await.unwrap();
        let output = compacted["output"].as_array().unwrap();
        assert_eq!(output.len(), 2, "{cause:?}: {compacted}");
        assert_eq!(output[0], moved[1]);
        assert_sealed(&output[1]);
        assert!(
            s.h.mock.received().is_empty(),
            "{cause:?}: the upstream was asked"
        );
        assert_eq!(
            s.h.metric(r#"context_proxy_responses_compactions_total{outcome="marker"}"#)
                .await,
            3.0,
            "{cause:?}"
        );

        // Next turn: the item goes as the marker; the model reads the originals back.
        let next = vec![
            moved[1].clone(),
            item.clone(),
            json!({"role": "user", "content": "Recall the needles: port"}),
        ];
        let resp = s.turn(next, false).await;
        assert_eq!(resp.status(), 200, "{cause:?}");
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(
            answer["output"].as_array().unwrap().len(),
            1,
            "{cause:?}: {answer}"
        );
        assert_eq!(
            answer["output"][0]["content"][0]["text"],
            "port=7411",
            "{cause:?}: {}",
            s.h.mock.received()[0].json()
        );
        let received = s.h.mock.received();
        assert_eq!(received.len(), 2, "{cause:?}: one read, one answer");
        let sent = received[0].json();
        let marker = sent["input"][1]["content"][0]["text"].as_str().unwrap();
        assert!(
            marker.starts_with("[context-proxy: 8 earlier messages"),
            "{marker}"
        );
        assert!(
            !marker.contains("Summary of") && !marker.contains(needle),
            "{marker}"
        );
        assert!(!sent.to_string().contains("compaction"), "{sent}");
        let read = received[1].json();
        let outputs: Vec<&Value> = read["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .collect();
        assert!(
            outputs.last().unwrap()["output"]
                .as_str()
                .unwrap()
                .contains(needle),
            "{cause:?}: {read}"
        );
        gate.open();
    }
}

/// A second compaction without a summary keeps the first one's text after its own marker,
/// so no stored original loses the marker that names it.
#[tokio::test]
async fn a_second_marker_only_compaction_keeps_the_first_marker() {
    let s = start(|c| c.context.summarizer.enabled = false).await;
    let v: Value = s.turn_json(with_trigger(history())).await;
    let first = v["output"][0].clone();
    let again = with_trigger(vec![
        history()[1].clone(),
        first.clone(),
        json!({"role": "user", "content": "now run the whole suite"}),
    ]);
    let v: Value = s.turn_json(again).await;
    let second = v["output"][0].clone();
    assert_sealed(&second);
    s.h.mock.push(Reply::text("ok"));
    let next = vec![
        history()[1].clone(),
        second,
        json!({"role": "user", "content": "go on"}),
    ];
    assert_eq!(s.turn(next, false).await.status(), 200);
    let sent = s.h.mock.received()[0].json();
    let text = sent["input"][1]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("[context-proxy: 1 earlier messages"),
        "{text}"
    );
    assert_eq!(text.matches("[context-proxy: ").count(), 2, "{text}");
    assert!(
        text.contains("[context-proxy: 8 earlier messages"),
        "{text}"
    );
}

/// Codex 0.171 sends item ids and `internal_chat_message_metadata_passthrough`: a compaction
/// and the turn after it keep both on the client's items, byte for byte, and the message the
/// sealed item expands into has no id, so no id reaches the (strict) upstream twice.
#[tokio::test]
async fn ids_and_codex_metadata_survive_a_compaction_round_trip() {
    let s = start(|_| {}).await;
    s.summarizer.push(Reply::text(SUMMARY));
    let mut input = history();
    for (n, item) in input.iter_mut().enumerate() {
        if item["type"] == "message" {
            item["id"] = json!(format!("msg_0199b{n:043}"));
            item["internal_chat_message_metadata_passthrough"] = json!({"turn_id": "t1"});
        }
    }
    let v: Value = s.turn_json(with_trigger(input.clone())).await;
    let item = v["output"][0].clone();
    assert_sealed(&item);
    let request = json!({"model": "gpt-5-codex", "input": input.clone()});
    let compacted: Value = s.compact(&request).await.json().await.unwrap();
    assert_eq!(
        compacted["output"][0], input[1],
        "the kept message, id and metadata"
    );

    let mut next = vec![input[1].clone(), item.clone()];
    next.push(
        json!({"type": "message", "role": "user", "id": "msg_0199c", "content": "go on",
        "internal_chat_message_metadata_passthrough": {"turn_id": "t2"}}),
    );
    s.h.mock.push(Reply::text("ok"));
    let resp = s.turn(next.clone(), false).await;
    assert_eq!(resp.status(), 200);
    let sent = s.h.mock.received()[0].json();
    let sent = sent["input"].as_array().unwrap();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0], next[0]);
    assert_eq!(sent[2], next[2]);
    assert!(sent[1].get("id").is_none(), "{}", sent[1]);
    assert_eq!(sent[1]["role"], "user");
}
