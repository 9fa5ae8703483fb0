//! A list of JSON records kept as one state record of a session and changed by
//! compare-and-set, so that replicas updating it at once never lose each other's entries: the
//! shape of the remembered decisions, the hidden tool exchanges and the summaries.

use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{SessionId, StateKey, Store, StoreError, Tenant};

/// Compare-and-set attempts before an update gives up (each failed attempt means another
/// writer succeeded).
const CAS_ATTEMPTS: usize = 16;

/// The list stored under one state key of a session.
pub struct StateList<T> {
    store: Arc<dyn Store>,
    key: &'static str,
    items: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> StateList<T> {
    /// `key` must be a valid [`StateKey`] (checked on every call).
    pub fn new(store: Arc<dyn Store>, key: &'static str) -> StateList<T> {
        StateList {
            store,
            key,
            items: PhantomData,
        }
    }

    /// The record as stored (for compare-and-set) and its items. A record that does not parse
    /// (an incompatible version, damage) reads as empty and is replaced by the next update.
    async fn read_raw(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<(Option<Vec<u8>>, Vec<T>), StoreError> {
        let stored = self
            .store
            .get_state(tenant, session, &StateKey::parse(self.key)?)
            .await?;
        let items = match stored.as_deref().map(serde_json::from_slice::<Vec<T>>) {
            None => Vec::new(),
            Some(Ok(items)) => items,
            Some(Err(e)) => {
                tracing::warn!(error = %e, key = self.key, "unreadable session record: ignoring it");
                Vec::new()
            }
        };
        Ok((stored, items))
    }

    /// The items.
    pub async fn read(&self, tenant: &Tenant, session: &SessionId) -> Result<Vec<T>, StoreError> {
        Ok(self.read_raw(tenant, session).await?.1)
    }

    /// Changes the list with `update` and writes it by compare-and-set, reading and updating
    /// again when another writer changed it in between. `update` returns `Continue(r)` to
    /// write its change, `Break(r)` to leave the record as it is; either way `r` is returned.
    pub async fn update<R>(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        mut update: impl FnMut(&mut Vec<T>) -> ControlFlow<R, R>,
    ) -> Result<R, StoreError> {
        let key = StateKey::parse(self.key)?;
        for _ in 0..CAS_ATTEMPTS {
            let (stored, mut items) = self.read_raw(tenant, session).await?;
            let result = match update(&mut items) {
                ControlFlow::Break(r) => return Ok(r),
                ControlFlow::Continue(r) => r,
            };
            let bytes =
                serde_json::to_vec(&items).map_err(|e| StoreError::Internal(e.to_string()))?;
            if self
                .store
                .compare_and_set_state(tenant, session, &key, stored.as_deref(), &bytes)
                .await?
            {
                return Ok(result);
            }
        }
        Err(StoreError::Internal(format!(
            "the session's {} record changed under {CAS_ATTEMPTS} attempts in a row",
            self.key
        )))
    }
}
