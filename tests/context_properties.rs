//! Property tests for the invariants in ARCHITECTURE.md ("Invariants"), on the pure context engine with the real
//! tokenizer, over generated conversations: user text, assistant text, parallel tool calls,
//! huge and tiny tool results, CJK and emoji, images.

use std::collections::HashMap;

use context_proxy::context::engine::{
    self, content_text, unseen_start, Action, Decision, Input, Outcome, Source,
};
use context_proxy::context::transforms::{collapse_repeats, minify_json};
use context_proxy::context::units::{is_instruction, role, segment};
use context_proxy::context::{ContextConfig, Mode, Settings};
use context_proxy::pricing::CachePricing;
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use proptest::prelude::*;
use serde_json::{json, Value};

fn counter() -> Counter {
    Counter::new(Encoding::O200kBase, CountSettings::default())
}

/// A piece of text of roughly `size` characters from a few scripts.
fn text(seed: u64, size: usize) -> String {
    const PIECES: [&str; 6] = [
        "fn main() { println!(\"hello\"); }\n",
        "The quick brown fox jumps over the lazy dog. ",
        "日本語のテキストと中文内容。",
        "emoji 🚀🔥 mixed ",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}\n",
        "    at module.function (file.rs:42:7)\n",
    ];
    let mut out = String::with_capacity(size + 64);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(PIECES[(x % PIECES.len() as u64) as usize]);
        if x % 5 == 0 {
            out.push_str(&format!("line {}\n", x % 1000));
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Turn {
    User(usize),
    UserImage(usize),
    Assistant(usize),
    Tools(Vec<usize>),
}

fn turn() -> impl Strategy<Value = Turn> {
    let size = prop_oneof![3 => 1usize..200, 2 => 200usize..4000, 1 => 4000usize..60_000];
    prop_oneof![
        3 => size.clone().prop_map(Turn::User),
        1 => (1usize..300).prop_map(Turn::UserImage),
        2 => (1usize..600).prop_map(Turn::Assistant),
        4 => prop::collection::vec(size, 1..4).prop_map(Turn::Tools),
    ]
}

fn build(turns: &[Turn], seed: u64) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are an agent."})];
    let mut call = 0;
    for (k, t) in turns.iter().enumerate() {
        let s = seed.wrapping_add(k as u64 * 7919);
        match t {
            Turn::User(n) => messages.push(json!({"role": "user", "content": text(s, *n)})),
            Turn::UserImage(n) => messages.push(json!({"role": "user", "content": [
                {"type": "text", "text": text(s, *n)},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            ]})),
            Turn::Assistant(n) => {
                messages.push(json!({"role": "assistant", "content": text(s, *n)}))
            }
            Turn::Tools(sizes) => {
                let ids: Vec<String> = sizes
                    .iter()
                    .map(|_| {
                        call += 1;
                        format!("call_{call}")
                    })
                    .collect();
                let calls: Vec<Value> = ids
                    .iter()
                    .map(|id| json!({"id": id, "type": "function", "function": {"name": "read", "arguments": "{\"p\":1}"}}))
                    .collect();
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                for (id, n) in ids.iter().zip(sizes) {
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": text(s ^ (*n as u64), *n)}));
                }
            }
        }
    }
    messages.push(json!({"role": "user", "content": "What next?"}));
    messages
}

fn settings(mode: Mode, budget: usize, keep_recent: usize) -> Settings {
    let cfg = ContextConfig {
        max_context_tokens: Some(budget),
        keep_recent_messages: keep_recent,
        tool_result_max_tokens: 300,
        truncate_tool_result_tokens: Some(6000),
        compact_batch_tokens: 1500,
        ..ContextConfig::default()
    };
    cfg.resolve("gpt-4o", mode, &Default::default())
}

fn run(messages: &[Value], s: &Settings, prior: Decision) -> Outcome {
    let c = counter();
    let counts: Vec<usize> = messages.iter().map(|m| c.count_message(m)).collect();
    engine::run(&Input::new(messages, &counts, 3), s, prior, &c)
}

/// The stored texts of an outcome, by reference.
fn stored(messages: &[Value], outcome: &Outcome) -> HashMap<String, String> {
    outcome
        .writes
        .iter()
        .map(|w| {
            let text = match &w.source {
                Source::Owned(t) => t.clone(),
                Source::MessageText(i) => content_text(&messages[*i]).unwrap().into_owned(),
            };
            assert_eq!(
                context_proxy::store::ContentRef::of(&text),
                w.reference,
                "ref is not content-addressed"
            );
            (w.reference.to_string(), text)
        })
        .collect()
}

