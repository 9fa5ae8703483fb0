//! The `fs` backend, the embedded default: a directory tree under `store.path` that a person can
//! read with `ls` and `cat`.
//!
//! ```text
//! data/
//!   <tenant>/                     20 hex characters of SHA-256 of the API key, or `anonymous`
//!     <session>/
//!       context.jsonl             the session journal: one JSON record per line, append-only
//!       tool_result-<ref>.txt     offloaded content, byte-exact (also `user_text-<ref>.txt`
//!       messages-<ref>.json         and `messages-<ref>.json`)
//!       state/<key>               small state records
//!     _refs/<ref>                 where content <ref> is: one line `<session>/<file name>`
//! ```
//!
//! Content lives in the session that first stored it, and `_refs/` finds it from the reference
//! alone, whichever session asks. A pointer read back from disk is checked like any outside
//! input, and content is checked against its reference on every read, so a file edited by hand
//! is reported as corrupt, never served.
//!
//! Writes are atomic: a `.tmp-*` file in the same directory, flushed (`fsync`, when
//! `store.fsync`), then renamed over the final name, so a crash never leaves a torn file.
//! Leftover temporary files are never read, and the sweeper deletes them after an hour. Two
//! writers of the same content both succeed: their renames put identical bytes in place. The
//! journal takes one `write` per record; a line torn by a crash is skipped when reading and never
//! glued to the next record.
//!
//! Retention uses each file's modification time: every write or read sets it to the clock's
//! now, and the sweeper deletes our files older than the retention period (it leaves unknown
//! files alone), then empty directories. A lock keeps the sweeper from deleting a file between
//! an operation's check and its refresh. It is an in-process lock: one proxy process per
//! directory (replicas share a store through Redis).
//!
//! Compare-and-set takes an in-process async mutex for the record (one of `KEY_STRIPES`, chosen
//! by a hash of its path; `put_state` takes it too) around read, compare and the atomic write,
//! so it is atomic among the calls of this process — enough, since one process owns a
//! directory. Session locks are held in memory ([`LockTable`]), their expiry measured with the
//! store's clock; they do not survive a restart, which only frees them early.
//!
//! File work runs on tokio's blocking threads, at most `store.max_blocking_ops` at once. A permit
//! is held until the blocking work really ends, even when the caller has timed out and gone, so
//! a hung disk cannot pile up blocking threads. On Unix, directories are created `0700` and
//! files `0600`: offloaded content is the users' data.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, Semaphore};

use super::locks::LockTable;
use super::sweeper::Sweeper;
use super::{
    Clock, ContentKind, ContentRef, SessionId, StateKey, Store, StoreConfig, StoreError, Tenant,
};

const LOG_FILE: &str = "context.jsonl";
const REFS_DIR: &str = "_refs";
const STATE_DIR: &str = "state";
const TEMP_PREFIX: &str = ".tmp-";
/// A temporary file older than this was left by a crash (operations time out long before).
const TEMP_GRACE: Duration = Duration::from_secs(60 * 60);
/// A pointer is one short line; anything longer is not ours.
const MAX_POINTER_BYTES: u64 = 256;
/// State records share this many compare-and-set mutexes (by a hash of their path).
const KEY_STRIPES: usize = 64;

/// The directory-tree store.
pub struct FsStore {
    tree: Arc<Tree>,
    sweeper: Sweeper,
}

/// The tree and what file work needs; shared with the blocking threads and the sweeper.
struct Tree {
    root: PathBuf,
    clock: Arc<dyn Clock>,
    retention: Duration,
    fsync: bool,
    permits: Arc<Semaphore>,
    /// Held shared by every operation and exclusively by the sweeper for each deletion.
    sweep_lock: RwLock<()>,
    /// Serialize the writes of a state record (compare-and-set is read, compare, write).
    key_stripes: Vec<Arc<AsyncMutex<()>>>,
    /// Session locks (`try_lock`, `unlock`).
    locks: LockTable,
}

