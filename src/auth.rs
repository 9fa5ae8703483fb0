//! Who is calling: the proxy's own client keys, checked before anything is stored or sent.
//!
//! When an upstream has a key of its own (`api_key_env`), the proxy must never relay that key to
//! whoever reaches it (invariant *Isolated*). Clients then present a key the proxy knows: one of
//! the `[[keys]]` of the config or of `[auth] keys_file`, each given by a name and the SHA-256 of
//! the key (the key itself is never written anywhere, logged or stored). Each key is a tenant of
//! its own; it may be limited to some models and upstreams, and to a number of requests and of
//! tokens per minute. Without upstream keys, the client's own `Authorization` passes through as
//! before and its hash is the tenant.
//!
//! The router calls [`Auth::authenticate`] once for every `/v1/…` request and leaves the
//! [`Caller`] in the request's extensions; the chat and pass-through routes check the model
//! with [`Caller::authorize`] once they know it. This module decides; it does no I/O after
//! start-up (the keys file is read once, by [`Auth::new`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::StatusCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::glob::glob_match;
use crate::http::error::ClientError;
use crate::store::Tenant;

/// The `[auth]` section.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Let any client use the upstreams' own keys without a proxy key. Dangerous: whoever
    /// reaches the proxy spends those keys. Only for a proxy nobody else can reach.
    pub open_relay: bool,
    /// A TOML file of `[[keys]]` entries (same fields as in the config), read at start-up.
    pub keys_file: Option<PathBuf>,
    /// Name of an environment variable holding the admin token: it may inspect and erase the
    /// sessions of every tenant on the `/v1/context/…` routes (and only there).
    pub admin_token_env: Option<String>,
    /// Without proxy keys, let a client inspect and erase the sessions of its own key (its
    /// hash) on the `/v1/context/…` routes. Dangerous where clients share a key or send none
    /// (a placeholder such as `EMPTY`): they would see one another's sessions. Only for a proxy
    /// one person uses (the `--demo` sets it). Default false: only the admin token.
    pub inspect_by_client_key: bool,
}

/// One client key the proxy knows (`[[keys]]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Shown in logs and metrics labels; the key itself never is.
    pub name: String,
    /// SHA-256 of the key, 64 hex digits (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// Model name patterns (`*`, `?`) this key may use; empty: any model.
    #[serde(default)]
    pub models: Vec<String>,
    /// Upstream names this key may reach; empty: any upstream.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Most requests in one minute (a bucket refilled continuously); unset: no limit.
    pub requests_per_minute: Option<u32>,
    /// Most tokens (the upstream's `usage.total_tokens`, else the proxy's count) in one
    /// minute; a key over it is refused until its budget refills. Unset: no limit.
    pub tokens_per_minute: Option<u32>,
}

/// The keys file: `[[keys]]` entries only.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyConfig>,
}

/// Checks `[auth]` and `[[keys]]` (called by `Config::validate`): every key named and hashed
/// once, budgets above 0, and no open relay of an upstream key unless asked for.
pub fn validate(auth: &AuthConfig, keys: &[KeyConfig], upstream_keys: bool) -> Result<(), String> {
    check_keys("keys", keys)?;
    if upstream_keys && keys.is_empty() && auth.keys_file.is_none() && !auth.open_relay {
        return Err(
            "an upstream has api_key_env but no proxy keys are configured: add [[keys]] or \
             auth.keys_file so clients must present a key the proxy knows, or set \
             auth.open_relay = true (dangerous: anyone who reaches the proxy spends the \
             upstream's key)"
                .into(),
        );
    }
    Ok(())
}