fn refs_in(text: &str) -> Vec<String> {
    text.match_indices("ctx_")
        .map(|(i, _)| text[i..i + 28].to_string())
        .collect()
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Auto), Just(Mode::Compact), Just(Mode::Compress)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Units intact, instructions and the latest user message kept, nothing reordered, and
    /// every removed byte in the store, readable byte-exact.
    #[test]
    fn output_is_valid_and_reversible(turns in prop::collection::vec(turn(), 1..24), seed in any::<u64>(),
                                      mode in mode(), budget in 800usize..40_000, keep in 0usize..8) {
        let messages = build(&turns, seed);
        let s = settings(mode, budget, keep);
        let outcome = run(&messages, &s, Decision::default());
        let Some(out) = &outcome.messages else { return Ok(()) };
        let store = stored(&messages, &outcome);

        // Valid conversation: every call with its results, in units.
        prop_assert!(segment(out).is_ok(), "output is malformed");
        // Instructions first and untouched; latest user message last and untouched.
        prop_assert_eq!(&out[0], &messages[0]);
        prop_assert_eq!(out.last(), messages.last());

        let actions: HashMap<usize, Action> = outcome
            .writes
            .iter()
            .filter_map(|w| match w.source {
                Source::MessageText(i) => Some((i, w.action)),
                Source::Owned(_) => None,
            })
            .collect();
        let units = segment(&messages).unwrap();
        let unseen = unseen_start(&messages, &units);
        let first_user = messages.iter().position(|m| role(m) == "user");

        // Every output message is an input message (same or rewritten in place, same order)
        // or the one marker for a moved run; every input message is accounted for.
        // A run reaching into the latest turn keeps the latest user message after the marker.
        let last_user = messages.iter().rposition(|m| role(m) == "user");
        let mut i = 0;
        let (mut lifted, mut resume) = (None, None);
        for m in out {
            if let (Some(kept), Some(end)) = (lifted.take(), resume.take()) {
                // The message the moved run kept (as it came, or capped), then what follows it.
                let original: &Value = &messages[kept];
                prop_assert!(m == original || content_text(m).is_some_and(|t| t.contains("[context-proxy: truncated")),
                    "the kept message changed");
                i = end;
                continue;
            }
            let text = content_text(m).map(|t| t.into_owned()).unwrap_or_default();
            if role(m) == "user" && text.starts_with("[context-proxy:") && text.contains("earlier messages") {
                let r = refs_in(&text)[0].clone();
                let lines = store.get(&r).expect("moved run is stored");
                for line in lines.lines() {
                    let moved: Value = serde_json::from_str(line).unwrap();
                    if moved != messages[i] && Some(i) == last_user {
                        prop_assert!(lifted.is_none(), "the run kept two messages");
                        lifted = Some(i);
                        i += 1;
                    }
                    prop_assert_eq!(&moved, &messages[i], "moved run differs from the input");
                    prop_assert!(!is_instruction(&moved));
                    // The model reads before anything is hidden; the task is pinned.
                    prop_assert!(i < unseen, "message {} moved out before the model saw it", i);
                    prop_assert!(Some(i) != first_user, "the task was moved out");
                    i += 1;
                }
                if lifted.is_some() {
                    resume = Some(i);
                }
                continue;
            }
            let original = &messages[i];
            prop_assert_eq!(role(m), role(original));
            if m != original {
                // A write is recorded once per content: a message with the same text as an
                // earlier one shares its write (and so its action).
                let action = actions.get(&i).copied().or_else(|| {
                    let r = content_text(original)
                        .map(|t| context_proxy::store::ContentRef::of(&t))?;
                    outcome.writes.iter().find(|w| w.reference == r).map(|w| w.action)
                });
                // Unseen results and the pinned messages change only by lossless transforms or
                // the hard cap.
                if i >= unseen || Some(i) == first_user || is_instruction(original) {
                    prop_assert!(matches!(action, Some(Action::Minified | Action::Deduped | Action::Truncated)),
                        "message {} (unseen from {}) was {:?}", i, unseen, action);
                }
                if matches!(action, Some(Action::Minified | Action::Deduped)) {
                    // Lossless: the text sent means exactly the original, which is stored.
                    let original_text = content_text(original).unwrap().into_owned();
                    let reference = context_proxy::store::ContentRef::of(&original_text).to_string();
                    prop_assert_eq!(store.get(&reference), Some(&original_text));
                    if action == Some(Action::Minified) {
                        prop_assert_eq!(json_tokens(&text), json_tokens(&original_text));
                    } else {
                        prop_assert_eq!(expand_repeats(&text), original_text);
                    }
                    i += 1;
                    continue;
                }
                let refs = refs_in(&text);
                prop_assert!(!refs.is_empty(), "a rewritten message names no reference");
                let full = store.get(&refs[0]).expect("rewritten content is stored");
                let original_text = content_text(original).unwrap().into_owned();
                prop_assert_eq!(full, &original_text);
                let (mut a, mut b) = (m.clone(), original.clone());
                a.as_object_mut().unwrap().remove("content");
                b.as_object_mut().unwrap().remove("content");
                prop_assert_eq!(a, b, "fields besides content changed");
            }
            i += 1;
        }
        prop_assert_eq!(i, messages.len());
        prop_assert!(outcome.report.tokens_after <= outcome.report.tokens_before);
    }

    /// The same input and state give byte-identical output.
    #[test]
    fn deterministic(turns in prop::collection::vec(turn(), 1..16), seed in any::<u64>(), budget in 800usize..20_000) {
        let messages = build(&turns, seed);
        let s = settings(Mode::Auto, budget, 4);
        let a = run(&messages, &s, Decision::default());
        let b = run(&messages, &s, Decision::default());
        prop_assert_eq!(serde_json::to_string(&a.messages).unwrap(), serde_json::to_string(&b.messages).unwrap());
        prop_assert_eq!(a.decision, b.decision);
        prop_assert_eq!(a.writes, b.writes);
    }

    /// Within budget when it can be: if what can never be moved out fits, the output fits.
    #[test]
    fn within_budget_when_possible(turns in prop::collection::vec(turn(), 1..24), seed in any::<u64>(),
                                   budget in 2000usize..30_000, keep in 0usize..6) {
        let messages = build(&turns, seed);
        let s = settings(Mode::Auto, budget, keep);
        let outcome = run(&messages, &s, Decision::default());
        let c = counter();
        let units = segment(&messages).unwrap();
        let n = messages.len();
        let last_user = messages.iter().rposition(|m| role(m) == "user").unwrap();
        let limit = n.saturating_sub(keep).min(last_user).min(unseen_start(&messages, &units));
        let protected_from = units.iter().find(|u| u.end > limit).map_or(n, |u| u.start);
        // Worst case for what stays: the pinned head (instructions, the task), a marker, and
        // the protected tail as it came but with each message capped by truncation.
        let capped = |m: &Value| c.count_message(m).min(s.truncate_tokens + 200);
        let first_user = messages.iter().position(|m| role(m) == "user").unwrap();
        let head: usize = messages[..=first_user.min(protected_from)].iter().map(capped).sum();
        let tail: usize = messages[protected_from..].iter().map(capped).sum();
        let bound = 3 + head + 200 + tail;
        if bound <= s.budget {
            prop_assert!(outcome.report.tokens_after <= s.budget,
                "after {} > budget {} though the protected part is only {}", outcome.report.tokens_after, s.budget, bound);
        }
    }

    /// The hard cap holds exactly: every result the engine truncated counts at most
    /// `truncate_tokens` as it goes out, whatever its scripts and line lengths.
    #[test]
    fn truncated_results_stay_within_the_cap(turns in prop::collection::vec(turn(), 1..12), seed in any::<u64>(),
                                             cap in 1024usize..6000, mode in mode()) {
        let messages = build(&turns, seed);
        let cfg = ContextConfig {
            max_context_tokens: Some(200_000),
            truncate_tool_result_tokens: Some(cap),
            ..ContextConfig::default()
        };
        let s = cfg.resolve("gpt-4o", mode, &Default::default());
        let outcome = run(&messages, &s, Decision::default());
        let Some(out) = &outcome.messages else { return Ok(()) };
        let c = counter();
        for m in out {
            if content_text(m).is_some_and(|t| t.contains("[context-proxy: truncated:")) {
                prop_assert!(c.count_message(m) <= s.truncate_tokens,
                    "a truncated message counts {} over the cap {}", c.count_message(m), s.truncate_tokens);
            }
        }
    }

    /// Stable as the conversation grows one turn at a time: boundaries only move forward, and
    /// while they stand still every earlier message keeps its exact bytes.
    #[test]
    fn stable_as_the_conversation_grows(turns in prop::collection::vec(turn(), 4..28), seed in any::<u64>(),
                                        budget in 3000usize..40_000) {
        let full = build(&turns, seed);
        let s = settings(Mode::Auto, budget, 4);
        // Request ends: after each user message or tool result run, as an agent would send.
        let ends: Vec<usize> = (1..=full.len())
            .filter(|&e| matches!(role(&full[e - 1]), "user" | "tool") && (e == full.len() || role(&full[e]) != "tool"))
            .collect();
        let mut prior = Decision::default();
        let mut previous: Option<Vec<Value>> = None;
        let mut moves = 0;
        for &end in &ends {
            let messages = &full[..end];
            let outcome = run(messages, &s, prior);
            prop_assert!(outcome.decision.compact_before >= prior.compact_before.min(end));
            prop_assert!(outcome.decision.offload_before >= prior.offload_before.min(end));
            let out = outcome.messages.clone().unwrap_or_else(|| messages.to_vec());
            if outcome.decision == prior {
                if let Some(prev) = &previous {
                    prop_assert!(out.len() >= prev.len());
                    for (k, (a, b)) in prev.iter().zip(&out).enumerate() {
                        prop_assert_eq!(a, b, "message {} changed without a boundary move", k);
                    }
                }
            } else {
                moves += 1;
            }
            prior = outcome.decision;
            previous = Some(out);
        }
        // Boundaries move in batches, not on every request: a compaction move needs a batch's
        // worth of tokens aging out of the recent window, an over-budget move a climb from the
        // target back over the budget.
        let c = counter();
        let total: usize = full.iter().map(|m| c.count_message(m)).sum();
        let added: usize = full[ends[0]..].iter().map(|m| c.count_message(m)).sum();
        let bound = 2 + total / s.compact_batch_tokens + added / (s.budget - s.target).max(1);
        prop_assert!(moves <= bound, "{} moves for {} tokens ({} added), bound {}", moves, total, added, bound);
    }
}

