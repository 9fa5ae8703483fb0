//! Limits learned from upstreams: when an upstream answers "context too long" and states its
//! limit, that limit replaces the table's window for that upstream and model from the next
//! request on. [`stated_limit`] reads an error body (pure); [`LearnedLimits`] keeps what was
//! learned in memory and in the store, so a restarted proxy still knows it.
//!
//! An error body is client-influenced (some servers echo invalid values back), and a learned
//! limit shrinks every later request of that model, so learning is guarded:
//! - only the documented overflow forms are read, anchored where the server puts them (an
//!   OpenAI `context_length_exceeded` code, a vLLM message that *begins* with its overflow
//!   sentence, llama.cpp's `exceed_context_size_error` numbers, Anthropic's "prompt is too
//!   long" message); a number anywhere else in an error is not evidence;
//! - only when the request that drew the error was larger than the limit it states (the
//!   proxy's own count of what it sent, plus the answer's room);
//! - never below a floor for the model ([`floor`]);
//! - one tenant's evidence rules only that tenant's requests until it is confirmed: by a
//!   second tenant stating the same limit, or by the upstream answering the smaller request
//!   the proxy retried with ([`LearnedLimits::confirm`]).
//!
//! The store holds all learned limits as one JSON state record under a tenant of its own
//! (`Tenant::from_api_key(Some("_context_proxy_limits"))`, a hash like every tenant), session
//! `learned-limits`, key `limits`. Like all state it is kept `retention_days` after its last
//! write; a limit forgotten is learned again from the next error. Records written before these
//! guards (a bare `limit`, from any error) are not trusted: they load as nothing.

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::store::{SessionId, StateKey, Store, StoreError, Tenant};

/// Upstream and model pairs remembered; further ones are not learned (model names come from
/// clients, so the map must be bounded).
const MAX_LEARNED: usize = 4096;
/// Tenants whose unconfirmed report is remembered per upstream and model (the oldest go).
const MAX_REPORTS: usize = 8;
/// Longest model name remembered.
const MAX_MODEL_LEN: usize = 200;
/// Limits outside this range are not believed.
const PLAUSIBLE: std::ops::RangeInclusive<usize> = 256..=100_000_000;
/// No limit below this many tokens is learned, for any model: a tool-using agent's prompt
/// alone is larger.
pub const MIN_LEARNED: usize = 1_024;

/// The smallest limit learned for a model whose window is `window` tokens (from the config,
/// the upstream's default window or the built-in table): 1/32 of it (servers often run a model
/// below its native window, e.g. a 128k model at 8k, but not at a few hundred tokens), and
/// never below [`MIN_LEARNED`], which is all that holds for a model nothing says anything of
/// (a llama.cpp server at `n_ctx` 2048 is common).
pub fn floor(window: Option<usize>) -> usize {
    window.map_or(0, |w| w / 32).max(MIN_LEARNED)
}

