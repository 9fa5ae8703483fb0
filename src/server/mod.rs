//! The listener: accepts TCP connections and serves HTTP/1.1 and h2c (HTTP/2 with prior
//! knowledge) on the same port, with TCP_NODELAY, a header read timeout, a connection limit
//! (a semaphore), and a graceful shutdown that stops accepting, lets in-flight requests and
//! streams finish up to a deadline, then cuts what is left.
//!
//! Every connection task is tracked in a `JoinSet`, so nothing outlives the server.
//!
//! Every connection has a watchdog: it must complete a request head within
//! `header_read_timeout_ms` of being accepted (hyper's own header timeout does not cover
//! hyper-util's HTTP/1-or-2 detection, nor HTTP/2), and a connection with no request in flight
//! is closed after `idle_timeout_ms`. A request counts as in flight from its head until its
//! response body has been sent or dropped. The watchdog sleeps until the next deadline (at
//! most half `idle_timeout_ms`) and reads the connection's counters then: a request costs it
//! two atomic updates and a clock read, no wake-up.
//!
//! At `max_connections`, a new connection does not wait behind silent, idle or slow ones: the
//! connection idle the longest (no request in flight: silent since its accept, or an idle
//! keep-alive) is closed to make room; when none is idle, the one that has waited the longest
//! on its client's request body (a slow or stalled upload: nothing of the client's is being
//! worked on). Only when every connection has a request being worked on does a new one wait
//! for a slot.
//!
//! Stopping goes in steps, each cut short by the next [`Stop`]: the drain window (`/readyz`
//! answers 503 while new connections are still served, so a load balancer moves away; skipped
//! by [`Stop::Now`]), then the grace (no new connections; in-flight requests and streams
//! finish; a connection still receiving a request body is closed at once, without waiting for
//! its `body_read_timeout_ms`), then the rest is cut. The listening socket has `SO_REUSEADDR`, so a proxy started
//! again on the same port right after binds while the old connections are in `TIME_WAIT`.

mod config;
pub mod router;

pub use config::ServerConfig;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

use crate::http::body::{BoxError, ProxyBody};
use crate::http::request_body::{self, Receiving};
use crate::routes::shared::Shared;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    // The I/O error is in the message, not a `source`, so that it is said once.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

/// A write past the process's `RLIMIT_FSIZE` (the traffic recorder, the fs store) raises
/// `SIGXFSZ`, whose default action ends the process. Its handler is replaced once, for the
/// process's life (tokio never removes a signal handler it installed), so such a write fails
/// with `EFBIG` like any full disk, and is handled as one: fail open, with a warning.
fn survive_file_size_limit() {
    #[cfg(target_os = "linux")]
    {
        /// `SIGXFSZ` on Linux.
        const SIGXFSZ: i32 = 25;
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let kind = tokio::signal::unix::SignalKind::from_raw(SIGXFSZ);
            if let Err(e) = tokio::signal::unix::signal(kind) {
                tracing::warn!(error = %e, "cannot catch SIGXFSZ: a write past the file size limit would end the process");
            }
        });
    }
}

/// The connections served at once: `max_connections`, or fewer when the process may not open
/// that many files. The soft `RLIMIT_NOFILE` is first raised to the hard one; then each
/// connection may need two descriptors (the client's and, with a request in flight, the
/// upstream's), beside a reserve for the listener, the store, logs and the pools. Past the
/// limit the idlest connection is evicted, which running out of descriptors cannot do.
fn connection_limit(max_connections: usize) -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut files = getrlimit(Resource::Nofile);
    if let (Some(current), Some(hard)) = (files.current, files.maximum) {
        if current < hard {
            files.current = Some(hard);
            match setrlimit(Resource::Nofile, files) {
                Ok(()) => {}
                Err(e) => {
                    files.current = Some(current);
                    tracing::debug!(error = %e, "cannot raise the open files limit");
                }
            }
        }
    }
    let Some(open_files) = files.current.and_then(|n| usize::try_from(n).ok()) else {
        return max_connections;
    };
    let reserve = (open_files / 4).min(64);
    let limit = (open_files.saturating_sub(reserve) / 2).max(1);
    if limit < max_connections {
        tracing::warn!(
            open_files,
            max_connections,
            limit,
            "the open files limit (ulimit -n) allows fewer connections than server.max_connections: idle ones are evicted past this many"
        );
        return limit;
    }
    max_connections
}

