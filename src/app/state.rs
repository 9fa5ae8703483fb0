//! The application's state, built from the whole configuration: what every request handler
//! shares ([`Shared`]), with the background services that live as long as the proxy (the
//! store's sweeper, the summarizer, the traffic recorder, the page's journal writer) started
//! and registered here, to be stopped by the server at shutdown, last started first.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::app::config::ValidConfig;
use crate::context::ContextManager;
use crate::recorder::Recorder;
use crate::routes::shared::Shared;
use crate::service::Service;
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::Metrics;
use crate::tokens::{Counter, Encoding};
use crate::upstream::{UpstreamSetupError, Upstreams};

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

/// Builds what the handlers share from the whole configuration: the upstream clients, the
/// store, the context manager, and the background services, started and registered.
pub async fn build(config: &ValidConfig) -> Result<Shared, StateError> {
    let upstreams = Upstreams::new(&config.upstreams, |var| std::env::var(var).ok())?;
    let auth = crate::auth::Auth::new(&config.auth, &config.keys, config.upstream_keys(), |var| {
        std::env::var(var).ok()
    })?;
    let store = crate::store::open(&config.store)
        .await
        .map_err(StateError::Store)?;
    let counter = Counter::new(Encoding::O200kBase, config.tokens.clone());
    let metrics = Metrics::default();
    let summarizer =
        crate::summarizer::start(&config.context.summarizer, &upstreams, &store, &metrics)
            .map_err(StateError::SummarizerUpstream)?;
    let context = ContextManager::new(config.context.clone(), counter, store.clone())
        .with_content_refresh(config.store.content_refresh())
        .with_shared_sessions(config.store.backend == crate::store::Backend::Redis)
        .with_quotas(
            config.store.tenant_quota_bytes_per_day,
            config.store.quota_bytes_per_day,
        );
    let body_budget =
        crate::http::request_body::BodyBudget::new(config.server.max_body_bytes_in_flight);
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
    let journal = config.ui.enabled.then(|| {
        use crate::sessions::journal::{JournalWriter, WriterConfig};
        let upstreams = upstreams.clone();
        JournalWriter::start(
            store.clone(),
            WriterConfig::of(&config.ui),
            metrics.journal_dropped.clone(),
            Arc::new(move |name: &str, model: Option<&str>| upstreams.cache_terms(name, model)),
        )
    });
    let state = Shared {
        body_limits: config.server.body_limits(),
        idle_timeout: config.server.idle_timeout(),
        store: config.store.clone(),
        auth,
        upstreams,
        context,
        metrics,
        body_budget,
        recorder: recorder.clone(),
        summarizer: summarizer.clone(),
        ui: journal
            .clone()
            .map(|journal| crate::routes::shared::UiState::new(config.ui.clone(), journal)),
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
    if let Some(journal) = journal {
        state.register(journal);
    }
    Ok(state)
}
