//! The fidelity probe through the real proxy and the mock in reader mode: every needle is
//! reachable with compaction forced, and not when the proxy may not offer its tools; on chat
//! completions and in Codex-shaped sessions on the Responses API (read back with
//! `context_read`).

mod common;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::mock::MockConfig;
use context_proxy_drive::fidelity::{
    plant, probe, sample_codex_sessions, sample_sessions, url_for, ProbeRun,
};

fn forced(reload: bool) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 1000;
        c.context.tool_result_max_tokens = 300;
        c.context.reload.enabled = reload;
    }
}

async fn run(reload: bool, off: bool) -> ProbeRun {
    let mock = MockConfig {
        reader: true,
        ..MockConfig::default()
    };
    let h = Harness::start_with(mock, forced(reload)).await;
    let mut sessions = sample_sessions(6, 42);
    let needles = plant(&mut sessions);
    assert!(needles.len() >= 8, "{needles:?}");
    let url = h.url("/v1/chat/completions");
    probe(
        &h.client,
        &url,
        "sk-test-client",
        &sessions,
        &needles,
        off,
        None,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn every_needle_is_reachable_through_the_proxys_tools() {
    let run = run(true, false).await;
    assert!(run.rewritten > 0, "nothing was compacted: {run:?}");
    assert!(run.reload_rounds > 0, "the tools were never used: {run:?}");
    let missed: Vec<_> = run.needles.iter().filter(|n| !n.found).collect();
    assert!(missed.is_empty(), "{missed:?}");
    assert_eq!(run.recall, 1.0);
}

#[tokio::test]
async fn without_the_proxys_tools_compacted_needles_are_lost() {
    let run = run(false, false).await;
    assert!(run.rewritten > 0);
    assert!(run.recall < 1.0, "{run:?}");
    // The same sessions unmanaged show everything (and cost more).
    let off = run_off().await;
    assert_eq!(off.recall, 1.0);
    assert!(off.input_tokens > run.input_tokens);
}

async fn run_off() -> ProbeRun {
    run(true, true).await
}

/// The probe on two Codex-shaped sessions (40 requests each) through `/v1/responses`.
async fn run_codex(reload: bool) -> (ProbeRun, Vec<serde_json::Value>) {
    let mock = MockConfig {
        reader: true,
        ..MockConfig::default()
    };
    // The reader reads every stored output back whole, several at once: one call returns a
    // whole output (they are at most 80 KB) and the rounds suffice for a session's dozens.
    let h = Harness::start_with(mock, |c: &mut Config| {
        forced(reload)(c);
        c.context.reload.read_max_tokens = 32_000;
        c.context.reload.max_calls_per_round = 32;
    })
    .await;
    let mut sessions = sample_codex_sessions(2, 42);
    let needles = plant(&mut sessions);
    assert_eq!(needles.len(), 8, "{needles:?}");
    let url = url_for(&h.url("/v1"), &sessions);
    assert!(url.ends_with("/v1/responses"), "{url}");
    let run = probe(
        &h.client,
        &url,
        "sk-test-client",
        &sessions,
        &needles,
        false,
        None,
    )
    .await
    .unwrap();
    let received = h.mock.received().iter().map(|r| r.json()).collect();
    (run, received)
}

#[tokio::test]
async fn every_needle_of_a_codex_session_is_read_back_with_context_read() {
    let (run, received) = run_codex(true).await;
    assert!(run.rewritten > 0, "nothing was compacted: {run:?}");
    assert!(run.reload_rounds > 0, "the tools were never used: {run:?}");
    let missed: Vec<_> = run.needles.iter().filter(|n| !n.found).collect();
    assert!(missed.is_empty(), "{missed:?}");
    // Found by reading: the upstream got the proxy's context_read pages back.
    let pages = received
        .iter()
        .flat_map(|body| body["input"].as_array().cloned().unwrap_or_default())
        .filter(|item| {
            item["type"] == "function_call_output"
                && item["output"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("[context_read ctx_"))
        })
        .count();
    assert!(pages > 0);
}

#[tokio::test]
async fn without_the_proxys_tools_a_codex_sessions_needles_are_lost() {
    let (run, _) = run_codex(false).await;
    assert!(run.rewritten > 0);
    assert!(run.recall < 1.0, "{run:?}");
}
