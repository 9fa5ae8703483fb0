//! A bounded, concurrent cache of token counts keyed by a content hash, so that the next
//! request of a conversation tokenizes only its new messages.
//!
//! **Key.** A 128-bit XXH3 hash of a JSON value's canonical bytes, salted with what the count
//! depends on (the encoding, the media estimates, and which rules apply: message or tools).
//! The canonical bytes are a type-tagged, length-prefixed walk of the value in the order its
//! object keys arrived, fed to the hasher without serializing the value. The same message
//! resent byte-for-byte always hits; one whose keys were reordered merely misses. The hash is
//! seeded per cache from the process's random hasher keys, so no one can aim colliding
//! messages at it; a chance collision (about 2⁻¹²⁸ per pair) would only misreport one count.
//!
//! **Bound.** At most `capacity` entries (`CountSettings::cache_entries`; 0 turns caching
//! off). Eviction is an approximate LRU by generations: the generation advances every
//! `capacity / 4` insertions, a lookup stamps the entry with the current generation, and when
//! an insertion takes the cache over capacity, one thread drops every entry not used in the
//! current or previous generation, then, if that freed too little, every entry not used in the
//! current one, then, as a last resort, everything, so that at most 3/4 of capacity remains.
//! A long-lived conversation's messages, hit on every request, survive; one-off messages go.
//! Under concurrent insertions the size may briefly pass capacity by about one entry per
//! inserting thread. An entry costs about 40 bytes.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use dashmap::DashMap;
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

/// A cached count and the generation in which it was last used.
struct Slot {
    tokens: u32,
    used: AtomicU32,
}

/// The cache; shared by every [`super::Counter`] cloned from the same one.
pub struct CountCache {
    map: DashMap<u128, Slot, BuildHasherDefault<KeyHasher>>,
    capacity: usize,
    /// Insertions per generation (capacity / 4, at least 1).
    generation_len: usize,
    generation: AtomicU32,
    inserts: AtomicUsize,
    /// Entries in `map`, kept here so that an insertion need not lock every shard to know.
    len: AtomicUsize,
    evicting: AtomicBool,
    seed: u64,
}

impl CountCache {
    pub fn new(capacity: usize) -> CountCache {
        CountCache {
            map: DashMap::default(),
            capacity,
            generation_len: (capacity / 4).max(1),
            generation: AtomicU32::new(0),
            inserts: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            evicting: AtomicBool::new(false),
            seed: RandomState::new().hash_one(0x746f_6b65_6e73_u64),
        }
    }

    /// Whether the cache stores anything at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Number of cached counts.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The key of `value` under `salt` (everything else the count depends on).
    pub fn key(&self, salt: &[u8], value: &Value) -> u128 {
        hash_canonical(Some((self.seed, salt)), false, value).0
    }

    /// `(self.key(salt, value), stable_hash(value))` from one walk of `value`: a request's
    /// messages need both, the count's key and the hash that identifies its prefix.
    pub fn key_and_stable_hash(&self, salt: &[u8], value: &Value) -> (u128, u128) {
        hash_canonical(Some((self.seed, salt)), true, value)
    }

    /// The cached count for `key`, marking it as recently used.
    pub fn get(&self, key: u128) -> Option<usize> {
        let slot = self.map.get(&key)?;
        let now = self.generation.load(Ordering::Relaxed);
        if slot.used.load(Ordering::Relaxed) != now {
            slot.used.store(now, Ordering::Relaxed);
        }
        Some(slot.tokens as usize)
    }

    /// Remembers `tokens` for `key`, evicting old entries if the cache is over capacity.
    pub fn insert(&self, key: u128, tokens: usize) {
        if !self.enabled() {
            return;
        }
        let now = self.tick();
        let slot = Slot {
            tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            used: AtomicU32::new(now),
        };
        if self.map.insert(key, slot).is_none() {
            let len = self.len.fetch_add(1, Ordering::Relaxed) + 1;
            if len > self.capacity {
                self.evict();
            }
        }
    }

