//! The replay's report: requests, errors, latency, tokens and savings, prefix stability and
//! the effective input cost under prompt caching with and without the proxy; printed as a
//! table and serialized as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::cost::{count_session, effective_cost, Call, CallKind, Pricing, SummarizerCalls};
use super::send::Outcome;
#[cfg(test)]
use context_proxy_pricing::CachePricing;
use context_proxy_tokens::Counter;

/// Percentiles of a set of durations, in ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    /// p1 … p100, for the chart.
    #[serde(skip)]
    pub quantiles: Vec<f64>,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if values.is_empty() {
                return 0.0;
            }
            // Nearest rank.
            let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
            values[rank - 1]
        };
        Percentiles {
            quantiles: (1..=100).map(|q| at(f64::from(q) / 100.0)).collect(),
            count: values.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: values.last().copied().unwrap_or(0.0),
        }
    }
}

/// What the upstream received on one side (without or with the proxy).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    pub upstream_calls: usize,
    pub input_tokens: usize,
    /// The input tokens of the largest call: what a budget bounds.
    pub largest_call: usize,
    /// Share of consecutive calls of a session whose messages start with the previous call's.
    pub prefix_stability: f64,
    /// Share of input tokens that repeat the previous call's prefix.
    pub cached_share: f64,
    /// Effective input cost per provider, in full-price input tokens.
    pub cost: BTreeMap<String, f64>,
    /// Input tokens and cost (headline provider) per turn, averaged over sessions.
    pub per_turn: Vec<TurnPoint>,
    /// The same figures for each session, in the order of the traffic.
    pub per_session: Vec<SessionSide>,
    /// Calls, tokens and cost by why they were made (`forwarded`, `reload`, `retry`,
    /// `summarizer`): every upstream call is on the bill.
    pub by_kind: BTreeMap<String, KindBill>,
}

/// The upstream calls of one kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KindBill {
    pub calls: usize,
    pub input_tokens: usize,
    /// Effective cost per provider, in full-price input tokens (summaries: at the summarizer
    /// model's prices, output included, the same under every provider's caching).
    pub cost: BTreeMap<String, f64>,
}

/// What the upstream received for one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSide {
    pub upstream_calls: usize,
    pub input_tokens: usize,
    pub cached_share: f64,
    /// Effective input cost per provider, in full-price input tokens.
    pub cost: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnPoint {
    pub turn: usize,
    pub sessions: usize,
    pub tokens: f64,
    pub cost: f64,
}

impl Side {
    /// `sessions`: the bodies the upstream received, session by session, in order.
    pub fn measure(
        counter: &Counter,
        sessions: &[Vec<Value>],
        providers: &[Pricing],
        headline: &Pricing,
    ) -> Side {
        let calls: Vec<Vec<Call>> = sessions.iter().map(|s| count_session(counter, s)).collect();
        Side::from_calls(&calls, providers, headline)
    }

    pub fn from_calls(calls: &[Vec<Call>], providers: &[Pricing], headline: &Pricing) -> Side {
        let flat: Vec<&Call> = calls.iter().flatten().collect();
        let input_tokens: usize = flat.iter().map(|c| c.tokens).sum();
        let shared: usize = flat.iter().map(|c| c.shared_prefix_tokens).sum();
        let pairs = flat.iter().filter(|c| c.has_previous).count();
        let stable = flat.iter().filter(|c| c.extends_previous).count();
        let mut per_turn: Vec<TurnPoint> = Vec::new();
        for session in calls {
            for (turn, call) in session.iter().enumerate() {
                if per_turn.len() <= turn {
                    per_turn.push(TurnPoint {
                        turn: turn + 1,
                        sessions: 0,
                        tokens: 0.0,
                        cost: 0.0,
                    });
                }
                let point = &mut per_turn[turn];
                point.sessions += 1;
                point.tokens += call.tokens as f64;
                point.cost += effective_cost(std::slice::from_ref(call), &headline.terms);
            }
        }
        for point in &mut per_turn {
            point.tokens /= point.sessions as f64;
            point.cost /= point.sessions as f64;
        }
        let per_session: Vec<SessionSide> = calls
            .iter()
            .map(|session| {
                let tokens: usize = session.iter().map(|c| c.tokens).sum();
                let shared: usize = session.iter().map(|c| c.shared_prefix_tokens).sum();
                SessionSide {
                    upstream_calls: session.len(),
                    input_tokens: tokens,
                    cached_share: ratio(shared, tokens),
                    cost: providers
                        .iter()
                        .map(|p| (p.name.to_string(), effective_cost(session, &p.terms)))
                        .collect(),
                }
            })
            .collect();
        // The totals are the sessions' sums (a session's cost depends only on its own calls).
        let mut cost: BTreeMap<String, f64> = providers
            .iter()
            .map(|p| (p.name.to_string(), 0.0))
            .collect();
        for session in &per_session {
            for (name, c) in &session.cost {
                *cost.entry(name.clone()).or_default() += c;
            }
        }
        let mut by_kind: BTreeMap<String, KindBill> = BTreeMap::new();
        for call in &flat {
            let bill = by_kind.entry(call.kind.as_str().to_string()).or_default();
            bill.calls += 1;
            bill.input_tokens += call.tokens;
            for p in providers {
                let one = effective_cost(std::slice::from_ref(*call), &p.terms);
                *bill.cost.entry(p.name.to_string()).or_default() += one;
            }
        }
        Side {
            upstream_calls: flat.len(),
            input_tokens,
            largest_call: flat.iter().map(|c| c.tokens).max().unwrap_or(0),
            prefix_stability: ratio(stable, pairs),
            cached_share: ratio(shared, input_tokens),
            cost,
            per_turn,
            per_session,
            by_kind,
        }
    }

