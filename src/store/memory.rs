//! The `memory` backend: every item in one map inside the process, lost on restart. It holds at
//! most `memory_max_bytes` (keys and values counted), evicting the least recently used items
//! (written or read) to stay under it. Meant for tests and trials.
//!
//! Items are keyed the way the Redis backend keys them (`<tenant>/c/<ref>`,
//! `<tenant>/s/<session>/<key>`, `<tenant>/l/<session>`). Compare-and-set runs under the map's
//! lock; session locks live in a separate [`LockTable`] (they are not data, so they are neither
//! counted nor evicted). One ordered index of last use serves
//! both eviction (oldest first) and expiry (everything unused for the retention period is at its
//! front), so the sweeper only looks at what it deletes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::locks::LockTable;
use super::sweeper::Sweeper;
use super::{
    epoch_millis, refuses, Appended, Clock, ContentKind, ContentRef, Leave, LogLine, LogPage,
    SessionId, StateKey, Store, StoreConfig, StoreError, Tenant,
};

/// The in-process store.
pub struct MemoryStore {
    shared: Arc<Shared>,
    sweeper: Sweeper,
}

struct Shared {
    items: Mutex<Items>,
    locks: LockTable,
    clock: Arc<dyn Clock>,
    retention: Duration,
    max_bytes: usize,
}

#[derive(Default)]
struct Items {
    map: HashMap<String, Item>,
    /// Keys by last use, least recent first, under their [`Item::tick`].
    by_use: BTreeMap<u64, String>,
    next_tick: u64,
    /// Sum of [`Item::bytes`].
    bytes: usize,
}

struct Item {
    value: Value,
    used_at: SystemTime,
    tick: u64,
    /// Key and value bytes.
    bytes: usize,
}

enum Value {
    Content(String),
    State(Vec<u8>),
    /// Serialized JSON records, one per line.
    Log(Vec<String>),
}

impl Value {
    fn len(&self) -> usize {
        match self {
            Value::Content(text) => text.len(),
            Value::State(bytes) => bytes.len(),
            Value::Log(lines) => lines.iter().map(|line| line.len() + 1).sum(),
        }
    }
}

impl MemoryStore {
    /// An empty store; starts its sweeper, so it must be called inside a tokio runtime.
    pub fn new(cfg: &StoreConfig, clock: Arc<dyn Clock>) -> MemoryStore {
        let shared = Arc::new(Shared {
            items: Mutex::new(Items::default()),
            locks: LockTable::default(),
            clock,
            retention: cfg.retention(),
            max_bytes: cfg.memory_max_bytes,
        });
        let swept = Arc::clone(&shared);
        let sweeper = Sweeper::spawn("memory", cfg.sweep_interval(), move || {
            let shared = Arc::clone(&swept);
            async move { Ok(shared.purge_expired()) }
        });
        MemoryStore { shared, sweeper }
    }

