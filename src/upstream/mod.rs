//! The upstreams: which one serves a model, and sending a request to it.
//!
//! Each configured upstream has its own pooled reqwest client (rustls). A request is routed by
//! its model name against the upstreams' patterns; a model no pattern matches goes to the
//! default upstream. Timeouts: connecting, and the longest silence while waiting for the
//! response headers or between two body chunks. There is deliberately no total timeout, so a
//! long stream is never cut while it keeps sending.
//!
//! [`relay`] passes an upstream's answer on to the client as it arrives.

mod config;
pub mod relay;

pub use config::UpstreamConfig;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Method;

use crate::glob::glob_match;
use crate::http::error::ClientError;
use crate::http::headers::end_to_end;

/// Request headers starting with this are the proxy's own and never forwarded.
pub use context_proxy_contract::CONTROL_HEADER_PREFIX;

/// An upstream's own key, as the two headers that carry keys want it.
#[derive(Clone)]
struct OwnKey {
    /// `Bearer <key>`, for `Authorization`.
    bearer: HeaderValue,
    /// The key alone, for Anthropic's `x-api-key`.
    bare: HeaderValue,
}

impl std::fmt::Debug for OwnKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnKey(..)")
    }
}

/// Anthropic's API key header.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// One upstream API.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    /// The same, shared with the responses in flight (for their error messages).
    label: Arc<str>,
    /// Base URL, parsed once: every request's URL is this with its path and query replaced.
    base: reqwest::Url,
    /// The base URL's path without a trailing slash, e.g. `/v1` (empty for the root).
    base_path: String,
    /// The key replacing the client's, when the config gives this upstream one.
    authorization: Option<OwnKey>,
    /// Whether this is Anthropic's own API (`*.anthropic.com`), which takes an API key only in
    /// `x-api-key` on its Messages routes.
    anthropic_api: bool,
    patterns: Vec<String>,
    read_timeout: Duration,
    client: reqwest::Client,
    /// Tokenizer override for this upstream's models.
    pub encoding: Option<crate::tokens::Encoding>,
    /// Context window of models the built-in table does not know (`context_window`).
    pub context_window: Option<usize>,
    /// The provider's prompt-caching prices (`cache_pricing` and its overrides).
    pub cache: crate::pricing::CacheTerms,
    /// Compaction requests go to this upstream as they came (`native_compaction`).
    pub native_compaction: bool,
    /// Anthropic Messages: the share of the budget or window within which the exact count is
    /// asked for (`count_tokens_margin`; 0: never), and how long it is waited for.
    pub count_tokens_margin: f64,
    pub count_tokens_timeout: Duration,
}

/// Every configured upstream and the routing between them (cloned cheaply: the upstreams are
/// shared).
#[derive(Debug, Clone)]
pub struct Upstreams {
    list: Vec<Arc<Upstream>>,
    default: usize,
}

/// What can go wrong while building the upstreams at start-up.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    #[error("upstream {upstream}: environment variable {var} (api_key_env) is not set")]
    MissingKey { upstream: String, var: String },
    #[error("upstream {upstream}: the key in {var} is not a valid header value")]
    InvalidKey { upstream: String, var: String },
    #[error("upstream {upstream}: base_url {url:?} is not a URL without query or fragment")]
    BaseUrl { upstream: String, url: String },
    #[error("{0}")]
    Pricing(String),
    #[error("upstream {upstream}: cannot build the HTTP client: {source}")]
    Client {
        upstream: String,
        source: reqwest::Error,
    },
}

