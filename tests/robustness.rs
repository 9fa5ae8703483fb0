//! Robustness at scale (issue 12, item 8): arbitrary request bodies through parse, plan and
//! apply (`ContextManager::manage` on a memory store), and arbitrary byte streams through the
//! SSE reader. The property is that nothing panics, whatever the input; the case counts are in
//! BENCHMARKS.md.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use context_proxy::context::{ContextConfig, ContextManager, Mode};
use context_proxy::store::{self, Backend, StoreConfig};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use context_proxy::wire::{SseConfig, SseReader};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Cases of each property (fixed, so the figure in BENCHMARKS.md is what runs).
const BODY_CASES: u32 = 2_000;
const SSE_CASES: u32 = 20_000;

/// Bodies run and bodies the manager rewrote, printed now and then (`--nocapture`) to show that
/// the cases reach the actions, not only the early exits.
static RUN: AtomicUsize = AtomicUsize::new(0);
static REWRITTEN: AtomicUsize = AtomicUsize::new(0);

/// One runtime and one manager for every case, so caches and recorded decisions carry over
/// from one conversation to the next, as in a running proxy. Budgets are tiny so that every
/// action (truncate, compact, move out) is taken often.
fn fixture() -> &'static (tokio::runtime::Runtime, ContextManager) {
    static FIXTURE: OnceLock<(tokio::runtime::Runtime, ContextManager)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let manager = runtime.block_on(async {
            let store = store::open(&StoreConfig {
                backend: Backend::Memory,
                ..StoreConfig::default()
            })
            .await
            .unwrap();
            let config = ContextConfig {
                max_context_tokens: Some(300),
                keep_recent_messages: 2,
                tool_result_max_tokens: 20,
                truncate_tool_result_tokens: Some(120),
                compact_batch_tokens: 10,
                preview_head_lines: 2,
                preview_tail_lines: 1,
                ..ContextConfig::default()
            };
            let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
            ContextManager::new(config, counter, Arc::clone(&store))
        });
        (runtime, manager)
    })
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Text with lines, repeats, JSON-looking runs, multi-byte characters and control bytes.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "(line [0-9]{1,3}\n){0,60}",
        "[{}\\[\\]\":, \n\tabc0-9]{0,200}",
        (".{0,20}", 0usize..400).prop_map(|(s, n)| s.repeat(n)),
        "[日本語✓\u{0}\u{1b}\r\n]{0,50}",
    ]
}

/// A message that is sometimes well-formed and sometimes not at all.
fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just(json!("system")),
        Just(json!("developer")),
        Just(json!("user")),
        Just(json!("assistant")),
        Just(json!("tool")),
        Just(json!("")),
        Just(json!(7)),
        "[a-z]{1,6}".prop_map(Value::String),
    ];
    let content = prop_oneof![
        text().prop_map(Value::String),
        Just(Value::Null),
        prop::collection::vec(
            prop_oneof![
                text().prop_map(|t| json!({"type": "text", "text": t})),
                Just(json!({"type": "image_url", "image_url": {"url": "data:,", "detail": "low"}})),
                any_json(),
            ],
            0..4
        )
        .prop_map(Value::Array),
        any_json(),
    ];
    let id = "call_[0-3]";
    let tool_calls = prop::collection::vec(
        prop_oneof![
            (id, text()).prop_map(|(id, args)| json!({"id": id, "type": "function", "function": {"name": "read", "arguments": args}})),
            any_json(),
        ],
        0..4,
    );
    (
        role,
        content,
        prop::option::of(tool_calls),
        prop::option::of(id),
        prop::option::of(any_json()),
    )
        .prop_map(|(role, content, calls, call_id, extra)| {
            let mut m = Map::new();
            m.insert("role".into(), role);
            m.insert("content".into(), content);
            if let Some(calls) = calls {
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            if let Some(call_id) = call_id {
                m.insert("tool_call_id".into(), json!(call_id));
            }
            if let Some(extra) = extra {
                m.insert("x_vendor".into(), extra);
            }
            Value::Object(m)
        })
}

