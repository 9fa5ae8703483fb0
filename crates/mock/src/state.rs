//! The state one mock shares between its handle and its connections: the queue of scripted
//! replies, the log of received requests, and the stream counters, each count published on a
//! `watch` channel so that tests wait for it without polling.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;

use super::prompt_cache::PromptCache;
use super::script::Reply;

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Received {
    /// The body parsed as JSON; `Null` when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// `{method, path, query, headers: {name: value}, body: "<text>"}`: the form of the echo
    /// route and of `GET /_mock/received`. Repeated headers are joined with `", "`; a body that
    /// is not UTF-8 is converted lossily.
    pub fn to_json(&self) -> Value {
        let mut headers = serde_json::Map::new();
        for (name, value) in &self.headers {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            match headers.get_mut(name.as_str()) {
                Some(Value::String(joined)) => {
                    joined.push_str(", ");
                    joined.push_str(&value);
                }
                _ => {
                    headers.insert(name.as_str().to_string(), Value::String(value));
                }
            }
        }
        json!({
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": headers,
            "body": String::from_utf8_lossy(&self.body),
        })
    }
}

/// A count that can be awaited.
#[derive(Debug)]
struct Counter(watch::Sender<usize>);

impl Counter {
    fn new() -> Counter {
        Counter(watch::Sender::new(0))
    }

    fn get(&self) -> usize {
        *self.0.borrow()
    }

    fn set(&self, n: usize) {
        self.0.send_replace(n);
    }

    fn increment(&self) {
        self.0.send_modify(|n| *n += 1);
    }