    /// Adds the summarizer's calls to the bill: to the calls and to every provider's cost (they
    /// belong to no one session, so the per-session figures leave them out).
    pub fn with_summarizer(mut self, summarizer: &SummarizerCalls) -> Side {
        if summarizer.calls == 0 {
            return self;
        }
        self.upstream_calls += summarizer.calls;
        let bill = self
            .by_kind
            .entry(CallKind::Summarizer.as_str().to_string())
            .or_default();
        bill.calls += summarizer.calls;
        bill.input_tokens += summarizer.input_tokens;
        for (name, cost) in &mut self.cost {
            *cost += summarizer.cost;
            *bill.cost.entry(name.clone()).or_default() += summarizer.cost;
        }
        self
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Prefix stability and the cached share of Anthropic Messages traffic, from the usage of its
/// answers (what the provider's cache actually did), not from the prefix model of [`Side`]:
/// Anthropic caches only at `cache_control` breakpoints, and its usage says what was read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsageCache {
    /// Share of the answers after a session's first whose request read back the whole prefix
    /// the previous request cached (its cache reads and writes).
    pub prefix_stability: f64,
    /// Cache reads over the prompt (input, cache writes and reads).
    pub cached_share: f64,
    /// The same share, per session in the traffic's order.
    pub per_session: Vec<f64>,
}

impl UsageCache {
    /// From `outcomes` (any order) over `sessions` sessions; `None` when no answer reported a
    /// usage.
    pub fn of(outcomes: &[Outcome], sessions: usize) -> Option<UsageCache> {
        let mut ordered: Vec<(usize, usize, &super::send::Billed)> = outcomes
            .iter()
            .filter_map(|o| Some((o.session, o.index, o.billed.as_ref()?)))
            .collect();
        if ordered.is_empty() {
            return None;
        }
        ordered.sort_by_key(|(s, i, _)| (*s, *i));
        let (mut pairs, mut stable) = (0usize, 0usize);
        let mut read = vec![0u64; sessions];
        let mut prompt = vec![0u64; sessions];
        let mut previous: Option<(usize, u64)> = None;
        for (session, _, b) in ordered {
            if let Some((_, cached)) = previous.filter(|(s, _)| *s == session) {
                pairs += 1;
                if b.cache_read >= cached && cached > 0 {
                    stable += 1;
                }
            }
            previous = Some((session, b.cache_read + b.cache_write));
            if let (Some(r), Some(p)) = (read.get_mut(session), prompt.get_mut(session)) {
                *r += b.cache_read;
                *p += b.input + b.cache_write + b.cache_read;
            }
        }
        let share = |r: u64, p: u64| if p == 0 { 0.0 } else { r as f64 / p as f64 };
        Some(UsageCache {
            prefix_stability: ratio(stable, pairs),
            cached_share: share(read.iter().sum(), prompt.iter().sum()),
            per_session: read
                .iter()
                .zip(&prompt)
                .map(|(r, p)| share(*r, *p))
                .collect(),
        })
    }

    /// `side`'s prefix stability and cached shares replaced by these.
    pub fn onto(&self, side: &mut Side) {
        side.prefix_stability = self.prefix_stability;
        side.cached_share = self.cached_share;
        for (s, share) in side.per_session.iter_mut().zip(&self.per_session) {
            s.cached_share = *share;
        }
    }