impl FsStore {
    /// Creates `cfg.path` when missing, checks that files can be created in it, and starts the
    /// sweeper (which first deletes what a crash may have left).
    pub async fn open(cfg: &StoreConfig, clock: Arc<dyn Clock>) -> Result<FsStore, StoreError> {
        let tree = Arc::new(Tree {
            root: cfg.path.clone(),
            clock,
            retention: cfg.retention(),
            fsync: cfg.fsync,
            permits: Arc::new(Semaphore::new(
                cfg.max_blocking_ops.clamp(1, Semaphore::MAX_PERMITS),
            )),
            sweep_lock: RwLock::new(()),
            key_stripes: (0..KEY_STRIPES)
                .map(|_| Arc::new(AsyncMutex::new(())))
                .collect(),
            locks: LockTable::default(),
        });
        tree.run("open", |tree| {
            let mut builder = fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder
                .create(&tree.root)
                .map_err(io_error("create directory", &tree.root))?;
            tree.probe()
        })
        .await?;
        let swept = Arc::clone(&tree);
        let sweeper = Sweeper::spawn("fs", cfg.sweep_interval(), move || {
            let tree = Arc::clone(&swept);
            async move { tree.run_unlocked("sweep", Tree::sweep).await }
        });
        Ok(FsStore { tree, sweeper })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.tree.root
    }

    /// Deletes expired files, stale temporary files and empty directories now (the sweeper
    /// does this every `sweep_interval_secs`); returns how many files it deleted.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        self.tree.run_unlocked("sweep", Tree::sweep).await
    }
}

#[async_trait]
impl Store for FsStore {
    async fn put_content(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError> {
        let (t, s, content) = (tenant.clone(), session.clone(), content.to_owned());
        self.tree
            .run("put_content", move |tree| {
                tree.put_content(&t, &s, kind, &content)
            })
            .await
    }

    async fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError> {
        let (t, r) = (tenant.clone(), r.clone());
        self.tree
            .run("get_content", move |tree| tree.get_content(&t, &r))
            .await
    }

    async fn append_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        record: &serde_json::Value,
    ) -> Result<(), StoreError> {
        // Compact JSON has no raw newline: one record is one line.
        let line = serde_json::to_string(record)
            .map_err(|e| StoreError::Internal(format!("cannot serialize a log record: {e}")))?;
        let (t, s) = (tenant.clone(), session.clone());
        self.tree
            .run("append_log", move |tree| tree.append_log(&t, &s, &line))
            .await
    }

    async fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let (t, s) = (tenant.clone(), session.clone());
        self.tree
            .run("read_log", move |tree| tree.read_log(&t, &s))
            .await
    }

    async fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let guard = self.tree.key_guard(tenant, session, key).await;
        let (t, s, k, value) = (tenant.clone(), session.clone(), key.clone(), value.to_vec());
        self.tree
            .run("put_state", move |tree| {
                let _guard = guard;
                tree.put_state(&t, &s, &k, &value)
            })
            .await
    }

    async fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let (t, s, k) = (tenant.clone(), session.clone(), key.clone());
        self.tree
            .run("get_state", move |tree| tree.get_state(&t, &s, &k))
            .await
    }

    async fn compare_and_set_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StoreError> {
        // Held until the blocking work ends, even when the caller has timed out and gone.
        let guard = self.tree.key_guard(tenant, session, key).await;
        let (t, s, k) = (tenant.clone(), session.clone(), key.clone());
        let (expected, new) = (expected.map(<[u8]>::to_vec), new.to_vec());
        self.tree
            .run("compare_and_set_state", move |tree| {
                let _guard = guard;
                if tree.get_state(&t, &s, &k)? != expected {
                    return Ok(false);
                }
                tree.put_state(&t, &s, &k, &new).map(|()| true)
            })
            .await
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
        let now = self.tree.clock.now();
        Ok(self.tree.locks.try_lock(&key, holder, ttl, now))
    }

    async fn unlock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.tree
            .locks
            .unlock(&lock_key(tenant, session, name), holder);
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.tree.run("ping", Tree::probe).await
    }

    async fn close(&self) {
        self.sweeper.stop().await;
    }
}

impl Tree {
    /// Runs the operation `f` on a blocking thread, holding a permit and the sweep lock shared.
    async fn run<T, F>(self: &Arc<Self>, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Tree) -> Result<T, StoreError> + Send + 'static,
    {
        self.run_unlocked(op, move |tree| {
            let _shared = tree.shared_lock();
            f(tree)
        })
        .await
    }

