//! The summarizer: computes the summaries the context plan asks for ([`SummaryJob`]), once per
//! prefix, and remembers them in the store (`context::summaries`). The pure parts (prompt,
//! parsing, placement) are in `context::summary`; this module does the I/O.
//!
//! - **Single-flight.** A summary is computed once: in the process, concurrent askers wait on
//!   the one computing it; across replicas, a store lock per prefix (`Store::try_lock`, with
//!   an expiry) elects the one that calls the summarizer, the others watch for its result.
//! - **Background.** [`Summarizer::enqueue`] queues a job (bounded queue; a full queue drops
//!   it) for a worker task running at most `concurrency` calls at once, each in its own span.
//!   It is a [`Service`]: stopped at shutdown, running calls cut.
//! - **Failure.** An error, a timeout, an empty or malformed answer (after one retry) is never
//!   recorded; the span is not tried again for a backoff that doubles, and the caller falls
//!   back to the marker.

mod call;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use http::HeaderValue;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::summary::SummarizerConfig;
use crate::context::summary_store::{Recorded, Summaries};
use crate::context::{Identity, SummaryJob};
use crate::service::Service;
use crate::store::{StateKey, Store, StoreError};
use crate::telemetry::summarizer_stats::Stats;
use crate::upstream::Upstream;

/// While another replica holds a prefix's lock, its result is looked for this often.
const REPLICA_POLL: Duration = Duration::from_millis(100);

/// One summary to compute, with what is needed to call the summarizer.
#[derive(Clone)]
pub struct Task {
    pub identity: Identity,
    pub job: SummaryJob,
    /// The request's upstream (used unless the config names one).
    pub upstream: Arc<Upstream>,
    /// The client's `Authorization` header, sent to the request's upstream.
    pub authorization: Option<HeaderValue>,
    /// The request's model (used unless the config names one).
    pub model: String,
    /// The bill of the request waiting for this summary, which its calls go on (`None` in the
    /// background: the metrics count them alone).
    pub bill: Option<Arc<Mutex<crate::pricing::Bill>>>,
}

/// Why no summary came.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("the summarizer did not answer in time")]
    Timeout,
    #[error("the summarizer failed: {0}")]
    Upstream(String),
    #[error("the summarizer's answer is empty or malformed")]
    Malformed,
    #[error("this span failed recently; retrying later")]
    Backoff,
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("the summarizer is stopped")]
    Stopped,
}

/// Computed now, or found computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cached,
    Computed,
}

/// The summarizer service.
pub struct Summarizer {
    config: SummarizerConfig,
    store: Arc<dyn Store>,
    summaries: Summaries,
    /// The upstream named in the config, if any.
    named: Option<Arc<Upstream>>,
    /// Prefixes being computed in this process → a receiver that changes when it ends.
    inflight: DashMap<String, watch::Receiver<bool>>,
    /// Prefixes that failed → when they may be tried again, and how many failures in a row:
    /// at most [`BACKOFF_SPANS`], each forgotten [`BACKOFF_MEMORY`] backoffs after its last
    /// failure, so a long outage cannot grow it.
    backoff: moka::sync::Cache<String, (Instant, u32)>,
    queue: mpsc::Sender<Task>,
    stop: watch::Sender<bool>,
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    holder: String,
    pub stats: Arc<Stats>,
}

/// Failing spans whose backoff is remembered (the least likely to be asked again evicted).
pub const BACKOFF_SPANS: u64 = 10_000;
/// A span's backoff is forgotten this many base backoffs (`retry_backoff_ms`) after its last
/// failure (twice the longest backoff): it is then tried as if it had never failed.
pub const BACKOFF_MEMORY: u32 = 64;

/// Removes an in-flight entry and wakes its waiters when dropped.
struct Flight<'a> {
    map: &'a DashMap<String, watch::Receiver<bool>>,
    key: String,
    done: watch::Sender<bool>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.map.remove(&self.key);
        let _ = self.done.send(true);
    }
}

