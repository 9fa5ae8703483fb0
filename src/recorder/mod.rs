//! The traffic recorder: a background service that appends every exchange of a managed route
//! (chat completions, the Responses API) to
//! a recording directory in the corpus crate's recording format
//! ([`crate::corpus::recording`]).
//!
//! The record phase hands over a [`Pending`] exchange — bytes already held by the request
//! (shared, not copied) and the response body read on the way — with a non-blocking
//! `try_send` into a bounded queue. When the queue is full the exchange is dropped and counted
//! (`context_proxy_record_dropped_total`): recording never slows a request down. One thread
//! owns the files: it parses the bodies, assembles streamed answers, hashes texts when asked,
//! and writes each exchange with one `write` call, so a crash tears at most the last line; a
//! write that fails part way (a full disk) is cut back off the file and counted
//! (`context_proxy_recorder_write_errors_total`).
//! At shutdown the queue is drained and the thread joined.
//!
//! API keys are never written: the request's headers are not recorded at all, the tenant is
//! the proxy's hash of the key.

pub mod config;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;

use crate::corpus::recording::{Exchange, Writer, WriterConfig};
use crate::service::Service;
use crate::upstream::relay::End;
use crate::wire::{ChatAccumulator, SseConfig, SseReader};

pub use config::RecordConfig;

/// One exchange as the record phase hands it over: cheap to build (shared bytes), turned into
/// an [`Exchange`] on the recorder's thread.
#[derive(Debug)]
pub struct Pending {
    pub at: SystemTime,
    pub request_id: String,
    pub session: Option<String>,
    pub tenant: Option<String>,
    pub mode: &'static str,
    /// The route's name (`chat`, `responses`, `messages`, `count_tokens`).
    pub route: &'static str,
    /// The body as received.
    pub request: Bytes,
    /// The body sent upstream, when it differs from `request`.
    pub forwarded: Option<Bytes>,
    /// The response body as relayed, unless it was larger than `max_response_bytes`.
    pub response: Option<Bytes>,
    pub status: u16,
    pub end: End,
    pub ttfb_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub tokens_before: Option<usize>,
    pub tokens_after: Option<usize>,
    pub actions: String,
    pub upstream_calls: u64,
    pub reload_rounds: u64,
}

enum Msg {
    Exchange(Box<Pending>),
    /// Answered once everything queued before it is written.
    Flush(tokio::sync::oneshot::Sender<()>),
    /// Tests: the thread waits until this is answered (or dropped).
    #[cfg(test)]
    Hold {
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    },
}

/// Exchanges written, and exchanges that could not be written (an I/O error, logged; shared
/// with `/metrics` as `context_proxy_recorder_write_errors_total`).
#[derive(Debug, Default)]
pub struct RecordStats {
    pub written: AtomicU64,
    pub failed: Arc<AtomicU64>,
}

/// The running recorder (see the module docs).
pub struct Recorder {
    queue: Mutex<Option<SyncSender<Msg>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    stats: Arc<RecordStats>,
    max_response_bytes: usize,
}

impl Recorder {
    /// Opens a new file in `config.dir` and starts the writing thread, which counts the
    /// exchanges it cannot write in `write_errors`.
    pub fn start(
        config: &RecordConfig,
        write_errors: Arc<AtomicU64>,
    ) -> std::io::Result<Arc<Recorder>> {
        let started_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let writer = Writer::create(
            WriterConfig {
                dir: config.dir.clone(),
                hash_content: config.hash_content,
                max_file_bytes: config.max_file_bytes,
            },
            started_ms,
        )?;
        let (tx, rx) = sync_channel(config.queue_capacity);
        let stats = Arc::new(RecordStats {
            written: AtomicU64::new(0),
            failed: write_errors,
        });
        let span = tracing::info_span!("recorder", dir = %config.dir.display());
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                let _entered = span.enter();
                write_loop(writer, rx, &thread_stats);
            })?;
        Ok(Arc::new(Recorder {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            stats,
            max_response_bytes: config.max_response_bytes,
        }))
    }

    /// The largest response body the record phase should keep for an exchange.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    pub fn stats(&self) -> &RecordStats {
        &self.stats
    }

    fn sender(&self) -> Option<SyncSender<Msg>> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .cloned()
    }

    /// Queues `pending` without waiting: false when the queue is full or the recorder has
    /// stopped (the exchange is dropped; the caller counts it).
    pub fn offer(&self, pending: Pending) -> bool {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match queue.as_ref() {
            Some(tx) => match tx.try_send(Msg::Exchange(Box::new(pending))) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        }
    }

    /// Waits until everything queued so far is written.
    pub async fn flush(&self) {
        let Some(tx) = self.sender() else { return };
        let (done, wait) = tokio::sync::oneshot::channel();
        // Waiting for room in the queue happens on a blocking thread, never a worker.
        let sent = tokio::task::spawn_blocking(move || tx.send(Msg::Flush(done)).is_ok()).await;
        if matches!(sent, Ok(true)) {
            let _ = wait.await;
        }
    }
}

#[async_trait]
impl Service for Recorder {
    fn name(&self) -> &'static str {
        "traffic recorder"
    }

    /// Closes the queue; the thread writes what is queued and exits; waits for it.
    async fn stop(&self) {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            if tokio::task::spawn_blocking(move || thread.join())
                .await
                .is_err()
            {
                tracing::warn!("the recorder's thread could not be joined");
            }
        }
    }
}

