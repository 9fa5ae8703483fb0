//! Inspection and erasure: the sessions of a tenant (or of all), and deleting one session's
//! directory with the `_refs/` pointers into it and the content its journal names.

use std::fs;
use std::io::ErrorKind;

use super::tree::{io_error, Tree};
use super::{ERASED_DIR, REFS_DIR, TEMP_PREFIX};
use crate::store::{ContentRef, SessionId, StoreError, Tenant};

impl Tree {
    pub(super) fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        let tenants = match tenant {
            Some(t) => vec![t.clone()],
            None => dir_names(&self.root)?
                .iter()
                .filter_map(|name| Tenant::from_id(name))
                .collect(),
        };
        let mut found = Vec::new();
        for t in tenants {
            for name in dir_names(&self.tenant_dir(&t))? {
                if name == REFS_DIR || name.starts_with(TEMP_PREFIX) {
                    continue;
                }
                if let Some(session) = SessionId::from_stored(&name) {
                    found.push((t.clone(), session));
                }
            }
        }
        found.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
        Ok(found)
    }

    pub(super) fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
    ) -> Result<usize, StoreError> {
        let _guard = self.exclusive_lock();
        // The tombstone first: a line of before the erasure, appended after it, is refused.
        let now = self.clock.now();
        let tombstones = self.tenant_dir(tenant).join(ERASED_DIR);
        self.make_dir(&self.tenant_dir(tenant))?;
        self.make_dir(&tombstones)?;
        let millis = crate::store::epoch_millis(now).to_string();
        self.write_atomic(&tombstones, session.as_str(), millis.as_bytes(), now)?;
        let dir = self.session_dir(tenant, session);
        let mut erased = 0;
        // Content stored in this session's directory: its pointer goes too.
        let mut doomed: Vec<ContentRef> = refs.to_vec();
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if let Some(r) = ref_in_file_name(&name) {
                    doomed.push(r);
                }
            }
        }
        for r in &doomed {
            let pointer = self.pointer_path(tenant, r);
            let Ok(target) = fs::read_to_string(&pointer) else {
                continue;
            };
            let target = target.trim_end();
            let in_session = target
                .strip_prefix(session.as_str())
                .is_some_and(|rest| rest.starts_with('/'));
            if !in_session {
                // Stored by another session of the tenant: the journal names it, so it goes.
                if let Some((other, file)) = target.split_once('/') {
                    if let (Some(other), false) =
                        (SessionId::from_stored(other), file.contains('/'))
                    {
                        let path = self.session_dir(tenant, &other).join(file);
                        if remove_file(&path)? {
                            erased += 1;
                        }
                    }
                }
            }
            remove_file(&pointer)?;
        }
        match fs::symlink_metadata(&dir) {
            Ok(_) => erased += count_files(&dir),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(erased),
            Err(e) => return Err(io_error("read", &dir)(e)),
        }
        fs::remove_dir_all(&dir).map_err(io_error("erase", &dir))?;
        Ok(erased)
    }
}

/// The reference in a content file name (`<kind>-<ref>.<ext>`).
fn ref_in_file_name(name: &str) -> Option<ContentRef> {
    let start = name.find("ctx_")?;
    let end = name[start..].find('.').map_or(name.len(), |e| start + e);
    name[start..end].parse().ok()
}

/// Files under `dir`, its subdirectories' included.
fn count_files(dir: &std::path::Path) -> usize {
    fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => count_files(&e.path()),
                _ => 1,
            })
            .sum()
    })
}

fn remove_file(path: &std::path::Path) -> Result<bool, StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("erase", path)(e)),
    }
}

fn dir_names(dir: &std::path::Path) -> Result<Vec<String>, StoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("list", dir)(e)),
    };
    Ok(entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect())
}
