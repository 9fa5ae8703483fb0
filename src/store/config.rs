//! The `[store]` section of `config.toml`: which backend holds offloaded content and session
//! state, where, for how long, and the limits every store call runs under.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest retention accepted, so that retention arithmetic on timestamps cannot overflow.
const MAX_RETENTION_DAYS: u64 = 36_500;

/// Where the store keeps its items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In the process, bounded by `memory_max_bytes`; lost on restart. For tests.
    Memory,
    /// A human-readable directory tree under `path`. The embedded default.
    #[default]
    Fs,
    /// A Redis server (or Redis Cluster) shared by several proxy replicas.
    Redis,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Fs => "fs",
            Backend::Redis => "redis",
        }
    }
}

/// What a request does when the store fails: `open` (the default) serves it without context
/// management, as it came; `closed` refuses it (503), for operators who would rather fail than
/// send a conversation unmanaged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    #[default]
    Open,
    Closed,
}

/// The `[store]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `memory`, `fs` or `redis`. Default `fs`.
    pub backend: Backend,
    /// Root directory of the `fs` backend; created when missing. Default `./data`.
    pub path: PathBuf,
    /// Server of the `redis` backend. Default `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// `redis`: the nodes of a Redis Cluster (`redis://host:port` each, a few are enough); when
    /// set, `redis_url` is not used. Default empty (one server).
    pub redis_cluster_nodes: Vec<String>,
    /// `redis`: every key starts with `<prefix>:`, so several proxies (or other programs) can
    /// share a server. 1 to 64 characters of a-z, A-Z, 0-9, `-`, `_`, `.` or `:`. Default `cp`.
    pub redis_key_prefix: String,
    /// `redis`: time allowed to open a connection, in milliseconds. Default 1000.
    pub redis_connect_timeout_ms: u64,
    /// `redis`: time allowed for the server's answer to one command, in milliseconds, sized for
    /// multi-megabyte values on a LAN. Default 2000.
    pub redis_response_timeout_ms: u64,
    /// What a request does when the store fails: `open` serves it unmanaged, `closed` refuses
    /// it. Default `open`.
    pub on_error: OnError,
    /// Days an item is kept after it was last written or read. Default 30.
    pub retention_days: u64,
    /// Most bytes the `memory` backend holds; the least recently used items are evicted above
    /// it. Default 256 MiB.
    pub memory_max_bytes: usize,
    /// Time allowed for one store operation, in milliseconds; a slower one fails (and the
    /// request is served without context management). Default 2000.
    pub op_timeout_ms: u64,
    /// How often expired items are deleted in the background, in seconds. Default 3600.
    pub sweep_interval_secs: u64,
    /// A request that forwards a reference to stored content stores it again (which only
    /// refreshes its retention when it is there, and writes it back when it was lost) at most
    /// once per this many seconds per reference and process. 0: on every request. Default 60.
    pub content_refresh_secs: u64,
    /// `fs`: most file operations running at once on blocking threads; further ones wait
    /// (within `op_timeout_ms`). Default 64.
    pub max_blocking_ops: usize,
    /// `fs`: flush each file (and its directory) to disk before it counts as written, so that
    /// offloaded content survives a power loss. A process crash never leaves a torn file either
    /// way. Default true.
    pub fsync: bool,
    /// Bytes of new content one tenant may store per UTC day, counted by each proxy process;
    /// a request that would go over is forwarded unmanaged (fail-open), with a warning and
    /// `context_proxy_store_quota_exceeded_total{scope="tenant"}`. 0: no quota. Default 1 GiB.
    pub tenant_quota_bytes_per_day: u64,
    /// The same for all tenants together (`scope="store"`). 0: no quota. Default 8 GiB.
    pub quota_bytes_per_day: u64,
    /// `fs`: the store counts as degraded (`/readyz` 503) when fewer bytes than this are free
    /// under `path`: a nearly full disk still takes the readiness probe's small write but not
    /// a request's content. 0: not checked. Default 256 MiB.
    pub min_free_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: Backend::Fs,
            path: PathBuf::from("./data"),
            redis_url: "redis://127.0.0.1:6379".into(),
            redis_cluster_nodes: Vec::new(),
            redis_key_prefix: "cp".into(),
            redis_connect_timeout_ms: 1_000,
            redis_response_timeout_ms: 2_000,
            on_error: OnError::Open,
            retention_days: 30,
            memory_max_bytes: 256 * 1024 * 1024,
            op_timeout_ms: 2_000,
            sweep_interval_secs: 3_600,
            content_refresh_secs: 60,
            max_blocking_ops: 64,
            fsync: true,
            tenant_quota_bytes_per_day: 1 << 30,
            quota_bytes_per_day: 8 << 30,
            min_free_bytes: 256 << 20,
        }
    }
}