impl Upstreams {
    /// Builds the clients. `env` reads an environment variable (injected for tests).
    pub fn new(
        configs: &[UpstreamConfig],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Upstreams, UpstreamSetupError> {
        let mut list = Vec::with_capacity(configs.len());
        for cfg in configs {
            let authorization = match &cfg.api_key_env {
                None => None,
                Some(var) => {
                    let key = env(var).ok_or_else(|| UpstreamSetupError::MissingKey {
                        upstream: cfg.name.clone(),
                        var: var.clone(),
                    })?;
                    let invalid = || UpstreamSetupError::InvalidKey {
                        upstream: cfg.name.clone(),
                        var: var.clone(),
                    };
                    let mut bearer =
                        HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| invalid())?;
                    bearer.set_sensitive(true);
                    let mut bare = HeaderValue::from_str(&key).map_err(|_| invalid())?;
                    bare.set_sensitive(true);
                    Some(OwnKey { bearer, bare })
                }
            };
            let client = reqwest::Client::builder()
                .connect_timeout(cfg.connect_timeout())
                .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
                .tcp_nodelay(true)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|source| UpstreamSetupError::Client {
                    upstream: cfg.name.clone(),
                    source,
                })?;
            let base = reqwest::Url::parse(&cfg.base_url)
                .ok()
                .filter(|u| u.query().is_none() && u.fragment().is_none())
                .ok_or_else(|| UpstreamSetupError::BaseUrl {
                    upstream: cfg.name.clone(),
                    url: cfg.base_url.clone(),
                })?;
            let anthropic_api = base.host_str().is_some_and(|host| {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                host == "anthropic.com" || host.ends_with(".anthropic.com")
            });
            list.push(Arc::new(Upstream {
                name: cfg.name.clone(),
                label: Arc::from(cfg.name.as_str()),
                base_path: base.path().trim_end_matches('/').to_string(),
                base,
                authorization,
                anthropic_api,
                patterns: cfg.models.clone(),
                read_timeout: cfg.read_timeout(),
                client,
                encoding: cfg.encoding,
                context_window: cfg.context_window,
                native_compaction: cfg.native_compaction,
                count_tokens_margin: cfg.count_tokens_margin,
                count_tokens_timeout: cfg.count_tokens_timeout(),
                cache: cfg
                    .cache_terms(&format!("upstream {}", cfg.name))
                    .map_err(UpstreamSetupError::Pricing)?,
            }));
        }
        let default = configs.iter().position(|c| c.default).unwrap_or(0);
        Ok(Upstreams { list, default })
    }

    /// The upstream called `name`.
    pub fn named(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.list.iter().find(|u| u.name == name)
    }

    /// The prompt-caching terms of a request sent to the upstream `name` (the one `model` is
    /// routed to when no upstream has that name any more) for `model`.
    pub fn cache_terms(&self, name: &str, model: Option<&str>) -> crate::pricing::CachePricing {
        let upstream = self.named(name).unwrap_or_else(|| self.route(model));
        upstream.cache.for_model(model.unwrap_or(""))
    }

    /// The upstream serving `model`: the first whose patterns match, else the default.
    pub fn route(&self, model: Option<&str>) -> &Arc<Upstream> {
        model
            .and_then(|m| {
                self.list
                    .iter()
                    .find(|u| u.patterns.iter().any(|p| glob_match(p, m)))
            })
            .unwrap_or(&self.list[self.default])
    }
}

/// Why an upstream call got no answer. Mapped to the client's status and error shape in one
/// place (`ProxyError::from`).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {upstream} is unreachable: {detail}")]
    Unreachable { upstream: String, detail: String },
    #[error(
        "upstream {upstream} did not answer within {timeout_ms} ms (upstreams.read_timeout_ms)"
    )]
    Timeout { upstream: String, timeout_ms: u64 },
}

impl ClientError for UpstreamError {
    fn classify(&self) -> (http::StatusCode, &'static str, Option<&'static str>) {
        match self {
            UpstreamError::Unreachable { .. } => (
                http::StatusCode::BAD_GATEWAY,
                "upstream_error",
                Some("upstream_unreachable"),
            ),
            UpstreamError::Timeout { .. } => (
                http::StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                Some("upstream_timeout"),
            ),
        }
    }
}

/// A request for an upstream, built once and sendable any number of times (a tool loop or a
/// retry sends it again, possibly with another body): method, full URL, the headers to send
/// (end-to-end only, the upstream's own key in place of the client's when it has one) and the
/// body.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The upstream's answer: status, end-to-end headers and the body as a stream of chunks.
pub struct Incoming {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    pub body: reqwest::Response,
    read_timeout: Duration,
    upstream: Arc<str>,
}

