//! Context management for one chat-completions request: identify the conversation, count it,
//! let the pure [`engine`] decide, write what it removed to the store, and hand back the new
//! body. Fail-open: if anything around the engine fails (the store above all), the request goes
//! out as it came, with a warning.
//!
//! - `settings` — the `[context]` config and the budget for one model;
//! - `model` — the conversation model: items, units that are never split (pure);
//! - `adapter` — one per wire format: a request read into items, the decision written back;
//! - `units` — the chat names of units;
//! - `markers` — the texts that stand in for removed content;
//! - `engine` — lossless transforms, truncate, compact, move out (pure);
//! - `estimate` — counting Anthropic Messages without its tokenizer, calibrated by usage;
//! - `transforms` — the lossless transforms of tool results (pure);
//! - `models` — the built-in table of model windows and output limits, with sources;
//! - `limits` — limits stated by upstreams in their errors, learned and remembered;
//! - `session` — tenant, session, prefix hashes and remembered decisions (I/O);
//! - `planner` — decision lookup, engine, summaries ([`Planner`]);
//! - `writer` — store writes, quotas, the written-content cache, compare-and-set ([`Writer`]);
//! - `vetting` — tenants accepted and refused by upstreams ([`KeyVetting`]);
//! - `caches` — the bounded in-process caches and their bounds.

pub mod adapter;
pub mod caches;
pub mod compaction;
pub mod engine;
pub mod estimate;
pub mod limits;
pub mod markers;
pub mod model;
pub mod models;
pub mod planner;
pub mod quota;
pub mod session;
pub mod settings;
pub mod summary;
pub mod summary_store;
pub mod transforms;
pub mod units;
pub mod vetting;
pub mod writer;

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::store::{ContentRef, Store, StoreError, Tenant};
use crate::tokens::{Counter, Encoding};
pub use adapter::messages_bound::{Forwarded, Records};
use adapter::{Adapter, Wire};
use engine::Report;
pub use engine::Skipped;
use planner::Planner;
pub use planner::{Plan, Route, Sizing, SummaryJob, SummaryPlan};
use session::identify;
pub use session::Identity;
pub use settings::{ContextConfig, Mode, RequestLimits, Settings};
use vetting::KeyVetting;
use writer::Writer;

