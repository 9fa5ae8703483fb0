//! Key vetting: which tenants an upstream has accepted, and what a refused key leaves behind.
//! A tenant never accepted whose key the upstream refuses, in a session with no earlier request,
//! stored nothing legitimate: its session is erased.

use std::sync::Arc;

use moka::sync::Cache;
use serde_json::Value;

use super::session::Identity;
use crate::store::{ContentRef, Leave, Store, StoreError, Tenant};

/// The tenants accepted and refused by upstreams.
pub struct KeyVetting {
    store: Arc<dyn Store>,
    /// Tenants an upstream has accepted (answered 2xx) lately (`caches::ACCEPTED_TTL`): what
    /// they stored is kept when a later answer refuses their key.
    accepted: Cache<Tenant, ()>,
}

impl KeyVetting {
    pub fn new(store: Arc<dyn Store>) -> KeyVetting {
        KeyVetting {
            store,
            accepted: super::caches::accepted(),
        }
    }

    /// Notes that the upstream accepted `tenant`'s key (a 2xx answer).
    pub fn accepted(&self, tenant: &Tenant) {
        // Inserted again on every 2xx: an acceptance expires a day after the last one.
        self.accepted.insert(tenant.clone(), ());
    }

    /// The upstream refused the key of `identity`'s request `request_id` (401 or 403). When no
    /// upstream has accepted this tenant lately (`caches::ACCEPTED_TTL`) and the session holds
    /// nothing from an earlier request, nothing it stored can be legitimate: the session's
    /// state, journal and stored content are erased, `refs` (what this request forwarded)
    /// included, so a rejected key leaves nothing behind for weeks. Returns how many items were
    /// erased (0 for a tenant accepted before: its content may serve its other sessions).
    ///
    /// The references erased are returned too: whoever remembers them as stored must forget it.
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
    ) -> Result<(usize, Vec<ContentRef>), StoreError> {
        if self.accepted.contains_key(&identity.tenant) {
            return Ok((0, Vec::new()));
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
            return Ok((0, Vec::new()));
        }
        let mut all = crate::sessions::journal_refs(&journal);
        all.extend(refs.iter().cloned());
        all.sort();
        all.dedup();
        let erased = self
            .store
            .erase_session(&identity.tenant, &identity.session, &all, Leave::Nothing)
            .await?;
        Ok((erased, all))
    }
}
