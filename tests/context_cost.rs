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

/// A long chat without tools, far over a 1,500-token budget: the same conversation for both
/// upstreams but for the model's name in the system prompt (one session each).
fn long_chat(model: &str) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You answer briefly ({model}).")}),
        json!({"role": "user", "content": "Help me plan a trip."}),
    ];
    for k in 0..40 {
        messages.push(json!({"role": "assistant", "content": format!("Idea {k}: {}", "visit the old town and the harbour ".repeat(5))}));
        messages.push(json!({"role": "user", "content": format!("And then ({k})? {}", "what else is worth seeing ".repeat(5))}));
    }
    json!({"model": model, "messages": messages})
}

/// Over budget, the cut's depth is chosen by price: DeepSeek caches from 64 tokens, so the
/// deep cut (down to the low watermark, 900 tokens) is the cheapest; Anthropic caches nothing
/// under 1,024 tokens, so the same cut would bill every following turn in full, and a
/// shallower cut that keeps the prompt cacheable is cheaper. Both requests fit the budget.
#[tokio::test]
async fn two_upstreams_cut_the_same_conversation_at_depths_their_prices_choose() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        let base_url = c.upstreams[0].base_url.clone();
        c.context.max_context_tokens = Some(1500);
        c.context.keep_recent_messages = 2;
        c.context.reload.enabled = false;
        c.upstreams = vec![
            UpstreamConfig {
                name: "deepseek".into(),
                base_url: base_url.clone(),
                models: vec!["deepseek-*".into()],
                cache_pricing: Some("deepseek".into()),
                ..UpstreamConfig::default()
            },
            UpstreamConfig {
                name: "anthropic".into(),
                base_url,
                models: vec!["claude-*".into()],
                default: true,
                cache_pricing: Some("anthropic".into()),
                ..UpstreamConfig::default()
            },
        ];
    })
    .await;
    let tokens =
        |resp: &reqwest::Response, name: &str| -> usize { header(resp, name).parse().unwrap() };
    let deep = h.chat(&long_chat("deepseek-chat")).await;
    let shallow = h.chat(&long_chat("claude-sonnet-4")).await;
    assert_eq!(
        (deep.status().as_u16(), shallow.status().as_u16()),
        (200, 200)
    );
    for resp in [&deep, &shallow] {
        assert!(tokens(resp, "x-context-tokens-before") > 3000);
        assert!(tokens(resp, "x-context-tokens-after") <= 1500);
    }
    let (deep_after, shallow_after) = (
        tokens(&deep, "x-context-tokens-after"),
        tokens(&shallow, "x-context-tokens-after"),
    );
    // Down to the low watermark (0.6 × 1,500, and the marker) on one; over 1,024 on the other.
    assert!(deep_after <= 900 + 120, "{deep_after}");
    assert!(shallow_after >= 1024, "{shallow_after}");
    let moved = |resp: &reqwest::Response| -> usize {
        let actions = header(resp, "x-context-actions");
        actions
            .strip_prefix("offloaded=")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{actions}"))
    };
    assert!(moved(&deep) > moved(&shallow));
    // What the upstream received: the two cuts, both after the pinned system prompt and task.
    let received = h.mock.received();
    let sent = |i: usize| received[i].json()["messages"].as_array().unwrap().len();
    assert!(sent(0) < sent(1), "{} and {} messages", sent(0), sent(1));
}

/// A support agent's conversation whose pinned head (a long policy prompt and the task)
/// nearly fills the budget: every cut keeps the head and little else, and is soon followed by
/// another, each writing everything after the head again.
fn head_heavy(turns: usize) -> Value {
    let policy: String = (0..60)
        .map(|i| format!("Rule {i}: answer politely, check the order first and never promise a refund over the limit.\n"))
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": policy}),
        json!({"role": "user", "content": "My order A100 has not arrived."}),
    ];
    for k in 0..turns {
        messages.push(json!({"role": "assistant", "content": format!("Let me check that for you ({k}): {}", "the parcel is on its way. ".repeat(6))}));
        messages.push(json!({"role": "user", "content": format!("Still nothing ({k}). {}", "where is it? ".repeat(6))}));
    }
    json!({"model": "claude-sonnet-4", "messages": messages})
}

