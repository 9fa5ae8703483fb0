//! The background task that deletes expired items: one per store, run every
//! `sweep_interval_secs` (and once at start-up, to clean what a crash left), with a tracing span,
//! and stopped through a `Notify` — the shape of mini-redis's `purge_expired_tasks`.
//!
//! The task holds only the backend's shared state, never the store itself, so dropping the store
//! drops its [`Sweeper`], which stops the task.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use super::StoreError;

/// The handle of a running sweeper task.
pub(crate) struct Sweeper {
    stop: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Sweeper {
    /// Spawns a task that runs `sweep` now and then every `every`, until stopped. `sweep`
    /// returns how many items it deleted.
    pub(crate) fn spawn<F, Fut>(backend: &'static str, every: Duration, sweep: F) -> Sweeper
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<usize, StoreError>> + Send + 'static,
    {
        let stop = Arc::new(Notify::new());
        let span = tracing::info_span!("store_sweeper", backend);
        let task = tokio::spawn(run(Arc::clone(&stop), every, sweep).instrument(span));
        Sweeper {
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Stops the task and waits until it has finished (a sweep under way completes first).
    pub(crate) async fn stop(&self) {
        self.stop.notify_one();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "store sweeper task failed");
            }
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        // `notify_one` keeps a permit when the task is not waiting, so it stops at its next
        // check even when it is in the middle of a sweep.
        self.stop.notify_one();
    }
}

async fn run<F, Fut>(stop: Arc<Notify>, every: Duration, sweep: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<usize, StoreError>>,
{
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.notified() => break,
            _ = ticks.tick() => match sweep().await {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(removed, "deleted expired items"),
                Err(e) => tracing::warn!(error = %e, "sweeping expired items failed"),
            },
        }
    }
    tracing::debug!("stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::time::timeout;

    const PATIENCE: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn sweeps_at_start_and_every_interval_until_stopped() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sweeper = Sweeper::spawn("test", Duration::from_millis(10), move || {
            let tx = tx.clone();
            async move {
                let _ = tx.send(());
                Ok(0)
            }
        });
        for _ in 0..3 {
            timeout(PATIENCE, rx.recv()).await.unwrap().unwrap();
        }
        sweeper.stop().await;
        // Stopped: the task dropped its closure, so the channel closes after what was sent.
        while rx.try_recv().is_ok() {}
        assert_eq!(timeout(PATIENCE, rx.recv()).await.unwrap(), None);
    }

    #[tokio::test]
    async fn dropping_the_handle_stops_the_task() {
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let sweeper = Sweeper::spawn("test", Duration::from_secs(3600), move || {
            let _tx = tx.clone();
            async { Ok(0) }
        });
        drop(sweeper);
        assert_eq!(timeout(PATIENCE, rx.recv()).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_failing_sweep_does_not_stop_the_task() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sweeper = Sweeper::spawn("test", Duration::from_millis(10), move || {
            let tx = tx.clone();
            async move {
                let _ = tx.send(());
                Err(StoreError::Internal("disk on fire".into()))
            }
        });
        for _ in 0..2 {
            timeout(PATIENCE, rx.recv()).await.unwrap().unwrap();
        }
        sweeper.stop().await;
    }
}
