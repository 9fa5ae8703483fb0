//! Context management for one chat-completions request: identify the conversation, count it,
//! let the pure [`engine`] decide, write what it removed to the store, and hand back the new
//! body. Fail-open: if anything around the engine fails (the store above all), the request goes
//! out as it came, with a warning.
//!
//! - `settings` — the `[context]` config and the budget for one model;
//! - `units` — cutting a conversation into units that are never split;
//! - `markers` — the texts that stand in for removed content;
//! - `engine` — lossless transforms, truncate, compact, move out (pure);
//! - `transforms` — the lossless transforms of tool results (pure);
//! - `models` — the built-in table of model windows and output limits, with sources;
//! - `limits` — limits stated by upstreams in their errors, learned and remembered;
//! - `session` — tenant, session, prefix hashes and remembered decisions (I/O).

pub mod engine;
pub mod limits;
pub mod markers;
pub mod models;
pub mod quota;
pub mod session;
pub mod settings;
pub mod summaries;
pub mod summary;
pub mod transforms;
pub mod units;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;
use http::HeaderMap;
use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_128;

use crate::store::{ContentRef, Store, StoreError, Tenant};
use crate::tokens::{Counter, Encoding};
pub use engine::Skipped;
use engine::{content_text, Decision, Env, Input, Report, Source};
pub use session::Identity;
use session::{identify, Decisions, Prefixes};
pub use settings::{ContextConfig, Mode, RequestLimits, Settings};

/// Response headers that tell the client what was done, and the request header choosing the
/// mode for one request (the names are the contract crate's).
pub use context_proxy_contract::{
    ACTIONS_HEADER, KEPT_PREFIX_HEADER, MODE_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER,
};

/// Content references remembered as already stored, and content hashes → references.
const MEMORY_REFS: usize = 1_000_000;
/// Sessions whose last request time is remembered (all forgotten at once past it: a forgotten
/// session's cache counts as warm, the safe side).
const LAST_SEEN_SESSIONS: usize = 100_000;

/// What context management did to a request.
#[derive(Debug, Clone)]
pub struct Managed {
    /// The body to send instead of the client's, when it changed.
    pub body: Option<Bytes>,
    pub report: Report,
    /// The request was left unchanged because something around the engine failed.
    pub fail_open: bool,
    /// The request was counted (`report`'s token figures mean something); false in mode off.
    pub counted: bool,
    /// The stored content the new body refers to (empty when it refers to none).
    pub refs: Vec<ContentRef>,
}

impl Managed {
    /// Nothing done and nothing counted (mode off, or before the plan ran).
    pub fn off() -> Managed {
        Managed {
            body: None,
            report: Report::default(),
            fail_open: false,
            counted: false,
            refs: Vec::new(),
        }
    }

    fn unchanged(report: Report) -> Managed {
        Managed {
            body: None,
            report,
            fail_open: false,
            counted: true,
            refs: Vec::new(),
        }
    }

    /// Forwarded as it came, counted as `planned` counted it, for the reason `why`.
    fn skipped(planned: &Report, why: Skipped, fail_open: bool) -> Managed {
        Managed {
            fail_open,
            ..Managed::unchanged(Report {
                tokens_before: planned.tokens_before,
                tokens_after: planned.tokens_before,
                skipped: Some(why),
                ..Report::default()
            })
        }
    }
}

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
    /// Set when the engine ran: what it needs from the session to apply.
    decided: Option<Decided>,
    /// What a summary does for this request (see [`SummaryPlan`]).
    pub summary: SummaryPlan,
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
struct MarkerSlot {
    index: usize,
    marker: String,
    encoding: Encoding,
}

#[derive(Debug)]
struct Decided {
    prefixes: Prefixes,
    prior: Decision,
    outcome: engine::Outcome,
    marker: Option<MarkerSlot>,
}

impl Plan {
    fn off() -> Plan {
        Plan {
            report: Report::default(),
            counted: false,
            store_failed: false,
            restored: 0,
            decided: None,
            summary: SummaryPlan::None,
        }
    }