impl Upstream {
    /// The full URL for `path` (below `/v1`) and `query`: the base URL, parsed at start-up,
    /// with its path extended (parsing a whole URL per request costs more than the rest of
    /// building the request).
    pub fn url(&self, path: &str, query: Option<&str>) -> reqwest::Url {
        let mut full_path = String::with_capacity(self.base_path.len() + path.len());
        full_path.push_str(&self.base_path);
        full_path.push_str(path);
        let mut url = self.base.clone();
        url.set_path(&full_path);
        url.set_query(query);
        url
    }

    /// The headers to send for a client's `headers`: end-to-end ones only, less `drop` and
    /// `host`, with this upstream's own key when it has one.
    fn outgoing_headers(&self, headers: HeaderMap, drop: &[HeaderName]) -> HeaderMap {
        let mut headers = end_to_end(headers, drop);
        headers.remove(header::HOST);
        // The proxy's own control headers (`x-context-session`, `-mode`, `-request-id`, …)
        // are for the proxy, not the upstream.
        let control: Vec<HeaderName> = headers
            .keys()
            .filter(|name| name.as_str().starts_with(CONTROL_HEADER_PREFIX))
            .cloned()
            .collect();
        for name in control {
            headers.remove(name);
        }
        if let Some(key) = &self.authorization {
            // An Anthropic client sends its key in `x-api-key`: the upstream's own goes there
            // too (Anthropic's API wants it there), and the client's never goes upstream. On
            // Anthropic's own API a Messages request (it names its `anthropic-version`) takes
            // an API key only there, whichever header the client used for its proxy key (a
            // bearer there is an OAuth token: Claude Code's `ANTHROPIC_AUTH_TOKEN` sends one).
            let anthropic_request = self.anthropic_api && headers.contains_key("anthropic-version");
            if headers.remove(X_API_KEY).is_some() || anthropic_request {
                headers.remove(header::AUTHORIZATION);
                headers.insert(X_API_KEY, key.bare.clone());
            } else {
                headers.insert(header::AUTHORIZATION, key.bearer.clone());
            }
        }
        headers
    }

    /// Builds a request for `path` (below `/v1`) from the client's headers (taken) and `body`.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        client_headers: HeaderMap,
        drop: &[HeaderName],
        body: Bytes,
    ) -> UpstreamRequest {
        UpstreamRequest {
            method,
            url: self.url(path, query),
            headers: self.outgoing_headers(client_headers, drop),
            body,
        }
    }

    /// A JSON `POST` of the proxy's own (the summarizer's) to `path` (below `/v1`), sent with
    /// `authorization` (the client's), which the upstream's own key replaces when it has one.
    pub fn json_post(
        &self,
        path: &str,
        authorization: Option<&HeaderValue>,
        body: Bytes,
    ) -> UpstreamRequest {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(auth) = authorization {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        self.request(Method::POST, path, None, headers, &[], body)
    }

    /// Sends `req` (it stays usable) and waits for the response headers, bounded by the read
    /// timeout.
    pub async fn send(&self, req: &UpstreamRequest) -> Result<Incoming, UpstreamError> {
        let mut request = reqwest::Request::new(req.method.clone(), req.url.clone());
        *request.headers_mut() = req.headers.clone();
        *request.body_mut() = Some(req.body.clone().into());
        self.execute(request).await
    }

    /// Sends a request whose body streams from the client as it arrives (pass-through routes):
    /// it can be sent only once.
    pub async fn send_streaming(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        client_headers: HeaderMap,
        drop: &[HeaderName],
        body: reqwest::Body,
    ) -> Result<Incoming, UpstreamError> {
        let mut request = reqwest::Request::new(method, self.url(path, query));
        *request.headers_mut() = self.outgoing_headers(client_headers, drop);
        *request.body_mut() = Some(body);
        self.execute(request).await
    }

    async fn execute(&self, request: reqwest::Request) -> Result<Incoming, UpstreamError> {
        let mut response =
            match tokio::time::timeout(self.read_timeout, self.client.execute(request)).await {
                Err(_) => return Err(self.timeout_error()),
                Ok(Err(e)) => return Err(self.send_error(e)),
                Ok(Ok(r)) => r,
            };
        let status = response.status();
        let headers = end_to_end(std::mem::take(response.headers_mut()), &[]);
        Ok(Incoming {
            status,
            headers,
            body: response,
            read_timeout: self.read_timeout,
            upstream: self.label.clone(),
        })
    }

    fn timeout_error(&self) -> UpstreamError {
        UpstreamError::Timeout {
            upstream: self.name.clone(),
            timeout_ms: self.read_timeout.as_millis() as u64,
        }
    }

    /// The error for a failed send. The URL is left out of the message: clients see the
    /// upstream's name, never its address.
    fn send_error(&self, e: reqwest::Error) -> UpstreamError {
        if e.is_timeout() {
            return self.timeout_error();
        }
        UpstreamError::Unreachable {
            upstream: self.name.clone(),
            detail: error_chain(&e.without_url()),
        }
    }
}

