//! The `redis` backend: one Redis server or Redis Cluster shared by several proxy replicas, so a
//! conversation may go through any of them.
//!
//! ```text
//! <prefix>:{<tenant>}:c:<ref>              content, byte-exact       SET NX EX, GETEX EX
//! <prefix>:{<tenant>}:s:<session>:<key>    a state record            SET EX, GETEX EX, CAS script
//! <prefix>:{<tenant>}:l:<session>          the journal, a list       RPUSH + EXPIRE, LRANGE
//! <prefix>:{<tenant>}:k:<session>:<name>   a session lock (holder)   lock and unlock scripts
//! ```
//!
//! `<prefix>` is `store.redis_key_prefix` (default `cp`). The tenant is the hash tag: content is
//! found by tenant and reference whatever the session, so every key a call touches is in the
//! tenant's Redis Cluster slot, and the scripts and pipelines work on a cluster. No name can hold
//! `:`, `{` or `}` (see `ids.rs`), so keys cannot collide.
//!
//! Retention is Redis's own expiry, set to `retention_days` on every write and read (`GETEX`,
//! `EXPIRE`): Redis deletes what expired, so there is no sweeper, and the store's `Clock` is not
//! used. Locks expire by `PX` on the server as well.
//!
//! Values are the bytes given: content is UTF-8 already and is checked against its reference on
//! reading (like the fs backend), state records are arbitrary bytes.
//!
//! Failures: a call fails with [`StoreError::Redis`] when Redis is down or slow (connect and
//! response timeouts from the config, and `op_timeout_ms` around every call), and the request is
//! served unmanaged. Reconnection is automatic, including the very first connection, so the
//! proxy starts and keeps running while Redis is away (see `conn.rs`).

mod conn;
mod sessions;
#[cfg(test)]
pub(crate) mod test_server;

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use redis::Script;

use super::{
    epoch_millis, from_epoch_millis, Appended, ContentKind, ContentRef, Leave, LogLine, LogPage,
    SessionId, StateKey, Store, StoreConfig, StoreError, Tenant,
};
use conn::{Connection, Connector};

/// Replaces KEYS[1] with ARGV[3] (expiring in ARGV[4] seconds) if it holds ARGV[2] (ARGV[1] =
/// "1") or does not exist (ARGV[1] = "0"). Returns 1 when it did.
const CAS_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
local matches
if ARGV[1] == '0' then
  matches = (current == false)
else
  matches = (current == ARGV[2])
end
if matches then
  redis.call('SET', KEYS[1], ARGV[3], 'EX', ARGV[4])
  return 1
end
return 0
";

/// Appends ARGV[3..] to the journal KEYS[1] (expiring in ARGV[2] seconds) unless the
/// session's tombstone KEYS[2] holds a time (epoch ms) at or after ARGV[1] (-1: no check).
/// Returns {records in the journal, 0}, or {-1, the tombstone's time} when it refused.
const APPEND_SCRIPT: &str = r"
local since = tonumber(ARGV[1])
if since >= 0 then
  local erased = tonumber(redis.call('GET', KEYS[2]) or '')
  if erased and erased >= since then
    return {-1, erased}
  end
end
local n = 0
for i = 3, #ARGV, 1000 do
  n = redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {n, 0}
";

/// Takes KEYS[1] for holder ARGV[1] for ARGV[2] milliseconds unless another holder has it.
/// Returns 1 when ARGV[1] holds it.
const LOCK_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
if current == false or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// Deletes KEYS[1] if it holds ARGV[1].
const UNLOCK_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The store on Redis.
pub struct RedisStore {
    connector: Connector,
    prefix: String,
    /// Retention in seconds, the TTL of every key.
    ttl_secs: u64,
    cas: Script,
    lock: Script,
    unlock: Script,
}

impl RedisStore {
    /// Makes the store and tries to connect once (within the connect timeout). Only an invalid
    /// address fails: when Redis is down the store is made anyway, its calls fail until Redis
    /// answers, and [`Store::ping`] tells.
    pub async fn open(cfg: &StoreConfig) -> Result<RedisStore, StoreError> {
        let store = RedisStore {
            connector: Connector::new(cfg)?,
            prefix: cfg.redis_key_prefix.clone(),
            ttl_secs: cfg.retention().as_secs().max(1),
            cas: Script::new(CAS_SCRIPT),
            lock: Script::new(LOCK_SCRIPT),
            unlock: Script::new(UNLOCK_SCRIPT),
        };
        store.connector.warm_up(cfg.redis_connect_timeout()).await;
        Ok(store)
    }

    async fn conn(&self) -> Result<Connection, StoreError> {
        self.connector.get().await
    }