/// The context limit an upstream states in an error answer, when it states one in a form
/// that means "the context is too long":
///
/// - OpenAI (`code: "context_length_exceeded"`): "This model's maximum context length is N
///   tokens. However, your messages resulted in M tokens…";
/// - vLLM (its error object, or its top-level `{"object":"error","message":…}`), the message
///   beginning with "This model's maximum context length is N tokens…" or "'max_tokens' or
///   'max_completion_tokens' is too large: X. This model's maximum context length is N
///   tokens…";
/// - llama.cpp's `exceed_context_size_error`: `{"error":{…,"n_prompt_tokens":M,"n_ctx":N}}`;
/// - Anthropic (`invalid_request_error`): "prompt is too long: M tokens > N maximum", or
///   "input length and `max_tokens` exceed context limit: M + X > N…".
///
/// Only error statuses (400 and above) are read; any other text is not evidence.
pub fn stated_limit(status: u16, body: &[u8]) -> Option<usize> {
    if status < 400 {
        return None;
    }
    let json: Value = serde_json::from_slice(body).ok()?;
    let error = json.get("error").filter(|e| e.is_object());
    let message = error
        .and_then(|e| e.get("message"))
        .or_else(|| json.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let field = |key: &str| error.and_then(|e| e.get(key)).and_then(Value::as_str);
    if field("type") == Some("exceed_context_size_error") {
        let n = error?.get("n_ctx").and_then(Value::as_u64)?;
        return plausible(usize::try_from(n).ok()?);
    }
    let lower = message.trim_start().to_ascii_lowercase();
    const MAXIMUM: &str = "this model's maximum context length is ";
    const TOO_LARGE: &str = "'max_tokens' or 'max_completion_tokens' is too large: ";
    if field("code") == Some("context_length_exceeded") || lower.starts_with(MAXIMUM) {
        return plausible(number_after(&lower, MAXIMUM)?);
    }
    if let Some(rest) = lower.strip_prefix(TOO_LARGE) {
        // "…is too large: 10000. This model's maximum context length is N tokens…": the first
        // sentence holds only the client's number.
        let sentence = rest.split_once(". ")?.1;
        return plausible(number_after(
            sentence.strip_prefix("this model's ")?,
            "maximum context length is ",
        )?);
    }
    let anthropic = field("type") == Some("invalid_request_error")
        && json.get("type").and_then(Value::as_str) == Some("error");
    if anthropic {
        if let Some(rest) = lower.strip_prefix("prompt is too long: ") {
            let gt = rest.find("tokens > ")?;
            return plausible(number_after(&rest[gt..], "tokens > ")?);
        }
        if let Some(rest) =
            lower.strip_prefix("input length and `max_tokens` exceed context limit: ")
        {
            return plausible(number_after(rest, "> ")?);
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

/// One tenant's report of a limit, not confirmed yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Report {
    tenant: String,
    limit: usize,
}

/// What is known of one upstream and model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Known {
    /// The limit every tenant's requests are planned against.
    #[serde(default)]
    confirmed: Option<usize>,
    /// Reports each ruling only its own tenant's requests, newest last.
    #[serde(default)]
    reports: Vec<Report>,
}

impl Known {
    /// The limit for `tenant`'s requests: its own report, else the confirmed limit.
    fn for_tenant(&self, tenant: &str) -> Option<usize> {
        self.reports
            .iter()
            .rev()
            .find(|r| r.tenant == tenant)
            .map(|r| r.limit)
            .or(self.confirmed)
    }

    /// Adds `tenant`'s report of `limit`; a second tenant stating the same limit confirms it.
    /// Returns whether anything changed.
    fn report(&mut self, tenant: &str, limit: usize) -> bool {
        if self.confirmed == Some(limit) {
            return false;
        }
        if self
            .reports
            .iter()
            .any(|r| r.tenant != tenant && r.limit == limit)
        {
            self.confirm(limit);
            return true;
        }
        if self
            .reports
            .iter()
            .any(|r| r.tenant == tenant && r.limit == limit)
        {
            return false;
        }
        self.reports.retain(|r| r.tenant != tenant);
        self.reports.push(Report {
            tenant: tenant.to_string(),
            limit,
        });
        if self.reports.len() > MAX_REPORTS {
            self.reports.remove(0);
        }
        true
    }

    /// `limit` holds for every tenant; the reports of it are settled.
    fn confirm(&mut self, limit: usize) {
        self.confirmed = Some(limit);
        self.reports.retain(|r| r.limit != limit);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    upstream: String,
    model: String,
    #[serde(flatten)]
    known: Known,
}

/// The request that drew an overflow error, as the route knows it.
#[derive(Debug, Clone, Copy)]
pub struct Drawn<'a> {
    pub tenant: &'a Tenant,
    /// The body as forwarded (for the answer's room it asked for).
    pub sent: &'a Value,
    /// The proxy's count of the prompt it forwarded.
    pub sent_tokens: usize,
    /// The upstream's default context window (a self-hosted server's `context_window`).
    pub default_window: Option<usize>,
}

/// What a request that drew an overflow error sent, to judge the limit it states.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    /// The tenant whose request it was.
    pub tenant: &'a Tenant,
    /// The proxy's count of the prompt it forwarded.
    pub sent_tokens: usize,
    /// The answer's room the request asked for (`max_tokens`…), when it asked.
    pub requested_output: Option<usize>,
    /// The model's window from the config, the upstream's default or the built-in table,
    /// when known (for the [`floor`]).
    pub window: Option<usize>,
}

impl Evidence<'_> {
    /// Whether a limit of `limit` tokens can be what refused this request: not below the
    /// floor, and no larger than what was sent (the proxy's count may be a quarter under the
    /// upstream's own tokenizer).
    pub fn supports(&self, limit: usize) -> bool {
        let sent = self.sent_tokens + self.sent_tokens / 4 + self.requested_output.unwrap_or(0);
        limit >= floor(self.window) && sent >= limit
    }
}

