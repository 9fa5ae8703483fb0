//! The planner: counts a request, looks up what was decided for its conversation's prefix and
//! the summaries recorded for it, runs the pure [engine](super::engine) and places a ready
//! summary. It reads the store (decisions, summaries, the proxy's hidden calls, learned limits)
//! and never writes content: what the plan removes is stored by the
//! [writer](super::writer). Never fails: a store error is logged and the engine decides
//! without the session's state.

use std::sync::Arc;
use std::time::Instant;

use moka::sync::Cache;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_128;

use super::adapter;
use super::engine::{self, Decision, Env, Input, Report, Skipped};
use super::estimate::{self, Calibration};
use super::session::{Decisions, Identity, Prefixes};
use super::settings::{self, ContextConfig, Mode, RequestLimits, Settings};
use super::{caches, limits, markers, summary, summary_store, transforms};
use crate::pricing::ModelPrice;
use crate::store::{ContentRef, Store, Tenant};
use crate::tokens::{Counter, Encoding};

/// Where a request goes, as far as its budget is concerned.
#[derive(Debug, Clone, Default)]
pub struct Route<'a> {
    /// The upstream's name (learned limits are kept per upstream and model).
    pub upstream: Option<&'a str>,
    /// The upstream's tokenizer override.
    pub encoding: Option<Encoding>,
    /// The upstream's default context window (`context_window` of a self-hosted server).
    pub default_window: Option<usize>,
    /// How markers tell the model to read content back in this request.
    pub readback: markers::Readback,
    /// A budget replacing the one resolved for the model (a retry after the upstream said the
    /// context is too long).
    pub budget_override: Option<usize>,
    /// Whether moved-out spans are summarized for this request (`[context.summarizer]`).
    pub summarize: bool,
    /// The upstream's prompt-caching prices for this request's model; unset: OpenAI's (the
    /// default for an unknown host).
    pub cache: Option<crate::pricing::CachePricing>,
    /// Tokens the proxy may add to the request after planning (its own tools' definitions):
    /// kept free in the budget, so the request as forwarded still fits.
    pub reserved_tokens: usize,
    /// The request's wire format (its adapter reads and writes the conversation).
    pub wire: adapter::Wire,
    /// An estimated wire's (Messages') correction for this request alone, from the upstream's
    /// exact count of it: the upstream's tokens per estimated token. It replaces the
    /// conversation's correction learned from usage.
    pub scale: Option<f64>,
    /// The page's journal is on: the plan leaves the client's request as prefix parts
    /// ([`Plan::client_parts`]). Off, nothing is built for it.
    pub journal: bool,
}

/// A request's size against its budget and its model's window, as the estimate sees it before
/// planning (`Planner::sizing`): whether the exact count is worth asking the upstream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    /// The count, in the units of the `x-context-tokens-*` headers (an estimated wire's
    /// default estimate).
    pub tokens: usize,
    /// The conversation's correction learned from usage (1 until an answer was seen):
    /// `tokens × scale` estimates the upstream's count.
    pub scale: f64,
    /// The budget, in the upstream's tokens.
    pub budget: usize,
    /// The model's context window, in the upstream's tokens.
    pub window: usize,
}

impl Sizing {
    /// The upstream's count of `tokens` (in the headers' units) as the estimate sees it.
    pub fn upstream_tokens(&self, tokens: usize) -> usize {
        (tokens as f64 * self.scale).ceil() as usize
    }

    /// Whether `tokens` (the headers' units) are within `margin` (a share) of `limit` (the
    /// upstream's tokens), above or below it.
    pub fn near(&self, tokens: usize, limit: usize, margin: f64) -> bool {
        let estimated = self.upstream_tokens(tokens) as f64;
        (estimated - limit as f64).abs() <= margin * limit as f64
    }
}

/// What the plan phase decided for one request, handed to the apply phase.
#[derive(Debug)]
pub struct Plan {
    /// What the plan does (the token figures mean something when `counted`).
    pub report: Report,
    /// The request was counted; false in mode off.
    pub counted: bool,
    /// The session's state could not be read (the plan was made without it).
    pub store_failed: bool,
    /// Hidden exchanges of the proxy's tools put back into the body's messages.
    pub restored: usize,
    /// The engine has nothing to change in the messages before the last thinking block (or
    /// there is none): on a model binding thinking to its prefix, no earlier request of the
    /// conversation was edited where a signature reads (Anthropic Messages; always true on
    /// the other wires; `untouched_before_thinking` in this file).
    pub untouched_before_thinking: bool,
    /// Set when the engine ran: what it needs from the session to apply.
    pub(super) decided: Option<Decided>,
    /// What a summary does for this request (see [`SummaryPlan`]).
    pub summary: SummaryPlan,
    /// The client's request as prefix parts, as counted (the page prices the request without
    /// the proxy with them); `None` when it was not counted or the journal is off
    /// ([`Route::journal`]).
    pub client_parts: Option<crate::tokens::Parts>,
}

/// What a summary does for one request.
#[derive(Debug, Default)]
pub enum SummaryPlan {
    /// No span is moved out, nor worth summarizing yet.
    #[default]
    None,
    /// The moved-out span's summary was ready and is placed.
    Hit,
    /// A span is moved out without its summary: the marker stands (with the previous summary,
    /// if any) unless the job completes in time.
    Missing(SummaryJob),
    /// Under the hard budget but over the soft watermark: the next span is worth summarizing
    /// in the background.
    Ahead(SummaryJob),
    /// A summary was worth asking for (`ahead`: ahead of time), but would cost more than going
    /// direct saves ([`engine::summary_pays`]): not asked for; the plain marker stands.
    Unpaid { ahead: bool },
}

