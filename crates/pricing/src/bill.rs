//! Every upstream call made for one client request, by why it was made, and what it costs.
//!
//! A request the proxy manages may cost more than the one call the client asked for: a round
//! of the proxy's own tools resends the conversation (mostly cached) with the model's call and
//! its result at the end, a summary is a call of the summarizer model, an overflow retries the
//! request smaller. "Cheaper than going direct" holds only with them, so the proxy's response
//! headers, its metrics, the page and the replay's report all put each call on one bill,
//! priced here, once.
//!
//! Costs are in full-price input tokens of the request's model (as every figure of this
//! crate): a call of the conversation under the provider's prompt caching
//! ([`CachePricing::call_cost`]), plus the output the proxy pays for that the client never sees
//! (a reload round carries the model's hidden call of the proxy's tools that asked for it, at
//! the model's output price); the client's own answer is the same going direct and is not
//! counted. A summarizer call at its model's list prices, input and output, never cached
//! ([`ModelPrice::relative_cost`]). A call the upstream refused as too long is on the bill
//! (it was made) at no cost: providers bill the `usage` of an answer, and a refusal has none
//! ([`Call::refused`]).

use serde::{Deserialize, Serialize};

use crate::{CachePricing, ModelPrice};

/// Why the proxy made an upstream call for a client request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// The request as forwarded (one per client request; going direct, every call).
    Forwarded,
    /// A round of the proxy's own tools: the conversation again, with the proxy's call of
    /// `context_read` / `context_search` and its result at the end.
    Reload,
    /// The same client request sent again, smaller, after "context too long".
    Retry,
    /// A summary of a moved-out span, by the summarizer model.
    Summarizer,
}

impl CallKind {
    /// Every kind, in the order the bill lists them.
    pub const ALL: [CallKind; 4] = [
        CallKind::Forwarded,
        CallKind::Reload,
        CallKind::Retry,
        CallKind::Summarizer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Forwarded => "forwarded",
            CallKind::Reload => "reload",
            CallKind::Retry => "retry",
            CallKind::Summarizer => "summarizer",
        }
    }
}

/// One upstream call, by the proxy's count of what it sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub kind: CallKind,
    /// Input tokens sent.
    pub tokens: usize,
    /// Of those, the prefix the conversation's previous call sent too, byte for byte (read
    /// from the provider's cache when it is long enough).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared: usize,
    /// Output tokens the proxy pays for that the client never sees: a summary's, or on a reload
    /// round the model's hidden output before it (its call of the proxy's tools); 0 for a call
    /// whose answer is the client's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output: usize,
    /// The upstream refused it as too long (a 400 or 413 saying the context is exceeded): it
    /// was made, and costs nothing. Providers bill what an answer's `usage` reports, and an
    /// error has none: OpenAI's error object is `{"error": {message, type, param, code}}` only
    /// (`ErrorResponse` in openai/openai-openapi), Anthropic's `{"type": "error", "error":
    /// {type, message}}` only (docs.anthropic.com/en/api/errors); an overflow is refused before
    /// the model runs. (Azure OpenAI's content filter is the documented exception, a 400 that is
    /// billed because the prompt was evaluated: learn.microsoft.com, "Content filtering"; not a
    /// length refusal.)
    #[serde(default, skip_serializing_if = "is_false")]
    pub refused: bool,
    /// The model called, when it is not the request's (the summarizer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Call {
    /// A call of the conversation's model: `tokens` sent, `shared` of them as its previous call.
    pub fn conversation(kind: CallKind, tokens: usize, shared: usize) -> Call {
        Call {
            kind,
            tokens,
            shared: shared.min(tokens),
            output: 0,
            refused: false,
            model: None,
        }
    }

    /// The same call with `output` hidden output tokens the proxy pays for.
    pub fn with_output(self, output: usize) -> Call {
        Call { output, ..self }
    }

    /// A call of the summarizer `model`: `input` tokens in, `output` out.
    pub fn summarizer(model: &str, input: usize, output: usize) -> Call {
        Call {
            kind: CallKind::Summarizer,
            tokens: input,
            shared: 0,
            output,
            refused: false,
            model: Some(model.to_string()),
        }
    }

    /// Its cost in full-price input tokens of `unit_model`, the request's model, whose
    /// provider caches as `cache` (see the module's doc).
    pub fn cost(&self, cache: &CachePricing, unit_model: &str) -> f64 {
        if self.refused {
            return 0.0;
        }
        match (&self.model, self.kind) {
            (Some(model), _) => {
                ModelPrice::relative_cost(model, unit_model, self.tokens, self.output)
            }
            (None, CallKind::Summarizer) => {
                ModelPrice::relative_cost(unit_model, unit_model, self.tokens, self.output)
            }
            (None, _) => {
                cache.call_cost(self.tokens, self.shared)
                    + ModelPrice::relative_cost(unit_model, unit_model, 0, self.output)
            }
        }
    }
}

/// The calls of one client request, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bill {
    pub calls: Vec<Call>,
}

/// One kind's line of a [`Bill`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KindTotal {
    pub calls: usize,
    pub tokens: usize,
    pub cost: f64,
}

