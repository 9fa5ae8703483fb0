//! The session journal, `<session>/context.jsonl`: one JSON record per line, appended with one
//! `write` per call (one record, or the lines of a batch); a line torn by a crash is skipped when reading and never glued to the next.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, BufRead, Read, Seek, SeekFrom, Write};
use std::time::SystemTime;

use super::tree::{io_error, private_file, refresh_on_read, sync_dir, Tree};
use super::{ERASED_DIR, LOG_FILE};
use crate::store::{refuses, Appended, LogPage, SessionId, StoreError, Tenant};

impl Tree {
    /// Appends `lines` (`count` records, one per line: one record or the lines of a batch,
    /// without their last newline) to the session's journal, unless the session was erased
    /// since `since` (its tombstone); the records the journal then holds. The count is kept per journal (its length and
    /// records after the last append), so a journal is read whole only when its file changed
    /// otherwise (a first append since start-up, an erasure, a sweep).
    pub(super) fn append_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: &[u8],
        count: usize,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        if let Some(at) = refuses(self.tombstone(tenant, session), since) {
            return Ok(Appended::Erased(at));
        }
        let now = self.clock.now();
        let session_dir = self.session_dir(tenant, session);
        self.make_dir(&self.tenant_dir(tenant))?;
        self.make_dir(&session_dir)?;
        let path = session_dir.join(LOG_FILE);
        let mut options = OpenOptions::new();
        options.read(true).append(true).create(true);
        private_file(&mut options);
        let mut file = options.open(&path).map_err(io_error("open", &path))?;
        let appended = (|| -> io::Result<usize> {
            let meta = file.metadata()?;
            let mut len = meta.len();
            if len > 0 && self.expired(meta.modified()?, now) {
                // An expired journal the sweeper has not reached yet: start afresh.
                file.set_len(0)?;
                len = 0;
            }
            let before = match self.journal_counts.get(&path) {
                Some((known, records)) if known == len => records,
                _ if len == 0 => 0,
                _ => {
                    file.seek(SeekFrom::Start(0))?;
                    let mut bytes = Vec::with_capacity(len as usize);
                    (&mut file).take(len).read_to_end(&mut bytes)?;
                    records_in(&bytes)
                }
            };
            let mut buf = Vec::with_capacity(lines.len() + 2);
            if len > 0 {
                let mut last = [0u8];
                file.seek(SeekFrom::End(-1))?;
                file.read_exact(&mut last)?;
                if last[0] != b'\n' {
                    // The last record was torn by a crash: keep the new one on its own line.
                    buf.push(b'\n');
                }
            }
            buf.extend_from_slice(lines);
            buf.push(b'\n');
            file.write_all(&buf)?;
            file.set_modified(now)?;
            if self.fsync {
                file.sync_all()?;
                if len == 0 {
                    sync_dir(&session_dir)?;
                }
            }
            let records = before + count;
            self.journal_counts
                .insert(path.clone(), (len + buf.len() as u64, records));
            Ok(records)
        })();
        appended
            .map(Appended::Records)
            .map_err(io_error("append to", &path))
    }

    /// When the session was erased, from its tombstone (`<tenant>/_erased/<session>`, epoch
    /// milliseconds), when it has one.
    pub(super) fn tombstone(&self, tenant: &Tenant, session: &SessionId) -> Option<u64> {
        let path = self
            .tenant_dir(tenant)
            .join(ERASED_DIR)
            .join(session.as_str());
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// A page of the journal (see `Store::read_log_page`), read line by line: only the last
    /// `limit` lines before `before` are kept, so a journal of any size costs the page's
    /// memory. Every non-empty line counts as a record; a torn one
    /// in the page is skipped.
    pub(super) fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let now = self.clock.now();
        let path = self.session_dir(tenant, session).join(LOG_FILE);
        let Some(file) = self.open_live(&path, now)? else {
            return Ok(LogPage::default());
        };
        let mut reader = io::BufReader::new(&file);
        let mut kept: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
        let mut total = 0usize;
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(io_error("read", &path))?;
            if n == 0 {
                break;
            }
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            // The last `limit` lines before `before`.
            if before.is_none_or(|end| total < end) && limit > 0 {
                if kept.len() == limit {
                    kept.pop_front();
                }
                kept.push_back((total, std::mem::take(&mut line)));
            }
            total += 1;
        }
        let range = LogPage::range(total, before, limit);
        let mut records = Vec::with_capacity(kept.len());
        for (i, bytes) in kept.into_iter().filter(|(i, _)| range.contains(i)) {
            match serde_json::from_slice(&bytes) {
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
        Ok(LogPage {
            records,
            first_index: range.start,
            total,
        })
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

/// The records in `bytes` of a journal: its lines that are not blank (what a read counts).
fn records_in(bytes: &[u8]) -> usize {
    bytes
        .split(|&b| b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .count()
}
