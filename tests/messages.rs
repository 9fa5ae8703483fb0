//! `POST /v1/messages` managed through the real proxy against the strict mock: a long
//! Claude-Code-shaped conversation over a small budget is shortened and still accepted (pairing,
//! breakpoints, thinking signatures), with the latest assistant message byte for byte;
//! `count_tokens` answers the size of what the proxy forwards; a request with nothing to do goes
//! out byte-identical; an edit that would break a bound thinking block leaves the request
//! unmanaged, with the reason; the proxy's own errors are in Anthropic's shape, and so is the
//! end of a stream the upstream cut short before `message_stop`.

mod common;

use common::Harness;
use context_proxy::context::adapter::{Adapter, Messages};
use context_proxy::mock::{rules, MockConfig, Reply};
use serde_json::Value;

/// A Claude Code session ([`common::claude_code_session`]) whose `Read` results repeat one
/// line.
fn session(model: &str, turns: usize, thinking: bool) -> Value {
    common::claude_code_session(model, turns, thinking, |t| {
        format!("fn f{t}() {{ println!(\"line\"); }}\n").repeat(120)
    })
}

async fn small_budget() -> Harness {
    Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(6_000);
        c.context.keep_recent_messages = 4;
    })
    .await
}

async fn post(h: &Harness, path: &str, body: &[u8]) -> reqwest::Response {
    h.client
        .post(h.url(path))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        )
        .header("content-type", "application/json")
        .body(body.to_vec())
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

fn breakpoints(body: &Value) -> usize {
    let blocks = |v: &Value| {
        v.as_array().map_or(0, |b| {
            b.iter()
                .filter(|b| b.get("cache_control").is_some())
                .count()
        })
    };
    blocks(&body["tools"])
        + blocks(&body["system"])
        + body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| blocks(&m["content"]))
            .sum::<usize>()
}

#[tokio::test]
async fn a_long_session_is_shortened_and_still_accepted() {
    let h = small_budget().await;
    h.mock.push(Reply::text("Nothing else."));
    let body = session("claude-sonnet-4-5", 24, true);
    let raw = serde_json::to_vec_pretty(&body).unwrap();
    let resp = post(&h, "/v1/messages?beta=true", &raw).await;
    assert_eq!(resp.status(), 200, "{}", header(&resp, "x-context-actions"));
    let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
    let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
    assert!(after < before / 2, "{before} -> {after}");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["content"][1]["text"], "Nothing else.");

    let received = &h.mock.received()[0];
    assert_eq!(received.path, "/v1/messages");
    assert_eq!(received.query.as_deref(), Some("beta=true"));
    assert_eq!(received.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        received.headers["anthropic-beta"],
        "claude-code-20250219,interleaved-thinking-2025-05-14"
    );
    let forwarded = received.json();
    assert_eq!(rules::check_messages(&forwarded), Ok(()));
    assert!(breakpoints(&forwarded) <= breakpoints(&body));
    // The latest assistant message and the system prompt went out byte for byte.
    let spans = Messages.spans(&raw).unwrap();
    let latest = &raw[spans.items[spans.items.len() - 2].clone()];
    assert!(
        received.body.windows(latest.len()).any(|w| w == latest),
        "latest assistant message re-serialized"
    );
    assert_eq!(forwarded["system"], body["system"]);
    assert_eq!(forwarded["messages"][0], body["messages"][0]);
}

#[tokio::test]
async fn count_tokens_counts_what_the_proxy_forwards() {
    let h = small_budget().await;
    let mut body = session("claude-sonnet-4-5", 24, false);
    let counted: Value = {
        let mut b = body.clone();
        b.as_object_mut().unwrap().remove("max_tokens");
        let resp = post(
            &h,
            "/v1/messages/count_tokens",
            &serde_json::to_vec(&b).unwrap(),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let actions = header(&resp, "x-context-actions");
        assert!(
            actions.contains('=') && !actions.starts_with("skipped"),
            "{actions}"
        );
        resp.json().await.unwrap()
    };
    // What the mock counts of the client's own body, asked directly.
    body.as_object_mut().unwrap().remove("max_tokens");
    let direct: Value = h
        .client
        .post(format!("{}/messages/count_tokens", h.mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let forwarded = &h.mock.received()[0];
    assert_eq!(forwarded.path, "/v1/messages/count_tokens");
    let of_forwarded: Value = h
        .client
        .post(format!("{}/messages/count_tokens", h.mock.base_url()))
        .header("anthropic-version", "2023-06-01")
        .body(forwarded.body.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(counted["input_tokens"], of_forwarded["input_tokens"]);
    assert!(
        counted["input_tokens"].as_u64().unwrap() < direct["input_tokens"].as_u64().unwrap() / 2
    );
}

#[tokio::test]
async fn a_small_request_goes_out_byte_identical() {
    let h = Harness::start().await;
    let raw = br#"{"model":"claude-sonnet-4-5","max_tokens":64,
        "messages":[{"role":"user","content":"caf\u00e9 1.0e3"}]}"#;
    let resp = post(&h, "/v1/messages", raw).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(&h.mock.received()[0].body[..], &raw[..]);
}

/// A preserved-thinking model, thinking in every assistant message, the conversation at a turn
/// boundary (no tool loop open): an edit before the thinking blocks invalidates them, so they
/// are removed (older thinking may be omitted outside the current tool-use cycle), and the
/// strict mock accepts the request.
#[tokio::test]
async fn an_edit_before_bound_thinking_at_a_turn_boundary_removes_the_thinking_after_it() {
    let h = small_budget().await;
    let body = session("claude-opus-5-5", 24, true);
    let raw = serde_json::to_vec(&body).unwrap();
    let resp = post(&h, "/v1/messages", &raw).await;
    assert_eq!(resp.status(), 200);
    let actions = header(&resp, "x-context-actions");
    assert!(!actions.starts_with("skipped"), "{actions}");
    let sent = h.mock.received()[0].json();
    assert_ne!(sent, body);
    let thinking = |b: &Value| b.to_string().matches(r#""type":"thinking""#).count();
    assert!(thinking(&sent) < thinking(&body), "{actions}");
}

#[tokio::test]
async fn the_proxys_own_errors_are_in_anthropics_shape() {
    let h = Harness::start().await;
    let resp = post(&h, "/v1/messages", b"{not json").await;
    assert_eq!(resp.status(), 400);
    let error: Value = resp.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(!error["error"]["message"].as_str().unwrap().is_empty());
    assert!(error["request_id"].is_string());
    assert!(h.mock.received().is_empty());
}

/// An upstream that ends its stream, cleanly, before `message_stop`: the client's stream ends
/// with Anthropic's `error` event after what the upstream sent, so no SDK takes the half answer
/// for a whole one.
#[tokio::test]
async fn a_stream_ended_before_message_stop_ends_with_an_error_event() {
    let h = Harness::start().await;
    let partial = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",",
        "\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",",
        "\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,",
        "\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,",
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,",
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
    );
    let event_stream = vec![("content-type".to_string(), "text/event-stream".to_string())];
    h.mock.push(Reply::raw(
        200,
        event_stream,
        partial.as_bytes().to_vec().into(),
    ));
    let body = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let resp = post(&h, "/v1/messages", body.to_string().as_bytes()).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let rest = text.strip_prefix(partial).expect(&text);
    let data = rest.strip_prefix("event: error\ndata: ").expect(rest);
    let error: Value = serde_json::from_str(data.trim_end()).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
}
