//! The listener: accepts TCP connections and serves HTTP/1.1 and h2c (HTTP/2 with prior
//! knowledge) on the same port, with TCP_NODELAY, a header read timeout, a connection limit
//! (a semaphore), and a graceful shutdown that stops accepting, lets in-flight requests and
//! streams finish up to a deadline, then cuts what is left.
//!
//! Every connection task is tracked in a `JoinSet`, so nothing outlives the server.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::ValidConfig;
use crate::router;
use crate::state::{AppState, StateError};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
}

/// A bound, not yet serving, proxy.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    /// Binds `config.server.listen` and builds the application state.
    pub async fn bind(config: ValidConfig) -> Result<Server, ServerError> {
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let state = Arc::new(AppState::new(config).await?);
        Ok(Server { listener, state })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| self.state.config.server.listen)
    }

    /// Serves until `shutdown` completes, then drains within `server.shutdown_grace_ms`.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, state } = self;
        let server_cfg = &state.config.server;
        let grace = server_cfg.shutdown_grace();
        let connections = Arc::new(Semaphore::new(server_cfg.max_connections));
        let graceful = GracefulShutdown::new();
        let mut tasks = JoinSet::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(server_cfg.header_read_timeout());
        builder.http2().timer(TokioTimer::new());

        tokio::pin!(shutdown);
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = &mut shutdown => break,
            };
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, do not spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let service_state = state.clone();
            let service = service_fn(move |req| {
                let state = service_state.clone();
                async move { Ok::<_, Infallible>(router::handle(state, req).await) }
            });
            let watcher = graceful.watcher();
            let builder = builder.clone();
            let span = tracing::debug_span!("connection", %peer);
            tasks.spawn(
                async move {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
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
        tokio::select! {
            () = graceful.shutdown() => tracing::info!("all connections drained"),
            () = tokio::time::sleep(grace) => {
                tracing::warn!(
                    grace_ms = grace.as_millis() as u64,
                    "shutdown grace period over: cutting the remaining connections"
                );
                tasks.abort_all();
            }
        }
        while tasks.join_next().await.is_some() {}
        state.shutdown().await;
    }
}

/// A server running on its own task, for tests, the demo and the benchmark.
pub struct RunningServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Binds and starts serving `config` on a task of the current runtime.
    pub async fn start(config: ValidConfig) -> Result<RunningServer, ServerError> {
        let server = Server::bind(config).await?;
        let addr = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            server
                .serve(async {
                    let _ = stopped.await;
                })
                .instrument(tracing::info_span!("server", %addr)),
        );
        Ok(RunningServer {
            addr,
            stop: Some(stop),
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Begins the graceful shutdown without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts down gracefully and waits until every connection is closed.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        self.finished().await;
    }

    /// Waits for the server to finish (after [`RunningServer::begin_shutdown`]).
    pub async fn finished(self) {
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "server task failed");
        }
    }
}