/// A well-formed agent conversation: instructions, a task, rounds of tool calls with their
/// results (any text, in any order within the round), answers, the latest user turn.
fn conversation() -> impl Strategy<Value = Vec<Value>> {
    let round = prop::collection::vec(text(), 1..4).prop_map(|results| {
        let n = results.len();
        let mut round = vec![json!({"role": "assistant", "content": null, "tool_calls": (0..n)
            .map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "read", "arguments": "{}"}}))
            .collect::<Vec<_>>()})];
        for (i, r) in results.into_iter().enumerate().rev() {
            round.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": r}));
        }
        round
    });
    (
        text(),
        prop::collection::vec((round, prop::option::of(text())), 0..10),
        text(),
    )
        .prop_map(|(task, rounds, last)| {
            let mut messages = vec![
                json!({"role": "system", "content": "You are an agent."}),
                json!({"role": "user", "content": task}),
            ];
            for (round, answer) in rounds {
                messages.extend(round);
                if let Some(answer) = answer {
                    messages.push(json!({"role": "assistant", "content": answer}));
                }
            }
            messages.push(json!({"role": "user", "content": last}));
            messages
        })
}

/// A request body: a well-formed conversation, any chat-shaped body, or any JSON at all.
fn body() -> impl Strategy<Value = Value> {
    let well_formed =
        conversation().prop_map(|messages| json!({"model": "gpt-4o", "messages": messages}));
    let chat = (
        prop_oneof![
            Just("gpt-4o"),
            Just("gpt-4"),
            Just("unknown-model"),
            Just("")
        ],
        prop::collection::vec(message(), 0..24),
        prop::option::of(any_json()),
        any::<bool>(),
    )
        .prop_map(|(model, messages, tools, stream)| {
            let mut body = json!({"model": model, "messages": messages, "stream": stream});
            if let Some(tools) = tools {
                body["tools"] = tools;
            }
            body
        });
    prop_oneof![5 => well_formed, 4 => chat, 1 => any_json()]
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Off),
        Just(Mode::Compact),
        Just(Mode::Compress),
        Just(Mode::Auto)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: BODY_CASES, ..ProptestConfig::default() })]

    /// parse → plan → apply never panics, and a rewritten body is a JSON object again.
    #[test]
    fn any_request_body_goes_through_context_management(
        mut body in body(),
        mode in mode(),
        session in prop::option::of("[a-z0-9]{1,8}"),
    ) {
        let (runtime, manager) = fixture();
        let tenant = context_proxy::store::Tenant::from_api_key(Some("sk-fuzz"));
        // Through the bytes, as the proxy receives it.
        let raw = serde_json::to_vec(&body).unwrap();
        if let Ok(parsed) = serde_json::from_slice::<Value>(&raw) {
            body = parsed;
        }
        let managed = runtime.block_on(manager.manage(&tenant, session.as_deref(), &mut body, mode, None));
        let run = RUN.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(bytes) = managed.body {
            REWRITTEN.fetch_add(1, Ordering::Relaxed);
            let sent: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert!(sent.is_object());
        }
        if run % 500 == 0 {
            eprintln!("{run} bodies, {} rewritten", REWRITTEN.load(Ordering::Relaxed));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: SSE_CASES, ..ProptestConfig::default() })]

    /// Any bytes, cut anywhere, with any event size limit: the reader never panics, and the
    /// events it returns are the stream's bytes in order.
    #[test]
    fn any_byte_stream_goes_through_the_sse_reader(
        stream in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            "((data|event|id|retry|:)?[: ]?[a-z\\[\\]{}\"0-9 ]{0,20}(\n|\r\n|\r)){0,60}"
                .prop_map(String::into_bytes),
        ],
        cuts in prop::collection::vec(0usize..2048, 0..12),
        max_event_bytes in prop_oneof![Just(16usize), Just(256), Just(1 << 20)],
        expect_done in any::<bool>(),
    ) {
        let mut reader = SseReader::new(SseConfig { max_event_bytes, expect_done });
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
        cuts.sort_unstable();
        cuts.push(stream.len());
        let mut seen = Vec::new();
        let mut start = 0;
        for cut in cuts {
            for event in reader.feed(&stream[start..cut]).flatten() {
                seen.extend_from_slice(&event.raw);
            }
            start = cut;
        }
        for event in reader.finish().flatten() {
            seen.extend_from_slice(&event.raw);
        }
        prop_assert!(stream.starts_with(&seen));
    }
}