    fn unchanged(report: Report) -> Plan {
        Plan {
            report,
            counted: true,
            store_failed: false,
            restored: 0,
            decided: None,
            summary: SummaryPlan::None,
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

/// Shared state of context management.
pub struct ContextManager {
    config: ContextConfig,
    counter: Counter,
    store: Arc<dyn Store>,
    decisions: Decisions,
    /// Content this process stored, per tenant, and when: not stored again before `refresh`
    /// has passed (then stored again, which refreshes or restores it).
    written: DashMap<(Tenant, ContentRef), Instant>,
    /// How often forwarded references are stored again (`store.content_refresh_secs`).
    refresh: std::time::Duration,
    /// The proxy's tool calls hidden from clients, per session.
    hidden: crate::proxy_tools::hidden::Hidden,
    /// Summaries of moved-out spans, by the prefix they cover.
    summaries: summaries::Summaries,
    /// Content hash → reference, so a compacted message is not hashed with SHA-256 every turn.
    references: DashMap<u128, ContentRef>,
    /// Content hash → lossless form of a tool result (`None`: no transform applies), so each
    /// result is transformed once.
    transformed: DashMap<u128, Option<Arc<transforms::Lossless>>>,
    /// Context limits stated by upstreams, per upstream and model.
    learned: limits::LearnedLimits,
    /// Daily write quotas per tenant and in all (`store.*quota_bytes_per_day`).
    quotas: quota::Quotas,
    /// Tenants an upstream has accepted (answered 2xx) since this process started: what they
    /// stored is kept when a later answer refuses their key.
    accepted: DashMap<Tenant, ()>,
    /// When each session last sent a request to this process: whether the provider's cache
    /// may still hold its prefix (unknown: assumed warm).
    last_seen: DashMap<Identity, Instant>,
    /// Whether other processes serve the same sessions (a shared store): then this process
    /// sees only some of a session's requests, and never judges its cache expired.
    shared: bool,
}

/// The engine's view of counting and addressing, with caches.
struct CachedEnv<'a> {
    counter: &'a Counter,
    references: &'a DashMap<u128, ContentRef>,
    transformed: &'a DashMap<u128, Option<Arc<transforms::Lossless>>>,
}

impl Env for CachedEnv<'_> {
    fn count_message(&self, message: &Value) -> usize {
        self.counter.count_message(message)
    }

    fn reference(&self, text: &str) -> ContentRef {
        let key = xxh3_128(text.as_bytes());
        if let Some(r) = self.references.get(&key) {
            return r.clone();
        }
        let r = ContentRef::of(text);
        if self.references.len() >= MEMORY_REFS {
            self.references.clear();
        }
        self.references.insert(key, r.clone());
        r
    }

    fn lossless(&self, text: &str) -> Option<Arc<transforms::Lossless>> {
        let key = xxh3_128(text.as_bytes());
        if let Some(t) = self.transformed.get(&key) {
            return t.clone();
        }
        let t = transforms::lossless(text).map(Arc::new);
        if self.transformed.len() >= MEMORY_REFS {
            self.transformed.clear();
        }
        self.transformed.insert(key, t.clone());
        t
    }
}

impl ContextManager {
    pub fn new(config: ContextConfig, counter: Counter, store: Arc<dyn Store>) -> ContextManager {
        ContextManager {
            config,
            counter,
            decisions: Decisions::new(store.clone()),
            hidden: crate::proxy_tools::hidden::Hidden::new(store.clone()),
            summaries: summaries::Summaries::new(store.clone()),
            store,
            written: DashMap::new(),
            refresh: std::time::Duration::from_secs(60),
            references: DashMap::new(),
            transformed: DashMap::new(),
            learned: limits::LearnedLimits::new(),
            quotas: quota::Quotas::new(0, 0),
            accepted: DashMap::new(),
            last_seen: DashMap::new(),
            shared: false,
        }
    }

    /// Serving sessions that other processes serve too (replicas on one Redis): a session's
    /// previous request may have gone to another replica moments ago, so the time this process
    /// last saw it says nothing about the provider's cache, which is then always assumed warm
    /// (a rewrite must pay for itself).
    pub fn with_shared_sessions(mut self, shared: bool) -> ContextManager {
        self.shared = shared;
        self
    }

