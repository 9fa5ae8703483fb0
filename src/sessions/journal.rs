//! The `request` line of a session's journal: what the proxy did for one request, left by the
//! record phase of the chat and Responses routes (one phase for both) when `[ui] enabled`,
//! read back by the page (`routes::ui`, which also reads each wire's conversation out of a
//! body for it). Older journals (only `decision` and `stored` lines) stay readable:
//! every field has a default, and a journal without `request` lines shows its other lines.
//!
//! The record phase only builds the line and hands it to the [`JournalWriter`] with the
//! request's bodies as they are (shared bytes, not copies): a non-blocking `try_send` into a
//! bounded queue, as the traffic recorder's. One task owns everything else. It gathers lines
//! for up to `[ui] journal_flush_ms` and then, per session: stores the batch's kept messages
//! with one store call ([`Store::put_contents`]), appends its lines with another
//! ([`Store::append_logs`], each line serialized once, here: the store is handed its bytes),
//! and adds them to the session's [`Summary`] (a state record,
//! compare-and-set), which is what the session list reads. So a request costs the proxy the
//! line, not a parse or a store call. The page asks the writer to write what waits before it
//! reads ([`JournalWriter::flush`]); at shutdown it writes what is queued. A full queue drops
//! the line and counts it (`context_proxy_journal_dropped_total`): the page never slows a
//! request.
//!
//! With `[ui] keep_messages`, the messages the client sent and those the model received (the
//! wire's list, cut out of the body by the route's `Pending::conversation`, in the writer) are
//! stored as content (kind `messages`, addressed by their hash: a body sent twice, or
//! forwarded as sent, is read and kept once) and named in the line's `bodies`; erasing the
//! session erases them ([`crate::sessions::erase`] reads `bodies`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use serde_json::Value;

pub use super::line::*;
use super::view::{Pricing, Summary, SUMMARY_KEY};
use crate::service::Service;
use crate::store::{
    Appended, ContentKind, LogLine, SessionId, StateKey, Store, StoreError, Tenant,
};

/// What a finished request leaves for the journal: the line and, when kept, the bodies.
pub struct Pending {
    pub tenant: Tenant,
    pub session: SessionId,
    /// Reads the conversation to keep out of a body, as JSON text (the route knows its
    /// wire's shape: `routes::ui::journal::conversation`).
    pub conversation: fn(&[u8]) -> Option<String>,
    pub line: RequestLine,
    /// When the line was written (the record phase's clock): a session erased since drops it.
    pub at: std::time::SystemTime,
    /// The client's request as prefix parts: the writer counts the prefix it shares with the
    /// previous request of its session into the line (`client_shared_tokens`).
    pub client_parts: Option<crate::tokens::Parts>,
    /// The client's body, to keep (`keep_messages`).
    pub client_body: Option<bytes::Bytes>,
    /// The body forwarded, when the proxy sent other bytes than the client's (`None`: it sent
    /// the client's): counted by the writer with `recount`, and kept with the client's.
    pub forwarded_body: Option<bytes::Bytes>,
    /// How the writer counts `forwarded_body` (given with it).
    pub recount: Option<Recount>,
}

/// How the journal writer counts a forwarded body as the upstream bills it, off the request
/// path: the request's counter, and its wire's count of a body as prefix parts.
pub struct Recount {
    pub counter: crate::tokens::Counter,
    /// The route's (`routes::ui::journal::sent`).
    pub sent: fn(&crate::tokens::Counter, &[u8]) -> Option<Sent>,
}

/// A request as sent upstream: its prefix parts and its tokens (`total`, the parts' and
/// what is in none, the reply priming).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub parts: crate::tokens::Parts,
    pub total: usize,
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
    /// The caching terms the sessions' summaries are priced with (the page's too).
    pricing: Arc<Pricing>,
    queue: Mutex<Option<mpsc::Sender<Msg>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Lines dropped or not written, shared with `/metrics`.
    dropped: Arc<AtomicU64>,
    /// Ends the task's wait for more lines (a flush, the stop).
    wake: Arc<tokio::sync::Notify>,
}

