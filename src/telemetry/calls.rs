//! Every upstream call the proxy made for the requests it manages, by why it made it
//! (`forwarded`, `reload`, `retry`, `summarizer`): calls, input tokens and cost, served at
//! `/metrics` as `context_proxy_calls_total{kind}`, `context_proxy_call_input_tokens_total{kind}`
//! and `context_proxy_call_cost_tokens_total{kind}`. Callers hand over the kind's name and
//! the figures (the bill is priced by `crate::pricing::Bill`); a name not in [`KINDS`] is
//! not counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of call, in the order they are served.
pub const KINDS: [&str; 4] = ["forwarded", "reload", "retry", "summarizer"];

/// Costs are kept in thousandths of a full-price input token.
const MILLI: f64 = 1000.0;

#[derive(Debug, Default)]
struct Kind {
    calls: AtomicU64,
    input_tokens: AtomicU64,
    cost_milli: AtomicU64,
}

/// The counters of each kind of call.
#[derive(Debug, Default)]
pub struct CallStats {
    kinds: [Kind; 4],
}

/// One kind's figures, as read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindFigures {
    pub kind: &'static str,
    pub calls: u64,
    pub input_tokens: u64,
    /// In full-price input tokens of the requests' models.
    pub cost: f64,
}

impl CallStats {
    /// Counts one call of `kind` with `input_tokens` in, costing `cost` full-price input
    /// tokens of its request's model.
    pub fn record(&self, kind: &str, input_tokens: usize, cost: f64) {
        let Some(k) = KINDS.iter().position(|&n| n == kind) else {
            return;
        };
        let k = &self.kinds[k];
        k.calls.fetch_add(1, Ordering::Relaxed);
        k.input_tokens
            .fetch_add(input_tokens as u64, Ordering::Relaxed);
        let milli = (cost.max(0.0) * MILLI).round();
        k.cost_milli.fetch_add(milli as u64, Ordering::Relaxed);
    }

    /// Every kind's figures so far, in [`KINDS`]' order.
    pub fn figures(&self) -> [KindFigures; 4] {
        std::array::from_fn(|i| {
            let k = &self.kinds[i];
            KindFigures {
                kind: KINDS[i],
                calls: k.calls.load(Ordering::Relaxed),
                input_tokens: k.input_tokens.load(Ordering::Relaxed),
                cost: k.cost_milli.load(Ordering::Relaxed) as f64 / MILLI,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_add_up_by_kind_and_unknown_kinds_are_not_counted() {
        let stats = CallStats::default();
        stats.record("reload", 1_000, 250.5);
        stats.record("reload", 500, 100.25);
        stats.record("summarizer", 200, 12.0);
        stats.record("something", 1, 1.0);
        let f = stats.figures();
        assert_eq!(f[1].kind, "reload");
        assert_eq!((f[1].calls, f[1].input_tokens), (2, 1_500));
        assert!((f[1].cost - 350.75).abs() < 1e-9);
        assert_eq!((f[3].calls, f[3].input_tokens), (1, 200));
        assert_eq!(f[0].calls + f[2].calls, 0);
    }
}
