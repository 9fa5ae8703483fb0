//! What a request handler of the mock holds: [`Ctx`], the shared state and config, and the
//! [`Lifecycle`] that tells a task the mock is stopping. Apart from the server so that the
//! handlers (`routes`, `chat`, `sse`) and the server that calls them do not import each other.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::{mpsc, watch};

use super::state::State;
use super::MockConfig;

/// What every task of a running mock holds: the stop signal, and a token whose drop tells the
/// handle the task has finished.
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    stop: watch::Receiver<bool>,
    _running: mpsc::Sender<()>,
}

impl Lifecycle {
    pub(crate) fn new(stop: watch::Receiver<bool>, running: mpsc::Sender<()>) -> Lifecycle {
        Lifecycle {
            stop,
            _running: running,
        }
    }

    /// Resolves once the mock is shutting down (or its handle was dropped).
    pub(crate) async fn stopping(&self) {
        let mut stop = self.stop.clone();
        // An error means the handle is gone, which is a stop too.
        let _ = stop.wait_for(|stopped| *stopped).await;
    }

    /// Sleeps for `delay`; false when the mock started shutting down first.
    pub(crate) async fn sleep(&self, delay: Duration) -> bool {
        if delay.is_zero() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.stopping() => false,
        }
    }

    /// Runs `future` unless the mock starts shutting down first.
    pub(crate) async fn unless_stopping<F: Future>(&self, future: F) -> Option<F::Output> {
        tokio::select! {
            output = future => Some(output),
            () = self.stopping() => None,
        }
    }
}

/// What request handlers need.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) state: Arc<State>,
    pub(crate) config: Arc<MockConfig>,
    /// `x-mock-name`, when the mock has a (header-safe) name.
    pub(crate) name_header: Option<HeaderValue>,
    pub(crate) life: Lifecycle,
}
