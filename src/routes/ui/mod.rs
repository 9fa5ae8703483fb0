//! The page that shows what the proxy did (`/ui/`, when `[ui] enabled`): the sessions the
//! caller may see, one session as a timeline with its chart, one request side by side (what the
//! client sent, what the model received), and stored content, paged. It reads the store and
//! journal the `/v1/context/…` routes read ([`crate::sessions`]) and never changes what the
//! proxy does.
//!
//! - `GET /ui/` — the sessions, newest first (`model`, `since` hours, `offset`);
//! - `GET /ui/session?t=&s=` — one session (`before`: older journal records);
//! - `GET /ui/live?t=&s=&n=` — the session's live part again when its journal no longer has
//!   `n` records, else `204`: what the page's script polls;
//! - `GET /ui/request?t=&s=&i=` — journal record `i` side by side;
//! - `GET /ui/message?t=&s=&i=&side=&m=&offset=` — one kept message, paged;
//! - `GET /ui/ref?t=&r=&offset=` — stored content, paged like `context_read`;
//! - `POST /ui/erase` (`t`, `s`) — erases the session as `DELETE /v1/context/sessions/…` does;
//! - `GET|POST /ui/login`, `POST /ui/logout`; `GET /ui/assets/…` the script and stylesheet.
//!
//! **Safe by construction.** HTML comes from maud templates (`pages.rs`) that escape every
//! string; every response carries a Content-Security-Policy without inline scripts or styles
//! and without other origins. Who is looking is the proxy's own authentication
//! ([`crate::auth::Auth::authenticate`], as on the `/v1/context/` routes): an `Authorization`
//! header, or a login whose random token is an `HttpOnly`, `SameSite=Strict` cookie scoped
//! to `/ui/`. A proxy key sees its own tenant; `t` names another tenant only for the admin
//! token. A `POST` is refused unless the browser says it comes from this origin.

pub mod chart;
pub mod journal;
pub mod pages;
pub use crate::sessions::view;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use maud::Markup;
use serde_json::Value;

pub use crate::sessions::UiConfig;

use crate::auth::{Caller, KeyNames};
use crate::http::body::{full, ProxyBody};
use crate::routes::shared::{Shared, UiState};
use crate::sessions::{erase, parse_tenant, InspectError};
use crate::store::{ContentRef, SessionId, Store, Tenant};
use journal::RequestLine;
use pages::{Row, Viewer};
use view::Reader;

/// The login cookie's name.
const COOKIE: &str = "cp_ui";
/// What every answer of the page says about where its content may come from.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// Sessions on one page of the list; journal records on one page of a session.
const LIST_PAGE: usize = 50;
const TIMELINE_PAGE: usize = 100;
/// Sessions' summaries the list reads at once.
const SUMMARIES_AT_ONCE: usize = 16;
/// Lines on one page of stored text.
const TEXT_PAGE: usize = 500;
/// Largest form a `POST` may send.
const MAX_FORM_BYTES: usize = 16 << 10;

const SCRIPT: &str = include_str!("assets/ui.js");
const STYLE: &str = include_str!("assets/ui.css");
const ICON: &str = include_str!("assets/favicon.svg");

/// Why a page cannot be shown.
#[derive(Debug)]
enum PageError {
    Status(StatusCode, String),
}

impl From<InspectError> for PageError {
    fn from(e: InspectError) -> PageError {
        use crate::http::error::ClientError;
        let (status, _, _) = e.classify();
        PageError::Status(status, e.to_string())
    }
}

fn not_found(what: &str) -> PageError {
    PageError::Status(
        StatusCode::NOT_FOUND,
        format!("No {what} here for this key."),
    )
}

fn bad(message: impl Into<String>) -> PageError {
    PageError::Status(StatusCode::BAD_REQUEST, message.into())
}

