//! Deleting what expired: the store's files older than the retention period (unknown files are
//! left alone), temporary files a crash left, then empty directories. Runs on a blocking thread
//! and takes the sweep lock exclusively for each deletion, so no operation is between its check
//! and its refresh of a file being deleted.

use std::fs;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::content::is_content_file_name;
use super::tree::{io_error, Tree};
use super::{ERASED_DIR, LOG_FILE, REFS_DIR, STATE_DIR, TEMP_GRACE, TEMP_PREFIX};
use crate::store::{ContentRef, SessionId, StateKey, StoreError, Tenant};

impl Tree {
    pub(super) fn sweep(&self) -> Result<usize, StoreError> {
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

    pub(super) fn sweep_tenant(&self, dir: &Path, now: SystemTime) -> usize {
        let mut removed = 0;
        for entry in list(dir) {
            let (path, name) = (entry.path(), entry.file_name());
            let Some(name) = name.to_str() else { continue };
            if name == REFS_DIR && is_dir(&entry) {
                removed += self.sweep_files(&path, now, |n| ContentRef::parse(n).is_ok());
                self.remove_if_empty(&path);
            } else if name == ERASED_DIR && is_dir(&entry) {
                removed += self.sweep_files(&path, now, |n| SessionId::from_stored(n).is_some());
                self.remove_if_empty(&path);
            } else if SessionId::from_stored(name).is_some() && is_dir(&entry) {
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
    pub(super) fn sweep_files(
        &self,
        dir: &Path,
        now: SystemTime,
        ours: impl Fn(&str) -> bool,
    ) -> usize {
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

    pub(super) fn remove_stale_temp(&self, path: &Path, now: SystemTime) -> usize {
        let _exclusive = self.exclusive_lock();
        let stale = modified(path)
            .is_some_and(|m| now.duration_since(m).is_ok_and(|age| age >= TEMP_GRACE));
        if stale {
            remove(path)
        } else {
            0
        }
    }

    pub(super) fn remove_if_empty(&self, dir: &Path) {
        let _exclusive = self.exclusive_lock();
        // Fails, as it should, when the directory is not empty.
        let _ = fs::remove_dir(dir);
    }
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
