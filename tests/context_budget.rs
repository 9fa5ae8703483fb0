//! "What the model sees", through the real proxy and mock upstream: results the model has not
//! read reach it whole, a large document reaches a large-window model whole, the task survives
//! on a small-window model, the request's `max_tokens` shrinks the budget, and a limit the
//! upstream states in a "context too long" error is used from the next request on.

mod common;

use common::Harness;
use context_proxy::context::settings::WindowEntry;
use context_proxy::mock::MockConfig;
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use serde_json::{json, Value};

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

/// Source-like text of about `tokens` tokens, every line different.
fn document(name: &str, tokens: usize) -> String {
    let c = counter();
    let mut text = String::new();
    let mut line = 1;
    while c.count_text(&text) < tokens {
        for _ in 0..50 {
            text.push_str(&format!(
                "{name}:{line:>5}  pub fn handler_{line}(req: &Request) -> Result<Response> {{ validate(req, {line})?; Ok(respond(req)) }}\n"
            ));
            line += 1;
        }
    }
    text
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// A chat of `rounds` question/answer pairs of about 100 tokens each, after a system prompt and
/// a task, ending with a question.
fn long_chat(rounds: usize) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful assistant."}),
        json!({"role": "user", "content": "TASK: plan the migration of the billing service to Postgres 16."}),
        json!({"role": "assistant", "content": "Understood. Where do we start?"}),
    ];
    for i in 0..rounds {
        messages.push(json!({"role": "user", "content": format!("Question {i}: {}", "what about the indexes and the replicas ".repeat(10))}));
        messages.push(json!({"role": "assistant", "content": format!("Answer {i}: {}", "rebuild them concurrently after the copy ".repeat(10))}));
    }
    messages.push(json!({"role": "user", "content": "What is left?"}));
    messages
}

/// The request of one round of eight parallel reads of files of `tokens` tokens each.
fn eight_reads(tokens: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read the eight modules."}),
    ];
    let calls: Vec<Value> = (0..8)
        .map(|k| json!({"id": format!("call_{k}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"m{k}.rs\"}}")}}))
        .collect();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
    for k in 0..8 {
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{k}"), "content": document(&format!("m{k}.rs"), tokens)}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// gpt-4o's budget: (128,000 − 4,096) × 0.8.
const GPT_4O_BUDGET: usize = 99_123;

#[tokio::test]
async fn eight_parallel_results_within_the_budget_reach_the_model_whole() {
    let h = Harness::start().await;
    let body = eight_reads(10_000);
    let resp = h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    assert!((80_000..GPT_4O_BUDGET).contains(&before), "{before}");
    assert_eq!(header(&resp, "x-context-actions"), "none");
    // Every result, the first two included, reached the model as it was.
    let sent = h.mock.received()[0].json();
    assert_eq!(sent["messages"], body["messages"]);
}

/// Eight parallel results the model has not read, together over the budget (each under the
/// hard cap): they share it, each cut to head and tail at one common cap, none kept whole
/// while another is cut short, and the request fits.
#[tokio::test]
async fn eight_parallel_results_over_the_budget_share_it() {
    let h = Harness::start().await;
    let body = eight_reads(16_000);
    let resp = h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    assert!(before > GPT_4O_BUDGET + 20_000, "{before}");
    assert_eq!(header(&resp, "x-context-actions"), "truncated=8");
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= GPT_4O_BUDGET, "{after}");
    let sent = h.mock.received()[0].json();
    // The request as forwarded, the proxy's tools included, fits too.
    let forwarded = counter().count_request(&sent).total;
    assert!(forwarded <= GPT_4O_BUDGET, "{forwarded}");
    let c = counter();
    let sizes: Vec<usize> = sent["messages"].as_array().unwrap()[3..]
        .iter()
        .map(|m| c.count_message(m))
        .collect();
    let (least, most) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
    // A fair share each: within a few percent of one another, all of the room used.
    assert!(most - least <= most / 20, "{sizes:?}");
    assert!(
        sizes.iter().sum::<usize>() * 10 > GPT_4O_BUDGET * 9,
        "{sizes:?}"
    );
    for m in &sent["messages"].as_array().unwrap()[3..] {
        assert!(m["content"]
            .as_str()
            .unwrap()
            .contains("[context-proxy: truncated"));
    }
}

