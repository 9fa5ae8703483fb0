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
pub mod session;
pub mod settings;
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

/// Response headers that tell the client what was done.
pub const TOKENS_BEFORE_HEADER: &str = "x-context-tokens-before";
pub const TOKENS_AFTER_HEADER: &str = "x-context-tokens-after";
pub const ACTIONS_HEADER: &str = "x-context-actions";
/// Request header choosing the mode for one request.
pub const MODE_HEADER: &str = "x-context-mode";

/// Content references remembered as already stored, and content hashes → references.
const MEMORY_REFS: usize = 1_000_000;

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
}

#[derive(Debug)]
struct Decided {
    prefixes: Prefixes,
    prior: Decision,
    outcome: engine::Outcome,
}

impl Plan {
    fn off() -> Plan {
        Plan {
            report: Report::default(),
            counted: false,
            store_failed: false,
            restored: 0,
            decided: None,
        }
    }

    fn unchanged(report: Report) -> Plan {
        Plan {
            report,
            counted: true,
            store_failed: false,
            restored: 0,
            decided: None,
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
        self.decided.as_ref().is_some_and(|d| {
            d.outcome.messages.is_some()
                && d.outcome.writes.iter().any(|w| {
                    matches!(
                        w.action,
                        engine::Action::Truncated
                            | engine::Action::Compacted
                            | engine::Action::MovedOut
                    )
                })
        })
    }
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
    hidden: crate::reload::hidden::Hidden,
    /// Content hash → reference, so a compacted message is not hashed with SHA-256 every turn.
    references: DashMap<u128, ContentRef>,
    /// Content hash → lossless form of a tool result (`None`: no transform applies), so each
    /// result is transformed once.
    transformed: DashMap<u128, Option<Arc<transforms::Lossless>>>,
    /// Context limits stated by upstreams, per upstream and model.
    learned: limits::LearnedLimits,
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
            hidden: crate::reload::hidden::Hidden::new(store.clone()),
            store,
            written: DashMap::new(),
            refresh: std::time::Duration::from_secs(60),
            references: DashMap::new(),
            transformed: DashMap::new(),
            learned: limits::LearnedLimits::new(),
        }
    }

    /// Learns the context limit an upstream states in an error answer (status and body as the
    /// upstream sent them), for the next requests of `model` on `upstream`.
    pub async fn learn_from_upstream_error(
        &self,
        upstream: &str,
        model: &str,
        status: u16,
        body: &[u8],
    ) {
        let Some(limit) = limits::stated_limit(status, body) else {
            return;
        };
        if self
            .learned
            .learn(&*self.store, upstream, model, limit)
            .await
        {
            tracing::info!(
                upstream,
                model,
                limit,
                "learned the context limit from the upstream"
            );
        }
    }

    /// What this request adds to the config's budget: its `max_completion_tokens` /
    /// `max_tokens`, the upstream's default window, and the limit learned for its model on that
    /// upstream.
    fn request_limits(&self, route: &Route<'_>, model: &str, body: &Value) -> RequestLimits {
        RequestLimits {
            requested_output: RequestLimits::requested_output_of(body),
            upstream_default_window: route.default_window,
            learned_window: self.learned.get(route.upstream, model),
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

    /// The `[context.reload]` settings.
    pub fn reload_config(&self) -> &crate::reload::ReloadConfig {
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
        self.learned.load(&*self.store).await;
        let limits = self.request_limits(route, model, body);
        let mut settings = self.config.resolve(model, mode, &limits);
        settings.readback = route.readback.clone();
        let env = CachedEnv {
            counter: &counter,
            references: &self.references,
            transformed: &self.transformed,
        };
        if engine::nothing_to_do(count.total, &count.per_message, messages, &settings, &env) {
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
        let prefixes = Prefixes::of(messages);
        let mut store_failed = false;
        let prior = match self.decisions.lookup(identity, &prefixes).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "context store unavailable: deciding without the session's state");
                store_failed = true;
                Decision::default()
            }
        };
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        let input = Input {
            messages,
            counts: &count.per_message,
            fixed,
        };
        let outcome = engine::run(&input, &settings, prior, &env);
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
            }),
        }
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
                    let report = Report {
                        tokens_before: report.tokens_before,
                        tokens_after: report.tokens_before,
                        skipped: Some(Skipped::StoreUnavailable),
                        ..Report::default()
                    };
                    return Managed {
                        body: None,
                        report,
                        fail_open: true,
                        counted: true,
                        refs: Vec::new(),
                    };
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

    /// Writes every piece of content the new request refers to, unless this process stored it
    /// less than `refresh` ago: so content is refreshed while requests point to it, and
    /// written back within `refresh` if it was lost.
    async fn write_all(
        &self,
        id: &Identity,
        messages: &[Value],
        writes: &[engine::Write],
    ) -> Result<Vec<usize>, StoreError> {
        let mut stored_now = Vec::new();
        for (n, w) in writes.iter().enumerate() {
            let key = (id.tenant.clone(), w.reference.clone());
            if self
                .written
                .get(&key)
                .is_some_and(|at| at.elapsed() < self.refresh)
            {
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