/// One summary to compute: the previous summary and the newly covered span.
#[derive(Debug, Clone)]
pub struct SummaryJob {
    /// The summary covers `messages[..prefix_len]` (after the pinned head).
    pub prefix_len: usize,
    pub prefix_hash: String,
    /// The summary of a shorter prefix of the same span, merged into the new one.
    pub previous: Option<String>,
    /// The newly covered messages, compacted, as the summarizer reads them.
    pub span: String,
    /// The request moved this span out just now, over its hard budget: it may wait for it.
    pub blocking: bool,
    /// The request's token encoding: the summary must fit `max_summary_tokens` in it.
    pub encoding: Encoding,
}

/// Where the marker of a moved-out span stands, to put a summary in it.
#[derive(Debug)]
pub(super) struct MarkerSlot {
    index: usize,
    marker: String,
    encoding: Encoding,
    /// The wire (its adapter writes and counts the marker item).
    wire: adapter::Wire,
}

/// What the engine decided for a request, with what the writer needs to record it.
#[derive(Debug)]
pub struct Decided {
    pub(super) wire: adapter::Wire,
    pub(super) prefixes: Prefixes,
    pub(super) prior: Decision,
    pub(super) outcome: engine::Outcome,
    pub(super) marker: Option<MarkerSlot>,
}

impl Plan {
    fn off() -> Plan {
        Plan {
            report: Report::default(),
            counted: false,
            store_failed: false,
            restored: 0,
            untouched_before_thinking: true,
            decided: None,
            summary: SummaryPlan::None,
            client_parts: None,
        }
    }

    fn unchanged(report: Report) -> Plan {
        Plan {
            report,
            counted: true,
            store_failed: false,
            restored: 0,
            untouched_before_thinking: true,
            decided: None,
            summary: SummaryPlan::None,
            client_parts: None,
        }
    }

    /// Whether applying this plan changes the request.
    pub fn rewrites(&self) -> bool {
        self.decided
            .as_ref()
            .is_some_and(|d| d.outcome.messages.is_some())
    }

    /// Whether the new body shows the model a reference to stored content (a compacted or
    /// truncated result, a moved-out span), so the reload tools are worth offering. The
    /// originals of lossless transforms are stored too, but nothing in the body names them.
    pub fn refers_to_stored_content(&self) -> bool {
        self.decided
            .as_ref()
            .is_some_and(|d| refers_to_stored_content(&d.outcome))
    }
}

/// Whether the engine has nothing to change in `messages` (payloads, counted `per_message`,
/// `fixed` tokens outside them) before the last one holding a thinking block: true when none
/// holds one, and on wires that do not sign thinking. On a model binding thinking to its
/// prefix, every thinking block the client sends back was signed after an earlier request,
/// which held at most the messages before the last such block; the engine edits only what it
/// plans, so a prefix it has nothing to plan for now was, as far as the proxy can tell without
/// the store, never edited. What this cannot see is a budget smaller then than now (a
/// calibrated count that moved since, a request asking for more room for its answer).
fn untouched_before_thinking(
    wire: adapter::Wire,
    messages: &[Value],
    per_message: &[usize],
    fixed: usize,
    settings: &Settings,
    env: &dyn engine::Env,
) -> bool {
    if wire != adapter::Wire::Messages {
        return true;
    }
    let Some(last) = messages.iter().rposition(adapter::messages::has_thinking) else {
        return true;
    };
    let before = &per_message[..last.min(per_message.len())];
    engine::nothing_to_do(
        wire.adapter(),
        fixed + before.iter().sum::<usize>(),
        before,
        &messages[..before.len()],
        settings,
        env,
    )
}

/// Whether the engine's new messages name stored content (see
/// [`Plan::refers_to_stored_content`]).
fn refers_to_stored_content(outcome: &engine::Outcome) -> bool {
    outcome.messages.is_some()
        && outcome.writes.iter().any(|w| {
            matches!(
                w.action,
                engine::Action::Truncated | engine::Action::Compacted | engine::Action::MovedOut
            )
        })
}

/// What the store holds for a conversation's prefix.
struct SessionState {
    prior: Decision,
    /// The store did not answer: the plan is made without the session's state.
    store_failed: bool,
    /// Summaries are placed and planned for this request.
    summarize: bool,
    ready: Vec<summary_store::Recorded>,
}

/// Plans requests: the decision lookup, the engine, the summaries.
pub struct Planner {
    config: ContextConfig,
    counter: Counter,
    store: Arc<dyn Store>,
    decisions: Decisions,
    /// The proxy's tool calls hidden from clients, per session.
    hidden: crate::proxy_tools::hidden::Hidden,
    /// Summaries of moved-out spans, by the prefix they cover.
    summaries: summary_store::Summaries,
    /// Content hash → reference, so a compacted message is not hashed with SHA-256 every turn.
    references: caches::PerMessage<ContentRef>,
    /// Content hash → lossless form of a tool result (`None`: no transform applies), so each
    /// result is transformed once.
    transformed: caches::PerMessage<Option<Arc<transforms::Lossless>>>,
    /// Context limits stated by upstreams, per upstream and model.
    learned: limits::LearnedLimits,
    /// When each session last sent a request to this process: whether the provider's cache
    /// may still hold its prefix (unknown: assumed warm).
    last_seen: Cache<Identity, Instant>,
    /// Sessions already warned that their budget costs more than going direct.
    warned: Cache<Identity, ()>,
    /// Each Messages conversation's counting factor, learned from its answers' usage (there
    /// is no public Claude tokenizer: [`estimate`]).
    calibrations: Cache<Identity, Calibration>,
    /// Whether other processes serve the same sessions (a shared store): then this process
    /// sees only some of a session's requests, and never judges its cache expired.
    shared: bool,
}