/// A request to stop the server (from a signal, or a test). The first one starts the shutdown;
/// each further one, whichever kind, cuts the current step short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Drain first: `/readyz` answers 503 while new connections are still accepted for
    /// `server.drain_window_ms`, so a load balancer moves away (SIGTERM, or SIGINT without a
    /// terminal).
    Drain,
    /// No drain window: stop accepting at once, then let in-flight requests finish within
    /// `server.shutdown_grace_ms` (a Ctrl-C in a terminal: no load balancer to warn).
    Now,
}

/// The [`Stop`]s a server receives. When every sender is gone no more will come: the current
/// step then runs its course.
pub type Stops = mpsc::UnboundedReceiver<Stop>;

/// The next stop; never completes once the senders are gone.
async fn next_stop(stops: &mut Stops) -> Stop {
    match stops.recv().await {
        Some(stop) => stop,
        None => std::future::pending().await,
    }
}

/// Backlog of the listening socket (what `TcpListener::bind` uses).
const LISTEN_BACKLOG: u32 = 1024;

/// A bound, not yet serving, proxy.
pub struct Server {
    listener: TcpListener,
    config: ServerConfig,
    state: Arc<Shared>,
}

/// A bound listening socket, before the state it will serve is built (so that a port in use
/// fails before the store is opened).
pub struct Listener {
    listener: TcpListener,
    config: ServerConfig,
}

impl Listener {
    /// Binds `config.listen`.
    pub fn bind(config: &ServerConfig) -> Result<Listener, ServerError> {
        survive_file_size_limit();
        let addr = config.listen;
        let listener = listen(addr).map_err(|error| ServerError::Bind { addr, error })?;
        Ok(Listener {
            listener,
            config: config.clone(),
        })
    }

    /// The server of `state` on this socket.
    pub fn serving(self, state: Arc<Shared>) -> Server {
        Server {
            listener: self.listener,
            config: self.config,
            state,
        }
    }
}

impl Server {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Serves until `shutdown` completes, then drains (the drain window, then in-flight
    /// requests within `server.shutdown_grace_ms`).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let (stop, stops) = mpsc::unbounded_channel();
        let serving = self.serve_until(stops);
        tokio::pin!(serving);
        tokio::select! {
            () = &mut serving => return,
            () = shutdown => {
                let _ = stop.send(Stop::Drain);
            }
        }
        serving.await;
    }

