//! The `request` line of a session's journal: what the proxy did for one request, left by the
//! record phase of the chat and Responses routes (one phase for both) when `[ui] enabled`,
//! read back by the page (`routes::ui`, which also reads each wire's conversation out of a
//! body for it). Older journals (only `decision` and `stored` lines) stay readable:
//! every field has a default, and a journal without `request` lines shows its other lines.
//!
//! The record phase only builds the line and hands it to the [`JournalWriter`] (a
//! non-blocking `try_send` into a bounded queue, as the traffic recorder's): one task owns the
//! writing. It gathers lines for up to `[ui] journal_flush_ms` and appends each session's
//! lines with one store call ([`Store::append_logs`]), so a request costs the proxy the line,
//! not a store append. The page asks it to write what waits before it reads
//! ([`JournalWriter::flush`]); at shutdown it writes what is queued. A full queue drops the
//! line and counts it (`context_proxy_journal_dropped_total`): the page never slows a request.
//!
//! With `[ui] keep_messages`, the messages the client sent and those the model received (in
//! the wire's shape, read by the route's `Pending::conversation`) are stored as content (kind `messages`, addressed by their hash, so a turn sent twice is kept
//! once) and named in the line's `bodies`; erasing the session erases them
//! ([`crate::sessions::erase`] reads `bodies`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::service::Service;
use crate::store::{ContentKind, SessionId, Store, Tenant};

/// Longest part of a reload call's answer kept in the line, in characters.
pub const RESULT_PREVIEW_CHARS: usize = 2_000;
/// Most reload calls kept in one line (the counts stay exact).
pub const MAX_CALLS_KEPT: usize = 32;

/// One call of the proxy's own tools, as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReloadCall {
    /// The round it was made in, from 1.
    pub round: u32,
    pub tool: String,
    /// Its arguments as the model wrote them (clipped).
    pub arguments: String,
    pub ok: bool,
    /// Lines of stored content the answer held.
    pub lines: usize,
    /// The start of the answer ([`RESULT_PREVIEW_CHARS`]).
    pub result: String,
    /// The answer was longer than `result`.
    pub clipped: bool,
}

/// What one request's record phase knows, as a journal line (`"event": "request"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestLine {
    pub ts: String,
    pub request_id: String,
    pub event: String,
    /// The route: `chat` for `/v1/chat/completions`, `responses` for `/v1/responses`,
    /// `messages` for `/v1/messages`.
    pub route: String,
    pub model: Option<String>,
    pub upstream: String,
    pub status: u16,
    pub mode: String,
    pub stream: bool,
    /// Tokens of the request as the client sent it and as forwarded (the proxy's count).
    pub tokens_before: usize,
    pub tokens_after: usize,
    /// Tokens at the start of the forwarded request the previous one also had.
    pub kept_prefix_tokens: usize,
    /// Whether a message the previous request had sent was rewritten.
    pub rewrote_prefix: bool,
    /// `minified=2,compacted=1`, `none`, or `skipped (why)`.
    pub actions: String,
    /// What a summary did for this request (`hit`, `computed`, `fallback`).
    pub summary: Option<String>,
    /// The upstream's usage, summed over every call the request made.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Milliseconds from the request's arrival: the proxy's own work, the first byte to the
    /// client, the end of the answer.
    pub proxy_ms: Option<f64>,
    pub ttfb_ms: Option<f64>,
    pub latency_ms: Option<f64>,
    pub upstream_calls: u32,
    pub reload_rounds: u32,
    pub reload_calls: u32,
    /// The calls themselves (at most [`MAX_CALLS_KEPT`]).
    pub reloads: Vec<ReloadCall>,
    /// The stored content the forwarded request refers to (its markers' references).
    pub refs: Vec<String>,
    /// The kept messages, when `[ui] keep_messages`.
    pub bodies: Option<Bodies>,
    /// Every upstream call the request made, by kind, with what each sent: the forwarded
    /// request, rounds of the proxy's tools, a retry, the summarizer's calls it waited for
    /// (what the page's cost with the proxy adds up; empty in lines written before it).
    #[serde(skip_serializing_if = "crate::pricing::Bill::is_empty")]
    pub calls: crate::pricing::Bill,
}