fn check_keys(section: &str, keys: &[KeyConfig]) -> Result<(), String> {
    let mut names = HashMap::new();
    let mut hashes = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        let at = format!("{section}[{i}]");
        if k.name.is_empty() {
            return Err(format!("{at}.name must not be empty"));
        }
        if names.insert(k.name.as_str(), i).is_some() {
            return Err(format!("{at}.name {:?} is used twice", k.name));
        }
        let hash = parse_hash(&k.sha256).ok_or_else(|| {
            format!(
                "{at}.sha256 of key {:?} must be 64 hex digits (the SHA-256 of the key)",
                k.name
            )
        })?;
        if hashes.insert(hash, i).is_some() {
            return Err(format!("{at}.sha256 of key {:?} is used twice", k.name));
        }
        if k.requests_per_minute == Some(0) || k.tokens_per_minute == Some(0) {
            return Err(format!(
                "{at}.requests_per_minute and tokens_per_minute of key {:?} must be above 0 \
                 (leave them out for no limit)",
                k.name
            ));
        }
    }
    Ok(())
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Why a caller is refused. Mapped to the OpenAI error shape by `ProxyError`.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing API key: send \"Authorization: Bearer <key>\" with a key this proxy knows")]
    Missing,
    #[error("incorrect API key provided")]
    Invalid,
    #[error("the API key {key:?} may not use the model {model:?} (an empty name: the request's model could not be read)")]
    ModelNotAllowed { key: String, model: String },
    #[error("the API key {key:?} may not use the upstream {upstream:?} (serving model {model:?})")]
    UpstreamNotAllowed {
        key: String,
        upstream: String,
        model: String,
    },
    #[error("rate limit reached for the API key {key:?}: {limit} {what} per minute; retry after {retry_after} s")]
    RateLimited {
        key: String,
        what: &'static str,
        limit: u32,
        retry_after: u64,
    },
    /// Without proxy keys, every client with no key (or the same placeholder) is one tenant:
    /// the `/v1/context/…` routes would show each of them the others' sessions.
    #[error("{}", if *.configured {
        "without proxy keys ([[keys]]), the /v1/context/ routes answer only the admin token ([auth] admin_token_env): clients without a key, or with the same placeholder, would share one tenant"
    } else {
        "the /v1/context/ routes are off: without proxy keys ([[keys]]) they need an admin token; set [auth] admin_token_env"
    })]
    AdminTokenRequired { configured: bool },
}

impl ClientError for AuthError {
    fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            AuthError::Missing | AuthError::Invalid => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
            AuthError::ModelNotAllowed { .. } | AuthError::UpstreamNotAllowed { .. } => (
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("model_not_allowed"),
            ),
            AuthError::RateLimited { what, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                what,
                Some("rate_limit_exceeded"),
            ),
            AuthError::AdminTokenRequired { .. } => (
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                Some("admin_token_required"),
            ),
        }
    }

    /// Seconds for the `Retry-After` header, for a rate limit.
    fn retry_after(&self) -> Option<u64> {
        match self {
            AuthError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// What went wrong while loading the keys at start-up.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("cannot read auth.keys_file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid auth.keys_file {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("auth.admin_token_env: environment variable {0} is not set or empty")]
    MissingAdminToken(String),
}

/// A budget of so many units per minute, refilled continuously; it may go into debt (tokens are
/// known only after the answer), and then refuses until it is above zero again.
#[derive(Debug)]
struct Bucket {
    per_minute: u32,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(per_minute: u32) -> Bucket {
        Bucket {
            per_minute,
            state: Mutex::new((f64::from(per_minute), Instant::now())),
        }
    }

    fn refill(&self, state: &mut (f64, Instant), now: Instant) {
        let rate = f64::from(self.per_minute) / 60.0;
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * rate).min(f64::from(self.per_minute));
        state.1 = now;
    }

    /// The deepest debt: refilled to zero within one minute, so a debt never locks a key out
    /// longer than one window.
    fn floor(&self) -> f64 {
        -f64::from(self.per_minute)
    }

    /// Takes `take` units when at least `need` are there; else the seconds until they are.
    fn admit(&self, need: f64, take: f64, now: Instant) -> Result<(), u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut state, now);
        if state.0 >= need {
            state.0 = (state.0 - take).max(self.floor());
            Ok(())
        } else {
            let rate = f64::from(self.per_minute) / 60.0;
            Err(((need - state.0) / rate).ceil().max(1.0) as u64)
        }
    }

    /// Takes `units` (negative: gives them back), down to the floor.
    fn charge(&self, units: f64, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut state, now);
        state.0 = (state.0 - units).max(self.floor());
    }
}