    /// Serves until the first of `stops`, then shuts down in steps, each cut short by the next
    /// stop (see the module doc).
    pub async fn serve_until(self, mut stops: Stops) {
        let Server {
            listener,
            config,
            state,
        } = self;
        let server_cfg = &config;
        let grace = server_cfg.shutdown_grace();
        let connections = Arc::new(Semaphore::new(connection_limit(server_cfg.max_connections)));
        let graceful = GracefulShutdown::new();
        let mut tasks = JoinSet::new();
        let mut accept_errors = AcceptErrors::default();
        // Set when the shutdown grace is over: event streams still open end with an error event.
        let (grace_over_tx, grace_over_rx) = watch::channel(false);
        // Set when the grace begins: connections still receiving a request body close at once.
        let (stopping_tx, stopping_rx) = watch::channel(false);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            // hyper's timer also bounds the idle wait between two requests of a keep-alive
            // connection: no shorter than the idle timeout, so idle connections live
            // `idle_timeout_ms` as documented. The watchdog enforces the first head's deadline.
            .header_read_timeout(
                server_cfg
                    .header_read_timeout()
                    .max(server_cfg.idle_timeout()),
            );
        builder.http2().timer(TokioTimer::new());

        let drain_window = server_cfg.drain_window();
        let mut draining_since = None;
        let open = Arc::new(OpenConnections::new());
        loop {
            while tasks.try_join_next().is_some() {}
            let stop = stop_accepting(&mut stops, &mut draining_since, &state, drain_window);
            tokio::pin!(stop);
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: log (at most once per
                        // ACCEPT_ERROR_LOG_EVERY), wait a little rather than spin, go on.
                        accept_errors.failed(&e);
                        tokio::select! {
                            () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                            () = &mut stop => break,
                        }
                        continue;
                    }
                },
                () = &mut stop => break,
            };
            let permit = match connections.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    // Full: make room by closing the connection idle the longest, if any;
                    // else wait until a connection ends.
                    if !open.evict_idlest() {
                        tracing::debug!(
                            "max_connections reached, all busy: the new connection waits"
                        );
                    }
                    tokio::select! {
                        permit = connections.clone().acquire_owned() => match permit {
                            Ok(p) => p,
                            Err(_) => break,
                        },
                        () = &mut stop => break,
                    }
                }
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let service_state = state.clone();
            let grace_over = grace_over_rx.clone();
            let conn_state = open.insert();
            let activity = conn_state.activity.clone();
            let service = service_fn(move |req| {
                let state = service_state.clone();
                let in_flight = InFlight::begin(activity.clone());
                let grace_over = grace_over.clone();
                let receiving = activity.receiving.clone();
                async move {
                    let response =
                        request_body::receiving_into(receiving, router::handle(state, req)).await;
                    let is_event_stream =
                        crate::upstream::relay::is_event_stream(response.headers());
                    Ok::<_, Infallible>(response.map(|body| Tracked {
                        body,
                        _in_flight: in_flight,
                        cut: is_event_stream.then(|| Cut::new(grace_over)),
                    }))
                }
            });
            let watcher = graceful.watcher();
            let builder = builder.clone();
            let span = tracing::debug_span!("connection", %peer);
            let (head_timeout, idle_timeout) =
                (server_cfg.header_read_timeout(), server_cfg.idle_timeout());
            let stopping = stopping_rx.clone();
            tasks.spawn(
                async move {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        served = watcher.watch(conn) => if let Err(e) = served {
                            tracing::debug!(error = %e, "connection ended with an error");
                        },
                        why = watchdog(&conn_state.activity, head_timeout, idle_timeout, stopping) => {
                            tracing::debug!(why, "connection closed");
                        }
                    }
                    drop(conn_state);
                    drop(permit);
                }
                .instrument(span),
            );
        }

        drop(listener);
        state.begin_draining();
        tracing::info!(
            connections = graceful.count(),
            "shutting down: draining in-flight requests"
        );
        let drained = graceful.shutdown();
        tokio::pin!(drained);
        stopping_tx.send_replace(true);
        let cut = tokio::select! {
            () = &mut drained => {
                tracing::info!("all connections drained");
                false
            }
            () = tokio::time::sleep(grace) => {
                tracing::warn!(
                    grace_ms = grace.as_millis() as u64,
                    "shutdown grace period over: cutting the remaining connections"
                );
                true
            }
            _ = next_stop(&mut stops) => {
                tracing::warn!("stopped again: cutting the remaining connections now");
                true
            }
        };
        if cut {
            // Event streams end with a final error event; whatever is still open after
            // a moment to send it is cut.
            grace_over_tx.send_replace(true);
            tokio::select! {
                () = &mut drained => {}
                () = tokio::time::sleep(CUT_FLUSH) => {}
            }
            tasks.abort_all();
        }
        while tasks.join_next().await.is_some() {}
        state.shutdown().await;
    }
}

/// Completes when the accept loop must stop: once the first stop has come (then `/readyz`
/// answers 503) and the drain window after it has passed: none for [`Stop::Now`], cut short by
/// a further stop. Cancel-safe: what it has seen is kept in `draining_until`.
async fn stop_accepting(
    stops: &mut Stops,
    draining_until: &mut Option<Instant>,
    state: &Shared,
    window: Duration,
) {
    let until = match *draining_until {
        Some(until) => until,
        None => {
            let first = next_stop(stops).await;
            state.begin_draining();
            let window = match first {
                Stop::Drain => window,
                Stop::Now => Duration::ZERO,
            };
            if !window.is_zero() {
                tracing::info!(
                    drain_window_ms = window.as_millis() as u64,
                    "shutting down: /readyz answers 503, still accepting for \
                     server.drain_window_ms (stop again to skip it)"
                );
            }
            *draining_until.insert(Instant::now() + window)
        }
    };
    if Instant::now() >= until {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        _ = next_stop(stops) => {
            tracing::info!("stopped again: the rest of the drain window is skipped");
        }
    }
}

