//! The connection to Redis: one server through a [`ConnectionManager`] (a multiplexed connection
//! that reconnects by itself) or a Redis Cluster through a [`ClusterConnection`] (which follows
//! the cluster's slots and reconnects by itself), behind one type the commands run on.
//!
//! The first connection is made lazily and retried on every call until it succeeds, so a proxy
//! started while Redis is down starts anyway: calls fail (and requests are served unmanaged)
//! until Redis answers, then work without a restart. Both connection kinds are cheap handles
//! to shared state, cloned for each call.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

use crate::store::{StoreConfig, StoreError};

/// One server: a failed (re)connection is not retried with backoff inside the call (the
/// manager's backoff starts at a second); the call fails at once and the next call connects
/// again, so a call never waits longer than the connect timeout for a server that is down.
const RECONNECT_RETRIES: usize = 0;
/// A cluster: how many times a request is retried (topology changes, a node restarting), and
/// the bounds of the wait between retries in milliseconds. `op_timeout_ms` bounds it all.
const CLUSTER_RETRIES: u32 = 2;
const CLUSTER_RETRY_MIN_WAIT_MS: u64 = 10;
const CLUSTER_RETRY_MAX_WAIT_MS: u64 = 200;

/// An open connection of either kind; a command runs on it like on any redis connection.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// What makes the connection, and the connection once made.
pub(super) struct Connector {
    target: Target,
    connection: OnceCell<Connection>,
}

enum Target {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    Cluster(ClusterClient),
}

impl Connector {
    /// Checks the addresses; connects nothing yet.
    pub(super) fn new(cfg: &StoreConfig) -> Result<Connector, StoreError> {
        let target = if cfg.redis_cluster_nodes.is_empty() {
            let client = redis::Client::open(cfg.redis_url.as_str())
                .map_err(|e| StoreError::Config(format!("store.redis_url {e}")))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(cfg.redis_connect_timeout())
                .set_response_timeout(cfg.redis_response_timeout())
                .set_number_of_retries(RECONNECT_RETRIES);
            Target::Single { client, config }
        } else {
            let client = ClusterClientBuilder::new(cfg.redis_cluster_nodes.clone())
                .connection_timeout(cfg.redis_connect_timeout())
                .response_timeout(cfg.redis_response_timeout())
                .retries(CLUSTER_RETRIES)
                .min_retry_wait(CLUSTER_RETRY_MIN_WAIT_MS)
                .max_retry_wait(CLUSTER_RETRY_MAX_WAIT_MS)
                .build()
                .map_err(|e| StoreError::Config(format!("store.redis_cluster_nodes {e}")))?;
            Target::Cluster(client)
        };
        Ok(Connector {
            target,
            connection: OnceCell::new(),
        })
    }

    /// The connection, made now if it has not been yet. Concurrent first calls wait for one
    /// attempt; when it fails they fail, and the next call tries again.
    pub(super) async fn get(&self) -> Result<Connection, StoreError> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                match &self.target {
                    Target::Single { client, config } => {
                        ConnectionManager::new_with_config(client.clone(), config.clone())
                            .await
                            .map(Connection::Single)
                    }
                    Target::Cluster(client) => {
                        client.get_async_connection().await.map(Connection::Cluster)
                    }
                }
                .map_err(|e| StoreError::Redis {
                    op: "connect",
                    source: e,
                })
            })
            .await?;
        Ok(connection.clone())
    }

    /// Tries to connect once within `timeout`, so that a reachable Redis is ready before the
    /// first request; an unreachable one is only logged.
    pub(super) async fn warm_up(&self, timeout: Duration) {
        match tokio::time::timeout(timeout, self.get()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "redis is not reachable yet; retrying on use"),
            Err(_) => tracing::warn!("redis did not answer in time; retrying on use"),
        }
    }
}