    /// Bytes held now (keys and values).
    pub fn used_bytes(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Deletes the items not used for the retention period; returns how many.
    pub fn purge_expired(&self) -> usize {
        self.shared.purge_expired()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Items> {
        // No code path panics while holding the lock; a poisoned map is still consistent.
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn purge_expired(&self) -> usize {
        let now = self.clock.now();
        let locks = self.locks.purge_expired(now);
        self.lock().purge_expired(now, self.retention) + locks
    }

    /// Runs `f` on the live item under `key`, after refreshing it; `None` when there is none.
    fn with_item<T>(&self, key: &str, f: impl FnOnce(&mut Item) -> T) -> Option<T> {
        let now = self.clock.now();
        let mut items = self.lock();
        items.touch(key, now, self.retention).map(f)
    }

    fn insert(&self, key: String, value: Value) -> Result<(), StoreError> {
        let now = self.clock.now();
        self.lock().insert(key, value, now, self.max_bytes)
    }
}

impl Items {
    /// Refreshes the item under `key` and returns it, or deletes it when it has expired.
    fn touch(&mut self, key: &str, now: SystemTime, retention: Duration) -> Option<&mut Item> {
        if expired(self.map.get(key)?.used_at, now, retention) {
            self.remove(key);
            return None;
        }
        let item = self.map.get_mut(key)?;
        self.by_use.remove(&item.tick);
        item.tick = self.next_tick;
        self.next_tick += 1;
        item.used_at = now;
        self.by_use.insert(item.tick, key.to_owned());
        Some(item)
    }

    /// Stores `value` under `key` as the most recently used item, evicting the least recently
    /// used ones until everything fits in `max_bytes`.
    fn insert(
        &mut self,
        key: String,
        value: Value,
        now: SystemTime,
        max_bytes: usize,
    ) -> Result<(), StoreError> {
        let bytes = key.len() + value.len();
        if bytes > max_bytes {
            return Err(StoreError::TooLarge {
                len: bytes,
                limit: max_bytes,
            });
        }
        self.remove(&key);
        let tick = self.next_tick;
        self.next_tick += 1;
        self.by_use.insert(tick, key.clone());
        let item = Item {
            value,
            used_at: now,
            tick,
            bytes,
        };
        self.map.insert(key, item);
        self.bytes += bytes;
        self.evict_to(max_bytes);
        Ok(())
    }

    /// Evicts least recently used items while more than `max_bytes` are held. The most recently
    /// used item is never evicted: each item fits on its own.
    fn evict_to(&mut self, max_bytes: usize) {
        while self.bytes > max_bytes && self.by_use.len() > 1 {
            let Some((_, key)) = self.by_use.pop_first() else {
                break;
            };
            if let Some(item) = self.map.remove(&key) {
                self.bytes -= item.bytes;
            }
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(item) = self.map.remove(key) {
            self.by_use.remove(&item.tick);
            self.bytes -= item.bytes;
        }
    }

    fn purge_expired(&mut self, now: SystemTime, retention: Duration) -> usize {
        let mut removed = 0;
        while let Some((_, key)) = self.by_use.first_key_value() {
            let key = key.clone();
            match self.map.get(&key) {
                Some(item) if !expired(item.used_at, now, retention) => break,
                _ => {
                    self.remove(&key);
                    removed += 1;
                }
            }
        }
        removed
    }
}

fn expired(used_at: SystemTime, now: SystemTime, retention: Duration) -> bool {
    now.duration_since(used_at)
        .is_ok_and(|age| age >= retention)
}

fn content_key(tenant: &Tenant, r: &ContentRef) -> String {
    format!("{tenant}/c/{r}")
}

fn state_key(tenant: &Tenant, session: &SessionId, key: &StateKey) -> String {
    format!("{tenant}/s/{session}/{key}")
}

fn log_key(tenant: &Tenant, session: &SessionId) -> String {
    format!("{tenant}/l/{session}")
}

/// Where an erased session's tombstone is kept (a kind the session list does not read).
fn tombstone_key(tenant: &Tenant, session: &SessionId) -> String {
    format!("{tenant}/e/{session}")
}

fn lock_key(tenant: &Tenant, session: &SessionId, name: &StateKey) -> String {
    format!("{tenant}/k/{session}/{name}")
}

#[async_trait]
impl Store for MemoryStore {
    async fn put_content(
        &self,
        tenant: &Tenant,
        _session: &SessionId,
        _kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError> {
        let r = ContentRef::of(content);
        let key = content_key(tenant, &r);
        let now = self.shared.clock.now();
        let mut items = self.shared.lock();
        // Stored already: written once, only refreshed.
        if items.touch(&key, now, self.shared.retention).is_none() {
            let value = Value::Content(content.to_owned());
            items.insert(key, value, now, self.shared.max_bytes)?;
        }
        Ok(r)
    }

    async fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError> {
        let key = content_key(tenant, r);
        Ok(self
            .shared
            .with_item(&key, |item| match &item.value {
                Value::Content(text) => Some(text.clone()),
                _ => None,
            })
            .flatten())
    }

    async fn contains_content(
        &self,
        tenant: &Tenant,
        refs: &[ContentRef],
    ) -> Result<Vec<bool>, StoreError> {
        let now = self.shared.clock.now();
        let items = self.shared.lock();
        Ok(refs
            .iter()
            .map(|r| {
                items
                    .map
                    .get(&content_key(tenant, r))
                    .is_some_and(|item| !expired(item.used_at, now, self.shared.retention))
            })
            .collect())
    }

    async fn append_lines(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        let key = log_key(tenant, session);
        let max_bytes = self.shared.max_bytes;
        let now = self.shared.clock.now();
        let added: usize = lines.iter().map(|l| l.as_str().len() + 1).sum();
        let mut lines = lines.into_iter().map(LogLine::into_string);
        let mut items = self.shared.lock();
        let erased = match items.map.get(&tombstone_key(tenant, session)) {
            Some(Item {
                value: Value::State(millis),
                ..
            }) => std::str::from_utf8(millis)
                .ok()
                .and_then(|m| m.parse().ok()),
            _ => None,
        };
        if let Some(at) = refuses(erased, since) {
            return Ok(Appended::Erased(at));
        }
        let Some(item) = items.touch(&key, now, self.shared.retention) else {
            let log: Vec<String> = lines.collect();
            let records = log.len();
            items.insert(key, Value::Log(log), now, max_bytes)?;
            return Ok(Appended::Records(records));
        };
        let Value::Log(log) = &mut item.value else {
            return Err(StoreError::Internal(format!("{key} is not a log")));
        };
        let grown = item.bytes + added;
        if grown > max_bytes {
            return Err(StoreError::TooLarge {
                len: grown,
                limit: max_bytes,
            });
        }
        log.extend(&mut lines);
        let records = log.len();
        item.bytes = grown;
        items.bytes += added;
        items.evict_to(max_bytes);
        Ok(Appended::Records(records))
    }

    async fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let key = log_key(tenant, session);
        let lines = self
            .shared
            .with_item(&key, |item| match &item.value {
                Value::Log(lines) => lines.clone(),
                _ => Vec::new(),
            })
            .unwrap_or_default();
        lines
            .iter()
            .map(|line| {
                serde_json::from_str(line).map_err(|e| StoreError::Corrupt {
                    location: key.clone(),
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    async fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let key = log_key(tenant, session);
        let (lines, total, first_index) = self
            .shared
            .with_item(&key, |item| match &item.value {
                Value::Log(lines) => {
                    let range = LogPage::range(lines.len(), before, limit);
                    (lines[range.clone()].to_vec(), lines.len(), range.start)
                }
                _ => (Vec::new(), 0, 0),
            })
            .unwrap_or_default();
        let records = lines
            .iter()
            .map(|line| {
                serde_json::from_str(line).map_err(|e| StoreError::Corrupt {
                    location: key.clone(),
                    detail: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(LogPage {
            records,
            first_index,
            total,
        })
    }

    async fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let key = state_key(tenant, session, key);
        self.shared.insert(key, Value::State(value.to_vec()))
    }

    async fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = state_key(tenant, session, key);
        Ok(self
            .shared
            .with_item(&key, |item| match &item.value {
                Value::State(bytes) => Some(bytes.clone()),
                _ => None,
            })
            .flatten())
    }

    async fn compare_and_set_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StoreError> {
        let key = state_key(tenant, session, key);
        let now = self.shared.clock.now();
        let mut items = self.shared.lock();
        let current = items
            .touch(&key, now, self.shared.retention)
            .map(|item| match &item.value {
                Value::State(bytes) => Some(bytes.as_slice()),
                _ => None,
            });
        let matches = match current {
            None => expected.is_none(),
            Some(current) => current.is_some() && current == expected,
        };
        if matches {
            let value = Value::State(new.to_vec());
            items.insert(key, value, now, self.shared.max_bytes)?;
        }
        Ok(matches)
    }

    async fn try_lock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = lock_key(tenant, session, name);
        let now = self.shared.clock.now();
        Ok(self.shared.locks.try_lock(&key, holder, ttl, now))
    }

    async fn unlock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.shared
            .locks
            .unlock(&lock_key(tenant, session, name), holder);
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn close(&self) {
        self.sweeper.stop().await;
    }

    async fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        let items = self.shared.lock();
        let mut found = std::collections::BTreeSet::new();
        for key in items.map.keys() {
            // `<tenant>/s/<session>/<key>` or `<tenant>/l/<session>`.
            let mut parts = key.splitn(4, '/');
            let (Some(t), Some(kind), Some(s)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if (kind == "s" || kind == "l") && tenant.is_none_or(|want| want.as_str() == t) {
                found.insert((t.to_owned(), s.to_owned()));
            }
        }
        Ok(found
            .into_iter()
            .filter_map(|(t, s)| Some((Tenant::from_id(&t)?, SessionId::from_stored(&s)?)))
            .collect())
    }

    async fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
        leave: Leave,
    ) -> Result<usize, StoreError> {
        let mut items = self.shared.lock();
        let state_prefix = format!("{tenant}/s/{session}/");
        let mut doomed: Vec<String> = items
            .map
            .keys()
            .filter(|k| k.starts_with(&state_prefix))
            .cloned()
            .collect();
        doomed.push(log_key(tenant, session));
        doomed.extend(refs.iter().map(|r| content_key(tenant, r)));
        let mut erased = 0;
        for key in doomed {
            if items.map.contains_key(&key) {
                items.remove(&key);
                erased += 1;
            }
        }
        if leave == Leave::Tombstone {
            let now = self.shared.clock.now();
            let tombstone = Value::State(epoch_millis(now).to_string().into_bytes());
            let key = tombstone_key(tenant, session);
            items.insert(key, tombstone, now, self.shared.max_bytes)?;
        }
        Ok(erased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ManualClock;

    const DAY: Duration = Duration::from_secs(86_400);

    fn store(max_bytes: usize) -> (MemoryStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(SystemTime::now()));
        let cfg = StoreConfig {
            memory_max_bytes: max_bytes,
            ..StoreConfig::default()
        };
        (MemoryStore::new(&cfg, clock.clone()), clock)
    }

    fn ids() -> (Tenant, SessionId) {
        (
            Tenant::from_api_key(Some("k")),
            SessionId::parse("s").unwrap(),
        )
    }

    #[tokio::test]
    async fn evicts_the_least_recently_used_to_stay_under_the_bound() {
        let (store, _) = store(1_000);
        let (t, s) = ids();
        let [a, b, c, d] = ["a", "b", "c", "d"].map(|x| x.repeat(250));
        let ra = store
            .put_content(&t, &s, ContentKind::ToolResult, &a)
            .await
            .unwrap();
        let rb = store
            .put_content(&t, &s, ContentKind::ToolResult, &b)
            .await
            .unwrap();
        let rc = store
            .put_content(&t, &s, ContentKind::ToolResult, &c)
            .await
            .unwrap();
        // Reading `a` makes `b` the least recently used.
        assert!(store.get_content(&t, &ra).await.unwrap().is_some());
        let rd = store
            .put_content(&t, &s, ContentKind::ToolResult, &d)
            .await
            .unwrap();
        assert!(store.used_bytes() <= 1_000, "{}", store.used_bytes());
        assert_eq!(store.get_content(&t, &rb).await.unwrap(), None);
        assert_eq!(store.get_content(&t, &ra).await.unwrap(), Some(a));
        assert_eq!(store.get_content(&t, &rc).await.unwrap(), Some(c));
        assert_eq!(store.get_content(&t, &rd).await.unwrap(), Some(d));
    }

    #[tokio::test]
    async fn an_item_larger_than_the_bound_is_refused_and_evicts_nothing() {
        let (store, _) = store(1_000);
        let (t, s) = ids();
        let kept = store
            .put_content(&t, &s, ContentKind::ToolResult, "kept")
            .await
            .unwrap();
        let err = store
            .put_content(&t, &s, ContentKind::ToolResult, &"x".repeat(1_001))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TooLarge { limit: 1_000, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("store.memory_max_bytes"), "{err}");
        assert!(store.get_content(&t, &kept).await.unwrap().is_some());
        let key = StateKey::parse("k").unwrap();
        assert!(store.put_state(&t, &s, &key, &[0; 2_000]).await.is_err());
    }

    #[tokio::test]
    async fn a_log_stops_growing_at_the_bound() {
        let (store, _) = store(200);
        let (t, s) = ids();
        let record = serde_json::json!({ "pad": "x".repeat(50) });
        store.append_log(&t, &s, &record).await.unwrap();
        store.append_log(&t, &s, &record).await.unwrap();
        let err = store.append_log(&t, &s, &record).await.unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        assert_eq!(store.read_log(&t, &s).await.unwrap().len(), 2);
        assert!(store.used_bytes() <= 200);
    }

    #[tokio::test]
    async fn storing_the_same_content_again_holds_it_once() {
        let (store, _) = store(1 << 20);
        let (t, s) = ids();
        store
            .put_content(&t, &s, ContentKind::ToolResult, "same")
            .await
            .unwrap();
        let used = store.used_bytes();
        let other = SessionId::parse("other").unwrap();
        store
            .put_content(&t, &other, ContentKind::UserText, "same")
            .await
            .unwrap();
        assert_eq!(store.used_bytes(), used);
    }

    #[tokio::test]
    async fn purge_frees_only_what_expired() {
        let (store, clock) = store(1 << 20);
        let (t, s) = ids();
        let old = store
            .put_content(&t, &s, ContentKind::ToolResult, "old")
            .await
            .unwrap();
        clock.advance(20 * DAY);
        let new = store
            .put_content(&t, &s, ContentKind::ToolResult, "new")
            .await
            .unwrap();
        clock.advance(15 * DAY);
        assert_eq!(store.purge_expired(), 1);
        assert_eq!(store.used_bytes(), content_key(&t, &new).len() + 3);
        assert_eq!(store.get_content(&t, &old).await.unwrap(), None);
        assert!(store.get_content(&t, &new).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn the_sweeper_task_frees_expired_items() {
        let clock = Arc::new(ManualClock::new(SystemTime::now()));
        let cfg = StoreConfig {
            sweep_interval_secs: 1,
            ..StoreConfig::default()
        };
        let store = MemoryStore::new(&cfg, clock.clone());
        let (t, s) = ids();
        store
            .put_content(&t, &s, ContentKind::ToolResult, "x")
            .await
            .unwrap();
        clock.advance(31 * DAY);
        assert!(store.used_bytes() > 0);
        // The next sweep is due within a second.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.used_bytes() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.used_bytes(), 0);
        store.close().await;
    }
}
