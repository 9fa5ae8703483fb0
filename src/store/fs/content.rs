//! Offloaded content: `<session>/<kind>-<ref>.<ext>`, written once, found from the reference
//! alone through the tenant's `_refs/<ref>` pointer, and checked against its reference on
//! every read.

use std::fs::{self, File};
use std::io::Read;
use std::path::PathBuf;
use std::time::SystemTime;

use super::tree::{io_error, refresh_on_read, Tree};
use super::{MAX_POINTER_BYTES, REFS_DIR};
use crate::store::{ContentKind, ContentRef, SessionId, StoreError, Tenant};

impl Tree {
    pub(super) fn put_content(
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

    /// Whether `r` is stored and live for `tenant`: its pointer and the file it names exist and
    /// have not expired. Reads the pointer and `stat`s the file; refreshes nothing.
    pub(super) fn contains_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let pointer_path = self.pointer_path(tenant, r);
        let text = match fs::read(&pointer_path) {
            Ok(bytes) if bytes.len() as u64 <= MAX_POINTER_BYTES => bytes,
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error("read", &pointer_path)(e)),
        };
        let live = |path: &std::path::Path| -> Result<bool, StoreError> {
            match fs::metadata(path).and_then(|m| m.modified()) {
                Ok(modified) => Ok(!self.expired(modified, now)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io_error("read the time of", path)(e)),
            }
        };
        let Some(path) = std::str::from_utf8(&text)
            .ok()
            .and_then(|text| self.resolve_pointer(tenant, r, text))
        else {
            return Ok(false);
        };
        Ok(live(&pointer_path)? && live(&path)?)
    }

    pub(super) fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError> {
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
        refresh_on_read(&file, &path, now);
        Ok(Some(text))
    }

    /// The content file `r` names, opened, when its pointer and the file are both live; the
    /// pointer is refreshed.
    pub(super) fn open_content(
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
        refresh_on_read(&pointer, &pointer_path, now);
        Ok(Some((path, file)))
    }

    /// The content file a pointer names, if the pointer is exactly `<session>/<file>\n` with a
    /// valid session and the file name of one kind of content `r`: it cannot name anything else.
    pub(super) fn resolve_pointer(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
        text: &str,
    ) -> Option<PathBuf> {
        let (session, file) = text.strip_suffix('\n')?.split_once('/')?;
        let session = SessionId::from_stored(session)?;
        ContentKind::ALL
            .iter()
            .any(|kind| kind.file_name(r) == file)
            .then(|| self.session_dir(tenant, &session).join(file))
    }
}

/// Whether `name` is `<kind>-<ref>.<ext>` of some kind and reference.
pub(super) fn is_content_file_name(name: &str) -> bool {
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
