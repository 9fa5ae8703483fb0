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
use engine::{content_text, Decision, Env, Input, Report, Source};
use session::{identify, Decisions, Identity, Prefixes};
pub use settings::{ContextConfig, Mode, RequestLimits, Settings};

/// Response headers that tell the client what was done.
pub const TOKENS_BEFORE_HEADER: &str = "x-context-tokens-before";
pub const TOKENS_AFTER_HEADER: &str = "x-context-tokens-after";
pub const ACTIONS_HEADER: &str = "x-context-actions";
/// Request header choosing the mode for one request.
pub const MODE_HEADER: &str = "x-context-mode";

/// Sessions whose decisions are kept in memory (the store keeps them all).
const MEMORY_SESSIONS: usize = 100_000;
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
}

impl Managed {
    fn unchanged(report: Report) -> Managed {
        Managed {
            body: None,
            report,
            fail_open: false,
            counted: true,
        }
    }
}

/// Shared state of context management.
pub struct ContextManager {
    config: ContextConfig,
    counter: Counter,
    store: Arc<dyn Store>,
    decisions: Decisions,
    /// Content already in the store, per tenant: not written again.
    written: DashMap<(Tenant, ContentRef), ()>,
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
            decisions: Decisions::new(store.clone(), MEMORY_SESSIONS),
            store,
            written: DashMap::new(),
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
    /// `max_tokens` and the limit learned for its model (on `upstream` when known).
    // TODO(merge): pass the routed upstream's name and its default window here.
    fn request_limits(&self, upstream: Option<&str>, model: &str, body: &Value) -> RequestLimits {
        RequestLimits {
            requested_output: RequestLimits::requested_output_of(body),
            upstream_default_window: None,
            learned_window: self.learned.get(upstream, model),
        }
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

    /// Manages the context of `body` (a parsed chat request). Never fails: on any error the
    /// request is left unchanged and the error logged.
    pub async fn manage(
        &self,
        headers: &HeaderMap,
        body: &mut Value,
        mode: Mode,
        encoding: Option<Encoding>,
    ) -> Managed {
        let started = Instant::now();
        if mode == Mode::Off {
            // Untouched and uncounted: pass-through never loads the BPE tables.
            return Managed {
                body: None,
                report: Report::default(),
                fail_open: false,
                counted: false,
            };
        }
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let counter = self
            .counter
            .with_encoding(encoding.unwrap_or_else(|| Encoding::for_model(&model)));
        let count = counter.count_request(body);
        let mut report = Report {
            tokens_before: count.total,
            tokens_after: count.total,
            ..Report::default()
        };
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            report.skipped = Some("no messages array".into());
            return Managed::unchanged(report);
        };
        self.learned.load(&*self.store).await;
        let limits = self.request_limits(None, &model, body);
        let settings = self.config.resolve(&model, mode, &limits);
        // Nothing to transform, truncate or compact and within budget: no decision can change it.
        let largest = count.per_message.iter().copied().max().unwrap_or(0);
        if count.total <= settings.budget
            && largest
                <= settings
                    .tool_result_max_tokens
                    .min(settings.truncate_tokens)
            && !(settings.lossless && engine::has_tool_results(messages))
        {
            return Managed::unchanged(report);
        }
        let identity = identify(headers, messages);
        let prefixes = Prefixes::of(messages);
        let prior = match self.decisions.lookup(&identity, &prefixes).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "context store unavailable: deciding without the session's state");
                Decision::default()
            }
        };
        let fixed = count.total - count.per_message.iter().sum::<usize>();
        let env = CachedEnv {
            counter: &counter,
            references: &self.references,
            transformed: &self.transformed,
        };
        let input = Input {
            messages,
            counts: &count.per_message,
            fixed,
        };
        let outcome = engine::run(&input, &settings, prior, &env);
        let report = outcome.report.clone();

        // Reversible: everything removed is stored before the smaller request goes out.
        if outcome.messages.is_some() {
            if let Err(e) = self.write_all(&identity, messages, &outcome.writes).await {
                tracing::warn!(error = %e, "context store write failed: forwarding the request unchanged");
                let report = Report {
                    tokens_before: count.total,
                    tokens_after: count.total,
                    skipped: Some("store unavailable".into()),
                    ..Report::default()
                };
                return Managed {
                    body: None,
                    report,
                    fail_open: true,
                    counted: true,
                };
            }
        }
        self.remember_decision(
            &identity,
            &prefixes,
            prior,
            outcome.decision,
            &report,
            &outcome.writes,
        )
        .await;
        tracing::debug!(
            before = report.tokens_before,
            after = report.tokens_after,
            actions = %report.actions(),
            compact_before = outcome.decision.compact_before,
            offload_before = outcome.decision.offload_before,
            budget = settings.budget,
            micros = started.elapsed().as_micros() as u64,
            "context plan"
        );
        let Some(new_messages) = outcome.messages else {
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
        }
    }

    /// Writes every piece of content the new request refers to (unless already stored).
    async fn write_all(
        &self,
        id: &Identity,
        messages: &[Value],
        writes: &[engine::Write],
    ) -> Result<(), StoreError> {
        for w in writes {
            let key = (id.tenant.clone(), w.reference.clone());
            if self.written.contains_key(&key) {
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
            self.written.insert(key, ());
        }
        Ok(())
    }

    /// Records a changed decision in the session state and its log. Failures only warn.
    async fn remember_decision(
        &self,
        id: &Identity,
        prefixes: &Prefixes,
        prior: Decision,
        decision: Decision,
        report: &Report,
        writes: &[engine::Write],
    ) {
        if decision == prior {
            return;
        }
        match self.decisions.record(id, prefixes, decision).await {
            Ok(false) => {}
            Ok(true) => {
                let record = json!({
                    "event": "decision",
                    "compact_before": decision.compact_before,
                    "offload_before": decision.offload_before,
                    "tokens_before": report.tokens_before,
                    "tokens_after": report.tokens_after,
                    "actions": report.actions(),
                    "refs": writes.iter().map(|w| w.reference.as_str()).collect::<Vec<_>>(),
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