    /// With daily write quotas: bytes per tenant and for all tenants (0: none).
    pub fn with_quotas(mut self, per_tenant: u64, total: u64) -> ContextManager {
        self.quotas = quota::Quotas::new(per_tenant, total);
        self
    }

    /// Notes that the upstream accepted `tenant`'s key (a 2xx answer).
    pub fn accepted(&self, tenant: &Tenant) {
        if self.accepted.contains_key(tenant) {
            return;
        }
        if self.accepted.len() >= MEMORY_REFS {
            self.accepted.clear();
        }
        self.accepted.insert(tenant.clone(), ());
    }

    /// The upstream refused the key of `identity`'s request `request_id` (401 or 403). When no
    /// upstream has accepted this tenant since the process started and the session holds
    /// nothing from an earlier request, nothing it stored can be legitimate: the session's
    /// state, journal and stored content are erased, `refs` (what this request forwarded)
    /// included, so a rejected key leaves nothing behind for weeks. Returns how many items were
    /// erased (0 for a tenant accepted before: its content may serve its other sessions).
    ///
    /// A journal line of an earlier request means the session was served before (a refused
    /// request leaves no line): its key was accepted then, before a restart say, and this
    /// refusal is about something else (a 403 for a model the key may not use). Its state,
    /// the proxy's hidden tool exchanges included, cannot be rebuilt from the client's history,
    /// so it stays.
    pub async fn rejected(
        &self,
        identity: &Identity,
        refs: &[ContentRef],
        request_id: &str,
    ) -> Result<usize, StoreError> {
        if self.accepted.contains_key(&identity.tenant) {
            return Ok(0);
        }
        let journal = self
            .store
            .read_log(&identity.tenant, &identity.session)
            .await?;
        let served_before = journal.iter().any(|line| {
            line.get("request_id")
                .and_then(Value::as_str)
                .is_some_and(|id| id != request_id)
        });
        if served_before {
            return Ok(0);
        }
        let mut all = crate::sessions::journal_refs(&journal);
        all.extend(refs.iter().cloned());
        all.sort();
        all.dedup();
        let erased = self
            .store
            .erase_session(&identity.tenant, &identity.session, &all)
            .await?;
        // Stored again by the next request that needs them, not skipped as already written.
        for r in &all {
            self.written.remove(&(identity.tenant.clone(), r.clone()));
        }
        Ok(erased)
    }