    /// Counts one insertion and returns the current generation.
    fn tick(&self) -> u32 {
        let n = self.inserts.fetch_add(1, Ordering::Relaxed) + 1;
        if n % self.generation_len == 0 {
            self.generation
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1)
        } else {
            self.generation.load(Ordering::Relaxed)
        }
    }

    /// Brings the cache down to at most 3/4 of capacity; one thread at a time, others skip.
    fn evict(&self) {
        if self
            .evicting
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let target = self.capacity - self.capacity / 4;
        let now = self.generation.load(Ordering::Relaxed);
        let age = |slot: &Slot| now.wrapping_sub(slot.used.load(Ordering::Relaxed));
        if self.map.len() > target {
            self.map.retain(|_, slot| age(slot) <= 1);
        }
        if self.map.len() > target {
            self.map.retain(|_, slot| age(slot) == 0);
        }
        if self.map.len() > target {
            self.map.clear();
        }
        self.len.store(self.map.len(), Ordering::Relaxed);
        self.evicting.store(false, Ordering::Release);
    }
}

/// Keys are already uniform 128-bit hashes: the map's hasher just takes 64 bits of them.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached if something other than a u128 is hashed; fold it in.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(word)).rotate_left(29);
        }
    }

    fn write_u128(&mut self, key: u128) {
        self.0 = key as u64 ^ (key >> 64) as u64;
    }
}

const TAG_NULL: u8 = 0;
const TAG_FALSE: u8 = 1;
const TAG_TRUE: u8 = 2;
const TAG_U64: u8 = 3;
const TAG_I64: u8 = 4;
const TAG_F64: u8 = 5;
const TAG_STRING: u8 = 6;
const TAG_ARRAY: u8 = 7;
const TAG_OBJECT: u8 = 8;

/// Feeds the canonical bytes of `value` to `hasher`: a tag per node, lengths before contents.
/// A hash of `value`'s content that is the same in every process (XXH3-128, seed 0), for keys
/// that are persisted (conversation prefixes). Not keyed: use it where a collision can only
/// hurt the one who crafted it.
pub fn stable_hash(value: &Value) -> u128 {
    hash_canonical(None, true, value).1
}

/// Canonical bytes gathered before they are hashed in one go (a later piece streams through
/// [`Streams`]); the buffer is kept per thread, so hashing a message allocates nothing.
const GATHERED: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Hashes the canonical bytes of `value`: keyed (`(seed, salt)`, the salt's canonical bytes
/// first) and, when `stable`, unkeyed. Returns `(keyed, stable)`, 0 for a hash not asked for.
///
/// The canonical bytes come in many tiny pieces (tags, lengths): they are gathered in a
/// buffer and hashed at once, which for a message of a few hundred bytes costs a fraction of
/// feeding a streaming hasher. Past [`GATHERED`] bytes they go on through streaming hashers.
/// Either way the hash is XXH3-128 of the whole canonical bytes (XXH3's streaming form equals
/// its one-shot form).
fn hash_canonical(keyed: Option<(u64, &[u8])>, stable: bool, value: &Value) -> (u128, u128) {
    SCRATCH.with(|scratch| {
        let mut own = Vec::new();
        let mut borrowed = scratch.try_borrow_mut().ok();
        let buf = borrowed.as_deref_mut().unwrap_or(&mut own);
        buf.clear();
        let mut sink = Sink {
            buf,
            salted: 0,
            seed: keyed.map(|(seed, _)| seed),
            stable,
            streams: None,
        };
        if let Some((_, salt)) = keyed {
            write_bytes(&mut sink, salt);
            sink.salted = sink.buf.len();
        }
        write_value(&mut sink, value);
        let hashes = sink.finish();
        if buf.capacity() > GATHERED * 2 {
            *buf = Vec::new();
        }
        hashes
    })
}

/// Where canonical bytes go: `buf` (its first `salted` bytes are the salt, read only by the
/// keyed hash), and once it is full, the streaming hashers.
struct Sink<'a> {
    buf: &'a mut Vec<u8>,
    salted: usize,
    seed: Option<u64>,
    stable: bool,
    streams: Option<Box<Streams>>,
}

/// The streaming form of the hashes, for canonical bytes longer than [`GATHERED`].
struct Streams {
    keyed: Option<Xxh3>,
    stable: Option<Xxh3>,
}

