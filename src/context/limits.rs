//! Limits learned from upstreams: when an upstream answers "context too long" and states its
//! limit, that limit replaces the table's window for that upstream and model from the next
//! request on. [`stated_limit`] reads an error body (pure); [`LearnedLimits`] keeps what was
//! learned in memory and in the store, so a restarted proxy still knows it.
//!
//! The store holds all learned limits as one JSON state record under a tenant of its own
//! (`Tenant::from_api_key(Some("_context_proxy_limits"))`, a hash like every tenant), session
//! `learned-limits`, key `limits`. Like all state it is kept `retention_days` after its last
//! write; a limit forgotten is learned again from the next error.

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::store::{SessionId, StateKey, Store, StoreError, Tenant};

/// Upstream and model pairs remembered; further ones are not learned (model names come from
/// clients, so the map must be bounded).
const MAX_LEARNED: usize = 4096;
/// Longest model name remembered.
const MAX_MODEL_LEN: usize = 200;
/// Limits outside this range are not believed.
const PLAUSIBLE: std::ops::RangeInclusive<usize> = 256..=100_000_000;

/// The context limit an upstream states in an error answer, when it states one:
///
/// - OpenAI's `context_length_exceeded` and vLLM: "This model's maximum context length is N
///   tokens. However, you requested M tokens…" (also vLLM's "…is N tokens and your request
///   has M input tokens");
/// - llama.cpp's `exceed_context_size_error`: `{"error":{…,"n_prompt_tokens":M,"n_ctx":N}}`;
/// - Anthropic-style "prompt is too long: M tokens > N maximum".
///
/// Only error statuses (400 and above) are read.
pub fn stated_limit(status: u16, body: &[u8]) -> Option<usize> {
    if status < 400 {
        return None;
    }
    let text = String::from_utf8_lossy(body);
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let error = json.as_ref().and_then(|v| v.get("error"));
    if let Some(e) = error {
        if e.get("type").and_then(Value::as_str) == Some("exceed_context_size_error") {
            if let Some(n) = e.get("n_ctx").and_then(Value::as_u64) {
                return plausible(usize::try_from(n).ok()?);
            }
        }
    }
    let lower = text.to_ascii_lowercase();
    if let Some(n) = number_after(&lower, "maximum context length is ") {
        return plausible(n);
    }
    if let Some(at) = lower.find("prompt is too long: ") {
        let rest = &lower[at..];
        if let Some(gt) = rest.find("tokens > ") {
            return plausible(number_after(&rest[gt..], "tokens > ")?);
        }
    }
    None
}

fn plausible(n: usize) -> Option<usize> {
    PLAUSIBLE.contains(&n).then_some(n)
}

/// The number (digits, `,` and `_` allowed between them) right after the first `needle`.
fn number_after(text: &str, needle: &str) -> Option<usize> {
    let at = text.find(needle)? + needle.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '_')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    upstream: String,
    model: String,
    limit: usize,
}

/// Limits learned per (upstream name, model), in memory and in the store.
#[derive(Debug, Default)]
pub struct LearnedLimits {
    map: DashMap<(String, String), usize>,
    loaded: OnceCell<()>,
}

impl LearnedLimits {
    pub fn new() -> LearnedLimits {
        LearnedLimits::default()
    }

    fn tenant() -> Tenant {
        Tenant::from_api_key(Some("_context_proxy_limits"))
    }

    fn location() -> Result<(SessionId, StateKey), StoreError> {
        Ok((
            SessionId::parse("learned-limits")?,
            StateKey::parse("limits")?,
        ))
    }

    /// The limit learned for `model` on `upstream`. Without an upstream name, the smallest
    /// learned for `model` on any upstream (routing is by model, so it is usually one).
    pub fn get(&self, upstream: Option<&str>, model: &str) -> Option<usize> {
        if self.map.is_empty() {
            return None;
        }
        match upstream {
            Some(u) => self
                .map
                .get(&(u.to_string(), model.to_string()))
                .map(|v| *v),
            None => self
                .map
                .iter()
                .filter(|e| e.key().1 == model)
                .map(|e| *e.value())
                .min(),
        }
    }

