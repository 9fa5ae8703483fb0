//! What the store holds about a tenant's sessions, read for people: the list of sessions, one
//! session's detail (statistics from its journal, every reference it stored, the journal
//! itself), erasing one, and the references a journal names. Shared by the `/v1/context/…`
//! routes and the `inspect` subcommand; the context manager finds a session's stored content
//! with [`journal_refs`]. It decides nothing about context. The `[ui]` section ([`UiConfig`])
//! says what the page that shows them (`routes::ui`) keeps and how it is served; [`journal`]
//! the page's `request` lines and their writer.

pub mod journal;
pub mod line;
pub mod view;

use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::auth::KeyNames;
use crate::http::error::ClientError;
use crate::store::{ContentRef, Leave, SessionId, Store, StoreError, Tenant};

/// Why an inspection request cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("no {what} {id:?} for this tenant (the API key's own, or the one an admin named with ?tenant=)")]
    NotFound { what: &'static str, id: String },
    #[error("no session {0:?} in the store")]
    NotInStore(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}

impl ClientError for InspectError {
    fn classify(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            InspectError::NotFound { .. } | InspectError::NotInStore(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("not_found"),
            ),
            InspectError::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            InspectError::Store(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                Some("store_unavailable"),
            ),
        }
    }
}

/// A session or reference the tenant does not have (its id cut to 100 characters).
pub fn not_found(what: &'static str, id: &str) -> InspectError {
    InspectError::NotFound {
        what,
        id: id.chars().take(100).collect(),
    }
}

/// A tenant id, or the name of a proxy key for its tenant.
pub fn parse_tenant(given: &str, names: Option<&KeyNames>) -> Result<Tenant, InspectError> {
    if let Some(t) = Tenant::from_id(given) {
        return Ok(t);
    }
    names
        .and_then(|n| n.tenant_of(given))
        .cloned()
        .ok_or_else(|| {
            InspectError::BadRequest(format!(
                "{given:?} is neither a tenant id (20 hex digits, as the session list shows) nor the name of a proxy key"
            ))
        })
}

/// Names the tenant (and its proxy key, when it is one) in an admin's view.
fn name_tenant(entry: &mut Value, tenant: &Tenant, names: &KeyNames) {
    entry["tenant"] = json!(tenant.as_str());
    if let Some(key) = names.name_of(tenant) {
        entry["key"] = json!(key);
    }
}

/// Records (journal records, or sessions in a list) returned when `limit` is not given.
pub const DEFAULT_PAGE: usize = 100;
/// The largest `limit` allowed.
pub const MAX_PAGE: usize = 1_000;

/// What page of a list or a journal a request asks for: `limit` (1 to [`MAX_PAGE`], by
/// default [`DEFAULT_PAGE`]) and, for a journal, `before` (the index of the oldest record
/// already seen: the page ends before it; none: the newest records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: usize,
    pub before: Option<usize>,
}

impl Default for Page {
    fn default() -> Page {
        Page {
            limit: DEFAULT_PAGE,
            before: None,
        }
    }
}

impl Page {
    /// The page a request's `limit` and `before` parameters ask for.
    pub fn parse(limit: Option<&str>, before: Option<&str>) -> Result<Page, InspectError> {
        let limit = match limit {
            None => DEFAULT_PAGE,
            Some(l) => l
                .parse()
                .ok()
                .filter(|l| (1..=MAX_PAGE).contains(l))
                .ok_or_else(|| {
                    InspectError::BadRequest(format!(
                        "limit must be a whole number from 1 to {MAX_PAGE} (default {DEFAULT_PAGE})"
                    ))
                })?,
        };
        let before = before
            .map(|b| {
                b.parse().map_err(|_| {
                    InspectError::BadRequest(
                        "before must be a journal index (journal_first of the previous page)"
                            .into(),
                    )
                })
            })
            .transpose()?;
        Ok(Page { limit, before })
    }
}

/// The sessions of `tenant` (every tenant when `None`), as an OpenAI-style list. With `names`
/// (an admin's view), each entry names its tenant and the proxy key it belongs to.
pub async fn list(
    store: &dyn Store,
    tenant: Option<&Tenant>,
    names: Option<&KeyNames>,
) -> Result<Value, InspectError> {
    list_page(store, tenant, names, None, usize::MAX).await
}

/// A page of [`list`]: sessions sorted by id, the first `limit` after the id `after`, in the
/// OpenAI list shape (`first_id`, `last_id`, `has_more`). Sessions of several tenants with the
/// same id (an admin's view) stay on one page, which may then hold more than `limit`.
pub async fn list_page(
    store: &dyn Store,
    tenant: Option<&Tenant>,
    names: Option<&KeyNames>,
    after: Option<&str>,
    limit: usize,
) -> Result<Value, InspectError> {
    let mut sessions = store.list_sessions(tenant).await?;
    sessions.sort_by(|(ta, a), (tb, b)| (a.name(), ta.as_str()).cmp(&(b.name(), tb.as_str())));
    let rest: Vec<&(Tenant, SessionId)> = sessions
        .iter()
        .filter(|(_, s)| after.is_none_or(|after| *s.name() > *after))
        .collect();
    let mut end = rest.len().min(limit);
    while end > 0 && end < rest.len() && rest[end].1.name() == rest[end - 1].1.name() {
        end += 1;
    }
    let data: Vec<Value> = rest[..end]
        .iter()
        .map(|(t, s)| {
            let mut entry = json!({"id": s.name(), "object": "context.session"});
            if let Some(names) = names {
                name_tenant(&mut entry, t, names);
            }
            entry
        })
        .collect();
    let id = |i: Option<&&(Tenant, SessionId)>| i.map(|(_, s)| json!(s.name()));
    Ok(json!({
        "object": "list",
        "data": data,
        "first_id": id(rest[..end].first()),
        "last_id": id(rest[..end].last()),
        "has_more": end < rest.len(),
    }))
}