impl Sink<'_> {
    fn update(&mut self, bytes: &[u8]) {
        if bytes.len() > GATHERED {
            // A long string goes to the streaming hashers without a copy.
            self.spill();
            self.stream(bytes, 0);
            return;
        }
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > GATHERED {
            self.spill();
        }
    }

    /// Moves what `buf` holds into the streaming hashers.
    fn spill(&mut self) {
        let buf = std::mem::take(self.buf);
        self.stream(&buf, self.salted);
        *self.buf = buf;
        self.buf.clear();
        self.salted = 0;
    }

    /// Feeds `bytes` to the streaming hashers, the first `salted` to the keyed one only.
    fn stream(&mut self, bytes: &[u8], salted: usize) {
        let (seed, stable) = (self.seed, self.stable);
        let streams = self.streams.get_or_insert_with(|| {
            Box::new(Streams {
                keyed: seed.map(Xxh3::with_seed),
                stable: stable.then(Xxh3::new),
            })
        });
        if let Some(keyed) = &mut streams.keyed {
            keyed.update(bytes);
        }
        if let Some(unkeyed) = &mut streams.stable {
            unkeyed.update(&bytes[salted..]);
        }
    }

    fn finish(mut self) -> (u128, u128) {
        use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed};
        if self.streams.is_some() {
            self.spill();
        }
        match &self.streams {
            None => (
                self.seed
                    .map_or(0, |seed| xxh3_128_with_seed(self.buf, seed)),
                if self.stable {
                    xxh3_128(&self.buf[self.salted..])
                } else {
                    0
                },
            ),
            Some(streams) => (
                streams.keyed.as_ref().map_or(0, Xxh3::digest128),
                streams.stable.as_ref().map_or(0, Xxh3::digest128),
            ),
        }
    }
}

