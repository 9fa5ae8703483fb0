//! The lifecycle of a background service (the store's sweeper, the summarizer, the traffic
//! recorder): started when the application state is built, stopped at shutdown, last started
//! first. A leaf, so that a service of any layer can implement it without importing the
//! composition root that starts and stops it.

use async_trait::async_trait;

/// A task that runs beside the request path and must be stopped at shutdown.
#[async_trait]
pub trait Service: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &'static str;
    /// Stops the service and waits until it has stopped.
    async fn stop(&self);
}