/// One session with the newest page of its journal ([`session_page`]).
pub async fn session_detail(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    names: Option<&KeyNames>,
) -> Result<Option<Value>, InspectError> {
    session_page(store, tenant, session, names, &Page::default()).await
}

/// One session: a page of its journal (`journal`, its index `journal_first`, of
/// `journal_total` records, `has_more` when older ones remain), the statistics of that page,
/// each reference it names with its kind, size and time, and when the session's first and last
/// records were written. Only the page is read into memory. `None` when the tenant has no such
/// session. With `names` (an admin's view), it names its tenant and the proxy key it belongs
/// to.
pub async fn session_page(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
    names: Option<&KeyNames>,
    page: &Page,
) -> Result<Option<Value>, InspectError> {
    let read = store
        .read_log_page(tenant, session, page.before, page.limit)
        .await?;
    if read.total == 0
        && !store
            .list_sessions(Some(tenant))
            .await?
            .iter()
            .any(|(_, s)| s == session)
    {
        return Ok(None);
    }
    let edge = |before: Option<usize>| async move {
        let record = store
            .read_log_page(tenant, session, before, 1)
            .await?
            .records
            .pop();
        Ok::<_, InspectError>(record.and_then(|r| r.get("ts").cloned()))
    };
    let first_at = match read.first_index {
        0 => read.records.first().and_then(|r| r.get("ts").cloned()),
        _ => edge(Some(1)).await?,
    };
    let last_at = match page.before {
        None => read.records.last().and_then(|r| r.get("ts").cloned()),
        Some(_) => edge(None).await?,
    };
    let journal = read.records;
    let mut refs = Vec::new();
    let mut stored_bytes = 0usize;
    for item in journal_items(&journal) {
        let content = store.get_content(tenant, &item.reference).await?;
        let (bytes, lines) = content
            .as_deref()
            .map_or((None, None), |c| (Some(c.len()), Some(c.lines().count())));
        stored_bytes += bytes.unwrap_or(0);
        refs.push(json!({
            "ref": item.reference.as_str(),
            "kind": item.kind,
            "bytes": bytes,
            "lines": lines,
            "stored_at": item.at,
            "present": content.is_some(),
        }));
    }
    let last = journal.iter().rev().find(|r| r["event"] == "decision");
    let field = |name: &str| {
        last.and_then(|r| r.get(name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mut detail = json!({
        "id": session.name(),
        "object": "context.session",
        "decisions": journal.iter().filter(|r| r["event"] == "decision").count(),
        "first_at": first_at.unwrap_or(Value::Null),
        "last_at": last_at.unwrap_or(Value::Null),
        "last_tokens_before": field("tokens_before"),
        "last_tokens_after": field("tokens_after"),
        "last_actions": field("actions"),
        "stored_refs": refs.len(),
        "stored_bytes": stored_bytes,
        "refs": refs,
        "journal": journal,
        "journal_first": read.first_index,
        "journal_total": read.total,
        "has_more": read.first_index > 0,
    });
    if let Some(names) = names {
        name_tenant(&mut detail, tenant, names);
    }
    Ok(Some(detail))
}

/// Erases a session: its state, its journal and the content its journal names. Returns how
/// many items were deleted.
pub async fn erase(
    store: &dyn Store,
    tenant: &Tenant,
    session: &SessionId,
) -> Result<usize, InspectError> {
    let journal = store.read_log(tenant, session).await?;
    let refs = journal_refs(&journal);
    Ok(store
        .erase_session(tenant, session, &refs, Leave::Tombstone)
        .await?)
}

/// One reference a session's journal names.
struct JournalItem {
    reference: ContentRef,
    /// Its kind, when the record says.
    kind: Value,
    /// When it was first named.
    at: Value,
}

/// The references a journal names, each once, oldest first: in `stored` records (`items`:
/// `{ref, kind, action}`), in `decision` records (`refs`, with `kinds` at the same index) and
/// in `request` records (`bodies`: the messages kept for the page).
fn journal_items(journal: &[Value]) -> Vec<JournalItem> {
    let mut seen = std::collections::HashSet::new();
    let mut items = Vec::new();
    for record in journal {
        let at = record.get("ts").cloned().unwrap_or(Value::Null);
        let stored = record
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|i| (i.get("ref"), i.get("kind")));
        let kinds = record.get("kinds").and_then(Value::as_array);
        let decided = record
            .get("refs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(n, r)| (Some(r), kinds.and_then(|k| k.get(n))));
        // The messages a `request` line kept for the page (`[ui] keep_messages`).
        let kept = record
            .get("bodies")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|b| b.values())
            .map(|r| (Some(r), None));
        for (r, kind) in stored.chain(decided).chain(kept) {
            let Some(reference) = r
                .and_then(Value::as_str)
                .and_then(|r| r.parse::<ContentRef>().ok())
            else {
                continue;
            };
            if seen.insert(reference.clone()) {
                items.push(JournalItem {
                    reference,
                    kind: kind.cloned().unwrap_or(Value::Null),
                    at: at.clone(),
                });
            }
        }
    }
    items
}

/// The references a session's journal names, each once.
pub fn journal_refs(journal: &[Value]) -> Vec<ContentRef> {
    journal_items(journal)
        .into_iter()
        .map(|i| i.reference)
        .collect()
}

/// The `[ui]` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// Serve the page at `/ui/` and write one `request` line per managed request to the
    /// session's journal. Default false: no page, no extra journal lines.
    pub enabled: bool,
    /// Keep the messages the client sent and the messages the model received, per request,
    /// in the store (content-addressed, erased with the session), for the side-by-side view.
    pub keep_messages: bool,
    /// Largest request body whose messages are kept, in bytes (larger ones: "not kept").
    pub max_kept_bytes: usize,
    /// How long a login to the page lasts, in seconds.
    pub login_ttl_secs: u64,
    /// Most logins held at once (the oldest go first).
    pub max_logins: u64,
    /// How often an open session page asks for new requests, in milliseconds.
    pub poll_ms: u64,
    /// Journal lines waiting for the page's journal writer; when it is full, a line is dropped
    /// and counted rather than waited for.
    pub journal_queue: usize,
    /// How long the journal writer gathers lines before writing them, in milliseconds: lines
    /// of one session written together cost one store append. A page being opened writes what
    /// waits at once, so it never shows less than was answered.
    pub journal_flush_ms: u64,
    /// Most lines the journal writer writes in one batch.
    pub journal_batch_lines: usize,
}

impl Default for UiConfig {
    fn default() -> UiConfig {
        UiConfig {
            enabled: false,
            keep_messages: true,
            max_kept_bytes: 8 << 20,
            login_ttl_secs: 12 * 3600,
            max_logins: 10_000,
            poll_ms: 2_000,
            journal_queue: 10_000,
            journal_flush_ms: 200,
            journal_batch_lines: 1_000,
        }
    }
}

impl UiConfig {
    /// Checks the ranges; messages name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.login_ttl_secs == 0 {
            return Err("ui.login_ttl_secs must be at least 1".into());
        }
        if self.max_logins == 0 {
            return Err("ui.max_logins must be at least 1".into());
        }
        if !(250..=600_000).contains(&self.poll_ms) {
            return Err("ui.poll_ms must be from 250 to 600000".into());
        }
        if self.journal_queue == 0 {
            return Err("ui.journal_queue must be at least 1".into());
        }
        if self.journal_flush_ms > 60_000 {
            return Err("ui.journal_flush_ms must be at most 60000".into());
        }
        if self.journal_batch_lines == 0 {
            return Err("ui.journal_batch_lines must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ContentKind, MemoryStore, StoreConfig, SystemClock};
    use std::sync::Arc;

    /// A session whose journal names content in both record shapes: `stored` lines (what a
    /// lossless transform or a refresh stored without a new decision) and `decision` lines.
    #[tokio::test]
    async fn erasure_removes_what_either_kind_of_journal_line_names() {
        let store = MemoryStore::new(&StoreConfig::default(), Arc::new(SystemClock));
        let tenant = Tenant::from_api_key(Some("sk-a"));
        let session = SessionId::derive(b"s");
        let put = |text: &'static str| {
            let (store, tenant, session) = (&store, &tenant, &session);
            async move {
                store
                    .put_content(tenant, session, ContentKind::ToolResult, text)
                    .await
                    .unwrap()
            }
        };
        let (stored, decided) = (
            put("only in a stored line").await,
            put("in a decision").await,
        );
        let journal = [
            json!({"event": "stored", "ts": "t1", "items": [{"ref": stored.as_str(), "kind": "tool_result", "action": "minified"}]}),
            json!({"event": "decision", "ts": "t2", "refs": [decided.as_str(), stored.as_str()], "kinds": ["tool_result", "tool_result"]}),
        ];
        for record in &journal {
            store.append_log(&tenant, &session, record).await.unwrap();
        }
        let items = journal_items(&journal);
        assert_eq!(
            items.iter().map(|i| &i.reference).collect::<Vec<_>>(),
            [&stored, &decided],
            "each reference once, in the order first named"
        );
        assert_eq!(items[0].at, json!("t1"));
        assert_eq!(items[1].kind, json!("tool_result"));
        assert!(erase(&store, &tenant, &session).await.unwrap() >= 2);
        for r in [&stored, &decided] {
            assert_eq!(store.get_content(&tenant, r).await.unwrap(), None);
        }
    }
}
