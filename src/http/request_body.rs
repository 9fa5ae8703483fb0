//! Reading a request body, bounded in size (`server.max_body_bytes`, 413) and in time
//! (`server.body_read_timeout_ms` plus the body's size at `server.body_min_bytes_per_sec`,
//! 408), whether it is read into memory or streamed to the upstream.
//!
//! A body read into memory is also held against a budget shared by all requests
//! (`server.max_body_bytes_in_flight`, 503 when it is spent) until the request's response head
//! is sent ([`holding_bodies`]), and a chat body's JSON is measured from its bytes before it is
//! parsed into a DOM ([`check_json_shape`]: `server.max_json_elements`, 413;
//! `server.max_json_depth`, 400).
//!
//! While a body is being received, the connection it comes on knows it ([`Receiving`]): a
//! connection waiting on its client's body is not doing the client's work, so the server may
//! close it to make room, and closes it at once when it shuts down.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::http::body::BoxError;
use crate::http::error::ClientError;

/// The `[server]` limits a request body is read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// `server.max_body_bytes`.
    pub max_body_bytes: usize,
    /// `server.max_json_elements`.
    pub max_json_elements: usize,
    /// `server.max_json_depth`.
    pub max_json_depth: usize,
    /// `server.body_read_timeout_ms`.
    pub body_read_timeout_ms: u64,
    /// `server.body_min_bytes_per_sec`.
    pub body_min_bytes_per_sec: u64,
}

/// Why a request body was refused.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    #[error("request body is larger than the limit of {limit} bytes (server.max_body_bytes)")]
    TooLarge { limit: usize },
    #[error("the request body holds more than {limit} JSON values (server.max_json_elements)")]
    JsonTooLarge { limit: usize },
    #[error("the request body nests arrays and objects deeper than {limit} levels (server.max_json_depth)")]
    JsonTooDeep { limit: usize },
    #[error("the proxy holds as many request bodies as it may (server.max_body_bytes_in_flight = {budget} bytes): retry shortly")]
    Overloaded { budget: usize },
    #[error("the request body did not arrive in time: it must arrive within {timeout_ms} ms plus its size at {min_rate} bytes per second (server.body_read_timeout_ms, server.body_min_bytes_per_sec)")]
    Timeout { timeout_ms: u64, min_rate: u64 },
    #[error("could not read the request body: {0}")]
    Read(String),
}

impl ClientError for RequestBodyError {
    fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        use RequestBodyError::*;
        match self {
            TooLarge { .. } | JsonTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                Some("request_too_large"),
            ),
            JsonTooDeep { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("json_too_deep"),
            ),
            Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("overloaded"),
            ),
            Timeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                Some("body_read_timeout"),
            ),
            Read(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("body_read_error"),
            ),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        matches!(self, RequestBodyError::Overloaded { .. }).then_some(1)
    }
}

/// The `Content-Length` the client declared, if any.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Refuses a chat body whose JSON would cost too much to parse into a DOM
/// (`server.max_json_elements`, 413; `server.max_json_depth`, 400), measured from its bytes.
pub fn check_json_shape(raw: &[u8], server: &BodyLimits) -> Result<JsonShape, RequestBodyError> {
    let shape = json_shape(raw, server.max_json_elements, server.max_json_depth);
    if shape.elements > server.max_json_elements {
        return Err(RequestBodyError::JsonTooLarge {
            limit: server.max_json_elements,
        });
    }
    if shape.depth > server.max_json_depth {
        return Err(RequestBodyError::JsonTooDeep {
            limit: server.max_json_depth,
        });
    }
    Ok(shape)
}

/// Bytes one JSON value costs once parsed (serde_json's `Value` with `preserve_order`, its
/// slot in its array or map, the allocator's rounding): 64 bodies of 3 MB of empty objects
/// peaked at 4.7 GB, about 73 bytes a value.
pub const PARSED_BYTES_PER_VALUE: usize = 80;