    fn content_key(&self, tenant: &Tenant, r: &ContentRef) -> String {
        format!("{}:{{{tenant}}}:c:{r}", self.prefix)
    }

    fn state_key(&self, tenant: &Tenant, session: &SessionId, key: &StateKey) -> String {
        format!("{}:{{{tenant}}}:s:{session}:{key}", self.prefix)
    }

    fn log_key(&self, tenant: &Tenant, session: &SessionId) -> String {
        format!("{}:{{{tenant}}}:l:{session}", self.prefix)
    }

    /// An erased session's tombstone (a kind the session list does not read).
    fn tombstone_key(&self, tenant: &Tenant, session: &SessionId) -> String {
        format!("{}:{{{tenant}}}:e:{session}", self.prefix)
    }

    fn lock_key(&self, tenant: &Tenant, session: &SessionId, name: &StateKey) -> String {
        format!("{}:{{{tenant}}}:k:{session}:{name}", self.prefix)
    }
}

fn failed(op: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { op, source }
}

/// Longest lock time-to-live sent to Redis (which refuses one past its clock's range): 100 years.
const MAX_LOCK_TTL_MS: u64 = 100 * 365 * 86_400_000;

/// Milliseconds of a lock's time-to-live, between 1 (Redis refuses 0) and [`MAX_LOCK_TTL_MS`].
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_LOCK_TTL_MS)
}

#[async_trait]
impl Store for RedisStore {
    async fn put_content(
        &self,
        tenant: &Tenant,
        _session: &SessionId,
        _kind: ContentKind,
        content: &str,
    ) -> Result<ContentRef, StoreError> {
        let r = ContentRef::of(content);
        let key = self.content_key(tenant, &r);
        let mut conn = self.conn().await?;
        // Stored already: only refreshed, without sending the content again.
        let refreshed: bool = redis::cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .query_async(&mut conn)
            .await
            .map_err(failed("put_content"))?;
        if !refreshed {
            // NX: a concurrent writer of the same content may have been first; same bytes.
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(content.as_bytes())
                .arg("NX")
                .arg("EX")
                .arg(self.ttl_secs)
                .query_async(&mut conn)
                .await
                .map_err(failed("put_content"))?;
        }
        Ok(r)
    }

    /// Two round trips for the whole batch: every key refreshed at once, then the missing ones
    /// set at once. (Keys of one tenant share a hash slot: one pipeline works on a cluster.)
    async fn put_contents(
        &self,
        tenant: &Tenant,
        _session: &SessionId,
        _kind: ContentKind,
        contents: Vec<String>,
    ) -> Result<Vec<ContentRef>, StoreError> {
        if contents.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<ContentRef> = contents.iter().map(|c| ContentRef::of(c)).collect();
        let keys: Vec<String> = refs.iter().map(|r| self.content_key(tenant, r)).collect();
        let mut conn = self.conn().await?;
        let mut refresh = redis::pipe();
        for key in &keys {
            refresh.cmd("EXPIRE").arg(key).arg(self.ttl_secs);
        }
        let refreshed: Vec<bool> = refresh
            .query_async(&mut conn)
            .await
            .map_err(failed("put_contents"))?;
        let mut set = redis::pipe();
        let mut missing = 0;
        for ((key, content), refreshed) in keys.iter().zip(&contents).zip(refreshed) {
            if !refreshed {
                // NX: a concurrent writer of the same content may have been first; same bytes.
                set.cmd("SET")
                    .arg(key)
                    .arg(content.as_bytes())
                    .arg("NX")
                    .arg("EX")
                    .arg(self.ttl_secs)
                    .ignore();
                missing += 1;
            }
        }
        if missing > 0 {
            set.query_async::<()>(&mut conn)
                .await
                .map_err(failed("put_contents"))?;
        }
        Ok(refs)
    }

    async fn get_content(
        &self,
        tenant: &Tenant,
        r: &ContentRef,
    ) -> Result<Option<String>, StoreError> {
        let key = self.content_key(tenant, r);
        let mut conn = self.conn().await?;
        let bytes: Option<Vec<u8>> = redis::cmd("GETEX")
            .arg(&key)
            .arg("EX")
            .arg(self.ttl_secs)
            .query_async(&mut conn)
            .await
            .map_err(failed("get_content"))?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let corrupt = |detail: &str| StoreError::Corrupt {
            location: format!("redis key {key}"),
            detail: detail.to_owned(),
        };
        if ContentRef::of_bytes(&bytes) != *r {
            return Err(corrupt("the content does not match its reference"));
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| corrupt("not UTF-8"))
    }