    /// Reads what earlier runs learned, once; a store failure only warns (and is retried on
    /// no later call: the limits are learned again from the next error).
    pub async fn load(&self, store: &dyn Store) {
        self.loaded
            .get_or_init(|| async {
                match Self::read(store).await {
                    Ok(entries) => {
                        for e in entries.into_iter().take(MAX_LEARNED) {
                            if plausible(e.limit).is_some() {
                                self.map.entry((e.upstream, e.model)).or_insert(e.limit);
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the learned context limits"),
                }
            })
            .await;
    }

    async fn read(store: &dyn Store) -> Result<Vec<Entry>, StoreError> {
        let (session, key) = Self::location()?;
        match store.get_state(&Self::tenant(), &session, &key).await? {
            None => Ok(Vec::new()),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::Internal(format!("learned limits: {e}"))),
        }
    }

    /// Remembers that `model` on `upstream` takes at most `limit` tokens; returns whether it
    /// is new. Persisted at once; a store failure only warns.
    pub async fn learn(
        &self,
        store: &dyn Store,
        upstream: &str,
        model: &str,
        limit: usize,
    ) -> bool {
        if plausible(limit).is_none() || model.len() > MAX_MODEL_LEN {
            return false;
        }
        self.load(store).await;
        let key = (upstream.to_string(), model.to_string());
        if self.map.get(&key).is_some_and(|v| *v == limit) {
            return false;
        }
        if !self.map.contains_key(&key) && self.map.len() >= MAX_LEARNED {
            return false;
        }
        self.map.insert(key, limit);
        if let Err(e) = self.persist(store).await {
            tracing::warn!(error = %e, "cannot store the learned context limits");
        }
        true
    }

    async fn persist(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut entries: Vec<Entry> = self
            .map
            .iter()
            .map(|e| Entry {
                upstream: e.key().0.clone(),
                model: e.key().1.clone(),
                limit: *e.value(),
            })
            .collect();
        entries.sort_by(|a, b| (&a.upstream, &a.model).cmp(&(&b.upstream, &b.model)));
        let bytes = serde_json::to_vec(&entries)
            .map_err(|e| StoreError::Internal(format!("learned limits: {e}")))?;
        let (session, key) = Self::location()?;
        store
            .put_state(&Self::tenant(), &session, &key, &bytes)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Backend, StoreConfig};

    #[test]
    fn openai_context_length_exceeded() {
        let body = br#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 8227 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(stated_limit(400, body), Some(8192));
        assert_eq!(stated_limit(200, body), None);
    }

    #[test]
    fn vllm_wordings() {
        // vllm-project/vllm#20409
        let body = br#"{"object":"error","message":"This model's maximum context length is 16384 tokens. However, you requested 122946 tokens (112946 in the messages, 10000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(stated_limit(400, body), Some(16384));
        let newer = br#"{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 10000. This model's maximum context length is 32768 tokens and your request has 30000 input tokens (10000 > 32768 - 30000).","type":"BadRequestError","param":null,"code":400}}"#;
        assert_eq!(stated_limit(400, newer), Some(32768));
    }

    #[test]
    fn llama_cpp_exceed_context_size_error() {
        // ggml-org/llama.cpp#15780, oobabooga/textgen#7257
        let body = br#"{"error":{"code":400,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":14429,"n_ctx":8192}}"#;
        assert_eq!(stated_limit(400, body), Some(8192));
        let without = br#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"invalid_request_error"}}"#;
        assert_eq!(stated_limit(400, without), None);
    }

    #[test]
    fn anthropic_prompt_is_too_long() {
        // boldsoftware/exe.dev#62
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 200251 tokens > 200000 maximum"},"request_id":"req_011CWdepJvA2D819tdYYq4h7"}"#;
        assert_eq!(stated_limit(400, body), Some(200_000));
    }

    #[test]
    fn other_errors_state_nothing() {
        for body in [
            &br#"{"error":{"message":"Invalid API key","type":"invalid_request_error"}}"#[..],
            b"<html>413 Request Entity Too Large</html>",
            b"maximum context length is 3 tokens",
            b"",
        ] {
            assert_eq!(stated_limit(400, body), None);
        }
    }

    #[tokio::test]
    async fn learned_limits_persist_in_the_store() {
        let store = crate::store::open(&StoreConfig {
            backend: Backend::Memory,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let store = &*store;
        let learned = LearnedLimits::new();
        assert!(learned.learn(store, "local", "qwen", 8192).await);
        assert!(!learned.learn(store, "local", "qwen", 8192).await);
        assert_eq!(learned.get(Some("local"), "qwen"), Some(8192));
        assert_eq!(learned.get(None, "qwen"), Some(8192));
        assert_eq!(learned.get(Some("other"), "qwen"), None);
        let again = LearnedLimits::new();
        again.load(store).await;
        assert_eq!(again.get(Some("local"), "qwen"), Some(8192));
    }
}
