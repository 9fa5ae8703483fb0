//! Recorded traffic: the exchanges a proxy saw, appended one line at a time to JSONL files.
//!
//! A recording directory holds `traffic-<start ms>-<pid>-<part>.jsonl` files (names sort in
//! the order they were written). Each file is a sequence of lines of two kinds:
//!
//! - `{"t":"m","id":ID,"m":MESSAGE}` defines a message once per file;
//! - `{"t":"x",…}` is one [`Exchange`]: its request (and what was forwarded, when it differs)
//!   with `messages` replaced, in place, by the ids of messages defined earlier in the file.
//!
//! A conversation resends its whole history with every request, so storing each message once
//! keeps a long session's recording linear in its length instead of quadratic. Every line is
//! written with one `write` call, after the messages it refers to, so a crash tears at most
//! the last line; [`read`] skips a torn last line. A write that fails part way (a full disk,
//! the file size limit) is cut back off the file, and the messages it defined count as not
//! written: no torn line, no reference to a message the file does not hold.
//!
//! [`hash_content`] replaces text with same-length hashes (structure, roles, tool names and
//! sizes kept) for sharing traffic without its content.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One chat-completions exchange as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Exchange {
    /// When the request arrived, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub request_id: String,
    /// The conversation (`x-context-session`, or derived by the proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The tenant: a hash of the API key, never the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The proxy's route: `messages` (`/v1/messages`), `count_tokens`, `responses`; absent:
    /// chat completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Context management mode of the request.
    pub mode: String,
    /// The request body as received (`null` when it was not JSON).
    pub request: Value,
    /// What was sent upstream, when it differs from `request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Value>,
    /// The response: the JSON body, or the completion assembled from the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Value>,
    pub stream: bool,
    /// The response was larger than the recorder keeps: `response` is absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_truncated: bool,
    pub status: u16,
    /// How the body ended: `complete`, `failed` or `cancelled`.
    pub end: String,
    /// Time to the first response byte and to the end, from the request's arrival.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttfb_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<f64>,
    /// The proxy's count of the request before and after its changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_before: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_after: Option<usize>,
    /// What the proxy did (`x-context-actions`).
    pub actions: String,
    /// Calls the proxy made upstream, and rounds of its own tools, for this request.
    pub upstream_calls: u64,
    pub reload_rounds: u64,
}

impl Exchange {
    /// What the upstream received: `forwarded`, or the request when nothing changed.
    pub fn upstream_body(&self) -> &Value {
        self.forwarded.as_ref().unwrap_or(&self.request)
    }
}

/// Replaces every text of `messages`-like content in `body` (message contents and text parts,
/// tool-call arguments, `choices[].message` of a response) by a same-length hash. Roles,
/// names, ids, tool names and the JSON structure are kept; equal texts get equal hashes, so
/// prefixes shared between requests stay shared.
pub fn hash_content(body: &mut Value) {
    if let Some(Value::Array(messages)) = body.get_mut("messages") {
        messages.iter_mut().for_each(hash_message);
    }
    if let Some(Value::Array(choices)) = body.get_mut("choices") {
        for choice in choices {
            if let Some(message) = choice.get_mut("message") {
                hash_message(message);
            }
        }
    }
}

fn hash_message(message: &mut Value) {
    match message.get_mut("content") {
        Some(Value::String(text)) => *text = same_length_hash(text),
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(Value::String(text)) = part.get_mut("text") {
                    *text = same_length_hash(text);
                }
            }
        }
        _ => {}
    }
    for key in ["refusal", "reasoning_content"] {
        if let Some(Value::String(text)) = message.get_mut(key) {
            *text = same_length_hash(text);
        }
    }
    if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
        for call in calls {
            if let Some(Value::String(args)) = call.pointer_mut("/function/arguments") {
                *args = same_length_hash(args);
            }
        }
    }
}

/// Hex digits of SHA-256 chains, as many as `text` has bytes.
fn same_length_hash(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut digest = Sha256::digest(text.as_bytes());
    while out.len() < text.len() {
        for byte in digest.iter() {
            out.push_str(&format!("{byte:02x}"));
        }
        digest = Sha256::digest(digest);
    }
    out.truncate(text.len());
    out
}

