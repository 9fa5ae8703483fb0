//! For tests: a Redis to test against. `REDIS_URL` when it is set (a server the tests may write
//! to: each test works under its own key prefix and deletes its keys when done), else a private
//! `redis-server` child on a free port, killed when dropped. Also a private three-node Redis
//! Cluster, and a server that can be killed and restarted on its port for fault tests.
//!
//! Used by the library's unit tests and, through `#[path]`, by the integration tests
//! (`tests/common/redis.rs`), so it uses nothing of the crate.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for a server to answer or a cluster to settle.
const PATIENCE: Duration = Duration::from_secs(20);
/// Pause between two checks of a condition that is polled (never used as synchronisation).
const POLL: Duration = Duration::from_millis(10);

const INSTALL_HINT: &str = "the Redis tests need `redis-server` (and `redis-cli` for the \
    cluster test) on the PATH: install them with `apt-get install redis-server` (Debian, \
    Ubuntu) or `brew install redis` (macOS), or set REDIS_URL=redis://host:port to a server \
    the tests may write to";

/// A Redis for one test, and the key prefix the test's keys go under.
pub struct TestRedis {
    pub url: String,
    pub prefix: String,
    /// `None` when testing against `REDIS_URL`.
    pub server: Option<RedisServer>,
}

impl TestRedis {
    /// `REDIS_URL`'s server, or a private one.
    pub fn start() -> TestRedis {
        let (url, server) = match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => (url, None),
            _ => {
                let server = RedisServer::start();
                (server.url(), Some(server))
            }
        };
        TestRedis {
            url,
            prefix: unique_prefix(),
            server,
        }
    }

    /// The keys under this test's prefix.
    pub fn keys(&self) -> Vec<String> {
        let mut conn = connect(&self.url).expect("connect to redis");
        redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut conn)
            .expect("KEYS")
    }

    /// A plain synchronous connection, for looking at keys directly.
    pub fn connection(&self) -> redis::Connection {
        connect(&self.url).expect("connect to redis")
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if self.server.is_some() {
            return; // The private server dies with its data.
        }
        if let Ok(mut conn) = connect(&self.url) {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}:*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }
}

/// A key prefix no other test (in this process or another) uses.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "test-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private `redis-server` child; killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(free_port(), Vec::new())
    }

    /// A free port where no server runs yet (for starting one later with [`RedisServer::start_on`]).
    pub fn free_port() -> u16 {
        free_port()
    }

    /// Starts a server on `port` and waits until it answers.
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::start_with(port, Vec::new())
    }

    fn start_with(port: u16, extra: Vec<String>) -> RedisServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra,
        };
        server.restart();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server and waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (after [`RedisServer::kill`]), and waits until
    /// it answers.
    pub fn restart(&mut self) {
        self.kill();
        let child = spawn_server(self.port, self.dir.path(), &self.extra);
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if connect(&self.url()).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("redis-server on port {} exited: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within {PATIENCE:?}",
                self.port
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private Redis Cluster of masters without replicas; killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` (at least 3) cluster-enabled servers, joins them with `redis-cli --cluster
    /// create` and waits until every node reports `cluster_state:ok`. Panics with a clear
    /// message when that cannot be done: the test must fail, not pass without a cluster.
    pub fn start(n: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]
                    .map(String::from)
                    .to_vec();
                RedisServer::start_with(free_cluster_port(), extra)
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = create
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): {INSTALL_HINT}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + PATIENCE;
        while !cluster.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not reach cluster_state:ok within {PATIENCE:?}"
            );
            std::thread::sleep(POLL);
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|node| {
            let Ok(mut conn) = connect(&node.url()) else {
                return false;
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut conn)
                .unwrap_or_default();
            info.contains("cluster_state:ok")
        })
    }
}

fn spawn_server(port: u16, dir: &Path, extra: &[String]) -> Child {
    let config_file = dir.join("nodes.conf");
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--cluster-config-file")
        .arg(&config_file)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server ({e}): {INSTALL_HINT}"))
}

fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(200))?;
    redis::cmd("PING").query::<()>(&mut conn)?;
    Ok(conn)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// A free port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}