impl StoreConfig {
    /// How long an item is kept after it was last written or read.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_days.saturating_mul(24 * 60 * 60))
    }

    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }

    pub fn sweep_interval(&self) -> Duration {
        Duration::from_secs(self.sweep_interval_secs)
    }

    pub fn content_refresh(&self) -> Duration {
        Duration::from_secs(self.content_refresh_secs)
    }

    pub fn redis_connect_timeout(&self) -> Duration {
        Duration::from_millis(self.redis_connect_timeout_ms)
    }

    pub fn redis_response_timeout(&self) -> Duration {
        Duration::from_millis(self.redis_response_timeout_ms)
    }

    /// Whether a request must be refused (503) rather than served unmanaged when the store
    /// fails (`on_error = "closed"`).
    pub fn fail_closed(&self) -> bool {
        self.on_error == OnError::Closed
    }

    /// Checks every key that has constraints; the message names the key (`store.…`), as every
    /// section's `validate` does.
    pub fn validate(&self) -> Result<(), String> {
        let fail = |key: &str, message: String| Err(format!("store.{key} {message}"));
        if !(1..=MAX_RETENTION_DAYS).contains(&self.retention_days) {
            return fail(
                "retention_days",
                format!("must be between 1 and {MAX_RETENTION_DAYS}"),
            );
        }
        if self.op_timeout_ms == 0 {
            return fail("op_timeout_ms", "must be above 0".into());
        }
        if self.sweep_interval_secs == 0 {
            return fail("sweep_interval_secs", "must be above 0".into());
        }
        match self.backend {
            Backend::Memory if self.memory_max_bytes == 0 => {
                fail("memory_max_bytes", "must be above 0".into())
            }
            Backend::Fs if self.path.as_os_str().is_empty() => {
                fail("path", "must not be empty".into())
            }
            Backend::Fs if self.max_blocking_ops == 0 => {
                fail("max_blocking_ops", "must be above 0".into())
            }
            Backend::Redis => self.validate_redis(),
            _ => Ok(()),
        }
    }

    fn validate_redis(&self) -> Result<(), String> {
        let fail = |key: &str, message: String| Err(format!("store.{key} {message}"));
        let is_url = |url: &str| url.starts_with("redis://") || url.starts_with("rediss://");
        if self.redis_cluster_nodes.is_empty() && !is_url(&self.redis_url) {
            return fail(
                "redis_url",
                format!("{:?} must start with redis:// or rediss://", self.redis_url),
            );
        }
        if let Some(node) = self.redis_cluster_nodes.iter().find(|url| !is_url(url)) {
            return fail(
                "redis_cluster_nodes",
                format!("{node:?} must start with redis:// or rediss://"),
            );
        }
        let prefix = &self.redis_key_prefix;
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
        if !(1..=64).contains(&prefix.len()) || !prefix.chars().all(allowed) {
            return fail(
                "redis_key_prefix",
                format!(
                    "{prefix:?} must be 1 to 64 characters of a-z, A-Z, 0-9, '-', '_', '.' or ':'"
                ),
            );
        }
        if self.redis_connect_timeout_ms == 0 {
            return fail("redis_connect_timeout_ms", "must be above 0".into());
        }
        if self.redis_response_timeout_ms == 0 {
            return fail("redis_response_timeout_ms", "must be above 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let cfg: StoreConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, StoreConfig::default());
        assert_eq!(cfg.backend, Backend::Fs);
        assert_eq!(cfg.path, PathBuf::from("./data"));
        assert_eq!(cfg.retention(), Duration::from_secs(30 * 86_400));
        cfg.validate().unwrap();
    }

    #[test]
    fn keys_parse_and_unknown_keys_are_errors() {
        let cfg: StoreConfig = toml::from_str(
            "backend = \"memory\"\nretention_days = 7\nmemory_max_bytes = 1024\nop_timeout_ms = 50\n",
        )
        .unwrap();
        assert_eq!(cfg.backend, Backend::Memory);
        assert_eq!(cfg.retention_days, 7);
        assert_eq!(cfg.memory_max_bytes, 1024);
        assert_eq!(cfg.op_timeout(), Duration::from_millis(50));
        let err = toml::from_str::<StoreConfig>("retention = 7\n").unwrap_err();
        assert!(err.to_string().contains("retention"), "{err}");
        let err = toml::from_str::<StoreConfig>("backend = \"sqlite\"\n").unwrap_err();
        assert!(err.to_string().contains("sqlite"), "{err}");
    }

    #[test]
    fn redis_keys_and_on_error_parse() {
        let cfg: StoreConfig = toml::from_str(
            "backend = \"redis\"\nredis_cluster_nodes = [\"redis://10.0.0.1:7000\"]\n\
             redis_key_prefix = \"proxy:prod\"\nredis_connect_timeout_ms = 300\n\
             redis_response_timeout_ms = 5000\non_error = \"closed\"\n",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.redis_cluster_nodes, ["redis://10.0.0.1:7000"]);
        assert_eq!(cfg.redis_key_prefix, "proxy:prod");
        assert_eq!(cfg.redis_connect_timeout(), Duration::from_millis(300));
        assert_eq!(cfg.redis_response_timeout(), Duration::from_millis(5000));
        assert!(cfg.fail_closed());
        assert!(!StoreConfig::default().fail_closed());
        let err = toml::from_str::<StoreConfig>("on_error = \"maybe\"\n").unwrap_err();
        assert!(err.to_string().contains("maybe"), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let cases = [
            (
                StoreConfig {
                    retention_days: 0,
                    ..StoreConfig::default()
                },
                "store.retention_days",
            ),
            (
                StoreConfig {
                    op_timeout_ms: 0,
                    ..StoreConfig::default()
                },
                "store.op_timeout_ms",
            ),
            (
                StoreConfig {
                    backend: Backend::Memory,
                    memory_max_bytes: 0,
                    ..StoreConfig::default()
                },
                "store.memory_max_bytes",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_url: "http://x".into(),
                    ..StoreConfig::default()
                },
                "store.redis_url",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_cluster_nodes: vec!["redis://a:1".into(), "a:2".into()],
                    ..StoreConfig::default()
                },
                "store.redis_cluster_nodes",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_key_prefix: "cp{x}".into(),
                    ..StoreConfig::default()
                },
                "store.redis_key_prefix",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_key_prefix: String::new(),
                    ..StoreConfig::default()
                },
                "store.redis_key_prefix",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_response_timeout_ms: 0,
                    ..StoreConfig::default()
                },
                "store.redis_response_timeout_ms",
            ),
            (
                StoreConfig {
                    backend: Backend::Redis,
                    redis_connect_timeout_ms: 0,
                    ..StoreConfig::default()
                },
                "store.redis_connect_timeout_ms",
            ),
        ];
        for (cfg, key) in cases {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