/// Sessions the proxy warned that their budget costs more than going direct, by `/metrics`.
async fn unpaid_sessions(h: &Harness) -> u64 {
    let resp = h.client.get(h.url("/metrics")).send().await.unwrap();
    let text = resp.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("context_proxy_budget_unpaid_conversations_total "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Sends three requests of one head-heavy session (`exchanges`, then two exchanges more each
/// time) under a budget `room` tokens over its pinned head, each cut and within the budget (the
/// recent window the default six messages), with the upstream priced as `preset`: the sessions
/// warned, and the budget warnings `check-config` gives for the same configuration.
async fn cut_three_times(preset: &str, room: usize, exchanges: usize) -> (u64, usize) {
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let head = counter.count_request(&head_heavy(0)).total;
    let mut config = None;
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.reload.enabled = false;
        c.context.max_context_tokens = Some(head + room);
        c.upstreams[0].cache_pricing = Some(preset.into());
        config = Some(c.clone());
    })
    .await;
    let checked = config.unwrap().validate().unwrap().warnings();
    let budget_warnings = checked
        .iter()
        .filter(|w| w.contains("max_context_tokens"))
        .count();
    for turns in (exchanges..).step_by(2).take(3) {
        let resp = h.chat(&head_heavy(turns)).await;
        assert_eq!(resp.status().as_u16(), 200);
        let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
        assert!(after <= head + room, "{after} over {}", head + room);
        let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
        assert!(before > head + room);
        assert!(header(&resp, "x-context-actions").contains("offloaded"));
    }
    (unpaid_sessions(&h).await, budget_warnings)
}

/// A budget that cannot be met without costing more than going direct is said once per
/// session (the metric counts the session once, however many of its requests are cut); a
/// budget with room enough for the cuts to pay says nothing. `check-config`, which knows the
/// budget and the prices but not the traffic, agrees on both.
#[tokio::test]
async fn a_budget_the_head_nearly_fills_is_warned_once_per_session() {
    // 400 tokens of room hold the marker and the recent window (three exchanges) but not one
    // more exchange: every request is cut, each writing the window and the marker again at
    // the full rate (plus Anthropic's write premium), where going direct writes one exchange
    // and reads the rest at 10%: the cuts cost more over the next ten requests too.
    // `check-config` says the same: cuts go down to 0.6 × the budget (about 970 tokens, the
    // head being about 1,220), under Anthropic's minimum cacheable prefix.
    assert_eq!(cut_three_times("anthropic", 400, 6).await, (1, 1));
    // 3,000 tokens of room, and a conversation grown well past them: the cuts pay.
    assert_eq!(cut_three_times("anthropic", 3000, 40).await, (0, 0));
    // Without caching every token sent is billed, and the cuts send fewer: never warned.
    assert_eq!(cut_three_times("none", 400, 6).await, (0, 0));
}

/// A request over a budget its pinned head and recent window overfill, with nothing older to
/// move out, goes as it came (its marker and the proxy's tools would only add to it): no cut is
/// made, so none is priced, and without caching (where fewer tokens always cost less) nothing
/// is said. (It used to price the cut that moves nothing, with the tools it would bring, and
/// warn for every such conversation at 1.02–1.06×.)
#[tokio::test]
async fn a_cut_that_moves_nothing_is_not_warned() {
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let head = counter.count_request(&head_heavy(0)).total;
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(head + 50);
        c.upstreams[0].cache_pricing = Some("none".into());
    })
    .await;
    for turns in 1..=2 {
        let resp = h.chat(&head_heavy(turns)).await;
        assert_eq!(resp.status().as_u16(), 200);
        let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
        assert!(before > head + 50, "{before}: not over the budget");
        assert!(!header(&resp, "x-context-actions").contains("offloaded"));
    }
    assert_eq!(unpaid_sessions(&h).await, 0);
}