/// One known client key, at run time.
#[derive(Debug)]
pub struct Key {
    pub name: String,
    tenant: Tenant,
    models: Vec<String>,
    upstreams: Vec<String>,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

impl Key {
    fn new(cfg: &KeyConfig) -> Key {
        Key {
            name: cfg.name.clone(),
            tenant: key_tenant(&cfg.name),
            models: cfg.models.clone(),
            upstreams: cfg.upstreams.clone(),
            requests: cfg.requests_per_minute.map(Bucket::new),
            tokens: cfg.tokens_per_minute.map(Bucket::new),
        }
    }
}

/// The tenant of the proxy key named `name`. It follows the name, so a key replaced under the
/// same name keeps its sessions; no client key hashes to it (they are never hashed with this
/// prefix).
pub fn key_tenant(name: &str) -> Tenant {
    Tenant::from_api_key(Some(&format!("\0context-proxy key\0{name}")))
}

/// Who sent a request, as found by [`Auth::authenticate`]; kept in the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Where this caller's sessions and content are stored.
    pub tenant: Tenant,
    /// The proxy key used, when proxy keys are required.
    pub key: Option<Arc<Key>>,
    /// The admin token: every tenant on the `/v1/context/…` routes.
    pub admin: bool,
}

impl Caller {
    /// Checks that this caller may use `model` on `upstream` (403 otherwise). `None`: the
    /// request names no model (a `GET /v1/models`); `Some("")`: it may, but it could not be
    /// read, which a key limited to some models is refused.
    pub fn authorize(&self, model: Option<&str>, upstream: &str) -> Result<(), AuthError> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let model_name = model.unwrap_or("");
        let admit_request = || match &key.requests {
            // Counted only once the request is allowed: a refused model costs nothing.
            Some(bucket) => bucket
                .admit(1.0, 1.0, Instant::now())
                .map_err(|retry_after| AuthError::RateLimited {
                    key: key.name.clone(),
                    what: "requests",
                    limit: bucket.per_minute,
                    retry_after,
                }),
            None => Ok(()),
        };
        if let (false, Some(model)) = (key.models.is_empty(), model) {
            if !key.models.iter().any(|p| glob_match(p, model)) {
                return Err(AuthError::ModelNotAllowed {
                    key: key.name.clone(),
                    model: model.to_string(),
                });
            }
        }
        if !key.upstreams.is_empty() && !key.upstreams.iter().any(|u| u == upstream) {
            return Err(AuthError::UpstreamNotAllowed {
                key: key.name.clone(),
                upstream: upstream.to_string(),
                model: model_name.to_string(),
            });
        }
        admit_request()
    }

    /// Reserves a request's estimated tokens against the key's tokens-per-minute budget before
    /// it is forwarded: admitted while the budget is not spent (one request may take it into
    /// debt), so concurrent requests cannot all pass on the same balance. Settled by
    /// [`Caller::settle_tokens`] once the answer is known.
    pub fn reserve_tokens(&self, estimate: u64) -> Result<(), AuthError> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let Some(bucket) = &key.tokens else {
            return Ok(());
        };
        bucket
            .admit(0.0, estimate as f64, Instant::now())
            .map_err(|retry_after| AuthError::RateLimited {
                key: key.name.clone(),
                what: "tokens",
                limit: bucket.per_minute,
                retry_after,
            })
    }

    /// Counts the `tokens` a request used against the key's tokens-per-minute budget, once the
    /// answer is known; `reserved` (what [`Caller::reserve_tokens`] took) is given back.
    pub fn settle_tokens(&self, tokens: u64, reserved: u64) {
        if let Some(bucket) = self.key.as_ref().and_then(|k| k.tokens.as_ref()) {
            bucket.charge(tokens as f64 - reserved as f64, Instant::now());
        }
    }

    /// Whether the key has a tokens-per-minute budget (the answer's usage must be read).
    pub fn has_token_budget(&self) -> bool {
        self.key.as_ref().is_some_and(|k| k.tokens.is_some())
    }

    /// The key's name, for logs and metrics labels (never the key).
    pub fn key_name(&self) -> Option<&str> {
        self.key.as_deref().map(|k| k.name.as_str())
    }
}

/// The keys the proxy knows and whether clients must present one.
#[derive(Debug)]
pub struct Auth {
    /// Some upstream has a key of its own and the relay is not open: a proxy key is required.
    required: bool,
    keys: HashMap<[u8; 32], Arc<Key>>,
    admin: Option<[u8; 32]>,
    /// `[auth] inspect_by_client_key`.
    inspect_by_client_key: bool,
    /// Every key's tenant and name, sorted by name (the admin's inspection names them).
    names: KeyNames,
}

/// The proxy keys' names by tenant, so that the admin's inspection can say whose a tenant is
/// and take a key's name for its tenant.
#[derive(Debug, Clone, Default)]
pub struct KeyNames(Vec<(Tenant, String)>);