impl Bill {
    pub fn push(&mut self, call: Call) {
        self.calls.push(call);
    }

    /// Marks the last call of the conversation's model as refused as too long (it costs
    /// nothing: [`Call::refused`]).
    pub fn refuse_last(&mut self) {
        if let Some(call) = self
            .calls
            .iter_mut()
            .rev()
            .find(|c| c.kind != CallKind::Summarizer)
        {
            call.refused = true;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Calls of `kind`.
    pub fn count(&self, kind: CallKind) -> usize {
        self.calls.iter().filter(|c| c.kind == kind).count()
    }

    /// The tokens of the last call of the conversation's model (what the next round extends).
    pub fn last_sent(&self) -> Option<usize> {
        self.calls
            .iter()
            .rev()
            .find(|c| c.kind != CallKind::Summarizer)
            .map(|c| c.tokens)
    }

    /// The forwarded request counted again from the bytes the upstream received (the page's
    /// journal writer does, off the request path, as the replay's report counts every call):
    /// it sent `tokens`, `shared` of them its previous call's prefix parts
    /// (`tokens::shared_prefix`), and `outside` of them are in no part (the reply priming:
    /// what ends a request, never a prefix). The rounds of the proxy's tools after it move by
    /// the same difference, each sharing all of the previous call's parts (its tokens less
    /// `outside`) unless it shared nothing (the tools withdrawn). A bill whose request was
    /// retried, or that does not start with the forwarded request, is left as it is.
    pub fn recount_forwarded(&mut self, tokens: usize, shared: usize, outside: usize) {
        let mut calls = self
            .calls
            .iter_mut()
            .filter(|c| c.kind != CallKind::Summarizer);
        let Some(first) = calls.next() else { return };
        if first.kind != CallKind::Forwarded {
            return;
        }
        let rest: Vec<&mut Call> = calls.collect();
        if rest.iter().any(|c| c.kind != CallKind::Reload) {
            return;
        }
        let moved = tokens as i64 - first.tokens as i64;
        first.tokens = tokens;
        first.shared = shared.min(tokens);
        let mut previous = tokens;
        for call in rest {
            call.tokens = (call.tokens as i64 + moved).max(0) as usize;
            if call.shared > 0 {
                call.shared = previous.saturating_sub(outside).min(call.tokens);
            }
            previous = call.tokens;
        }
    }

    /// The tokens the forwarded request sent (its first call), when it is on the bill.
    pub fn forwarded_tokens(&self) -> Option<usize> {
        self.calls
            .iter()
            .find(|c| c.kind == CallKind::Forwarded)
            .map(|c| c.tokens)
    }

    /// The whole bill, in full-price input tokens of `unit_model` ([`Call::cost`]).
    pub fn cost(&self, cache: &CachePricing, unit_model: &str) -> f64 {
        self.calls.iter().map(|c| c.cost(cache, unit_model)).sum()
    }

    /// Calls, input tokens and cost of each kind, in [`CallKind::ALL`]'s order.
    pub fn by_kind(&self, cache: &CachePricing, unit_model: &str) -> [(CallKind, KindTotal); 4] {
        CallKind::ALL.map(|kind| {
            let mut total = KindTotal::default();
            for c in self.calls.iter().filter(|c| c.kind == kind) {
                total.calls += 1;
                total.tokens += c.tokens;
                total.cost += c.cost(cache, unit_model);
            }
            (kind, total)
        })
    }

    /// The calls of each kind, as `forwarded=1,reload=2,retry=0,summarizer=1` (the
    /// `x-context-upstream-calls` header).
    pub fn calls_text(&self) -> String {
        self.text_of(&CallKind::ALL)
    }

    /// [`Bill::calls_text`] without `reload`, for a streamed answer whose headers leave before
    /// its rounds of the proxy's tools: `forwarded=1,retry=0,summarizer=1`.
    pub fn calls_text_before_rounds(&self) -> String {
        self.text_of(&[CallKind::Forwarded, CallKind::Retry, CallKind::Summarizer])
    }

    fn text_of(&self, kinds: &[CallKind]) -> String {
        kinds
            .iter()
            .map(|&k| format!("{}={}", k.as_str(), self.count(k)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: CachePricing = CachePricing {
        cached_read_rate: 0.5,
        cache_write_premium: 0.0,
        min_cacheable_prefix: 0,
        cache_ttl_secs: 300,
    };

    /// A request forwarded, one reload round and a summary by gpt-4o-mini, priced by hand.
    #[test]
    fn each_call_is_priced_by_its_kind() {
        let mut bill = Bill::default();
        bill.push(Call::conversation(CallKind::Forwarded, 2_000, 1_500));
        bill.push(Call::conversation(CallKind::Reload, 2_300, 2_000).with_output(40));
        bill.push(Call::summarizer("gpt-4o-mini", 4_000, 300));
        // 500 new + 1 500 cached at half; 300 new + 2 000 at half and the 40 hidden output
        // tokens at gpt-4o's $10 out against $2.50 in; the summary at $0.15 in and $0.60 out
        // per 1M against gpt-4o's $2.50 in.
        let forwarded = 500.0 + 750.0;
        let reload = 300.0 + 1_000.0 + 40.0 * 4.0;
        let summary = (4_000.0 * 0.15 + 300.0 * 0.60) / 2.50;
        let kinds = bill.by_kind(&HALF, "gpt-4o");
        assert_eq!(kinds[0].1.calls, 1);
        assert!((kinds[0].1.cost - forwarded).abs() < 1e-9);
        assert!((kinds[1].1.cost - reload).abs() < 1e-9);
        assert_eq!(kinds[2].1, KindTotal::default());
        assert!((kinds[3].1.cost - summary).abs() < 1e-9);
        assert_eq!(kinds[3].1.tokens, 4_000);
        assert!((bill.cost(&HALF, "gpt-4o") - (forwarded + reload + summary)).abs() < 1e-9);
        assert_eq!(
            bill.calls_text(),
            "forwarded=1,reload=1,retry=0,summarizer=1"
        );
        assert_eq!(
            bill.calls_text_before_rounds(),
            "forwarded=1,retry=0,summarizer=1"
        );
        assert_eq!(bill.last_sent(), Some(2_300));
    }

    /// A request refused as too long, then retried smaller: two calls, the refused one free.
    #[test]
    fn a_call_refused_as_too_long_costs_nothing() {
        let mut bill = Bill::default();
        bill.push(Call::conversation(CallKind::Forwarded, 9_000, 6_000));
        bill.refuse_last();
        bill.push(Call::conversation(CallKind::Retry, 5_000, 2_000));
        let kinds = bill.by_kind(&HALF, "gpt-4o");
        assert_eq!((kinds[0].1.calls, kinds[0].1.tokens), (1, 9_000));
        assert_eq!(kinds[0].1.cost, 0.0);
        assert!((kinds[2].1.cost - (3_000.0 + 1_000.0)).abs() < 1e-9);
        assert!((bill.cost(&HALF, "gpt-4o") - 4_000.0).abs() < 1e-9);
        assert_eq!(
            bill.calls_text(),
            "forwarded=1,reload=0,retry=1,summarizer=0"
        );
        assert_eq!(bill.last_sent(), Some(5_000));
    }

    #[test]
    fn a_bill_reads_back_as_written() {
        let mut bill = Bill::default();
        bill.push(Call::conversation(CallKind::Forwarded, 1_200, 0));
        bill.refuse_last();
        bill.push(Call::conversation(CallKind::Retry, 900, 0));
        bill.push(Call::summarizer("summarizer-1", 100, 20));
        let text = serde_json::to_string(&bill).unwrap();
        assert_eq!(
            text,
            r#"[{"kind":"forwarded","tokens":1200,"refused":true},{"kind":"retry","tokens":900},{"kind":"summarizer","tokens":100,"output":20,"model":"summarizer-1"}]"#
        );
        assert_eq!(serde_json::from_str::<Bill>(&text).unwrap(), bill);
    }

    /// Counted again from what the upstream received, the forwarded call takes the new
    /// figures and its rounds move with it, each sharing the call before it but its priming;
    /// a round after the tools were withdrawn still shares nothing; a retried request is left.
    #[test]
    fn the_forwarded_call_counted_again_moves_its_rounds() {
        let mut bill = Bill::default();
        bill.push(Call::summarizer("gpt-4o-mini", 4_000, 300));
        bill.push(Call::conversation(CallKind::Forwarded, 2_000, 1_500));
        bill.push(Call::conversation(CallKind::Reload, 2_300, 2_000).with_output(40));
        bill.push(Call::conversation(CallKind::Reload, 2_500, 0));
        bill.recount_forwarded(2_010, 1_497, 3);
        let figures: Vec<(usize, usize)> =
            bill.calls.iter().map(|c| (c.tokens, c.shared)).collect();
        assert_eq!(
            figures,
            [(4_000, 0), (2_010, 1_497), (2_310, 2_007), (2_510, 0)]
        );
        assert_eq!(bill.calls[2].output, 40);
        assert_eq!(bill.forwarded_tokens(), Some(2_010));
        let mut retried = Bill::default();
        retried.push(Call::conversation(CallKind::Forwarded, 9_000, 6_000));
        retried.refuse_last();
        retried.push(Call::conversation(CallKind::Retry, 5_000, 2_000));
        let before = retried.clone();
        retried.recount_forwarded(9_100, 6_100, 3);
        assert_eq!(retried, before);
    }

    /// A model the table does not know is priced as the request's model; an unknown request
    /// model's output at four times its input.
    #[test]
    fn unknown_models_fall_back_to_the_unit() {
        let unknown = Call::summarizer("summarizer-1", 1_000, 100);
        assert!((unknown.cost(&HALF, "gpt-4o") - (1_000.0 + 100.0 * 4.0)).abs() < 1e-9);
        let both = Call::summarizer("local-model", 1_000, 100);
        assert!((both.cost(&HALF, "local-too") - (1_000.0 + 400.0)).abs() < 1e-9);
    }
}
