//! Inspection and erasure on Redis: one Lua script each, so that on a Redis Cluster they run on
//! the node that holds the tenant's slot (every key of a tenant shares its hash tag) and SCAN
//! only that node. Listing every tenant (the admin's view) runs the listing script on every
//! primary of a cluster and joins what they found.

use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{FromRedisValue, Script};

use super::conn::Connection;
use super::{failed, RedisStore};
use crate::store::{ContentRef, SessionId, StoreError, Tenant};

/// Scans the keys matching ARGV[1] .. '*' (ARGV[1] ends with `:` or `{`) and returns the
/// distinct `<tenant>\n<session>` of the journals and state records among them. KEYS[1] is any
/// key of the tenant's slot (or none, for every tenant: on a cluster the script is sent to every
/// primary). ARGV[2] is the key prefix with its `:`.
const LIST_SCRIPT: &str = r"
local cursor = '0'
local seen = {}
local out = {}
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1] .. '*', 'COUNT', 1000)
  cursor = r[1]
  for _, k in ipairs(r[2]) do
    local rest = string.sub(k, #ARGV[2] + 1)
    local t, kind, s = string.match(rest, '^{([^}]+)}:([ls]):([^:]+)')
    if t then
      local id = t .. '\n' .. s
      if not seen[id] then
        seen[id] = true
        table.insert(out, id)
      end
    end
  end
until cursor == '0'
return out
";

/// Deletes KEYS[1] (the journal), every key matching ARGV[1] .. '*' (the session's state
/// records and locks) and ARGV[1] .. 'c:' .. each of ARGV[5..] (content); sets the tombstone
/// KEYS[2] to ARGV[3] (the time, epoch ms) for ARGV[4] seconds. Returns how many were deleted.
const ERASE_SCRIPT: &str = r"
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
local n = redis.call('DEL', KEYS[1])
for _, pattern in ipairs({ARGV[1] .. 's:' .. ARGV[2] .. ':*', ARGV[1] .. 'k:' .. ARGV[2] .. ':*'}) do
  local cursor = '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do
      n = n + redis.call('DEL', k)
    end
  until cursor == '0'
end
for i = 5, #ARGV do
  n = n + redis.call('DEL', ARGV[1] .. 'c:' .. ARGV[i])
end
return n
";

impl RedisStore {
    pub(super) async fn list(
        &self,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<(Tenant, SessionId)>, StoreError> {
        let mut conn = self.conn().await?;
        let prefix = format!("{}:", self.prefix);
        let ids: Vec<String> = match (tenant, &mut conn) {
            // Every tenant on a cluster: each primary scans its own keys.
            (None, Connection::Cluster(cluster)) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(LIST_SCRIPT)
                    .arg(0)
                    .arg(format!("{prefix}{{"))
                    .arg(&prefix);
                let all_primaries = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::CombineArrays),
                ));
                let value = cluster
                    .route_command(&eval, all_primaries)
                    .await
                    .map_err(failed("list_sessions"))?;
                Vec::<String>::from_redis_value(&value).map_err(failed("list_sessions"))?
            }
            _ => {
                let script = Script::new(LIST_SCRIPT);
                let mut invocation = script.prepare_invoke();
                match tenant {
                    Some(t) => invocation
                        .key(format!("{prefix}{{{t}}}:l:_"))
                        .arg(format!("{prefix}{{{t}}}:")),
                    None => invocation.arg(format!("{prefix}{{")),
                };
                invocation
                    .arg(&prefix)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(failed("list_sessions"))?
            }
        };
        let mut found: Vec<(Tenant, SessionId)> = ids
            .iter()
            .filter_map(|id| {
                let (t, s) = id.split_once('\n')?;
                Some((Tenant::from_id(t)?, SessionId::from_stored(s)?))
            })
            .collect();
        found.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
        // A key being moved between two primaries may be seen on both.
        found.dedup();
        Ok(found)
    }

    pub(super) async fn erase(
        &self,
        tenant: &Tenant,
        session: &SessionId,
        refs: &[ContentRef],
    ) -> Result<usize, StoreError> {
        let mut conn = self.conn().await?;
        let script = Script::new(ERASE_SCRIPT);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.log_key(tenant, session))
            .key(self.tombstone_key(tenant, session))
            .arg(format!("{}:{{{tenant}}}:", self.prefix))
            .arg(session.as_str())
            .arg(crate::store::epoch_millis(std::time::SystemTime::now()))
            .arg(self.ttl_secs);
        for r in refs {
            invocation.arg(r.as_str());
        }
        let n: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(failed("erase_session"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
