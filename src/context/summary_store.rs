//! Summaries remembered against the prefix they cover: one state record per session (tenant
//! scoped) holding the latest few, newest first. Every request whose conversation starts with
//! that prefix reuses the same bytes. Updates are compare-and-set, so replicas sharing a store
//! never lose one another's summaries. A failed or empty summary is never recorded.

use std::ops::ControlFlow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::session::{Identity, Prefixes};
use crate::store::{StateList, Store, StoreError};

/// One summary and the prefix (`messages[..prefix_len]`) it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub prefix_len: usize,
    pub prefix_hash: String,
    pub summary: String,
}

/// Summaries kept per session.
const PER_SESSION: usize = 8;

/// The store key naming `hash` (the prefix hash as 32 hex digits), for locks.
pub fn hash_hex(hash: u128) -> String {
    format!("{hash:032x}")
}

/// The summaries of a session's conversations.
pub struct Summaries {
    list: StateList<Recorded>,
}

impl Summaries {
    pub fn new(store: Arc<dyn Store>) -> Summaries {
        Summaries {
            list: StateList::new(store, "summaries"),
        }
    }

    async fn read(&self, id: &Identity) -> Result<Vec<Recorded>, StoreError> {
        self.list.read(&id.tenant, &id.session).await
    }

    /// Every summary recorded for a prefix of this conversation, longest prefix first.
    pub async fn matching(
        &self,
        id: &Identity,
        prefixes: &Prefixes,
    ) -> Result<Vec<Recorded>, StoreError> {
        let entries = self.read(id).await?;
        let mut found: Vec<Recorded> = entries
            .into_iter()
            .filter(|r| {
                prefixes
                    .get(r.prefix_len)
                    .is_some_and(|h| hash_hex(h) == r.prefix_hash)
            })
            .collect();
        found.sort_by_key(|r| std::cmp::Reverse(r.prefix_len));
        Ok(found)
    }

    /// The summary recorded for exactly this prefix.
    pub async fn get(
        &self,
        id: &Identity,
        prefix_len: usize,
        prefix_hash: &str,
    ) -> Result<Option<String>, StoreError> {
        let entries = self.read(id).await?;
        Ok(entries
            .into_iter()
            .find(|r| r.prefix_len == prefix_len && r.prefix_hash == prefix_hash)
            .map(|r| r.summary))
    }

    /// Records a summary; an existing one for the same prefix wins (it is never replaced, so
    /// every request sees the same bytes). Returns the summary now recorded.
    pub async fn record(&self, id: &Identity, entry: Recorded) -> Result<String, StoreError> {
        self.list
            .update(&id.tenant, &id.session, |entries| {
                if let Some(existing) = entries.iter().find(|r| {
                    r.prefix_len == entry.prefix_len && r.prefix_hash == entry.prefix_hash
                }) {
                    return ControlFlow::Break(existing.summary.clone());
                }
                entries.insert(0, entry.clone());
                entries.truncate(PER_SESSION);
                ControlFlow::Continue(entry.summary.clone())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Backend, StoreConfig};
    use serde_json::json;

    #[tokio::test]
    async fn the_first_summary_of_a_prefix_wins_and_the_longest_match_comes_first() {
        let store = crate::store::open(&StoreConfig {
            backend: Backend::Memory,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let summaries = Summaries::new(store);
        let messages: Vec<_> = (0..6)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        let prefixes = Prefixes::of(&messages);
        let id = super::super::session::identify(
            crate::store::Tenant::from_api_key(None),
            None,
            &messages,
        );
        let entry = |len: usize, text: &str| Recorded {
            prefix_len: len,
            prefix_hash: hash_hex(prefixes.get(len).unwrap()),
            summary: text.into(),
        };
        assert_eq!(summaries.record(&id, entry(3, "a")).await.unwrap(), "a");
        assert_eq!(summaries.record(&id, entry(3, "b")).await.unwrap(), "a");
        summaries.record(&id, entry(5, "c")).await.unwrap();
        let found = summaries.matching(&id, &prefixes).await.unwrap();
        assert_eq!(
            found.iter().map(|r| r.summary.as_str()).collect::<Vec<_>>(),
            ["c", "a"]
        );
        // Another conversation of the session shares only the first four messages.
        let mut other = messages[..4].to_vec();
        other.push(json!({"role": "user", "content": "else"}));
        let found = summaries
            .matching(&id, &Prefixes::of(&other))
            .await
            .unwrap();
        assert_eq!(found.len(), 1);
        let h = hash_hex(prefixes.get(3).unwrap());
        assert_eq!(
            summaries.get(&id, 3, &h).await.unwrap().as_deref(),
            Some("a")
        );
        assert_eq!(summaries.get(&id, 4, &h).await.unwrap(), None);
    }
}