/// A coding session whose file reads make it grow by thousands of tokens a turn: two files read
/// at once each turn, each request ending with the results the model has not read yet. At a
/// budget of 3,600 every request from the third on is cut (the reads truncated, compacted once
/// seen, the older turns moved out), and going direct rereads the whole growing session on
/// every request. The proxy's bill, added up from what the upstream received, is lower, and the
/// proxy says nothing. (The cut model used to price the cut's one short cycle against going
/// direct over as many turns as the session had made, two here, and warned.)
/// A coding session after `turns` turns, each reading two files at once (~2.4k tokens), the
/// latest reads not yet seen by the model.
fn fast_growing(turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent. Read files before you change them."}),
        json!({"role": "user", "content": "Fix the failing tests in the parser crate."}),
    ];
    for i in 0..turns {
        let ids = [format!("call_{i}_0"), format!("call_{i}_1")];
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/{id}.rs\"}}")}}))
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for id in &ids {
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": numbered_lines(&format!("src/{id}.rs"), 160)}));
        }
        // The latest reads are unseen: the model answers them in the next request.
        if i + 1 < turns {
            messages.push(json!({"role": "assistant", "content": format!("Read turn {i}'s files; the parser is not there.")}));
            messages.push(json!({"role": "user", "content": "Go on."}));
        }
    }
    json!({"model": "gpt-5", "messages": messages,
           "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]})
}

#[tokio::test]
async fn a_fast_growing_session_whose_cuts_pay_is_not_warned() {
    use context_proxy_drive::replay::cost::{count_session, effective_cost};
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.max_context_tokens = Some(3600);
        c.upstreams[0].cache_pricing = Some("openai-gpt5".into());
    })
    .await;
    let sent: Vec<Value> = (1..=12).map(fast_growing).collect();
    let mut cut = 0;
    for body in &sent {
        let resp = h.chat(body).await;
        assert_eq!(resp.status().as_u16(), 200);
        let before: usize = header(&resp, "x-context-tokens-before").parse().unwrap();
        assert!(before > 3600, "{before}");
        cut += usize::from(header(&resp, "x-context-actions").contains("offloaded"));
    }
    assert!(cut >= 9, "cut {cut} times");
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert_eq!(received.len(), sent.len());
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let gpt5 = context_proxy::pricing::Preset::parse("openai-gpt5")
        .unwrap()
        .for_model("gpt-5");
    let direct = effective_cost(&count_session(&counter, &sent), &gpt5);
    let proxy = effective_cost(&count_session(&counter, &received), &gpt5);
    assert!(
        proxy < 0.8 * direct,
        "{proxy} through the proxy, {direct} direct"
    );
    assert_eq!(unpaid_sessions(&h).await, 0);
}