    /// Records that `id` sends a request now; returns when it sent the previous one.
    fn touch(&self, id: &Identity) -> Option<Instant> {
        if self.last_seen.len() >= LAST_SEEN_SESSIONS {
            self.last_seen.clear();
        }
        self.last_seen.insert(id.clone(), Instant::now())
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

    /// Stores forwarded content again at most once per `every` (`store.content_refresh_secs`).
    pub fn with_content_refresh(mut self, every: std::time::Duration) -> ContextManager {
        self.refresh = every;
        self
    }

    /// The mode of a request: the `x-context-mode` header, else the config's.
    pub fn mode(&self, headers: &HeaderMap) -> Result<Mode, String> {
        match headers.get(MODE_HEADER) {
            None => Ok(self.config.mode),
            Some(v) => v.to_str().ok().and_then(Mode::parse).ok_or_else(|| {
                format!("{MODE_HEADER} must be one of off, compact, compress, auto")
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Summaries of moved-out spans, by the prefix they cover.
    pub fn summaries(&self) -> &summaries::Summaries {
        &self.summaries
    }

    /// The `[context.summarizer]` settings.
    pub fn summarizer_config(&self) -> &summary::SummarizerConfig {
        &self.config.summarizer
    }

    /// The `[context.reload]` settings.
    pub fn reload_config(&self) -> &crate::proxy_tools::ReloadConfig {
        &self.config.reload
    }

    /// The token counter for `model` (or the upstream's `encoding`).
    pub fn counter_for(&self, model: &str, encoding: Option<Encoding>) -> Counter {
        self.counter
            .with_encoding(encoding.unwrap_or_else(|| Encoding::for_model(model)))
    }

    /// Identify: whose conversation `body` is, or `None` when it has no `messages` array.
    pub fn identify(&self, headers: &HeaderMap, body: &Value) -> Option<Identity> {
        let messages = body.get("messages").and_then(Value::as_array)?;
        Some(identify(headers, messages))
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
        let mut count = counter.count_request(body);
        let mut report = Report {
            tokens_before: count.total,
            tokens_after: count.total,
            ..Report::default()
        };
        let (Some(identity), Some(messages)) =
            (identity, body.get("messages").and_then(Value::as_array))
        else {
            let report = Report {
                skipped: Some(Skipped::NoMessages),
                ..report
            };
            return Plan::unchanged(report);
        };
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
        let env = CachedEnv {
            counter: &counter,
            references: &self.references,
            transformed: &self.transformed,
        };
        // Over the summarizer's soft watermark, a summary may be started ahead of time.
        let summary_ahead = route.summarize
            && mode.offloads()
            && self.config.summarizer.enabled
            && count.total as f64 > self.config.summarizer.soft_ratio * settings.budget as f64;
        if !summary_ahead
            && engine::nothing_to_do(count.total, &count.per_message, messages, &settings, &env)
        {
            let fixed = count.total - count.per_message.iter().sum::<usize>();
            report.kept_prefix_tokens =
                Input::new(messages, &count.per_message, fixed).unchanged_prefix_tokens();
            return Plan::unchanged(report);
        }
        // Put back the proxy's own tool calls hidden from the client. Only a conversation that
        // needs planning can hold them: one was made when an earlier, shorter request of it
        // showed a reference, and what made that request need planning is still here.
        let mut restored = 0;
        if let Some(Value::Array(list)) = body.get_mut("messages") {
            match self.hidden.restore(identity, list).await {
                Ok(n) => restored = n,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the proxy's hidden tool calls: planning the conversation as the client sent it")
                }
            }
        }
        if restored > 0 {
            count = counter.count_request(body);
            report.tokens_before = count.total;
            report.tokens_after = count.total;
        }
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return Plan::unchanged(report);
        };
        // Counted from this very body (after any restore): the hashes are its messages'.
        debug_assert_eq!(count.message_hashes.len(), messages.len());
        let prefixes = Prefixes::from_hashes(count.message_hashes.iter().copied());
        let mut store_failed = false;
        let prior = match self.decisions.lookup(identity, &prefixes).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "context store unavailable: deciding without the session's state");
                store_failed = true;
                Decision::default()
            }
        };
        let summarize = route.summarize && mode.offloads() && !store_failed;
        let mut ready = Vec::new();
        if summarize {
            match self.summaries.matching(identity, &prefixes).await {
                Ok(found) => ready = found,
                Err(e) => tracing::warn!(error = %e, "cannot read the session's summaries"),
            }
        }
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        // A ready summary may move the boundary to the end of the span it covers, when the
        // engine finds that it pays.
        let input = Input {
            cache_warm,
            ready_summary: ready.first().map(|best| engine::ReadySummary {
                prefix_len: best.prefix_len,
                tokens: counter.count_text(&best.summary),
            }),
            ..Input::new(messages, &count.per_message, fixed)
        };
        let mut outcome = engine::run(&input, &settings, prior, &env);
        // A request that refers to stored content goes out with the proxy's tools: when they
        // would not fit beside it, decide again with their room kept free.
        if route.reserved_tokens > 0
            && refers_to_stored_content(&outcome)
            && outcome.report.tokens_after + route.reserved_tokens > settings.budget
        {
            settings.budget = settings.budget.saturating_sub(route.reserved_tokens).max(1);
            settings.target = settings.target.saturating_sub(route.reserved_tokens);
            outcome = engine::run(&input, &settings, prior, &env);
        }
        let (summary, marker) = if summarize && outcome.report.skipped.is_none() {
            self.plan_summary(
                &input,
                &settings,
                &mut outcome,
                prior,
                &ready,
                &prefixes,
                &counter,
                &env,
            )
        } else {
            (SummaryPlan::None, None)
        };
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
        Plan {
            report: outcome.report.clone(),
            counted: true,
            store_failed,
            restored,
            decided: Some(Decided {
                prefixes,
                prior,
                outcome,
                marker,
            }),
            summary,
        }
    }