/// A listening socket on `addr` with `SO_REUSEADDR` (on Unix: binding succeeds while
/// connections of a process that just stopped are still in `TIME_WAIT`; on Windows the option
/// would let another process take the port, so it is left unset there).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How long the accept loop waits after a failed accept (out of file descriptors, …).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// At most one log line per this long about failed accepts, with how many there were.
const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(5);

/// Failed accepts, logged at most once per [`ACCEPT_ERROR_LOG_EVERY`].
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    since_logged: u64,
}

impl AcceptErrors {
    fn failed(&mut self, e: &std::io::Error) {
        self.since_logged += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_some_and(|last| now.duration_since(last) < ACCEPT_ERROR_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            error = %e,
            failures = self.since_logged,
            "accept failed (out of file descriptors?): pausing new connections briefly"
        );
        self.last_logged = Some(now);
        self.since_logged = 0;
    }
}

/// What a connection is doing, as its watchdog (and an eviction) sees it.
struct Activity {
    /// Requests whose head was read and whose response body is not yet sent.
    in_flight: AtomicUsize,
    /// Whether a request has begun on this connection.
    begun: AtomicBool,
    /// When the connection was accepted or its last request ended, in ns after `epoch`.
    idle_since: AtomicU64,
    epoch: Instant,
    /// The request bodies the connection is receiving now.
    receiving: Arc<Receiving>,
    /// Set to close the connection now (to make room at `max_connections`).
    evicted: Notify,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        let activity = Activity {
            in_flight: AtomicUsize::new(0),
            begun: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            epoch,
            receiving: Arc::new(Receiving::new(epoch)),
            evicted: Notify::new(),
        };
        activity.mark_idle();
        activity
    }

    fn mark_idle(&self) {
        let since = Instant::now().saturating_duration_since(self.epoch);
        self.idle_since
            .store(since.as_nanos() as u64, Ordering::Release);
    }

    /// When the connection has been idle since, or `None` while a request is in flight.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let nanos = self.idle_since.load(Ordering::Acquire);
        Some(self.epoch + Duration::from_nanos(nanos))
    }

    /// When the connection began waiting on its client's request body, while every request in
    /// flight on it is still receiving its body (nothing of the client's is being worked on);
    /// else `None`.
    fn waiting_on_body_since(&self) -> Option<Instant> {
        let since = self.receiving.since()?;
        (self.in_flight.load(Ordering::Acquire) <= self.receiving.bodies()).then_some(since)
    }

    /// Whether closing the connection loses no work: idle, or waiting on a request body.
    fn evictable(&self) -> bool {
        self.idle_since().is_some() || self.waiting_on_body_since().is_some()
    }
}

/// The open connections, to find the one idle the longest when `max_connections` is reached.
struct OpenConnections {
    by_id: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    epoch: Instant,
}

