//! The tree's plumbing: the shared state every file operation runs with, where each item's file
//! is, and the file primitives — opening a live file, atomic writes, private directories — that
//! the operations are built from.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, Semaphore};

use super::{REFS_DIR, TEMP_PREFIX};
use crate::store::locks::LockTable;
use crate::store::{Clock, ContentRef, SessionId, StateKey, StoreConfig, StoreError, Tenant};

/// Bytes the readiness probe writes (one filesystem block).
const PROBE_BYTES: usize = 4096;

/// State records share this many compare-and-set mutexes (by a hash of their path).
const KEY_STRIPES: usize = 64;

/// The tree and what file work needs; shared with the blocking threads and the sweeper.
pub(super) struct Tree {
    pub(super) root: PathBuf,
    pub(super) clock: Arc<dyn Clock>,
    retention: Duration,
    pub(super) fsync: bool,
    /// `store.min_free_bytes`.
    min_free_bytes: u64,
    permits: Arc<Semaphore>,
    /// Held shared by every operation and exclusively by the sweeper for each deletion.
    sweep_lock: RwLock<()>,
    /// Serialize the writes of a state record (compare-and-set is read, compare, write).
    key_stripes: Vec<Arc<AsyncMutex<()>>>,
    /// Session locks (`try_lock`, `unlock`).
    pub(super) locks: LockTable,
    /// Per journal file, its length and records after this process's last append to it.
    pub(super) journal_counts: quick_cache::sync::Cache<PathBuf, (u64, usize)>,
}

/// Journals whose record count is remembered (a miss costs one read of the journal).
const JOURNAL_COUNTS: usize = 4_096;

impl Tree {
    pub(super) fn new(cfg: &StoreConfig, clock: Arc<dyn Clock>) -> Tree {
        Tree {
            root: cfg.path.clone(),
            clock,
            retention: cfg.retention(),
            fsync: cfg.fsync,
            min_free_bytes: cfg.min_free_bytes,
            permits: Arc::new(Semaphore::new(
                cfg.max_blocking_ops.clamp(1, Semaphore::MAX_PERMITS),
            )),
            sweep_lock: RwLock::new(()),
            key_stripes: (0..KEY_STRIPES)
                .map(|_| Arc::new(AsyncMutex::new(())))
                .collect(),
            locks: LockTable::default(),
            journal_counts: quick_cache::sync::Cache::new(JOURNAL_COUNTS),
        }
    }

    /// Creates the root directory (and its parents) when missing, then checks that files can be
    /// created in it.
    pub(super) fn create_root(&self) -> Result<(), StoreError> {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(&self.root)
            .map_err(io_error("create directory", &self.root))?;
        // A store that exists but cannot be written (a read-only mount, another user's files)
        // still serves what it holds: writes fail (requests go out as they came) and /readyz
        // says degraded until it can be written.
        if let Err(e) = self.probe() {
            tracing::warn!(error = %e, "the store cannot be written: serving reads only");
        }
        Ok(())
    }
    /// Runs the operation `f` on a blocking thread, holding a permit and the sweep lock shared.
    pub(super) async fn run<T, F>(self: &Arc<Self>, op: &'static str, f: F) -> Result<T, StoreError>
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
    pub(super) async fn run_unlocked<T, F>(
        self: &Arc<Self>,
        op: &'static str,
        f: F,
    ) -> Result<T, StoreError>
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
    pub(super) async fn key_guard(
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

    pub(super) fn shared_lock(&self) -> RwLockReadGuard<'_, ()> {
        // The lock guards no data, so a panic while it was held leaves nothing inconsistent.
        self.sweep_lock.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn exclusive_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.sweep_lock.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn tenant_dir(&self, tenant: &Tenant) -> PathBuf {
        self.root.join(tenant.as_str())
    }

    pub(super) fn session_dir(&self, tenant: &Tenant, session: &SessionId) -> PathBuf {
        self.tenant_dir(tenant).join(session.as_str())
    }

    pub(super) fn pointer_path(&self, tenant: &Tenant, r: &ContentRef) -> PathBuf {
        self.tenant_dir(tenant).join(REFS_DIR).join(r.as_str())
    }

    pub(super) fn expired(&self, modified: SystemTime, now: SystemTime) -> bool {
        now.duration_since(modified)
            .is_ok_and(|age| age >= self.retention)
    }

    /// Creates and deletes a temporary file in the root.
    pub(super) fn probe(&self) -> Result<(), StoreError> {
        let (path, file) = create_temp(&self.root)?;
        drop(file);
        fs::remove_file(&path).map_err(io_error("delete", &path))
    }

    /// Writes a small file in the root (creating the root when it is gone), then deletes it:
    /// an empty file can still be created on a full disk, a write cannot.
    pub(super) fn probe_write(&self) -> Result<(), StoreError> {
        self.make_dir(&self.root)?;
        let (path, mut file) = create_temp(&self.root)?;
        let written = file.write_all(&[b'.'; PROBE_BYTES]).and_then(|()| {
            if self.fsync {
                file.sync_data()
            } else {
                Ok(())
            }
        });
        drop(file);
        let removed = fs::remove_file(&path).map_err(io_error("delete", &path));
        written.map_err(io_error("write", &path))?;
        removed?;
        self.check_free_space()
    }

    /// Fails when fewer than `store.min_free_bytes` are free to this process under the root.
    fn check_free_space(&self) -> Result<(), StoreError> {
        if self.min_free_bytes == 0 {
            return Ok(());
        }
        let stat = rustix::fs::statvfs(&self.root).map_err(|e| StoreError::Io {
            op: "statvfs",
            path: self.root.clone(),
            source: e.into(),
        })?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free < self.min_free_bytes {
            return Err(StoreError::Internal(format!(
                "only {free} bytes are free under {} (store.min_free_bytes = {})",
                self.root.display(),
                self.min_free_bytes
            )));
        }
        Ok(())
    }

    /// Opens `path` for reading and refreshing, unless it is missing or expired.
    pub(super) fn open_live(
        &self,
        path: &Path,
        now: SystemTime,
    ) -> Result<Option<File>, StoreError> {
        // Read access is enough to refresh the time of one's own file, and a store that cannot
        // be written must still be read.
        let file = match OpenOptions::new().read(true).open(path) {
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
    pub(super) fn write_atomic(
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
    pub(super) fn make_dir(&self, path: &Path) -> Result<(), StoreError> {
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A parent is gone: the root was deleted under the running proxy. Make the
                // whole path again rather than fail every write until a restart.
                tracing::warn!(path = %path.display(), "store directory missing: creating it again");
                builder
                    .recursive(true)
                    .create(path)
                    .map_err(io_error("create directory", path))
            }
            Err(e) => Err(io_error("create directory", path)(e)),
        }
    }
}

/// Creates a new, empty temporary file in `dir`.
pub(super) fn create_temp(dir: &Path) -> Result<(PathBuf, File), StoreError> {
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

pub(super) fn private_file(options: &mut OpenOptions) {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    #[cfg(not(unix))]
    let _ = options;
}

/// Flushes a directory's entries, so that a rename or a new file in it survives a power loss.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

pub(super) fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

/// Refreshes a file's retention on a read. A store that cannot be written (a read-only mount,
/// files of another user) still serves what it holds: the failure is logged, not returned.
pub(super) fn refresh_on_read(file: &File, path: &Path, now: SystemTime) {
    if let Err(e) = file.set_modified(now) {
        tracing::debug!(error = %e, path = %path.display(), "cannot refresh the retention of stored content");
    }
}
