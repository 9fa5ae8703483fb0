//! The sample traffic corpus: deterministic, valid chat-completions traffic of the three agent
//! kinds with the size spread the benchmarks rely on, and a lossless round trip through files.

use std::sync::OnceLock;

use context_proxy_traffic::{self as traffic, AgentKind, Session, TrafficConfig};
use serde_json::Value;

/// The default corpus, generated once for all tests of this file.
fn default_corpus() -> &'static [Session] {
    static CORPUS: OnceLock<Vec<Session>> = OnceLock::new();
    CORPUS.get_or_init(|| traffic::generate(&TrafficConfig::default()))
}

fn small(seed: u64) -> TrafficConfig {
    TrafficConfig {
        seed,
        sessions: 9,
        max_turns: 60,
        max_result_bytes: 100_000,
        model: None,
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("context-proxy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn same_seed_gives_byte_identical_files_and_another_seed_does_not() {
    let (a, b, c) = (
        temp_dir("traffic-a"),
        temp_dir("traffic-b"),
        temp_dir("traffic-c"),
    );
    traffic::write_dir(&a, &small(1), &traffic::generate(&small(1))).unwrap();
    traffic::write_dir(&b, &small(1), &traffic::generate(&small(1))).unwrap();
    traffic::write_dir(&c, &small(2), &traffic::generate(&small(2))).unwrap();
    let index = traffic::corpus::read_index(&a).unwrap();
    let mut names: Vec<String> = index.files.iter().map(|f| f.file.clone()).collect();
    names.push("index.json".into());
    let mut differ = 0;
    for name in &names {
        let bytes_a = std::fs::read(a.join(name)).unwrap();
        assert_eq!(bytes_a, std::fs::read(b.join(name)).unwrap(), "{name}");
        if std::fs::read(c.join(name)).map_or(true, |bytes_c| bytes_c != bytes_a) {
            differ += 1;
        }
    }
    assert_eq!(differ, names.len());
    for dir in [a, b, c] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// SHA-256 of the default corpus's session files. Benchmarks compare runs on this corpus, so
/// a change to the generator that changes it must be deliberate: update the digest and say so.
const DEFAULT_CORPUS_SHA256: &str =
    "d83a54cdb2ee192301a285e39e0de457a564cd7a9450680119f779131b085aba";

#[test]
fn the_default_corpus_is_pinned() {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for s in default_corpus() {
        hasher.update(serde_json::to_vec(s).unwrap());
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, DEFAULT_CORPUS_SHA256);
    assert_eq!(
        traffic::generate_session(&TrafficConfig::default(), 4),
        default_corpus()[4]
    );
}

#[test]
fn every_session_is_a_valid_conversation() {
    for s in default_corpus() {
        s.validate().unwrap();
        for k in [0, s.request_count() - 1] {
            let r = s.request(k);
            let messages = r["messages"].as_array().unwrap();
            let last = messages.last().unwrap();
            assert!(last["role"] == "user" || last["role"] == "tool", "{}", s.id);
            assert_eq!(r["model"], s.model.as_str());
            assert_eq!(r["tools"], s.tools);
            assert_eq!(r.get("stream").is_some(), s.stream);
        }
    }
}

#[test]
fn tool_calls_are_answered_in_order_and_no_tool_message_is_orphaned() {
    for s in default_corpus() {
        let mut pending: Vec<String> = Vec::new();
        for m in &s.messages {
            match m["role"].as_str().unwrap() {
                "assistant" => {
                    assert!(pending.is_empty(), "{}: unanswered calls {pending:?}", s.id);
                    for call in m["tool_calls"].as_array().into_iter().flatten() {
                        let args: Value =
                            serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
                                .unwrap();
                        assert!(args.is_object());
                        pending.push(call["id"].as_str().unwrap().to_string());
                    }
                }
                "tool" => {
                    assert!(!pending.is_empty(), "{}: orphan tool message", s.id);
                    assert_eq!(m["tool_call_id"], pending.remove(0).as_str());
                    assert!(m["content"].is_string());
                }
                _ => assert!(pending.is_empty(), "{}: calls interrupted", s.id),
            }
        }
        assert!(pending.is_empty());
    }
}

#[test]
fn request_ends_increase_and_end_on_user_or_tool() {
    for s in default_corpus() {
        assert!(s.request_ends.windows(2).all(|w| w[0] < w[1]), "{}", s.id);
        for &end in &s.request_ends {
            let role = &s.messages[end - 1]["role"];
            assert!(role == "user" || role == "tool", "{}", s.id);
            assert_eq!(s.messages[end]["role"], "assistant");
        }
    }
}

#[test]
fn the_default_corpus_has_the_promised_shape() {
    let corpus = default_corpus();
    let stats = traffic::stats(corpus);
    for kind in AgentKind::ALL {
        assert_eq!(stats.kinds[&kind], 10, "{kind}");
        let longest = corpus
            .iter()
            .filter(|s| s.kind == kind)
            .map(Session::request_count)
            .max();
        assert!(longest.unwrap() >= 150, "{kind}: {longest:?}");
    }
    assert!(stats.longest_session_requests >= 200 && stats.longest_session_requests <= 300);
    assert!(corpus.iter().any(|s| s.request_count() < 10));
    assert!(stats.smallest_tool_result_bytes < 16);
    assert!(stats.largest_tool_result_bytes > 100_000);
    assert!(stats.largest_tool_result_bytes <= TrafficConfig::default().max_result_bytes);
    assert!(
        stats.tool_result_sizes.iter().all(|b| b.count > 0),
        "{:?}",
        stats.tool_result_sizes
    );
    assert!(
        stats.stored_bytes > 10_000_000 && stats.stored_bytes < 80_000_000,
        "{}",
        stats.stored_bytes
    );
    // Parallel calls, text parts, SDK-style echoes, developer prompts and streams all occur.
    let all = || corpus.iter().flat_map(|s| s.messages.iter());
    assert!(all().any(|m| m["tool_calls"].as_array().is_some_and(|c| c.len() >= 3)));
    assert!(all().any(|m| m["role"] == "user" && m["content"].is_array()));
    assert!(all().any(|m| m["role"] == "assistant" && m.get("refusal").is_some()));
    assert!(all().any(|m| m["role"] == "developer"));
    assert!(all()
        .any(|m| m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.contains('的'))));
    assert!(corpus.iter().any(|s| s.stream) && corpus.iter().any(|s| !s.stream));
}

#[test]
fn write_then_load_gives_the_same_sessions() {
    let dir = temp_dir("traffic-roundtrip");
    let sessions = traffic::generate(&small(3));
    let index = traffic::write_dir(&dir, &small(3), &sessions).unwrap();
    assert_eq!(index.files.len(), sessions.len());
    assert_eq!(index.stats, traffic::stats(&sessions));
    assert_eq!(traffic::load_dir(&dir).unwrap(), sessions);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Support-desk sessions: the shape the issue of costs describes — a long fixed policy prompt
/// and 10 to 20 tool schemas pinned at the head, then 5 to 30 requests of short turns with
/// small JSON tool results; independent of the mixed corpus of the same seed.
#[test]
fn support_desk_sessions_have_the_promised_shape() {
    use context_proxy_tokens::{CountSettings, Counter, Encoding};
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let cfg = TrafficConfig {
        sessions: 40,
        ..TrafficConfig::default()
    };
    let sessions = traffic::generate_shape(&cfg, traffic::Shape::Support, &unsigned);
    assert_eq!(sessions.len(), 40);
    let system = &sessions[0].messages[0];
    let policy = counter.count_message(system);
    assert!(
        (1_000..1_500).contains(&policy),
        "policy of {policy} tokens"
    );
    let mut lengths = Vec::new();
    for s in &sessions {
        s.validate().unwrap();
        assert_eq!(s.kind, AgentKind::Support);
        // The same policy and tools in every session.
        assert_eq!(&s.messages[0], system);
        let tools = s.tools.as_array().unwrap();
        assert!((10..=20).contains(&tools.len()), "{} tools", tools.len());
        let schemas = counter
            .count_request(
                &serde_json::json!({"model": "gpt-4o", "messages": [], "tools": s.tools}),
            )
            .tools;
        assert!(
            (2_000..3_000).contains(&schemas),
            "{schemas} tokens of schemas"
        );
        lengths.push(s.request_count());
        for m in &s.messages[1..] {
            let tokens = counter.count_message(m);
            match m["role"].as_str().unwrap() {
                "tool" => {
                    assert!(tokens < 600, "a tool result of {tokens} tokens");
                    let text = m["content"].as_str().unwrap();
                    assert!(serde_json::from_str::<Value>(text).is_ok(), "{text}");
                }
                "user" | "assistant" => assert!(tokens < 200, "{m}"),
                _ => {}
            }
        }
    }
    assert!(lengths.iter().all(|n| (5..=30).contains(n)), "{lengths:?}");
    assert!(
        lengths.iter().any(|&n| n < 10) && lengths.iter().any(|&n| n > 24),
        "{lengths:?}"
    );
    // Deterministic, and the mixed corpus of the seed is untouched.
    assert_eq!(
        traffic::generate_shape(&cfg, traffic::Shape::Support, &unsigned),
        sessions
    );
    assert_eq!(
        traffic::generate_shape(&cfg, traffic::Shape::Mixed, &unsigned),
        traffic::generate(&cfg)
    );
}

/// A thinking block the shapes other than Claude Code's never ask for.
fn unsigned(_: &serde_json::Value, text: &str) -> serde_json::Value {
    serde_json::json!({"type": "thinking", "thinking": text, "signature": ""})
}