/// Holds against `budget`, until the request ends, what a body of `shape` will cost once
/// parsed into a DOM (at most the whole budget): a body of many tiny values costs many times
/// its bytes. 503 when that is not left.
pub fn hold_parsed(budget: &BodyBudget, shape: JsonShape) -> Result<(), RequestBodyError> {
    let cost = shape
        .elements
        .saturating_mul(PARSED_BYTES_PER_VALUE)
        .min(budget.budget);
    hold(budget.take(cost)?);
    Ok(())
}

/// Reads the whole body, answering 413 as soon as it is known to exceed
/// `server.max_body_bytes`, 408 when it arrives too slowly, and 503 when the bytes it needs
/// are not left in `budget`.
pub async fn read_limited(
    body: Incoming,
    headers: &HeaderMap,
    server: &BodyLimits,
    budget: &BodyBudget,
) -> Result<Bytes, RequestBodyError> {
    let limit = server.max_body_bytes;
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(RequestBodyError::TooLarge { limit });
    }
    let capacity = declared.map_or(0, |len| len as usize);
    // The declared size is taken at once; a body without one takes its chunks as they come.
    let mut held = budget.take(capacity)?;
    let mut body = Timed::new(body, server);
    let mut bytes = BytesMut::with_capacity(capacity);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| body_error(server, &*e))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > limit {
                return Err(RequestBodyError::TooLarge { limit });
            }
            let short = (bytes.len() + data.len()).saturating_sub(held.num_permits());
            if short > 0 {
                held.merge(budget.take(short)?);
            }
            bytes.extend_from_slice(&data);
        }
    }
    hold(held);
    Ok(bytes.freeze())
}

/// Whether the body is sent with `Content-Encoding: zstd` (and no other coding), the one
/// compressed body the proxy decodes (Codex sends it in some setups).
pub fn is_zstd(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("zstd"))
}

/// Largest zstd window the decoder accepts, as a power of two: 128 MiB, zstd's own default
/// limit; lower when `server.max_body_bytes` is (a frame asking for more is refused before
/// anything is allocated for it).
const ZSTD_MAX_WINDOW_LOG: u32 = 27;

/// A body sent with `Content-Encoding: zstd`, decoded under the limits of any body:
/// `server.max_body_bytes` bounds the decoded size (413 as soon as it is passed, so a small
/// frame that expands without end costs at most the limit, never more memory) and the decoded
/// bytes are held against `server.max_body_bytes_in_flight` (503). Bytes that are not zstd
/// are a 400.
pub fn decode_zstd(
    raw: &[u8],
    server: &BodyLimits,
    budget: &BodyBudget,
) -> Result<Bytes, RequestBodyError> {
    use std::io::Read;
    let limit = server.max_body_bytes;
    let invalid = |e: std::io::Error| {
        // zstd's own words for a frame whose window is over `window_log_max`: it asks for
        // more memory than the limit lets a body hold.
        if e.to_string().contains("too much memory") {
            return RequestBodyError::TooLarge { limit };
        }
        RequestBodyError::Read(format!(
            "the body is sent with Content-Encoding: zstd but cannot be decoded ({e}); send \
             it uncompressed or as one zstd frame"
        ))
    };
    let mut decoder = zstd::stream::read::Decoder::new(raw).map_err(invalid)?;
    let window_log = (usize::BITS - limit.max(1 << 10).saturating_sub(1).leading_zeros())
        .min(ZSTD_MAX_WINDOW_LOG);
    decoder.window_log_max(window_log).map_err(invalid)?;
    let mut held = budget.take(0)?;
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = decoder.read(&mut chunk).map_err(invalid)?;
        if n == 0 {
            break;
        }
        if out.len() + n > limit {
            return Err(RequestBodyError::TooLarge { limit });
        }
        let short = (out.len() + n).saturating_sub(held.num_permits());
        if short > 0 {
            held.merge(budget.take(short)?);
        }
        out.extend_from_slice(&chunk[..n]);
    }
    hold(held);
    Ok(Bytes::from(out))
}

/// The request-body bytes that may be held in memory at once (`server.max_body_bytes_in_flight`).
pub struct BodyBudget {
    semaphore: Arc<Semaphore>,
    budget: usize,
}

impl BodyBudget {
    pub fn new(budget: usize) -> BodyBudget {
        let budget = budget.min(Semaphore::MAX_PERMITS);
        BodyBudget {
            semaphore: Arc::new(Semaphore::new(budget)),
            budget,
        }
    }