    /// Runs `f` on a blocking thread, holding a permit.
    async fn run_unlocked<T, F>(self: &Arc<Self>, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Tree) -> Result<T, StoreError> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Internal(format!("{op}: the fs store is closed")))?;
        let tree = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&tree)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("{op}: {e}")))?
    }

    /// The compare-and-set mutex of a state record, locked.
    async fn key_guard(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> OwnedMutexGuard<()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (tenant.as_str(), session.as_str(), key.as_str()).hash(&mut hasher);
        let stripe = (hasher.finish() % self.key_stripes.len() as u64) as usize;
        Arc::clone(&self.key_stripes[stripe]).lock_owned().await
    }

    fn shared_lock(&self) -> RwLockReadGuard<'_, ()> {
        // The lock guards no data, so a panic while it was held leaves nothing inconsistent.
        self.sweep_lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn exclusive_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.sweep_lock.write().unwrap_or_else(|e| e.into_inner())
    }

    fn tenant_dir(&self, tenant: &Tenant) -> PathBuf {
        self.root.join(tenant.as_str())
    }

    fn session_dir(&self, tenant: &Tenant, session: &SessionId) -> PathBuf {
        self.tenant_dir(tenant).join(session.as_str())
    }

    fn pointer_path(&self, tenant: &Tenant, r: &ContentRef) -> PathBuf {
        self.tenant_dir(tenant).join(REFS_DIR).join(r.as_str())
    }

    fn expired(&self, modified: SystemTime, now: SystemTime) -> bool {
        now.duration_since(modified)
            .is_ok_and(|age| age >= self.retention)
    }

    // ---- operations (on a blocking thread, under the shared lock) ----

    fn put_content(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError> {
        let r = ContentRef::of(content);
        let now = self.clock.now();
        match self.open_content(tenant, &r, now) {
            // Stored already: written once, only refreshed. (A file of another size was edited
            // by hand; a read would report it, so it is rewritten.)
            Ok(Some((path, file)))
                if file
                    .metadata()
                    .is_ok_and(|m| m.len() == content.len() as u64) =>
            {
                file.set_modified(now).map_err(io_error("refresh", &path))?;
                return Ok(r);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "rewriting stored content"),
        }
        let tenant_dir = self.tenant_dir(tenant);
        let session_dir = self.session_dir(tenant, session);
        let refs_dir = tenant_dir.join(REFS_DIR);
        self.make_dir(&tenant_dir)?;
        self.make_dir(&session_dir)?;
        self.make_dir(&refs_dir)?;
        let name = kind.file_name(&r);
        self.write_atomic(&session_dir, &name, content.as_bytes(), now)?;
        let pointer = format!("{session}/{name}\n");
        self.write_atomic(&refs_dir, r.as_str(), pointer.as_bytes(), now)?;
        Ok(r)
    }

    fn get_content(&self, tenant: &Tenant, r: &ContentRef) -> Result<Option<String>, StoreError> {
        let now = self.clock.now();
        let Some((path, mut file)) = self.open_content(tenant, r, now)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io_error("read", &path))?;
        let corrupt = |detail: &str| StoreError::Corrupt {
            location: path.display().to_string(),
            detail: detail.to_owned(),
        };
        if ContentRef::of_bytes(&bytes) != *r {
            // Forget it, so that storing the content again writes it afresh.
            let _ = fs::remove_file(self.pointer_path(tenant, r));
            return Err(corrupt("the content does not match its reference"));
        }
        let text = String::from_utf8(bytes).map_err(|_| corrupt("not UTF-8"))?;
        file.set_modified(now).map_err(io_error("refresh", &path))?;
        Ok(Some(text))
    }

    /// The content file `r` names, opened, when its pointer and the file are both live; the
    /// pointer is refreshed.
    fn open_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
        now: SystemTime,
    ) -> Result<Option<(PathBuf, File)>, StoreError> {
        let pointer_path = self.pointer_path(tenant, r);
        let Some(pointer) = self.open_live(&pointer_path, now)? else {
            return Ok(None);
        };
        let mut text = String::new();
        let read = (&pointer).take(MAX_POINTER_BYTES).read_to_string(&mut text);
        let path = read
            .ok()
            .and_then(|_| self.resolve_pointer(tenant, r, &text))
            .ok_or_else(|| StoreError::Corrupt {
                location: pointer_path.display().to_string(),
                detail: format!(
                    "expected one line `<session>/<kind>-{r}.<ext>`, found {:?}",
                    text.chars().take(80).collect::<String>()
                ),
            })?;
        let Some(file) = self.open_live(&path, now)? else {
            return Ok(None);
        };
        pointer
            .set_modified(now)
            .map_err(io_error("refresh", &pointer_path))?;
        Ok(Some((path, file)))
    }

    /// The content file a pointer names, if the pointer is exactly `<session>/<file>\n` with a
    /// valid session and the file name of one kind of content `r`: it cannot name anything else.
    fn resolve_pointer(&self, tenant: &Tenant, r: &ContentRef, text: &str) -> Option<PathBuf> {
        let (session, file) = text.strip_suffix('\n')?.split_once('/')?;
        let session = SessionId::parse(session).ok()?;
        ContentKind::ALL
            .iter()
            .any(|kind| kind.file_name(r) == file)
            .then(|| self.session_dir(tenant, &session).join(file))
    }

    fn append_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        line: &str,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let session_dir = self.session_dir(tenant, session);
        self.make_dir(&self.tenant_dir(tenant))?;
        self.make_dir(&session_dir)?;
        let path = session_dir.join(LOG_FILE);
        let mut options = OpenOptions::new();
        options.read(true).append(true).create(true);
        private_file(&mut options);
        let mut file = options.open(&path).map_err(io_error("open", &path))?;
        let appended = (|| -> io::Result<()> {
            let meta = file.metadata()?;
            let mut len = meta.len();
            if len > 0 && self.expired(meta.modified()?, now) {
                // An expired journal the sweeper has not reached yet: start afresh.
                file.set_len(0)?;
                len = 0;
            }
            let mut buf = Vec::with_capacity(line.len() + 2);
            if len > 0 {
                let mut last = [0u8];
                file.seek(SeekFrom::End(-1))?;
                file.read_exact(&mut last)?;
                if last[0] != b'\n' {
                    // The last record was torn by a crash: keep the new one on its own line.
                    buf.push(b'\n');
                }
            }
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
            file.write_all(&buf)?;
            file.set_modified(now)?;
            if self.fsync {
                file.sync_all()?;
                if len == 0 {
                    sync_dir(&session_dir)?;
                }
            }
            Ok(())
        })();
        appended.map_err(io_error("append to", &path))
    }

    fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let now = self.clock.now();
        let path = self.session_dir(tenant, session).join(LOG_FILE);
        let Some(mut file) = self.open_live(&path, now)? else {
            return Ok(Vec::new());
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io_error("read", &path))?;
        let mut records = Vec::new();
        for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice(line) {
                Ok(record) => records.push(record),
                Err(e) => tracing::warn!(
                    path = %path.display(),
                    line = i + 1,
                    error = %e,
                    "skipping a torn or invalid journal line"
                ),
            }
        }
        file.set_modified(now).map_err(io_error("refresh", &path))?;
        Ok(records)
    }

    fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let session_dir = self.session_dir(tenant, session);
        let state_dir = session_dir.join(STATE_DIR);
        self.make_dir(&self.tenant_dir(tenant))?;
        self.make_dir(&session_dir)?;
        self.make_dir(&state_dir)?;
        self.write_atomic(&state_dir, key.as_str(), value, now)
    }

    fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let now = self.clock.now();
        let path = self
            .session_dir(tenant, session)
            .join(STATE_DIR)
            .join(key.as_str());
        let Some(mut file) = self.open_live(&path, now)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io_error("read", &path))?;
        file.set_modified(now).map_err(io_error("refresh", &path))?;
        Ok(Some(bytes))
    }

    /// Creates and deletes a temporary file in the root.
    fn probe(&self) -> Result<(), StoreError> {
        let (path, file) = create_temp(&self.root)?;
        drop(file);
        fs::remove_file(&path).map_err(io_error("delete", &path))
    }

    // ---- files ----

    /// Opens `path` for reading and refreshing, unless it is missing or expired.
    fn open_live(&self, path: &Path, now: SystemTime) -> Result<Option<File>, StoreError> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("open", path)(e)),
        };
        let modified = file
            .metadata()
            .and_then(|meta| meta.modified())
            .map_err(io_error("read the time of", path))?;
        Ok((!self.expired(modified, now)).then_some(file))
    }

    /// Writes `dir/name` so that it is never seen half-written: a temporary file in `dir`,
    /// flushed, then renamed over `name`.
    fn write_atomic(
        &self,
        dir: &Path,
        name: &str,
        bytes: &[u8],
        now: SystemTime,
    ) -> Result<(), StoreError> {
        let target = dir.join(name);
        let (temp, mut file) = create_temp(dir)?;
        let written = (|| -> io::Result<()> {
            file.write_all(bytes)?;
            file.set_modified(now)?;
            if self.fsync {
                file.sync_all()?;
            }
            drop(file);
            fs::rename(&temp, &target)?;
            if self.fsync {
                sync_dir(dir)?;
            }
            Ok(())
        })();
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written.map_err(io_error("write", &target))
    }

    /// Creates the directory `path` (whose parent exists) unless it exists.
    fn make_dir(&self, path: &Path) -> Result<(), StoreError> {
        let mut builder = fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(path) {
            Ok(()) => match path.parent() {
                Some(parent) if self.fsync => {
                    sync_dir(parent).map_err(io_error("sync directory", parent))
                }
                _ => Ok(()),
            },
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io_error("create directory", path)(e)),
        }
    }

    // ---- sweeping (on a blocking thread, taking the lock exclusively per deletion) ----

    fn sweep(&self) -> Result<usize, StoreError> {
        let now = self.clock.now();
        self.locks.purge_expired(now);
        let entries = fs::read_dir(&self.root).map_err(io_error("list", &self.root))?;
        let mut removed = 0;
        for entry in entries.flatten() {
            let (path, name) = (entry.path(), entry.file_name());
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                removed += self.remove_stale_temp(&path, now);
            } else if Tenant::is_valid(name) && is_dir(&entry) {
                removed += self.sweep_tenant(&path, now);
            }
        }
        Ok(removed)
    }

    fn sweep_tenant(&self, dir: &Path, now: SystemTime) -> usize {
        let mut removed = 0;
        for entry in list(dir) {
            let (path, name) = (entry.path(), entry.file_name());
            let Some(name) = name.to_str() else { continue };
            if name == REFS_DIR && is_dir(&entry) {
                removed += self.sweep_files(&path, now, |n| ContentRef::parse(n).is_ok());
                self.remove_if_empty(&path);
            } else if SessionId::parse(name).is_ok() && is_dir(&entry) {
                removed +=
                    self.sweep_files(&path, now, |n| n == LOG_FILE || is_content_file_name(n));
                let state = path.join(STATE_DIR);
                if state.is_dir() {
                    removed += self.sweep_files(&state, now, |n| StateKey::parse(n).is_ok());
                    self.remove_if_empty(&state);
                }
                self.remove_if_empty(&path);
            }
        }
        self.remove_if_empty(dir);
        removed
    }

    /// Deletes the expired files of `dir` whose name is `ours`, and stale temporary files.
    fn sweep_files(&self, dir: &Path, now: SystemTime, ours: impl Fn(&str) -> bool) -> usize {
        let mut removed = 0;
        for entry in list(dir) {
            let (path, name) = (entry.path(), entry.file_name());
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                removed += self.remove_stale_temp(&path, now);
            } else if ours(name) && entry.file_type().is_ok_and(|t| t.is_file()) {
                let _exclusive = self.exclusive_lock();
                // Checked under the lock: no operation can be refreshing it now.
                if modified(&path).is_some_and(|m| self.expired(m, now)) {
                    removed += remove(&path);
                }
            }
        }
        removed
    }

    fn remove_stale_temp(&self, path: &Path, now: SystemTime) -> usize {
        let _exclusive = self.exclusive_lock();
        let stale = modified(path)
            .is_some_and(|m| now.duration_since(m).is_ok_and(|age| age >= TEMP_GRACE));
        if stale {
            remove(path)
        } else {
            0
        }
    }

    fn remove_if_empty(&self, dir: &Path) {
        let _exclusive = self.exclusive_lock();
        // Fails, as it should, when the directory is not empty.
        let _ = fs::remove_dir(dir);
    }
}