#[test]
fn malformed_conversations_are_left_as_they_came() {
    let messages = vec![
        json!({"role": "user", "content": "x".repeat(50_000)}),
        json!({"role": "tool", "tool_call_id": "nobody", "content": "y".repeat(50_000)}),
        json!({"role": "user", "content": "next"}),
    ];
    let outcome = run(
        &messages,
        &settings(Mode::Auto, 1000, 0),
        Decision::default(),
    );
    assert!(outcome.messages.is_none());
    assert!(outcome.writes.is_empty());
    assert!(
        outcome.report.actions().starts_with("skipped (malformed"),
        "{}",
        outcome.report.actions()
    );
}

#[test]
fn off_changes_nothing() {
    let messages = build(&[Turn::Tools(vec![50_000, 50_000]), Turn::User(10)], 1);
    let outcome = run(
        &messages,
        &settings(Mode::Off, 1000, 0),
        Decision::default(),
    );
    assert!(outcome.messages.is_none());
}

/// The string and number literals of a JSON text, in order, as written (an independent
/// tokenizer: minification must keep every one byte-exact and in order).
fn json_tokens(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let start = i;
                i += 1;
                while b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push(text[start..i].to_string());
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                out.push(text[start..i].to_string());
            }
            b' ' | b'\n' | b'\r' | b'\t' => i += 1,
            other => {
                out.push((other as char).to_string());
                i += 1;
            }
        }
    }
    out
}

/// Undoes [`collapse_repeats`]: each count marker becomes that many copies of the line above.
fn expand_repeats(text: &str) -> String {
    let mut out = String::new();
    let mut previous = "";
    for piece in text.split_inclusive('\n') {
        let body = piece.strip_suffix('\n').unwrap_or(piece);
        let count = body
            .strip_prefix("[previous line repeated ")
            .and_then(|r| r.strip_suffix(" more times]"))
            .and_then(|n| n.parse::<usize>().ok());
        match count {
            Some(k) => {
                for j in 0..k {
                    out.push_str(previous);
                    if j + 1 < k || piece.ends_with('\n') {
                        out.push('\n');
                    }
                }
            }
            None => {
                out.push_str(piece);
                previous = body;
            }
        }
    }
    out
}