/// An upstream body that failed or fell silent mid-way.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("upstream {upstream} sent nothing for {timeout_ms} ms")]
    Idle { upstream: String, timeout_ms: u64 },
    #[error("upstream {upstream} body failed: {detail}")]
    Failed { upstream: String, detail: String },
}

impl Incoming {
    /// The body as a stream of chunks; a silence longer than the read timeout ends it with
    /// [`BodyError::Idle`]. Dropping the stream closes the upstream connection.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, BodyError>> + Send + 'static {
        let Incoming {
            body,
            read_timeout,
            upstream,
            ..
        } = self;
        let chunks = body.bytes_stream();
        futures_util::stream::unfold(Some((chunks, upstream)), move |state| async move {
            let (mut chunks, upstream) = state?;
            match tokio::time::timeout(read_timeout, chunks.next()).await {
                Ok(None) => None,
                Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some((chunks, upstream)))),
                Ok(Some(Err(e))) => {
                    let err = BodyError::Failed {
                        upstream: upstream.to_string(),
                        // Clients see the upstream's name, never its address.
                        detail: error_chain(&e.without_url()),
                    };
                    Some((Err(err), None))
                }
                Err(_) => {
                    let err = BodyError::Idle {
                        upstream: upstream.to_string(),
                        timeout_ms: read_timeout.as_millis() as u64,
                    };
                    Some((Err(err), None))
                }
            }
        })
    }
}