/// Answers a `/ui` request (only routed here when `[ui] enabled`).
pub async fn handle<B>(state: Arc<Shared>, req: Request<B>) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(ui) = &state.ui else {
        return page(
            StatusCode::NOT_FOUND,
            pages::error(None, 404, "The page is off ([ui] enabled = false)."),
        );
    };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (method.clone(), path.as_str()) {
        (Method::GET, "/ui/assets/ui.js") => {
            return asset(SCRIPT, "text/javascript; charset=utf-8")
        }
        (Method::GET, "/ui/assets/ui.css") => return asset(STYLE, "text/css; charset=utf-8"),
        (Method::GET, "/ui/assets/favicon.svg") => return asset(ICON, "image/svg+xml"),
        (Method::GET, "/ui") => return redirect("/ui/", None),
        (Method::GET, "/ui/login") => return page(StatusCode::OK, pages::login(None)),
        (Method::POST, "/ui/login") => return login(&state, ui, req).await,
        (Method::POST, "/ui/logout") => return logout(ui, req.headers()),
        _ => {}
    }
    let Some(caller) = caller_of(&state, ui, req.headers()) else {
        return match method {
            Method::GET => redirect("/ui/login", None),
            _ => page(
                StatusCode::UNAUTHORIZED,
                pages::login(Some("Log in first.")),
            ),
        };
    };
    let names = caller.admin.then(|| state.auth.key_names().clone());
    let label = match (&caller.key, caller.admin) {
        (_, true) => "admin".to_string(),
        (Some(key), _) => format!("key {}", key.name),
        (None, _) => format!("tenant {}", caller.tenant.as_str()),
    };
    let viewer = Viewer {
        label: &label,
        admin: caller.admin,
    };
    let query = Query::of(req.uri().query());
    let store = state.context.store().clone();
    let ctx = PageCtx {
        ui,
        store: store.as_ref(),
        caller: &caller,
        names: names.as_ref(),
        viewer: &viewer,
    };
    // What the writer still holds is written first: the page never shows less than was
    // answered (nor leaves a line to come back after an erasure).
    ui.journal.flush().await;
    let result = match (method, path.as_str()) {
        (Method::GET, "/ui/") => ctx.list(&query).await,
        (Method::GET, "/ui/session") => ctx.session(&query).await,
        (Method::GET, "/ui/live") => ctx.live(&query).await,
        (Method::GET, "/ui/request") => ctx.request(&query).await,
        (Method::GET, "/ui/message") => ctx.message(&query).await,
        (Method::GET, "/ui/ref") => ctx.reference(&query).await,
        (Method::POST, "/ui/erase") => {
            if !same_origin(req.headers()) {
                Err(PageError::Status(
                    StatusCode::FORBIDDEN,
                    "Erasing needs a request from this page (same origin).".into(),
                ))
            } else {
                match read_form(req).await {
                    Ok(form) => ctx.erase(&form).await,
                    Err(e) => Err(e),
                }
            }
        }
        (
            _,
            "/ui/" | "/ui/session" | "/ui/live" | "/ui/request" | "/ui/message" | "/ui/ref"
            | "/ui/erase",
        ) => Err(PageError::Status(
            StatusCode::METHOD_NOT_ALLOWED,
            "This page does not answer that method.".into(),
        )),
        _ => Err(not_found("page")),
    };
    result.unwrap_or_else(|PageError::Status(status, message)| {
        page(
            status,
            pages::error(Some(&viewer), status.as_u16(), &message),
        )
    })
}

/// What a page handler reads.
struct PageCtx<'a> {
    ui: &'a UiState,
    store: &'a dyn Store,
    caller: &'a Caller,
    names: Option<&'a KeyNames>,
    viewer: &'a Viewer<'a>,
}

type PageResult = Result<Response<ProxyBody>, PageError>;

