//! Process-wide counters, served at `GET /metrics` in the Prometheus text format.
//!
//! Plain atomics: recording is a relaxed add on the request path, nothing else.

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
        let counters: [(&str, &str, u64); 8] = [
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
        out
    }
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Finds the last `"prompt_tokens":N` in a body as it streams past, chunk by chunk, keeping
/// only a short tail of the previous chunk (no buffering of the body).
#[derive(Debug, Default)]
pub struct UsageProbe {
    tail: Vec<u8>,
    found: Option<u64>,
}

const KEY: &[u8] = b"\"prompt_tokens\":";

impl UsageProbe {
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        let mut at = 0;
        while let Some(pos) = find(&window[at..], KEY) {
            let start = at + pos + KEY.len();
            let digits: Vec<u8> = window[start..]
                .iter()
                .skip_while(|b| **b == b' ')
                .take_while(|b| b.is_ascii_digit())
                .copied()
                .collect();
            let complete = window[start..]
                .iter()
                .skip_while(|b| **b == b' ')
                .nth(digits.len())
                .is_some();
            if complete {
                if let Ok(n) = std::str::from_utf8(&digits).unwrap_or("").parse() {
                    self.found = Some(n);
                }
                at = start;
            } else {
                // The number may go on in the next chunk: keep it for then.
                self.tail = window[at + pos..].to_vec();
                return;
            }
        }
        let keep = window.len().saturating_sub(KEY.len() + 24);
        self.tail = window[keep..].to_vec();
    }

    /// The last `prompt_tokens` seen, if any.
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.found
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_finds_usage_split_across_chunks() {
        let body = br#"data: {"choices":[],"usage":{"prompt_tokens":1234,"completion_tokens":5}}"#;
        for cut in 0..body.len() {
            let mut p = UsageProbe::default();
            p.feed(&body[..cut]);
            p.feed(&body[cut..]);
            assert_eq!(p.prompt_tokens(), Some(1234), "cut at {cut}");
        }
        let mut p = UsageProbe::default();
        p.feed(br#"{"usage":null} {"text":"no usage here"}"#);
        assert_eq!(p.prompt_tokens(), None);
    }

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
