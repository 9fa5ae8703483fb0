//! Application state: what every request handler shares (the validated config, the upstreams,
//! context management, metrics), and the background services that live as long as the proxy.
//!
//! The listener (`server`) builds one [`AppState`] at start-up and calls [`AppState::shutdown`]
//! once its connections are drained; handlers only read it. Neither imports the other's
//! internals: `server` → `router` → routes → `state`, never back.
//!
//! Background services (the store's sweeper, the summarizer, the traffic recorder) are
//! registered here when the state is built and stopped here, last started first stopped, so
//! nothing outlives the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::config::ValidConfig;
use crate::context::ContextManager;
use crate::metrics::Metrics;
use crate::record::Recorder;
use crate::store::{Store, StoreError};
use crate::tokens::{Counter, Encoding};
use crate::upstream::{UpstreamSetupError, Upstreams};

/// A task that runs beside the request path and must be stopped at shutdown.
#[async_trait]
pub trait Service: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &'static str;
    /// Stops the service and waits until it has stopped.
    async fn stop(&self);
}

/// What every request handler shares.
pub struct AppState {
    pub config: ValidConfig,
    /// The client keys the proxy knows (`crate::auth`).
    pub auth: crate::auth::Auth,
    pub upstreams: Upstreams,
    pub context: ContextManager,
    pub metrics: Metrics,
    /// Request-body bytes held in memory, over all requests (`server.max_body_bytes_in_flight`).
    pub body_budget: crate::request_body::BodyBudget,
    /// The traffic recorder, when `[record]` is enabled.
    pub recorder: Option<Arc<Recorder>>,
    /// The summarizer service, when `[context.summarizer] enabled`.
    pub summarizer: Option<Arc<crate::summarize::Summarizer>>,
    /// Set once shutdown begins: `/readyz` then answers 503 so load balancers move away.
    draining: AtomicBool,
    /// Running background services, in the order they were started.
    services: Mutex<Vec<Arc<dyn Service>>>,
}

/// Why the state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Upstream(#[from] UpstreamSetupError),
    #[error("cannot open the store: {0}")]
    Store(StoreError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthSetupError),
    #[error("cannot start the traffic recorder in {dir}: {source}")]
    Record { dir: String, source: std::io::Error },
    #[error("context.summarizer.upstream names no configured upstream: {0}")]
    SummarizerUpstream(String),
}

/// The store's background sweeper, seen as a service.
struct StoreSweeper(Arc<dyn Store>);

#[async_trait]
impl Service for StoreSweeper {
    fn name(&self) -> &'static str {
        "store sweeper"
    }

    async fn stop(&self) {
        self.0.close().await;
    }
}

impl AppState {
    /// Builds the upstream clients, opens the store and starts the background services.
    pub async fn new(config: ValidConfig) -> Result<AppState, StateError> {
        let upstreams = Upstreams::new(&config.upstreams, |var| std::env::var(var).ok())?;
        let auth = crate::auth::Auth::new(&config, |var| std::env::var(var).ok())?;
        let store = crate::store::open(&config.store)
            .await
            .map_err(StateError::Store)?;
        let counter = Counter::new(Encoding::O200kBase, config.tokens.clone());
        let metrics = Metrics::default();
        let summarizer =
            crate::summarize::start(&config.context.summarizer, &upstreams, &store, &metrics)
                .map_err(StateError::SummarizerUpstream)?;
        let context = ContextManager::new(config.context.clone(), counter, store.clone())
            .with_content_refresh(config.store.content_refresh())
            .with_shared_sessions(config.store.backend == crate::store::Backend::Redis)
            .with_quotas(
                config.store.tenant_quota_bytes_per_day,
                config.store.quota_bytes_per_day,
            );
        let body_budget =
            crate::request_body::BodyBudget::new(config.server.max_body_bytes_in_flight);
        let recorder = if config.record.enabled {
            Some(
                Recorder::start(&config.record, metrics.recorder_write_errors.clone()).map_err(
                    |source| StateError::Record {
                        dir: config.record.dir.display().to_string(),
                        source,
                    },
                )?,
            )
        } else {
            None
        };
        let state = AppState {
            config,
            auth,
            upstreams,
            context,
            metrics,
            body_budget,
            recorder: recorder.clone(),
            summarizer: summarizer.clone(),
            draining: AtomicBool::new(false),
            services: Mutex::new(Vec::new()),
        };
        state.register(Arc::new(StoreSweeper(store)));
        if let Some(summarizer) = summarizer {
            state.register(summarizer);
        }
        if let Some(recorder) = recorder {
            state.register(recorder);
        }
        Ok(state)
    }

    /// Adds a running service, to be stopped by [`AppState::shutdown`].
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
