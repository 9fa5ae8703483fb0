//! Process-wide counters, served at `GET /metrics` in the Prometheus text format.
//!
//! Plain atomics: recording is a relaxed add on the request path, nothing else. The upstream's
//! usage is read by [`crate::response::UsageProbe`].

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Every counter the proxy keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    pub chat_requests: AtomicU64,
    /// Chat requests whose messages the proxy rewrote.
    pub context_rewritten: AtomicU64,
    /// Chat requests forwarded unchanged because the store failed (fail-open).
    pub context_fail_open: AtomicU64,
    /// Chat requests left alone because the conversation was malformed.
    pub context_malformed: AtomicU64,
    pub tokens_before: AtomicU64,
    pub tokens_after: AtomicU64,
    /// Upstream answers whose `usage.prompt_tokens` was read.
    pub usage_samples: AtomicU64,
    /// Σ (upstream's prompt_tokens − proxy's count), and Σ of its absolute value.
    pub usage_diff_sum: AtomicI64,
    pub usage_diff_abs_sum: AtomicU64,
    /// Rounds of the proxy's own tool calls answered (context_read / context_search).
    pub reload_rounds: AtomicU64,
    pub reload_read_ok: AtomicU64,
    pub reload_read_failed: AtomicU64,
    pub reload_search_ok: AtomicU64,
    pub reload_search_failed: AtomicU64,
    /// The summarizer's counters (`context_proxy_summary_*`).
    pub summarizer: std::sync::Arc<crate::summarize::Stats>,
}

impl Metrics {
    /// Records the upstream's billed prompt tokens against the proxy's own count.
    pub fn record_usage(&self, counted: usize, billed: u64) {
        let diff = billed as i64 - counted as i64;
        self.usage_samples.fetch_add(1, Ordering::Relaxed);
        self.usage_diff_sum.fetch_add(diff, Ordering::Relaxed);
        self.usage_diff_abs_sum
            .fetch_add(diff.unsigned_abs(), Ordering::Relaxed);
        tracing::debug!(
            counted,
            billed,
            diff,
            "prompt tokens: proxy count vs upstream usage"
        );
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let counters: [(&str, &str, u64); 13] = [
            (
                "context_proxy_chat_requests_total",
                "Chat-completions requests handled.",
                load(&self.chat_requests),
            ),
            (
                "context_proxy_context_rewritten_total",
                "Chat requests whose messages were rewritten.",
                load(&self.context_rewritten),
            ),
            (
                "context_proxy_context_fail_open_total",
                "Chat requests forwarded unchanged because the store failed.",
                load(&self.context_fail_open),
            ),
            (
                "context_proxy_context_malformed_total",
                "Chat requests left alone because the conversation was malformed.",
                load(&self.context_malformed),
            ),
            (
                "context_proxy_tokens_before_total",
                "Prompt tokens as the clients sent them (proxy count).",
                load(&self.tokens_before),
            ),
            (
                "context_proxy_tokens_after_total",
                "Prompt tokens as forwarded upstream (proxy count).",
                load(&self.tokens_after),
            ),
            (
                "context_proxy_usage_samples_total",
                "Upstream answers whose usage.prompt_tokens was read.",
                load(&self.usage_samples),
            ),
            (
                "context_proxy_usage_diff_abs_tokens_total",
                "Sum of |upstream prompt_tokens - proxy count|.",
                load(&self.usage_diff_abs_sum),
            ),
            (
                "context_proxy_reload_rounds_total",
                "Rounds of the proxy's own tool calls answered before calling the upstream again.",
                load(&self.reload_rounds),
            ),
            (
                "context_proxy_reload_read_ok_total",
                "context_read calls answered with content.",
                load(&self.reload_read_ok),
            ),
            (
                "context_proxy_reload_read_failed_total",
                "context_read calls answered with an error (bad arguments, unknown ref, store down).",
                load(&self.reload_read_failed),
            ),
            (
                "context_proxy_reload_search_ok_total",
                "context_search calls answered with results.",
                load(&self.reload_search_ok),
            ),
            (
                "context_proxy_reload_search_failed_total",
                "context_search calls answered with an error (bad pattern, unknown ref, store down).",
                load(&self.reload_search_failed),
            ),
        ];
        let mut out = String::new();
        for (name, help, value) in counters {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            ));
        }
        let name = "context_proxy_usage_diff_tokens_sum";
        out.push_str(&format!(
            "# HELP {name} Sum of (upstream prompt_tokens - proxy count); negative when the proxy over-counts.\n# TYPE {name} gauge\n{name} {}\n",
            self.usage_diff_sum.load(Ordering::Relaxed)
        ));
        out.push_str(&self.summarizer.render());
        out
    }
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_prometheus_text() {
        let m = Metrics::default();
        m.record_usage(100, 103);
        m.record_usage(100, 98);
        let text = m.render();
        assert!(text.contains("context_proxy_usage_samples_total 2\n"));
        assert!(text.contains("context_proxy_usage_diff_abs_tokens_total 5\n"));
        assert!(text.contains("context_proxy_usage_diff_tokens_sum 1\n"));
    }
}