/// Limits learned per (upstream name, model), in memory and in the store.
#[derive(Debug, Default)]
pub struct LearnedLimits {
    map: DashMap<(String, String), Known>,
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

    /// The limit learned for `tenant`'s requests of `model` on `upstream`: its own report, else
    /// a confirmed limit. Without an upstream name, the smallest over every upstream (routing
    /// is by model, so it is usually one).
    pub fn get(&self, upstream: Option<&str>, model: &str, tenant: &Tenant) -> Option<usize> {
        if self.map.is_empty() {
            return None;
        }
        let tenant = tenant.as_str();
        match upstream {
            Some(u) => self
                .map
                .get(&(u.to_string(), model.to_string()))
                .and_then(|k| k.for_tenant(tenant)),
            None => self
                .map
                .iter()
                .filter(|e| e.key().1 == model)
                .filter_map(|e| e.value().for_tenant(tenant))
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
                        for mut e in entries.into_iter().take(MAX_LEARNED) {
                            e.known.confirmed = e.known.confirmed.and_then(plausible);
                            e.known.reports.retain(|r| plausible(r.limit).is_some());
                            e.known.reports.truncate(MAX_REPORTS);
                            if e.known != Known::default() {
                                self.map.entry((e.upstream, e.model)).or_insert(e.known);
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

    /// Remembers that `evidence`'s tenant was told `model` on `upstream` takes at most `limit`
    /// tokens, when the evidence supports it ([`Evidence::supports`]); returns whether anything
    /// changed. Persisted at once; a store failure only warns.
    pub async fn learn(
        &self,
        store: &dyn Store,
        upstream: &str,
        model: &str,
        limit: usize,
        evidence: &Evidence<'_>,
    ) -> bool {
        if plausible(limit).is_none() || model.len() > MAX_MODEL_LEN || !evidence.supports(limit) {
            return false;
        }
        self.load(store).await;
        let tenant = evidence.tenant.as_str();
        self.update(store, upstream, model, |known| known.report(tenant, limit))
            .await
    }

    /// The upstream answered a request planned for `limit` (the retry after its error): the
    /// limit holds for every tenant. Returns whether anything changed.
    pub async fn confirm(
        &self,
        store: &dyn Store,
        upstream: &str,
        model: &str,
        limit: usize,
    ) -> bool {
        let key = (upstream.to_string(), model.to_string());
        let reported = self
            .map
            .get(&key)
            .is_some_and(|k| k.reports.iter().any(|r| r.limit == limit));
        if !reported {
            return false;
        }
        self.update(store, upstream, model, |known| {
            known.confirm(limit);
            true
        })
        .await
    }

    async fn update(
        &self,
        store: &dyn Store,
        upstream: &str,
        model: &str,
        change: impl FnOnce(&mut Known) -> bool,
    ) -> bool {
        let key = (upstream.to_string(), model.to_string());
        if !self.map.contains_key(&key) && self.map.len() >= MAX_LEARNED {
            return false;
        }
        let changed = change(&mut self.map.entry(key).or_default());
        if changed {
            if let Err(e) = self.persist(store).await {
                tracing::warn!(error = %e, "cannot store the learned context limits");
            }
        }
        changed
    }

    async fn persist(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut entries: Vec<Entry> = self
            .map
            .iter()
            .map(|e| Entry {
                upstream: e.key().0.clone(),
                model: e.key().1.clone(),
                known: e.value().clone(),
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
    fn anthropic_input_and_max_tokens_over_the_limit() {
        // continuedev/continue#6080
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}"#;
        assert_eq!(stated_limit(400, body), Some(200_000));
    }

    #[test]
    fn other_errors_state_nothing() {
        for body in [
            &br#"{"error":{"message":"Invalid API key","type":"invalid_request_error"}}"#[..],
            b"<html>413 Request Entity Too Large</html>",
            b"maximum context length is 3 tokens",
            b"This model's maximum context length is 8192 tokens.",
            b"",
        ] {
            assert_eq!(stated_limit(400, body), None);
        }
    }

    #[test]
    fn a_limit_echoed_from_the_client_is_not_evidence() {
        // Validation errors that quote the client's own values (issue: a message role of
        // "maximum context length is 300 tokens" shrank every tenant's requests).
        for body in [
            // vLLM / pydantic, quoting the invalid role.
            &br#"{"object":"error","message":"1 validation error for ChatCompletionRequest
messages.0.role
  Input should be 'system', 'user', 'assistant' or 'tool' [type=literal_error, input_value='maximum context length is 300 tokens', input_type=str]","type":"BadRequestError","param":null,"code":400}"#[..],
            // OpenAI-shaped, another code.
            br#"{"error":{"message":"Invalid value: 'This model's maximum context length is 300 tokens'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.","type":"invalid_request_error","param":"messages[0].role","code":"invalid_value"}}"#,
            // Anthropic-shaped, the wording in the middle.
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages.0.role: unexpected value 'prompt is too long: 9999 tokens > 300 maximum'"}}"#,
            // Not Anthropic's envelope: its wording alone is not enough.
            br#"{"error":{"type":"invalid_request_error","message":"prompt is too long: 9999 tokens > 300 maximum"}}"#,
        ] {
            assert_eq!(stated_limit(400, body), None, "{}", String::from_utf8_lossy(body));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5_000))]

        /// Any bytes: an answer or none, never a panic.
        #[test]
        fn any_body_is_read_without_panicking(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = stated_limit(400, &body);
        }

        /// Whatever text a client slips into its request, an upstream's non-overflow error that
        /// quotes it (at any place, under any envelope but the overflow forms) states no limit.
        #[test]
        fn client_text_quoted_in_another_error_states_no_limit(
            quoted in "(This model's |prompt is too long: |'max_tokens' or 'max_completion_tokens' is too large: 9\\. )?(maximum context length is |[0-9]{1,6} tokens > )[0-9]{3,7}( tokens| maximum)?[ -~]{0,40}",
            envelope in 0usize..4,
        ) {
            let text = serde_json::Value::from(format!("Invalid value for 'messages[0].role': {quoted}"));
            let body = match envelope {
                0 => format!(r#"{{"error":{{"message":{text},"type":"invalid_request_error","param":"messages[0].role","code":"invalid_value"}}}}"#),
                1 => format!(r#"{{"object":"error","message":{text},"type":"BadRequestError","param":null,"code":400}}"#),
                2 => format!(r#"{{"type":"error","error":{{"type":"invalid_request_error","message":{text}}}}}"#),
                _ => format!(r#"{{"error":{{"message":{text},"type":"BadRequestError","code":400}}}}"#),
            };
            proptest::prop_assert_eq!(stated_limit(400, body.as_bytes()), None, "{}", body);
        }
    }

    fn evidence(tenant: &Tenant, sent_tokens: usize) -> Evidence<'_> {
        Evidence {
            tenant,
            sent_tokens,
            requested_output: None,
            window: Some(128_000),
        }
    }

    #[test]
    fn a_limit_must_be_below_what_was_sent_and_above_the_floor() {
        let t = Tenant::from_api_key(Some("a"));
        assert_eq!(floor(Some(128_000)), 4_000);
        assert_eq!(floor(Some(8_192)), MIN_LEARNED);
        assert_eq!(floor(None), MIN_LEARNED);
        assert!(evidence(&t, 7_000).supports(6_000));
        // The proxy's count may be a quarter under the upstream's.
        assert!(evidence(&t, 5_000).supports(6_000));
        assert!(!evidence(&t, 4_000).supports(6_000));
        let with_output = Evidence {
            requested_output: Some(3_000),
            ..evidence(&t, 4_000)
        };
        assert!(with_output.supports(6_000));
        // Below the model's floor, whatever was sent.
        assert!(!evidence(&t, 13_900).supports(300));
        assert!(!evidence(&t, 13_900).supports(3_999));
    }

    async fn memory_store() -> std::sync::Arc<dyn Store> {
        crate::store::open(&StoreConfig {
            backend: Backend::Memory,
            ..StoreConfig::default()
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn one_tenants_limit_rules_others_only_once_confirmed() {
        let store = memory_store().await;
        let store = &*store;
        let (a, b, c) = (
            Tenant::from_api_key(Some("a")),
            Tenant::from_api_key(Some("b")),
            Tenant::from_api_key(Some("c")),
        );
        let learned = LearnedLimits::new();
        assert!(
            learned
                .learn(store, "local", "qwen", 8192, &evidence(&a, 9_000))
                .await
        );
        assert!(
            !learned
                .learn(store, "local", "qwen", 8192, &evidence(&a, 9_000))
                .await
        );
        assert_eq!(learned.get(Some("local"), "qwen", &a), Some(8192));
        assert_eq!(learned.get(None, "qwen", &a), Some(8192));
        assert_eq!(learned.get(Some("local"), "qwen", &b), None);
        assert_eq!(learned.get(Some("other"), "qwen", &a), None);
        // A second tenant stating the same limit confirms it for everyone.
        assert!(
            learned
                .learn(store, "local", "qwen", 8192, &evidence(&b, 9_000))
                .await
        );
        assert_eq!(learned.get(Some("local"), "qwen", &c), Some(8192));
        // A later report of another limit rules its own tenant only.
        assert!(
            learned
                .learn(store, "local", "qwen", 6000, &evidence(&c, 7_000))
                .await
        );
        assert_eq!(learned.get(Some("local"), "qwen", &c), Some(6000));
        assert_eq!(learned.get(Some("local"), "qwen", &a), Some(8192));
        // Unsupported evidence is not learned at all.
        assert!(
            !learned
                .learn(store, "local", "qwen", 300, &evidence(&a, 13_900))
                .await
        );
        assert_eq!(learned.get(Some("local"), "qwen", &a), Some(8192));
        // Persisted, with what is confirmed and what is not.
        let again = LearnedLimits::new();
        again.load(store).await;
        assert_eq!(again.get(Some("local"), "qwen", &b), Some(8192));
        assert_eq!(again.get(Some("local"), "qwen", &c), Some(6000));
    }

    #[tokio::test]
    async fn the_upstream_answering_the_smaller_request_confirms_the_limit() {
        let store = memory_store().await;
        let store = &*store;
        let (a, b) = (
            Tenant::from_api_key(Some("a")),
            Tenant::from_api_key(Some("b")),
        );
        let learned = LearnedLimits::new();
        // Nothing reported: nothing to confirm.
        assert!(!learned.confirm(store, "local", "qwen", 8192).await);
        assert!(
            learned
                .learn(store, "local", "qwen", 8192, &evidence(&a, 9_000))
                .await
        );
        assert!(!learned.confirm(store, "local", "qwen", 6000).await);
        assert_eq!(learned.get(Some("local"), "qwen", &b), None);
        assert!(learned.confirm(store, "local", "qwen", 8192).await);
        assert_eq!(learned.get(Some("local"), "qwen", &b), Some(8192));
    }

    #[tokio::test]
    async fn limits_stored_before_the_guards_are_not_trusted() {
        let store = memory_store().await;
        let (session, key) = LearnedLimits::location().unwrap();
        let old = br#"[{"upstream":"local","model":"qwen","limit":300}]"#;
        store
            .put_state(&LearnedLimits::tenant(), &session, &key, old)
            .await
            .unwrap();
        let learned = LearnedLimits::new();
        learned.load(&*store).await;
        assert_eq!(
            learned.get(Some("local"), "qwen", &Tenant::from_api_key(Some("a"))),
            None
        );
    }
}
