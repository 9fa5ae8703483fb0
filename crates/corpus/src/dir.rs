//! A corpus on disk and its statistics: one `session-<id>.json` per session plus an
//! `index.json` that lists the files in order and summarizes the corpus (counts, bytes, a
//! histogram of tool-result sizes). `load_dir` reads back exactly what `write_dir` wrote.
//!
//! The index holds no timestamp, so the same sessions always give byte-identical files.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{AgentKind, Session};

/// Version of the on-disk format, bumped when a field changes meaning.
pub const FORMAT_VERSION: u32 = 1;

/// Bucket bounds (exclusive upper ends) of the tool-result size histogram, in bytes.
const BUCKETS: [usize; 7] = [16, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10];

/// One bucket of the tool-result size histogram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeBucket {
    /// Smallest size in the bucket, in bytes.
    pub min: usize,
    /// First size above the bucket, in bytes; `None` for the last one.
    pub below: Option<usize>,
    pub count: usize,
}

/// What a corpus holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusStats {
    pub sessions: usize,
    /// Sessions of each kind.
    pub kinds: BTreeMap<AgentKind, usize>,
    pub requests: usize,
    pub longest_session_requests: usize,
    pub messages: usize,
    pub tool_results: usize,
    pub smallest_tool_result_bytes: usize,
    pub median_tool_result_bytes: usize,
    pub largest_tool_result_bytes: usize,
    /// Bytes of the session files (compact JSON, each history stored once).
    pub stored_bytes: u64,
    /// Bytes of every request body as a client sends it, without a proxy (each history resent).
    pub request_bytes: u64,
    pub largest_request_bytes: usize,
    pub tool_result_sizes: Vec<SizeBucket>,
}

/// One line of the index per session file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub id: String,
    pub kind: AgentKind,
    pub file: String,
    pub requests: usize,
    pub messages: usize,
    pub bytes: u64,
}

/// Where a corpus comes from, as its index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    /// The generator's seed, for a generated corpus.
    pub seed: Option<u64>,
    /// The generator's longest session in requests, for a generated corpus.
    pub max_turns: Option<usize>,
}

/// The content of `index.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusIndex {
    pub format: u32,
    /// The generator's seed; absent from a corpus that was not generated (recorded traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The generator's `max_turns`; absent from a corpus that was not generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<usize>,
    pub stats: CorpusStats,
    pub files: Vec<IndexEntry>,
}

/// Counts bytes written to it.
#[derive(Default)]
struct Counter(u64);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn stored_size(session: &Session) -> u64 {
    let mut counter = Counter::default();
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, session);
    counter.0
}

/// Statistics of `sessions`.
pub fn stats(sessions: &[Session]) -> CorpusStats {
    let mut sizes: Vec<usize> = sessions
        .iter()
        .flat_map(|s| s.tool_results().map(str::len))
        .collect();
    sizes.sort_unstable();
    let mut buckets: Vec<SizeBucket> = Vec::with_capacity(BUCKETS.len() + 1);
    let mut min = 0;
    for below in BUCKETS.iter().copied().map(Some).chain([None]) {
        let count = sizes
            .iter()
            .filter(|&&n| n >= min && below.is_none_or(|b| n < b))
            .count();
        buckets.push(SizeBucket { min, below, count });
        min = below.unwrap_or(min);
    }
    let mut request_bytes = 0u64;
    let mut largest_request_bytes = 0;
    for s in sessions {
        for n in s.request_sizes() {
            request_bytes += n as u64;
            largest_request_bytes = largest_request_bytes.max(n);
        }
    }
    CorpusStats {
        sessions: sessions.len(),
        kinds: AgentKind::ALL
            .iter()
            .map(|&k| (k, sessions.iter().filter(|s| s.kind == k).count()))
            .collect(),
        requests: sessions.iter().map(Session::request_count).sum(),
        longest_session_requests: sessions
            .iter()
            .map(Session::request_count)
            .max()
            .unwrap_or(0),
        messages: sessions.iter().map(|s| s.messages.len()).sum(),
        tool_results: sizes.len(),
        smallest_tool_result_bytes: sizes.first().copied().unwrap_or(0),
        median_tool_result_bytes: sizes.get(sizes.len() / 2).copied().unwrap_or(0),
        largest_tool_result_bytes: sizes.last().copied().unwrap_or(0),
        stored_bytes: sessions.iter().map(stored_size).sum(),
        request_bytes,
        largest_request_bytes,
        tool_result_sizes: buckets,
    }
}

/// The file name of `session` in a corpus directory.
pub fn file_name(session: &Session) -> String {
    format!("session-{}.json", session.id)
}