/// The references of one request's kept messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bodies {
    /// The `messages` the client sent.
    pub client: Option<String>,
    /// The `messages` of the first upstream call (the client's when nothing changed).
    pub forwarded: Option<String>,
}

impl RequestLine {
    /// The line of a journal record, when it is a `request` line.
    pub fn of(record: &Value) -> Option<RequestLine> {
        if record.get("event")? != "request" {
            return None;
        }
        serde_json::from_value(record.clone()).ok()
    }
}

/// What a finished request leaves for the journal: the line and, when kept, the bodies.
pub struct Pending {
    pub tenant: Tenant,
    pub session: SessionId,
    /// Reads the conversation to keep out of a body, as JSON text (the route knows its
    /// wire's shape: `routes::ui::journal::conversation`).
    pub conversation: fn(&[u8]) -> Option<String>,
    pub line: RequestLine,
    /// The client's body, and the forwarded one when it differs, to keep (`keep_messages`).
    pub client_body: Option<bytes::Bytes>,
    pub forwarded_body: Option<bytes::Bytes>,
}

/// Stores the kept messages of `pending` and names them in its line; the line, as a record.
async fn prepare(store: &dyn Store, mut pending: Pending) -> Option<Value> {
    if let Some(client_body) = &pending.client_body {
        let (tenant, session) = (&pending.tenant, &pending.session);
        let client = keep(store, tenant, session, client_body, pending.conversation).await;
        let forwarded = match &pending.forwarded_body {
            Some(body) => keep(store, tenant, session, body, pending.conversation).await,
            None => client.clone(),
        };
        pending.line.bodies = Some(Bodies { client, forwarded });
    }
    match serde_json::to_value(&pending.line) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the request's journal line");
            None
        }
    }
}

/// The settings of a [`JournalWriter`] (`[ui]`).
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Lines that may wait; more are dropped.
    pub queue: usize,
    /// How long lines are gathered before they are written.
    pub flush: Duration,
    /// Most lines written in one batch.
    pub batch: usize,
}

impl WriterConfig {
    pub fn of(config: &super::UiConfig) -> WriterConfig {
        WriterConfig {
            queue: config.journal_queue,
            flush: Duration::from_millis(config.journal_flush_ms),
            batch: config.journal_batch_lines,
        }
    }
}

enum Msg {
    Line(Box<Pending>),
    /// Answered once every line queued before it is written.
    Flush(oneshot::Sender<()>),
}

/// The one writer of the page's journal lines (see the module docs).
pub struct JournalWriter {
    queue: Mutex<Option<mpsc::Sender<Msg>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Lines dropped or not written, shared with `/metrics`.
    dropped: Arc<AtomicU64>,
    /// Ends the task's wait for more lines (a flush, the stop).
    wake: Arc<tokio::sync::Notify>,
}

impl JournalWriter {
    /// Starts the writing task over `store` (on the current runtime); lines it drops or cannot
    /// write are counted in `dropped`.
    pub fn start(
        store: Arc<dyn Store>,
        config: WriterConfig,
        dropped: Arc<AtomicU64>,
    ) -> Arc<JournalWriter> {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let wake = Arc::new(tokio::sync::Notify::new());
        let span = tracing::info_span!("journal_writer");
        let task = tokio::spawn(tracing::Instrument::instrument(
            write_loop(store, rx, config, dropped.clone(), wake.clone()),
            span,
        ));
        Arc::new(JournalWriter {
            queue: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            dropped,
            wake,
        })
    }

    fn sender(&self) -> Option<mpsc::Sender<Msg>> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .cloned()
    }

    /// Queues `pending` without waiting; when the queue is full or the writer has stopped the
    /// line is dropped and counted.
    pub fn offer(&self, pending: Pending) {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let sent = queue
            .as_ref()
            .is_some_and(|tx| tx.try_send(Msg::Line(Box::new(pending))).is_ok());
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every line queued so far is written (or dropped).
    pub async fn flush(&self) {
        let Some(tx) = self.sender() else { return };
        let (done, wait) = oneshot::channel();
        if tx.send(Msg::Flush(done)).await.is_ok() {
            self.wake.notify_one();
            let _ = wait.await;
        }
    }
}

