//! The `[server]` section: the listener's address and limits, and the limits a request body is
//! read under (handed to the routes as [`BodyLimits`]).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::http::request_body::BodyLimits;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(deserialize_with = "socket_addr")]
    pub listen: SocketAddr,
    /// Largest request body accepted on `/v1/chat/completions`, in bytes (413 above).
    pub max_body_bytes: usize,
    /// Time allowed to receive a request's headers, in milliseconds. It also bounds a new
    /// connection that has not yet sent a whole request head (HTTP/1.1 or HTTP/2).
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight (an idle HTTP/1.1 keep-alive connection, an
    /// HTTP/2 connection without streams) is closed after this many milliseconds.
    pub idle_timeout_ms: u64,
    /// Most JSON values (containers, scalars, object members) a chat request body may hold,
    /// counted from its bytes before it is parsed (413 above): parsing multiplies the memory a
    /// body of many small values takes.
    pub max_json_elements: usize,
    /// Deepest nesting of arrays and objects a chat request body may have (400 above).
    pub max_json_depth: usize,
    /// Most request-body bytes read into memory at once, over all requests (chat and the
    /// pass-through bodies read to route by model); a request that would go over waits for
    /// nothing: it gets 503 with `Retry-After`. Held until the response head is sent.
    pub max_body_bytes_in_flight: usize,
    /// A request body must arrive within this many milliseconds plus the time its size takes
    /// at `body_min_bytes_per_sec` (408 after it); the same bounds each wait for more of it.
    pub body_read_timeout_ms: u64,
    /// The slowest average rate a request body may arrive at, past `body_read_timeout_ms`.
    pub body_min_bytes_per_sec: u64,
    /// On SIGINT/SIGTERM, how long `/readyz` answers 503 while the listener still accepts and
    /// serves, so load balancers move away before connections are refused, in milliseconds.
    /// Skipped for a Ctrl-C in a terminal and cut short by a second signal.
    pub drain_window_ms: u64,
    /// On SIGINT/SIGTERM, how long in-flight requests and streams may take to finish, in ms;
    /// one more signal cuts them at once.
    pub shutdown_grace_ms: u64,
    /// Most connections open at once. At the limit a new connection closes the one idle the
    /// longest (no request in flight); it waits only when every connection has one.
    pub max_connections: usize,
    /// Threads that run the connections: 0 is one per CPU core (tokio's multi-thread runtime);
    /// 1 runs everything on one thread (tokio's current-thread runtime), which costs the least
    /// per request and adds the least latency, but lets one CPU-heavy request hold up the
    /// others; n > 1 is a multi-thread runtime with n workers.
    pub worker_threads: usize,
}

/// An IP address and port; the error says what is allowed.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{text:?} is not an IP address and port, such as \"127.0.0.1:8080\" or \"[::]:8080\" \
             (host names are not resolved)"
        ))
    })
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 32 * 1024 * 1024,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_json_elements: 1_000_000,
            max_json_depth: 64,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            body_read_timeout_ms: 30_000,
            body_min_bytes_per_sec: 16_384,
            drain_window_ms: 3_000,
            shutdown_grace_ms: 30_000,
            max_connections: 10_000,
            worker_threads: 0,
        }
    }
}

impl ServerConfig {
    /// Checks the keys that have constraints; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_body_bytes == 0 {
            return Err("server.max_body_bytes must be above 0".into());
        }
        if self.max_json_elements == 0 || self.max_json_depth == 0 {
            return Err(
                "server.max_json_elements and server.max_json_depth must be above 0".into(),
            );
        }
        if self.max_body_bytes_in_flight < self.max_body_bytes {
            return Err(
                "server.max_body_bytes_in_flight must be at least server.max_body_bytes".into(),
            );
        }
        if self.body_read_timeout_ms == 0 || self.body_min_bytes_per_sec == 0 {
            return Err(
                "server.body_read_timeout_ms and server.body_min_bytes_per_sec must be above 0"
                    .into(),
            );
        }
        if self.header_read_timeout_ms == 0 || self.idle_timeout_ms == 0 {
            return Err(
                "server.header_read_timeout_ms and server.idle_timeout_ms must be above 0".into(),
            );
        }
        if self.max_connections == 0 {
            return Err("server.max_connections must be above 0".into());
        }
        Ok(())
    }

    /// The limits a request body is read under.
    pub fn body_limits(&self) -> BodyLimits {
        BodyLimits {
            max_body_bytes: self.max_body_bytes,
            max_json_elements: self.max_json_elements,
            max_json_depth: self.max_json_depth,
            body_read_timeout_ms: self.body_read_timeout_ms,
            body_min_bytes_per_sec: self.body_min_bytes_per_sec,
        }
    }
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
    pub fn drain_window(&self) -> Duration {
        Duration::from_millis(self.drain_window_ms)
    }
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}