/// Writes `sessions` and `index.json` into `dir` (created if missing) and returns the index.
pub fn write_dir(dir: &Path, origin: Origin, sessions: &[Session]) -> io::Result<CorpusIndex> {
    fs::create_dir_all(dir)?;
    let mut files = Vec::with_capacity(sessions.len());
    for s in sessions {
        let mut bytes = serde_json::to_vec(s)?;
        bytes.push(b'\n');
        let file = file_name(s);
        fs::write(dir.join(&file), &bytes)?;
        files.push(IndexEntry {
            id: s.id.clone(),
            kind: s.kind,
            file,
            requests: s.request_count(),
            messages: s.messages.len(),
            bytes: bytes.len() as u64,
        });
    }
    let index = CorpusIndex {
        format: FORMAT_VERSION,
        seed: origin.seed,
        max_turns: origin.max_turns,
        stats: stats(sessions),
        files,
    };
    let mut bytes = serde_json::to_vec_pretty(&index)?;
    bytes.push(b'\n');
    fs::write(dir.join("index.json"), bytes)?;
    Ok(index)
}

fn invalid(path: &Path, detail: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {detail}", path.display()),
    )
}

/// Reads the index of the corpus in `dir`.
pub fn read_index(dir: &Path) -> io::Result<CorpusIndex> {
    let path = dir.join("index.json");
    let index: CorpusIndex =
        serde_json::from_slice(&fs::read(&path)?).map_err(|e| invalid(&path, e))?;
    if index.format != FORMAT_VERSION {
        return Err(invalid(
            &path,
            format_args!("format {} is not {FORMAT_VERSION}", index.format),
        ));
    }
    Ok(index)
}

/// Reads every session listed in `dir/index.json`, in order, and checks each one's invariants.
pub fn load_dir(dir: impl AsRef<Path>) -> io::Result<Vec<Session>> {
    let dir = dir.as_ref();
    let index = read_index(dir)?;
    let mut sessions = Vec::with_capacity(index.files.len());
    for entry in &index.files {
        if entry.file.contains(['/', '\\']) || entry.file.starts_with('.') {
            return Err(invalid(
                &dir.join("index.json"),
                format_args!("bad file name {:?}", entry.file),
            ));
        }
        let path = dir.join(&entry.file);
        let session: Session =
            serde_json::from_slice(&fs::read(&path)?).map_err(|e| invalid(&path, e))?;
        session.validate().map_err(|e| invalid(&path, e))?;
        sessions.push(session);
    }
    Ok(sessions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(id: &str, results: &[&str]) -> Session {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        let mut ends = Vec::new();
        for (i, r) in results.iter().enumerate() {
            ends.push(messages.len());
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{i}"), "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
            messages
                .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": r}));
        }
        ends.push(messages.len());
        messages.push(json!({"role": "assistant", "content": "done"}));
        Session {
            wire: crate::Wire::Chat,
            instructions: None,
            id: id.into(),
            kind: AgentKind::Coding,
            model: "gpt-4o".into(),
            tools: json!([{"type": "function", "function": {"name": "f"}}]),
            stream: false,
            messages,
            request_ends: ends,
            fields: None,
            mark_newest: false,
        }
    }

    #[test]
    fn histogram_counts_every_result_once() {
        let big = "x".repeat(300_000);
        let s = [
            session("a", &["", "ok", &"y".repeat(300), &big]),
            session("b", &[]),
        ];
        let st = stats(&s);
        assert_eq!(st.tool_results, 4);
        assert_eq!(
            st.tool_result_sizes.iter().map(|b| b.count).sum::<usize>(),
            4
        );
        assert_eq!(st.tool_result_sizes[0].count, 2);
        assert_eq!(st.tool_result_sizes.last().unwrap().count, 1);
        assert_eq!(st.largest_tool_result_bytes, 300_000);
        assert_eq!(st.requests, 6);
        assert_eq!(st.kinds[&AgentKind::Coding], 2);
        let bodies: usize = s
            .iter()
            .flat_map(|x| (0..x.request_count()).map(|k| x.request_body(k).len()))
            .sum();
        assert_eq!(st.request_bytes, bodies as u64);
        assert_eq!(
            st.stored_bytes,
            s.iter()
                .map(|x| serde_json::to_vec(x).unwrap().len() as u64)
                .sum::<u64>()
        );
    }

    #[test]
    fn load_rejects_paths_and_broken_sessions() {
        let dir = std::env::temp_dir().join(format!("traffic-corpus-{}", std::process::id()));
        let mut index = write_dir(&dir, Origin::default(), &[session("a", &["ok"])]).unwrap();
        assert_eq!(read_index(&dir).unwrap().seed, None);
        assert_eq!(load_dir(&dir).unwrap().len(), 1);
        fs::write(dir.join("session-a.json"), b"{\"id\":1}").unwrap();
        assert_eq!(
            load_dir(&dir).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        index.files[0].file = "../x.json".into();
        fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
        assert!(load_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("bad file name"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