impl PageCtx<'_> {
    /// The tenant a page is about: the caller's own, or for the admin the `t` parameter.
    fn tenant(&self, q: &Query) -> Result<Tenant, PageError> {
        if !self.caller.admin {
            return Ok(self.caller.tenant.clone());
        }
        let given = q
            .get("t")
            .ok_or_else(|| bad("The admin names the tenant: t=<tenant id or key name>."))?;
        Ok(parse_tenant(given, self.names)?)
    }

    fn session_id(q: &Query) -> Result<SessionId, PageError> {
        let s = q
            .get("s")
            .ok_or_else(|| bad("Which session? s=<session id>."))?;
        SessionId::parse(s).map_err(|_| not_found("session"))
    }

    /// Every record of a session's journal, summed into turns, holding a chunk at a time.
    async fn read_all(
        &self,
        tenant: &Tenant,
        session: &SessionId,
    ) -> Result<(Reader, usize), PageError> {
        let pricing = self.ui.journal.pricing();
        let mut reader = Reader::default();
        let total = journal::read_journal(self.store, tenant, session, |i, record| {
            reader.read(i, record, pricing);
        })
        .await
        .map_err(InspectError::from)?;
        Ok((reader, total))
    }

    /// The sessions, newest first, a page at a time: each read from the summary the journal
    /// writer keeps (one small record per session), never from its journal.
    async fn list(&self, q: &Query) -> PageResult {
        use futures_util::StreamExt;
        let scope = (!self.caller.admin).then_some(&self.caller.tenant);
        let sessions = self
            .store
            .list_sessions(scope)
            .await
            .map_err(InspectError::from)?;
        let since_hours = q.get("since").and_then(|h| h.parse::<u64>().ok());
        let since = since_hours.map(|h| {
            crate::context::writer::rfc3339(
                std::time::SystemTime::now() - Duration::from_secs(h * 3600),
            )
        });
        let model = q.get("model").filter(|m| !m.is_empty());
        let offset: usize = q.get("offset").and_then(|o| o.parse().ok()).unwrap_or(0);
        let pricing = self.ui.journal.pricing();
        let summaries: Vec<_> = futures_util::stream::iter(sessions)
            .map(|(tenant, session)| async move {
                let summary = journal::summary(self.store, &tenant, &session, pricing).await;
                summary.map(|summary| (tenant, session, summary.totals))
            })
            .buffered(SUMMARIES_AT_ONCE)
            .collect()
            .await;
        let mut by_time = Vec::with_capacity(summaries.len());
        let mut models = std::collections::BTreeSet::new();
        for summary in summaries {
            let (tenant, session, totals) = summary.map_err(InspectError::from)?;
            if let Some(m) = &totals.model {
                models.insert(m.clone());
            }
            let at = totals.last_at.clone().unwrap_or_default();
            if since.as_deref().is_some_and(|since| at.as_str() < since)
                || model.is_some_and(|m| totals.model.as_deref() != Some(m))
            {
                continue;
            }
            by_time.push((at, tenant, session, totals));
        }
        // Newest first: each session's last record.
        by_time.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.name().cmp(&b.2.name())));
        let more = (by_time.len() > offset.saturating_add(LIST_PAGE)).then(|| {
            let mut next = q.clone();
            next.set("offset", (offset + LIST_PAGE).to_string());
            format!("/ui/?{}", next.encode())
        });
        let rows: Vec<pages::ListRow> = by_time
            .into_iter()
            .skip(offset)
            .take(LIST_PAGE)
            .map(|(_, tenant, session, totals)| pages::ListRow {
                query: session_query(&tenant, &session),
                session: session.name().into_owned(),
                tenant: self.names.map(|names| {
                    names
                        .name_of(&tenant)
                        .map_or_else(|| tenant.as_str().to_string(), |n| format!("key {n}"))
                }),
                totals,
            })
            .collect();
        if let Some(m) = model {
            models.insert(m.to_string());
        }
        let filter = pages::Filter {
            model,
            since_hours,
            models: models.into_iter().collect(),
        };
        Ok(page(
            StatusCode::OK,
            pages::session_list(self.viewer, &rows, &filter, more.as_deref()),
        ))
    }

    /// The session page, or only its live part (`fragment`).
    async fn session_markup(&self, q: &Query, fragment: bool) -> Result<Option<Markup>, PageError> {
        let tenant = self.tenant(q)?;
        let session = Self::session_id(q)?;
        let before = match q.get("before") {
            None => None,
            Some(b) => Some(
                b.parse::<usize>()
                    .map_err(|_| bad("before is a journal index."))?,
            ),
        };
        let page = self
            .store
            .read_log_page(&tenant, &session, before, TIMELINE_PAGE)
            .await
            .map_err(InspectError::from)?;
        if page.total == 0 {
            return Err(not_found("session"));
        }
        if fragment {
            let seen: Option<usize> = q.get("n").and_then(|n| n.parse().ok());
            if seen == Some(page.total) {
                return Ok(None);
            }
        }
        let (reader, total) = self.read_all(&tenant, &session).await?;
        let query = session_query(&tenant, &session);
        let older = (page.first_index > 0)
            .then(|| format!("/ui/session?{query}&before={}", page.first_index));
        let tenant_label = self.names.map(|names| {
            names
                .name_of(&tenant)
                .map_or_else(|| tenant.as_str().to_string(), |n| format!("key {n}"))
        });
        let name = session.name();
        let view = pages::SessionView {
            query: &query,
            session: &name,
            tenant: tenant_label.as_deref(),
            totals: reader.totals(),
            turns: &reader.turns,
            page: newest_first(&page.records, page.first_index),
            journal_total: total.max(page.total),
            older,
            live: before.is_none(),
            poll_ms: self.ui.config.poll_ms,
        };
        Ok(Some(if fragment {
            pages::live_section(&view)
        } else {
            pages::session_page(self.viewer, &view)
        }))
    }

    async fn session(&self, q: &Query) -> PageResult {
        let markup = self.session_markup(q, false).await?;
        Ok(page(StatusCode::OK, markup.unwrap_or_default()))
    }

    async fn live(&self, q: &Query) -> PageResult {
        let markup = match self.session_markup(q, true).await {
            // Erased while open (or never this key's): said once, and the polling stops.
            Err(PageError::Status(StatusCode::NOT_FOUND, _)) => Some(pages::gone()),
            other => other?,
        };
        match markup {
            None => {
                let mut resp = page(StatusCode::NO_CONTENT, Markup::default());
                *resp.body_mut() = full(Bytes::new());
                Ok(resp)
            }
            Some(markup) => Ok(page(StatusCode::OK, markup)),
        }
    }

    /// Journal record `i` of the session in `q`, when it is a request line.
    async fn request_line(
        &self,
        q: &Query,
    ) -> Result<(Tenant, SessionId, usize, RequestLine), PageError> {
        let tenant = self.tenant(q)?;
        let session = Self::session_id(q)?;
        let index: usize = q
            .get("i")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| bad("i is a journal index."))?;
        let page = self
            .store
            .read_log_page(&tenant, &session, Some(index.saturating_add(1)), 1)
            .await
            .map_err(InspectError::from)?;
        let line = page
            .records
            .first()
            .filter(|_| page.first_index == index)
            .and_then(RequestLine::of)
            .ok_or_else(|| not_found("request"))?;
        Ok((tenant, session, index, line))
    }

    /// Kept messages, by reference.
    async fn messages(
        &self,
        tenant: &Tenant,
        r: Option<&str>,
    ) -> Result<Option<Vec<Value>>, PageError> {
        let Some(r) = r.and_then(|r| r.parse::<ContentRef>().ok()) else {
            return Ok(None);
        };
        let text = self
            .store
            .get_content(tenant, &r)
            .await
            .map_err(InspectError::from)?;
        Ok(text
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| match v {
                Value::Array(list) => Some(list),
                _ => None,
            }))
    }

    async fn request(&self, q: &Query) -> PageResult {
        let (tenant, session, index, line) = self.request_line(q).await?;
        let bodies = line.bodies.clone().unwrap_or_default();
        let client = self.messages(&tenant, bodies.client.as_deref()).await?;
        let forwarded = self.messages(&tenant, bodies.forwarded.as_deref()).await?;
        let rows = match (client, forwarded) {
            (Some(c), Some(f)) => Some(align(c, f)),
            _ => None,
        };
        let query = session_query(&tenant, &session);
        let name = session.name();
        let view = pages::RequestView {
            query: &query,
            session: &name,
            index,
            line: &line,
            rows,
            refs: line.refs.iter().cloned().collect::<HashSet<_>>(),
        };
        Ok(page(
            StatusCode::OK,
            pages::request_page(self.viewer, &view),
        ))
    }

    async fn message(&self, q: &Query) -> PageResult {
        let (tenant, session, index, line) = self.request_line(q).await?;
        let bodies = line.bodies.clone().unwrap_or_default();
        let side = q.get("side").unwrap_or("client");
        let r = match side {
            "client" => bodies.client,
            "forwarded" => bodies.forwarded,
            _ => return Err(bad("side is client or forwarded.")),
        };
        let m: usize = q
            .get("m")
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| bad("m is a message index."))?;
        let messages = self
            .messages(&tenant, r.as_deref())
            .await?
            .ok_or_else(|| not_found("kept message"))?;
        let text = pages::message_text(messages.get(m).ok_or_else(|| not_found("message"))?);
        let query = session_query(&tenant, &session);
        let base = format!("/ui/message?{query}&i={index}&side={side}&m={m}");
        let back = (format!("/ui/request?{query}&i={index}"), "request");
        text_response(
            self.viewer,
            format!("Message {m} ({side})"),
            back,
            &text,
            q,
            &base,
        )
    }

    async fn reference(&self, q: &Query) -> PageResult {
        let tenant = self.tenant(q)?;
        let given = q.get("r").unwrap_or_default();
        // An invalid reference is as unknown as another tenant's.
        let r: ContentRef = given.parse().map_err(|_| not_found("stored content"))?;
        let text = self
            .store
            .get_content(&tenant, &r)
            .await
            .map_err(InspectError::from)?
            .ok_or_else(|| not_found("stored content"))?;
        let tq = form_urlencoded::Serializer::new(String::new())
            .append_pair("t", tenant.as_str())
            .append_pair("r", r.as_str())
            .finish();
        text_response(
            self.viewer,
            format!("Stored {}", r.as_str()),
            ("/ui/".into(), "stored content"),
            &text,
            q,
            &format!("/ui/ref?{tq}"),
        )
    }

    async fn erase(&self, form: &Query) -> PageResult {
        let tenant = self.tenant(form)?;
        let session = Self::session_id(form)?;
        let erased = erase(self.store, &tenant, &session).await?;
        if erased == 0 {
            return Err(not_found("session"));
        }
        tracing::info!(session = %session, items = erased, "session erased from the page");
        Ok(redirect("/ui/", None))
    }
}