/// The name of a session lock in the [`LockTable`].
fn lock_key(tenant: &Tenant, session: &SessionId, name: &StateKey) -> String {
    format!("{tenant}/{session}/{name}")
}

/// Whether `name` is `<kind>-<ref>.<ext>` of some kind and reference.
fn is_content_file_name(name: &str) -> bool {
    let Some((_, rest)) = name.split_once('-') else {
        return false;
    };
    let Some((r, _)) = rest.rsplit_once('.') else {
        return false;
    };
    ContentRef::parse(r).is_ok_and(|r| {
        ContentKind::ALL
            .iter()
            .any(|kind| kind.file_name(&r) == name)
    })
}

/// Creates a new, empty temporary file in `dir`.
fn create_temp(dir: &Path) -> Result<(PathBuf, File), StoreError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    private_file(&mut options);
    let mut last_path = dir.to_path_buf();
    // A name can only be taken by a file a crashed process with the same id left behind.
    for _ in 0..16 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{TEMP_PREFIX}{}-{n}", std::process::id()));
        match options.open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_path = path,
            Err(e) => return Err(io_error("create", &path)(e)),
        }
    }
    Err(io_error("create", &last_path)(io::Error::from(
        io::ErrorKind::AlreadyExists,
    )))
}

fn private_file(options: &mut OpenOptions) {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    #[cfg(not(unix))]
    let _ = options;
}

