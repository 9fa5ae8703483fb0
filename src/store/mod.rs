//! The store: where offloaded content, the session journal and small session state records
//! live, so that every byte removed from a context can be read back (invariant *Reversible*).
//!
//! One [`Store`] trait, chosen once at start-up by [`open`] from [`StoreConfig`]:
//! [`memory`](MemoryStore) (bounded, for tests), [`fs`](FsStore) (the embedded default, a
//! directory tree a person can read, see the `fs` module; one process per directory) and
//! [`redis`](RedisStore) (one server or a Redis Cluster shared by several replicas, see the
//! `redis` module). The same conformance suite (`conformance.rs`) runs against every backend.
//!
//! What the trait promises, on every backend:
//! - **Content-addressed.** Content is stored under [`ContentRef::of`] its bytes, an opaque id
//!   (`ctx_` + 24 base32 characters of SHA-256), never a path. The same content gets the same
//!   reference and is written once.
//! - **Isolated.** Every item is scoped by [`Tenant`] (a hash of the API key); nothing stored
//!   under one tenant can be read under another. The name types check their values when they
//!   are made, so no backend is ever handed a name that could leave its root or key space.
//! - **Retention.** An item is kept for `retention_days` after it was last written *or read*
//!   (reading refreshes it), then reads answer `None` and a background sweeper (one task per
//!   store, with a tracing span, stopped by [`Store::close`] or when the store is dropped)
//!   deletes it. Time comes from a [`Clock`], so tests move a [`ManualClock`] instead of
//!   sleeping. (Redis expires keys itself, by its own clock.)
//! - **Atomic updates.** [`Store::compare_and_set_state`] replaces a state record only if it
//!   still holds what the caller read, so replicas updating one session lose nothing.
//!   [`Store::try_lock`] / [`Store::unlock`] give a session lock that expires by itself, so a
//!   holder that died frees it after its time-to-live.
//! - **Bounded.** [`open`] wraps the backend so that every call fails with
//!   [`StoreError::Timeout`] after `op_timeout_ms`; the memory backend holds at most
//!   `memory_max_bytes`; the fs backend runs at most `max_blocking_ops` file operations at once.
//!   A request's store phase is bounded as a whole too ([`with_phase_budget`]): all its calls
//!   together wait at most `op_timeout_ms`, so a hung Redis delays a request once, not once per
//!   call.
//!   Callers treat any [`StoreError`] as "serve the request without context management"
//!   (invariant *Fail-open*).
//!
//! What to do when the store fails is the caller's choice, read from
//! [`StoreConfig::fail_closed`] (`on_error = "open" | "closed"`).
//!
//! Why `Arc<dyn Store>` with boxed futures (the `async-trait` crate) rather than an enum of
//! backends: other modules hold the store without caring which one it is, and their tests can
//! hand in a store that fails or stalls to check Fail-open. One allocation per call is nothing
//! next to a file write or a Redis round trip.

mod config;
mod fs;
mod locks;
mod memory;
mod redis;
mod state_list;
mod sweeper;

#[cfg(test)]
mod conformance;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

pub use self::redis::RedisStore;
pub use crate::ids::{ContentKind, ContentRef, InvalidId, SessionId, StateKey, Tenant};
pub use config::{Backend, OnError, StoreConfig};
pub use fs::FsStore;
pub use memory::MemoryStore;
pub use state_list::StateList;

/// Why a store call failed. None of these reaches a client: the request is served without
/// context management, with a warning log.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Invalid(#[from] InvalidId),
    /// A `[store]` key that cannot be used; the message names it (`store.…`).
    #[error("invalid config: {0}")]
    Config(String),
    #[error("store {op} did not finish within {timeout_ms} ms (store.op_timeout_ms)")]
    Timeout { op: &'static str, timeout_ms: u64 },
    #[error("{len} bytes do not fit in the memory store's {limit} bytes (store.memory_max_bytes)")]
    TooLarge { len: usize, limit: usize },
    #[error("store {op} failed on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store {op} failed on redis: {source}")]
    Redis {
        op: &'static str,
        source: ::redis::RedisError,
    },
    #[error("stored data at {location} is corrupt: {detail}")]
    Corrupt { location: String, detail: String },
    #[error("store task failed: {0}")]
    Internal(String),
}

/// Where the store reads the time: retention is measured with it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualClock(Mutex<SystemTime>);