/// A page of stored text: `offset` (the first line, from 1) and [`TEXT_PAGE`] lines.
fn text_response(
    viewer: &Viewer,
    title: String,
    back: (String, &str),
    text: &str,
    q: &Query,
    base: &str,
) -> PageResult {
    let offset: usize = q
        .get("offset")
        .and_then(|o| o.parse().ok())
        .filter(|o| *o >= 1)
        .unwrap_or(1);
    let total = text.lines().count();
    let lines: Vec<&str> = text.lines().skip(offset - 1).take(TEXT_PAGE).collect();
    let prev =
        (offset > 1).then(|| format!("{base}&offset={}", offset.saturating_sub(TEXT_PAGE).max(1)));
    let next = (offset - 1 + lines.len() < total)
        .then(|| format!("{base}&offset={}", offset + lines.len()));
    let p = pages::TextPage {
        title,
        back: Some(back),
        lines,
        offset,
        total,
        bytes: text.len(),
        prev,
        next,
    };
    Ok(page(StatusCode::OK, pages::text_page(viewer, &p)))
}

/// The client's messages against the model's, row by row. Equal messages pair up; between two
/// such anchors, the model's messages stand in place of the client's: one for one (a
/// compaction, a truncation), or, where the model has fewer, its first stands for the extra
/// ones of the client (a summary in place of a span), the rest pairing up from the end.
pub fn align(client: Vec<Value>, forwarded: Vec<Value>) -> Vec<Row> {
    let mut rows = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < client.len() || j < forwarded.len() {
        if let (Some(c), Some(f)) = (client.get(i), forwarded.get(j)) {
            if c == f {
                rows.push(Row::Same(i, c.clone()));
                i += 1;
                j += 1;
                continue;
            }
        }
        // The next anchor: the first later message of the model's that the client also sent.
        let (k, jj) = (j + 1..forwarded.len())
            .find_map(|jj| {
                client[i..]
                    .iter()
                    .position(|m| *m == forwarded[jj])
                    .map(|p| (i + p, jj))
            })
            .unwrap_or((client.len(), forwarded.len()));
        let (c_span, f_span) = (k - i, jj - j);
        let pairs = c_span.min(f_span.saturating_sub(usize::from(f_span < c_span)));
        if f_span == 0 {
            rows.extend((i..k).map(|n| Row::ClientOnly(n, client[n].clone())));
        } else if f_span < c_span {
            let head = k - pairs;
            rows.push(Row::Replaced(
                (i..head).map(|n| (n, client[n].clone())).collect(),
                forwarded[j].clone(),
            ));
            for t in 0..pairs {
                let (n, m) = (head + t, j + 1 + t);
                rows.push(Row::Changed(n, client[n].clone(), forwarded[m].clone()));
            }
        } else {
            for t in 0..c_span {
                rows.push(Row::Changed(
                    i + t,
                    client[i + t].clone(),
                    forwarded[j + t].clone(),
                ));
            }
            rows.extend((j + c_span..jj).map(|m| Row::ProxyOnly(forwarded[m].clone())));
        }
        i = k;
        j = jj;
    }
    rows
}

