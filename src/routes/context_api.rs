//! Inspection and erasure of what the proxy stored, over HTTP: the `/v1/context/…` routes,
//! answered by the proxy itself (never forwarded). What they show is read by
//! [`crate::sessions`], which the `inspect` subcommand shares.
//!
//! - `GET /v1/context/sessions` — the caller's sessions, a page at a time (`limit`, `after`);
//! - `GET /v1/context/sessions/{id}` — one session: a page of its journal (the newest records,
//!   or those before `before`; `limit`), with the statistics and stored references (kind, size,
//!   when) of that page; a journal of any size is read holding only the page;
//! - `DELETE /v1/context/sessions/{id}` — erases its state, journal and stored content;
//! - `GET /v1/context/refs/{ref}` — stored content, to its own tenant only (404 otherwise).
//!
//! Every route is scoped to the caller's tenant ([`crate::auth::Caller`]). The admin token
//! (`[auth] admin_token_env`) sees every tenant: its list names each session's tenant (and the
//! proxy key it belongs to, when it is one), and the other routes take the tenant as
//! `?tenant=<id or key name>`.

use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response};
use serde_json::json;

use crate::auth::{Caller, KeyNames};
use crate::http::body::{full, ProxyBody};
use crate::http::error::ProxyError;
use crate::routes::shared::Shared;
use crate::sessions::{
    erase, list_page, not_found, parse_tenant, session_page, InspectError, Page,
};
use crate::store::{ContentRef, SessionId, Tenant};

/// Answers a `/v1/context/…` request (the router has authenticated it).
pub async fn handle<B>(
    state: Arc<Shared>,
    req: Request<B>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let caller = crate::auth::caller(req.extensions())
        .cloned()
        .ok_or(crate::auth::AuthError::Missing)?;
    let store = state.context.store().clone();
    let names = caller.admin.then(|| state.auth.key_names());
    let path = req.uri().path().trim_end_matches('/');
    let rest = path.strip_prefix("/v1/context/").unwrap_or_default();
    let query_tenant = query_param(req.uri().query(), "tenant");
    let page = Page::parse(
        query_param(req.uri().query(), "limit").as_deref(),
        query_param(req.uri().query(), "before").as_deref(),
    )?;
    let method = req.method().clone();
    let not_allowed = |allowed| ProxyError::MethodNotAllowed {
        method: method.to_string(),
        path: path.to_string(),
        allowed,
    };
    // The page's journal lines still waiting are written first: what these routes read or
    // erase is every request answered so far, and an erased session gets no line back.
    if let Some(ui) = &state.ui {
        ui.journal.flush().await;
    }
    let body = match rest.split_once('/') {
        None if rest == "sessions" => {
            if method != Method::GET {
                return Err(not_allowed("GET"));
            }
            let scope = (!caller.admin).then_some(&caller.tenant);
            let after = query_param(req.uri().query(), "after");
            let after = after
                .as_deref()
                .map(|a| percent_encoding::percent_decode_str(a).decode_utf8_lossy());
            list_page(store.as_ref(), scope, names, after.as_deref(), page.limit).await?
        }
        Some(("sessions", id)) => {
            let tenant = tenant_of(&caller, query_tenant.as_deref(), names)?;
            // The session's name as the client gave it, percent-encoded in the path.
            let id = &*percent_encoding::percent_decode_str(id).decode_utf8_lossy();
            let session = parse_session(id)?;
            match method {
                Method::GET => session_page(store.as_ref(), &tenant, &session, names, &page)
                    .await?
                    .ok_or_else(|| not_found("session", id))?,
                Method::DELETE => {
                    let erased = erase(store.as_ref(), &tenant, &session).await?;
                    if erased == 0 {
                        return Err(not_found("session", id).into());
                    }
                    tracing::info!(session = %session, items = erased, "session erased");
                    json!({"id": id, "object": "context.session.deleted", "deleted": true, "items": erased})
                }
                _ => return Err(not_allowed("GET or DELETE")),
            }
        }
        Some(("refs", id)) => {
            if method != Method::GET {
                return Err(not_allowed("GET"));
            }
            let tenant = tenant_of(&caller, query_tenant.as_deref(), names)?;
            // An invalid reference is as unknown as another tenant's.
            let r: ContentRef = id.parse().map_err(|_| not_found("reference", id))?;
            let text = store
                .get_content(&tenant, &r)
                .await
                .map_err(InspectError::from)?
                .ok_or_else(|| not_found("reference", id))?;
            let mut resp = Response::new(full(text));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Ok(resp);
        }
        _ => {
            return Err(ProxyError::NotFound {
                method: method.to_string(),
                path: path.to_string(),
            })
        }
    };
    let mut resp = Response::new(full(body.to_string()));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn parse_session(id: &str) -> Result<SessionId, InspectError> {
    SessionId::parse(id).map_err(|_| not_found("session", id))
}

/// The tenant a request is about: the caller's own, or for the admin the `tenant` parameter.
fn tenant_of(
    caller: &Caller,
    given: Option<&str>,
    names: Option<&KeyNames>,
) -> Result<Tenant, InspectError> {
    if !caller.admin {
        return Ok(caller.tenant.clone());
    }
    let given = given.ok_or_else(|| {
        InspectError::BadRequest(
            "the admin token names the tenant: add ?tenant=<tenant id or proxy key name> \
             (GET /v1/context/sessions lists every session with its tenant)"
                .into(),
        )
    })?;
    parse_tenant(given, names)
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}