impl ManualClock {
    pub fn new(start: SystemTime) -> ManualClock {
        ManualClock(Mutex::new(start))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One journal record already serialized: compact JSON, so one line (a raw newline never
/// occurs in compact JSON; a string's newline is escaped). What [`Store::append_logs`] is
/// handed, so a record is serialized once, by its writer, and every backend stores the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine(String);

impl LogLine {
    /// The record `record` as one line.
    pub fn of<T: serde::Serialize + ?Sized>(record: &T) -> Result<LogLine, StoreError> {
        serde_json::to_string(record)
            .map(LogLine)
            .map_err(|e| StoreError::Internal(format!("cannot serialize a log record: {e}")))
    }

    /// The line, without its end.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The line as a `String`.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// What an erased session leaves ([`Store::erase_session`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// Its tombstone: lines written before the erasure are refused afterwards (an erasure a
    /// person or a tool asked for, which a line still queued must not undo).
    Tombstone,
    /// Nothing at all (what a key the upstream refused stored: no trace of it is kept).
    Nothing,
}

/// What [`Store::append_logs`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The lines are in: the journal holds this many records now (the last line's index + 1),
    /// which numbers them for whoever sums the journal as it grows.
    Records(usize),
    /// Nothing was appended: the session was erased at this time, not before the oldest line
    /// (see [`Store::erase_session`]'s tombstone).
    Erased(SystemTime),
}

/// `t` in whole milliseconds since the Unix epoch: how a tombstone keeps its time.
fn epoch_millis(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time `millis` milliseconds after the Unix epoch.
fn from_epoch_millis(millis: u64) -> SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(millis)
}

/// Whether a session erased at `erased` (a tombstone, in epoch milliseconds) refuses lines
/// written since `since`: the erase came at or after the oldest of them.
fn refuses(erased: Option<u64>, since: Option<SystemTime>) -> Option<SystemTime> {
    let (erased, since) = (erased?, since?);
    (erased >= epoch_millis(since)).then(|| from_epoch_millis(erased))
}

/// Part of a session's journal ([`Store::read_log_page`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogPage {
    /// The records, oldest first.
    pub records: Vec<serde_json::Value>,
    /// The index of the first of them in the journal (record 0 is the oldest).
    pub first_index: usize,
    /// How many records the journal holds.
    pub total: usize,
}

impl LogPage {
    /// Where the page of at most `limit` records before `before` (`None`: the end) starts and
    /// ends in a journal of `total` records.
    pub fn range(total: usize, before: Option<usize>, limit: usize) -> std::ops::Range<usize> {
        let end = before.unwrap_or(total).min(total);
        end.saturating_sub(limit)..end
    }

    /// The page of `all` (a whole journal).
    pub fn of(all: Vec<serde_json::Value>, before: Option<usize>, limit: usize) -> LogPage {
        let total = all.len();
        let range = LogPage::range(total, before, limit);
        LogPage {
            first_index: range.start,
            records: all
                .into_iter()
                .skip(range.start)
                .take(range.len())
                .collect(),
            total,
        }
    }
}

/// Offloaded content, the session journal and session state records, scoped by tenant.
///
/// Every read and write of an item refreshes its retention.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores `content` (once: storing it again only refreshes it) and returns its reference,
    /// which is always [`ContentRef::of`]`(content)`. `session` and `kind` say where a person
    /// finds it; reading needs only the tenant and the reference.
    async fn put_content(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError>;

    /// Stores each of `contents` as [`Store::put_content`] does, in as few calls as the
    /// backend allows (the page's journal writer keeps the messages of many requests at once);
    /// their references, in order. This default stores them one by one.
    async fn put_contents(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        contents: Vec<String>,
    ) -> Result<Vec<ContentRef>, StoreError> {
        let mut refs = Vec::with_capacity(contents.len());
        for content in &contents {
            refs.push(self.put_content(tenant, session, kind, content).await?);
        }
        Ok(refs)
    }

    /// The content stored under `r` by `tenant`, byte-exact, or `None` when there is none (never
    /// stored, expired, or stored by another tenant).
    async fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError>;

    /// Which of `refs` are stored for `tenant` (one answer per ref, in order): the check made
    /// before a request pointing at them is forwarded, so a marker never points at nothing.
    /// Cheap — no content is read (fs: a pointer read and a `stat` per ref; Redis: one
    /// pipelined `EXISTS`) — and it does not refresh retention.
    async fn contains_content(
        &self,
        tenant: &Tenant,
        refs: &[ContentRef],
    ) -> Result<Vec<bool>, StoreError>;

    /// Appends `record` as one JSON line to the session's journal (what was offloaded, what was
    /// decided). Lines are never rewritten.
    async fn append_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        record: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.append_logs(tenant, session, vec![LogLine::of(record)?], None)
            .await
            .map(drop)
    }

