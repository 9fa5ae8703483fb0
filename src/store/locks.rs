//! Session locks kept inside the process: `try_lock` and `unlock` of the `memory` and `fs`
//! backends (both serve one process; replicas share locks through Redis).
//!
//! A lock is a holder name and an expiry measured with the store's [`Clock`](super::Clock), so
//! tests move a `ManualClock` instead of sleeping. An expired lock is free for anyone; the
//! sweeper forgets expired locks so the table does not grow.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The locks of one store, keyed by the backend's name for them.
#[derive(Default)]
pub(crate) struct LockTable {
    locks: Mutex<HashMap<String, Held>>,
}

struct Held {
    holder: String,
    /// `None`: a time-to-live too long to represent, so never.
    until: Option<SystemTime>,
}

impl Held {
    fn expired(&self, now: SystemTime) -> bool {
        self.until.is_some_and(|until| now >= until)
    }
}

impl LockTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        // No code path panics while holding the lock; the map stays consistent.
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `key` for `holder` until `now + ttl`, unless another holder has it unexpired.
    /// Returns whether `holder` holds it now (taking it again extends it).
    pub(crate) fn try_lock(&self, key: &str, holder: &str, ttl: Duration, now: SystemTime) -> bool {
        let mut locks = self.lock();
        if let Some(held) = locks.get(key) {
            if held.holder != holder && !held.expired(now) {
                return false;
            }
        }
        let held = Held {
            holder: holder.to_owned(),
            until: now.checked_add(ttl),
        };
        locks.insert(key.to_owned(), held);
        true
    }

    /// Releases `key` if `holder` holds it; otherwise does nothing.
    pub(crate) fn unlock(&self, key: &str, holder: &str) {
        let mut locks = self.lock();
        if locks.get(key).is_some_and(|held| held.holder == holder) {
            locks.remove(key);
        }
    }

    /// Forgets expired locks; returns how many.
    pub(crate) fn purge_expired(&self, now: SystemTime) -> usize {
        let mut locks = self.lock();
        let before = locks.len();
        locks.retain(|_, held| !held.expired(now));
        before - locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_locks_are_free_and_purged() {
        let table = LockTable::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let ttl = Duration::from_secs(10);
        assert!(table.try_lock("k", "a", ttl, now));
        assert!(!table.try_lock("k", "b", ttl, now + Duration::from_secs(9)));
        assert_eq!(table.purge_expired(now + Duration::from_secs(9)), 0);
        assert_eq!(table.purge_expired(now + ttl), 1);
        assert!(table.try_lock("k", "b", ttl, now + ttl));
    }

    #[test]
    fn a_huge_ttl_never_expires_and_does_not_overflow() {
        let table = LockTable::default();
        let now = SystemTime::now();
        assert!(table.try_lock("k", "a", Duration::MAX, now));
        assert!(!table.try_lock(
            "k",
            "b",
            Duration::from_secs(1),
            now + Duration::from_secs(1 << 40)
        ));
        assert_eq!(table.purge_expired(now + Duration::from_secs(1 << 40)), 0);
    }
}