impl Summarizer {
    /// Starts the service (its worker task runs until [`Service::stop`]).
    pub fn start(
        config: SummarizerConfig,
        store: Arc<dyn Store>,
        named: Option<Arc<Upstream>>,
        stats: Arc<Stats>,
    ) -> Arc<Summarizer> {
        let (queue, rx) = mpsc::channel(config.queue_capacity);
        let backoff_memory = (Duration::from_millis(config.retry_backoff_ms) * BACKOFF_MEMORY)
            .max(Duration::from_secs(1));
        let (stop, stop_rx) = watch::channel(false);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let holder = format!(
            "{}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let summarizer = Arc::new(Summarizer {
            summaries: Summaries::new(store.clone()),
            config,
            store,
            named,
            inflight: DashMap::new(),
            backoff: moka::sync::Cache::builder()
                .max_capacity(BACKOFF_SPANS)
                .time_to_live(backoff_memory)
                .build(),
            queue,
            stop,
            worker: Mutex::new(None),
            holder,
            stats,
        });
        let worker = tokio::spawn(
            work(Arc::downgrade(&summarizer), rx, stop_rx)
                .instrument(tracing::info_span!("summarizer")),
        );
        *summarizer.worker.lock().unwrap_or_else(|e| e.into_inner()) = Some(worker);
        summarizer
    }

    pub fn config(&self) -> &SummarizerConfig {
        &self.config
    }

    /// The longest a request waits for a summary.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms)
    }

    /// Queues a background summary; false when the queue is full, the span is backing off,
    /// or it is already being computed here.
    pub fn enqueue(&self, task: Task) -> bool {
        let key = flight_key(&task);
        if self.inflight.contains_key(&key) || self.backing_off(&key) {
            return false;
        }
        match self.queue.try_send(task) {
            Ok(()) => {
                Stats::add(&self.stats.background_started);
                true
            }
            Err(_) => {
                Stats::add(&self.stats.background_dropped);
                false
            }
        }
    }

    fn backing_off(&self, key: &str) -> bool {
        self.backoff
            .get(key)
            .is_some_and(|(until, _)| Instant::now() < until)
    }

    /// The summary of `task`'s prefix: recorded already, computed by someone else meanwhile,
    /// or computed here, before `deadline`. Never records a failure.
    pub async fn obtain(
        &self,
        task: &Task,
        deadline: Instant,
    ) -> Result<(String, Source), Failure> {
        let key = flight_key(task);
        let id = &task.identity;
        let lock = StateKey::parse(&format!("summary-{}", task.job.prefix_hash))
            .map_err(StoreError::from)?;
        loop {
            if let Some(s) = self
                .summaries
                .get(id, task.job.prefix_len, &task.job.prefix_hash)
                .await?
            {
                return Ok((s, Source::Cached));
            }
            if *self.stop.borrow() {
                return Err(Failure::Stopped);
            }
            if Instant::now() >= deadline {
                return Err(Failure::Timeout);
            }
            if self.backing_off(&key) {
                return Err(Failure::Backoff);
            }
            // In this process: wait for the one computing it.
            let waiting = self.inflight.get(&key).map(|r| r.value().clone());
            if let Some(mut rx) = waiting {
                let _ = tokio::time::timeout_at(deadline, rx.wait_for(|done| *done)).await;
                continue;
            }
            let (done, rx) = watch::channel(false);
            match self.inflight.entry(key.clone()) {
                dashmap::mapref::entry::Entry::Occupied(_) => continue,
                dashmap::mapref::entry::Entry::Vacant(v) => {
                    v.insert(rx);
                }
            }
            let flight = Flight {
                map: &self.inflight,
                key: key.clone(),
                done,
            };
            // Across replicas: the store's lock elects one caller.
            let ttl = self.timeout() * 2;
            if !self
                .store
                .try_lock(&id.tenant, &id.session, &lock, &self.holder, ttl)
                .await?
            {
                drop(flight);
                let next = (Instant::now() + REPLICA_POLL).min(deadline);
                tokio::time::sleep_until(next).await;
                continue;
            }
            let result = tokio::time::timeout_at(
                deadline.min(Instant::now() + self.timeout()),
                self.call(task),
            )
            .await
            .unwrap_or(Err(Failure::Timeout));
            let outcome = match result {
                Ok(summary) => {
                    self.backoff.invalidate(&key);
                    let recorded = self
                        .summaries
                        .record(
                            id,
                            Recorded {
                                prefix_len: task.job.prefix_len,
                                prefix_hash: task.job.prefix_hash.clone(),
                                summary,
                            },
                        )
                        .await;
                    recorded
                        .map(|s| (s, Source::Computed))
                        .map_err(Failure::from)
                }
                Err(e) => {
                    self.fail(&key, &e);
                    Err(e)
                }
            };
            if let Err(e) = self
                .store
                .unlock(&id.tenant, &id.session, &lock, &self.holder)
                .await
            {
                tracing::warn!(error = %e, "cannot release the summary lock (it expires)");
            }
            drop(flight);
            return outcome;
        }
    }

    fn fail(&self, key: &str, e: &Failure) {
        Stats::add(&self.stats.failed);
        if matches!(e, Failure::Timeout) {
            Stats::add(&self.stats.timeouts);
        }
        let base = Duration::from_millis(self.config.retry_backoff_ms);
        let failures = self.backoff.get(key).map_or(0, |(_, n)| n);
        let n = failures.min(5);
        self.backoff.insert(
            key.to_string(),
            (Instant::now() + base * (1 << n), failures + 1),
        );
        tracing::warn!(error = %e, "summary failed: the marker stands, retrying later");
    }

    /// Puts one answered call on the bill of the request that waits for it, if any, and on
    /// the metrics, priced in full-price input tokens of the request's model.
    fn bill(&self, task: &Task, model: &str, answer: &call::Answer) {
        let call = crate::pricing::Call::summarizer(
            model,
            answer.prompt_tokens as usize,
            answer.completion_tokens as usize,
        );
        let cost = call.cost(&crate::pricing::CachePricing::NONE, &task.model);
        self.stats
            .every_call
            .record(call.kind.as_str(), call.tokens, cost);
        if let Some(bill) = &task.bill {
            bill.lock().unwrap_or_else(|e| e.into_inner()).push(call);
        }
    }

    async fn call(&self, task: &Task) -> Result<String, Failure> {
        let upstream = self.named.as_ref().unwrap_or(&task.upstream);
        let model = self.config.model.as_deref().unwrap_or(&task.model);
        // One retry on a malformed answer.
        for attempt in 0..2 {
            let started = std::time::Instant::now();
            let answer = call::ask(
                upstream,
                task.authorization.as_ref(),
                model,
                &self.config,
                &task.job,
            )
            .await;
            Stats::add(&self.stats.calls);
            Stats::add_n(
                &self.stats.latency_ms_sum,
                started.elapsed().as_millis() as u64,
            );
            let answer = answer?;
            Stats::add_n(&self.stats.tokens_in, answer.prompt_tokens);
            Stats::add_n(&self.stats.tokens_out, answer.completion_tokens);
            self.bill(task, model, &answer);
            if let Some(summary) = crate::context::summary::parse(&answer.text) {
                let max = self.config.max_summary_tokens;
                let bounded = crate::context::summary::bounded(&summary, max, task.job.encoding);
                if bounded.len() < summary.len() {
                    Stats::add(&self.stats.cut);
                    tracing::warn!(
                        max_summary_tokens = max,
                        bytes = summary.len(),
                        "the summarizer's answer is over its budget: cut"
                    );
                }
                return Ok(bounded.into_owned());
            }
            Stats::add(&self.stats.malformed);
            tracing::debug!(attempt, "malformed summary");
        }
        Err(Failure::Malformed)
    }
}