/// The engine's view of counting and addressing, with caches.
struct CachedEnv<'a> {
    counter: &'a Counter,
    /// The wire format's counting of one item.
    adapter: &'a dyn adapter::Adapter,
    references: &'a caches::PerMessage<ContentRef>,
    transformed: &'a caches::PerMessage<Option<Arc<transforms::Lossless>>>,
    /// The wire `adapter` reads.
    wire: adapter::Wire,
}

impl Env for CachedEnv<'_> {
    fn count_message(&self, message: &Value) -> usize {
        self.adapter.count_item(self.counter, message)
    }

    fn reference(&self, text: &str) -> ContentRef {
        let key = xxh3_128(text.as_bytes());
        match self.references.get_or_insert_with(&key, || {
            Ok::<_, std::convert::Infallible>(ContentRef::of(text))
        }) {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    fn lossless(&self, text: &str) -> Option<Arc<transforms::Lossless>> {
        let key = xxh3_128(text.as_bytes());
        match self.transformed.get_or_insert_with(&key, || {
            Ok::<_, std::convert::Infallible>(transforms::lossless(text).map(Arc::new))
        }) {
            Ok(form) => form,
            Err(never) => match never {},
        }
    }
}

impl Planner {
    pub fn new(config: ContextConfig, counter: Counter, store: Arc<dyn Store>) -> Planner {
        Planner {
            config,
            counter,
            decisions: Decisions::new(store.clone()),
            hidden: crate::proxy_tools::hidden::Hidden::new(store.clone()),
            summaries: summary_store::Summaries::new(store.clone()),
            store,
            references: caches::references(),
            transformed: caches::transformed(),
            learned: limits::LearnedLimits::new(),
            last_seen: caches::last_seen(),
            warned: caches::per_session(),
            calibrations: caches::per_session(),
            shared: false,
        }
    }

    /// Serving sessions that other processes serve too (see
    /// [`ContextManager::with_shared_sessions`](super::ContextManager::with_shared_sessions)).
    pub fn with_shared_sessions(mut self, shared: bool) -> Planner {
        self.shared = shared;
        self
    }

    /// The `[context]` settings.
    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    /// Summaries of moved-out spans, by the prefix they cover.
    pub fn summaries(&self) -> &summary_store::Summaries {
        &self.summaries
    }

    /// The token counter for `model` (or the upstream's `encoding`).
    pub fn counter_for(&self, model: &str, encoding: Option<Encoding>) -> Counter {
        self.counter
            .with_encoding(encoding.unwrap_or_else(|| Encoding::for_model(model)))
    }

    /// Records that `id` sends a request now; returns when it sent the previous one.
    fn touch(&self, id: &Identity) -> Option<Instant> {
        let previous = self.last_seen.get(id);
        self.last_seen.insert(id.clone(), Instant::now());
        previous
    }

    /// How much `identity`'s answers correct the counts of `wire`'s adapter: the learned
    /// factor over the default one for an estimated wire (Messages), else 1.
    fn scale(&self, wire: adapter::Wire, identity: &Identity) -> f64 {
        match (wire, self.calibrations.get(identity)) {
            (adapter::Wire::Messages, Some(c)) if c.learned => c.factor / estimate::DEFAULT_FACTOR,
            _ => 1.0,
        }
    }

    /// An answer to `identity`'s request reported `actual` prompt tokens (Anthropic's input,
    /// cache writes and cache reads together) for a request the proxy counted as `estimated`:
    /// the conversation's counting factor follows ([`Calibration::observe`]). Only an estimated
    /// wire (Messages) is corrected; returns the factor now in use.
    pub fn observe_usage(
        &self,
        identity: &Identity,
        wire: adapter::Wire,
        estimated: usize,
        actual: usize,
    ) -> Option<f64> {
        if wire != adapter::Wire::Messages {
            return None;
        }
        let before = self.calibrations.get(identity).unwrap_or_default();
        // The BPE tokens behind the estimate: counts are in the default estimate's units.
        let raw = (estimated as f64 / estimate::DEFAULT_FACTOR).round() as usize;
        let after = before.observe(raw, actual);
        if after != before {
            self.calibrations.insert(identity.clone(), after);
        }
        tracing::debug!(
            estimated,
            actual,
            factor = after.factor,
            "the Messages estimate corrected from the answer's usage"
        );
        Some(after.factor)
    }

    /// Says once per session, in a warning, that its budget forces cuts that cost more than
    /// going direct, and which budget would pay; whether it said so now. The engine's budgets
    /// are in its own units, less the room kept for the proxy's tools: `room` and `scale`
    /// bring the one that pays back to the operator's `max_context_tokens`.
    fn warn_unpaid(
        &self,
        id: &Identity,
        settings: &Settings,
        unpaid: engine::Unpaid,
        room: usize,
        scale: f64,
    ) -> bool {
        if self.warned.contains_key(id) {
            return false;
        }
        self.warned.insert(id.clone(), ());
        let advice = match unpaid.smallest_paying_budget {
            Some(b) => {
                let b = ((b + room) as f64 * scale).ceil() as usize;
                format!("a budget of at least {b} tokens would pay (context.max_context_tokens)")
            }
            None => format!(
                "no budget up to 64 times this one would pay over the next {} requests: a cut \
                 writes what it keeps again, which these cache prices pay back only over a longer \
                 conversation",
                settings.cache_horizon_turns
            ),
        };
        tracing::warn!(
            session = %id.session,
            budget = settings.budget,
            ratio = format!("{:.2}", unpaid.ratio),
            "the context budget forces cuts that cost {:.2}× going direct under the upstream's cache prices; {advice}",
            unpaid.ratio,
        );
        true
    }

    /// The context limit an upstream states in an error answer (status and body as the
    /// upstream sent them), for a retry of the request that drew it. The limit is also learned
    /// for the next requests of `model` on `upstream` when the request's own size supports it
    /// (`limits::Evidence`): at first for its tenant only, for every tenant once confirmed.
    pub async fn learn_from_upstream_error(
        &self,
        upstream: &str,
        model: &str,
        status: u16,
        body: &[u8],
        drawn: &limits::Drawn<'_>,
    ) -> Option<usize> {
        let limit = limits::stated_limit(status, body)?;
        let request = RequestLimits {
            upstream_default_window: drawn.default_window,
            ..RequestLimits::default()
        };
        let evidence = limits::Evidence {
            tenant: drawn.tenant,
            sent_tokens: drawn.sent_tokens,
            requested_output: RequestLimits::requested_output_of(drawn.sent),
            window: self.config.known_window(model, &request),
        };
        if self
            .learned
            .learn(&*self.store, upstream, model, limit, &evidence)
            .await
        {
            tracing::info!(
                upstream,
                model,
                limit,
                "learned the context limit from the upstream (for this tenant until confirmed)"
            );
        } else if !evidence.supports(limit) {
            tracing::info!(
                upstream,
                model,
                limit,
                sent_tokens = drawn.sent_tokens,
                "the upstream states a context limit the request does not support: not learned"
            );
        }
        Some(limit)
    }

    /// The upstream answered the request retried against `limit`: the limit holds for every
    /// tenant's requests of `model` on `upstream`.
    pub async fn confirm_limit(&self, upstream: &str, model: &str, limit: usize) {
        if self
            .learned
            .confirm(&*self.store, upstream, model, limit)
            .await
        {
            tracing::info!(
                upstream,
                model,
                limit,
                "confirmed the learned context limit for every tenant"
            );
        }
    }

    /// `body`'s size against its budget and its model's window, before planning and without
    /// noting the request (`Sizing`): the count the plan starts from and the correction it
    /// would apply.
    pub async fn sizing(
        &self,
        identity: &Identity,
        body: &Value,
        mode: Mode,
        route: &Route<'_>,
    ) -> Sizing {
        let model = body.get("model").and_then(Value::as_str).unwrap_or("");
        self.learned.load(&*self.store).await;
        let counter = self.counter_for(model, route.encoding);
        let tokens = route.wire.adapter().count(&counter, body).total;
        let limits = self.request_limits(route, model, body, &identity.tenant);
        Sizing {
            tokens,
            scale: self.scale(route.wire, identity),
            budget: self.config.resolve(model, mode, &limits).budget,
            window: self.config.limits_of(model, &limits).window,
        }
    }

    /// The budget of a second attempt after the upstream stated its `limit`: well below the
    /// input limit it implies, and well below what was sent.
    pub fn retry_budget(&self, limit: usize, body: &Value, sent_tokens: usize) -> usize {
        let output = RequestLimits::requested_output_of(body)
            .unwrap_or(self.config.output_reserve_tokens)
            .min(limit / 2);
        let input = limit.saturating_sub(output);
        (input * 6 / 10).min(sent_tokens * 6 / 10).max(1)
    }

    /// What this request adds to the config's budget: its `max_completion_tokens` /
    /// `max_tokens`, the upstream's default window, and the limit learned for its model on that
    /// upstream.
    fn request_limits(
        &self,
        route: &Route<'_>,
        model: &str,
        body: &Value,
        tenant: &Tenant,
    ) -> RequestLimits {
        RequestLimits {
            requested_output: RequestLimits::requested_output_of(body),
            upstream_default_window: route.default_window,
            learned_window: self.learned.get(route.upstream, model, tenant),
        }
    }

    /// The settings of one request of `model` in `mode` on `route` (its limits, the route's
    /// prices and readback, a retry's smaller budget), and whether the provider's cache may
    /// still hold the conversation's prefix (noting that it sends a request now).
    async fn settings_for(
        &self,
        identity: &Identity,
        route: &Route<'_>,
        model: &str,
        mode: Mode,
        body: &Value,
    ) -> (Settings, bool) {
        let last_seen = self.touch(identity);
        self.learned.load(&*self.store).await;
        let limits = self.request_limits(route, model, body, &identity.tenant);
        let mut settings = self.config.resolve(model, mode, &limits);
        settings.readback = route.readback.clone();
        if let Some(cache) = route.cache {
            settings.cache = cache;
        }
        let cache_warm = self.shared
            || last_seen.is_none_or(|t| t.elapsed().as_secs() < settings.cache.cache_ttl_secs);
        if let Some(budget) = route.budget_override.filter(|&b| b < settings.budget) {
            settings.target = (budget as f64 * self.config.target_ratio) as usize;
            settings.truncate_tokens = settings
                .truncate_tokens
                .min(budget / 2)
                .max(settings::MIN_TRUNCATE_TOKENS);
            settings.budget = budget;
        }
        (settings, cache_warm)
    }

    /// Puts back the proxy's own tool calls hidden from the client into `body`'s messages;
    /// returns how many. A store error only warns: the conversation is planned as sent.
    async fn restore_hidden(
        &self,
        identity: &Identity,
        wire: adapter::Wire,
        body: &mut Value,
    ) -> usize {
        use crate::proxy_tools::hidden::Shape;
        use adapter::Wire;
        let (shape, key) = match wire {
            Wire::Chat => (Shape::Chat, "messages"),
            Wire::Responses => (Shape::Responses, "input"),
            // The proxy's tools are not offered on Messages (yet): nothing was hidden.
            Wire::Messages => return 0,
        };
        let Some(Value::Array(list)) = body.get_mut(key) else {
            return 0;
        };
        match self
            .hidden
            .restore(&identity.tenant, &identity.session, shape, list)
            .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the proxy's hidden tool calls: planning the conversation as the client sent it");
                0
            }
        }
    }

    /// The decision recorded for the conversation's prefix and, when `summarize` (and the
    /// store answers), the summaries recorded for it.
    async fn session_state(
        &self,
        identity: &Identity,
        prefixes: &Prefixes,
        summarize: bool,
    ) -> SessionState {
        let (prior, store_failed) = match self.decisions.lookup(identity, prefixes).await {
            Ok(d) => (d, false),
            Err(e) => {
                tracing::warn!(error = %e, "context store unavailable: deciding without the session's state");
                (Decision::default(), true)
            }
        };
        let summarize = summarize && !store_failed;
        let mut ready = Vec::new();
        if summarize {
            match self.summaries.matching(identity, prefixes).await {
                Ok(found) => ready = found,
                Err(e) => tracing::warn!(error = %e, "cannot read the session's summaries"),
            }
        }
        SessionState {
            prior,
            store_failed,
            summarize,
            ready,
        }
    }

    /// Plan: counts the request, looks up the decision recorded for its conversation's prefix
    /// (only when the pure engine says a decision could matter) and runs the engine. Never
    /// fails: a store error is logged and the engine decides without the session's state.
    pub async fn plan(
        &self,
        identity: Option<&Identity>,
        body: &mut Value,
        mode: Mode,
        route: &Route<'_>,
    ) -> Plan {
        let mut client_parts = None;
        let mut plan = self
            .plan_counted(identity, body, mode, route, &mut client_parts)
            .await;
        plan.client_parts = client_parts;
        plan
    }

    /// [`Planner::plan`], leaving the client's request as prefix parts in `client_parts`
    /// once it is counted.
    async fn plan_counted(
        &self,
        identity: Option<&Identity>,
        body: &mut Value,
        mode: Mode,
        route: &Route<'_>,
        client_parts: &mut Option<crate::tokens::Parts>,
    ) -> Plan {
        let encoding = route.encoding;
        let started = Instant::now();
        if mode == Mode::Off {
            // Untouched and uncounted: pass-through never loads the BPE tables.
            return Plan::off();
        }
        let model = body.get("model").and_then(Value::as_str).unwrap_or("");
        let counter = self
            .counter
            .with_encoding(encoding.unwrap_or_else(|| Encoding::for_model(model)));
        let adapter = route.wire.adapter();
        let mut count = adapter.count(&counter, body);
        if route.journal {
            *client_parts = Some(crate::tokens::Parts::of(
                &count,
                model,
                matches!(route.wire, adapter::Wire::Responses),
            ));
        }
        let mut report = Report {
            tokens_before: count.total,
            tokens_after: count.total,
            ..Report::default()
        };
        let (Some(identity), Some(messages)) = (identity, adapter.payloads(body)) else {
            let report = Report {
                skipped: Some(Skipped::NoMessages),
                ..report
            };
            return Plan::unchanged(report);
        };
        let (mut settings, cache_warm) =
            self.settings_for(identity, route, model, mode, body).await;
        // A calibrated estimate: the counts stay in the default estimate's units (a marker
        // stating a size stays byte-stable from one request to the next) and the budget is
        // brought to them. An exact count of this request corrects it for this request alone.
        let scale = route
            .scale
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| self.scale(route.wire, identity));
        if scale != 1.0 {
            settings.budget = ((settings.budget as f64 / scale) as usize).max(1);
            settings.target = (settings.target as f64 / scale) as usize;
        }
        let env = CachedEnv {
            counter: &counter,
            adapter,
            references: &self.references,
            transformed: &self.transformed,
            wire: route.wire,
        };
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        let untouched_before_thinking = untouched_before_thinking(
            route.wire,
            &messages,
            &count.per_message,
            fixed,
            &settings,
            &env,
        );
        let first_look = Input::read(adapter, &messages, &count.per_message, &[], fixed);
        // A head that crowds the budget gets the proxy's tools from the first request on:
        // their room is kept free in every request of the conversation.
        let crowded = engine::head_crowds_budget(&first_look, &settings);
        let tools_room = if crowded { route.reserved_tokens } else { 0 };
        if !self.summary_ahead(route, mode, count.total, &settings)
            && engine::nothing_to_do(
                adapter,
                count.total + tools_room,
                &count.per_message,
                &messages,
                &settings,
                &env,
            )
        {
            report.kept_prefix_tokens = first_look.unchanged_prefix_tokens();
            report.head_crowds_budget = crowded;
            return Plan {
                untouched_before_thinking,
                ..Plan::unchanged(report)
            };
        }
        drop(first_look);
        // Put back the proxy's own tool calls hidden from the client. Only a conversation that
        // needs planning can hold them: one was made when an earlier, shorter request of it
        // showed a reference, and what made that request need planning is still here.
        let restored = self.restore_hidden(identity, route.wire, body).await;
        if restored > 0 {
            count = adapter.count(&counter, body);
            report.tokens_before = count.total;
            report.tokens_after = count.total;
        }
        let Some(messages) = adapter.payloads(body) else {
            return Plan {
                untouched_before_thinking,
                ..Plan::unchanged(report)
            };
        };
        // Counted from this very body (after any restore): the hashes are its messages'.
        debug_assert_eq!(count.message_hashes.len(), messages.len());
        let prefixes = Prefixes::from_hashes(count.message_hashes.iter().copied());
        let SessionState {
            prior,
            store_failed,
            summarize,
            ready,
        } = self
            .session_state(identity, &prefixes, route.summarize && mode.offloads())
            .await;
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        // A ready summary may move the boundary to the end of the span it covers, when the
        // engine finds that it pays.
        let input = Input {
            cache_warm,
            ready_summary: ready.first().map(|best| engine::ReadySummary {
                prefix_len: best.prefix_len,
                tokens: counter.count_text(&best.summary),
            }),
            ..Input::read(
                adapter,
                &messages,
                &count.per_message,
                &count.message_hashes,
                fixed,
            )
        };
        let budget_before_room = settings.budget;
        // The room a summary takes in the marker is kept only for a summary that will be
        // there: one ready, or one that pays. Without one ready, the request is planned
        // without that room first (a marker alone); when a summary of what it moves out pays,
        // again with the room kept, and the summary is asked for if it still pays then.
        let with_room = settings.clone();
        let lean = summarize
            && ready.is_empty()
            && settings.cut_reserve_tokens > settings::MARKER_RESERVE_TOKENS;
        if lean {
            settings.cut_reserve_tokens = settings::MARKER_RESERVE_TOKENS;
        }
        let mut outcome = decide(
            &input,
            &mut settings,
            prior,
            &env,
            route.reserved_tokens,
            crowded,
        );
        let (summary, marker) = if summarize && outcome.report.skipped.is_none() {
            let model = body.get("model").and_then(Value::as_str).unwrap_or("");
            let mut planned = self.plan_summary(
                &input,
                &settings,
                &mut outcome,
                prior,
                &ready,
                &prefixes,
                &counter,
                &env,
                model,
            );
            if lean && matches!(planned.0, SummaryPlan::Missing(_)) {
                let mut roomy = with_room;
                let mut again = decide(
                    &input,
                    &mut roomy,
                    prior,
                    &env,
                    route.reserved_tokens,
                    crowded,
                );
                let replanned = self.plan_summary(
                    &input, &roomy, &mut again, prior, &ready, &prefixes, &counter, &env, model,
                );
                if matches!(replanned.0, SummaryPlan::Missing(_)) {
                    (settings, outcome, planned) = (roomy, again, replanned);
                } else {
                    planned = (SummaryPlan::Unpaid { ahead: false }, planned.1, None);
                }
            }
            let (plan, marker, held) = planned;
            // The warning prices the summary the marker holds or is to hold with the cut.
            if let (Some(call), Some(priced)) = (held, outcome.report.priced) {
                if priced.cut {
                    outcome.report.costlier_than_direct = priced.unpaid(Some(&call));
                }
            }
            (plan, marker)
        } else {
            (SummaryPlan::None, None)
        };
        if let Some(unpaid) = outcome.report.costlier_than_direct {
            let room = budget_before_room.saturating_sub(settings.budget);
            outcome.report.warn_unpaid = self.warn_unpaid(identity, &settings, unpaid, room, scale);
        }
        trace(&outcome, &settings, started);
        Plan {
            report: outcome.report.clone(),
            counted: true,
            store_failed,
            restored,
            untouched_before_thinking,
            decided: Some(Decided {
                wire: route.wire,
                prefixes,
                prior,
                outcome,
                marker,
            }),
            summary,
            client_parts: None,
        }
    }

    /// Over the summarizer's soft watermark, a summary may be started ahead of time: the
    /// request needs planning even when the engine would change nothing.
    fn summary_ahead(
        &self,
        route: &Route<'_>,
        mode: Mode,
        tokens: usize,
        settings: &Settings,
    ) -> bool {
        let cfg = &self.config.summarizer;
        route.summarize
            && mode.offloads()
            && cfg.enabled
            && tokens as f64 > cfg.soft_ratio * settings.budget as f64
    }

    /// What the summarizer's call for `job` costs, priced by the price table in full-price
    /// input tokens of the request's `model`: its prompt and the span as counted, and a summary
    /// expected as long as the summarizer may write (`max_summary_tokens`), and never longer
    /// than what it reads. The bound: a summary that pays at it pays at any shorter length.
    fn summary_call(
        &self,
        job: &SummaryJob,
        model: &str,
        counter: &Counter,
    ) -> engine::SummaryCall {
        let cfg = &self.config.summarizer;
        let count = |t: &str| counter.count_text(t);
        let input = count(&summary::system_prompt(cfg.instructions.as_deref()))
            + count(&summary::user_prompt(job.previous.as_deref(), &job.span));
        let by = cfg.model.as_deref().unwrap_or(model);
        engine::SummaryCall {
            input,
            output: cfg.max_summary_tokens.min(input),
            input_price: ModelPrice::relative_cost(by, model, 1, 0),
            output_price: ModelPrice::relative_cost(by, model, 0, 1),
        }
    }

    /// After the engine ran: places the summary of the moved-out span when it is ready (else
    /// the previous one, with the marker naming every original), or says which summary is
    /// worth computing: one that pays ([`engine::summary_pays`]), else none
    /// ([`SummaryPlan::Unpaid`]). Also returns the summary the marker holds or is to hold with
    /// this request's cut, as the warning prices it (a ready one at no cost: it was paid).
    #[allow(clippy::too_many_arguments)]
    fn plan_summary(
        &self,
        input: &Input<'_>,
        settings: &Settings,
        outcome: &mut engine::Outcome,
        prior: Decision,
        ready: &[summary_store::Recorded],
        prefixes: &Prefixes,
        counter: &Counter,
        env: &CachedEnv<'_>,
        model: &str,
    ) -> (SummaryPlan, Option<MarkerSlot>, Option<engine::SummaryCall>) {
        let cfg = &self.config.summarizer;
        let job =
            |from: usize, end: usize, previous: Option<&summary_store::Recorded>, blocking| {
                let count = |t: &str| counter.count_text(t);
                let room = cfg
                    .max_input_tokens
                    .saturating_sub(cfg.max_summary_tokens + 1_000)
                    .saturating_sub(previous.map_or(0, |p| count(&p.summary)));
                let prefix_hash = summary_store::hash_hex(prefixes.get(end)?);
                Some(SummaryJob {
                    prefix_len: end,
                    prefix_hash,
                    previous: previous.map(|p| p.summary.clone()),
                    span: summary::render_span(
                        input.adapter,
                        &input.messages[from..end],
                        settings.tool_result_max_tokens,
                        room.max(1_000),
                        &count,
                    ),
                    blocking,
                    encoding: counter.encoding(),
                })
            };
        if let Some(moved) = outcome.moved.clone() {
            let Some(messages) = outcome.messages.as_mut() else {
                return (SummaryPlan::None, None, None);
            };
            let Some(marker) = messages
                .get(moved.start)
                .and_then(|m| env.adapter.text(m))
                .map(|t| t.into_owned())
            else {
                return (SummaryPlan::None, None, None);
            };
            let slot = MarkerSlot {
                index: moved.start,
                marker,
                encoding: counter.encoding(),
                wire: env.wire,
            };
            let exact = ready.iter().find(|r| r.prefix_len == moved.end);
            let previous = ready
                .iter()
                .find(|r| r.prefix_len < moved.end && r.prefix_len > moved.start);
            let placed = exact.or(previous);
            // A ready summary was paid for: the marker holds its tokens, at no further cost.
            let held = placed.map(|r| engine::SummaryCall {
                input: 0,
                output: counter.count_text(&r.summary).min(cfg.max_summary_tokens),
                input_price: 0.0,
                output_price: 0.0,
            });
            if let Some(r) = placed {
                place_into(outcome, &slot, &r.summary, cfg.max_summary_tokens, counter);
            }
            if exact.is_some() {
                return (SummaryPlan::Hit, Some(slot), held);
            }
            let from = previous.map_or(moved.start, |p| p.prefix_len);
            let blocking = moved.end > prior.offload_before;
            let Some(job) = job(from, moved.end, previous, blocking) else {
                return (SummaryPlan::None, Some(slot), held);
            };
            let call = self.summary_call(&job, model, counter);
            if let Some(p) = outcome.report.priced {
                if !engine::summary_pays(p.size, &p.outlook, &call) {
                    return (SummaryPlan::Unpaid { ahead: false }, Some(slot), held);
                }
            }
            return (SummaryPlan::Missing(job), Some(slot), Some(call));
        }
        // Nothing moved out: is the next span worth summarizing ahead of time?
        if (outcome.report.tokens_after as f64) <= cfg.soft_ratio * settings.budget as f64 {
            return (SummaryPlan::None, None, None);
        }
        let forced = Settings {
            budget: 1,
            ..settings.clone()
        };
        let candidate = engine::run(input, &forced, prior, env);
        // Only a forced cut goes past the recent window: a summary made ahead stops there.
        let recent = engine::recent_window_start(input, settings);
        let Some(span) = candidate
            .moved
            .map(|m| m.start..m.end.min(recent))
            .filter(|m| !m.is_empty())
        else {
            return (SummaryPlan::None, None, None);
        };
        let previous = ready
            .iter()
            .find(|r| r.prefix_len < span.end && r.prefix_len > span.start);
        let from = previous.map_or(span.start, |p| p.prefix_len);
        let freed: usize = input.counts[from..span.end].iter().sum();
        if freed < cfg.min_freed_tokens {
            return (SummaryPlan::None, None, None);
        }
        let Some(job) = job(from, span.end, previous, false) else {
            return (SummaryPlan::None, None, None);
        };
        // Priced as if the cut it is made for came now, to the end of the span: this request
        // less the span as it is sent (its latest user message stays), and a marker.
        if let Some(p) = candidate.report.priced {
            let kept_user = candidate.decision.kept_user;
            let now = |i: usize| {
                outcome
                    .messages
                    .as_ref()
                    .and_then(|m| m.get(i))
                    .map_or(input.counts[i], |m| env.count_message(m))
            };
            let moved: usize = span
                .clone()
                .filter(|&i| Some(i) != kept_user)
                .map(now)
                .sum();
            let held = outcome.report.tokens_after;
            let size = held.saturating_sub(moved) + settings::MARKER_RESERVE_TOKENS;
            let at = p.at(settings.budget, settings.target, held, size);
            let call = self.summary_call(&job, model, counter);
            if !engine::summary_pays(at.size, &at.outlook, &call) {
                return (SummaryPlan::Unpaid { ahead: true }, None, None);
            }
        }
        (SummaryPlan::Ahead(job), None, None)
    }

    /// Puts a summary computed while the request waited into the plan's marker message.
    pub fn place_summary(&self, plan: &mut Plan, summary: &str) -> bool {
        let Some(decided) = plan.decided.as_mut() else {
            return false;
        };
        let Some(slot) = decided.marker.as_ref() else {
            return false;
        };
        let counter = self.counter.with_encoding(slot.encoding);
        let max = self.config.summarizer.max_summary_tokens;
        if !place_into(&mut decided.outcome, slot, summary, max, &counter) {
            return false;
        }
        plan.report = decided.outcome.report.clone();
        true
    }
}