    /// What is not known without the answers' usage (going direct was not measured).
    pub fn unknown(side: &mut Side) {
        side.prefix_stability = f64::NAN;
        side.cached_share = f64::NAN;
        for s in &mut side.per_session {
            s.cached_share = f64::NAN;
        }
    }
}

/// Everything the replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub requests: usize,
    /// Answers by status (`"0"`: no answer).
    pub status: BTreeMap<String, usize>,
    pub errors: usize,
    pub duration_s: f64,
    pub throughput_rps: f64,
    /// Latency through the target (from each request's slot to its last byte).
    pub latency_ms: Percentiles,
    /// Time to first byte of streamed answers.
    pub ttfb_ms: Percentiles,
    /// Latency sending the same traffic directly to the upstream (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_latency_ms: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_throughput_rps: Option<f64>,
    /// Sums of the proxy's `x-context-tokens-before/after` headers.
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub savings: f64,
    /// Requests for which the proxy answered its own tools, and the rounds in all.
    pub requests_with_reload: usize,
    pub reload_rounds: u64,
    /// The headline provider of `per_turn` costs.
    pub provider: String,
    /// What a client sends without the proxy.
    pub without_proxy: Side,
    /// What the upstream received through the proxy (when it could be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_proxy: Option<Side>,
    /// Upstream calls beyond one per request (the proxy's tool rounds and summaries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_upstream_calls: Option<usize>,
    /// The sessions' ids, in the order of `without_proxy.per_session`.
    pub sessions: Vec<String>,
    /// Anthropic Messages traffic: what the answers' usage billed through the target, priced
    /// with the headline provider's cache terms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billed: Option<BilledSide>,
    /// The same, going directly to the upstream (`--compare`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billed_direct: Option<BilledSide>,
    /// Messages traffic: the proxy's estimate of each forwarded request
    /// (`x-context-tokens-after`) against the prompt its answer's usage billed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_error: Option<EstimateError>,
}

/// How far an estimate is from the usage, as `estimate / usage - 1` over requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ErrorSpread {
    pub requests: usize,
    pub min: f64,
    pub p50: f64,
    pub max: f64,
    /// Requests counted below their usage.
    pub under: usize,
}

impl ErrorSpread {
    fn of(mut errors: Vec<f64>) -> Option<ErrorSpread> {
        errors.sort_by(f64::total_cmp);
        Some(ErrorSpread {
            requests: errors.len(),
            min: *errors.first()?,
            p50: errors[(errors.len() - 1) / 2],
            max: *errors.last()?,
            under: errors.iter().filter(|e| **e < 0.0).count(),
        })
    }
}

/// The default estimate's error (o200k_base x 1.25, what the proxy's headers report) and the
/// error of the estimate corrected as the proxy corrects it, from each session's previous
/// answer (its measured ratio x 1.05, within 0.8-3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EstimateError {
    pub default: ErrorSpread,
    pub calibrated: ErrorSpread,
}

/// The proxy's default factor and its margin over a measured one (`src/context/estimate.rs`).
const DEFAULT_FACTOR: f64 = 1.25;
const MARGIN: f64 = 1.05;

impl EstimateError {
    /// From outcomes ordered by session then index.
    pub fn of(outcomes: &[Outcome]) -> Option<EstimateError> {
        let (mut default, mut calibrated) = (Vec::new(), Vec::new());
        let mut session = usize::MAX;
        let mut scale = 1.0;
        for o in outcomes {
            let (Some(estimate), Some(billed)) = (o.tokens_after, o.billed) else {
                continue;
            };
            if o.session != session {
                (session, scale) = (o.session, 1.0);
            }
            let actual = (billed.input + billed.cache_write + billed.cache_read) as f64;
            if actual == 0.0 || estimate == 0 {
                continue;
            }
            let estimate = estimate as f64;
            default.push(estimate / actual - 1.0);
            calibrated.push(estimate * scale / actual - 1.0);
            let measured = actual / (estimate / DEFAULT_FACTOR);
            if (0.8..=3.0).contains(&measured) {
                scale = (measured * MARGIN).clamp(0.8, 3.0) / DEFAULT_FACTOR;
            }
        }
        Some(EstimateError {
            default: ErrorSpread::of(default)?,
            calibrated: ErrorSpread::of(calibrated)?,
        })
    }
}

/// The usage Anthropic's answers reported, summed, and its cost in full-price input tokens
/// (cache writes at 1 + the write premium, one-hour writes at 2×, reads at the read rate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BilledSide {
    /// Answers that reported a usage.
    pub answers: usize,
    /// The largest prompt an answer billed (input, cache writes and reads): what a budget
    /// bounds, by the upstream's own count.
    pub largest_prompt: u64,
    #[serde(flatten)]
    pub usage: super::send::Billed,
    pub cost: f64,
}