fn write_value(hasher: &mut Sink<'_>, value: &Value) {
    match value {
        Value::Null => hasher.update(&[TAG_NULL]),
        Value::Bool(false) => hasher.update(&[TAG_FALSE]),
        Value::Bool(true) => hasher.update(&[TAG_TRUE]),
        Value::Number(n) => {
            // A number's count depends on how it is written (1 vs 1.0): keep the kind.
            if let Some(u) = n.as_u64() {
                hasher.update(&[TAG_U64]);
                hasher.update(&u.to_le_bytes());
            } else if let Some(i) = n.as_i64() {
                hasher.update(&[TAG_I64]);
                hasher.update(&i.to_le_bytes());
            } else {
                hasher.update(&[TAG_F64]);
                hasher.update(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
            }
        }
        Value::String(s) => {
            hasher.update(&[TAG_STRING]);
            write_bytes(hasher, s.as_bytes());
        }
        Value::Array(items) => {
            hasher.update(&[TAG_ARRAY]);
            hasher.update(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(hasher, item);
            }
        }
        Value::Object(fields) => {
            hasher.update(&[TAG_OBJECT]);
            hasher.update(&(fields.len() as u64).to_le_bytes());
            for (key, item) in fields {
                write_bytes(hasher, key.as_bytes());
                write_value(hasher, item);
            }
        }
    }
}

fn write_bytes(hasher: &mut Sink<'_>, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The canonical bytes of `value`, written out (the definition the hashes must follow).
    fn canonical_bytes(value: &Value, out: &mut Vec<u8>) {
        let bytes = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        };
        match value {
            Value::Null => out.push(TAG_NULL),
            Value::Bool(false) => out.push(TAG_FALSE),
            Value::Bool(true) => out.push(TAG_TRUE),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    out.push(TAG_U64);
                    out.extend_from_slice(&u.to_le_bytes());
                } else if let Some(i) = n.as_i64() {
                    out.push(TAG_I64);
                    out.extend_from_slice(&i.to_le_bytes());
                } else {
                    out.push(TAG_F64);
                    out.extend_from_slice(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
                }
            }
            Value::String(s) => {
                out.push(TAG_STRING);
                bytes(out, s.as_bytes());
            }
            Value::Array(items) => {
                out.push(TAG_ARRAY);
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    canonical_bytes(item, out);
                }
            }
            Value::Object(fields) => {
                out.push(TAG_OBJECT);
                out.extend_from_slice(&(fields.len() as u64).to_le_bytes());
                for (key, item) in fields {
                    bytes(out, key.as_bytes());
                    canonical_bytes(item, out);
                }
            }
        }
    }

    /// Buffering changes no hash: prefix hashes are persisted, so a stored decision must still
    /// be found after an upgrade. Values small and large, with strings around the buffer's size.
    #[test]
    fn hashes_are_xxh3_of_the_canonical_bytes() {
        let long = |n: usize| "é".repeat(n);
        let values = [
            json!(null),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "tool", "tool_call_id": "c1", "content": long(255)}),
            json!({"role": "tool", "content": long(256)}),
            json!({"role": "tool", "content": long(100_000), "x": [1, -2, 2.5, true, {"k": long(300)}]}),
            json!([long(500), long(10), long(513), 18446744073709551615u64]),
            // Around the gathered size: spilled part way, a string streamed through.
            json!({"role": "tool", "content": long(GATHERED / 2 - 20)}),
            json!([
                long(GATHERED / 2 - 8),
                long(GATHERED / 2),
                "x",
                long(GATHERED),
                long(GATHERED / 2 + 1)
            ]),
        ];
        let cache = CountCache::new(4);
        for v in &values {
            let mut canonical = Vec::new();
            canonical_bytes(v, &mut canonical);
            assert_eq!(stable_hash(v), xxhash_rust::xxh3::xxh3_128(&canonical));
            let mut salted = Vec::new();
            salted.extend_from_slice(&2u64.to_le_bytes());
            salted.extend_from_slice(b"ab");
            salted.extend_from_slice(&canonical);
            assert_eq!(
                cache.key(b"ab", v),
                xxhash_rust::xxh3::xxh3_128_with_seed(&salted, cache.seed)
            );
            assert_eq!(
                cache.key_and_stable_hash(b"ab", v),
                (cache.key(b"ab", v), stable_hash(v))
            );
        }
    }

    #[test]
    fn keys_tell_values_apart() {
        let cache = CountCache::new(16);
        let distinct = [
            json!(null),
            json!(false),
            json!(true),
            json!(0),
            json!(-1),
            json!(1.0),
            json!(""),
            json!("0"),
            json!([]),
            json!({}),
            json!(["a", "b"]),
            json!(["ab"]),
            json!({"a": "b"}),
            json!({"ab": ""}),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "user", "content": "hi "}),
            json!({"role": "user", "content": ["hi"]}),
        ];
        let keys: Vec<u128> = distinct.iter().map(|v| cache.key(b"", v)).collect();
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate() {
                assert_eq!(i == j, a == b, "{} vs {}", distinct[i], distinct[j]);
            }
        }
        let m = json!({"role": "user", "content": "hi"});
        assert_eq!(cache.key(b"x", &m), cache.key(b"x", &m.clone()));
        assert_ne!(cache.key(b"x", &m), cache.key(b"y", &m));
    }

    #[test]
    fn get_after_insert() {
        let cache = CountCache::new(8);
        assert_eq!(cache.get(1), None);
        cache.insert(1, 42);
        assert_eq!(cache.get(1), Some(42));
        cache.insert(2, usize::MAX);
        assert_eq!(cache.get(2), Some(u32::MAX as usize));
    }

    #[test]
    fn disabled_cache_stores_nothing() {
        let cache = CountCache::new(0);
        cache.insert(1, 42);
        assert_eq!(cache.get(1), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_bounded_and_keeps_what_is_used() {
        let capacity = 1000;
        let cache = CountCache::new(capacity);
        // A conversation of 100 messages, looked up on every "request".
        for k in 0..100u128 {
            cache.insert(k, k as usize);
        }
        for round in 0..200u128 {
            for k in 0..100u128 {
                assert_eq!(
                    cache.get(k),
                    Some(k as usize),
                    "hot entry {k} lost in round {round}"
                );
            }
            // Each request also brings 50 one-off messages.
            for k in 0..50u128 {
                cache.insert(1_000_000 + round * 50 + k, 1);
            }
            assert!(cache.len() <= capacity, "len {} > {capacity}", cache.len());
        }
    }

    #[test]
    fn bounded_when_everything_is_hot() {
        let cache = CountCache::new(64);
        for k in 0..10_000u128 {
            cache.insert(k, 1);
            for j in k.saturating_sub(100)..=k {
                cache.get(j);
            }
            assert!(cache.len() <= 64);
        }
    }

    #[test]
    fn concurrent_use() {
        let cache = std::sync::Arc::new(CountCache::new(500));
        let threads: Vec<_> = (0..4u128)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for k in 0..5_000u128 {
                        let key = t * 1_000_000 + k;
                        cache.insert(key, k as usize);
                        if let Some(n) = cache.get(key) {
                            assert_eq!(n, k as usize);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Up to one extra entry per thread may race past an eviction.
        assert!(cache.len() <= 500 + 4, "len {}", cache.len());
    }
}
