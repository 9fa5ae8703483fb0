//! `GET /metrics` after known traffic: labelled request counters, histogram counts, tokens by
//! model with the upstream's cached tokens, in-flight gauges and build info, in the OpenMetrics
//! text format.

mod common;

use common::{sample, Harness};
use context_proxy::mock::Reply;
use serde_json::json;

/// The value of the sample line starting with `series ` (name and labels exactly).
#[tokio::test]
async fn scrape_after_known_traffic() {
    let h = Harness::start().await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello there"}]});
    // 1: a plain JSON answer.
    assert_eq!(h.chat(&body).await.status(), 200);
    // 2: an answer whose usage reports cached prompt tokens.
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52,
                  "prompt_tokens_details": {"cached_tokens": 32}}
    });
    h.mock.push(Reply::raw(
        200,
        vec![("content-type".into(), "application/json".into())],
        completion.to_string().into(),
    ));
    assert_eq!(h.chat(&body).await.status(), 200);
    // 3: a stream.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let resp = h.chat(&streamed).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    // A pass-through route, and a path that is not a route.
    let resp = h.client.get(h.url("/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = h.client.get(h.url("/nowhere")).send().await.unwrap();
    assert_eq!(resp.status(), 404);

    let resp = h.client.get(h.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = resp.text().await.unwrap();

    let chat = "{route=\"chat\",status_class=\"2xx\",upstream=\"default\"}";
    assert_eq!(
        sample(&text, &format!("context_proxy_requests_total{chat}")),
        3.0
    );
    assert_eq!(
        sample(
            &text,
            "context_proxy_requests_total{route=\"passthrough\",status_class=\"2xx\",upstream=\"default\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "context_proxy_requests_total{route=\"other\",status_class=\"4xx\",upstream=\"none\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "context_proxy_request_duration_seconds_count{route=\"chat\"}"
        ),
        3.0
    );
    let upstream = "{route=\"chat\",upstream=\"default\"}";
    for name in [
        "context_proxy_chat_upstream_seconds_count",
        "context_proxy_chat_first_byte_seconds_count",
        "context_proxy_chat_response_seconds_count",
    ] {
        assert_eq!(sample(&text, &format!("{name}{upstream}")), 3.0, "{name}");
    }
    assert_eq!(
        sample(
            &text,
            "context_proxy_chat_proxy_seconds_count{route=\"chat\"}"
        ),
        3.0
    );
    // The proxy's count and the upstream's usage, by model.
    let model = "{model=\"gpt-4o\"}";
    let before = sample(
        &text,
        &format!("context_proxy_model_tokens_before_total{model}"),
    );
    assert!(before > 0.0);
    assert_eq!(
        sample(
            &text,
            &format!("context_proxy_model_tokens_after_total{model}")
        ),
        before
    );
    assert_eq!(
        sample(
            &text,
            &format!("context_proxy_upstream_cached_tokens_total{model}")
        ),
        32.0
    );
    assert!(
        sample(
            &text,
            &format!("context_proxy_upstream_prompt_tokens_total{model}")
        ) >= 50.0
    );
    // The names of the first version still work.
    assert_eq!(sample(&text, "context_proxy_chat_requests_total"), 3.0);
    assert_eq!(sample(&text, "context_proxy_tokens_before_total"), before);
    // Only the scrape itself is in flight; every chat response has ended.
    assert_eq!(sample(&text, "context_proxy_in_flight_requests"), 1.0);
    assert_eq!(sample(&text, "context_proxy_in_flight_chat_responses"), 0.0);
    assert!(text.contains("context_proxy_build_info{version=\""));
    assert!(text.ends_with("# EOF\n"));
    // Nothing identifies a session or a key.
    assert!(!text.contains("session"));
    assert!(!text.contains("sk-test-client"));

    // The Responses and Messages routes are managed, each under a label of its own (not
    // `passthrough`, which stays at the one `/v1/models` above).
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .json(&json!({"model": "gpt-4o", "input": "hello there"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let resp = h
        .client
        .post(h.url("/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "hello there"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let text = h.metrics_text().await;
    for (route, n) in [("responses", 1.0), ("messages", 1.0), ("passthrough", 1.0)] {
        let labels = format!("{{route=\"{route}\",status_class=\"2xx\",upstream=\"default\"}}");
        assert_eq!(
            sample(&text, &format!("context_proxy_requests_total{labels}")),
            n,
            "{route}"
        );
    }
    // The managed-route histograms count the Responses request under its route; the first
    // version's counter counts chat completions only.
    let responses = "{route=\"responses\",upstream=\"default\"}";
    assert_eq!(
        sample(
            &text,
            &format!("context_proxy_chat_response_seconds_count{responses}")
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "context_proxy_chat_proxy_seconds_count{route=\"responses\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "context_proxy_chat_proxy_seconds_count{route=\"chat\"}"
        ),
        3.0
    );
    assert_eq!(sample(&text, "context_proxy_chat_requests_total"), 3.0);
}