    /// After the engine ran: places the summary of the moved-out span when it is ready (else
    /// the previous one, with the marker naming every original), or says which summary is
    /// worth computing.
    #[allow(clippy::too_many_arguments)]
    fn plan_summary(
        &self,
        input: &Input<'_>,
        settings: &Settings,
        outcome: &mut engine::Outcome,
        prior: Decision,
        ready: &[summaries::Recorded],
        prefixes: &Prefixes,
        counter: &Counter,
        env: &CachedEnv<'_>,
    ) -> (SummaryPlan, Option<MarkerSlot>) {
        let cfg = &self.config.summarizer;
        let job = |from: usize, end: usize, previous: Option<&summaries::Recorded>, blocking| {
            let count = |t: &str| counter.count_text(t);
            let room = cfg
                .max_input_tokens
                .saturating_sub(cfg.max_summary_tokens + 1_000)
                .saturating_sub(previous.map_or(0, |p| count(&p.summary)));
            let prefix_hash = summaries::hash_hex(prefixes.get(end)?);
            Some(SummaryJob {
                prefix_len: end,
                prefix_hash,
                previous: previous.map(|p| p.summary.clone()),
                span: summary::render_span(
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
                return (SummaryPlan::None, None);
            };
            let Some(Value::String(marker)) = messages
                .get(moved.start)
                .and_then(|m| m.get("content"))
                .cloned()
            else {
                return (SummaryPlan::None, None);
            };
            let slot = MarkerSlot {
                index: moved.start,
                marker,
                encoding: counter.encoding(),
            };
            let exact = ready.iter().find(|r| r.prefix_len == moved.end);
            let previous = ready
                .iter()
                .find(|r| r.prefix_len < moved.end && r.prefix_len > moved.start);
            let placed = exact.or(previous);
            if let Some(r) = placed {
                place_into(outcome, &slot, &r.summary, cfg.max_summary_tokens, counter);
            }
            if exact.is_some() {
                return (SummaryPlan::Hit, Some(slot));
            }
            let from = previous.map_or(moved.start, |p| p.prefix_len);
            let blocking = moved.end > prior.offload_before;
            let plan = job(from, moved.end, previous, blocking)
                .map_or(SummaryPlan::None, SummaryPlan::Missing);
            return (plan, Some(slot));
        }
        // Nothing moved out: is the next span worth summarizing ahead of time?
        if (outcome.report.tokens_after as f64) <= cfg.soft_ratio * settings.budget as f64 {
            return (SummaryPlan::None, None);
        }
        let forced = Settings {
            budget: 1,
            ..settings.clone()
        };
        let candidate = engine::run(input, &forced, prior, env);
        let Some(span) = candidate.moved else {
            return (SummaryPlan::None, None);
        };
        let previous = ready
            .iter()
            .find(|r| r.prefix_len < span.end && r.prefix_len > span.start);
        let from = previous.map_or(span.start, |p| p.prefix_len);
        let freed: usize = input.counts[from..span.end].iter().sum();
        if freed < cfg.min_freed_tokens {
            return (SummaryPlan::None, None);
        }
        (
            job(from, span.end, previous, false).map_or(SummaryPlan::None, SummaryPlan::Ahead),
            None,
        )
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

    /// Apply: stores everything the plan removes (before the smaller request can go out),
    /// remembers a changed decision, and writes the new messages into `body`. Returns the new
    /// body's bytes when it changed. Never fails: if a write fails, the request goes out as it
    /// came (fail-open).
    pub async fn apply(
        &self,
        identity: Option<&Identity>,
        plan: Plan,
        body: &mut Value,
        request_id: &str,
    ) -> Managed {
        let Plan {
            report,
            counted,
            store_failed,
            decided,
            ..
        } = plan;
        let (Some(identity), Some(decided)) = (identity, decided) else {
            return Managed {
                body: None,
                report,
                fail_open: store_failed,
                counted,
                refs: Vec::new(),
            };
        };
        let mut decided = decided;
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return Managed::unchanged(report);
        };
        // Reversible: everything removed is stored before the smaller request goes out.
        if decided.outcome.messages.is_some() {
            let day = quota::day_of(std::time::SystemTime::now());
            let charged = match self.charge_quota(identity, messages, &decided.outcome.writes, day)
            {
                Ok(bytes) => bytes,
                Err(scope) => {
                    tracing::warn!(
                        scope = scope.as_str(),
                        tenant = %identity.tenant,
                        "daily store quota reached: forwarding the request unmanaged"
                    );
                    return Managed::skipped(&report, Skipped::QuotaExceeded(scope), false);
                }
            };
            match self
                .write_all(identity, messages, &decided.outcome.writes)
                .await
            {
                Ok(new) => {
                    self.log_stored(identity, &decided.outcome.writes, &new, request_id)
                        .await
                }
                Err(e) => {
                    tracing::warn!(error = %e, "context store write failed: forwarding the request unchanged");
                    // The request stored nothing it can point to: its bytes are given back.
                    self.quotas.refund(&identity.tenant, charged, day);
                    return Managed::skipped(&report, Skipped::StoreUnavailable, true);
                }
            }
        }
        self.remember_decision(identity, &decided, request_id).await;
        let Some(new_messages) = decided.outcome.messages.take() else {
            return Managed::unchanged(report);
        };
        if let Some(slot) = body.get_mut("messages") {
            *slot = Value::Array(new_messages);
        }
        // A `Value` always serializes (its keys are strings).
        let bytes = Bytes::from(body.to_string());
        Managed {
            body: Some(bytes),
            report,
            fail_open: false,
            counted: true,
            refs: decided
                .outcome
                .writes
                .iter()
                .map(|w| w.reference.clone())
                .collect(),
        }
    }

    /// identify, plan and apply in one call (tests and benchmarks).
    pub async fn manage(
        &self,
        headers: &HeaderMap,
        body: &mut Value,
        mode: Mode,
        encoding: Option<Encoding>,
    ) -> Managed {
        let identity = self.identify(headers, body);
        let route = Route {
            encoding,
            ..Route::default()
        };
        let plan = self.plan(identity.as_ref(), body, mode, &route).await;
        self.apply(identity.as_ref(), plan, body, "").await
    }

    /// Charges the bytes of the writes this process has not stored before to the daily quotas
    /// of `day`, and returns them (to refund if the writes fail).
    fn charge_quota(
        &self,
        id: &Identity,
        messages: &[Value],
        writes: &[engine::Write],
        day: u64,
    ) -> Result<u64, quota::Exceeded> {
        let bytes: usize = writes
            .iter()
            .filter(|w| {
                !self
                    .written
                    .contains_key(&(id.tenant.clone(), w.reference.clone()))
            })
            .map(|w| match &w.source {
                Source::Owned(text) => text.len(),
                Source::MessageText(i) => messages
                    .get(*i)
                    .and_then(content_text)
                    .map_or(0, |t| t.len()),
            })
            .sum();
        self.quotas.charge(&id.tenant, bytes as u64, day)?;
        Ok(bytes as u64)
    }

    /// Writes every piece of content the new request refers to, unless this process stored it
    /// less than `refresh` ago (so content is refreshed while requests point to it) and the
    /// store still has it: what was stored recently is checked in one cheap call, and written
    /// again from this request when it was lost (a deleted directory, a flushed or evicted
    /// Redis, an erased session) — a marker never points at nothing. When the store cannot
    /// answer, this fails and the request goes out as it came.
    async fn write_all(
        &self,
        id: &Identity,
        messages: &[Value],
        writes: &[engine::Write],
    ) -> Result<Vec<usize>, StoreError> {
        let recent: Vec<usize> = (0..writes.len())
            .filter(|&n| {
                self.written
                    .get(&(id.tenant.clone(), writes[n].reference.clone()))
                    .is_some_and(|at| at.elapsed() < self.refresh)
            })
            .collect();
        let mut lost = Vec::new();
        if !recent.is_empty() {
            let refs: Vec<ContentRef> = recent
                .iter()
                .map(|&n| writes[n].reference.clone())
                .collect();
            let present = self.store.contains_content(&id.tenant, &refs).await?;
            lost.extend(
                recent
                    .iter()
                    .zip(present)
                    .filter(|(_, present)| !present)
                    .map(|(&n, _)| n),
            );
            if !lost.is_empty() {
                tracing::warn!(
                    lost = lost.len(),
                    "stored content the request points to is gone from the store: writing it again"
                );
            }
        }
        let mut stored_now = Vec::new();
        for (n, w) in writes.iter().enumerate() {
            let key = (id.tenant.clone(), w.reference.clone());
            if recent.binary_search(&n).is_ok() && lost.binary_search(&n).is_err() {
                continue;
            }
            let text = match &w.source {
                Source::Owned(text) => std::borrow::Cow::Borrowed(text.as_str()),
                Source::MessageText(i) => {
                    messages.get(*i).and_then(content_text).ok_or_else(|| {
                        StoreError::Internal(format!("message {i} has no text to store"))
                    })?
                }
            };
            let stored = self
                .store
                .put_content(&id.tenant, &id.session, w.kind, &text)
                .await?;
            if stored != w.reference {
                return Err(StoreError::Internal(format!(
                    "store returned {stored} for content addressed {}",
                    w.reference
                )));
            }
            if self.written.len() >= MEMORY_REFS {
                self.written.clear();
            }
            // Logged the first time this process stores it, not on every refresh.
            if self.written.insert(key, Instant::now()).is_none() {
                stored_now.push(n);
            }
        }
        Ok(stored_now)
    }

    /// Appends one line to the session's journal naming what this request stored that this
    /// process had not stored before (truncated, compacted, moved out, or the original of a
    /// lossless transform; another replica may log the same content once too). Failures only
    /// warn.
    async fn log_stored(
        &self,
        id: &Identity,
        writes: &[engine::Write],
        new: &[usize],
        request_id: &str,
    ) {
        if new.is_empty() {
            return;
        }
        let stored: Vec<Value> = new
            .iter()
            .filter_map(|&n| writes.get(n))
            .map(|w| {
                json!({
                    "ref": w.reference.as_str(),
                    "action": w.action.as_str(),
                    "kind": w.kind.as_str(),
                })
            })
            .collect();
        let record = json!({
            "ts": rfc3339(std::time::SystemTime::now()),
            "request_id": request_id,
            "event": "stored",
            "items": stored,
        });
        if let Err(e) = self
            .store
            .append_log(&id.tenant, &id.session, &record)
            .await
        {
            tracing::warn!(error = %e, "cannot append to the session log");
        }
    }

    /// Records a changed decision in the session state and its log. Failures only warn.
    async fn remember_decision(&self, id: &Identity, decided: &Decided, request_id: &str) {
        let Decided {
            prefixes,
            prior,
            outcome,
            marker: _,
        } = decided;
        let (decision, report, writes) = (outcome.decision, &outcome.report, &outcome.writes);
        if decision == *prior {
            return;
        }
        match self.decisions.record(id, prefixes, decision).await {
            Ok(false) => {}
            Ok(true) => {
                let record = json!({
                    "ts": rfc3339(std::time::SystemTime::now()),
                    "request_id": request_id,
                    "event": "decision",
                    "compact_before": decision.compact_before,
                    "offload_before": decision.offload_before,
                    "tokens_before": report.tokens_before,
                    "tokens_after": report.tokens_after,
                    "actions": report.actions(),
                    "refs": writes.iter().map(|w| w.reference.as_str()).collect::<Vec<_>>(),
                    "kinds": writes.iter().map(|w| w.kind.as_str()).collect::<Vec<_>>(),
                });
                if let Err(e) = self
                    .store
                    .append_log(&id.tenant, &id.session, &record)
                    .await
                {
                    tracing::warn!(error = %e, "cannot append to the session log");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot record the context decision"),
        }
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
    let before = counter.count_message(m);
    if let Some(c) = m.get_mut("content") {
        *c = Value::String(summary::message_text(&slot.marker, &summary));
    }
    let after = counter.count_message(m);
    outcome.report.tokens_after = (outcome.report.tokens_after + after).saturating_sub(before);
    true
}

/// `t` as an RFC 3339 UTC timestamp with milliseconds, e.g. `2026-11-23T21:07:27.123Z`.
fn rfc3339(t: std::time::SystemTime) -> String {
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_554_447_123);
        assert_eq!(rfc3339(t), "2026-11-24T21:07:27.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
