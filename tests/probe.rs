//! The fidelity probe through the real proxy and the mock in reader mode: every needle is
//! reachable with compaction forced, and not when the proxy may not offer its tools.

mod common;

use common::Harness;
use context_proxy::app::config::Config;
use context_proxy::mock::MockConfig;
use context_proxy_drive::fidelity::{plant, probe, sample_sessions, ProbeRun};

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