/// The id a message is stored under: 24 hex digits of the SHA-256 of its JSON.
fn message_id(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How a [`Writer`] writes.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub dir: PathBuf,
    /// Replace texts by same-length hashes ([`hash_content`]).
    pub hash_content: bool,
    /// A file larger than this is closed and a new one begun (its messages written again).
    pub max_file_bytes: u64,
}

/// Appends exchanges to the files of a recording directory.
pub struct Writer {
    config: WriterConfig,
    stem: String,
    part: u32,
    file: File,
    path: PathBuf,
    /// The current file's length.
    written: u64,
    /// Messages already defined in the current file.
    seen: HashSet<String>,
}

impl Writer {
    /// Creates `config.dir` if needed and opens a new file in it, named after `started_ms`
    /// (milliseconds since the Unix epoch) and this process.
    pub fn create(config: WriterConfig, started_ms: u64) -> io::Result<Writer> {
        fs::create_dir_all(&config.dir)?;
        let stem = format!("traffic-{started_ms}-{}", std::process::id());
        let path = config.dir.join(format!("{stem}-0000.jsonl"));
        let file = open_append(&path)?;
        let written = file.metadata()?.len();
        Ok(Writer {
            config,
            stem,
            part: 0,
            file,
            path,
            written,
            seen: HashSet::new(),
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `exchange`: the messages this file does not hold yet, then the exchange line,
    /// in one write.
    pub fn append(&mut self, mut exchange: Exchange) -> io::Result<()> {
        if self.config.hash_content {
            hash_content(&mut exchange.request);
            if let Some(f) = &mut exchange.forwarded {
                hash_content(f);
            }
            if let Some(r) = &mut exchange.response {
                hash_content(r);
            }
        }
        let mut buf = Vec::new();
        let mut defined = Vec::new();
        let written = self.write_whole(&mut exchange, &mut buf, &mut defined);
        if written.is_err() {
            // Messages defined by this exchange are not in the file: not seen.
            for id in &defined {
                self.seen.remove(id);
            }
        }
        written?;
        if self.written >= self.config.max_file_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Builds the exchange's lines into `buf` (the ids of the messages it defines in
    /// `defined`) and appends them whole: should the write fail part way (a full disk, a file
    /// size limit), the file is cut back to where it was, so no torn line stays in it.
    fn write_whole(
        &mut self,
        exchange: &mut Exchange,
        buf: &mut Vec<u8>,
        defined: &mut Vec<String>,
    ) -> io::Result<()> {
        exchange.request = self.refer(std::mem::take(&mut exchange.request), buf, defined)?;
        if let Some(f) = exchange.forwarded.take() {
            exchange.forwarded = Some(self.refer(f, buf, defined)?);
        }
        let mut line = serde_json::to_value(&*exchange)?;
        if let Value::Object(map) = &mut line {
            // `t` first, so a reader (or a person) sees the kind of line at once.
            let mut tagged = serde_json::Map::with_capacity(map.len() + 1);
            tagged.insert("t".into(), Value::from("x"));
            tagged.extend(std::mem::take(map));
            *map = tagged;
        }
        serde_json::to_writer(&mut *buf, &line)?;
        buf.push(b'\n');
        if let Err(e) = self.file.write_all(buf) {
            if let Err(cut) = self.file.set_len(self.written) {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e}; the partial line could not be removed: {cut}"),
                ));
            }
            return Err(e);
        }
        self.written += buf.len() as u64;
        Ok(())
    }

    /// `body` with its messages replaced by their ids, defining new ones in `buf`.
    fn refer(
        &mut self,
        mut body: Value,
        buf: &mut Vec<u8>,
        defined: &mut Vec<String>,
    ) -> io::Result<Value> {
        let Some(Value::Array(messages)) = body.get_mut("messages") else {
            return Ok(body);
        };
        for message in messages.iter_mut() {
            let bytes = serde_json::to_vec(message)?;
            let id = message_id(&bytes);
            if self.seen.insert(id.clone()) {
                defined.push(id.clone());
                buf.extend_from_slice(b"{\"t\":\"m\",\"id\":\"");
                buf.extend_from_slice(id.as_bytes());
                buf.extend_from_slice(b"\",\"m\":");
                buf.extend_from_slice(&bytes);
                buf.extend_from_slice(b"}\n");
            }
            *message = Value::String(id);
        }
        Ok(body)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.part += 1;
        self.path = self
            .config
            .dir
            .join(format!("{}-{:04}.jsonl", self.stem, self.part));
        self.file = open_append(&self.path)?;
        self.written = self.file.metadata()?.len();
        self.seen.clear();
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// What [`read`] found.
#[derive(Debug, Default)]
pub struct Recording {
    /// Every exchange, file by file in name order, line by line.
    pub exchanges: Vec<Exchange>,
    /// Lines that could not be read (a torn last line after a crash).
    pub skipped_lines: usize,
}

/// Whether `path` is a recording: a `.jsonl` file with recorder lines, or a directory of them.
pub fn is_recording(path: &Path) -> bool {
    recording_files(path).is_ok_and(|files| {
        files.first().is_some_and(|f| {
            File::open(f).is_ok_and(|file| {
                let mut line = String::new();
                BufReader::new(file).read_line(&mut line).is_ok()
                    && (line.starts_with("{\"t\":\"m\"") || line.starts_with("{\"t\":\"x\""))
            })
        })
    })
}

/// The recording files at `path`: the file itself, or a directory's `traffic-*.jsonl`. Only
/// regular files: reading a FIFO or a device would wait for a writer that may never come.
fn recording_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension().is_some_and(|e| e == "jsonl")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("traffic-"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Most bytes [`read`] lets the requests of a recording grow to once every message reference
/// is put back (each counted as the line that defined its message plus
/// [`REFERENCE_OVERHEAD`]). Each message is stored once per file but every request resends its
/// history, so a small file can stand for far more (a hostile 1.1 MB one for 5.9 GB).
pub const MAX_EXPANDED_BYTES: u64 = 512 << 20;

/// What one message put back costs beyond its text, about (a JSON value's own size).
pub const REFERENCE_OVERHEAD: u64 = 128;

/// Reads a recording (a file or a directory of files), putting every message back; refuses
/// (`InvalidData`) one whose requests would take more than [`MAX_EXPANDED_BYTES`].
pub fn read(path: &Path) -> io::Result<Recording> {
    read_within(path, MAX_EXPANDED_BYTES)
}

/// [`read`] with another bound on the bytes of the requests once expanded.
pub fn read_within(path: &Path, max_expanded_bytes: u64) -> io::Result<Recording> {
    let mut recording = Recording::default();
    let mut expanded: u64 = 0;
    for file in recording_files(path)? {
        // Each message with the length of the line that defined it (what a reference to it
        // costs once put back, about).
        let mut messages: HashMap<String, (Value, u64)> = HashMap::new();
        for line in BufReader::new(File::open(&file)?).lines() {
            let line = line?;
            let Ok(mut value) = serde_json::from_str::<Value>(&line) else {
                recording.skipped_lines += 1;
                continue;
            };
            match value.get("t").and_then(Value::as_str) {
                Some("m") => {
                    if let (Some(Value::String(id)), Some(m)) =
                        (value.get("id").cloned(), value.get_mut("m"))
                    {
                        messages.insert(id, (m.take(), line.len() as u64));
                    }
                }
                Some("x") => {
                    let Ok(mut exchange) = serde_json::from_value::<Exchange>(value) else {
                        recording.skipped_lines += 1;
                        continue;
                    };
                    expanded = expanded
                        .saturating_add(line.len() as u64)
                        .saturating_add(references(&exchange.request, &messages))
                        .saturating_add(
                            exchange
                                .forwarded
                                .as_ref()
                                .map_or(0, |f| references(f, &messages)),
                        );
                    if expanded > max_expanded_bytes {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: the recording's requests take more than {} MiB once their \
                                 message references are put back: replay part of it (fewer \
                                 files, or a file cut at a line)",
                                file.display(),
                                max_expanded_bytes >> 20
                            ),
                        ));
                    }
                    resolve(&mut exchange.request, &messages);
                    if let Some(f) = &mut exchange.forwarded {
                        resolve(f, &messages);
                    }
                    recording.exchanges.push(exchange);
                }
                _ => recording.skipped_lines += 1,
            }
        }
    }
    Ok(recording)
}

/// The bytes the message references of `body` stand for.
fn references(body: &Value, messages: &HashMap<String, (Value, u64)>) -> u64 {
    let Some(Value::Array(list)) = body.get("messages") else {
        return 0;
    };
    list.iter()
        .filter_map(|m| messages.get(m.as_str()?))
        .fold(0u64, |sum, (_, len)| {
            sum.saturating_add(*len).saturating_add(REFERENCE_OVERHEAD)
        })
}

fn resolve(body: &mut Value, messages: &HashMap<String, (Value, u64)>) {
    if let Some(Value::Array(list)) = body.get_mut("messages") {
        for m in list.iter_mut() {
            if let Some((found, _)) = m.as_str().and_then(|id| messages.get(id)) {
                *m = found.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exchange(n: usize) -> Exchange {
        let messages: Vec<Value> = (0..n)
            .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("secret words {i}")}))
            .collect();
        Exchange {
            session: Some("s1".into()),
            request: json!({"model": "m", "messages": messages, "temperature": 0}),
            response: Some(
                json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "secret reply"}}]}),
            ),
            status: 200,
            end: "complete".into(),
            ..Exchange::default()
        }
    }

    fn writer(dir: &Path, hash: bool, max: u64) -> Writer {
        Writer::create(
            WriterConfig {
                dir: dir.to_path_buf(),
                hash_content: hash,
                max_file_bytes: max,
            },
            1,
        )
        .unwrap()
    }

    #[test]
    fn round_trip_stores_each_message_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), false, u64::MAX);
        let mut sent = Vec::new();
        for n in 1..=40 {
            let mut x = exchange(n);
            if n % 3 == 0 {
                let mut f = x.request.clone();
                f["messages"][0]["content"] = json!("compacted");
                x.forwarded = Some(f);
            }
            sent.push(x.clone());
            w.append(x).unwrap();
        }
        assert!(is_recording(dir.path()));
        let read = read(dir.path()).unwrap();
        assert_eq!(read.skipped_lines, 0);
        assert_eq!(read.exchanges, sent);
        // 40 distinct messages + one compacted version + 40 exchange lines: linear.
        let text = fs::read_to_string(w.path()).unwrap();
        assert_eq!(text.lines().count(), 40 + 1 + 40);
        assert_eq!(text.matches("secret words 0\"").count(), 1);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_rotation_keeps_files_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), false, 600);
        for n in 1..=10 {
            w.append(exchange(n)).unwrap();
        }
        let path = w.path().to_path_buf();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"t\":\"x\",\"at_ms\":12,\"requ").unwrap();
        let read = read(dir.path()).unwrap();
        assert!(fs::read_dir(dir.path()).unwrap().count() > 1);
        assert_eq!(read.skipped_lines, 1);
        assert_eq!(read.exchanges.len(), 10);
        assert_eq!(read.exchanges[9], exchange(10));
    }

    #[test]
    fn hashed_recordings_keep_shape_and_sizes_but_no_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = writer(dir.path(), true, u64::MAX);
        let mut x = exchange(3);
        x.request["messages"][1] = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"secret.rs\"}"}}]});
        w.append(x.clone()).unwrap();
        let text = fs::read_to_string(w.path()).unwrap();
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("read_file"));
        let got = &read(dir.path()).unwrap().exchanges[0];
        let m = &got.request["messages"];
        assert_eq!(m[0]["role"], "user");
        assert_eq!(
            m[0]["content"].as_str().unwrap().len(),
            "secret words 0".len()
        );
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
                .len(),
            "{\"path\":\"secret.rs\"}".len()
        );
        assert_eq!(
            got.response.as_ref().unwrap()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .len(),
            "secret reply".len()
        );
    }
}
