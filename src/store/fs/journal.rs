//! The session journal, `<session>/context.jsonl`: one JSON record per line, appended with one
//! `write` each; a line torn by a crash is skipped when reading and never glued to the next.

use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};

use super::tree::{io_error, private_file, refresh_on_read, sync_dir, Tree};
use super::LOG_FILE;
use crate::store::{SessionId, StoreError, Tenant};

impl Tree {
    pub(super) fn append_log(
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

    pub(super) fn read_log(
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
        refresh_on_read(&file, &path, now);
        Ok(records)
    }
}