/// `e` and its sources, joined, for an error message a person can act on.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, models: &[&str], default: bool) -> UpstreamConfig {
        UpstreamConfig {
            name: name.into(),
            base_url: format!("http://{name}.invalid/v1/"),
            models: models.iter().map(|s| s.to_string()).collect(),
            default,
            ..UpstreamConfig::default()
        }
    }

    #[test]
    fn routes_by_pattern_and_falls_back_to_default() {
        let ups = Upstreams::new(
            &[
                cfg("openai", &["gpt-*", "o?-*"], false),
                cfg("local", &["llama*"], true),
            ],
            |_| None,
        )
        .unwrap();
        assert_eq!(ups.route(Some("gpt-4o")).name, "openai");
        assert_eq!(ups.route(Some("o3-mini")).name, "openai");
        assert_eq!(ups.route(Some("llama3")).name, "local");
        assert_eq!(ups.route(Some("mistral")).name, "local");
        assert_eq!(ups.route(None).name, "local");
        assert_eq!(
            ups.route(Some("gpt-4o"))
                .url("/chat/completions", Some("a=1"))
                .as_str(),
            "http://openai.invalid/v1/chat/completions?a=1"
        );
    }

    #[test]
    fn urls_join_base_path_and_request_path() {
        let up = |base: &str| {
            let mut c = cfg("x", &[], true);
            c.base_url = base.into();
            Upstreams::new(&[c], |_| None).unwrap()
        };
        let url = |base: &str, path: &str, query: Option<&str>| {
            up(base).route(None).url(path, query).to_string()
        };
        assert_eq!(
            url("http://h:8/v1", "/models", None),
            "http://h:8/v1/models"
        );
        assert_eq!(url("http://h/v1/", "/models", None), "http://h/v1/models");
        assert_eq!(url("http://h", "/models", None), "http://h/models");
        assert_eq!(
            url("http://h/", "/a/b", Some("x=1&y=%20two")),
            "http://h/a/b?x=1&y=%20two"
        );
        assert_eq!(
            url("https://h/openai/v1", "/files/f-1/content", Some("")),
            "https://h/openai/v1/files/f-1/content?"
        );
        let mut c = cfg("q", &[], true);
        c.base_url = "http://h/v1?k=1".into();
        let err = Upstreams::new(&[c], |_| None).unwrap_err();
        assert!(err.to_string().contains("base_url"), "{err}");
    }

    #[test]
    fn the_upstreams_key_goes_where_the_client_put_its_own() {
        let mut c = cfg("x", &[], true);
        c.api_key_env = Some("KEY".into());
        let ups = Upstreams::new(&[c], |_| Some("sk-up".into())).unwrap();
        let up = ups.route(None);
        let sent = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            up.request(Method::POST, "/x", None, h, &[], Bytes::new())
                .headers
        };
        let openai = sent(&[("authorization", "Bearer client")]);
        assert_eq!(openai["authorization"], "Bearer sk-up");
        assert!(!openai.contains_key("x-api-key"));
        let anthropic = sent(&[("x-api-key", "client"), ("anthropic-version", "2023-06-01")]);
        assert_eq!(anthropic["x-api-key"], "sk-up");
        assert!(!anthropic.contains_key("authorization"));
        assert_eq!(anthropic["anthropic-version"], "2023-06-01");
    }

    /// Anthropic's API takes an API key only in `x-api-key` (a bearer token there is an OAuth
    /// token): a Messages request from a client that sent its proxy key as a bearer (Claude
    /// Code with `ANTHROPIC_AUTH_TOKEN`) still gets the upstream's key in `x-api-key`. Another
    /// host, and a request that is not Anthropic's, keep the client's header.
    #[test]
    fn anthropics_api_gets_its_key_in_x_api_key_whatever_the_client_used() {
        let sent = |base_url: &str, pairs: &[(&'static str, &'static str)]| {
            let mut c = cfg("x", &[], true);
            c.base_url = base_url.into();
            c.api_key_env = Some("KEY".into());
            let ups = Upstreams::new(&[c], |_| Some("sk-up".into())).unwrap();
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            ups.route(None)
                .request(Method::POST, "/messages", None, h, &[], Bytes::new())
                .headers
        };
        let bearer_messages = [
            ("authorization", "Bearer proxy-key"),
            ("anthropic-version", "2023-06-01"),
        ];
        let anthropic = sent("https://api.anthropic.com/v1", &bearer_messages);
        assert_eq!(anthropic["x-api-key"], "sk-up");
        assert!(!anthropic.contains_key("authorization"));
        let gateway = sent("https://gateway.example/v1", &bearer_messages);
        assert_eq!(gateway["authorization"], "Bearer sk-up");
        assert!(!gateway.contains_key("x-api-key"));
        // Anthropic's OpenAI-compatible endpoints take the key as a bearer.
        let chat = sent(
            "https://api.anthropic.com/v1",
            &[("authorization", "Bearer proxy-key")],
        );
        assert_eq!(chat["authorization"], "Bearer sk-up");
    }

    #[test]
    fn missing_key_env_is_named() {
        let mut c = cfg("x", &[], true);
        c.api_key_env = Some("NO_SUCH_KEY_VAR".into());
        let err = Upstreams::new(&[c], |_| None).unwrap_err();
        assert!(err.to_string().contains("NO_SUCH_KEY_VAR"), "{err}");
    }
}
