//! The sample traffic generator: seeded, deterministic agent sessions in the OpenAI
//! chat-completions format, stored in the corpus format of `context-proxy-corpus`. The
//! context-management benchmark (`cargo bench --bench context`) replays every request of every
//! session through the context engine, in process, to measure the tokens saved; nothing replays
//! it through a running proxy yet.
//!
//! Three kinds of agent are simulated — a coding agent reading large files and running
//! commands, a research agent reading long web pages, a support agent with many short turns —
//! each as the sequence of requests it would send: request `k` is the whole history up to the
//! point where the agent needs a model reply (after a user turn or after tool results). All text
//! is synthesized here; nothing is read from the network or from files. The same configuration
//! gives byte-identical sessions on every platform: the generator has its own PRNG and uses no
//! floating point and no hash-ordered collection.
//!
//! Layout: `rng` (randomness), `words`/`prose`/`code`/`shell`/`records` (content), `chat`
//! (message shapes), `tools` (schemas), `coding`/`research`/`support` (the agents), `cli` (the
//! command). The stored form of a session and the corpus files are the corpus crate's,
//! re-exported here as [`corpus`].

#![forbid(unsafe_code)]

mod chat;
pub mod claude_code;
pub mod cli;
mod code;
mod codex;
mod coding;
mod prose;
mod records;
mod research;
pub mod rng;
mod shell;
mod support;
mod tools;
mod words;

use std::io;
use std::path::Path;

pub use context_proxy_corpus as corpus;
pub use context_proxy_corpus::{load_dir, stats, AgentKind, CorpusIndex, CorpusStats, Session};

pub use cli::{run, GenTrafficArgs};

use chat::{Echo, Transcript};
use rng::Rng;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficConfig {
    /// Seed of everything; the same config gives byte-identical sessions.
    pub seed: u64,
    /// Number of sessions; kinds take turns (coding, research, support, coding, …).
    pub sessions: usize,
    /// Most requests in one session. Session lengths are heavy-tailed: about a third have
    /// under 7% of this, the longest tenth between 70% and 100%.
    pub max_turns: usize,
    /// Longest tool result, in bytes; longer ones are cut at a line end.
    pub max_result_bytes: usize,
    /// The model of every Claude Code session (else one of `claude_code::MODELS`, which do not
    /// bind thinking to the prefix); other shapes ignore it.
    pub model: Option<String>,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            seed: 42,
            sessions: 30,
            max_turns: 300,
            max_result_bytes: 400_000,
            model: None,
        }
    }
}

/// Length strata in permille of `max_turns`, visited in this fixed order by session index, so
/// that every ten consecutive sessions cover every stratum and, with kinds taking turns, every
/// kind gets short and long sessions.
const STRATA: [u64; 10] = [3, 8, 0, 5, 9, 1, 6, 2, 7, 4];

/// Heavy-tailed length curve: (permille of sessions, permille of `max_turns`).
const LENGTH_CURVE: [(u64, u64); 5] = [(0, 10), (350, 70), (650, 200), (850, 500), (1000, 1000)];

fn session_length(rng: &mut Rng, index: usize, max_turns: usize) -> usize {
    let q = STRATA[index % STRATA.len()] * 100 + rng.below(100);
    let mut share = 1000;
    for pair in LENGTH_CURVE.windows(2) {
        let ((q0, v0), (q1, v1)) = (pair[0], pair[1]);
        if q < q1 {
            share = v0 + (v1 - v0) * (q - q0) / (q1 - q0);
            break;
        }
    }
    ((max_turns as u64 * share / 1000) as usize).clamp(2.min(max_turns.max(1)), max_turns.max(1))
}

/// Session number `index` of the corpus `cfg` describes. It depends on the seed and the index
/// only, not on how many sessions are generated.
pub fn generate_session(cfg: &TrafficConfig, index: usize) -> Session {
    let kind = AgentKind::ALL[index % AgentKind::ALL.len()];
    let mut rng = Rng::derive(cfg.seed, index as u64);
    let requests = session_length(&mut rng, index, cfg.max_turns);
    let (models, stream_percent): (&[&str], u32) = match kind {
        AgentKind::Coding => (coding::MODELS, 60),
        AgentKind::Research => (research::MODELS, 40),
        AgentKind::Support => (support::MODELS, 70),
    };
    let model = rng.pick(models).to_string();
    let stream = rng.chance(stream_percent);
    let echo = if rng.chance(35) {
        Echo::Full
    } else {
        Echo::Minimal
    };
    let mut t = Transcript::new(echo, cfg.max_result_bytes);
    match kind {
        AgentKind::Coding => coding::run(&mut rng, &mut t, requests),
        AgentKind::Research => research::run(&mut rng, &mut t, requests),
        AgentKind::Support => support::run(&mut rng, &mut t, requests),
    }
    let (messages, request_ends) = t.finish();
    Session {
        wire: corpus::Wire::Chat,
        instructions: None,
        id: format!("{index:03}-{kind}"),
        kind,
        model,
        tools: tools::schemas(kind),
        stream,
        messages,
        request_ends,
        fields: None,
        mark_newest: false,
    }
}

