//! The context layer's in-process caches, each bounded, evicting what is least likely to be
//! used again (moka's TinyLFU, quick_cache's CLOCK-Pro for the two looked up per message) and,
//! where an entry goes stale, expiring it. Every cache only
//! saves work: losing an entry costs a recomputation, a store write or a cache judged warm
//! (the safe side), never a wrong answer. The bounds are here, one constant each, and in
//! `docs/configuration.md` ("In-process caches").

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::sync::Cache;

use super::session::Identity;
use super::transforms::Lossless;
use crate::store::{ContentRef, Tenant};

/// Content hash → reference: most entries remembered (a reference is ~40 bytes).
pub const REFERENCES: u64 = 1_000_000;
/// Content hash → lossless form of a tool result: most bytes of transformed text remembered.
pub const TRANSFORMED_BYTES: u64 = 256 * 1024 * 1024;
/// (tenant, reference) → when this process last stored it: most entries remembered.
pub const WRITTEN: u64 = 1_000_000;
/// How long a stored reference is remembered: past it, the next request that needs it stores
/// it again and journals it once more.
pub const WRITTEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Tenants an upstream accepted: most remembered.
pub const ACCEPTED: u64 = 100_000;
/// How long an acceptance is remembered: past it, a refusal of a tenant's key erases a
/// session only if that session left no journal line of an earlier request.
pub const ACCEPTED_TTL: Duration = Duration::from_secs(24 * 3600);
/// Sessions whose last request time is remembered (a forgotten session's provider cache
/// counts as warm, the safe side).
pub const LAST_SEEN: u64 = 100_000;
/// How long a session's last request time is remembered: well past every provider's cache
/// lifetime (at most an hour), after which it counts as warm again.
pub const LAST_SEEN_TTL: Duration = Duration::from_secs(6 * 3600);

/// The two caches looked up once per message of every request (content hash → reference,
/// → lossless form) are quick_cache's: a lookup costs a fraction of moka's, which showed on
/// the warm path of a 200-message request.
pub type PerMessage<V> = quick_cache::sync::Cache<u128, V, ByBytes>;

/// Content hash → reference, so a compacted message is not hashed with SHA-256 every turn.
pub fn references() -> PerMessage<ContentRef> {
    PerMessage::with_weighter(REFERENCES as usize, REFERENCES, ByBytes)
}

/// Content hash → lossless form of a tool result (`None`: no transform applies), weighed by
/// its text's bytes.
pub fn transformed() -> PerMessage<Option<Arc<Lossless>>> {
    PerMessage::with_weighter(1 << 16, TRANSFORMED_BYTES, ByBytes)
}

/// The weight of an entry: a reference counts one; a lossless form its text's bytes.
#[derive(Clone, Copy)]
pub struct ByBytes;

impl quick_cache::Weighter<u128, ContentRef> for ByBytes {
    fn weight(&self, _: &u128, _: &ContentRef) -> u64 {
        1
    }
}

impl quick_cache::Weighter<u128, Option<Arc<Lossless>>> for ByBytes {
    fn weight(&self, _: &u128, form: &Option<Arc<Lossless>>) -> u64 {
        form.as_ref().map_or(0, |l| l.text.len()) as u64 + 32
    }
}

/// Content this process stored, per tenant, and when.
pub fn written() -> Cache<(Tenant, ContentRef), Instant> {
    Cache::builder()
        .max_capacity(WRITTEN)
        .time_to_live(WRITTEN_TTL)
        .build()
}

/// Tenants an upstream has accepted (answered 2xx).
pub fn accepted() -> Cache<Tenant, ()> {
    Cache::builder()
        .max_capacity(ACCEPTED)
        .time_to_live(ACCEPTED_TTL)
        .build()
}

/// When each session last sent a request to this process.
pub fn last_seen() -> Cache<Identity, Instant> {
    Cache::builder()
        .max_capacity(LAST_SEEN)
        .time_to_live(LAST_SEEN_TTL)
        .build()
}

/// Something remembered per session, as long as when it was last seen: whether it was warned
/// that its budget costs more than going direct (once per session), its counting factor.
pub fn per_session<V: Clone + Send + Sync + 'static>() -> Cache<Identity, V> {
    Cache::builder()
        .max_capacity(LAST_SEEN)
        .time_to_live(LAST_SEEN_TTL)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_past_its_bound_evicts_instead_of_growing() {
        let cache: PerMessage<ContentRef> = PerMessage::with_weighter(100, 100, ByBytes);
        for n in 0..10_000u128 {
            cache.insert(n, ContentRef::of(&n.to_string()));
        }
        assert!(cache.len() <= 100, "{}", cache.len());
        let weighed = transformed();
        let big = Arc::new(Lossless {
            text: "x".repeat(1 << 20),
            minified: true,
            deduped: 0,
        });
        for n in 0..400u128 {
            weighed.insert(n, Some(big.clone()));
        }
        assert!(weighed.weight() <= TRANSFORMED_BYTES);
        assert!(weighed.len() < 400);
    }
}