impl KeyNames {
    /// The keys of the config and of `auth.keys_file` (read, not checked: `Auth::new` checks).
    pub fn of(section: &AuthConfig, keys: &[KeyConfig]) -> Result<KeyNames, AuthSetupError> {
        let mut entries = keys.to_vec();
        if let Some(path) = &section.keys_file {
            entries.extend(read_keys_file(path)?);
        }
        Ok(KeyNames::from_entries(&entries))
    }

    fn from_entries(entries: &[KeyConfig]) -> KeyNames {
        let mut names: Vec<(Tenant, String)> = entries
            .iter()
            .map(|k| (key_tenant(&k.name), k.name.clone()))
            .collect();
        names.sort_by(|a, b| a.1.cmp(&b.1));
        KeyNames(names)
    }

    /// The name of the key whose tenant is `tenant`.
    pub fn name_of(&self, tenant: &Tenant) -> Option<&str> {
        self.0
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, n)| n.as_str())
    }

    /// The tenant of the key named `name`.
    pub fn tenant_of(&self, name: &str) -> Option<&Tenant> {
        self.0.iter().find(|(_, n)| n == name).map(|(t, _)| t)
    }
}

impl Auth {
    /// Builds the key table from `[auth]`, `[[keys]]` and `auth.keys_file`; `upstream_keys`:
    /// an upstream sends a key of its own, so clients must present a proxy key (unless
    /// `open_relay`); `env` reads the admin token.
    pub fn new(
        section: &AuthConfig,
        keys: &[KeyConfig],
        upstream_keys: bool,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Auth, AuthSetupError> {
        let mut entries = keys.to_vec();
        if let Some(path) = &section.keys_file {
            entries.extend(read_keys_file(path)?);
            check_keys("keys", &entries).map_err(|message| AuthSetupError::Invalid {
                path: path.display().to_string(),
                message,
            })?;
        }
        let admin = match &section.admin_token_env {
            None => None,
            Some(var) => match env(var) {
                Some(token) if !token.is_empty() => Some(sha256(&token)),
                _ => return Err(AuthSetupError::MissingAdminToken(var.clone())),
            },
        };
        let keys = entries
            .iter()
            .filter_map(|k| Some((parse_hash(&k.sha256)?, Arc::new(Key::new(k)))))
            .collect::<HashMap<_, _>>();
        Ok(Auth {
            required: upstream_keys && !section.open_relay,
            keys,
            admin,
            inspect_by_client_key: section.inspect_by_client_key,
            names: KeyNames::from_entries(&entries),
        })
    }

    /// The keys' names by tenant.
    pub fn key_names(&self) -> &KeyNames {
        &self.names
    }

    /// Whether clients must present a proxy key.
    pub fn keys_required(&self) -> bool {
        self.required
    }

    /// Who sent a request presenting the key `presented` (read from its headers by the
    /// router). `admin_route`: the admin token is accepted too. A request over its key's
    /// requests-per-minute budget is refused here (429).
    pub fn authenticate(
        &self,
        presented: Option<&str>,
        admin_route: bool,
    ) -> Result<Caller, AuthError> {
        if admin_route {
            if let (Some(admin), Some(given)) = (&self.admin, presented) {
                if sha256(given) == *admin {
                    return Ok(Caller {
                        tenant: Tenant::from_api_key(None),
                        key: None,
                        admin: true,
                    });
                }
            }
        }
        if !self.required {
            if admin_route && !self.inspect_by_client_key {
                return Err(AuthError::AdminTokenRequired {
                    configured: self.admin.is_some(),
                });
            }
            return Ok(Caller {
                tenant: Tenant::from_api_key(presented),
                key: None,
                admin: false,
            });
        }
        let given = presented
            .filter(|k| !k.is_empty())
            .ok_or(AuthError::Missing)?;
        let key = self.keys.get(&sha256(given)).ok_or(AuthError::Invalid)?;
        let now = Instant::now();
        if let Some(bucket) = &key.tokens {
            bucket
                .admit(0.0, 0.0, now)
                .map_err(|retry_after| AuthError::RateLimited {
                    key: key.name.clone(),
                    what: "tokens",
                    limit: bucket.per_minute,
                    retry_after,
                })?;
        }
        if let Some(bucket) = &key.requests {
            // Only looked at here; taken by `Caller::authorize` once the request is allowed.
            bucket
                .admit(1.0, 0.0, now)
                .map_err(|retry_after| AuthError::RateLimited {
                    key: key.name.clone(),
                    what: "requests",
                    limit: bucket.per_minute,
                    retry_after,
                })?;
        }
        tracing::debug!(key = %key.name, "authenticated");
        Ok(Caller {
            tenant: key.tenant.clone(),
            key: Some(key.clone()),
            admin: false,
        })
    }
}

/// The logins of the page (`/ui/`): a random token, handed to the browser as a cookie, for the
/// caller who typed a key or the admin token into its form. Bounded and expiring (a moka
/// cache); a restart logs everyone out. The key itself is never kept.
pub struct Logins(moka::sync::Cache<String, Caller>);

impl Logins {
    /// At most `max` logins, each for `ttl`.
    pub fn new(max: u64, ttl: std::time::Duration) -> Logins {
        Logins(
            moka::sync::Cache::builder()
                .max_capacity(max)
                .time_to_live(ttl)
                .build(),
        )
    }