    /// Bytes of the budget not held now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits()
    }

    /// Takes `bytes` of the budget, or fails at once with 503 when they are not left.
    fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, RequestBodyError> {
        let n = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.semaphore
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| RequestBodyError::Overloaded {
                budget: self.budget,
            })
    }
}

tokio::task_local! {
    /// The body budget held by the request running on this task.
    static HELD: RefCell<Vec<OwnedSemaphorePermit>>;
}

/// Runs one request so that the body bytes it reads stay held against the budget until it
/// ends (the router runs each request in it, up to its response head).
pub async fn holding_bodies<F: Future>(request: F) -> F::Output {
    HELD.scope(RefCell::new(Vec::new()), request).await
}

/// Keeps `permit` until the request ends (outside [`holding_bodies`]: until now).
fn hold(permit: OwnedSemaphorePermit) {
    let _ = HELD.try_with(|held| held.borrow_mut().push(permit));
}

/// The request bodies a connection is receiving now, and since when: the server reads it to
/// tell a connection waiting on its client (a slow or stalled body) from one whose request is
/// being worked on.
pub struct Receiving {
    bodies: AtomicUsize,
    /// When the bodies now being received began, in ns after `epoch`.
    since: AtomicU64,
    epoch: Instant,
    /// Woken when a body begins.
    began: Notify,
}

impl Receiving {
    pub fn new(epoch: Instant) -> Receiving {
        Receiving {
            bodies: AtomicUsize::new(0),
            since: AtomicU64::new(0),
            epoch,
            began: Notify::new(),
        }
    }

    /// How many bodies are being received now.
    pub fn bodies(&self) -> usize {
        self.bodies.load(Ordering::Acquire)
    }

    /// When the first of the bodies being received now began; `None` when none is.
    pub fn since(&self) -> Option<Instant> {
        if self.bodies() == 0 {
            return None;
        }
        let nanos = self.since.load(Ordering::Acquire);
        Some(self.epoch + Duration::from_nanos(nanos))
    }

    /// Completes when a body begins (or began since the last wait ended).
    pub async fn began(&self) {
        self.began.notified().await;
    }

    fn begin(self: Arc<Self>) -> Receipt {
        if self.bodies.fetch_add(1, Ordering::AcqRel) == 0 {
            let since = Instant::now().saturating_duration_since(self.epoch);
            self.since.store(since.as_nanos() as u64, Ordering::Release);
        }
        self.began.notify_one();
        Receipt(self)
    }
}

/// One body being received, until it is whole, fails or is dropped.
struct Receipt(Arc<Receiving>);

impl Drop for Receipt {
    fn drop(&mut self) {
        self.0.bodies.fetch_sub(1, Ordering::AcqRel);
    }
}

tokio::task_local! {
    /// The bodies of the connection the request running on this task came on.
    static RECEIVING: Arc<Receiving>;
}

/// Runs one request so that the bodies it reads count in `receiving` while they arrive (the
/// server runs each request in it).
pub async fn receiving_into<F: Future>(receiving: Arc<Receiving>, request: F) -> F::Output {
    RECEIVING.scope(receiving, request).await
}

