//! The mock's HTTP server: the accept loop, one task per connection serving HTTP/1.1 or h2c
//! (`hyper_util`'s auto builder, `TCP_NODELAY`), and the handle that stops them.
//!
//! Shutdown follows mini-redis: the handle owns a `watch` sender whose closing tells every task
//! to stop, and every task holds a clone of one `mpsc` sender, so the handle knows all tasks have
//! finished when its receiver reports that every sender is gone.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info_span, warn, Instrument, Span};

use super::ctx::{Ctx, Lifecycle};
use super::state::State;
use super::{routes, MockConfig};

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(20);

/// The handle's side of the lifecycle.
#[derive(Debug)]
pub(crate) struct Handle {
    stop: watch::Sender<bool>,
    finished: mpsc::Receiver<()>,
}

impl Handle {
    /// Tells every task to stop and waits until all of them have finished.
    pub(crate) async fn shutdown(self) {
        let Handle { stop, mut finished } = self;
        stop.send_replace(true);
        drop(stop);
        while finished.recv().await.is_some() {}
    }
}

/// Starts serving `listener` in the background.
pub(crate) fn start(listener: TcpListener, state: Arc<State>, config: MockConfig) -> Handle {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (running, finished) = mpsc::channel(1);
    let name_header = match config.name.as_str() {
        "" => None,
        name => HeaderValue::from_str(name)
            .map_err(|_| warn!(name, "mock name is not a valid header value; not sent"))
            .ok(),
    };
    let ctx = Ctx {
        state,
        config: Arc::new(config),
        name_header,
        life: Lifecycle::new(stop_rx, running),
    };
    let addr = listener.local_addr().ok();
    let span = info_span!("mock_upstream", name = %ctx.config.name, addr = ?addr);
    tokio::spawn(accept_loop(listener, ctx).instrument(span));
    Handle {
        stop: stop_tx,
        finished,
    }
}

async fn accept_loop(listener: TcpListener, ctx: Ctx) {
    let builder = auto::Builder::new(SpannedExecutor);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = ctx.life.stopping() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(error = %err, "accept failed");
                if !ctx.life.sleep(ACCEPT_RETRY_DELAY).await {
                    break;
                }
                continue;
            }
        };
        let span = info_span!("mock_connection", %peer);
        tokio::spawn(serve_connection(builder.clone(), stream, ctx.clone()).instrument(span));
    }
    debug!("mock upstream stopped accepting");
}

async fn serve_connection(builder: auto::Builder<SpannedExecutor>, stream: TcpStream, ctx: Ctx) {
    if let Err(err) = stream.set_nodelay(true) {
        debug!(error = %err, "could not set TCP_NODELAY");
    }
    let life = ctx.life.clone();
    let service = service_fn(move |request| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(routes::handle(ctx, request).await) }
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        served = connection => {
            if let Err(err) = served {
                debug!(error = %err, "connection ended with an error");
            }
        }
        () = life.stopping() => debug!("connection closed: mock shutting down"),
    }
}

/// Runs hyper's HTTP/2 stream tasks on tokio inside the connection's span.
#[derive(Debug, Clone, Copy)]
struct SpannedExecutor;

impl<F> hyper::rt::Executor<F> for SpannedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(future.instrument(Span::current()));
    }
}