/// `t=<tenant>&s=<session>`, encoded.
fn session_query(tenant: &Tenant, session: &SessionId) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("t", tenant.as_str())
        .append_pair("s", &session.name())
        .finish()
}

/// A query string (or a form), decoded.
#[derive(Debug, Clone, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn of(query: Option<&str>) -> Query {
        Query::parse(query.unwrap_or_default().as_bytes())
    }

    fn parse(bytes: &[u8]) -> Query {
        Query(
            form_urlencoded::parse(bytes)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, name: &str, value: String) {
        self.0.retain(|(k, _)| k != name);
        self.0.push((name.to_string(), value));
    }

    fn encode(&self) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.0 {
            s.append_pair(k, v);
        }
        s.finish()
    }
}

/// A form body (`application/x-www-form-urlencoded`), read under [`MAX_FORM_BYTES`].
async fn read_form<B>(req: Request<B>) -> Result<Query, PageError>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limited = http_body_util::Limited::new(req.into_body(), MAX_FORM_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|_| {
            PageError::Status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "The form is too large or was cut off.".into(),
            )
        })?
        .to_bytes();
    Ok(Query::parse(&bytes))
}

/// Whether the browser says a request comes from this origin: `Sec-Fetch-Site: same-origin`
/// when it sends that header, else an `Origin` naming the `Host` the request was sent to. A
/// request with neither is refused: every browser sends one of them with a `POST`.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // Sent by every current browser and never settable by a page: it decides when present.
    if let Some(site) = get("sec-fetch-site") {
        return site == "same-origin";
    }
    match (get("origin"), get("host")) {
        (Some(origin), Some(host)) => {
            origin == format!("http://{host}") || origin == format!("https://{host}")
        }
        _ => false,
    }
}