/// Support-desk session number `index` of `cfg`'s seed: the shape where context management
/// pays least — a long fixed policy prompt and 20 tool schemas pinned at the head of every
/// request, then 5 to 30 requests of short turns (a sentence or two, small JSON tool
/// results). `max_turns` and `max_result_bytes` do not apply.
pub fn generate_support_session(cfg: &TrafficConfig, index: usize) -> Session {
    // A stream of its own, so the mixed corpus of the same seed is unchanged.
    let mut rng = Rng::derive(cfg.seed ^ SUPPORT_STREAM, index as u64);
    let requests = rng.between(5, 30);
    let model = rng.pick(support::MODELS).to_string();
    let stream = rng.chance(70);
    let mut t = Transcript::new(Echo::Minimal, cfg.max_result_bytes);
    support::run_desk(&mut rng, &mut t, requests);
    let (messages, request_ends) = t.finish();
    Session {
        wire: corpus::Wire::Chat,
        instructions: None,
        id: format!("{index:03}-desk"),
        kind: AgentKind::Support,
        model,
        tools: tools::desk(),
        stream,
        messages,
        request_ends,
        fields: None,
        mark_newest: false,
    }
}

/// Codex session number `index` of `cfg`'s seed: a coding session written the way Codex CLI
/// sends it on the Responses API (`codex.rs`), between 40 requests and `max_turns`.
pub fn generate_codex_session(cfg: &TrafficConfig, index: usize) -> Session {
    codex::session(cfg.seed, index, cfg.max_turns, cfg.max_result_bytes)
}

/// Separates the support desk's random streams from the mixed corpus's.
const SUPPORT_STREAM: u64 = 0x5eed_de5c;

/// Traffic shapes `gen-traffic` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Shape {
    /// Coding, research and support sessions taking turns ([`generate`]).
    #[default]
    Mixed,
    /// Support-desk sessions only ([`generate_support_session`]).
    Support,
    /// Codex-shaped coding sessions on the Responses API, 40 requests and more each
    /// ([`generate_codex_session`]).
    Codex,
    /// Claude Code sessions on Anthropic Messages ([`claude_code::generate_session`]).
    ClaudeCode,
}

/// Every session of `shape` for `cfg`, in index order; Claude Code's thinking blocks are
/// signed by `sign` (the upstream's signer, [`claude_code::Signer`]).
pub fn generate_shape(
    cfg: &TrafficConfig,
    shape: Shape,
    sign: claude_code::Signer<'_>,
) -> Vec<Session> {
    match shape {
        Shape::Mixed => generate(cfg),
        Shape::Support => (0..cfg.sessions)
            .map(|i| generate_support_session(cfg, i))
            .collect(),
        Shape::Codex => (0..cfg.sessions)
            .map(|i| generate_codex_session(cfg, i))
            .collect(),
        Shape::ClaudeCode => (0..cfg.sessions)
            .map(|i| claude_code::generate_session(cfg, i, sign))
            .collect(),
    }
}

/// Every session of the corpus `cfg` describes, in index order.
pub fn generate(cfg: &TrafficConfig) -> Vec<Session> {
    (0..cfg.sessions)
        .map(|i| generate_session(cfg, i))
        .collect()
}

/// Writes `sessions`, generated from `cfg`, as a corpus into `dir` (created if missing), with
/// `cfg`'s seed and `max_turns` in its index, and returns the index.
pub fn write_dir(dir: &Path, cfg: &TrafficConfig, sessions: &[Session]) -> io::Result<CorpusIndex> {
    let origin = corpus::Origin {
        seed: Some(cfg.seed),
        max_turns: Some(cfg.max_turns),
    };
    corpus::write_dir(dir, origin, sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> TrafficConfig {
        TrafficConfig {
            seed: 7,
            sessions: 6,
            max_turns: 40,
            max_result_bytes: 50_000,
            model: None,
        }
    }

    #[test]
    fn lengths_follow_the_curve_and_cover_every_stratum() {
        let mut rng = Rng::new(1);
        let lengths: Vec<usize> = (0..10).map(|i| session_length(&mut rng, i, 300)).collect();
        assert!(
            lengths.iter().all(|&n| (2..=300).contains(&n)),
            "{lengths:?}"
        );
        assert!(lengths.iter().any(|&n| n < 10), "{lengths:?}");
        assert!(lengths.iter().any(|&n| n > 200), "{lengths:?}");
        assert_eq!(session_length(&mut rng, 0, 1), 1);
    }

    #[test]
    fn sessions_have_their_length_and_are_valid() {
        let cfg = small();
        let mut rng_lengths = Vec::new();
        for (i, s) in generate(&cfg).iter().enumerate() {
            s.validate().unwrap();
            let mut rng = Rng::derive(cfg.seed, i as u64);
            rng_lengths.push(session_length(&mut rng, i, cfg.max_turns));
            assert_eq!(s.request_count(), rng_lengths[i], "{}", s.id);
            assert!(s.tool_results().all(|r| r.len() <= cfg.max_result_bytes));
        }
    }

    #[test]
    fn a_session_does_not_depend_on_the_corpus_size() {
        let cfg = small();
        let more = TrafficConfig {
            sessions: 9,
            ..small()
        };
        assert_eq!(generate(&cfg)[4], generate(&more)[4]);
    }
}