#[async_trait]
impl Service for JournalWriter {
    fn name(&self) -> &'static str {
        "journal writer"
    }

    /// Closes the queue; the task writes what is queued and ends; waits for it.
    async fn stop(&self) {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.wake.notify_one();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            if task.await.is_err() {
                tracing::warn!("the journal writer's task ended abnormally");
            }
        }
    }
}

/// Gathers lines and writes them; ends when the queue is closed and empty. After the first
/// line of a batch the task sleeps until `config.flush` has passed (or a flush or the stop is
/// asked: `wake`), then takes what queued meanwhile, at most `config.batch` lines: a line
/// offered while it sleeps wakes nothing (waking the task for every line cost the request
/// path as much as writing it). When a batch was full, the next one does not wait.
async fn write_loop(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<Msg>,
    config: WriterConfig,
    dropped: Arc<AtomicU64>,
    wake: Arc<tokio::sync::Notify>,
) {
    let mut batch: Vec<Pending> = Vec::new();
    let mut waiting: Vec<oneshot::Sender<()>> = Vec::new();
    let mut behind = false;
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut slept = behind;
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(pending) => batch.push(*pending),
                Msg::Flush(done) => {
                    waiting.push(done);
                    break;
                }
            }
            if batch.len() >= config.batch {
                break;
            }
            next = match rx.try_recv() {
                Ok(msg) => Some(msg),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) if !slept => {
                    slept = true;
                    let deadline = tokio::time::sleep(config.flush);
                    tokio::select! {
                        () = deadline => {}
                        () = wake.notified() => {}
                    }
                    rx.try_recv().ok()
                }
                Err(mpsc::error::TryRecvError::Empty) => None,
            };
        }
        behind = batch.len() >= config.batch;
        let written = batch.len();
        let failed = write_batch(store.as_ref(), std::mem::take(&mut batch)).await;
        if failed > 0 {
            dropped.fetch_add(failed as u64, Ordering::Relaxed);
        }
        tracing::trace!(written, failed, "journal lines written");
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Writes `batch`: each session's lines, in order, with one store call. Returns how many lines
/// could not be written (each warned).
async fn write_batch(store: &dyn Store, batch: Vec<Pending>) -> usize {
    let mut sessions: Vec<(Tenant, SessionId, Vec<Value>)> = Vec::new();
    let mut index: HashMap<(Tenant, SessionId), usize> = HashMap::new();
    let mut failed = 0;
    let keys: Vec<(Tenant, SessionId)> = batch
        .iter()
        .map(|p| (p.tenant.clone(), p.session.clone()))
        .collect();
    // The kept messages of the whole batch are stored at once (the store bounds how many of
    // its calls run together), then the lines go in their order.
    let records =
        futures_util::future::join_all(batch.into_iter().map(|p| prepare(store, p))).await;
    for (key, record) in keys.into_iter().zip(records) {
        let Some(record) = record else {
            failed += 1;
            continue;
        };
        let i = *index.entry(key).or_insert_with_key(|(t, s)| {
            sessions.push((t.clone(), s.clone(), Vec::new()));
            sessions.len() - 1
        });
        sessions[i].2.push(record);
    }
    for (tenant, session, records) in sessions {
        if let Err(e) = store.append_logs(&tenant, &session, &records).await {
            tracing::warn!(error = %e, lines = records.len(), "cannot append to the session log");
            failed += records.len();
        }
    }
    failed
}

