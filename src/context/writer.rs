//! The writer: stores what a plan removes before the smaller request goes out (within the daily
//! write quotas, skipping content this process stored a moment ago unless the store lost it),
//! journals it, and records a changed decision by compare-and-set. Failures of the journal and
//! the decision only warn; a failed content write leaves the request as it came.

use std::sync::Arc;
use std::time::Instant;

use moka::sync::Cache;
use serde_json::{json, Value};

use super::adapter::Adapter;
use super::engine::{self, Skipped, Source};
use super::planner::Decided;
use super::quota;
use super::session::{Decisions, Identity};
use crate::store::{ContentRef, Store, StoreError, Tenant};

/// Stores what plans remove and remembers decisions.
pub struct Writer {
    store: Arc<dyn Store>,
    decisions: Decisions,
    /// Content this process stored, per tenant, and when: not stored again before `refresh`
    /// has passed (then stored again, which refreshes or restores it).
    written: Cache<(Tenant, ContentRef), Instant>,
    /// How often forwarded references are stored again (`store.content_refresh_secs`).
    refresh: std::time::Duration,
    /// Daily write quotas per tenant and in all (`store.*quota_bytes_per_day`).
    quotas: quota::Quotas,
}

impl Writer {
    pub fn new(store: Arc<dyn Store>) -> Writer {
        Writer {
            decisions: Decisions::new(store.clone()),
            store,
            written: super::caches::written(),
            refresh: std::time::Duration::from_secs(60),
            quotas: quota::Quotas::new(0, 0),
        }
    }

    /// With daily write quotas: bytes per tenant and for all tenants (0: none).
    pub fn with_quotas(mut self, per_tenant: u64, total: u64) -> Writer {
        self.quotas = quota::Quotas::new(per_tenant, total);
        self
    }

    /// Stores forwarded content again at most once per `every`.
    pub fn with_content_refresh(mut self, every: std::time::Duration) -> Writer {
        self.refresh = every;
        self
    }

    /// Stores everything `decided` removes from `messages` (before the smaller request can go
    /// out) and remembers a changed decision. `Err`: the request must go out as it came, for
    /// this reason (and whether it is a failure, fail-open).
    pub async fn commit(
        &self,
        adapter: &dyn Adapter,
        identity: &Identity,
        messages: &[Value],
        decided: &Decided,
        request_id: &str,
    ) -> Result<(), (Skipped, bool)> {
        // Reversible: everything removed is stored before the smaller request goes out.
        if decided.outcome.messages.is_some() {
            let writes = &decided.outcome.writes;
            let day = quota::day_of(std::time::SystemTime::now());
            let charged = match self.charge_quota(adapter, identity, messages, writes, day) {
                Ok(bytes) => bytes,
                Err(scope) => {
                    tracing::warn!(
                        scope = scope.as_str(),
                        tenant = %identity.tenant,
                        "daily store quota reached: forwarding the request unmanaged"
                    );
                    return Err((Skipped::QuotaExceeded(scope), false));
                }
            };
            match self.write_all(adapter, identity, messages, writes).await {
                Ok(new) => self.log_stored(identity, writes, &new, request_id).await,
                Err(e) => {
                    tracing::warn!(error = %e, "context store write failed: forwarding the request unchanged");
                    // The request stored nothing it can point to: its bytes are given back.
                    self.quotas.refund(&identity.tenant, charged, day);
                    return Err((Skipped::StoreUnavailable, true));
                }
            }
        }
        self.remember_decision(identity, decided, request_id).await;
        Ok(())
    }

    /// Forgets that `tenant`'s `refs` were stored (they were erased): the next request that
    /// needs them stores them again.
    pub fn forget(&self, tenant: &Tenant, refs: &[ContentRef]) {
        for r in refs {
            self.written.invalidate(&(tenant.clone(), r.clone()));
        }
    }

    /// Charges the bytes of the writes this process has not stored before to the daily quotas
    /// of `day`, and returns them (to refund if the writes fail).
    fn charge_quota(
        &self,
        adapter: &dyn Adapter,
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
                    .and_then(|m| adapter.text(m))
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
        adapter: &dyn Adapter,
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
                Source::MessageText(i) => messages
                    .get(*i)
                    .and_then(|m| adapter.text(m))
                    .ok_or_else(|| {
                        StoreError::Internal(format!("message {i} has no text to store"))
                    })?,
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
            // Logged the first time this process stores it, not on every refresh.
            let first = !self.written.contains_key(&key);
            self.written.insert(key, Instant::now());
            if first {
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
            wire: _,
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
pub fn rfc3339(t: std::time::SystemTime) -> String {
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