impl OpenConnections {
    fn new() -> OpenConnections {
        OpenConnections {
            by_id: Mutex::default(),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Registers a new connection; it leaves the set when the returned guard is dropped.
    fn insert(self: &Arc<Self>) -> OpenConnection {
        let activity = Arc::new(Activity::new(self.epoch));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, activity.clone());
        OpenConnection {
            id,
            activity,
            open: self.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.by_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the connection with no request in flight that has been idle the longest (a silent
    /// one first, by age); when none is idle, the one waiting the longest on a request body.
    /// False when every connection has a request being worked on.
    fn evict_idlest(&self) -> bool {
        let open = self.lock();
        let oldest = |since: fn(&Activity) -> Option<Instant>| {
            open.values()
                .filter_map(|a| since(a).map(|since| (since, a)))
                .min_by_key(|(since, _)| *since)
        };
        let idlest =
            oldest(Activity::idle_since).or_else(|| oldest(Activity::waiting_on_body_since));
        match idlest {
            Some((_, activity)) => {
                activity.evicted.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A connection's entry in [`OpenConnections`], removed on drop.
struct OpenConnection {
    id: u64,
    activity: Arc<Activity>,
    open: Arc<OpenConnections>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

/// One request in flight on a connection, from its head until its response body is dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: Arc<Activity>) -> InFlight {
        activity.begun.store(true, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The time first: a watchdog that sees no request in flight sees when the last ended.
        self.0.mark_idle();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until it is sent or dropped.
struct Tracked {
    body: ProxyBody,
    _in_flight: InFlight,
    /// For an event stream: ends it with an error event when the shutdown grace is over.
    cut: Option<Cut>,
}

/// The end of an event stream cut at shutdown.
struct Cut {
    grace_over: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The last data sent ended an event: an error event can follow without breaking one.
    at_boundary: bool,
    done: bool,
}

impl Cut {
    fn new(mut grace_over: watch::Receiver<bool>) -> Cut {
        Cut {
            grace_over: Box::pin(async move {
                // An error means the server is gone: never cut then, the task is aborted.
                if grace_over.wait_for(|over| *over).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }),
            at_boundary: true,
            done: false,
        }
    }
}

/// Time given to event streams to send their final error event once the grace is over.
const CUT_FLUSH: Duration = Duration::from_millis(200);

/// The last event of a stream cut at shutdown, in the OpenAI error shape.
fn shutdown_event() -> Bytes {
    crate::wire::sse::data_event(&crate::wire::error::openai_error(
        "the proxy is shutting down and its grace period is over; send the request again",
        "server_error",
        None,
        Some("server_shutting_down"),
    ))
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(cut) = &mut this.cut {
            if cut.done {
                return Poll::Ready(None);
            }
            if cut.grace_over.as_mut().poll(cx).is_ready() {
                cut.done = true;
                return Poll::Ready(Some(if cut.at_boundary {
                    Ok(http_body::Frame::data(shutdown_event()))
                } else {
                    Err(BoxError::from(
                        "cut mid-event at the end of the shutdown grace",
                    ))
                }));
            }
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let (Some(cut), Poll::Ready(Some(Ok(frame)))) = (&mut this.cut, &polled) {
            if let Some(data) = frame.data_ref().filter(|d| !d.is_empty()) {
                cut.at_boundary = crate::upstream::relay::ends_event(data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.cut.as_ref().is_some_and(|c| c.done) || self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.cut {
            Some(_) => http_body::SizeHint::default(),
            None => self.body.size_hint(),
        }
    }
}

/// Completes when the connection should be closed: no request head within `head_timeout` of
/// the accept, no request in flight for `idle_timeout`, evicted, or waiting on a request body
/// once `stopping` is set. Says why. It sleeps until
/// the next possible deadline and looks at the counters then, so requests never wake it; while
/// a request is in flight or none has begun yet it looks at least every half `idle_timeout`
/// (a request may begin and end in between), so an idle connection closes between
/// `idle_timeout` and 1.5× that after its last request.
async fn watchdog(
    activity: &Activity,
    head_timeout: Duration,
    idle_timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) -> &'static str {
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    let evicted = activity.evicted.notified();
    tokio::pin!(evicted);
    loop {
        let is_stopping = *stopping.borrow_and_update();
        if is_stopping && activity.waiting_on_body_since().is_some() {
            return "closed at shutdown: still receiving its request body";
        }
        let now = Instant::now();
        let look_again = now + idle_timeout / 2;
        let wake = match activity.idle_since() {
            None => look_again,
            Some(since) if !activity.begun.load(Ordering::Relaxed) => {
                if now >= since + head_timeout {
                    return "no request head within server.header_read_timeout_ms";
                }
                (since + head_timeout).min(look_again)
            }
            Some(since) => {
                if now >= since + idle_timeout {
                    return "idle for server.idle_timeout_ms";
                }
                since + idle_timeout
            }
        };
        sleep.as_mut().reset(wake);
        tokio::select! {
            () = &mut sleep => {}
            () = &mut evicted => {
                // Chosen while it lost no work by closing; a request may have got on since:
                // then it stays open.
                if activity.evictable() {
                    return "closed to make room: server.max_connections reached";
                }
                evicted.set(activity.evicted.notified());
            }
            // Once stopping, look again whenever a body begins.
            changed = stopping.changed(), if !is_stopping => {
                if changed.is_err() {
                    return "the server stopped";
                }
            }
            () = activity.receiving.began(), if is_stopping => {}
        }
    }
}