    /// Appends `lines` (records serialized by the caller, [`LogLine`]), in order, to the
    /// session's journal: what [`Store::append_log`] does for each record, in one write (the
    /// page's journal writer hands over the lines of many requests at once, serialized once).
    /// With `since` (when the oldest line was written), nothing is appended when the session
    /// was erased since then ([`Appended::Erased`]): a line of before an erasure never brings
    /// the session back, whichever replica queued it. Checked and appended in one step. An
    /// empty `lines` does nothing (`Records(0)`); the backend's [`Store::append_lines`] does
    /// the rest.
    async fn append_logs(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        if lines.is_empty() {
            return Ok(Appended::Records(0));
        }
        self.append_lines(tenant, session, lines, since).await
    }

    /// [`Store::append_logs`] of at least one line: what each backend implements.
    async fn append_lines(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError>;

    /// The session's journal, oldest record first (empty when there is none). For tools, tests
    /// and debugging: it reads the whole journal.
    async fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError>;

    /// At most `limit` records of the journal, the newest of those before index `before`
    /// (record 0 is the oldest; `None`: the end), with how many it holds: what the inspection
    /// routes page through. Backends hold only the page in memory (this default, the whole
    /// journal).
    async fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let all = self.read_log(tenant, session).await?;
        Ok(LogPage::of(all, before, limit))
    }

    /// Stores a small record of the session under `key`, replacing any previous one.
    async fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError>;

    /// The record stored under `key`, or `None`.
    async fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError>;

    /// Replaces the record under `key` with `new` only if it currently holds exactly
    /// `expected` (`None`: no record). Returns whether it was replaced. Refreshes retention like
    /// [`Store::put_state`].
    async fn compare_and_set_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StoreError>;

    /// Takes the lock `name` of the session for `holder` until `ttl` has passed, unless another
    /// holder has it and it has not expired. Returns whether `holder` now holds it (taking a
    /// lock one already holds extends it).
    async fn try_lock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Releases the lock if `holder` still holds it; otherwise does nothing.
    async fn unlock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
    ) -> Result<(), StoreError>;

    /// Whether the store can serve (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Stops the background sweeper and waits for it. Calls keep working; expired items are
    /// just no longer deleted in the background.
    async fn close(&self);

    // Inspection and erasure (`crate::routes::context_api`): rare operations that walk a tenant's items.

    /// The sessions that have a journal or state under `tenant`, or under every tenant
    /// when `None` (the admin's view), sorted. Reads the tenant's whole key space (Redis: a
    /// SCAN inside one script; every tenant on a Redis Cluster: that script on every primary).
    async fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError>;

    /// Erases the session: its state records, journal, and the content under `refs` (the
    /// references its journal names; fs also deletes every file stored in the session's
    /// directory). Session locks are left to expire. With [`Leave::Tombstone`] (an erasure
    /// someone asked for), leaves the time of the erasure (kept for the retention period,
    /// never listed as a session), which [`Store::append_logs`] checks. Returns how many items
    /// were deleted.
    async fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
        leave: Leave,
    ) -> Result<usize, StoreError>;
}

/// Opens the configured backend, with every call bounded by `op_timeout_ms`.
pub async fn open(cfg: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    open_with_clock(cfg, Arc::new(SystemClock)).await
}