impl BilledSide {
    /// The usage of `outcomes`' answers, priced with `terms`; `None` when none reported one.
    pub fn of(
        outcomes: &[Outcome],
        terms: &context_proxy_pricing::CachePricing,
    ) -> Option<BilledSide> {
        let mut side = BilledSide::default();
        for billed in outcomes.iter().filter_map(|o| o.billed.as_ref()) {
            side.answers += 1;
            side.usage.add(billed);
            let prompt = billed.input + billed.cache_write + billed.cache_read;
            side.largest_prompt = side.largest_prompt.max(prompt);
        }
        side.cost = side.usage.cost(terms);
        (side.answers > 0).then_some(side)
    }
}

/// Builds the report from the outcomes of the run through the target.
pub fn report(
    outcomes: &[Outcome],
    duration_s: f64,
    without_proxy: Side,
    with_proxy: Option<Side>,
    provider: &str,
) -> Report {
    let mut status = BTreeMap::new();
    for o in outcomes {
        *status.entry(o.status.to_string()).or_insert(0) += 1;
    }
    let ok = |o: &&Outcome| (200..300).contains(&o.status);
    let tokens_before: u64 = outcomes.iter().filter_map(|o| o.tokens_before).sum();
    let tokens_after: u64 = outcomes.iter().filter_map(|o| o.tokens_after).sum();
    let extra = with_proxy
        .as_ref()
        .map(|w| w.upstream_calls.saturating_sub(outcomes.len()));
    Report {
        requests: outcomes.len(),
        errors: outcomes.iter().filter(|o| !ok(o)).count(),
        status,
        duration_s,
        throughput_rps: if duration_s > 0.0 {
            outcomes.len() as f64 / duration_s
        } else {
            0.0
        },
        latency_ms: Percentiles::of(outcomes.iter().map(|o| o.latency_ms).collect()),
        ttfb_ms: Percentiles::of(
            outcomes
                .iter()
                .filter(|o| o.stream && ok(o))
                .map(|o| o.ttfb_ms)
                .collect(),
        ),
        direct_latency_ms: None,
        direct_throughput_rps: None,
        tokens_before,
        tokens_after,
        savings: if tokens_before > 0 {
            1.0 - tokens_after as f64 / tokens_before as f64
        } else {
            0.0
        },
        requests_with_reload: outcomes.iter().filter(|o| o.reload_rounds > 0).count(),
        reload_rounds: outcomes.iter().map(|o| o.reload_rounds).sum(),
        provider: provider.to_string(),
        without_proxy,
        with_proxy,
        extra_upstream_calls: extra,
        sessions: Vec::new(),
        billed: None,
        billed_direct: None,
        estimate_error: EstimateError::of(outcomes),
    }
}