/// The error for a failed body read.
fn body_error(server: &BodyLimits, e: &(dyn std::error::Error + 'static)) -> RequestBodyError {
    if e.downcast_ref::<BodyTimeout>().is_some() {
        timeout_error(server)
    } else {
        RequestBodyError::Read(e.to_string())
    }
}

/// The 408 for a body that arrived too slowly.
pub fn timeout_error(server: &BodyLimits) -> RequestBodyError {
    RequestBodyError::Timeout {
        timeout_ms: server.body_read_timeout_ms,
        min_rate: server.body_min_bytes_per_sec,
    }
}

/// A body that took longer than its time allowance.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time (server.body_read_timeout_ms, server.body_min_bytes_per_sec)")]
pub struct BodyTimeout;

/// A request body that fails with [`BodyTimeout`] once it takes longer than
/// `body_read_timeout_ms` plus the bytes received so far at `body_min_bytes_per_sec`: a body
/// that stops, or drips slower than that rate, ends within the allowance.
pub struct Timed<B> {
    inner: B,
    started: Instant,
    timeout: Duration,
    min_rate: u64,
    received: u64,
    sleep: Pin<Box<Sleep>>,
    expired: Arc<AtomicBool>,
    /// Held while the body arrives (counted in the connection's [`Receiving`]).
    receipt: Option<Receipt>,
}

impl<B: Body> Timed<B> {
    pub fn new(inner: B, server: &BodyLimits) -> Timed<B> {
        let started = Instant::now();
        let timeout = Duration::from_millis(server.body_read_timeout_ms);
        let receipt = if inner.is_end_stream() {
            None
        } else {
            RECEIVING.try_with(|r| r.clone().begin()).ok()
        };
        Timed {
            receipt,
            inner,
            started,
            timeout,
            min_rate: server.body_min_bytes_per_sec.max(1),
            received: 0,
            sleep: Box::pin(tokio::time::sleep_until(started + timeout)),
            expired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Set once the body has timed out (to tell a timeout from other failures after the body
    /// was handed to the upstream client).
    pub fn expired_flag(&self) -> Arc<AtomicBool> {
        self.expired.clone()
    }

    fn deadline(&self) -> Instant {
        let allowance = Duration::from_secs_f64(self.received as f64 / self.min_rate as f64);
        self.started + self.timeout + allowance
    }
}

impl<B> Body for Timed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    let deadline = this.deadline();
                    this.sleep.as_mut().reset(deadline);
                }
                if this.inner.is_end_stream() {
                    this.receipt = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.receipt = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.receipt = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.receipt = None;
                    this.expired.store(true, Ordering::SeqCst);
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How much a JSON text would cost to parse: its values (containers, scalars, object members)
/// and its deepest nesting, counted from the bytes without building anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonShape {
    pub elements: usize,
    pub depth: usize,
}

/// Counts the shape of `bytes`, stopping as soon as it exceeds `max_elements` or `max_depth`
/// (the figures are then just past the limit). Strings are skipped with their escapes; the text
/// is not validated (the parser does that next): a malformed text gets some count.
pub fn json_shape(bytes: &[u8], max_elements: usize, max_depth: usize) -> JsonShape {
    let mut shape = JsonShape {
        elements: 0,
        depth: 0,
    };
    let mut depth = 0usize;
    // Whether the previous significant byte ended a value or started one (so a scalar's later
    // bytes are not counted again).
    let mut in_scalar = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' => {
                shape.elements += 1;
                in_scalar = false;
                i += 1;
                while i < bytes.len() {
                    match bytes[i] {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
            }
            b'[' | b'{' => {
                shape.elements += 1;
                depth += 1;
                shape.depth = shape.depth.max(depth);
                in_scalar = false;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                in_scalar = false;
            }
            b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => in_scalar = false,
            _ => {
                if !in_scalar {
                    shape.elements += 1;
                    in_scalar = true;
                }
            }
        }
        if shape.elements > max_elements || shape.depth > max_depth {
            return shape;
        }
        i += 1;
    }
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_counts_values_and_depth() {
        let shape = |s: &str| json_shape(s.as_bytes(), usize::MAX, usize::MAX);
        assert_eq!(
            shape(r#"{}"#),
            JsonShape {
                elements: 1,
                depth: 1
            }
        );
        assert_eq!(
            shape(r#"{"a": [1, 22, true, null, "x\"]"], "b": {"c": -1.5e3}}"#),
            JsonShape {
                elements: 12,
                depth: 2
            }
        );
        assert_eq!(
            shape(r#""[[[[""#),
            JsonShape {
                elements: 1,
                depth: 0
            }
        );
        assert_eq!(shape("[[[[]]]]").depth, 4);
        // Stops early, just past the limit.
        let many = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(json_shape(many.as_bytes(), 10, 64).elements, 11);
        assert_eq!(json_shape(b"[[[[[[", 100, 3).depth, 4);
        // Malformed or truncated input still ends.
        for bad in [&b"\"\\"[..], b"\"abc", b"]]]}", b"\xff\xfe"] {
            json_shape(bad, usize::MAX, usize::MAX);
        }
    }
}
