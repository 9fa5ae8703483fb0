//! Serving the whole configuration: the listener bound, the application state built, the
//! server returned to be served ([`bind`], what the binary runs), or run on a task of its own
//! ([`RunningServer`], for tests, the demo and the benchmark).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::Instrument;

use crate::app::config::ValidConfig;
use crate::app::state::{self, StateError};
use crate::server::{Listener, Server, ServerError};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Binds `server.listen`, then builds the application state (so a port in use fails first).
pub async fn bind(config: ValidConfig) -> Result<Server, StartError> {
    let listener = Listener::bind(&config.server)?;
    let state = Arc::new(state::build(&config).await?);
    Ok(listener.serving(state))
}

/// A server running on its own task, for tests, the demo and the benchmark.
pub struct RunningServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Binds and starts serving `config` on a task of the current runtime.
    pub async fn start(config: ValidConfig) -> Result<RunningServer, StartError> {
        let server = bind(config).await?;
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
