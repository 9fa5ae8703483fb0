//! The `[store]` section of `config.toml`: which backend holds offloaded content and session
//! state, where, for how long, and the limits every store call runs under.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::StoreError;

/// Longest retention accepted, so that retention arithmetic on timestamps cannot overflow.
const MAX_RETENTION_DAYS: u64 = 36_500;

/// Where the store keeps its items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In the process, bounded by `memory_max_bytes`; lost on restart. For tests.
    Memory,
    /// A human-readable directory tree under `path`. The embedded default.
    #[default]
    Fs,
    /// A Redis server shared by several proxy replicas (not in this build yet).
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

/// The `[store]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `memory`, `fs` or `redis`. Default `fs`.
    pub backend: Backend,
    /// Root directory of the `fs` backend; created when missing. Default `./data`.
    pub path: PathBuf,
    /// Server of the `redis` backend. Default `redis://127.0.0.1:6379`.
    pub redis_url: String,
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
    /// `fs`: most file operations running at once on blocking threads; further ones wait
    /// (within `op_timeout_ms`). Default 64.
    pub max_blocking_ops: usize,
    /// `fs`: flush each file (and its directory) to disk before it counts as written, so that
    /// offloaded content survives a power loss. A process crash never leaves a torn file either
    /// way. Default true.
    pub fsync: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: Backend::Fs,
            path: PathBuf::from("./data"),
            redis_url: "redis://127.0.0.1:6379".into(),
            retention_days: 30,
            memory_max_bytes: 256 * 1024 * 1024,
            op_timeout_ms: 2_000,
            sweep_interval_secs: 3_600,
            max_blocking_ops: 64,
            fsync: true,
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

    /// Checks every key that has constraints; the message names the key.
    pub fn validate(&self) -> Result<(), StoreError> {
        let fail = |key: &'static str, message: String| Err(StoreError::Config { key, message });
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
            Backend::Redis
                if !(self.redis_url.starts_with("redis://")
                    || self.redis_url.starts_with("rediss://")) =>
            {
                fail(
                    "redis_url",
                    format!("{:?} must start with redis:// or rediss://", self.redis_url),
                )
            }
            _ => Ok(()),
        }
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
        ];
        for (cfg, key) in cases {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