impl Report {
    /// The report as a plain-text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let p = |x: &Percentiles| {
            format!(
                "p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1} ms",
                x.p50, x.p90, x.p99, x.max
            )
        };
        let _ = writeln!(
            out,
            "requests        {}  ({} errors; by status: {})",
            self.requests,
            self.errors,
            self.status
                .iter()
                .map(|(s, n)| format!("{s}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let _ = writeln!(
            out,
            "throughput      {:.0} req/s over {:.1} s",
            self.throughput_rps, self.duration_s
        );
        let _ = writeln!(out, "latency         {}", p(&self.latency_ms));
        if let (Some(d), Some(rps)) = (&self.direct_latency_ms, self.direct_throughput_rps) {
            let _ = writeln!(out, "  direct        {}  ({rps:.0} req/s)", p(d));
        }
        if self.ttfb_ms.count > 0 {
            let _ = writeln!(out, "ttfb (streams)  {}", p(&self.ttfb_ms));
        }
        let _ = writeln!(
            out,
            "tokens          {} before, {} after: {:.1}% saved",
            self.tokens_before,
            self.tokens_after,
            self.savings * 1e2
        );
        let _ = writeln!(
            out,
            "reload          {} requests, {} rounds{}",
            self.requests_with_reload,
            self.reload_rounds,
            self.extra_upstream_calls
                .map(|n| format!("; {n} extra upstream calls"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "\n{:<22}{:>16}{:>16}{:>9}",
            "upstream input", "without proxy", "with proxy", "change"
        );
        let w = self.with_proxy.as_ref();
        let row = |out: &mut String, name: &str, a: f64, b: Option<f64>, pct: bool| {
            let fmt = |v: f64| {
                if v.is_nan() {
                    "-".to_string()
                } else if pct {
                    format!("{:.1}%", v * 1e2)
                } else {
                    format!("{v:.0}")
                }
            };
            let change = match b {
                Some(b) if !pct && a > 0.0 && !b.is_nan() => {
                    format!("{:+.1}%", (b / a - 1.0) * 1e2)
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "{name:<22}{:>16}{:>16}{change:>9}",
                fmt(a),
                b.map(fmt).unwrap_or_else(|| "-".into())
            );
        };
        let wo = &self.without_proxy;
        row(
            &mut out,
            "calls",
            wo.upstream_calls as f64,
            w.map(|w| w.upstream_calls as f64),
            false,
        );
        row(
            &mut out,
            "tokens",
            wo.input_tokens as f64,
            w.map(|w| w.input_tokens as f64),
            false,
        );
        row(
            &mut out,
            "largest call",
            wo.largest_call as f64,
            w.map(|w| w.largest_call as f64),
            false,
        );
        row(
            &mut out,
            "prefix stability",
            wo.prefix_stability,
            w.map(|w| w.prefix_stability),
            true,
        );
        row(
            &mut out,
            "cached share",
            wo.cached_share,
            w.map(|w| w.cached_share),
            true,
        );
        if let Some(billed) = &self.billed {
            let direct = self.billed_direct.as_ref();
            let _ = writeln!(
                out,
                "\n{:<22}{:>16}{:>16}{:>9}",
                "anthropic usage", "direct", "with proxy", "change"
            );
            let field = |b: &BilledSide, f: fn(&BilledSide) -> f64| f(b);
            for (name, f) in [
                (
                    "input",
                    (|b: &BilledSide| b.usage.input as f64) as fn(&BilledSide) -> f64,
                ),
                ("cache writes", |b| b.usage.cache_write as f64),
                ("cache reads", |b| b.usage.cache_read as f64),
                ("largest prompt", |b| b.largest_prompt as f64),
                ("output", |b| b.usage.output as f64),
                ("cost", |b| b.cost),
            ] {
                let proxied = field(billed, f);
                match direct {
                    Some(d) => row(&mut out, name, field(d, f), Some(proxied), false),
                    None => {
                        let _ = writeln!(out, "{name:<22}{:>16}{proxied:>16.0}", "-");
                    }
                }
            }
        }
        if let Some(e) = &self.estimate_error {
            let line = |s: &ErrorSpread| {
                format!(
                    "min {:+.1}%  p50 {:+.1}%  max {:+.1}%  ({} of {} under)",
                    s.min * 1e2,
                    s.p50 * 1e2,
                    s.max * 1e2,
                    s.under,
                    s.requests
                )
            };
            let _ = writeln!(out, "estimate/usage  default     {}", line(&e.default));
            let _ = writeln!(out, "                calibrated  {}", line(&e.calibrated));
        }
        for (name, cost) in &wo.cost {
            row(
                &mut out,
                &format!("cost {name}"),
                *cost,
                w.and_then(|w| w.cost.get(name).copied()),
                false,
            );
        }
        if let Some(w) = w {
            self.kind_table(&mut out, w);
            self.session_table(&mut out, w);
        }
        out
    }

    /// With the proxy: what each kind of upstream call cost, under each provider's prices
    /// (full-price input tokens), and its share of the bill.
    fn kind_table(&self, out: &mut String, with: &Side) {
        let names: Vec<&String> = with.cost.keys().collect();
        let _ = write!(
            out,
            "\n{:<24}{:>8}{:>12}",
            "calls via proxy (cost)", "calls", "tokens"
        );
        for name in &names {
            let _ = write!(out, "{name:>20}");
        }
        out.push('\n');
        for (kind, bill) in &with.by_kind {
            let _ = write!(out, "{kind:<24}{:>8}{:>12}", bill.calls, bill.input_tokens);
            for name in &names {
                let cost = bill.cost.get(*name).copied().unwrap_or(0.0);
                let total = with.cost.get(*name).copied().unwrap_or(0.0);
                let share = if total > 0.0 { cost / total * 1e2 } else { 0.0 };
                let _ = write!(out, "{:>20}", format!("{cost:.0} ({share:.0}%)"));
            }
            out.push('\n');
        }
    }

    /// Per session: tokens and cached share with the proxy, and its effective cost relative to
    /// going direct under each provider's prices (1.00×: the same bill).
    fn session_table(&self, out: &mut String, with: &Side) {
        let wo = &self.without_proxy;
        let names: Vec<&String> = wo.cost.keys().collect();
        let _ = write!(
            out,
            "\n{:<24}{:>10}{:>10}{:>8}",
            "session (cost ×direct)", "tokens", "via proxy", "cached"
        );
        for name in &names {
            let _ = write!(out, "{:>14}", name);
        }
        out.push('\n');
        for (i, (a, b)) in wo.per_session.iter().zip(&with.per_session).enumerate() {
            let id = self.sessions.get(i).map_or("", String::as_str);
            let id: String = id.chars().take(23).collect();
            let _ = write!(
                out,
                "{id:<24}{:>10}{:>10}{:>7.1}%",
                a.input_tokens,
                b.input_tokens,
                b.cached_share * 1e2
            );
            for name in &names {
                let ratio = match (a.cost.get(*name), b.cost.get(*name)) {
                    // `+ 0.0`: an empty side's sum is -0.0, shown as 0.00×.
                    (Some(&a), Some(&b)) if a > 0.0 => format!("{:.2}×", b / a + 0.0),
                    _ => "-".into(),
                };
                let _ = write!(out, "{ratio:>14}");
            }
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tokens: usize, shared: usize, extends: bool, has_previous: bool) -> Call {
        Call {
            kind: CallKind::Forwarded,
            tokens,
            hidden_output: 0,
            hidden_output_cost: 0.0,
            refused: false,
            shared_prefix_tokens: shared,
            extends_previous: extends,
            has_previous,
        }
    }

    /// A hand-computed trace: one session of three calls, 1000, 1500 and 1600 tokens; the
    /// second repeats 1000 of the first, the third only 200 of the second (a rewrite).
    #[test]
    fn numbers_match_a_hand_computed_trace() {
        let calls = vec![vec![
            call(1000, 0, false, false),
            call(1500, 1000, true, true),
            call(1600, 200, false, true),
        ]];
        let half = CachePricing {
            cached_read_rate: 0.5,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        let openai = Pricing {
            name: "openai",
            terms: half,
        };
        let anthropic = Pricing {
            name: "anthropic",
            terms: CachePricing {
                cached_read_rate: 0.1,
                cache_write_premium: 0.25,
                ..half
            },
        };
        let with_min = Pricing {
            name: "min",
            terms: CachePricing {
                min_cacheable_prefix: 500,
                ..half
            },
        };
        let side = Side::from_calls(&calls, &[openai, anthropic, with_min], &openai);
        assert_eq!(side.upstream_calls, 3);
        assert_eq!(side.input_tokens, 4100);
        assert_eq!(side.prefix_stability, 0.5);
        assert!((side.cached_share - 1200.0 / 4100.0).abs() < 1e-12);
        // 1000 + (500 + 0.5·1000) + (1400 + 0.5·200) = 3500
        assert_eq!(side.cost["openai"], 3500.0);
        // 1.25·1000 + (1.25·500 + 0.1·1000) + (1.25·1400 + 0.1·200) = 3745
        assert!((side.cost["anthropic"] - 3745.0).abs() < 1e-9);
        // The 200-token prefix is under the minimum: 1000 + 1000 + 1600 = 3600
        assert_eq!(side.cost["min"], 3600.0);
        assert_eq!(side.per_turn[2].cost, 1500.0);
        assert_eq!(side.per_session.len(), 1);
        assert_eq!(side.per_session[0].cost["openai"], 3500.0);
        assert_eq!(side.per_session[0].input_tokens, 4100);

        let outcomes: Vec<Outcome> = [
            (200, 10.0, Some(100), Some(60), 0),
            (200, 30.0, Some(200), Some(120), 1),
            (502, 20.0, None, None, 0),
        ]
        .into_iter()
        .map(|(status, ms, before, after, rounds)| Outcome {
            status,
            latency_ms: ms,
            tokens_before: before,
            tokens_after: after,
            reload_rounds: rounds,
            ..Outcome::default()
        })
        .collect();
        let r = report(&outcomes, 2.0, side.clone(), Some(side), "openai");
        assert_eq!(r.requests, 3);
        assert_eq!(r.errors, 1);
        assert_eq!(r.status["502"], 1);
        assert_eq!(r.throughput_rps, 1.5);
        assert_eq!(r.latency_ms.p50, 20.0);
        assert_eq!(r.latency_ms.max, 30.0);
        assert_eq!((r.tokens_before, r.tokens_after), (300, 180));
        assert!((r.savings - 0.4).abs() < 1e-12);
        assert_eq!((r.requests_with_reload, r.reload_rounds), (1, 1));
        assert_eq!(r.extra_upstream_calls, Some(0));
        let mut r = r;
        r.sessions = vec!["s1".into()];
        let table = r.table();
        assert!(table.contains("cost openai"));
        assert!(table.contains("s1"), "{table}");
        assert!(table.contains("1.00×"), "{table}");
    }

    /// A hand-computed trace of a session through the proxy with a reload round, an overflow
    /// retry and two summarizer calls: each call's kind, each kind's cost, and the bill with
    /// every call on it.
    #[test]
    fn every_call_is_on_the_bill_as_computed_by_hand() {
        use context_proxy_tokens::{CountSettings, Encoding};
        use serde_json::json;
        let c = Counter::new(Encoding::O200kBase, CountSettings::default());
        let task = json!({"role": "user", "content": "Fix the failing test in the parser."});
        let read = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "r1", "type": "function", "function": {"name": "context_read", "arguments": "{\"ref\":\"ctx_1\"}"}}]});
        let text =
            json!({"role": "tool", "tool_call_id": "r1", "content": "fn parse() { todo!() }"});
        let answer =
            json!({"role": "assistant", "content": "Done: the parser handles empty input."});
        let next = json!({"role": "user", "content": "Now run the whole suite."});
        let marker =
            json!({"role": "user", "content": "[context-proxy: 2 earlier messages moved out]"});
        let body = |ms: Vec<&Value>| json!({"model": "gpt-4o", "messages": ms});
        let bodies = vec![
            body(vec![&task]),                                 // forwarded
            body(vec![&task, &read, &text]),                   // the proxy's reload round
            body(vec![&task, &read, &text, &answer, &next]),   // forwarded
            body(vec![&marker, &read, &text, &answer, &next]), // retried smaller after "too long"
        ];
        let calls = count_session(&c, &bodies);
        let kinds: Vec<CallKind> = calls.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                CallKind::Forwarded,
                CallKind::Reload,
                CallKind::Forwarded,
                CallKind::Retry
            ]
        );
        let t: Vec<usize> = bodies.iter().map(|b| c.count_request(b).total).collect();
        let m = |v: &Value| c.count_message(v);
        // Shared prefixes: the reload round and the next request extend the call before them;
        // the retry shares nothing with the call before the refused one.
        let shared = [0, m(&task), m(&task) + m(&read) + m(&text), 0];
        for (call, s) in calls.iter().zip(shared) {
            assert_eq!(call.shared_prefix_tokens, s);
        }
        // The reload round pays for the model's hidden call it resends (gpt-4o: $10 out
        // against $2.50 in); the request the upstream refused as too long costs nothing.
        assert_eq!(calls[1].hidden_output, m(&read));
        let refused: Vec<bool> = calls.iter().map(|c| c.refused).collect();
        assert_eq!(refused, [false, false, true, false]);
        let hidden = m(&read) as f64 * 4.0;
        let half = Pricing {
            name: "half",
            terms: CachePricing {
                cached_read_rate: 0.5,
                cache_write_premium: 0.0,
                min_cacheable_prefix: 0,
                cache_ttl_secs: 300,
            },
        };
        let by_hand = |i: usize| match i {
            1 => t[i] as f64 - 0.5 * shared[i] as f64 + hidden,
            2 => 0.0,
            _ => t[i] as f64 - 0.5 * shared[i] as f64,
        };
        // Two summaries by gpt-4o-mini, 1,000 and 3,000 tokens in, 400 out in all: shared out
        // by input (100 and 300), at $0.15 and $0.60 per 1M against gpt-4o's $2.50 input.
        let summary = |n: usize| json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "word ".repeat(n)}]});
        let (s1, s2) = (summary(1_000), summary(3_000));
        let summarizer =
            SummarizerCalls::price(&c, &[s1.clone(), s2.clone()], Some(400), &["gpt-4o".into()]);
        let (i1, i2) = (c.count_request(&s1).total, c.count_request(&s2).total);
        let out1 = (400.0 * i1 as f64 / (i1 + i2) as f64).round();
        let out2 = (400.0 * i2 as f64 / (i1 + i2) as f64).round();
        let summaries = ((i1 + i2) as f64 * 0.15 + (out1 + out2) * 0.60) / 2.50;
        assert_eq!(summarizer.calls, 2);
        assert_eq!(summarizer.input_tokens, i1 + i2);
        assert!(
            (summarizer.cost - summaries).abs() < 1e-9,
            "{} != {summaries}",
            summarizer.cost
        );

        let side = Side::from_calls(&[calls], &[half], &half).with_summarizer(&summarizer);
        assert_eq!(side.upstream_calls, 6);
        let kind = |k: &str| &side.by_kind[k];
        assert_eq!((kind("forwarded").calls, kind("reload").calls), (2, 1));
        assert_eq!((kind("retry").calls, kind("summarizer").calls), (1, 2));
        assert!((kind("forwarded").cost["half"] - (by_hand(0) + by_hand(2))).abs() < 1e-9);
        assert!((kind("reload").cost["half"] - by_hand(1)).abs() < 1e-9);
        assert!((kind("retry").cost["half"] - by_hand(3)).abs() < 1e-9);
        assert!((kind("summarizer").cost["half"] - summaries).abs() < 1e-9);
        let total: f64 = (0..4).map(by_hand).sum::<f64>() + summaries;
        assert!((side.cost["half"] - total).abs() < 1e-9);
        assert_eq!(kind("summarizer").input_tokens, i1 + i2);
        // The table names every kind with its cost.
        let r = report(&[], 1.0, side.clone(), Some(side), "half");
        let table = r.table();
        for k in ["forwarded", "reload", "retry", "summarizer"] {
            assert!(table.contains(k), "{table}");
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(Vec::new()).count, 0);
    }

    #[test]
    fn the_estimate_is_judged_against_usage_and_corrected_per_session() {
        let billed = |prompt: u64| super::super::send::Billed {
            input: 10,
            cache_write: prompt - 110,
            cache_read: 100,
            ..Default::default()
        };
        let outcome = |session, estimate, prompt| Outcome {
            session,
            status: 200,
            tokens_after: Some(estimate),
            billed: Some(billed(prompt)),
            ..Outcome::default()
        };
        // Session 0 counted 25% high twice; session 1 starts over, 10% low.
        let outcomes = [
            outcome(0, 1_250, 1_000),
            outcome(0, 2_500, 2_000),
            outcome(1, 900, 1_000),
        ];
        let e = EstimateError::of(&outcomes).unwrap();
        assert_eq!(e.default.requests, 3);
        assert!((e.default.max - 0.25).abs() < 1e-9);
        assert!((e.default.min + 0.1).abs() < 1e-9);
        assert_eq!(e.default.under, 1);
        // The second request of session 0 is corrected by the first's ratio x 1.05.
        assert!((e.calibrated.p50 - 0.05).abs() < 1e-9, "{:?}", e.calibrated);
        assert_eq!(e.calibrated.under, 1);
        assert_eq!(EstimateError::of(&[]), None);
    }

    /// Messages traffic: stability and cached share from the answers' usage, hand-computed.
    #[test]
    fn messages_prefix_rows_come_from_the_usage() {
        let outcome = |session, index, read, write| Outcome {
            session,
            index,
            status: 200,
            billed: Some(super::super::send::Billed {
                input: 10,
                cache_write: write,
                cache_read: read,
                ..Default::default()
            }),
            ..Outcome::default()
        };
        // Session 0: the second request reads back all the first cached; the third reads
        // less than the second cached (an edit before its breakpoint). Given out of order.
        let outcomes = [
            outcome(0, 2, 1_000, 1_500),
            outcome(1, 0, 0, 1_000),
            outcome(0, 0, 0, 2_000),
            outcome(0, 1, 2_000, 500),
        ];
        let u = UsageCache::of(&outcomes, 2).unwrap();
        assert_eq!(u.prefix_stability, 0.5);
        assert!((u.cached_share - 3_000.0 / 8_040.0).abs() < 1e-12);
        assert!((u.per_session[0] - 3_000.0 / 7_030.0).abs() < 1e-12);
        assert_eq!(u.per_session[1], 0.0);
        assert_eq!(UsageCache::of(&[], 2), None);
        // Onto a side; unknown without usage, shown as "-".
        let calls = vec![
            vec![call(100, 0, false, false)],
            vec![call(50, 0, false, false)],
        ];
        let providers = super::super::cost::providers();
        let mut side = Side::from_calls(&calls, &providers, &providers[0]);
        u.onto(&mut side);
        assert_eq!(side.prefix_stability, 0.5);
        assert_eq!(side.per_session[1].cached_share, 0.0);
        UsageCache::unknown(&mut side);
        let r = Report {
            without_proxy: side,
            ..report(
                &outcomes,
                1.0,
                Side::from_calls(&calls, &providers, &providers[0]),
                None,
                "anthropic",
            )
        };
        let table = r.table();
        let row = table
            .lines()
            .find(|l| l.starts_with("cached share"))
            .unwrap();
        assert!(row.contains(" -"), "{row}");
    }
}