    /// Whether the count reaches `n` within `timeout`.
    async fn wait_at_least(&self, n: usize, timeout: Duration) -> bool {
        let mut rx = self.0.subscribe();
        // `wait_for` fails only when the sender is gone; it lives in `self`.
        let reached = tokio::time::timeout(timeout, rx.wait_for(|count| *count >= n)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

/// Requests kept in the log, most recent first to stay: a mock serving a long benchmark or a
/// demo keeps a bounded tail, not every request it ever received.
const MAX_RECEIVED: usize = 10_000;
/// Bytes of request bodies kept in the log.
const MAX_RECEIVED_BYTES: usize = 256 * 1024 * 1024;

/// The most recent requests, at most `max` of them and `max_bytes` of bodies (the last one is
/// kept whatever its size).
#[derive(Debug)]
struct Log {
    requests: VecDeque<Received>,
    bytes: usize,
    max: usize,
    max_bytes: usize,
    /// Requests dropped to stay within the bounds since the log was last cleared.
    dropped: usize,
}

impl Log {
    fn new(max: usize, max_bytes: usize) -> Log {
        Log {
            requests: VecDeque::new(),
            bytes: 0,
            max,
            max_bytes,
            dropped: 0,
        }
    }

    fn push(&mut self, request: Received) {
        self.bytes += request.body.len();
        self.requests.push_back(request);
        while self.requests.len() > self.max
            || (self.bytes > self.max_bytes && self.requests.len() > 1)
        {
            let Some(oldest) = self.requests.pop_front() else {
                break;
            };
            self.bytes -= oldest.body.len();
            self.dropped += 1;
        }
    }

    fn clear(&mut self) {
        self.requests.clear();
        self.bytes = 0;
        self.dropped = 0;
    }
}

/// State of one mock, shared by its handle and every connection.
#[derive(Debug)]
pub(crate) struct State {
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Log>,
    received_count: Counter,
    streams_cancelled: Counter,
    streams_completed: Counter,
    serial: AtomicU64,
    /// The Messages API's prompt cache.
    prompt_cache: PromptCache,
    /// The Responses API's prompt cache: the prefixes seen.
    prefix_cache: Mutex<PrefixCache>,
}

/// The prefixes of Responses requests seen, by hash, oldest first (bounded).
#[derive(Debug, Default)]
struct PrefixCache {
    known: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

/// Locks a mutex; a panic while it was held does not make its data invalid here.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    pub(crate) fn new() -> State {
        State {
            replies: Mutex::new(VecDeque::new()),
            received: Mutex::new(Log::new(MAX_RECEIVED, MAX_RECEIVED_BYTES)),
            received_count: Counter::new(),
            streams_cancelled: Counter::new(),
            streams_completed: Counter::new(),
            serial: AtomicU64::new(0),
            prompt_cache: PromptCache::default(),
            prefix_cache: Mutex::new(PrefixCache::default()),
        }
    }

    pub(crate) fn push_replies(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.replies).extend(replies);
    }

    pub(crate) fn prompt_cache(&self) -> &PromptCache {
        &self.prompt_cache
    }

    pub(crate) fn pop_reply(&self) -> Option<Reply> {
        lock(&self.replies).pop_front()
    }

    pub(crate) fn pending_replies(&self) -> usize {
        lock(&self.replies).len()
    }

    /// Adds `request` to the log (dropping the oldest beyond the bounds) and counts it.
    pub(crate) fn record(&self, request: Received) {
        lock(&self.received).push(request);
        self.received_count.increment();
    }

    /// The most recent requests (all of them until the log's bounds are reached).
    pub(crate) fn received(&self) -> Vec<Received> {
        self.received_and_dropped().0
    }

    /// The most recent requests, and how many older ones the log's bounds dropped since the
    /// last reset (read together).
    pub(crate) fn received_and_dropped(&self) -> (Vec<Received>, usize) {
        let log = lock(&self.received);
        (log.requests.iter().cloned().collect(), log.dropped)
    }

    pub(crate) async fn wait_received(&self, n: usize, timeout: Duration) -> bool {
        self.received_count.wait_at_least(n, timeout).await
    }

    /// The next answer's serial number: 1, 2, …
    pub(crate) fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn stream_cancelled(&self) {
        self.streams_cancelled.increment();
    }

    pub(crate) fn stream_completed(&self) {
        self.streams_completed.increment();
    }

    pub(crate) fn streams_cancelled(&self) -> usize {
        self.streams_cancelled.get()
    }

    pub(crate) fn streams_completed(&self) -> usize {
        self.streams_completed.get()
    }

    pub(crate) async fn wait_streams_cancelled(&self, n: usize, timeout: Duration) -> bool {
        self.streams_cancelled.wait_at_least(n, timeout).await
    }

    pub(crate) async fn wait_streams_completed(&self, n: usize, timeout: Duration) -> bool {
        self.streams_completed.wait_at_least(n, timeout).await
    }

    /// Forgets the queued replies, the request log, the counters, the serial numbers and the
    /// prompt caches.
    pub(crate) fn reset(&self) {
        self.prompt_cache.clear();
        lock(&self.replies).clear();
        lock(&self.received).clear();
        self.received_count.set(0);
        self.streams_cancelled.set(0);
        self.streams_completed.set(0);
        self.serial.store(0, Ordering::Relaxed);
        *lock(&self.prefix_cache) = PrefixCache::default();
    }

    /// The tokens of the longest of a request's prefixes found in the prompt cache, given its
    /// prefixes as (hash, tokens up to there); every prefix is cached from now on, the oldest
    /// forgotten past `max` (what the API reports of the hit is the caller's rule).
    pub(crate) fn cache_prefixes(&self, prefixes: &[([u8; 32], usize)], max: usize) -> usize {
        let mut cache = lock(&self.prefix_cache);
        let hit = prefixes
            .iter()
            .rev()
            .find(|(hash, _)| cache.known.contains(hash))
            .map_or(0, |(_, tokens)| *tokens);
        for (hash, _) in prefixes {
            if cache.known.insert(*hash) {
                cache.order.push_back(*hash);
            }
        }
        while cache.order.len() > max {
            if let Some(old) = cache.order.pop_front() {
                cache.known.remove(&old);
            }
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn request(path: &str) -> Received {
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", "1".parse().unwrap());
        headers.append("x-a", "2".parse().unwrap());
        Received {
            method: "POST".into(),
            path: path.into(),
            query: Some("q=1".into()),
            headers,
            body: Bytes::from_static(b"{\"k\":1}"),
        }
    }

    #[test]
    fn received_json_form_joins_repeated_headers() {
        let r = request("/p");
        assert_eq!(r.json(), json!({"k": 1}));
        assert_eq!(
            r.to_json(),
            json!({"method": "POST", "path": "/p", "query": "q=1",
                   "headers": {"x-a": "1, 2"}, "body": "{\"k\":1}"})
        );
        let not_json = Received {
            body: Bytes::from_static(b"\xff"),
            ..r
        };
        assert_eq!(not_json.json(), Value::Null);
        assert_eq!(not_json.to_json()["body"], "\u{fffd}");
    }

    #[tokio::test]
    async fn waiting_wakes_on_record_and_times_out_otherwise() {
        let state = std::sync::Arc::new(State::new());
        let waiter = {
            let state = state.clone();
            tokio::spawn(async move { state.wait_received(2, Duration::from_secs(5)).await })
        };
        state.record(request("/a"));
        state.record(request("/b"));
        assert!(waiter.await.unwrap());
        assert!(!state.wait_received(3, Duration::from_millis(10)).await);
        state.reset();
        assert!(state.received().is_empty());
        assert_eq!(state.next_serial(), 1);
    }

    #[test]
    fn the_log_keeps_a_bounded_tail() {
        // At most three requests (7 bytes of body each).
        let mut log = Log::new(3, 1_000);
        for i in 0..5 {
            log.push(request(&format!("/{i}")));
        }
        let paths: Vec<&str> = log.requests.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["/2", "/3", "/4"]);
        assert_eq!(log.bytes, 21);
        // At most 15 bytes of bodies: two requests; one larger than the bound stays alone.
        let mut log = Log::new(100, 15);
        for i in 0..4 {
            log.push(request(&format!("/{i}")));
        }
        assert_eq!(log.requests.len(), 2);
        let mut big = request("/big");
        big.body = Bytes::from(vec![b' '; 64]);
        log.push(big);
        assert_eq!(log.requests.len(), 1);
        assert_eq!(log.bytes, 64);
    }

    #[test]
    fn the_count_goes_on_past_the_log() {
        let state = State::new();
        lock(&state.received).max = 2;
        for i in 0..5 {
            state.record(request(&format!("/{i}")));
        }
        assert_eq!(state.received().len(), 2);
        assert_eq!(*state.received_count.0.borrow(), 5);
        assert_eq!(state.received_and_dropped().1, 3);
        state.reset();
        assert_eq!(state.received_and_dropped().1, 0);
    }
}