/// [`open`] with the clock retention is measured by.
pub async fn open_with_clock(
    cfg: &StoreConfig,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn Store>, StoreError> {
    cfg.validate().map_err(StoreError::Config)?;
    let inner: Arc<dyn Store> = match cfg.backend {
        Backend::Memory => Arc::new(MemoryStore::new(cfg, clock)),
        Backend::Fs => {
            Arc::new(bounded("open", cfg.op_timeout(), FsStore::open(cfg, clock)).await?)
        }
        // Never fails because Redis is down: see `RedisStore::open`.
        Backend::Redis => Arc::new(RedisStore::open(cfg).await?),
    };
    Ok(Arc::new(Timed {
        inner,
        timeout: cfg.op_timeout(),
    }))
}

tokio::task_local! {
    /// What is left of the current request's store time ([`with_phase_budget`]).
    static PHASE_BUDGET: std::cell::Cell<Duration>;
}

/// Runs `fut` (a request's store phase: planning and applying its context) with all the store
/// calls made inside it sharing one budget of `total`: each call may wait only what the calls
/// before it left, and once the budget is spent every further call fails at once with
/// [`StoreError::Timeout`]. Time spent elsewhere (waiting for a summary, counting) is not
/// charged. Calls outside such a phase (background tasks, the proxy's tools) have their own
/// timeout only.
pub async fn with_phase_budget<F: Future>(total: Duration, fut: F) -> F::Output {
    PHASE_BUDGET.scope(std::cell::Cell::new(total), fut).await
}

/// Runs `fut`, failing with [`StoreError::Timeout`] after `timeout`, or sooner when the
/// request's store phase has less left ([`with_phase_budget`]).
async fn bounded<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let left = PHASE_BUDGET.try_with(|b| b.get()).ok();
    let allowed = left.map_or(timeout, |left| left.min(timeout));
    let timed_out = || StoreError::Timeout {
        op,
        timeout_ms: u64::try_from(allowed.as_millis()).unwrap_or(u64::MAX),
    };
    if allowed.is_zero() {
        return Err(timed_out());
    }
    let started = tokio::time::Instant::now();
    let result = tokio::time::timeout(allowed, fut).await;
    let _ = PHASE_BUDGET.try_with(|b| b.set(b.get().saturating_sub(started.elapsed())));
    result.unwrap_or_else(|_| Err(timed_out()))
}

/// A backend with every call bounded by a timeout.
struct Timed {
    inner: Arc<dyn Store>,
    timeout: Duration,
}

#[async_trait]
impl Store for Timed {
    async fn put_content(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError> {
        let fut = self.inner.put_content(tenant, session, kind, content);
        bounded("put_content", self.timeout, fut).await
    }

    async fn put_contents(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        contents: Vec<String>,
    ) -> Result<Vec<ContentRef>, StoreError> {
        let fut = self.inner.put_contents(tenant, session, kind, contents);
        bounded("put_contents", self.timeout, fut).await
    }

    async fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError> {
        bounded(
            "get_content",
            self.timeout,
            self.inner.get_content(tenant, r),
        )
        .await
    }

    async fn contains_content(
        &self,
        tenant: &Tenant,
        refs: &[ContentRef],
    ) -> Result<Vec<bool>, StoreError> {
        let fut = self.inner.contains_content(tenant, refs);
        bounded("contains_content", self.timeout, fut).await
    }

    async fn append_lines(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        let fut = self.inner.append_lines(tenant, session, lines, since);
        bounded("append_logs", self.timeout, fut).await
    }

    async fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        bounded(
            "read_log",
            self.timeout,
            self.inner.read_log(tenant, session),
        )
        .await
    }