/// Response headers that tell the client what was done, and the request header choosing the
/// mode for one request (the names are the contract crate's).
pub use context_proxy_contract::{
    ACTIONS_HEADER, KEPT_PREFIX_HEADER, MODE_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER,
};

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
    /// Why the request must not be forwarded at all, when it must not: on a model binding
    /// thinking to its prefix, the store cannot say what the conversation forwarded before,
    /// and earlier requests may have been edited (the route answers a retryable error).
    pub refused: Option<String>,
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
            refused: None,
        }
    }

    fn unchanged(report: Report) -> Managed {
        Managed {
            body: None,
            report,
            fail_open: false,
            counted: true,
            refs: Vec::new(),
            refused: None,
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

/// Context management: the [`Planner`], the [`Writer`] and [`KeyVetting`], composed as the
/// identify, plan and apply phases.
pub struct ContextManager {
    store: Arc<dyn Store>,
    planner: Planner,
    writer: Writer,
    vetting: KeyVetting,
}

impl ContextManager {
    pub fn new(config: ContextConfig, counter: Counter, store: Arc<dyn Store>) -> ContextManager {
        ContextManager {
            planner: Planner::new(config, counter, store.clone()),
            writer: Writer::new(store.clone()),
            vetting: KeyVetting::new(store.clone()),
            store,
        }
    }

    /// `identity`'s request goes as `record` says (on a model binding thinking to its prefix,
    /// with thinking on): kept in the store with the conversation's other branches `before`
    /// ([`adapter::messages_bound::Records::with`]), under the session's state key
    /// `forwarded-…` of the conversation ([`adapter::messages_bound::state_key`]), where the
    /// next request of the conversation, on any replica or after a restart, finds what it must
    /// repeat. Written before the request goes: a form the store does not hold must not go.
    /// `Ok(false)`: the record is too large to keep.
    async fn remember_forwarded(
        &self,
        identity: &Identity,
        before: Option<&Records>,
        record: Forwarded,
    ) -> Result<bool, StoreError> {
        let key = crate::store::StateKey::parse(record.state_key())?;
        let Some(records) = before.cloned().unwrap_or_default().with(record) else {
            return Ok(false);
        };
        let bytes =
            serde_json::to_vec(&records).map_err(|e| StoreError::Internal(e.to_string()))?;
        self.store
            .put_state(&identity.tenant, &identity.session, &key, &bytes)
            .await?;
        Ok(true)
    }

    /// What the conversation of `identity`'s request `body` forwarded, branch by branch
    /// ([`ContextManager::remember_forwarded`]); `None` when nothing is kept (or what is kept
    /// does not parse: written by another version).
    async fn forwarded_before(
        &self,
        identity: &Identity,
        body: &Value,
    ) -> Result<Option<Records>, StoreError> {
        let Ok(key) = crate::store::StateKey::parse(&adapter::messages_bound::state_key(body))
        else {
            return Ok(None);
        };
        let bytes = self
            .store
            .get_state(&identity.tenant, &identity.session, &key)
            .await?;
        Ok(bytes.and_then(|b| Records::parse(&b)))
    }

    /// Serving sessions that other processes serve too (replicas on one Redis): a session's
    /// previous request may have gone to another replica moments ago, so the time this process
    /// last saw it says nothing about the provider's cache, which is then always assumed warm
    /// (a rewrite must pay for itself).
    pub fn with_shared_sessions(mut self, shared: bool) -> ContextManager {
        self.planner = self.planner.with_shared_sessions(shared);
        self
    }

    /// With daily write quotas: bytes per tenant and for all tenants (0: none).
    pub fn with_quotas(mut self, per_tenant: u64, total: u64) -> ContextManager {
        self.writer = self.writer.with_quotas(per_tenant, total);
        self
    }

    /// Stores forwarded content again at most once per `every` (`store.content_refresh_secs`).
    pub fn with_content_refresh(mut self, every: std::time::Duration) -> ContextManager {
        self.writer = self.writer.with_content_refresh(every);
        self
    }

    /// An answer's usage reported `actual` prompt tokens for a request counted as `estimated`:
    /// corrects the conversation's estimate on a wire without a public tokenizer
    /// ([`Planner::observe_usage`]); the factor now in use, for such a wire.
    pub fn observe_usage(
        &self,
        identity: &Identity,
        wire: adapter::Wire,
        estimated: usize,
        actual: usize,
    ) -> Option<f64> {
        self.planner
            .observe_usage(identity, wire, estimated, actual)
    }

    /// `body`'s size against its budget and window before planning ([`Planner::sizing`]).
    pub async fn sizing(
        &self,
        identity: &Identity,
        body: &Value,
        mode: Mode,
        route: &Route<'_>,
    ) -> Sizing {
        self.planner.sizing(identity, body, mode, route).await
    }

    /// Notes that the upstream accepted `tenant`'s key (a 2xx answer).
    pub fn accepted(&self, tenant: &Tenant) {
        self.vetting.accepted(tenant);
    }

    /// The upstream refused the key of `identity`'s request `request_id` (401 or 403): erases
    /// what a never accepted key stored ([`KeyVetting::rejected`]). Returns how many items were
    /// erased.
    pub async fn rejected(
        &self,
        identity: &Identity,
        refs: &[ContentRef],
        request_id: &str,
    ) -> Result<usize, StoreError> {
        let (erased, refs) = self.vetting.rejected(identity, refs, request_id).await?;
        // Stored again by the next request that needs them, not skipped as already written.
        self.writer.forget(&identity.tenant, &refs);
        Ok(erased)
    }

    /// The context limit an upstream states in an error answer, learned when the request
    /// supports it ([`Planner::learn_from_upstream_error`]).
    pub async fn learn_from_upstream_error(
        &self,
        upstream: &str,
        model: &str,
        status: u16,
        body: &[u8],
        drawn: &limits::Drawn<'_>,
    ) -> Option<usize> {
        self.planner
            .learn_from_upstream_error(upstream, model, status, body, drawn)
            .await
    }

    /// The upstream answered the request retried against `limit`: the limit holds for every
    /// tenant.
    pub async fn confirm_limit(&self, upstream: &str, model: &str, limit: usize) {
        self.planner.confirm_limit(upstream, model, limit).await
    }

    /// The budget of a second attempt after the upstream stated its `limit`.
    pub fn retry_budget(&self, limit: usize, body: &Value, sent_tokens: usize) -> usize {
        self.planner.retry_budget(limit, body, sent_tokens)
    }

    /// The mode of a request: the one it asks for (the route's `x-context-mode`), else the
    /// config's.
    pub fn mode(&self, requested: Option<&str>) -> Result<Mode, String> {
        match requested {
            None => Ok(self.planner.config().mode),
            Some(v) => Mode::parse(v).ok_or_else(|| {
                format!("{MODE_HEADER} must be one of off, compact, compress, auto")
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Summaries of moved-out spans, by the prefix they cover.
    pub fn summaries(&self) -> &summary_store::Summaries {
        self.planner.summaries()
    }

    /// The `[context.summarizer]` settings.
    pub fn summarizer_config(&self) -> &summary::SummarizerConfig {
        &self.planner.config().summarizer
    }

    /// `[context] tool_result_max_tokens`: the longest text shown whole to the summarizer.
    pub fn tool_result_max_tokens(&self) -> usize {
        self.planner.config().tool_result_max_tokens
    }

    /// The `[context.reload]` settings.
    pub fn reload_config(&self) -> &crate::proxy_tools::ReloadConfig {
        &self.planner.config().reload
    }

    /// The token counter for `model` (or the upstream's `encoding`).
    pub fn counter_for(&self, model: &str, encoding: Option<Encoding>) -> Counter {
        self.planner.counter_for(model, encoding)
    }

    /// Identify: whose conversation `body` is — `tenant`'s, in the session the client named
    /// (`session_hint`) or the one its opening identifies — or `None` when it holds no
    /// conversation.
    pub fn identify(
        &self,
        tenant: Tenant,
        session_hint: Option<&str>,
        body: &Value,
    ) -> Option<Identity> {
        self.identify_wire(Wire::Chat, tenant, session_hint, body)
    }

    /// [`ContextManager::identify`] for a request of any wire format.
    pub fn identify_wire(
        &self,
        wire: Wire,
        tenant: Tenant,
        session_hint: Option<&str>,
        body: &Value,
    ) -> Option<Identity> {
        let messages = wire.adapter().payloads(body)?;
        Some(identify(tenant, session_hint, &messages))
    }

    /// Plan: what to do with the request ([`Planner::plan`]).
    pub async fn plan(
        &self,
        identity: Option<&Identity>,
        body: &mut Value,
        mode: Mode,
        route: &Route<'_>,
    ) -> Plan {
        self.planner.plan(identity, body, mode, route).await
    }

    /// Puts a summary computed while the request waited into the plan's marker message.
    pub fn place_summary(&self, plan: &mut Plan, summary: &str) -> bool {
        self.planner.place_summary(plan, summary)
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
        self.apply_to(identity, plan, body, None, request_id).await
    }

    /// [`ContextManager::apply`], writing the decision into the request's bytes when
    /// `written_into` gives them (an Anthropic Messages request, whose decision is written by
    /// [`adapter::messages::write_bytes`]): untouched messages keep their bytes, and a decision
    /// that would break a rule of the API leaves the request unmanaged. On a model binding
    /// thinking to its prefix, with thinking on and without `drop_block`, against what the
    /// conversation forwarded before ([`ContextManager::apply_bound`]).
    pub async fn apply_to(
        &self,
        identity: Option<&Identity>,
        plan: Plan,
        body: &mut Value,
        written_into: Option<WrittenInto<'_>>,
        request_id: &str,
    ) -> Managed {
        if let (Some(identity), Some(into)) = (identity, written_into) {
            if binding(into.rules, body) {
                return self
                    .apply_bound(identity, plan, body, into, request_id)
                    .await;
            }
        }
        let Plan {
            report,
            counted,
            store_failed,
            decided,
            ..
        } = plan;
        let (Some(identity), Some(mut decided)) = (identity, decided) else {
            return Managed {
                body: None,
                report,
                fail_open: store_failed,
                counted,
                refs: Vec::new(),
                refused: None,
            };
        };
        let adapter: &dyn Adapter = decided.wire.adapter();
        let Some(messages) = adapter.payloads(body) else {
            return Managed::unchanged(report);
        };
        // Written into the original bytes before anything is stored: a decision that cannot
        // be written stores nothing.
        let written = match (&written_into, &decided.outcome.messages) {
            (Some(into), Some(items)) => {
                match adapter::messages::write_bytes(into.raw, body, &messages, items, into.rules) {
                    Ok(written) => Some(written),
                    Err(why) => {
                        tracing::info!(reason = %why, "messages request left unmanaged");
                        return Managed::skipped(
                            &report,
                            Skipped::Unmanaged(why.to_string()),
                            false,
                        );
                    }
                }
            }
            _ => None,
        };
        let committed = self
            .writer
            .commit(adapter, identity, &messages, &decided, request_id)
            .await;
        if let Err((why, fail_open)) = committed {
            return Managed::skipped(&report, why, fail_open);
        }
        let Some(new_messages) = decided.outcome.messages.take() else {
            return Managed::unchanged(report);
        };
        adapter.write(body, new_messages);
        let bytes = match written {
            Some(written) => Bytes::from(written.body),
            // A `Value` always serializes (its keys are strings).
            None => Bytes::from(body.to_string()),
        };
        Managed {
            body: Some(bytes),
            report,
            fail_open: false,
            counted: true,
            refs: refs_of(&decided),
            refused: None,
        }
    }

    /// [`ContextManager::apply_to`] on a model binding thinking to its prefix (thinking on,
    /// no `drop_block`): every thinking block the client sends back was signed after what the
    /// conversation's earlier requests forwarded, which the record in the store says
    /// ([`adapter::messages_bound`]). So the record is read first; the decision is written
    /// against it ([`adapter::messages_bound::write_bound`]), and a form the record does not
    /// reproduce goes only once the new record is stored. Whatever fails after the read (the
    /// decision cannot be written, the store does not take what it removes or the new record,
    /// the engine planned nothing) sends the record's form, the **repeat form**, never the
    /// client's messages where the record says otherwise. When the record cannot be read, the
    /// request goes as the client sent it only if nothing before its last thinking block was
    /// ever edited ([`Plan::untouched_before_thinking`]); else it is refused
    /// ([`Managed::refused`]): those bytes the upstream would refuse.
    async fn apply_bound(
        &self,
        identity: &Identity,
        plan: Plan,
        body: &mut Value,
        into: WrittenInto<'_>,
        request_id: &str,
    ) -> Managed {
        use adapter::messages_bound as bound;
        let before = match self.forwarded_before(identity, body).await {
            Ok(before) => before,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read what the conversation forwarded before");
                return record_unreadable(&plan, into, &e.to_string());
            }
        };
        let repeat = match bound::repeat(into.raw, body, before.as_ref()) {
            Ok(repeat) => repeat,
            Err(why) => {
                tracing::warn!(reason = %why, "the record of what was forwarded does not fit the request");
                return record_unreadable(&plan, into, &why.to_string());
            }
        };
        let Plan {
            report,
            counted,
            store_failed,
            decided,
            ..
        } = plan;
        // The repeat form, for `why` (the request's own changes held back).
        let repeated = |body: &mut Value, why: Option<String>, fail_open: bool| -> Managed {
            let mut managed = match &why {
                Some(why) => Managed::skipped(&report, Skipped::Unmanaged(why.clone()), fail_open),
                None => Managed {
                    fail_open,
                    counted,
                    ..Managed::unchanged(report.clone())
                },
            };
            let Some(sent) = &repeat else {
                return managed;
            };
            managed.report.repeated = true;
            if let Ok(shown) = serde_json::from_slice::<Value>(sent) {
                managed.report.tokens_after = Wire::Messages
                    .adapter()
                    .count(&self.counter_for("", None), &shown)
                    .total;
                *body = shown;
            }
            managed.body = Some(Bytes::from(sent.clone()));
            managed
        };
        let Some(mut decided) = decided else {
            return repeated(body, None, store_failed);
        };
        let adapter: &dyn Adapter = decided.wire.adapter();
        let Some(messages) = adapter.payloads(body) else {
            return repeated(body, None, false);
        };
        let Some(items) = &decided.outcome.messages else {
            // The engine changes nothing; what changed before goes again.
            let committed = self
                .writer
                .commit(adapter, identity, &messages, &decided, request_id)
                .await;
            return match committed {
                Ok(()) => repeated(body, None, false),
                Err((why, fail_open)) => repeated(body, Some(why.to_string()), fail_open),
            };
        };
        // Written into the original bytes before anything is stored: a decision that cannot
        // be written stores nothing.
        let unbound = adapter::messages::WriteRules {
            binds_thinking: false,
            ..into.rules
        };
        let written = adapter::messages::write_bytes(into.raw, body, &messages, items, unbound)
            .and_then(|decided| bound::write_bound(into.raw, body, decided, before.as_ref()));
        let written = match written {
            Ok(written) => written,
            Err(why) => {
                tracing::info!(reason = %why, "messages request left unmanaged");
                return repeated(body, Some(why.to_string()), false);
            }
        };
        // What goes, for the next request to repeat: only when the record kept does not
        // reproduce it, and only for a request that goes (not one only counted).
        let record = match (
            written.changes_record && into.forwards,
            serde_json::from_slice::<Value>(&written.written.body),
        ) {
            (false, _) => None,
            (true, Ok(shown)) => match Forwarded::record(body, &shown) {
                Some(record) => Some(record),
                None => return repeated(body, Some(bound::RECORD_TOO_LARGE.into()), false),
            },
            (true, Err(_)) => {
                return repeated(
                    body,
                    Some(adapter::messages::Unmanaged::Misaligned.to_string()),
                    false,
                )
            }
        };
        let committed = self
            .writer
            .commit(adapter, identity, &messages, &decided, request_id)
            .await;
        if let Err((why, fail_open)) = committed {
            return repeated(body, Some(why.to_string()), fail_open);
        }
        if let Some(record) = record {
            match self
                .remember_forwarded(identity, before.as_ref(), record)
                .await
            {
                Ok(true) => {}
                Ok(false) => return repeated(body, Some(bound::RECORD_TOO_LARGE.into()), false),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot keep what the request forwards: the form kept before goes");
                    return repeated(body, Some(bound::RECORD_UNWRITTEN.into()), true);
                }
            }
        }
        let Some(new_messages) = decided.outcome.messages.take() else {
            return repeated(body, None, false);
        };
        adapter.write(body, new_messages);
        let bound::Bound { written, .. } = written;
        let mut report = report;
        if written.held_back {
            // What goes is not the decision: counted as it goes.
            if let Ok(sent) = serde_json::from_slice::<Value>(&written.body) {
                report.tokens_after = adapter.count(&self.counter_for("", None), &sent).total;
                *body = sent;
            }
            report.compacted = 0;
            report.offloaded = 0;
            report.rewrote_prefix = false;
            report.held_back = true;
        }
        Managed {
            body: Some(Bytes::from(written.body)),
            report,
            fail_open: false,
            counted: true,
            refs: refs_of(&decided),
            refused: None,
        }
    }

    /// A Messages request in mode off, its bytes `raw` (`body` parsed from them), written
    /// under `rules`: on a model binding thinking to its prefix, with thinking on and without
    /// `drop_block`, the form its conversation forwarded before ([`adapter::messages_bound::
    /// repeat`]) with nothing new changed, where it differs from the client's messages (the
    /// client's bytes would be refused where the proxy edited before); otherwise, or when the
    /// record cannot be read, nothing (the request goes as it came).
    pub async fn repeat_recorded(
        &self,
        identity: &Identity,
        raw: &[u8],
        body: &Value,
        rules: adapter::messages::WriteRules,
    ) -> Managed {
        if !binding(rules, body) {
            return Managed::off();
        }
        let before = match self.forwarded_before(identity, body).await {
            Ok(before) => before,
            Err(e) => {
                tracing::warn!(error = %e, "mode off: cannot read what the conversation forwarded before; sent as it came");
                return Managed::off();
            }
        };
        match adapter::messages_bound::repeat(raw, body, before.as_ref()) {
            Ok(Some(bytes)) => Managed {
                body: Some(Bytes::from(bytes)),
                report: Report {
                    repeated: true,
                    ..Report::default()
                },
                ..Managed::off()
            },
            Ok(None) => Managed::off(),
            Err(why) => {
                tracing::warn!(reason = %why, "mode off: the record of what was forwarded does not fit the request; sent as it came");
                Managed::off()
            }
        }
    }

    /// Puts the upstream transcript of the proxy's hidden tool rounds back into an Anthropic
    /// Messages request ([`crate::proxy_tools::hidden_rounds`]), in its bytes `raw` (`body`
    /// parsed from them): the new bytes and how many messages were restored, or `None` when
    /// there is nothing to restore. Reads the store only when the conversation has an
    /// assistant message; a store error only warns (the request goes as the client sent it).
    pub async fn restore_rounds(
        &self,
        identity: &Identity,
        raw: &[u8],
        body: &Value,
    ) -> Option<(Bytes, usize)> {
        use crate::proxy_tools::hidden::Hidden;
        use crate::proxy_tools::hidden_rounds::{restorations, Rounds, STATE_KEY};
        let messages = body.get("messages")?.as_array()?;
        if !messages
            .iter()
            .any(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        {
            return None;
        }
        let list = Hidden::<Rounds>::under(self.store.clone(), STATE_KEY)
            .read(&identity.tenant, &identity.session)
            .await;
        let list = match list {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the proxy's hidden tool rounds: the conversation goes as the client sent it");
                return None;
            }
        };
        let found = restorations(&list, messages);
        if found.is_empty() {
            return None;
        }
        let bytes = adapter::messages_added::restored(raw, messages, &found)?;
        Some((Bytes::from(bytes), found.len()))
    }

    /// identify, plan and apply in one call (tests and benchmarks).
    pub async fn manage(
        &self,
        tenant: &Tenant,
        session_hint: Option<&str>,
        body: &mut Value,
        mode: Mode,
        encoding: Option<Encoding>,
    ) -> Managed {
        let identity = self.identify(tenant.clone(), session_hint, body);
        let route = Route {
            encoding,
            ..Route::default()
        };
        let plan = self.plan(identity.as_ref(), body, mode, &route).await;
        self.apply(identity.as_ref(), plan, body, "").await
    }
}

/// How a Messages decision is written into the request's bytes
/// ([`ContextManager::apply_to`]).
#[derive(Debug, Clone, Copy)]
pub struct WrittenInto<'a> {
    /// The request's bytes (the body was parsed from them).
    pub raw: &'a [u8],
    pub rules: adapter::messages::WriteRules,
    /// The request is forwarded, not only counted (as `count_tokens` is): on a model binding
    /// thinking to its prefix, what it forwards is recorded, and it is refused when what the
    /// conversation forwarded before cannot be known.
    pub forwards: bool,
}

/// Whether a Messages request is written against what its conversation forwarded before: its
/// model binds thinking to its prefix, thinking is on and the API cannot be asked to drop
/// what an edit invalidates.
fn binding(rules: adapter::messages::WriteRules, body: &Value) -> bool {
    rules.binds_thinking && !rules.drop_block_allowed && adapter::messages::thinking_on(body)
}

/// The stored content a decision's new body refers to.
fn refs_of(decided: &planner::Decided) -> Vec<ContentRef> {
    decided
        .outcome
        .writes
        .iter()
        .map(|w| w.reference.clone())
        .collect()
}

/// A binding conversation whose record cannot be read (`what` went wrong): as the client sent
/// it when nothing before its last thinking block was ever edited, else refused (a request
/// only counted is counted as sent).
fn record_unreadable(plan: &Plan, into: WrittenInto<'_>, what: &str) -> Managed {
    use adapter::messages_bound as bound;
    if plan.untouched_before_thinking || !into.forwards {
        return Managed::skipped(
            &plan.report,
            Skipped::Unmanaged(bound::UNREADABLE_UNEDITED.into()),
            true,
        );
    }
    Managed {
        refused: Some(bound::unreadable_refusal(what)),
        ..Managed::skipped(&plan.report, Skipped::StoreUnavailable, true)
    }
}