/// Stores the `messages` of `body`; their reference, when stored.
async fn keep(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    body: &bytes::Bytes,
    conversation: fn(&[u8]) -> Option<String>,
) -> Option<String> {
    let text = conversation(body)?;
    match store
        .put_content(tenant, session, ContentKind::Messages, &text)
        .await
    {
        Ok(r) => Some(r.as_str().to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot keep a request's messages for the page");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, StoreConfig, SystemClock};

    fn pending(tenant: &Tenant, session: &SessionId, id: &str, body: Option<&str>) -> Pending {
        Pending {
            tenant: tenant.clone(),
            session: session.clone(),
            conversation: messages,
            line: RequestLine {
                request_id: id.into(),
                event: "request".into(),
                route: "chat".into(),
                ..RequestLine::default()
            },
            client_body: body.map(|b| bytes::Bytes::from(b.to_string())),
            forwarded_body: None,
        }
    }

    /// A chat body's `messages`.
    fn messages(body: &[u8]) -> Option<String> {
        let value: Value = serde_json::from_slice(body).ok()?;
        Some(value.get("messages")?.to_string())
    }

    fn ids(journal: &[Value]) -> Vec<&str> {
        journal
            .iter()
            .map(|r| r["request_id"].as_str().unwrap())
            .collect()
    }

    /// Lines wait in the writer (here for an hour) until the page asks: then every session's
    /// lines are in its journal, in the order they were offered, their kept messages stored.
    #[tokio::test]
    async fn lines_wait_for_a_flush_and_land_in_order_per_session() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
            &StoreConfig::default(),
            Arc::new(SystemClock),
        ));
        let dropped = Arc::new(AtomicU64::new(0));
        let config = WriterConfig {
            queue: 100,
            flush: Duration::from_secs(3600),
            batch: 1_000,
        };
        let writer = JournalWriter::start(store.clone(), config, dropped.clone());
        let t = Tenant::from_api_key(Some("sk-a"));
        let (a, b) = (SessionId::derive(b"a"), SessionId::derive(b"b"));
        let body = r#"{"model":"m","messages":[{"role":"user","content":"<b>hi</b>"}]}"#;
        writer.offer(pending(&t, &a, "a1", Some(body)));
        writer.offer(pending(&t, &b, "b1", None));
        writer.offer(pending(&t, &a, "a2", None));
        tokio::task::yield_now().await;
        assert!(store.read_log(&t, &a).await.unwrap().is_empty());
        writer.flush().await;
        let journal_a = store.read_log(&t, &a).await.unwrap();
        assert_eq!(ids(&journal_a), ["a1", "a2"]);
        assert_eq!(ids(&store.read_log(&t, &b).await.unwrap()), ["b1"]);
        let line = RequestLine::of(&journal_a[0]).unwrap();
        let bodies = line.bodies.unwrap();
        assert_eq!(bodies.client, bodies.forwarded);
        let kept = bodies.client.unwrap().parse().unwrap();
        assert_eq!(
            store.get_content(&t, &kept).await.unwrap().as_deref(),
            Some(r#"[{"role":"user","content":"<b>hi</b>"}]"#)
        );
        assert_eq!(dropped.load(Ordering::Relaxed), 0);
        // Stopping writes what is queued; afterwards a line is dropped and counted.
        writer.offer(pending(&t, &b, "b2", None));
        writer.stop().await;
        assert_eq!(ids(&store.read_log(&t, &b).await.unwrap()), ["b1", "b2"]);
        writer.offer(pending(&t, &b, "b3", None));
        writer.flush().await;
        assert_eq!(dropped.load(Ordering::Relaxed), 1);
        assert_eq!(store.read_log(&t, &b).await.unwrap().len(), 2);
    }

    /// A batch as large as `batch` is written without waiting for the interval.
    #[tokio::test]
    async fn a_full_batch_is_written_without_waiting() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(
            &StoreConfig::default(),
            Arc::new(SystemClock),
        ));
        let config = WriterConfig {
            queue: 100,
            flush: Duration::from_secs(3600),
            batch: 3,
        };
        let writer = JournalWriter::start(store.clone(), config, Arc::default());
        let t = Tenant::from_api_key(None);
        let s = SessionId::derive(b"s");
        for i in 0..3 {
            writer.offer(pending(&t, &s, &format!("r{i}"), None));
        }
        // The writer owes nothing to a flush here: it wrote the full batch on its own.
        let mut journal = Vec::new();
        for _ in 0..1_000 {
            journal = store.read_log(&t, &s).await.unwrap();
            if journal.len() == 3 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(ids(&journal), ["r0", "r1", "r2"]);
        writer.stop().await;
    }
}