/// Flushes a directory's entries, so that a rename or a new file in it survives a power loss.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn list(dir: &Path) -> impl Iterator<Item = fs::DirEntry> {
    let entries = fs::read_dir(dir)
        .map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot list"))
        .ok();
    entries.into_iter().flatten().flatten()
}

fn is_dir(entry: &fs::DirEntry) -> bool {
    entry.file_type().is_ok_and(|t| t.is_dir())
}

fn modified(path: &Path) -> Option<SystemTime> {
    fs::metadata(path).and_then(|meta| meta.modified()).ok()
}

/// Deletes a file; 1 when it did.
fn remove(path: &Path) -> usize {
    match fs::remove_file(path) {
        Ok(()) => 1,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot delete");
            0
        }
    }
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ManualClock;

    const DAY: Duration = Duration::from_secs(86_400);

    struct Fixture {
        store: FsStore,
        clock: Arc<ManualClock>,
        dir: tempfile::TempDir,
        tenant: Tenant,
        session: SessionId,
    }

    impl Fixture {
        async fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let clock = Arc::new(ManualClock::new(SystemTime::now()));
            let cfg = StoreConfig {
                path: dir.path().join("data"),
                ..StoreConfig::default()
            };
            let store = FsStore::open(&cfg, clock.clone()).await.unwrap();
            // The tests sweep when they choose to, not when the background task does.
            store.close().await;
            Fixture {
                store,
                clock,
                dir,
                tenant: Tenant::from_api_key(Some("sk-test")),
                session: SessionId::parse("s1").unwrap(),
            }
        }

        fn tenant_dir(&self) -> PathBuf {
            self.store.root().join(self.tenant.as_str())
        }

        fn session_dir(&self) -> PathBuf {
            self.tenant_dir().join(self.session.as_str())
        }

        async fn put(&self, content: &str) -> ContentRef {
            self.store
                .put_content(
                    &self.tenant,
                    &self.session,
                    ContentKind::ToolResult,
                    content,
                )
                .await
                .unwrap()
        }
    }

    /// Every file under `dir`, as paths relative to it, sorted.
    fn files(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(base, &path, out);
                } else {
                    out.push(path.strip_prefix(base).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        if dir.exists() {
            walk(dir, dir, &mut out);
        }
        out.sort();
        out
    }

    #[tokio::test]
    async fn the_tree_is_human_readable() {
        let f = Fixture::new().await;
        let r = f.put("the whole tool result\n").await;
        let m = f
            .store
            .put_content(&f.tenant, &f.session, ContentKind::Messages, "[]")
            .await
            .unwrap();
        let record = serde_json::json!({"event": "offload", "ref": r.as_str()});
        f.store
            .append_log(&f.tenant, &f.session, &record)
            .await
            .unwrap();
        let multiline = serde_json::json!({"summary": "one\ntwo\r\n\u{4e2d}"});
        f.store
            .append_log(&f.tenant, &f.session, &multiline)
            .await
            .unwrap();
        let key = StateKey::parse("compact-abc").unwrap();
        f.store
            .put_state(&f.tenant, &f.session, &key, b"{\"upto\":3}")
            .await
            .unwrap();

        let tenant = f.tenant.as_str();
        let mut expected = [
            format!("{tenant}/_refs/{m}"),
            format!("{tenant}/_refs/{r}"),
            format!("{tenant}/s1/context.jsonl"),
            format!("{tenant}/s1/messages-{m}.json"),
            format!("{tenant}/s1/state/compact-abc"),
            format!("{tenant}/s1/tool_result-{r}.txt"),
        ];
        expected.sort();
        assert_eq!(files(f.store.root()), expected);
        let read = |p: PathBuf| fs::read_to_string(p).unwrap();
        assert_eq!(
            read(f.session_dir().join(format!("tool_result-{r}.txt"))),
            "the whole tool result\n"
        );
        assert_eq!(
            read(f.tenant_dir().join("_refs").join(r.as_str())),
            format!("s1/tool_result-{r}.txt\n")
        );
        let journal = read(f.session_dir().join("context.jsonl"));
        let first = format!("{{\"event\":\"offload\",\"ref\":\"{r}\"}}\n");
        assert!(journal.starts_with(&first), "{journal}");
        let lines: Vec<serde_json::Value> = journal
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines, [record, multiline]);
        assert_eq!(
            read(f.session_dir().join("state/compact-abc")),
            "{\"upto\":3}"
        );

        let anonymous = Tenant::from_api_key(None);
        f.store
            .put_content(&anonymous, &f.session, ContentKind::UserText, "hi")
            .await
            .unwrap();
        let r = ContentRef::of("hi");
        assert!(f
            .store
            .root()
            .join(format!("anonymous/s1/user_text-{r}.txt"))
            .is_file());
    }

    #[tokio::test]
    async fn content_is_written_once_across_sessions() {
        let f = Fixture::new().await;
        let r = f.put("same").await;
        let path = f.session_dir().join(format!("tool_result-{r}.txt"));
        let before = fs::metadata(&path).unwrap();
        let other = SessionId::parse("s2").unwrap();
        let again = f
            .store
            .put_content(&f.tenant, &other, ContentKind::ToolResult, "same")
            .await
            .unwrap();
        assert_eq!(again, r);
        assert!(!f.tenant_dir().join("s2").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(fs::metadata(&path).unwrap().ino(), before.ino());
        }
        let _ = before;
        assert_eq!(
            f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
            Some("same")
        );
    }

    #[tokio::test]
    async fn writes_leave_no_temporary_files() {
        let f = Fixture::new().await;
        let key = StateKey::parse("k").unwrap();
        for i in 0..20 {
            f.put(&format!("content {i}")).await;
            f.store
                .put_state(&f.tenant, &f.session, &key, format!("{i}").as_bytes())
                .await
                .unwrap();
        }
        f.store.ping().await.unwrap();
        let all = files(f.store.root());
        assert!(all.iter().all(|p| !p.contains(TEMP_PREFIX)), "{all:?}");
    }

    #[tokio::test]
    async fn concurrent_writers_leave_one_intact_file() {
        let f = Fixture::new().await;
        let store = Arc::new(f.store);
        let content = "中文 ".repeat(50_000);
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (store, t, s, c) = (
                store.clone(),
                f.tenant.clone(),
                f.session.clone(),
                content.clone(),
            );
            tasks.push(tokio::spawn(async move {
                store.put_content(&t, &s, ContentKind::ToolResult, &c).await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap(), ContentRef::of(&content));
        }
        let r = ContentRef::of(&content);
        let all = files(store.root());
        assert_eq!(all.len(), 2, "{all:?}");
        let on_disk = fs::read_to_string(
            store
                .root()
                .join(f.tenant.as_str())
                .join("s1")
                .join(format!("tool_result-{r}.txt")),
        )
        .unwrap();
        assert_eq!(on_disk, content);
    }

    #[tokio::test]
    async fn a_crash_leftover_temporary_file_is_ignored_then_deleted() {
        let f = Fixture::new().await;
        let r = f.put("kept").await;
        // As if a crash struck mid-write: a half-written temporary file beside the real ones.
        let leftover = f.session_dir().join(format!("{TEMP_PREFIX}999999-0"));
        fs::write(&leftover, "ha").unwrap();
        let in_refs = f
            .tenant_dir()
            .join(REFS_DIR)
            .join(format!("{TEMP_PREFIX}1-1"));
        fs::write(&in_refs, "s1/../../x").unwrap();
        assert_eq!(
            f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
            Some("kept")
        );
        assert_eq!(f.store.sweep().await.unwrap(), 0);
        assert!(leftover.exists(), "too young to be a leftover");
        f.clock.advance(2 * TEMP_GRACE);
        assert_eq!(f.store.sweep().await.unwrap(), 2);
        assert!(!leftover.exists() && !in_refs.exists());
        assert_eq!(
            f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
            Some("kept")
        );
    }

    #[tokio::test]
    async fn a_torn_journal_line_is_skipped_and_not_glued_to_the_next() {
        let f = Fixture::new().await;
        let one = serde_json::json!({"n": 1});
        let two = serde_json::json!({"n": 2});
        f.store
            .append_log(&f.tenant, &f.session, &one)
            .await
            .unwrap();
        let path = f.session_dir().join(LOG_FILE);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"n\": 9, \"torn").unwrap();
        drop(file);
        f.store
            .append_log(&f.tenant, &f.session, &two)
            .await
            .unwrap();
        assert_eq!(
            f.store.read_log(&f.tenant, &f.session).await.unwrap(),
            [one, two]
        );
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
    }

    #[tokio::test]
    async fn a_tampered_pointer_cannot_lead_outside_the_root() {
        let f = Fixture::new().await;
        let secret = f.dir.path().join("secret.txt");
        fs::write(&secret, "secret").unwrap();
        let r = ContentRef::of("secret");
        let refs = f.tenant_dir().join(REFS_DIR);
        fs::create_dir_all(&refs).unwrap();
        for pointer in [
            "../../secret.txt\n",
            "s1/../../../secret.txt\n",
            &format!("{}\n", secret.display()),
            &format!("../s1/tool_result-{r}.txt\n"),
            &format!("s1/tool_result-{r}.txt/../../../../secret.txt\n"),
        ] {
            fs::write(refs.join(r.as_str()), pointer).unwrap();
            let err = f.store.get_content(&f.tenant, &r).await.unwrap_err();
            assert!(
                matches!(err, StoreError::Corrupt { .. }),
                "{pointer:?}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn content_edited_by_hand_is_reported_not_served() {
        let f = Fixture::new().await;
        let r = f.put("original").await;
        fs::write(
            f.session_dir().join(format!("tool_result-{r}.txt")),
            "edited",
        )
        .unwrap();
        let err = f.store.get_content(&f.tenant, &r).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        // Storing it again repairs it.
        f.put("original").await;
        assert_eq!(
            f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
            Some("original")
        );
        // An edit that keeps the size is caught on reading too.
        fs::write(
            f.session_dir().join(format!("tool_result-{r}.txt")),
            "ORIGINAL",
        )
        .unwrap();
        assert!(f.store.get_content(&f.tenant, &r).await.is_err());
        f.put("original").await;
        assert_eq!(
            f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
            Some("original")
        );
    }

    #[tokio::test]
    async fn the_sweeper_deletes_expired_files_and_empty_directories() {
        let f = Fixture::new().await;
        let old = f.put("old").await;
        let record = serde_json::json!({"n": 1});
        f.store
            .append_log(&f.tenant, &f.session, &record)
            .await
            .unwrap();
        let key = StateKey::parse("k").unwrap();
        f.store
            .put_state(&f.tenant, &f.session, &key, b"v")
            .await
            .unwrap();
        let other = SessionId::parse("s2").unwrap();
        f.clock.advance(20 * DAY);
        let young = f
            .store
            .put_content(&f.tenant, &other, ContentKind::ToolResult, "young")
            .await
            .unwrap();
        let unknown = f.session_dir().join("notes.md");
        fs::write(&unknown, "a person's notes").unwrap();
        f.clock.advance(15 * DAY);
        // content + pointer, journal, state record.
        assert_eq!(f.store.sweep().await.unwrap(), 4);
        let tenant = f.tenant.as_str();
        assert_eq!(
            files(f.store.root()),
            [
                format!("{tenant}/_refs/{young}"),
                format!("{tenant}/s1/notes.md"),
                format!("{tenant}/s2/tool_result-{young}.txt"),
            ]
        );
        assert!(!f.session_dir().join(STATE_DIR).exists());
        assert_eq!(f.store.get_content(&f.tenant, &old).await.unwrap(), None);
        fs::remove_file(unknown).unwrap();
        f.clock.advance(31 * DAY);
        assert_eq!(f.store.sweep().await.unwrap(), 2);
        assert!(files(f.store.root()).is_empty());
        assert!(!f.tenant_dir().exists());
        assert!(f.store.root().is_dir());
    }

    #[tokio::test]
    async fn open_fails_clearly_when_the_path_is_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        fs::write(&path, "").unwrap();
        let cfg = StoreConfig {
            path: path.clone(),
            ..StoreConfig::default()
        };
        let err = FsStore::open(&cfg, Arc::new(crate::store::SystemClock))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::Io { .. }), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn close_stops_the_sweeper_and_the_store_keeps_working() {
        let f = Fixture::new().await;
        f.store.close().await;
        f.put("still works").await;
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn files_and_directories_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let f = Fixture::new().await;
        let r = f.put("private").await;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&f.session_dir()), 0o700);
        assert_eq!(
            mode(&f.session_dir().join(format!("tool_result-{r}.txt"))),
            0o600
        );
    }
}