fn write_loop(mut writer: Writer, rx: Receiver<Msg>, stats: &RecordStats) {
    tracing::info!(file = %writer.path().display(), "recording traffic");
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Exchange(pending) => match writer.append(exchange(*pending)) {
                Ok(()) => {
                    stats.written.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot write a recorded exchange");
                }
            },
            Msg::Flush(done) => {
                let _ = done.send(());
            }
            #[cfg(test)]
            Msg::Hold { entered, release } => {
                let _ = entered.send(());
                let _ = release.recv();
            }
        }
    }
    tracing::debug!(
        written = stats.written.load(Ordering::Relaxed),
        "recorder stopped"
    );
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

/// The exchange to write: bodies parsed, a stream assembled into the completion it stands for.
fn exchange(p: Pending) -> Exchange {
    let request = json(&p.request);
    let stream = request.get("stream") == Some(&Value::Bool(true));
    let anthropic = matches!(p.route, "messages" | "count_tokens");
    let response = p.response.as_ref().map(|body| match (stream, anthropic) {
        (false, _) => json(body),
        (true, false) => assemble(body),
        (true, true) => crate::wire::anthropic::assemble(body).unwrap_or_else(|| json(body)),
    });
    Exchange {
        at_ms: p
            .at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        request_id: p.request_id,
        session: p.session,
        tenant: p.tenant,
        route: (p.route != "chat").then(|| p.route.to_string()),
        mode: p.mode.to_string(),
        request,
        forwarded: p.forwarded.as_deref().map(json),
        response_truncated: p.response.is_none(),
        response,
        stream,
        status: p.status,
        end: match p.end {
            End::Complete => "complete",
            End::Failed => "failed",
            End::Cancelled => "cancelled",
        }
        .to_string(),
        ttfb_ms: p.ttfb_ms,
        total_ms: p.total_ms,
        tokens_before: p.tokens_before,
        tokens_after: p.tokens_after,
        actions: p.actions,
        upstream_calls: p.upstream_calls,
        reload_rounds: p.reload_rounds,
    }
}

/// The answer a streamed body stands for: a Responses stream's final `response` object (of
/// its terminal event), else the `chat.completion` its chunks make (an error body as JSON when
/// it is not SSE).
fn assemble(body: &[u8]) -> Value {
    let mut reader = SseReader::new(SseConfig::default());
    let mut acc = ChatAccumulator::new();
    let mut events = 0;
    let mut response = None;
    reader.push(body);
    let _ = reader.finish();
    while let Ok(Some(event)) = reader.next_event() {
        events += 1;
        let terminal = matches!(
            event.event.as_deref(),
            Some("response.completed" | "response.incomplete" | "response.failed")
        );
        if terminal {
            response = event
                .data
                .as_deref()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .and_then(|mut v| v.get_mut("response").map(Value::take));
            continue;
        }
        let _ = acc.push_event(&event);
    }
    if let Some(response) = response {
        return response;
    }
    if events == 0 {
        return json(body);
    }
    acc.to_completion()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_responses_stream_is_kept_as_its_final_response() {
        let body = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[{\"type\":\"compaction\"}],\"usage\":{\"input_tokens\":5}}}\n\n";
        let v = assemble(body);
        assert_eq!(v["status"], "completed");
        assert_eq!(v["output"][0]["type"], "compaction");
        assert_eq!(v["usage"]["input_tokens"], 5);
    }

    fn pending(n: usize) -> Pending {
        Pending {
            at: SystemTime::now(),
            request_id: format!("r{n}"),
            session: Some("s".into()),
            tenant: None,
            mode: "off",
            route: "chat",
            request: Bytes::from(format!(
                r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"hello {n}"}}]}}"#
            )),
            forwarded: None,
            response: Some(Bytes::from_static(
                b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
            )),
            status: 200,
            end: End::Complete,
            ttfb_ms: Some(1.0),
            total_ms: Some(2.0),
            tokens_before: None,
            tokens_after: None,
            actions: "off".into(),
            upstream_calls: 1,
            reload_rounds: 0,
        }
    }

    fn config(dir: &std::path::Path, capacity: usize) -> RecordConfig {
        RecordConfig {
            enabled: true,
            dir: dir.to_path_buf(),
            queue_capacity: capacity,
            ..RecordConfig::default()
        }
    }

    #[tokio::test]
    async fn streams_are_assembled_and_stop_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::start(&config(dir.path(), 16), Arc::default()).unwrap();
        for n in 0..5 {
            assert!(recorder.offer(pending(n)));
        }
        recorder.stop().await;
        assert!(!recorder.offer(pending(9)), "stopped: dropped");
        let read = crate::corpus::recording::read(dir.path()).unwrap();
        assert_eq!(read.exchanges.len(), 5);
        let x = &read.exchanges[4];
        assert_eq!(x.request["messages"][0]["content"], "hello 4");
        let response = x.response.as_ref().unwrap();
        assert_eq!(response["choices"][0]["message"]["content"], "hi there");
        assert_eq!(response["object"], "chat.completion");
    }

    #[tokio::test]
    async fn a_full_queue_drops_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::start(&config(dir.path(), 3), Arc::default()).unwrap();
        // The writer is held until `release` is dropped: the queue fills and stays full.
        let (release, hold) = std::sync::mpsc::channel();
        let (entered, has_entered) = std::sync::mpsc::channel();
        let tx = recorder.sender().unwrap();
        tx.send(Msg::Hold {
            entered,
            release: hold,
        })
        .unwrap();
        has_entered.recv().unwrap();
        let started = std::time::Instant::now();
        let accepted = (0..100).filter(|&n| recorder.offer(pending(n))).count();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(accepted, 3);
        drop((release, tx));
        recorder.flush().await;
        assert_eq!(
            recorder.stats().written.load(Ordering::Relaxed),
            accepted as u64
        );
        recorder.stop().await;
    }
}
