//! A Redis for the integration tests: `REDIS_URL` when set, else a private `redis-server` child
//! (killed on drop), a server that can be killed and restarted on its port, and a private
//! cluster. The same file the library's unit tests use.

#[path = "../../src/store/redis/test_server.rs"]
mod test_server;

#[allow(unused_imports)]
pub use test_server::*;
