//! What every request handler shares: the parts the composition root built from the
//! configuration (upstreams, context management, auth, metrics, the body budget, the
//! background services) and the few settings the routes read. Never the whole configuration.
//!
//! The listener (`server`) serves one [`Shared`] and calls [`Shared::shutdown`] once its
//! connections are drained; handlers only read it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::Auth;
use crate::context::ContextManager;
use crate::http::request_body::{BodyBudget, BodyLimits};
use crate::recorder::Recorder;
use crate::service::Service;
use crate::store::StoreConfig;
use crate::summarizer::Summarizer;
use crate::telemetry::metrics::Metrics;
use crate::upstream::Upstreams;

/// What every request handler shares.
pub struct Shared {
    /// The limits a request body is read under (`[server]`).
    pub body_limits: BodyLimits,
    /// How long an idle keep-alive connection stays open (`server.idle_timeout_ms`), which
    /// HTTP/1 responses announce.
    pub idle_timeout: Duration,
    /// The `[store]` section: its backend's name labels metrics, `on_error` and
    /// `op_timeout_ms` say how a request treats a failing store.
    pub store: StoreConfig,
    /// The client keys the proxy knows (`crate::auth`).
    pub auth: Auth,
    pub upstreams: Upstreams,
    pub context: ContextManager,
    pub metrics: Metrics,
    /// Request-body bytes held in memory, over all requests (`server.max_body_bytes_in_flight`).
    pub body_budget: BodyBudget,
    /// The traffic recorder, when `[record]` is enabled.
    pub recorder: Option<Arc<Recorder>>,
    /// The summarizer service, when `[context.summarizer] enabled`.
    pub summarizer: Option<Arc<Summarizer>>,
    /// The page (`/ui/`), when `[ui] enabled`.
    pub ui: Option<UiState>,
    /// Set once shutdown begins: `/readyz` then answers 503 so load balancers move away.
    pub draining: AtomicBool,
    /// Running background services, in the order they were started.
    pub services: Mutex<Vec<Arc<dyn Service>>>,
}

/// What the page (`/ui/`) holds: its settings, the logins it handed out and the writer of
/// its journal lines.
pub struct UiState {
    pub config: crate::sessions::UiConfig,
    pub logins: crate::auth::Logins,
    pub journal: Arc<crate::sessions::journal::JournalWriter>,
}

impl UiState {
    pub fn new(
        config: crate::sessions::UiConfig,
        journal: Arc<crate::sessions::journal::JournalWriter>,
    ) -> UiState {
        let logins = crate::auth::Logins::new(
            config.max_logins,
            Duration::from_secs(config.login_ttl_secs),
        );
        UiState {
            config,
            logins,
            journal,
        }
    }
}

impl Shared {
    /// Adds a running service, to be stopped by [`Shared::shutdown`].
    pub fn register(&self, service: Arc<dyn Service>) {
        self.services
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(service);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Marks the proxy as draining (`/readyz` answers 503 from now on).
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Stops every background service, last started first. Requests still work afterwards,
    /// without the services.
    pub async fn shutdown(&self) {
        let services =
            std::mem::take(&mut *self.services.lock().unwrap_or_else(|e| e.into_inner()));
        for service in services.iter().rev() {
            tracing::debug!(service = service.name(), "stopping");
            service.stop().await;
        }
    }
}