/// Replaces the marker message of `slot` by the marker and `summary`, and recounts it.
fn place_into(
    outcome: &mut engine::Outcome,
    slot: &MarkerSlot,
    summary: &str,
    max_summary_tokens: usize,
    counter: &Counter,
) -> bool {
    // Remembered by an earlier version or another replica, it may be longer than its budget.
    let summary = summary::bounded(summary, max_summary_tokens, counter.encoding());
    let Some(messages) = outcome.messages.as_mut() else {
        return false;
    };
    let Some(m) = messages.get_mut(slot.index) else {
        return false;
    };
    // The marker item in the wire's shape (a user text block on Messages), counted as the
    // engine counted it.
    let adapter = slot.wire.adapter();
    let count = |m: &Value| adapter.count_item(counter, m);
    let before = count(m);
    *m = adapter.with_text(m, summary::message_text(&slot.marker, &summary));
    let after = count(m);
    let report = &mut outcome.report;
    report.tokens_after = (report.tokens_after + after).saturating_sub(before);
    // The previous request showed the same summary: it is part of the prefix kept.
    if report.marker_kept {
        report.kept_prefix_tokens = (report.kept_prefix_tokens + after).saturating_sub(before);
    }
    true
}

/// The engine's outcome for `input`. A request that refers to stored content goes out with the
/// proxy's tools (`reserved` tokens): when they would not fit beside it, the engine decides
/// again with their room kept free (`settings` then holds the smaller budget). A conversation
/// whose head crowds the budget (`crowded`, [`engine::head_crowds_budget`]) has them in every
/// request: their room is kept from the start.
fn decide(
    input: &Input<'_>,
    settings: &mut Settings,
    prior: Decision,
    env: &CachedEnv<'_>,
    reserved: usize,
    crowded: bool,
) -> engine::Outcome {
    let keep_room = |settings: &mut Settings| {
        settings.budget = settings.budget.saturating_sub(reserved).max(1);
        settings.target = settings.target.saturating_sub(reserved);
    };
    // The tools go out with every request of a crowded conversation: their room is kept.
    // Otherwise a rewrite that first refers to stored content brings them, and is priced so.
    if crowded && reserved > 0 {
        keep_room(settings);
    } else {
        settings.tools_offer_tokens = reserved;
    }
    let mut outcome = engine::run(input, settings, prior, env);
    if !crowded
        && reserved > 0
        && refers_to_stored_content(&outcome)
        && outcome.report.tokens_after + reserved > settings.budget
    {
        keep_room(settings);
        outcome = engine::run(input, settings, prior, env);
    }
    outcome.report.head_crowds_budget = crowded;
    outcome
}