    async fn contains_content(
        &self,
        tenant: &Tenant,
        refs: &[ContentRef],
    ) -> Result<Vec<bool>, StoreError> {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        // One round trip; the keys share the tenant's hash slot.
        let mut pipe = redis::pipe();
        for r in refs {
            pipe.cmd("EXISTS").arg(self.content_key(tenant, r));
        }
        let mut conn = self.conn().await?;
        pipe.query_async(&mut conn)
            .await
            .map_err(failed("contains_content"))
    }

    /// One script: the tombstone checked, every line pushed with one `RPUSH`, the journal's
    /// expiry refreshed.
    async fn append_lines(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        lines: Vec<LogLine>,
        since: Option<SystemTime>,
    ) -> Result<Appended, StoreError> {
        let mut conn = self.conn().await?;
        let script = Script::new(APPEND_SCRIPT);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.log_key(tenant, session))
            .key(self.tombstone_key(tenant, session))
            .arg(since.map_or(-1, |t| epoch_millis(t) as i64))
            .arg(self.ttl_secs);
        for line in &lines {
            invocation.arg(line.as_str());
        }
        let (records, erased): (i64, i64) = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(failed("append_logs"))?;
        Ok(if records < 0 {
            Appended::Erased(from_epoch_millis(erased.max(0) as u64))
        } else {
            Appended::Records(records as usize)
        })
    }

    async fn read_log(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let key = self.log_key(tenant, session);
        let mut conn = self.conn().await?;
        let (lines, _): (Vec<Vec<u8>>, bool) = redis::pipe()
            .atomic()
            .cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .query_async(&mut conn)
            .await
            .map_err(failed("read_log"))?;
        lines
            .iter()
            .map(|line| {
                serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
                    location: format!("redis key {key}"),
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    async fn read_log_page(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        before: Option<usize>,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let key = self.log_key(tenant, session);
        let mut conn = self.conn().await?;
        let total: usize = redis::cmd("LLEN")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(failed("read_log_page"))?;
        let range = LogPage::range(total, before, limit);
        if range.is_empty() {
            return Ok(LogPage {
                records: Vec::new(),
                first_index: range.start,
                total,
            });
        }
        let (lines, _): (Vec<Vec<u8>>, bool) = redis::pipe()
            .atomic()
            .cmd("LRANGE")
            .arg(&key)
            .arg(range.start)
            .arg(range.end - 1)
            .cmd("EXPIRE")
            .arg(&key)
            .arg(self.ttl_secs)
            .query_async(&mut conn)
            .await
            .map_err(failed("read_log_page"))?;
        let records = lines
            .iter()
            .map(|line| {
                serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
                    location: format!("redis key {key}"),
                    detail: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(LogPage {
            records,
            first_index: range.start,
            total,
        })
    }

    async fn put_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let key = self.state_key(tenant, session, key);
        let mut conn = self.conn().await?;
        redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("EX")
            .arg(self.ttl_secs)
            .query_async::<()>(&mut conn)
            .await
            .map_err(failed("put_state"))
    }

    async fn get_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = self.state_key(tenant, session, key);
        let mut conn = self.conn().await?;
        redis::cmd("GETEX")
            .arg(&key)
            .arg("EX")
            .arg(self.ttl_secs)
            .query_async(&mut conn)
            .await
            .map_err(failed("get_state"))
    }

    async fn compare_and_set_state(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        key: &StateKey,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> Result<bool, StoreError> {
        let key = self.state_key(tenant, session, key);
        let mut conn = self.conn().await?;
        let (present, expected) = match expected {
            Some(bytes) => ("1", bytes),
            None => ("0", &b""[..]),
        };
        self.cas
            .key(&key)
            .arg(present)
            .arg(expected)
            .arg(new)
            .arg(self.ttl_secs)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|replaced| replaced == 1)
            .map_err(failed("compare_and_set_state"))
    }

    async fn try_lock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.lock_key(tenant, session, name);
        let mut conn = self.conn().await?;
        self.lock
            .key(&key)
            .arg(holder)
            .arg(ttl_millis(ttl))
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|held| held == 1)
            .map_err(failed("try_lock"))
    }

    async fn unlock(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        name: &StateKey,
        holder: &str,
    ) -> Result<(), StoreError> {
        let key = self.lock_key(tenant, session, name);
        let mut conn = self.conn().await?;
        self.unlock
            .key(&key)
            .arg(holder)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(failed("unlock"))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(failed("ping"))
    }

    /// Nothing runs in the background: Redis expires keys itself.
    async fn close(&self) {}

    async fn list_sessions(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        self.list(tenant).await
    }

    async fn erase_session(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
        leave: Leave,
    ) -> Result<usize, StoreError> {
        self.erase(tenant, session, refs, leave).await
    }
}

#[cfg(test)]
mod tests;