impl JournalWriter {
    /// Starts the writing task over `store` (on the current runtime); lines it drops or cannot
    /// write are counted in `dropped`; `pricing` prices the sessions' summaries.
    pub fn start(
        store: Arc<dyn Store>,
        config: WriterConfig,
        dropped: Arc<AtomicU64>,
        pricing: Arc<Pricing>,
    ) -> Arc<JournalWriter> {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let wake = Arc::new(tokio::sync::Notify::new());
        let span = tracing::info_span!("journal_writer");
        let writer = Writer {
            store,
            pricing: pricing.clone(),
        };
        let task = tokio::spawn(tracing::Instrument::instrument(
            write_loop(writer, rx, config, dropped.clone(), wake.clone()),
            span,
        ));
        Arc::new(JournalWriter {
            pricing,
            queue: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            dropped,
            wake,
        })
    }

    /// The caching terms of a request, from its upstream's name and its model.
    pub fn pricing(&self) -> &Pricing {
        self.pricing.as_ref()
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
    writer: Writer,
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
        let failed = writer.write(std::mem::take(&mut batch)).await;
        if failed > 0 {
            dropped.fetch_add(failed as u64, Ordering::Relaxed);
        }
        tracing::trace!(written, failed, "journal lines written");
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

/// What the writing task writes with.
struct Writer {
    store: Arc<dyn Store>,
    pricing: Arc<Pricing>,
}

impl Writer {
    /// Writes `batch`: each session's kept messages with one store call, its lines, in order,
    /// with another (refused, for the lines of before, when the session was erased since),
    /// then its summary. Returns how many lines could not be written (each warned).
    async fn write(&self, batch: Vec<Pending>) -> usize {
        let mut sessions: Vec<Vec<Pending>> = Vec::new();
        let mut index: HashMap<(Tenant, SessionId), usize> = HashMap::new();
        for pending in batch {
            let key = (pending.tenant.clone(), pending.session.clone());
            let i = *index.entry(key).or_insert_with(|| {
                sessions.push(Vec::new());
                sessions.len() - 1
            });
            sessions[i].push(pending);
        }
        let mut failed = 0;
        for mut lines in sessions {
            let (tenant, session) = (lines[0].tenant.clone(), lines[0].session.clone());
            self.keep_messages(&tenant, &session, &mut lines).await;
            let kept = match self.kept_summary(&tenant, &session).await {
                Ok(kept) => kept,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the session's summary for the page");
                    None
                }
            };
            let previous = kept
                .as_ref()
                .and_then(|(_, s)| s.as_ref())
                .map(Previous::of)
                .unwrap_or_default();
            let last = shared_prefixes(&mut lines, previous);
            let (written, end) = match self.append(&tenant, &session, lines).await {
                Ok(done) => done,
                Err(count) => {
                    failed += count;
                    continue;
                }
            };
            if written.is_empty() {
                continue;
            }
            let summary = Added {
                lines: &written,
                end,
                last,
            };
            if let Err(e) = self.summarize(&tenant, &session, &summary, kept).await {
                tracing::warn!(error = %e, "cannot keep the session's summary for the page");
            }
        }
        failed
    }

    /// Appends one session's `lines`, each serialized once (the store is handed the bytes),
    /// unless the session was erased after they were written: those of before the erasure
    /// are dropped. The lines written, and the journal's records after them; `Err` how many
    /// could not be written (warned).
    async fn append(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        mut lines: Vec<Pending>,
    ) -> Result<(Vec<RequestLine>, usize), usize> {
        let mut failed = 0;
        let mut records: Vec<(LogLine, Pending)> = Vec::with_capacity(lines.len());
        for pending in lines.drain(..) {
            match LogLine::of(&pending.line) {
                Ok(line) => records.push((line, pending)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the request's journal line");
                    failed += 1;
                }
            }
        }
        // At most twice: a refusal names the erasure, and the lines of after it go again.
        for _ in 0..2 {
            let since = records.iter().map(|(_, p)| p.at).min();
            let Some(since) = since else { break };
            let count = records.len();
            let batch = records.iter().map(|(l, _)| l.clone()).collect();
            match self
                .store
                .append_logs(tenant, session, batch, Some(since))
                .await
            {
                Ok(Appended::Records(end)) => {
                    let written = records.into_iter().map(|(_, p)| p.line).collect();
                    return Ok((written, end));
                }
                Ok(Appended::Erased(at)) => {
                    records.retain(|(_, p)| p.at > at);
                    tracing::debug!(
                        dropped = count - records.len(),
                        "the session was erased after these journal lines were written"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, lines = count, "cannot append to the session log");
                    return Err(failed + count);
                }
            }
        }
        if failed > 0 {
            return Err(failed);
        }
        Ok((Vec::new(), 0))
    }

    /// The session's summary as stored (its bytes, for the compare-and-set) and as read
    /// (`None` when it cannot be read); `None` when there is none.
    async fn kept_summary(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Option<(Vec<u8>, Option<Summary>)>, StoreError> {
        let old = self
            .store
            .get_state(tenant, session, &summary_key()?)
            .await?;
        Ok(old.map(|bytes| {
            let summary = serde_json::from_slice::<Summary>(&bytes).ok();
            (bytes, summary)
        }))
    }

    /// Stores the kept messages of one session's `lines` with one store call and names them in
    /// each line: each body read once (a body sent again, or forwarded as sent, is one item).
    async fn keep_messages(&self, tenant: &Tenant, session: &SessionId, lines: &mut [Pending]) {
        // Each distinct body (by route and bytes) with its text's index, and the texts to
        // store, in order.
        let mut bodies: Vec<(&bytes::Bytes, Option<usize>)> = Vec::new();
        let mut seen: HashMap<(&str, u64), Vec<usize>> = HashMap::new();
        let mut texts: Vec<String> = Vec::new();
        // Per line: the body index of the client's and of the forwarded messages.
        let mut slots: Vec<(Option<usize>, Option<usize>)> = Vec::with_capacity(lines.len());
        for pending in lines.iter() {
            if pending.client_body.is_none() {
                slots.push((None, None));
                continue;
            }
            let route = pending.line.route.as_str();
            let mut ids = [None, None];
            let both = [
                pending.client_body.as_ref(),
                pending.forwarded_body.as_ref(),
            ];
            for (id, body) in ids.iter_mut().zip(both) {
                let Some(body) = body else { continue };
                let hash = xxhash_rust::xxh3::xxh3_64(body);
                let same = seen.entry((route, hash)).or_default();
                if let Some(&i) = same.iter().find(|&&i| *bodies[i].0 == *body) {
                    *id = Some(i);
                    continue;
                }
                let text = (pending.conversation)(body).map(|text| {
                    texts.push(text);
                    texts.len() - 1
                });
                bodies.push((body, text));
                same.push(bodies.len() - 1);
                *id = Some(bodies.len() - 1);
            }
            // No forwarded body: the model received what the client sent.
            let forwarded = match pending.forwarded_body {
                Some(_) => ids[1],
                None => ids[0],
            };
            slots.push((ids[0], forwarded));
        }
        if texts.is_empty() {
            return;
        }
        let refs = match self
            .store
            .put_contents(tenant, session, ContentKind::Messages, texts)
            .await
        {
            Ok(refs) => refs,
            Err(e) => {
                tracing::warn!(error = %e, "cannot keep the requests' messages for the page");
                return;
            }
        };
        let reference = |slot: Option<usize>| {
            let text = bodies[slot?].1?;
            Some(refs.get(text)?.as_str().to_string())
        };
        let named: Vec<Option<Bodies>> = slots
            .iter()
            .map(|&(client, forwarded)| {
                client.map(|_| Bodies {
                    client: reference(client),
                    forwarded: reference(forwarded),
                })
            })
            .collect();
        for (pending, bodies) in lines.iter_mut().zip(named) {
            if bodies.is_some() {
                pending.line.bodies = bodies;
            }
        }
    }

    /// Adds `added`, just appended, to the session's summary ([`SUMMARY_KEY`]) by
    /// compare-and-set (replicas sharing a store add theirs in turn), starting from `kept`
    /// (the record as read before the append). Idempotent by the journal's numbering: the
    /// summary says how many records it sums; lines below that are in already (a replica
    /// that built the summary from the journal counted them), records between it and these
    /// lines (another replica's, not yet added) are read from the journal. A session without
    /// a summary, or with one older than the numbering, has it built from its whole journal.
    async fn summarize(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        added: &Added<'_>,
        mut kept: Option<(Vec<u8>, Option<Summary>)>,
    ) -> Result<(), StoreError> {
        let key = summary_key()?;
        let pricing = self.pricing.as_ref();
        let start = added.end - added.lines.len();
        for attempt in 0..SUMMARY_TRIES {
            if attempt > 0 {
                kept = self.kept_summary(tenant, session).await?;
            }
            let (old, summary) = match kept.take() {
                Some((bytes, summary)) => (Some(bytes), summary),
                None => (None, None),
            };
            let summary = match summary {
                Some(mut summary) if summary.records.is_some() => {
                    let covered = summary.records.unwrap_or(0);
                    if covered >= added.end {
                        return Ok(());
                    }
                    if covered < start {
                        // Another replica's records between: read them, and these, back.
                        read_records(
                            self.store.as_ref(),
                            tenant,
                            session,
                            covered,
                            added.end,
                            |i, r| {
                                summary.read(i, r, pricing);
                            },
                        )
                        .await?;
                    } else {
                        for line in &added.lines[covered - start..] {
                            summary.add(line, pricing);
                        }
                    }
                    summary.records = Some(added.end);
                    summary
                }
                // None yet, or one this version cannot number: the journal says it all.
                _ => {
                    let mut summary =
                        summary_of_journal(self.store.as_ref(), tenant, session, pricing).await?;
                    summary.records = Some(summary.records.unwrap_or(0).max(added.end));
                    summary
                }
            };
            let mut summary = summary;
            // The next request is counted against these lines' last, when it is the newest.
            let last = match summary.records == Some(added.end) {
                true => added.last.clone(),
                false => Previous::default(),
            };
            summary.previous_parts = last.client.unwrap_or_default();
            summary.previous_sent = last.sent.unwrap_or_default();
            let new = serde_json::to_vec(&summary)
                .map_err(|e| StoreError::Internal(format!("cannot write a summary: {e}")))?;
            if self
                .store
                .compare_and_set_state(tenant, session, &key, old.as_deref(), &new)
                .await?
            {
                return Ok(());
            }
        }
        Err(StoreError::Internal(format!(
            "the summary changed under the writer {SUMMARY_TRIES} times in a row"
        )))
    }
}

/// What one batch added to a session's journal.
struct Added<'a> {
    lines: &'a [RequestLine],
    /// The journal's records after them: they are its records `end - lines.len()..end`.
    end: usize,
    /// The prefix parts of the last of them.
    last: Previous,
}

/// The prefix parts of a session's last request, as its client sent it and as the upstream
/// received it, when known: what the next request's shared prefixes are counted against.
#[derive(Debug, Clone, Default)]
struct Previous {
    client: Option<Vec<u64>>,
    sent: Option<Vec<u64>>,
}

impl Previous {
    /// What a session's summary kept.
    fn of(summary: &Summary) -> Previous {
        let known = |parts: &Vec<u64>| (!parts.is_empty()).then(|| parts.clone());
        Previous {
            client: known(&summary.previous_parts),
            sent: known(&summary.previous_sent),
        }
    }
}

/// The key of a session's summary.
fn summary_key() -> Result<StateKey, StoreError> {
    StateKey::parse(SUMMARY_KEY).map_err(|e| StoreError::Internal(e.to_string()))
}

/// Counts into each of `lines` the prefix its client's request shares with the previous one
/// of the session (the line before it, or `previous`: the parts the summary kept), as the
/// replay's report counts it; and the forwarded request as the upstream received it (its
/// body counted again when the proxy changed it, [`Recount`]), sharing a prefix with the
/// previous request as forwarded, into the line's bill
/// ([`crate::pricing::Bill::recount_forwarded`]): the replay's computation of every call,
/// [`crate::tokens::shared_prefix`] over [`crate::tokens::Parts`]. The parts of the last.
fn shared_prefixes(lines: &mut [Pending], mut previous: Previous) -> Previous {
    for pending in lines.iter_mut() {
        let client = pending.client_parts.take();
        let sent = match (&pending.forwarded_body, &pending.recount) {
            (Some(body), Some(recount)) => (recount.sent)(&recount.counter, body),
            (Some(_), None) => None,
            // The client's bytes went out: they are what the upstream received.
            (None, _) => client.as_ref().map(|parts| Sent {
                parts: parts.clone(),
                total: pending.line.tokens_before,
            }),
        };
        if let (Some(before), Some(parts)) = (&previous.client, &client) {
            let shared = crate::tokens::shared_prefix(Some(before), &parts.ids, &parts.tokens);
            pending.line.client_shared_tokens = Some(shared.tokens);
        }
        previous.client = client.map(|parts| parts.ids);
        previous.sent = sent.map(|sent| {
            let parts = sent.parts;
            let shared =
                crate::tokens::shared_prefix(previous.sent.as_deref(), &parts.ids, &parts.tokens);
            let outside = sent.total.saturating_sub(parts.tokens.iter().sum());
            pending
                .line
                .calls
                .recount_forwarded(sent.total, shared.tokens, outside);
            parts.ids
        });
    }
    previous
}

/// Hands the records `from..to` of a session's journal to `read` with their index, oldest
/// first, [`READ_CHUNK`] at a time.
async fn read_records(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    from: usize,
    to: usize,
    mut read: impl FnMut(usize, &Value),
) -> Result<(), StoreError> {
    let mut next = from;
    while next < to {
        let end = (next + READ_CHUNK).min(to);
        let page = store
            .read_log_page(tenant, session, Some(end), end - next)
            .await?;
        for (n, record) in page.records.iter().enumerate() {
            read(page.first_index + n, record);
        }
        next = end;
    }
    Ok(())
}

/// How many times the writer tries to add a batch to a session's summary when another writer
/// changed it meanwhile.
const SUMMARY_TRIES: usize = 5;
/// Journal records read at a time when a whole journal is summed.
pub const READ_CHUNK: usize = 1_000;

/// Hands every record of a session's journal to `read` with its index, oldest first, holding
/// [`READ_CHUNK`] records at a time; how many there were.
pub async fn read_journal(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    mut read: impl FnMut(usize, &Value),
) -> Result<usize, StoreError> {
    let mut end = READ_CHUNK;
    loop {
        let page = store
            .read_log_page(tenant, session, Some(end), READ_CHUNK)
            .await?;
        for (n, record) in page.records.iter().enumerate() {
            read(page.first_index + n, record);
        }
        if end >= page.total {
            return Ok(page.total);
        }
        end += READ_CHUNK;
    }
}

/// The summary of a session's whole journal.
pub async fn summary_of_journal(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    pricing: &Pricing,
) -> Result<Summary, StoreError> {
    let mut summary = Summary::default();
    read_journal(store, tenant, session, |i, record| {
        summary.read(i, record, pricing);
    })
    .await?;
    Ok(summary)
}

/// The summary of a session, as the session list shows it: the one the writer keeps, else
/// (a journal older than summaries, or written without the page) read from the journal.
pub async fn summary(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    pricing: &Pricing,
) -> Result<Summary, StoreError> {
    if let Some(bytes) = store.get_state(tenant, session, &summary_key()?).await? {
        if let Ok(summary) = serde_json::from_slice::<Summary>(&bytes) {
            return Ok(summary);
        }
    }
    summary_of_journal(store, tenant, session, pricing).await
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
            at: std::time::SystemTime::now(),
            client_parts: None,
            client_body: body.map(|b| bytes::Bytes::from(b.to_string())),
            forwarded_body: None,
            recount: None,
        }
    }

    /// A chat body's `messages`.
    fn messages(body: &[u8]) -> Option<String> {
        let value: Value = serde_json::from_slice(body).ok()?;
        Some(value.get("messages")?.to_string())
    }

    /// Caching terms under which every input token costs one.
    fn free() -> Arc<Pricing> {
        Arc::new(|_: &str, _: Option<&str>| crate::pricing::CachePricing {
            cached_read_rate: 1.0,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        })
    }

    fn ids(journal: &[Value]) -> Vec<&str> {
        journal
            .iter()
            .map(|r| r["request_id"].as_str().unwrap())
            .collect()
    }

    fn memory() -> Arc<dyn Store> {
        Arc::new(MemoryStore::new(
            &StoreConfig::default(),
            Arc::new(SystemClock),
        ))
    }

    /// A writer over `store` whose lines wait an hour (until a flush), at most `batch` at a
    /// time, and the count of the lines it drops.
    fn writer(store: &Arc<dyn Store>, batch: usize) -> (Arc<JournalWriter>, Arc<AtomicU64>) {
        let dropped = Arc::new(AtomicU64::new(0));
        let config = WriterConfig {
            queue: 100,
            flush: Duration::from_secs(3600),
            batch,
        };
        let writer = JournalWriter::start(store.clone(), config, dropped.clone(), free());
        (writer, dropped)
    }

    /// Lines wait in the writer (here for an hour) until the page asks: then every session's
    /// lines are in its journal, in the order they were offered, their kept messages stored.
    #[tokio::test]
    async fn lines_wait_for_a_flush_and_land_in_order_per_session() {
        let store = memory();
        let (writer, dropped) = writer(&store, 1_000);
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

    /// The writer keeps each session's summary as its whole journal says it: started from the
    /// journal for a session whose lines were written before (none yet), then added to batch
    /// by batch. A body sent twice, or forwarded as sent, is read and kept once.
    #[tokio::test]
    async fn the_summary_follows_the_journal_and_a_body_is_kept_once() {
        let store = memory();
        let (writer, _) = writer(&store, 1_000);
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        let earlier = serde_json::json!({"event": "request", "ts": "2026-01-01T00:00:00.000Z",
            "tokens_before": 1000, "tokens_after": 1000, "upstream": "u", "model": "gpt-4o"});
        store.append_log(&t, &s, &earlier).await.unwrap();
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
        let turn = |id: &str, before: usize, after: usize| {
            let mut p = pending(&t, &s, id, Some(body));
            p.line.ts = format!("2026-01-01T00:00:0{}.000Z", before / 1000);
            p.line.tokens_before = before;
            p.line.tokens_after = after;
            p.line.kept_prefix_tokens = after / 2;
            p.line.upstream = "u".into();
            p.line.model = Some("gpt-4o".into());
            p
        };
        let mut forwarded_as_sent = turn("r1", 2000, 1500);
        forwarded_as_sent.forwarded_body = Some(bytes::Bytes::from(body.to_string()));
        writer.offer(forwarded_as_sent);
        writer.offer(turn("r2", 3000, 1600));
        writer.flush().await;
        let key = StateKey::parse(SUMMARY_KEY).unwrap();
        let kept = |bytes: Option<Vec<u8>>| serde_json::from_slice::<Summary>(&bytes.unwrap());
        let pricing = free();
        let whole = summary_of_journal(store.as_ref(), &t, &s, pricing.as_ref())
            .await
            .unwrap();
        assert_eq!(whole.totals.turns, 3);
        assert_eq!(whole.totals.tokens_before, 6000);
        assert_eq!(
            kept(store.get_state(&t, &s, &key).await.unwrap()).unwrap(),
            whole
        );
        let journal = store.read_log(&t, &s).await.unwrap();
        let named: Vec<Bodies> = journal[1..]
            .iter()
            .map(|r| RequestLine::of(r).unwrap().bodies.unwrap())
            .collect();
        assert!(named
            .iter()
            .all(|b| b.client.is_some() && b.client == b.forwarded));
        assert_eq!(named[0], named[1]);
        // The next batch is added to the summary kept.
        writer.offer(turn("r3", 4000, 1700));
        writer.flush().await;
        let whole = summary_of_journal(store.as_ref(), &t, &s, pricing.as_ref())
            .await
            .unwrap();
        assert_eq!(whole.totals.turns, 4);
        assert_eq!(
            whole.totals.last_at.as_deref(),
            Some("2026-01-01T00:00:04.000Z")
        );
        assert_eq!(
            kept(store.get_state(&t, &s, &key).await.unwrap()).unwrap(),
            whole
        );
        assert_eq!(
            summary(store.as_ref(), &t, &s, pricing.as_ref())
                .await
                .unwrap(),
            whole
        );
        // What the list reads is the record, not the journal.
        let mut told = whole.clone();
        told.totals.turns = 999;
        let told = serde_json::to_vec(&told).unwrap();
        store.put_state(&t, &s, &key, &told).await.unwrap();
        let read = summary(store.as_ref(), &t, &s, pricing.as_ref()).await;
        assert_eq!(read.unwrap().totals.turns, 999);
        writer.stop().await;
    }

    /// A batch as large as `batch` is written without waiting for the interval.
    #[tokio::test]
    async fn a_full_batch_is_written_without_waiting() {
        let store = memory();
        let (writer, _) = writer(&store, 3);
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

    /// Two replicas' writers (one store) each append a line of a new session before either
    /// has its summary: both build it from the journal, which holds both lines; the one whose
    /// compare-and-set loses finds its line numbered in the other's summary and adds nothing.
    /// The summary counts each line once.
    #[tokio::test]
    async fn two_writers_building_the_first_summary_count_a_line_once() {
        let store = memory();
        let (a, b) = (
            Writer {
                store: store.clone(),
                pricing: free(),
            },
            Writer {
                store: store.clone(),
                pricing: free(),
            },
        );
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        let (kept_a, kept_b) = (
            a.kept_summary(&t, &s).await.unwrap(),
            b.kept_summary(&t, &s).await.unwrap(),
        );
        assert!(kept_a.is_none() && kept_b.is_none());
        let (lines_a, end_a) = a
            .append(&t, &s, vec![pending(&t, &s, "a1", None)])
            .await
            .unwrap();
        let (lines_b, end_b) = b
            .append(&t, &s, vec![pending(&t, &s, "b1", None)])
            .await
            .unwrap();
        assert_eq!((end_a, end_b), (1, 2));
        let added_a = Added {
            lines: &lines_a,
            end: end_a,
            last: Previous::default(),
        };
        let added_b = Added {
            lines: &lines_b,
            end: end_b,
            last: Previous::default(),
        };
        b.summarize(&t, &s, &added_b, kept_b).await.unwrap();
        a.summarize(&t, &s, &added_a, kept_a).await.unwrap();
        let kept = summary(store.as_ref(), &t, &s, free().as_ref())
            .await
            .unwrap();
        assert_eq!(kept.totals.turns, 2);
        assert_eq!(kept.records, Some(2));
        // A third line, added by the writer that lost, goes on from the numbering.
        let kept_a = a.kept_summary(&t, &s).await.unwrap();
        let (lines, end) = a
            .append(&t, &s, vec![pending(&t, &s, "a2", None)])
            .await
            .unwrap();
        let added = Added {
            lines: &lines,
            end,
            last: Previous::default(),
        };
        a.summarize(&t, &s, &added, kept_a).await.unwrap();
        let kept = summary(store.as_ref(), &t, &s, free().as_ref())
            .await
            .unwrap();
        assert_eq!(kept.totals.turns, 3);
        let whole = summary_of_journal(store.as_ref(), &t, &s, free().as_ref()).await;
        assert_eq!(kept.totals, whole.unwrap().totals);
    }

    /// A line another replica's writer added between the summary and this writer's lines is
    /// read from the journal, in its place.
    #[tokio::test]
    async fn a_line_of_another_writer_before_these_is_read_from_the_journal() {
        let store = memory();
        let (writer, _) = writer(&store, 1_000);
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        writer.offer(pending(&t, &s, "r1", None));
        writer.flush().await;
        // Another replica appends a line and has not summed it yet.
        let other = serde_json::json!({"event": "request", "request_id": "x1",
            "tokens_before": 500, "upstream": "u"});
        store.append_log(&t, &s, &other).await.unwrap();
        let mut next = pending(&t, &s, "r2", None);
        next.line.tokens_before = 700;
        writer.offer(next);
        writer.flush().await;
        let kept = summary(store.as_ref(), &t, &s, free().as_ref())
            .await
            .unwrap();
        assert_eq!((kept.totals.turns, kept.records), (3, Some(3)));
        assert_eq!(kept.totals.tokens_before, 1200);
        writer.stop().await;
    }

    /// Lines written before the session was erased (queued here, the erasure made by another
    /// replica) are dropped, not brought back; lines written after it start it again.
    #[tokio::test]
    async fn lines_of_before_an_erasure_do_not_bring_the_session_back() {
        let store = memory();
        let (writer, _) = writer(&store, 1_000);
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        let mut old = pending(&t, &s, "old", None);
        old.at = std::time::SystemTime::now() - Duration::from_secs(5);
        writer.offer(old);
        crate::sessions::erase(store.as_ref(), &t, &s)
            .await
            .unwrap();
        writer.flush().await;
        assert!(store.read_log(&t, &s).await.unwrap().is_empty());
        assert!(store.list_sessions(Some(&t)).await.unwrap().is_empty());
        let mut new = pending(&t, &s, "new", None);
        new.at = std::time::SystemTime::now() + Duration::from_secs(5);
        writer.offer(new);
        writer.flush().await;
        assert_eq!(ids(&store.read_log(&t, &s).await.unwrap()), ["new"]);
        let kept = summary(store.as_ref(), &t, &s, free().as_ref())
            .await
            .unwrap();
        assert_eq!(kept.totals.turns, 1);
        writer.stop().await;
    }

    /// The writer counts into each line the prefix its client's request shares with the
    /// previous one of the session, by `shared_prefix` over their parts, across batches (the
    /// summary keeps the last request's parts); the first line of a session has none to share.
    #[tokio::test]
    async fn each_line_counts_the_prefix_shared_with_the_previous_request() {
        let store = memory();
        let (writer, _) = writer(&store, 1_000);
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        let turn = |id: &str, ids: Vec<u64>, tokens: Vec<usize>| {
            let mut p = pending(&t, &s, id, None);
            p.line.tokens_before = tokens.iter().sum();
            p.client_parts = Some(crate::tokens::Parts { ids, tokens });
            p
        };
        writer.offer(turn("r1", vec![9, 1], vec![10, 100]));
        writer.offer(turn("r2", vec![9, 1, 2], vec![10, 100, 50]));
        writer.flush().await;
        // The next batch: the third message rewritten by the client.
        writer.offer(turn("r3", vec![9, 1, 3, 4], vec![10, 100, 60, 5]));
        writer.flush().await;
        let shared: Vec<Option<usize>> = store
            .read_log(&t, &s)
            .await
            .unwrap()
            .iter()
            .map(|r| RequestLine::of(r).unwrap().client_shared_tokens)
            .collect();
        assert_eq!(shared, [None, Some(110), Some(110)]);
        writer.stop().await;
    }

    /// The writer counts what the upstream received into each line's bill, with the replay's
    /// computation: a body the proxy changed is counted again (here by a route counting
    /// `r2` and `r3` by hand), one it sent as it came is the client's; each shares with the
    /// previous request as forwarded (across batches: the summary keeps its parts), and a
    /// round of the proxy's tools moves with the forwarded call, sharing it but its priming.
    #[tokio::test]
    async fn the_forwarded_request_is_counted_as_the_upstream_received_it() {
        use crate::pricing::{Call, CallKind};
        use crate::tokens::{CountSettings, Counter, Encoding, Parts};
        let store = memory();
        let (writer, _) = writer(&store, 1_000);
        let t = Tenant::from_api_key(Some("sk-a"));
        let s = SessionId::derive(b"s");
        let by_hand = |_: &Counter, body: &[u8]| -> Option<Sent> {
            let (ids, tokens) = match body {
                b"r2" => (vec![1, 90, 11, 12], vec![5, 40, 20, 30]),
                b"r3" => (vec![1, 90, 11, 12, 13], vec![5, 40, 20, 30, 7]),
                _ => return None,
            };
            let total = tokens.iter().sum::<usize>() + 3;
            Some(Sent {
                parts: Parts { ids, tokens },
                total,
            })
        };
        let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
        let turn = |id: &str, ids: Vec<u64>, tokens: Vec<usize>, calls: Vec<Call>| {
            let mut p = pending(&t, &s, id, None);
            p.line.tokens_before = tokens.iter().sum::<usize>() + 3;
            p.client_parts = Some(Parts { ids, tokens });
            p.line.calls.calls = calls;
            if id != "r1" {
                p.forwarded_body = Some(bytes::Bytes::from(id.to_string()));
                p.recount = Some(Recount {
                    counter: counter.clone(),
                    sent: by_hand,
                });
            }
            p
        };
        let forwarded = |tokens, shared| Call::conversation(CallKind::Forwarded, tokens, shared);
        writer.offer(turn(
            "r1",
            vec![1, 10],
            vec![5, 100],
            vec![forwarded(999, 0)],
        ));
        let reload = Call::conversation(CallKind::Reload, 145, 95).with_output(9);
        writer.offer(turn(
            "r2",
            vec![1, 10, 11, 12],
            vec![5, 100, 20, 30],
            vec![forwarded(95, 60), reload],
        ));
        writer.flush().await;
        writer.offer(turn(
            "r3",
            vec![1, 10, 11, 12, 13],
            vec![5, 100, 20, 30, 7],
            vec![forwarded(100, 90)],
        ));
        writer.flush().await;
        let lines: Vec<RequestLine> = store
            .read_log(&t, &s)
            .await
            .unwrap()
            .iter()
            .map(|r| RequestLine::of(r).unwrap())
            .collect();
        let bills: Vec<Vec<(usize, usize)>> = lines
            .iter()
            .map(|l| l.calls.calls.iter().map(|c| (c.tokens, c.shared)).collect())
            .collect();
        // r1 went as it came: 108 tokens, nothing before it. r2: 98 sent, sharing the head
        // (5) with r1 as sent; its round 3 more, sharing r2's parts (95). r3: 105 sent,
        // sharing r2's parts as sent (95), read back from the summary.
        assert_eq!(
            bills,
            [vec![(108, 0)], vec![(98, 5), (148, 95)], vec![(105, 95)]]
        );
        let client: Vec<Option<usize>> = lines.iter().map(|l| l.client_shared_tokens).collect();
        assert_eq!(client, [None, Some(105), Some(155)]);
        writer.stop().await;
    }
}
