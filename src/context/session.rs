//! Identify: which tenant and session a request belongs to, the rolling hashes of its
//! conversation prefixes, and the decisions remembered against those prefixes, so that the
//! next request of a conversation reuses them instead of deciding again.
//!
//! Decisions live in the store's session state, so they survive a restart (fs) and are shared
//! by replicas (redis); updates are compare-and-set, so concurrent replicas never lose one.

use std::ops::ControlFlow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use super::engine::Decision;
use super::units::{is_instruction, role};
use crate::store::{SessionId, StateList, Store, StoreError, Tenant};
use crate::tokens::stable_hash;

/// Request header naming the session.
pub use context_proxy_contract::SESSION_HEADER;

/// Whose request this is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub tenant: Tenant,
    pub session: SessionId,
}

/// The conversation of `tenant` whose session the client named `session_hint` (the route's
/// `x-context-session`), else the one its first messages (its instructions and first user
/// message) identify.
pub fn identify(tenant: Tenant, session_hint: Option<&str>, messages: &[Value]) -> Identity {
    let session = match session_hint {
        Some(given) => {
            SessionId::parse(given).unwrap_or_else(|_| SessionId::derive(given.as_bytes()))
        }
        None => {
            let first_user = messages
                .iter()
                .position(|m| role(m) == "user")
                .map_or(0, |i| i + 1);
            let opening: Vec<&Value> = messages[..first_user.min(messages.len())]
                .iter()
                .filter(|m| is_instruction(m) || role(m) == "user")
                .collect();
            let mut hasher = Xxh3::new();
            for m in opening {
                hasher.update(&stable_hash(m).to_le_bytes());
            }
            SessionId::derive(&hasher.digest128().to_le_bytes())
        }
    };
    Identity { tenant, session }
}

/// `hashes[k]` identifies `messages[..k]`: a rolling hash over each message's content hash.
#[derive(Debug)]
pub struct Prefixes {
    hashes: Vec<u128>,
}

impl Prefixes {
    pub fn of(messages: &[Value]) -> Prefixes {
        Prefixes::from_hashes(messages.iter().map(stable_hash))
    }

    /// The prefixes of the messages whose [`stable_hash`]es are `message_hashes` (as counting
    /// found them: `RequestCount::message_hashes`).
    pub fn from_hashes(message_hashes: impl ExactSizeIterator<Item = u128>) -> Prefixes {
        let mut hashes = Vec::with_capacity(message_hashes.len() + 1);
        let mut current = 0u128;
        hashes.push(current);
        for hash in message_hashes {
            let mut hasher = Xxh3::new();
            hasher.update(&current.to_le_bytes());
            hasher.update(&hash.to_le_bytes());
            current = hasher.digest128();
            hashes.push(current);
        }
        Prefixes { hashes }
    }

    /// The hash of the first `len` messages, if there are that many.
    pub fn get(&self, len: usize) -> Option<u128> {
        self.hashes.get(len).copied()
    }
}

/// One remembered decision and the prefix it was made for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Recorded {
    prefix_len: usize,
    prefix_hash: String,
    decision: Decision,
}

/// Decisions remembered per session: a few recent ones, newest first (a session may hold
/// several branches of a conversation).
///
/// Safe for several replicas sharing one store: every lookup reads the session's record from
/// the store (another replica may have added a decision since; nothing is cached in the
/// process), and every update is a compare-and-set that merges with what another writer put
/// there in the meantime, so no decision is ever overwritten.
pub struct Decisions {
    list: StateList<Recorded>,
}

/// Decisions kept per session.
const PER_SESSION: usize = 8;

impl Decisions {
    pub fn new(store: Arc<dyn Store>) -> Decisions {
        Decisions {
            list: StateList::new(store, "decisions"),
        }
    }

    /// The decision recorded for the longest prefix this conversation shares, or none.
    pub async fn lookup(&self, id: &Identity, prefixes: &Prefixes) -> Result<Decision, StoreError> {
        let entries = self.list.read(&id.tenant, &id.session).await?;
        Ok(entries
            .iter()
            .filter(|r| {
                prefixes
                    .get(r.prefix_len)
                    .is_some_and(|h| format!("{h:032x}") == r.prefix_hash)
            })
            .max_by_key(|r| r.prefix_len)
            .map(|r| r.decision)
            .unwrap_or_default())
    }

    /// Remembers `decision` against the prefix it covers, merged with whatever other writers
    /// recorded. Returns whether it was new.
    pub async fn record(
        &self,
        id: &Identity,
        prefixes: &Prefixes,
        decision: Decision,
    ) -> Result<bool, StoreError> {
        let prefix_len = decision.prefix_len();
        let Some(hash) = prefixes.get(prefix_len).filter(|_| prefix_len > 0) else {
            return Ok(false);
        };
        let entry = Recorded {
            prefix_len,
            prefix_hash: format!("{hash:032x}"),
            decision,
        };
        self.list
            .update(&id.tenant, &id.session, |entries| {
                if entries.contains(&entry) {
                    return ControlFlow::Break(false);
                }
                entries.insert(0, entry.clone());
                entries.truncate(PER_SESSION);
                ControlFlow::Continue(true)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefixes_depend_on_content_and_order() {
        let a = [
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let b = [
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "c"}),
        ];
        let (pa, pb) = (Prefixes::of(&a), Prefixes::of(&b));
        assert_eq!(pa.get(1), pb.get(1));
        assert_ne!(pa.get(2), pb.get(2));
        assert_eq!(pa.get(3), None);
    }

    #[test]
    fn session_from_header_or_opening() {
        let msgs = [
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "u"}),
        ];
        let mut more = msgs.to_vec();
        more.push(json!({"role": "assistant", "content": "later"}));
        let t = || Tenant::from_api_key(None);
        assert_eq!(identify(t(), None, &msgs), identify(t(), None, &more));
        let named = identify(t(), Some("My Session/1"), &msgs);
        assert_ne!(named.session, identify(t(), None, &msgs).session);
        assert_eq!(named.session.name(), "My Session/1");
        let (k1, k2) = (Some("sk-a"), Some("sk-b"));
        assert_ne!(
            identify(Tenant::from_api_key(k1), None, &msgs).tenant,
            identify(Tenant::from_api_key(k2), None, &msgs).tenant
        );
    }
}