#[tokio::test]
async fn a_large_document_reaches_a_large_window_model_whole() {
    let h = Harness::start().await;
    let doc = document("spec.md", 100_000);
    let body = |model: &str| {
        json!({"model": model, "messages": [
            {"role": "system", "content": "Review documents."},
            {"role": "user", "content": format!("Review this:\n{doc}")}
        ]})
    };
    let resp = h.chat(&body("gpt-4.1")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-context-actions"), "none");
    assert_eq!(
        h.mock.received()[0].json()["messages"],
        body("gpt-4.1")["messages"]
    );

    // gpt-4o's budget is (128,000 − 4,096) × 0.8 = 99,123: its cap (half of it) cuts the
    // document to head and tail, and never over the cap.
    let resp = h.chat(&body("gpt-4o")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-context-actions"), "truncated=1");
    let sent = h.mock.received()[1].json();
    let user = &sent["messages"][1];
    assert!(user["content"]
        .as_str()
        .unwrap()
        .contains("[context-proxy: truncated"));
    assert!(counter().count_message(user) <= 49_561);
}

#[tokio::test]
async fn a_small_window_model_keeps_the_task() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("small-model".into(), WindowEntry::Window(8192));
    })
    .await;
    let messages = long_chat(60);
    let resp = h
        .chat(&json!({"model": "small-model", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "x-context-actions").contains("offloaded="));
    // (8192 − 4096) × 0.8
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 3276, "{after}");
    let sent = h.mock.received()[0].json();
    let got = sent["messages"].as_array().unwrap();
    assert_eq!(got[0], messages[0]);
    assert_eq!(got[1], messages[1], "the task was moved out");
    assert!(got[2]["content"]
        .as_str()
        .unwrap()
        .contains("earlier messages"));
    assert_eq!(got.last(), messages.last());
}

#[tokio::test]
async fn max_tokens_reduces_the_budget() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context
            .model_windows
            .insert("local-model".into(), WindowEntry::Window(20_000));
    })
    .await;
    let messages = long_chat(60);
    // About 9k tokens: under (20,000 − 4,096) × 0.8 = 12,723 ...
    let resp = h
        .chat(&json!({"model": "local-model", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    assert!((8000..12_723).contains(&before), "{before}");
    assert_eq!(header(&resp, "x-context-actions"), "none");
    // ... but over (20,000 − 10,000) × 0.8 = 8,000 when the answer may take 10,000.
    for key in ["max_tokens", "max_completion_tokens"] {
        let resp = h
            .chat(&json!({"model": "local-model", "messages": messages, key: 10_000}))
            .await;
        assert_eq!(resp.status(), 200);
        assert!(header(&resp, "x-context-actions").contains("offloaded="));
        let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
        assert!(after <= 8000, "{key}: {after}");
    }
}

#[tokio::test]
async fn a_limit_the_upstream_states_is_used_from_the_next_request() {
    let h = Harness::start_with(
        MockConfig {
            context_limit: Some(6000),
            ..MockConfig::default()
        },
        |_| {},
    )
    .await;
    let messages = long_chat(60);
    let body = json!({"model": "self-hosted-model", "messages": messages});
    // Unknown model: 128k assumed, sent whole; the upstream refuses and says its limit. The
    // proxy learns it, plans again against a much smaller budget and retries once.
    let resp = h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let sent = h.mock.received();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].json()["messages"][1], messages[1]);
    // The next request is planned against 6,000 at once: (6,000 − 3,000 for the answer) × 0.8.
    let resp = h.chat(&body).await;
    assert_eq!(resp.status(), 200);
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 2400, "{after}");
    assert_eq!(h.mock.received().len(), 3);

    // The same through a streaming request, for another model: the error comes before the
    // first event, and the retry streams.
    let stream = json!({"model": "other-model", "stream": true, "messages": messages});
    let resp = h.chat(&stream).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("[DONE]"));
    assert_eq!(h.mock.received().len(), 5);
    let resp = h.chat(&stream).await;
    assert_eq!(resp.status(), 200);
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 2400, "{after}");
}

