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

// Each file adds the operations of one kind of item to `Tree`: `content` (and the `_refs/`
// index), `journal`, `state`; `sweep` deletes what expired; `tree` is the plumbing under them.
mod content;
mod erase;
mod journal;
mod state;
mod sweep;
mod tree;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::sweeper::Sweeper;
use super::{
    Appended, Clock, ContentKind, ContentRef, Leave, LogLine, LogPage, SessionId, StateKey, Store,
    StoreConfig, StoreError, Tenant,
};
use tree::Tree;

const LOG_FILE: &str = "context.jsonl";
const REFS_DIR: &str = "_refs";
/// Tombstones of erased sessions, one file per session (never a session's stored name: those
/// never start with `_`).
const ERASED_DIR: &str = "_erased";
const STATE_DIR: &str = "state";
const TEMP_PREFIX: &str = ".tmp-";
/// A temporary file older than this was left by a crash (operations time out long before).
const TEMP_GRACE: Duration = Duration::from_secs(60 * 60);
/// A pointer is one short line; anything longer is not ours.
const MAX_POINTER_BYTES: u64 = 256;

/// The directory-tree store.
pub struct FsStore {
    tree: Arc<Tree>,
    sweeper: Sweeper,
}

impl FsStore {
    /// Creates `cfg.path` when missing, checks that files can be created in it, and starts the
    /// sweeper (which first deletes what a crash may have left).
    pub async fn open(cfg: &StoreConfig, clock: Arc<dyn Clock>) -> Result<FsStore, StoreError> {
        let tree = Arc::new(Tree::new(cfg, clock));
        tree.run("open", Tree::create_root).await?;
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

    /// One blocking task for the whole batch.
    async fn put_contents(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        kind: ContentKind,
        contents: Vec<String>,
    ) -> Result<Vec<ContentRef>, StoreError> {
        if contents.is_empty() {
            return Ok(Vec::new());
        }
        let (t, s) = (tenant.clone(), session.clone());
        self.tree
            .run("put_contents", move |tree| {
                contents
                    .iter()
                    .map(|content| tree.put_content(&t, &s, kind, content))
                    .collect()
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

    async fn contains_content(
        &self,
        tenant: &Tenant,
        refs: &[ContentRef],
    ) -> Result<Vec<bool>, StoreError> {
        let (t, refs) = (tenant.clone(), refs.to_vec());
        self.tree
            .run("contains_content", move |tree| {
                refs.iter().map(|r| tree.contains_content(&t, r)).collect()
            })
            .await
    }

    /// One open and one `write` for all of `lines` (each a record: the journal's count grows
    /// by how many there are, without scanning them).
    async fn append_lines(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        let mut bytes = Vec::with_capacity(lines.iter().map(|l| l.as_str().len() + 1).sum());
        for line in &lines {
            if !bytes.is_empty() {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(line.as_str().as_bytes());
        }
        let (t, s, count) = (tenant.clone(), session.clone(), lines.len());
        self.tree
            .run("append_logs", move |tree| {
                tree.append_log(&t, &s, &bytes, count, since)
            })
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

    async fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let (t, s) = (tenant.clone(), session.clone());
        self.tree
            .run("read_log_page", move |tree| {
                tree.read_log_page(&t, &s, before, limit)
            })
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
        self.tree.run("ping", Tree::probe_write).await
    }

    async fn close(&self) {
        self.sweeper.stop().await;
    }

    async fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        let t = tenant.cloned();
        self.tree
            .run("list_sessions", move |tree| tree.list_sessions(t.as_ref()))
            .await
    }

    async fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
        leave: Leave,
    ) -> Result<usize, StoreError> {
        let (t, s, r) = (tenant.clone(), session.clone(), refs.to_vec());
        self.tree
            .run_unlocked("erase_session", move |tree| {
                tree.erase_session(&t, &s, &r, leave)
            })
            .await
    }
}

/// The name of a session lock in the [`LockTable`].
fn lock_key(tenant: &Tenant, session: &SessionId, name: &StateKey) -> String {
    format!("{tenant}/{session}/{name}")
}
