//! Cache-aware decisions through the real proxy: the same conversation sent to two upstreams,
//! one without prompt caching (`cache_pricing = "none"`) and one billing cached tokens at 10%,
//! is decided differently, and the headers say so.

mod common;

use common::Harness;
use context_proxy::mock::MockConfig;
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

fn numbered_lines(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("{prefix} line {i}: let value_{i} = compute({i}) * 2;\n"))
        .collect()
}

/// An old large file read (worth compacting), then a long exchange after it: compacting the
/// read frees ~5k tokens but bills the ~10k tokens after it again.
fn conversation(model: &str) -> Value {
    let mut messages = vec![
        // One session per model (a session is derived from its opening messages).
        json!({"role": "system", "content": format!("You are a coding agent ({model}).")}),
        json!({"role": "user", "content": "Read the file."}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "call_a", "content": numbered_lines("a.rs", 300)}),
    ];
    for k in 0..20 {
        messages.push(json!({"role": "assistant", "content": format!("Step {k}: {}", "the value is computed twice here. ".repeat(60))}));
        messages.push(json!({"role": "user", "content": format!("Go on ({k}).")}));
    }
    json!({"model": model, "messages": messages})
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_same_conversation_is_decided_by_each_upstreams_cache_prices() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        let base_url = c.upstreams[0].base_url.clone();
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
        c.upstreams = vec![
            UpstreamConfig {
                name: "local".into(),
                base_url: base_url.clone(),
                models: vec!["local-*".into()],
                cache_pricing: Some("none".into()),
                ..UpstreamConfig::default()
            },
            UpstreamConfig {
                name: "expiring".into(),
                base_url: base_url.clone(),
                models: vec!["expiring-*".into()],
                cache_pricing: Some("anthropic".into()),
                cache_ttl_secs: Some(0),
                ..UpstreamConfig::default()
            },
            UpstreamConfig {
                name: "cached".into(),
                base_url,
                models: vec!["cached-*".into()],
                default: true,
                cache_pricing: Some("openai".into()),
                cached_read_rate: Some(0.1),
                ..UpstreamConfig::default()
            },
        ];
    })
    .await;

    // No caching: rewriting costs nothing, so the old read is compacted at once.
    let free = h.chat(&conversation("local-model")).await;
    assert_eq!(free.status(), 200);
    assert_eq!(header(&free, "x-context-actions"), "compacted=1");
    let before: usize = header(&free, "x-context-tokens-before").parse().unwrap();
    let after: usize = header(&free, "x-context-tokens-after").parse().unwrap();
    assert!(after + 4000 < before, "{before} → {after}");
    // Only the system prompt, the task and the call precede the rewritten result.
    let kept: usize = header(&free, "x-context-kept-prefix-tokens")
        .parse()
        .unwrap();
    assert!(kept < 100, "{kept}");

    // 90% off cached tokens: ~5k tokens freed at 10% over 10 turns do not pay for ~10k tokens
    // billed again at 90% more: the prefix is kept whole, and the request goes as it came.
    let cached = h.chat(&conversation("cached-model")).await;
    assert_eq!(cached.status(), 200);
    assert_eq!(header(&cached, "x-context-actions"), "none");
    assert_eq!(
        header(&cached, "x-context-tokens-after"),
        header(&cached, "x-context-tokens-before")
    );
    let kept: usize = header(&cached, "x-context-kept-prefix-tokens")
        .parse()
        .unwrap();
    // Everything before the model's last answer (the previous request's prompt).
    assert!(kept < before && kept + 1000 > before, "{kept} of {before}");

    // What the upstream received: the compacted result on one, the original on the other.
    let received = h.mock.received();
    let content = |i: usize| {
        received[i].json()["messages"][3]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(content(0).starts_with("[context-proxy: tool result compacted"));
    assert_eq!(content(1), numbered_lines("a.rs", 300));
}

/// The actions on the second request of a session whose first request was left as it came,
/// on an upstream priced like Anthropic's whose cached prefix lives 0 s (`configure` sets the
/// rest of the proxy).
async fn after_the_cache_lifetime(
    configure: impl FnOnce(&mut context_proxy::app::config::Config),
) -> String {
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
        c.upstreams[0].cache_pricing = Some("anthropic".into());
        c.upstreams[0].cache_ttl_secs = Some(0);
        configure(c);
    })
    .await;
    // The session's first request: its cache's age is unknown, so it counts as warm and the
    // rewrite does not pay.
    let mut body = conversation("claude-sonnet-4");
    let first = h.chat(&body).await;
    assert_eq!(header(&first, "x-context-actions"), "none");
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Done."}));
    messages.push(json!({"role": "user", "content": "And now?"}));
    let second = h.chat(&body).await;
    assert_eq!(second.status(), 200);
    header(&second, "x-context-actions")
}

#[tokio::test]
async fn a_cache_known_to_have_expired_makes_the_rewrite_free() {
    // The next request of the same session comes after the cache's lifetime: free.
    assert_eq!(after_the_cache_lifetime(|_| {}).await, "compacted=1");
}

/// With replicas on one Redis, a session's previous request may have gone to another replica a
/// moment ago: the time this replica last saw the session says nothing about the provider's
/// cache, so the rewrite that an expired cache made free above must pay for itself again.
#[tokio::test]
async fn replicas_sharing_redis_never_judge_a_cache_expired() {
    let redis = tokio::task::spawn_blocking(common::redis::TestRedis::start)
        .await
        .unwrap();
    let actions = after_the_cache_lifetime(|c| {
        c.store.backend = context_proxy::store::Backend::Redis;
        c.store.redis_url = redis.url.clone();
        c.store.redis_key_prefix = redis.prefix.clone();
    })
    .await;
    assert_eq!(actions, "none");
}