#[tokio::test]
async fn json_results_go_out_minified_and_the_original_is_stored() {
    use context_proxy::store::{Backend, ContentRef, StoreConfig, Tenant};
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.store.backend = Backend::Fs;
        c.store.path = dir.path().to_path_buf();
        c.store.fsync = false;
    })
    .await;
    let items: Vec<Value> = (0..40)
        .map(|i| json!({"id": i, "price": 1.5, "tags": ["a", "b"], "note": format!("item  {i}")}))
        .collect();
    let pretty = serde_json::to_string_pretty(&items).unwrap();
    let messages = json!([
        {"role": "user", "content": "List the items."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "api", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": pretty}
    ]);
    let resp = h
        .chat(&json!({"model": "gpt-4o", "messages": messages}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-context-actions"), "minified=1");
    let sent = h.mock.received()[0].json();
    let text = sent["messages"][2]["content"].as_str().unwrap();
    assert_eq!(text, serde_json::to_string(&items).unwrap());
    // The original, byte-exact, under its reference.
    let store = context_proxy::store::open(&StoreConfig {
        backend: Backend::Fs,
        path: dir.path().to_path_buf(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let stored = store
        .get_content(
            &Tenant::from_api_key(Some("sk-test-client")),
            &ContentRef::of(&pretty),
        )
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some(pretty.as_str()));
    store.close().await;
}

/// OpenAI's `context_length_exceeded` error stating `limit`.
fn overflow(limit: usize, tokens: usize) -> Value {
    json!({"error": {"message": format!("This model's maximum context length is {limit} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."), "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
}

/// POSTs `body` to the chat route with `key` as the client's API key (one tenant per key).
async fn chat_as(h: &Harness, key: &str, body: &Value) -> reqwest::Response {
    h.client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_limit_echoed_from_one_tenants_request_does_not_shrink_anothers() {
    use context_proxy::mock::Reply;
    let h = Harness::start().await;
    // The upstream (vLLM-style validation) echoes the attacker's invalid role in its error.
    let mut poisoned = long_chat(60);
    poisoned[1]["role"] = json!("maximum context length is 300 tokens");
    h.mock.push(Reply::error(
        400,
        json!({"object": "error", "message": "1 validation error for ChatCompletionRequest\nmessages.1.role\n  Input should be 'system', 'user', 'assistant' or 'tool' [type=literal_error, input_value='maximum context length is 300 tokens', input_type=str]", "type": "BadRequestError", "param": null, "code": 400}),
    ));
    let resp = chat_as(
        &h,
        "sk-attacker",
        &json!({"model": "qwen-local", "messages": poisoned}),
    )
    .await;
    assert_eq!(resp.status(), 400);
    // Even an OpenAI-shaped overflow stating a limit below the model's floor is not learned.
    h.mock.push(Reply::error(400, overflow(300, 14_000)));
    let resp = chat_as(
        &h,
        "sk-attacker",
        &json!({"model": "qwen-local", "messages": long_chat(60)}),
    )
    .await;
    resp.bytes().await.unwrap();
    // Another tenant's request of the same model is planned against the model's own window.
    let victim = json!({"model": "qwen-local", "messages": long_chat(60)});
    let resp = chat_as(&h, "sk-victim", &victim).await;
    assert_eq!(resp.status(), 200);
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    assert!(before > 5_000, "{before}");
    assert_eq!(header(&resp, "x-context-tokens-after"), before.to_string());
    assert_eq!(header(&resp, "x-context-actions"), "none");
}

#[tokio::test]
async fn a_learned_limit_rules_other_tenants_once_the_smaller_request_went_through() {
    let h = Harness::start_with(
        MockConfig {
            context_limit: Some(6000),
            ..MockConfig::default()
        },
        |_| {},
    )
    .await;
    let body = json!({"model": "self-hosted-model", "messages": long_chat(60)});
    // Tenant a: refused, the limit stated, retried smaller, answered: the limit is confirmed.
    let resp = chat_as(&h, "sk-a", &body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(h.mock.received().len(), 2);
    // Tenant b is planned against it at once: one upstream call.
    let resp = chat_as(&h, "sk-b", &body).await;
    assert_eq!(resp.status(), 200);
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 2400, "{after}");
    assert_eq!(h.mock.received().len(), 3);
}

#[tokio::test]
async fn an_unconfirmed_limit_rules_only_the_tenant_that_drew_it() {
    use context_proxy::mock::Reply;
    let h = Harness::start().await;
    let body = json!({"model": "self-hosted-model", "messages": long_chat(60)});
    // The upstream states 6,000 but then refuses the smaller retry too: nothing confirms it.
    for _ in 0..2 {
        h.mock.push(Reply::error(400, overflow(6000, 14_000)));
    }
    let resp = chat_as(&h, "sk-a", &body).await;
    assert_eq!(resp.status(), 400);
    resp.bytes().await.unwrap();
    assert_eq!(h.mock.received().len(), 2);
    // Tenant a's next request is planned against 6,000; tenant b's is not.
    let resp = chat_as(&h, "sk-a", &body).await;
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after <= 2400, "{after}");
    let resp = chat_as(&h, "sk-b", &body).await;
    assert_eq!(header(&resp, "x-context-actions"), "none");
}