/// Starts the summarizer when `[context.summarizer]` enables it; an error names an unknown
/// upstream (which `Config::validate` has already refused, for `check-config` and start-up).
pub fn start(
    config: &SummarizerConfig,
    upstreams: &crate::upstream::Upstreams,
    store: &Arc<dyn Store>,
    metrics: &crate::telemetry::metrics::Metrics,
) -> Result<Option<Arc<Summarizer>>, String> {
    if !config.enabled {
        return Ok(None);
    }
    let named = match &config.upstream {
        None => None,
        Some(name) => Some(upstreams.named(name).ok_or_else(|| name.clone())?.clone()),
    };
    Ok(Some(Summarizer::start(
        config.clone(),
        store.clone(),
        named,
        metrics.summarizer.clone(),
    )))
}

fn flight_key(task: &Task) -> String {
    format!(
        "{}/{}/{}",
        task.identity.tenant.as_str(),
        task.identity.session.as_str(),
        task.job.prefix_hash
    )
}

/// The background worker: takes queued tasks and runs up to `concurrency` at once, until
/// stopped (running calls are then cut).
async fn work(
    summarizer: std::sync::Weak<Summarizer>,
    mut rx: mpsc::Receiver<Task>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(concurrency) = summarizer.upgrade().map(|s| s.config.concurrency) else {
        return;
    };
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break,
            Some(_) = running.join_next(), if !running.is_empty() => {}
            task = rx.recv() => {
                let Some(task) = task else { break };
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let Some(s) = summarizer.upgrade() else { break };
                let span = tracing::info_span!("summary", prefix_len = task.job.prefix_len);
                running.spawn(async move {
                    let _permit = permit;
                    let deadline = Instant::now() + s.timeout();
                    match s.obtain(&task, deadline).await {
                        Ok(_) => Stats::add(&s.stats.background_completed),
                        Err(e) => {
                            Stats::add(&s.stats.background_failed);
                            tracing::debug!(error = %e, "background summary not made");
                        }
                    }
                }.instrument(span));
            }
        }
    }
    running.shutdown().await;
}

#[async_trait]
impl Service for Summarizer {
    fn name(&self) -> &'static str {
        "summarizer"
    }

    async fn stop(&self) {
        let _ = self.stop.send(true);
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = worker {
            let _ = worker.await;
        }
    }
}