/// Who is looking: a key or the admin token in `Authorization`, else the login cookie.
fn caller_of(state: &Shared, ui: &UiState, headers: &HeaderMap) -> Option<Caller> {
    if let Some(key) = crate::http::headers::api_key(headers) {
        return state.auth.authenticate(Some(key), true).ok();
    }
    ui.logins.caller(&cookie(headers)?)
}

/// The login cookie's value.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

async fn login<B>(state: &Shared, ui: &UiState, req: Request<B>) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !same_origin(req.headers()) {
        return page(
            StatusCode::FORBIDDEN,
            pages::login(Some("Log in from this page (same origin).")),
        );
    }
    let form = match read_form(req).await {
        Ok(form) => form,
        Err(_) => {
            return page(
                StatusCode::BAD_REQUEST,
                pages::login(Some("The form could not be read.")),
            )
        }
    };
    let key = form.get("key").unwrap_or_default();
    let caller = match state
        .auth
        .authenticate(Some(key).filter(|k| !k.is_empty()), true)
    {
        Ok(caller) => caller,
        Err(e) => {
            return page(
                StatusCode::UNAUTHORIZED,
                pages::login(Some(&format!("Not accepted: {e}"))),
            )
        }
    };
    let Some(token) = ui.logins.open(caller) else {
        return page(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::login(Some("No randomness for a login token; try again.")),
        );
    };
    let cookie = format!(
        "{COOKIE}={token}; Path=/ui/; HttpOnly; SameSite=Strict; Max-Age={}",
        ui.config.login_ttl_secs
    );
    redirect("/ui/", Some(cookie))
}

