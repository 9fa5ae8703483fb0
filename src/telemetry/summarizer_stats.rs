//! The summarizer's counters, served at `/metrics` with the rest.

use std::sync::atomic::{AtomicU64, Ordering};

/// Summarizer calls and what became of them.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls to the summarizer model (a retry counts again).
    pub calls: AtomicU64,
    pub latency_ms_sum: AtomicU64,
    pub tokens_in: AtomicU64,
    pub tokens_out: AtomicU64,
    /// Summaries that could not be made (error, timeout, malformed twice).
    pub failed: AtomicU64,
    pub timeouts: AtomicU64,
    /// Malformed answers (each one, retried or not).
    pub malformed: AtomicU64,
    /// Summaries over `max_summary_tokens`, cut to it before they were remembered.
    pub cut: AtomicU64,
    /// Requests whose moved-out span had its summary ready.
    pub hits: AtomicU64,
    /// Requests that waited for a summary and got it.
    pub computed: AtomicU64,
    /// Requests whose moved-out span went without its summary (the marker stands).
    pub fallbacks: AtomicU64,
    /// Summaries not asked for, ahead of time or for a moved-out span, because they would
    /// cost more than going direct saves (the plain marker stands).
    pub unpaid: AtomicU64,
    pub background_started: AtomicU64,
    pub background_completed: AtomicU64,
    pub background_failed: AtomicU64,
    /// Background summaries not queued because the queue was full.
    pub background_dropped: AtomicU64,
    /// Every upstream call's counters (`context_proxy_calls_*`), shared with the metrics: the
    /// summarizer counts its calls there, the background ones too.
    pub every_call: std::sync::Arc<super::calls::CallStats>,
}

impl Stats {
    pub fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_n(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Every counter: its name (after `context_proxy_summary_`), help text and value.
    pub fn entries(&self) -> [(&'static str, &'static str, &AtomicU64); 16] {
        [
            ("calls", "Summarizer model calls.", &self.calls),
            (
                "latency_ms_sum",
                "Summed latency of summarizer calls, ms.",
                &self.latency_ms_sum,
            ),
            (
                "tokens_in",
                "Prompt tokens of summarizer calls.",
                &self.tokens_in,
            ),
            (
                "tokens_out",
                "Completion tokens of summarizer calls.",
                &self.tokens_out,
            ),
            (
                "failed",
                "Summaries not made (error, timeout, malformed).",
                &self.failed,
            ),
            (
                "timeouts",
                "Summarizer calls that timed out.",
                &self.timeouts,
            ),
            (
                "malformed",
                "Malformed summarizer answers.",
                &self.malformed,
            ),
            (
                "cut",
                "Summaries over max_summary_tokens, cut to it.",
                &self.cut,
            ),
            (
                "cache_hits",
                "Requests whose summary was ready.",
                &self.hits,
            ),
            (
                "computed",
                "Requests that waited for their summary and got it.",
                &self.computed,
            ),
            (
                "fallbacks",
                "Requests whose moved-out span went without its summary.",
                &self.fallbacks,
            ),
            (
                "unpaid",
                "Summaries not asked for: they would cost more than going direct saves.",
                &self.unpaid,
            ),
            (
                "background_started",
                "Background summaries queued.",
                &self.background_started,
            ),
            (
                "background_completed",
                "Background summaries made or found made.",
                &self.background_completed,
            ),
            (
                "background_failed",
                "Background summaries that failed.",
                &self.background_failed,
            ),
            (
                "background_dropped",
                "Background summaries dropped (queue full).",
                &self.background_dropped,
            ),
        ]
    }
}