    /// A new login for `caller`: its token (64 hex digits from the OS's randomness), `None`
    /// when the OS has none to give.
    pub fn open(&self, caller: Caller) -> Option<String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).ok()?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.0.insert(token.clone(), caller);
        Some(token)
    }

    /// The caller a token stands for, while its login lasts.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        self.0.get(token)
    }

    pub fn close(&self, token: &str) {
        self.0.invalidate(token);
    }
}

/// The caller the router found, from a request's extensions.
pub fn caller(extensions: &http::Extensions) -> Option<&Caller> {
    extensions.get::<Caller>()
}

/// Whether a request's caller (if any) may use `model` on `upstream`.
pub fn authorize(
    extensions: &http::Extensions,
    model: Option<&str>,
    upstream: &str,
) -> Result<(), AuthError> {
    caller(extensions).map_or(Ok(()), |c| c.authorize(model, upstream))
}

fn read_keys_file(path: &Path) -> Result<Vec<KeyConfig>, AuthSetupError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthSetupError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let file: KeysFile = toml::from_str(&text).map_err(|e| AuthSetupError::Invalid {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(file.keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(name: &str, secret: &str) -> KeyConfig {
        KeyConfig {
            name: name.into(),
            sha256: sha256(secret).iter().map(|b| format!("{b:02x}")).collect(),
            models: vec![],
            upstreams: vec![],
            requests_per_minute: None,
            tokens_per_minute: None,
        }
    }

    #[test]
    fn validation_names_the_key() {
        let mut bad = key("a", "x");
        bad.sha256 = "zz".into();
        let err = check_keys("keys", &[bad]).unwrap_err();
        assert!(err.contains("keys[0].sha256"), "{err}");
        let err = check_keys("keys", &[key("a", "x"), key("a", "y")]).unwrap_err();
        assert!(err.contains("keys[1].name"), "{err}");
        let err = validate(&AuthConfig::default(), &[], true).unwrap_err();
        assert!(err.contains("open_relay"), "{err}");
        let open = AuthConfig {
            open_relay: true,
            ..AuthConfig::default()
        };
        validate(&open, &[], true).unwrap();
        validate(&AuthConfig::default(), &[], false).unwrap();
    }

    #[test]
    fn bucket_refuses_then_refills() {
        let b = Bucket::new(2);
        let t0 = Instant::now();
        b.admit(1.0, 1.0, t0).unwrap();
        b.admit(1.0, 1.0, t0).unwrap();
        assert_eq!(b.admit(1.0, 1.0, t0), Err(30));
        b.admit(1.0, 1.0, t0 + Duration::from_secs(30)).unwrap();
        b.charge(10.0, t0 + Duration::from_secs(30));
        assert!(b.admit(0.0, 0.0, t0 + Duration::from_secs(31)).is_err());
        // The debt stops at one window: 2 per minute, so zero again within 60 s.
        assert!(b.admit(0.0, 0.0, t0 + Duration::from_secs(90)).is_ok());
    }

    #[test]
    fn model_patterns_are_enforced() {
        let mut cfg = key("k", "s");
        cfg.models = vec!["gpt-4o*".into()];
        let caller = Caller {
            tenant: Tenant::from_api_key(None),
            key: Some(Arc::new(Key::new(&cfg))),
            admin: false,
        };
        caller.authorize(Some("gpt-4o-mini"), "u").unwrap();
        let err = caller.authorize(Some("o3"), "u").unwrap_err();
        assert!(err.to_string().contains("\"o3\""), "{err}");
    }
}