/// JSON text with arbitrary insignificant whitespace, numbers in every form, escapes.
fn json_text() -> impl Strategy<Value = String> {
    let ws = prop::sample::select(vec!["", " ", "\n", "  ", "\n    ", "\t", "\r\n"]);
    let scalar = prop::sample::select(vec![
        "0",
        "-0",
        "1.50",
        "1e3",
        "-2.5E-7",
        "12345678901234567890123",
        "true",
        "false",
        "null",
        "\"plain\"",
        "\"two  spaces\"",
        "\"esc \\\" \\\\ \\n \\u00e9 \\ud83d\\ude80\"",
        "\"日本語 🚀\"",
        "\"\"",
    ]);
    let leaf = (scalar, ws.clone(), ws.clone()).prop_map(|(v, a, b)| format!("{a}{v}{b}"));
    leaf.prop_recursive(4, 48, 6, move |inner| {
        let ws = ws.clone();
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), ws.clone())
                .prop_map(|(items, w)| format!("[{w}{}]", items.join(","))),
            (
                prop::collection::vec(("[a-z]{1,6}", ws.clone(), inner), 0..6),
                ws.clone()
            )
                .prop_map(|(fields, w)| {
                    let fields: Vec<String> = fields
                        .into_iter()
                        .map(|(k, s, v)| format!("{s}\"{k}\"{s}:{v}"))
                        .collect();
                    format!("{{{w}{}}}", fields.join(","))
                }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Minified JSON parses to the same value, keeps every string and number byte-exact and in
    /// order, and is the same bytes every time.
    #[test]
    fn minified_json_means_the_same(text in json_text()) {
        let Some(min) = minify_json(&text) else {
            // Nothing to remove, or not an object/array at the top.
            let top = text.trim_start().as_bytes().first().copied();
            let container = matches!(top, Some(b'{' | b'['));
            let spaced = text.bytes().any(|b| b" \n\r\t".contains(&b));
            prop_assert!(!container || !spaced || serde_json::from_str::<Value>(&text).is_err(), "not minified: {:?}", text);
            return Ok(());
        };
        let a: Value = serde_json::from_str(&text).unwrap();
        let b: Value = serde_json::from_str(&min).unwrap();
        prop_assert_eq!(a, b);
        prop_assert_eq!(json_tokens(&min), json_tokens(&text));
        prop_assert!(!min.bytes().any(|b| b == b'\n'));
        prop_assert_eq!(minify_json(&text), Some(min));
    }

    /// Collapsing repeated lines is undone exactly by expanding the markers.
    #[test]
    fn collapsed_lines_expand_to_the_original(lines in prop::collection::vec((prop::sample::select(vec!["a", "warn: retry", "", "  ", "x\r", "日本", "error: connection refused\r"]), 1usize..12), 0..12),
                                              end_newline in any::<bool>()) {
        let mut text: String = lines.iter().flat_map(|(l, k)| std::iter::repeat_n(format!("{l}\n"), *k)).collect();
        if !end_newline && text.ends_with('\n') {
            text.pop();
        }
        match collapse_repeats(&text) {
            Some((out, runs)) => {
                prop_assert!(runs > 0);
                prop_assert!(out.len() < text.len());
                prop_assert_eq!(expand_repeats(&out), text.clone());
                prop_assert_eq!(collapse_repeats(&text), Some((out, runs)));
            }
            None => prop_assert!(!text.contains("[previous line")),
        }
    }
}

/// Cache prices of any provider: a cached rate, a write premium, no minimum prefix.
fn pricing() -> impl Strategy<Value = CachePricing> {
    (0.05f64..1.0, prop_oneof![Just(0.0), 0.0f64..0.5]).prop_map(|(rate, premium)| CachePricing {
        cached_read_rate: rate,
        cache_write_premium: premium,
        min_cacheable_prefix: 0,
        cache_ttl_secs: 300,
    })
}

/// A turn of moderate size: every request can be brought under its target.
fn small_turn() -> impl Strategy<Value = Turn> {
    let size = prop_oneof![3 => 1usize..200, 2 => 200usize..3000];
    prop_oneof![
        3 => size.clone().prop_map(Turn::User),
        2 => (1usize..600).prop_map(Turn::Assistant),
        4 => prop::collection::vec(size, 1..3).prop_map(Turn::Tools),
    ]
}

/// Request ends: after each user message or tool result run, as an agent would send.
fn request_ends(full: &[Value]) -> Vec<usize> {
    (1..=full.len())
        .filter(|&e| {
            matches!(role(&full[e - 1]), "user" | "tool")
                && (e == full.len() || role(&full[e]) != "tool")
        })
        .collect()
}

fn run_priced(messages: &[Value], s: &Settings, prior: Decision, warm: bool) -> Outcome {
    let c = counter();
    let counts: Vec<usize> = messages.iter().map(|m| c.count_message(m)).collect();
    let input = Input {
        cache_warm: warm,
        ..Input::new(messages, &counts, 3)
    };
    engine::run(&input, s, prior, &c)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Under budget with a warm cache, a prefix rewrite is made only when it pays over the
    /// horizon, checked against the inequality computed here from the two outputs: the one
    /// with the move and the one keeping the prior decision (a batch no request can reach).
    #[test]
    fn optional_rewrites_pay_over_the_horizon(turns in prop::collection::vec(turn(), 4..28), seed in any::<u64>(),
                                              cache in pricing(), horizon in 0.5f64..40.0,
                                              tools in prop_oneof![Just(0usize), 1usize..3000]) {
        let full = build(&turns, seed);
        let s = Settings { cache, cache_horizon_turns: horizon, tools_offer_tokens: tools, ..settings(Mode::Auto, 10_000_000, 4) };
        let keep_prior = Settings { compact_batch_tokens: usize::MAX, ..s.clone() };
        let c = counter();
        let mut prior = Decision::default();
        for end in request_ends(&full) {
            let messages = &full[..end];
            let moved = run_priced(messages, &s, prior, true);
            if moved.decision != prior {
                let kept = run_priced(messages, &keep_prior, prior, true);
                prop_assert_eq!(kept.decision, prior);
                let with = moved.messages.clone().unwrap_or_else(|| messages.to_vec());
                let without = kept.messages.clone().unwrap_or_else(|| messages.to_vec());
                // Under budget nothing is moved out: output message k is input message k.
                prop_assert_eq!(with.len(), messages.len());
                let first = (0..with.len()).find(|&k| with[k] != without[k]).unwrap_or(with.len());
                let answered = messages.iter().rposition(|m| role(m) == "assistant").unwrap_or(0);
                let mut rebilled: usize = with[first.min(answered)..answered].iter().map(|m| c.count_message(m)).sum();
                let mut freed = kept.report.tokens_after.saturating_sub(moved.report.tokens_after);
                // The first rewrite to refer to stored content brings the proxy's tools, which
                // lead the cached prompt: everything before the rewritten message (and the 3
                // tokens of framing) is billed again, the tools written, and every later
                // request carries them.
                let refers = |out: &[Value]| out.iter().any(|m| content_text(m).is_some_and(|t| !refs_in(&t).is_empty()));
                if tools > 0 && refers(&with) && !refers(&without) {
                    let before: usize = 3 + with[..first].iter().map(|m| c.count_message(m)).sum::<usize>();
                    rebilled += before + tools;
                    freed = freed.saturating_sub(tools);
                }
                // The horizon: the requests made so far (the model's answers), at most the
                // setting (the engine's own stops earlier still, at the next forced cut: a
                // move it takes must pay over this one too).
                let answers = messages.iter().filter(|m| role(m) == "assistant").count();
                let gain = freed as f64 * cache.cached_read_rate * horizon.min(answers as f64);
                let loss = rebilled as f64 * (1.0 + cache.cache_write_premium - cache.cached_read_rate);
                prop_assert!(gain > loss, "rewrite at {} freed {} and re-bills {}: {} <= {}", first, freed, rebilled, gain, loss);
            }
            prior = moved.decision;
        }
    }

    /// With the budget forcing changes and a warm cache, each request cuts once and deep: the
    /// number of requests that rewrite what the previous one sent is bounded by the tokens the
    /// session adds over the batch (of compaction, and of the climb from the target back over
    /// the budget), plus one.
    #[test]
    fn forced_rewrites_are_few(turns in prop::collection::vec(small_turn(), 10..40), seed in any::<u64>(),
                               budget in 15_000usize..40_000, cache in pricing()) {
        let warm = true;
        let full = build(&turns, seed);
        let s = Settings { cache, ..settings(Mode::Auto, budget, 2) };
        let ends = request_ends(&full);
        let mut prior = Decision::default();
        let mut previous: Option<Vec<Value>> = None;
        let mut rewrites = 0;
        for &end in &ends {
            let messages = &full[..end];
            let outcome = run_priced(messages, &s, prior, warm);
            let out = outcome.messages.clone().unwrap_or_else(|| messages.to_vec());
            if let Some(prev) = &previous {
                if out.len() < prev.len() || out[..prev.len()] != prev[..] {
                    rewrites += 1;
                    prop_assert!(outcome.decision != prior, "a rewrite without a boundary move");
                }
            }
            prior = outcome.decision;
            previous = Some(out);
        }
        let c = counter();
        let added: usize = full.iter().map(|m| c.count_message(m)).sum();
        let bound = 1 + added / s.compact_batch_tokens + added / (s.budget - s.target);
        prop_assert!(rewrites <= bound, "{} rewrites for {} tokens added, bound {}", rewrites, added, bound);
    }

    /// The price model reaches decisions only as the engine's input: a request the budget
    /// forces is decided the same under any prices, and so is one whose cache is cold (the
    /// prices of a provider without caching).
    #[test]
    fn prices_change_only_optional_moves(turns in prop::collection::vec(turn(), 1..24), seed in any::<u64>(),
                                         budget in 800usize..40_000, a in pricing(), b in pricing()) {
        let messages = build(&turns, seed);
        let base = settings(Mode::Auto, budget, 4);
        let with = |cache| Settings { cache, ..base.clone() };
        let c = counter();
        // Each message as the hard cap leaves it at most: truncation alone may bring a request
        // of huge tool results under the budget, and then every further move is optional.
        let capped: usize = 3 + messages.iter().map(|m| c.count_message(m).min(base.truncate_tokens)).sum::<usize>();
        let same = |x: &Outcome, y: &Outcome| x.decision == y.decision && x.messages == y.messages && x.writes == y.writes;
        if capped > base.budget * 2 {
            // Well over budget (neither the lossless forms nor truncation bring it under): forced.
            let (x, y) = (run_priced(&messages, &with(a), Decision::default(), true), run_priced(&messages, &with(b), Decision::default(), true));
            prop_assert!(same(&x, &y));
        }
        let cold = run_priced(&messages, &with(a), Decision::default(), false);
        let none = run_priced(&messages, &with(CachePricing::NONE), Decision::default(), true);
        prop_assert!(same(&cold, &none));
    }
}

/// Cache prices with a minimum cacheable prefix that matters at these sizes.
fn pricing_with_minimum() -> impl Strategy<Value = CachePricing> {
    (pricing(), prop_oneof![Just(0usize), 64usize..4096]).prop_map(|(p, min)| CachePricing {
        min_cacheable_prefix: min,
        ..p
    })
}

/// The cost model of a forced cut, written here from its definition (docs/context.md): one
/// request of `size` tokens after the cut, the head read from the cache, then turns of `growth`
/// tokens until the next cut or the horizon (the last one weighed by its fraction), each
/// reading the previous request from the cache when that is at least the minimum prefix.
fn cycle_cost(size: usize, model: &engine::CutModel) -> f64 {
    let c = &model.cache;
    let price = |tokens: f64, cached: f64| {
        let cached = if cached >= c.min_cacheable_prefix as f64 {
            cached.min(tokens)
        } else {
            0.0
        };
        cached * c.cached_read_rate + (tokens - cached) * (1.0 + c.cache_write_premium)
    };
    let turns = if model.growth > 0.0 {
        model
            .horizon
            .min((model.budget as f64 - size as f64) / model.growth)
    } else {
        model.horizon
    };
    // A cut that brings the proxy's tools sends them in every request, and they lead the
    // prompt: the cut reads nothing from the cache.
    let s = (size + model.tools) as f64;
    let head = if model.tools > 0 {
        0.0
    } else {
        (model.head as f64).min(s)
    };
    let mut requests = vec![(s, head, 1.0)];
    let mut k = 1.0;
    while k < turns + 1.0 {
        let weight = (turns - (k - 1.0)).min(1.0);
        let at = |k: f64| (s + k * model.growth).round();
        requests.push((at(k), at(k - 1.0), weight));
        k += 1.0;
    }
    let total: f64 = requests.iter().map(|&(t, c, w)| w * price(t, c)).sum();
    total / (1.0 + turns)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The chosen depth is the cheapest candidate by the model, found by brute force over
    /// every candidate; a tie goes to the deeper cut.
    #[test]
    fn the_cut_depth_is_the_cheapest_candidate(steps in prop::collection::vec(1usize..800, 1..12),
                                               head in 0usize..3000, room in 0usize..4000,
                                               growth in 0.0f64..1500.0, horizon in 0.0f64..12.0,
                                               cache in pricing_with_minimum(),
                                               tools in prop_oneof![Just(0usize), 1usize..1500]) {
        // Candidate sizes from the shallowest (just under the budget) to the deepest.
        let budget = head + room + steps.iter().sum::<usize>() + 1;
        let mut sizes = vec![budget - 1];
        for step in &steps {
            sizes.push(sizes.last().unwrap() - step);
        }
        let model = engine::CutModel { budget, head, growth, horizon, cache, tools };
        let chosen = engine::cheapest_cut(&sizes, &model);
        let costs: Vec<f64> = sizes.iter().map(|&s| cycle_cost(s, &model)).collect();
        let best = costs.iter().copied().fold(f64::INFINITY, f64::min);
        let tolerance = 1e-6 * best.max(1.0);
        prop_assert!((engine::cut_cost_per_turn(sizes[chosen], &model) - costs[chosen]).abs() < tolerance,
            "the engine's cost {} differs from the definition's {}", engine::cut_cost_per_turn(sizes[chosen], &model), costs[chosen]);
        prop_assert!(costs[chosen] <= best + tolerance, "chose {} at {} over the cheapest {}", chosen, costs[chosen], best);
        prop_assert!(costs[chosen + 1..].iter().all(|&c| c > costs[chosen] - tolerance), "a deeper cut costs the same: {:?}", costs);
        // Without caching every token is billed, and the deepest cut is the cheapest.
        let none = engine::CutModel { cache: CachePricing::NONE, ..model };
        prop_assert_eq!(engine::cheapest_cut(&sizes, &none), sizes.len() - 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// A rewrite is taken exactly when the bills of the next requests, added up here one
    /// request at a time, come out lower with it: without it each of `h` requests reads
    /// `before + rebilled + freed` from the cache and writes `new` tokens; with it the first
    /// writes `rebilled` (and, when it brings the proxy's tools, which lead the prompt, the
    /// tools and `before` too), and the next read them back.
    #[test]
    fn a_rewrite_bringing_the_tools_pays_as_the_bills_say(freed in 0usize..20_000, rebilled in 0usize..20_000,
                                                          before in 0usize..20_000,
                                                          tools in prop_oneof![Just(0usize), 1usize..3000],
                                                          new in 0usize..2000, h in 1usize..12, cache in pricing()) {
        let bill = |prefix: usize, first_cached: usize| -> f64 {
            (0..h)
                .map(|k| {
                    let cached = if k == 0 { first_cached } else { prefix };
                    cache.call_cost(prefix + new, cached)
                })
                .sum()
        };
        let without = bill(before + rebilled + freed, before + rebilled + freed);
        // Without tools coming, what stands before the rewrite stays cached.
        let with = bill(tools + before + rebilled, if tools == 0 { before } else { 0 });
        let (f, r) = engine::with_tools_added(freed, rebilled, before, tools);
        let pays = engine::rewrite_pays(f, r, &cache, h as f64);
        let margin = 1e-6 * without.max(1.0);
        if pays {
            prop_assert!(with < without + margin, "taken: {} with, {} without", with, without);
        } else if f > 0 {
            prop_assert!(with > without - margin, "left: {} with, {} without", with, without);
        }
    }
}

/// Both sides of the bill from a forced cut, written here one request at a time from their
/// definition (docs/context.md, "A budget that costs more than going direct is said"): the
/// proxy's requests start at the cut and grow by the proxy's growth, cut again to `kept` when
/// over the budget; going direct's start at the client's request and grow by its growth; each
/// request is billed on what it shares with the one before. Returns both totals per request.
fn both_bills(size: usize, o: &engine::Outlook) -> (f64, f64) {
    bills_with_marker_text(size, o, 0)
}

/// [`both_bills`] with `summary` more tokens in the marker of every request through the proxy
/// (after the pinned head and the tools: the cut writes them, later requests read them from
/// the cache, a later cut keeps them and writes them again).
fn bills_with_marker_text(size: usize, o: &engine::Outlook, summary: usize) -> (f64, f64) {
    let m = &o.model;
    let c = &m.cache;
    let price = |tokens: f64, shared: f64| {
        let cached = if shared >= c.min_cacheable_prefix as f64 {
            shared.min(tokens)
        } else {
            0.0
        };
        cached * c.cached_read_rate + (tokens - cached) * (1.0 + c.cache_write_premium)
    };
    let t = m.tools as f64;
    // (tokens sent, tokens shared with the previous request, weight)
    let first_shared = if m.tools > 0 {
        0.0
    } else {
        m.head.min(size + summary) as f64
    };
    let s = summary as f64;
    let mut proxy = vec![(size as f64 + s + t, first_shared, 1.0)];
    let mut direct = vec![(o.raw as f64, o.raw_prefix.min(o.raw) as f64, 1.0)];
    let (mut p, mut d) = (size as f64 + s, o.raw as f64);
    let kept = o.kept as f64 + s;
    let mut k = 1.0;
    while k < o.horizon + 1.0 {
        let weight = (o.horizon - (k - 1.0)).min(1.0);
        if p + o.growth > m.budget as f64 {
            proxy.push((kept + t, (m.head as f64).min(kept) + t, weight));
            p = kept;
        } else {
            proxy.push(((p + o.growth).round() + t, p.round() + t, weight));
            p += o.growth;
        }
        direct.push(((d + m.growth).round(), d.round(), weight));
        d += m.growth;
        k += 1.0;
    }
    let total = |calls: &[(f64, f64, f64)]| {
        calls.iter().map(|&(n, s, w)| w * price(n, s)).sum::<f64>() / (1.0 + o.horizon)
    };
    (total(&proxy), total(&direct))
}

/// A forced cut's outlook: a head, a budget over it, a cut and the later ones, both growths.
fn outlook() -> impl Strategy<Value = (usize, engine::Outlook)> {
    (
        (0usize..4000, 1usize..6000, 0usize..8000, 0usize..3000),
        (
            0.0f64..3000.0,
            0.0f64..12000.0,
            0usize..20_000,
            0usize..5000,
        ),
        (
            0.0f64..12.0,
            pricing_with_minimum(),
            prop_oneof![Just(0usize), 1usize..800],
        ),
    )
        .prop_map(
            |(
                (head, room, over, later),
                (growth, raw_growth, raw_extra, new),
                (horizon, cache, tools),
            )| {
                let budget = head + room;
                // The cut leaves `over` tokens past the head: within the budget or not.
                let size = head + over;
                let raw = size + raw_extra;
                let outlook = engine::Outlook {
                    model: engine::CutModel {
                        budget,
                        head,
                        growth: raw_growth,
                        horizon: 3.0,
                        cache,
                        tools,
                    },
                    kept: head + later,
                    growth,
                    raw,
                    raw_prefix: raw.saturating_sub(new),
                    horizon,
                };
                (size, outlook)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// The warning's two sides are the bills added up request by request, and it is raised
    /// exactly when the proxy's bill is the larger one.
    #[test]
    fn the_warning_compares_the_bills_of_both_sides((size, o) in outlook()) {
        let (proxy, direct) = both_bills(size, &o);
        let tolerance = 1e-9 * proxy.max(direct).max(1.0);
        let with = engine::with_proxy_per_turn(size, &o);
        let without = engine::direct_per_turn(&o);
        prop_assert!((with - proxy).abs() < tolerance, "through the proxy {} against {} by request", with, proxy);
        prop_assert!((without - direct).abs() < tolerance, "going direct {} against {} by request", without, direct);
    }

    /// Without caching every token sent is billed: a proxy that never sends more than the
    /// client (its cut and later cuts, the tools included, under the client's request, and
    /// growing no faster) never costs more, so it is never warned.
    #[test]
    fn without_caching_fewer_tokens_are_never_warned((size, o) in outlook()) {
        let o = engine::Outlook { model: engine::CutModel { cache: CachePricing::NONE, ..o.model }, ..o };
        let t = o.model.tools;
        prop_assume!(size + t <= o.raw && o.kept + t <= o.raw && o.growth <= o.model.growth);
        prop_assert!(engine::with_proxy_per_turn(size, &o) <= engine::direct_per_turn(&o) + 1e-9 * o.raw as f64);
    }

    /// The budget the warning names pays by the same comparison (the one checked against the
    /// bills above), and one token less does not.
    #[test]
    fn the_named_budget_pays_and_one_less_does_not((_, o) in outlook(), ratio in 0.3f64..0.9,
                                                   raw_per_managed in 1.0f64..4.0) {
        let steady = o.kept;
        let kept = |b: usize| ((b as f64 * ratio) as usize).max(steady);
        let new = o.raw - o.raw_prefix;
        let pays = |b: usize| {
            let raw = ((b as f64 * raw_per_managed).round() as usize).max(b);
            let at = engine::Outlook {
                model: engine::CutModel { budget: b, ..o.model },
                kept: kept(b),
                raw,
                raw_prefix: raw.saturating_sub(new),
                ..o
            };
            kept(b) <= b && engine::with_proxy_per_turn(kept(b), &at) <= engine::direct_per_turn(&at)
        };
        if let Some(b) = engine::smallest_paying_budget(&o, raw_per_managed, kept, None) {
            prop_assert!(pays(b), "{} does not pay", b);
            prop_assert!(b == o.model.budget.max(1) || !pays(b - 1), "{} pays too", b - 1);
        } else {
            prop_assert!(!pays(o.model.budget.max(1) * 64));
        }
    }
}

/// A summarizer call: its input, its output, each priced in the request's model's full-price
/// input tokens (a cheaper model, the same, or a dearer one).
fn summary_call() -> impl Strategy<Value = engine::SummaryCall> {
    (0usize..30_000, 0usize..2000, 0.02f64..2.0, 1.0f64..8.0).prop_map(
        |(input, output, input_price, output_ratio)| engine::SummaryCall {
            input,
            output,
            input_price,
            output_price: input_price * output_ratio,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// A summary is asked for exactly when the bill through the proxy with it — every request
    /// carrying the summary in its marker, added up one request at a time, plus the
    /// summarizer's call at its model's input and output prices — stays at or under going
    /// direct's over the same requests.
    #[test]
    fn a_summary_is_bought_only_when_the_bill_with_it_stays_under_direct(
        (size, o) in outlook(), call in summary_call(),
    ) {
        let (proxy, direct) = bills_with_marker_text(size, &o, call.output);
        let n = 1.0 + o.horizon;
        let call_cost = call.input as f64 * call.input_price + call.output as f64 * call.output_price;
        let with = proxy + call_cost / n;
        let tolerance = 1e-9 * with.max(direct).max(1.0);
        let priced = engine::with_summary_per_turn(size, &o, &call);
        prop_assert!((priced - with).abs() < tolerance, "with the summary {} against {} by request", priced, with);
        let pays = engine::summary_pays(size, &o, &call);
        if with < direct - tolerance {
            prop_assert!(pays, "{} with it, {} direct: not asked", with, direct);
        } else if with > direct + tolerance {
            prop_assert!(!pays, "{} with it, {} direct: asked", with, direct);
        }
        // Whatever a summary costs, it never pays where the cut alone does not.
        if !pays {
            return Ok(());
        }
        prop_assert!(engine::with_proxy_per_turn(size, &o) <= engine::direct_per_turn(&o) + tolerance);
    }

    /// Without caching (the `none` preset) every token sent is billed in full: a summary pays
    /// exactly when the tokens the proxy saves over the requests, the summary's own tokens in
    /// each of them counted, cover the summarizer's call; with a proxy that saves nothing, never.
    #[test]
    fn without_caching_a_summary_pays_from_the_tokens_saved((size, o) in outlook(), call in summary_call()) {
        let o = engine::Outlook { model: engine::CutModel { cache: CachePricing::NONE, ..o.model }, ..o };
        let (with_tokens, direct_tokens) = bills_with_marker_text(size, &o, call.output);
        let saved = direct_tokens - with_tokens;
        let n = 1.0 + o.horizon;
        let pays = engine::summary_pays(size, &o, &call);
        let tolerance = 1e-9 * direct_tokens.max(with_tokens).max(1.0);
        if saved > call.cost() / n + tolerance {
            prop_assert!(pays, "saves {} a request, the call costs {}: not asked", saved, call.cost() / n);
        } else if saved < call.cost() / n - tolerance {
            prop_assert!(!pays, "saves {} a request, the call costs {}: asked", saved, call.cost() / n);
        }
        if saved <= 0.0 && call.cost() > 0.0 {
            prop_assert!(!pays);
        }
    }

    /// The budget the warning names with a summary in the marker pays by the same comparison
    /// as the bill with the summary above, and one token less does not.
    #[test]
    fn the_named_budget_with_a_summary_pays_and_one_less_does_not((_, o) in outlook(), call in summary_call(),
                                                                  ratio in 0.3f64..0.9, raw_per_managed in 1.0f64..4.0) {
        let steady = o.kept;
        let kept = |b: usize| ((b as f64 * ratio) as usize).max(steady);
        let new = o.raw - o.raw_prefix;
        let pays = |b: usize| {
            let raw = ((b as f64 * raw_per_managed).round() as usize).max(b);
            let at = engine::Outlook {
                model: engine::CutModel { budget: b, ..o.model },
                kept: kept(b),
                raw,
                raw_prefix: raw.saturating_sub(new),
                ..o
            };
            kept(b) <= b && engine::summary_pays(kept(b), &at, &call)
        };
        if let Some(b) = engine::smallest_paying_budget(&o, raw_per_managed, kept, Some(&call)) {
            prop_assert!(pays(b), "{} does not pay", b);
            prop_assert!(b == o.model.budget.max(1) || !pays(b - 1), "{} pays too", b - 1);
        } else {
            prop_assert!(!pays(o.model.budget.max(1) * 64));
        }
    }
}

/// Today's cut, "once and deep, down to the low watermark": the same settings with a marker
/// reserve no shallower cut can fit beside, so only the deepest is a candidate.
fn deepest_only(s: &Settings) -> Settings {
    Settings {
        cut_reserve_tokens: s.budget,
        ..s.clone()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Prices change how the budget is met, never whether: a forced request that the deep cut
    /// brings under the budget is brought under it at the depth any prices choose; and without
    /// caching the choice is the deep cut itself.
    #[test]
    fn forced_cuts_fit_under_any_prices(turns in prop::collection::vec(small_turn(), 6..30), seed in any::<u64>(),
                                        budget in 2_000usize..20_000, cache in pricing_with_minimum(),
                                        mode in prop_oneof![Just(Mode::Auto), Just(Mode::Compress)],
                                        tools in prop_oneof![Just(0usize), 1usize..800]) {
        let messages = build(&turns, seed);
        // The proxy's tools, when the cut brings them, priced in under any prices.
        let base = Settings { tools_offer_tokens: tools, ..settings(mode, budget, 2) };
        let priced = Settings { cache, ..base.clone() };
        let none = Settings { cache: CachePricing::NONE, ..base.clone() };
        let deep = run_priced(&messages, &deepest_only(&none), Decision::default(), true);
        let out = run_priced(&messages, &priced, Decision::default(), true);
        prop_assert_eq!(out.report.forced, deep.report.forced);
        if deep.report.tokens_after <= budget {
            prop_assert!(out.report.tokens_after <= budget, "{:?} over {}", out.report, budget);
        }
        let plain = run_priced(&messages, &none, Decision::default(), true);
        // The same cut. (`deepest_only` keeps the whole budget as the room of what stands in
        // for the moved run, so that only the deepest cut is a candidate: counting that room,
        // the deep run may then also compact up to what the model has not read, or squeeze
        // that, where the plain one fits without.)
        prop_assert_eq!(plain.decision.offload_before, deep.decision.offload_before);
        prop_assert_eq!(plain.decision.kept_user, deep.decision.kept_user);
        if plain.decision == deep.decision {
            prop_assert_eq!(plain.messages, deep.messages);
        }
    }
}

/// Tool rounds before any user message (the task has not come yet) stay where they are with
/// `pin_task`: a run moved out then would be pinned back into the head when the task arrives,
/// its marker gone and the prefix rewritten without a boundary move (a case
/// `stable_as_the_conversation_grows` found).
#[test]
fn rounds_before_the_task_are_pinned_until_it_comes() {
    let turns = vec![
        Turn::Tools(vec![322]),
        Turn::Tools(vec![18642]),
        Turn::Tools(vec![206]),
        Turn::User(1),
    ];
    let full = build(&turns, 3477015008764128637);
    let s = settings(Mode::Auto, 3000, 4);
    let mut prior = Decision::default();
    let mut previous: Option<Vec<Value>> = None;
    for end in [3, 5, 7, 8, 9] {
        let messages = &full[..end];
        let outcome = run(messages, &s, prior);
        assert_eq!(
            outcome.decision.offload_before, 0,
            "request of {end} moved out"
        );
        let out = outcome
            .messages
            .clone()
            .unwrap_or_else(|| messages.to_vec());
        assert_eq!(out[1], full[1], "request of {end}");
        if let (Some(prev), true) = (&previous, outcome.decision == prior) {
            assert_eq!(&out[..prev.len()], &prev[..], "request of {end}");
        }
        prior = outcome.decision;
        previous = Some(out);
    }
}