    async fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        bounded(
            "read_log_page",
            self.timeout,
            self.inner.read_log_page(tenant, session, before, limit),
        )
        .await
    }

    async fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let fut = self.inner.put_state(tenant, session, key, value);
        bounded("put_state", self.timeout, fut).await
    }

    async fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let fut = self.inner.get_state(tenant, session, key);
        bounded("get_state", self.timeout, fut).await
    }

    async fn compare_and_set_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StoreError> {
        let fut = self
            .inner
            .compare_and_set_state(tenant, session, key, expected, new);
        bounded("compare_and_set_state", self.timeout, fut).await
    }

    async fn try_lock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let fut = self.inner.try_lock(tenant, session, name, holder, ttl);
        bounded("try_lock", self.timeout, fut).await
    }

    async fn unlock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
    ) -> Result<(), StoreError> {
        let fut = self.inner.unlock(tenant, session, name, holder);
        bounded("unlock", self.timeout, fut).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        bounded("ping", self.timeout, self.inner.ping()).await
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    async fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        bounded(
            "list_sessions",
            self.timeout,
            self.inner.list_sessions(tenant),
        )
        .await
    }

    async fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
        leave: Leave,
    ) -> Result<usize, StoreError> {
        let fut = self.inner.erase_session(tenant, session, refs, leave);
        bounded("erase_session", self.timeout, fut).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose every call hangs, like a disk or server that stopped answering.
    struct Stalled;

    #[async_trait]
    impl Store for Stalled {
        async fn put_content(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: ContentKind,
            _: &str,
        ) -> Result<ContentRef, StoreError> {
            std::future::pending().await
        }
        async fn get_content(
            &self,
            _: &Tenant,
            _: &ContentRef,
        ) -> Result<Option<String>, StoreError> {
            std::future::pending().await
        }
        async fn contains_content(
            &self,
            _: &Tenant,
            _: &[ContentRef],
        ) -> Result<Vec<bool>, StoreError> {
            std::future::pending().await
        }
        async fn append_lines(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: Vec<LogLine>,
            _: Option<SystemTime>,
        ) -> Result<Appended, StoreError> {
            std::future::pending().await
        }
        async fn read_log(
            &self,
            _: &Tenant,
            _: &SessionId,
        ) -> Result<Vec<serde_json::Value>, StoreError> {
            std::future::pending().await
        }
        async fn put_state(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &StateKey,
            _: &[u8],
        ) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn get_state(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &StateKey,
        ) -> Result<Option<Vec<u8>>, StoreError> {
            std::future::pending().await
        }
        async fn compare_and_set_state(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &StateKey,
            _: Option<&[u8]>,
            _: &[u8],
        ) -> Result<bool, StoreError> {
            std::future::pending().await
        }
        async fn try_lock(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &StateKey,
            _: &str,
            _: Duration,
        ) -> Result<bool, StoreError> {
            std::future::pending().await
        }
        async fn unlock(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &StateKey,
            _: &str,
        ) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn close(&self) {}
        async fn list_sessions(
            &self,
            _: Option<&Tenant>,
        ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
            std::future::pending().await
        }
        async fn erase_session(
            &self,
            _: &Tenant,
            _: &SessionId,
            _: &[ContentRef],
            _: Leave,
        ) -> Result<usize, StoreError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn every_call_is_bounded_by_the_timeout() {
        let store = Timed {
            inner: Arc::new(Stalled),
            timeout: Duration::from_millis(20),
        };
        let t = Tenant::from_api_key(None);
        let s = SessionId::parse("s").unwrap();
        let k = StateKey::parse("k").unwrap();
        let r = ContentRef::of("x");
        let v = serde_json::json!({});
        let errors = [
            store
                .put_content(&t, &s, ContentKind::ToolResult, "x")
                .await
                .unwrap_err(),
            store.get_content(&t, &r).await.unwrap_err(),
            store.append_log(&t, &s, &v).await.unwrap_err(),
            store.read_log(&t, &s).await.unwrap_err(),
            store.put_state(&t, &s, &k, b"v").await.unwrap_err(),
            store.get_state(&t, &s, &k).await.unwrap_err(),
            store
                .compare_and_set_state(&t, &s, &k, None, b"v")
                .await
                .unwrap_err(),
            store
                .try_lock(&t, &s, &k, "h", Duration::from_secs(1))
                .await
                .unwrap_err(),
            store.unlock(&t, &s, &k, "h").await.unwrap_err(),
            store.ping().await.unwrap_err(),
        ];
        for err in errors {
            assert!(
                matches!(err, StoreError::Timeout { timeout_ms: 20, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("store.op_timeout_ms"), "{err}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_calls_of_a_phase_share_one_budget() {
        let store = Timed {
            inner: Arc::new(Stalled),
            timeout: Duration::from_secs(2),
        };
        let t = Tenant::from_api_key(None);
        let s = SessionId::parse("s").unwrap();
        let k = StateKey::parse("k").unwrap();
        let started = tokio::time::Instant::now();
        let errors = with_phase_budget(Duration::from_secs(3), async {
            [
                store.get_state(&t, &s, &k).await.unwrap_err(),
                store.get_state(&t, &s, &k).await.unwrap_err(),
                store.put_state(&t, &s, &k, b"v").await.unwrap_err(),
            ]
        })
        .await;
        // 2 s, then the 1 s left, then nothing: 3 s in all, not 6.
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        let waited: Vec<u64> = errors
            .iter()
            .map(|e| match e {
                StoreError::Timeout { timeout_ms, .. } => *timeout_ms,
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(waited, [2000, 1000, 0]);
        // Outside a phase, each call has its own timeout again.
        let started = tokio::time::Instant::now();
        store.get_state(&t, &s, &k).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test]
    async fn an_invalid_config_is_refused_before_opening() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            path: dir.path().join("data"),
            retention_days: 0,
            ..StoreConfig::default()
        };
        let err = open(&cfg).await.err().unwrap();
        assert!(err.to_string().contains("store.retention_days"), "{err}");
        assert!(!cfg.path.exists());
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(5));
        assert_eq!(clock.now(), start + Duration::from_secs(5));
    }
}