/// A pinned head over half the budget will be cut, and the proxy's tools, added at the first
/// cut, would change the `tools` that come first in the cached prompt: with caching they go
/// out from the conversation's first request instead (nothing is cached yet), the same in
/// every request, each within the budget with their room; without caching (`none`) they come
/// with the first marker, as before.
#[tokio::test]
async fn a_head_that_crowds_the_budget_gets_the_proxys_tools_from_the_first_request() {
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let head = counter.count_request(&head_heavy(0)).total;
    let budget = head + 600;
    assert!(2 * head > budget);
    for (preset, early) in [("anthropic", true), ("none", false)] {
        let h = Harness::start_with(MockConfig::default(), |c| {
            c.context.keep_recent_messages = 2;
            c.context.max_context_tokens = Some(budget);
            c.upstreams[0].cache_pricing = Some(preset.into());
        })
        .await;
        let mut cut = false;
        for turns in [0, 2, 4, 8, 12, 16, 20] {
            let resp = h.chat(&head_heavy(turns)).await;
            assert_eq!(resp.status().as_u16(), 200);
            let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
            assert!(after <= budget, "{preset}: {after} over {budget}");
            cut |= header(&resp, "x-context-actions").contains("offloaded");
        }
        assert!(cut, "{preset}: the conversation was never cut");
        let tools: Vec<Vec<String>> = h
            .mock
            .received()
            .iter()
            .map(|r| {
                r.json()["tools"]
                    .as_array()
                    .map(|t| {
                        t.iter()
                            .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let offered = vec!["context_read".to_string(), "context_search".to_string()];
        if early {
            assert!(tools.iter().all(|t| *t == offered), "{preset}: {tools:?}");
        } else {
            assert!(tools[0].is_empty(), "{preset}: {tools:?}");
            assert_eq!(tools.last(), Some(&offered), "{preset}");
        }
    }
}

/// A proxy with the summarizer on (`mode = "auto"`), the summarizer a second mock in reader
/// mode (it writes the structured summary asked for) serving `gpt-4o-mini`, the conversation's
/// upstream priced `openai-gpt5`, under `budget`; and the summarizer mock.
async fn summarizing(budget: usize) -> (Harness, context_proxy::mock::MockUpstream) {
    let summarizer = context_proxy::mock::MockUpstream::start(MockConfig {
        reader: true,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base_url = summarizer.base_url();
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.context.mode = context_proxy::context::Mode::Auto;
        c.context.max_context_tokens = Some(budget);
        c.upstreams[0].cache_pricing = Some("openai-gpt5".into());
        c.upstreams.push(UpstreamConfig {
            name: "summ".into(),
            base_url,
            models: vec!["summarizer-*".into()],
            ..UpstreamConfig::default()
        });
        let s = &mut c.context.summarizer;
        s.enabled = true;
        s.upstream = Some("summ".into());
        s.model = Some("gpt-4o-mini".into());
    })
    .await;
    (h, summarizer)
}

/// The summarizer's calls a run made, priced as the replay prices them (its model's list
/// prices, output included, in full-price input tokens of `model`), with their count.
async fn summaries_cost(
    h: &Harness,
    summarizer: &context_proxy::mock::MockUpstream,
    model: &str,
) -> (usize, f64) {
    use context_proxy_drive::replay::cost::SummarizerCalls;
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let bodies: Vec<Value> = summarizer.received().iter().map(|r| r.json()).collect();
    let output = h.metric("context_proxy_summary_tokens_out_total").await as usize;
    let calls = SummarizerCalls::price(&counter, &bodies, Some(output), &[model.to_string()]);
    (calls.calls, calls.cost)
}

/// A support conversation over a forced budget with the summarizer on: each cut saves a few
/// percent of a request (short turns behind a long pinned policy), which a summary — the span
/// sent to the summarizer, its answer, its tokens in every later request — would cost many
/// times over. No summary is asked for (`x-context-summary: unpaid`, the metric): the plain
/// marker goes, and the bill through the proxy, added up from what the upstream received, stays
/// at or under going direct's. (It used to be summarized at every cut, and the summaries cost
/// more than the conversation.)
#[tokio::test]
async fn a_support_conversation_whose_summaries_would_not_pay_gets_the_marker() {
    use context_proxy_drive::replay::cost::{count_session, effective_cost};
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let support = |turns: usize| {
        let mut body = head_heavy(turns);
        body["model"] = json!("gpt-5");
        body
    };
    let head = counter.count_request(&support(0)).total;
    let budget = head + 2000;
    let (h, summarizer) = summarizing(budget).await;
    let sent: Vec<Value> = (4..=80).step_by(2).map(support).collect();
    let mut unpaid = 0;
    for body in &sent {
        let resp = h.chat(body).await;
        assert_eq!(resp.status().as_u16(), 200);
        let after: usize = header(&resp, "x-context-tokens-after").parse().unwrap();
        assert!(after <= budget, "{after} over {budget}");
        if header(&resp, "x-context-actions").contains("offloaded") {
            assert_eq!(header(&resp, "x-context-summary"), "unpaid");
            unpaid += 1;
        }
        resp.bytes().await.unwrap();
    }
    assert!(unpaid >= 5, "cut {unpaid} times");
    assert!(h.metric("context_proxy_summary_unpaid_total").await >= unpaid as f64);
    let (summaries, _) = summaries_cost(&h, &summarizer, "gpt-5").await;
    assert_eq!(summaries, 0);
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert!(received
        .iter()
        .all(|b| !b.to_string().contains("## Task overview")));
    let gpt5 = context_proxy::pricing::Preset::parse("openai-gpt5")
        .unwrap()
        .for_model("gpt-5");
    let direct = effective_cost(&count_session(&counter, &sent), &gpt5);
    let proxy = effective_cost(&count_session(&counter, &received), &gpt5);
    assert!(
        proxy <= direct,
        "{proxy} through the proxy, {direct} direct"
    );
}

/// A coding session growing by two file reads a turn, over the same kind of budget: a cut
/// saves most of every later request, so a summary of what it moves out pays, and is asked for
/// and placed (`computed`); the bill with the summaries stays well under going direct's.
#[tokio::test]
async fn a_coding_conversation_whose_summary_pays_gets_one() {
    use context_proxy_drive::replay::cost::{count_session, effective_cost};
    let (h, summarizer) = summarizing(3600).await;
    let sent: Vec<Value> = (1..=12).map(fast_growing).collect();
    let mut computed = 0;
    for body in &sent {
        let resp = h.chat(body).await;
        assert_eq!(resp.status().as_u16(), 200);
        assert_ne!(header(&resp, "x-context-summary"), "unpaid");
        computed += usize::from(header(&resp, "x-context-summary") == "computed");
        resp.bytes().await.unwrap();
    }
    assert!(computed >= 1, "no summary computed");
    assert_eq!(h.metric("context_proxy_summary_unpaid_total").await, 0.0);
    let received: Vec<Value> = h.mock.received().iter().map(|r| r.json()).collect();
    assert!(received
        .iter()
        .any(|b| b.to_string().contains("## Task overview")));
    let (summaries, cost) = summaries_cost(&h, &summarizer, "gpt-5").await;
    assert!(summaries >= computed, "{summaries} summaries");
    let counter = context_proxy::tokens::Counter::new(
        context_proxy::tokens::Encoding::O200kBase,
        Default::default(),
    );
    let gpt5 = context_proxy::pricing::Preset::parse("openai-gpt5")
        .unwrap()
        .for_model("gpt-5");
    let direct = effective_cost(&count_session(&counter, &sent), &gpt5);
    let proxy = effective_cost(&count_session(&counter, &received), &gpt5) + cost;
    assert!(
        proxy < direct,
        "{proxy} through the proxy with {cost} of summaries, {direct} direct"
    );
}