fn logout(ui: &UiState, headers: &HeaderMap) -> Response<ProxyBody> {
    if !same_origin(headers) {
        return page(
            StatusCode::FORBIDDEN,
            pages::login(Some("Log out from this page.")),
        );
    }
    if let Some(token) = cookie(headers) {
        ui.logins.close(&token);
    }
    redirect(
        "/ui/login",
        Some(format!(
            "{COOKIE}=; Path=/ui/; HttpOnly; SameSite=Strict; Max-Age=0"
        )),
    )
}

/// The headers every answer of the page carries.
fn secure(resp: &mut Response<ProxyBody>) {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

fn page(status: StatusCode, markup: Markup) -> Response<ProxyBody> {
    let mut resp = Response::new(full(markup.into_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure(&mut resp);
    resp
}

fn asset(body: &'static str, content_type: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(&mut resp);
    resp
}

fn redirect(to: &'static str, cookie: Option<String>) -> Response<ProxyBody> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::SEE_OTHER;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        resp.headers_mut().insert(header::SET_COOKIE, c);
    }
    secure(&mut resp);
    resp
}

/// The records of a journal page (the first at index `first_index`), newest first, by when
/// each was written: a request's line is appended by the journal writer in batches, after
/// the decision and `stored` lines the next requests appended at once, and would show below
/// them. Records of the same time, or of a journal without times, stay in the journal's order.
fn newest_first(records: &[Value], first_index: usize) -> Vec<(usize, &Value)> {
    let mut page: Vec<(usize, &Value)> = records
        .iter()
        .enumerate()
        .map(|(n, r)| (first_index + n, r))
        .rev()
        .collect();
    fn ts(r: &Value) -> Option<&str> {
        r.get("ts").and_then(Value::as_str)
    }
    if page.iter().all(|(_, r)| ts(r).is_some()) {
        page.sort_by(|(_, a), (_, b)| ts(b).cmp(&ts(a)));
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's line, written by the journal writer after the next request's decision,
    /// shows above that decision; a journal without times keeps its order.
    #[test]
    fn the_timeline_is_newest_first_by_time() {
        let at = |event: &str, ts: &str| serde_json::json!({"event": event, "ts": ts});
        let records = [
            at("request", "2026-11-26T10:00:01.000Z"),
            at("decision", "2026-11-26T10:00:03.000Z"),
            at("request", "2026-11-26T10:00:02.000Z"),
            at("request", "2026-11-26T10:00:04.000Z"),
        ];
        let order = |page: Vec<(usize, &Value)>| page.iter().map(|(i, _)| *i).collect::<Vec<_>>();
        assert_eq!(order(newest_first(&records, 10)), [13, 11, 12, 10]);
        let untimed = [serde_json::json!({"event": "stored"}), at("request", "t")];
        assert_eq!(order(newest_first(&untimed, 0)), [1, 0]);
    }
    use serde_json::json;

    #[test]
    fn a_summary_replaces_several_messages_and_a_compaction_one() {
        let m = |role: &str, text: &str| json!({"role": role, "content": text});
        let client = vec![
            m("system", "s"),
            m("user", "task"),
            m("assistant", "a1"),
            m("user", "u2"),
            m("tool", "long"),
            m("user", "last"),
        ];
        let forwarded = vec![
            m("system", "s"),
            m("user", "task"),
            m("user", "[summary]"),
            m("tool", "[compacted]"),
            m("user", "last"),
        ];
        let rows = align(client, forwarded);
        let kinds: Vec<&str> = rows
            .iter()
            .map(|r| match r {
                Row::Same(..) => "same",
                Row::Changed(..) => "changed",
                Row::Replaced(list, _) => {
                    if list.len() == 2 {
                        "replaced2"
                    } else {
                        "replaced"
                    }
                }
                Row::ClientOnly(..) => "client",
                Row::ProxyOnly(..) => "proxy",
            })
            .collect();
        assert_eq!(kinds, ["same", "same", "replaced2", "changed", "same"]);
    }

    #[test]
    fn only_same_origin_posts_pass() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://a:1")
        ])));
        assert!(!same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://evil")
        ])));
        assert!(!same_origin(&h(&[("host", "a:1")])));
        assert!(!same_origin(&h(&[
            ("host", "a:1"),
            ("origin", "http://a:1"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(same_origin(&h(&[
            ("host", "a:1"),
            ("sec-fetch-site", "same-origin")
        ])));
    }
}