/// One debug line per plan: what it did and how long it took.
fn trace(outcome: &engine::Outcome, settings: &Settings, started: Instant) {
    tracing::debug!(
        before = outcome.report.tokens_before,
        after = outcome.report.tokens_after,
        actions = %outcome.report.actions(),
        compact_before = outcome.decision.compact_before,
        offload_before = outcome.decision.offload_before,
        budget = settings.budget,
        micros = started.elapsed().as_micros() as u64,
        "context plan"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ContextManager;
    use crate::store::{MemoryStore, StoreConfig, SystemClock};
    use crate::tokens::CountSettings;

    /// The client's prefix parts are what the page's journal reads: built when the journal is
    /// on, from the count the plan made anyway, and not at all when it is off.
    #[tokio::test]
    async fn the_client_parts_are_built_only_for_the_journal() {
        let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
            &StoreConfig::default(),
            Arc::new(SystemClock),
        ));
        let manager = ContextManager::new(ContextConfig::default(), counter.clone(), store);
        let body = serde_json::json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Check every service."}]});
        let tenant = Tenant::from_api_key(Some("sk-a"));
        let identity = manager.identify(tenant, None, &body);
        let plan = |journal: bool| {
            let mut body = body.clone();
            let manager = &manager;
            let identity = identity.clone();
            async move {
                let route = Route {
                    journal,
                    ..Route::default()
                };
                manager
                    .plan(identity.as_ref(), &mut body, Mode::Auto, &route)
                    .await
                    .client_parts
            }
        };
        assert_eq!(plan(false).await, None);
        let expected = crate::tokens::Parts::of(&counter.count_request(&body), "gpt-4o", false);
        assert_eq!(plan(true).await, Some(expected));
    }

    /// A summary's call is priced by the price table in the request's model's full-price input
    /// tokens: a cheaper summarizer model at its own prices; one the table does not know as the
    /// request's model; when neither is known, its input at 1 and its output at 4 (never free).
    /// Its output is expected as long as `max_summary_tokens`, never longer than its input.
    #[tokio::test]
    async fn a_summary_call_is_priced_by_the_summarizer_models_prices() {
        let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
        let planner = |model: Option<&str>| {
            let mut config = ContextConfig::default();
            config.summarizer.model = model.map(str::to_string);
            let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
                &StoreConfig::default(),
                Arc::new(SystemClock),
            ));
            Planner::new(config, counter.clone(), store)
        };
        let job = |span: &str| SummaryJob {
            prefix_len: 3,
            prefix_hash: String::new(),
            previous: None,
            span: span.to_string(),
            blocking: true,
            encoding: Encoding::O200kBase,
        };
        let long = "word ".repeat(4_000);
        let priced = |summarizer: Option<&str>, model: &str| {
            let call = planner(summarizer).summary_call(&job(&long), model, &counter);
            (call.input_price, call.output_price)
        };
        let close = |(a, b): (f64, f64), (x, y): (f64, f64)| {
            assert!(
                (a - x).abs() < 1e-9 && (b - y).abs() < 1e-9,
                "{a}, {b} against {x}, {y}"
            );
        };
        close(
            priced(Some("gpt-4o-mini"), "gpt-4o"),
            (0.15 / 2.5, 0.60 / 2.5),
        );
        close(priced(None, "gpt-4o"), (1.0, 4.0));
        close(priced(None, "gpt-5"), (1.0, 8.0));
        close(priced(Some("my-local-model"), "gpt-5"), (1.0, 8.0));
        close(priced(Some("my-local-model"), "another-one"), (1.0, 4.0));

        let call = planner(None).summary_call(&job(&long), "gpt-4o", &counter);
        let prompt = summary::system_prompt(None) + &summary::user_prompt(None, &long);
        assert!(call.input >= 4_000 && call.input <= counter.count_text(&prompt) + 8);
        assert_eq!(
            call.output,
            ContextConfig::default().summarizer.max_summary_tokens
        );
        let short = planner(None).summary_call(&job("ok"), "gpt-4o", &counter);
        assert_eq!(short.output, short.input);
    }
}
