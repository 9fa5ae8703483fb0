//! The page's HTML, from maud templates: checked when the proxy compiles, every string escaped
//! when rendered (only `PreEscaped` would not be, and this module never uses it). No inline
//! script or style: the page's one script and stylesheet are files of their own
//! (`assets/`), so the Content-Security-Policy can forbid every inline one.

use std::collections::HashSet;

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;

use super::chart::{compact, session_chart, usd};
use super::journal::{ReloadCall, RequestLine};
use super::view::{Dollars, Totals, Turn};

/// Who is looking, as the header says it.
pub struct Viewer<'a> {
    pub label: &'a str,
    pub admin: bool,
}

/// Wraps a page's body in the document.
pub fn layout(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · context-proxy" }
                link rel="icon" href="/ui/assets/favicon.svg" type="image/svg+xml";
                link rel="stylesheet" href="/ui/assets/ui.css";
                script src="/ui/assets/ui.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/ui/" { "context-proxy" }
                    @if let Some(v) = viewer {
                        span.who { (v.label) @if v.admin { " (admin: every tenant)" } }
                        form.logout method="post" action="/ui/logout" {
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The login form.
pub fn login(error: Option<&str>) -> Markup {
    layout(
        "Log in",
        None,
        html! {
            section.login {
                h1 { "See what the proxy did" }
                p { "Enter a proxy key (its tenant's sessions) or the admin token (every tenant's)." }
                @if let Some(e) = error { p.error role="alert" { (e) } }
                form method="post" action="/ui/login" {
                    label for="key" { "Key or admin token" }
                    input #key type="password" name="key" autocomplete="current-password" required autofocus;
                    button type="submit" { "Log in" }
                }
            }
        },
    )
}

/// An error, as a page.
pub fn error(viewer: Option<&Viewer>, status: u16, message: &str) -> Markup {
    layout(
        "Error",
        viewer,
        html! {
            section.error-page {
                h1 { "Error " (status) }
                p { (message) }
                p { a href="/ui/" { "Back to the sessions" } }
            }
        },
    )
}

/// A session of the list.
pub struct ListRow {
    /// Query string naming the session (`t=…&s=…`).
    pub query: String,
    pub session: String,
    /// The tenant's proxy key name, else its id (an admin's view).
    pub tenant: Option<String>,
    pub totals: Totals,
}

/// What the list was filtered by.
pub struct Filter<'a> {
    pub model: Option<&'a str>,
    pub since_hours: Option<u64>,
    pub models: Vec<String>,
}

fn percent(share: Option<f64>) -> String {
    share.map_or("–".into(), |s| format!("{:.0}%", s * 100.0))
}

/// A cost without the proxy (`with`: false) or with it: in dollars when the model has list
/// prices, else in full-price input tokens.
fn cost(units: f64, dollars: Option<Dollars>, with: bool) -> String {
    match dollars {
        Some(d) => usd(if with { d.with } else { d.without }),
        None => format!("{} tok", compact(units)),
    }
}

/// `63104` as `63,104`.
pub fn num(n: impl Into<u64>) -> String {
    let digits = n.into().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An RFC 3339 time (`2026-11-26T01:19:43.016Z`) as `2026-11-26 01:19:43`.
fn when(ts: &str) -> String {
    match (ts.get(..10), ts.get(11..19)) {
        (Some(day), Some(time)) if ts.as_bytes().get(10) == Some(&b'T') => format!("{day} {time}"),
        _ => ts.to_string(),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0} ms"))
}

/// The sessions the viewer may see, newest first.
pub fn session_list(
    viewer: &Viewer,
    rows: &[ListRow],
    filter: &Filter,
    more: Option<&str>,
) -> Markup {
    layout(
        "Sessions",
        Some(viewer),
        html! {
            h1 { "Sessions" }
            form.filter method="get" action="/ui/" {
                label for="model" { "Model" }
                select #model name="model" {
                    option value="" { "any" }
                    @for m in &filter.models {
                        option value=(m) selected[filter.model == Some(m.as_str())] { (m) }
                    }
                }
                label for="since" { "Active in the last" }
                select #since name="since" {
                    option value="" { "any time" }
                    @for (h, label) in [(1u64, "hour"), (24, "day"), (168, "week")] {
                        option value=(h) selected[filter.since_hours == Some(h)] { (label) }
                    }
                }
                button type="submit" { "Filter" }
            }
            @if rows.is_empty() {
                p.empty { "No sessions." }
            } @else {
                div.wide { table.sessions {
                    thead { tr {
                        th { "Session" }
                        @if viewer.admin { th { "Tenant" } }
                        th { "Model" }
                        th.num { "Turns" }
                        th.num { "Tokens sent" }
                        th.num { "Forwarded" }
                        th.num { "Saved" }
                        th.num { "Cached" }
                        th.num { "Cost without" }
                        th.num { "Cost with" }
                        th.num { "Reload rounds" }
                        th.num { "Summaries" }
                        th { "Last activity" }
                    } }
                    tbody {
                        @for r in rows {
                            tr.session {
                                td.nowrap { a href=(format!("/ui/session?{}", r.query)) { (r.session) } }
                                @if viewer.admin { td { (r.tenant.as_deref().unwrap_or("")) } }
                                td.nowrap { (r.totals.model.as_deref().unwrap_or("–")) }
                                td.num.turns { (r.totals.turns) }
                                td.num.sent { (num(r.totals.tokens_before)) }
                                td.num.forwarded { (num(r.totals.tokens_after)) }
                                td.num { (percent(r.totals.saved_share())) }
                                td.num { (percent(r.totals.cached_share())) }
                                td.num.cost-without { (cost(r.totals.cost_without, r.totals.dollars, false)) }
                                td.num.cost-with { (cost(r.totals.cost_with, r.totals.dollars, true)) }
                                td.num.reloads { (r.totals.reload_rounds) }
                                td.num { (r.totals.summaries) }
                                td.when { (r.totals.last_at.as_deref().map_or("–".into(), when)) }
                            }
                        }
                    }
                } }
                @if let Some(more) = more { p { a href=(more) { "Older sessions →" } } }
            }
        },
    )
}

/// One session: its figures, chart and timeline.
pub struct SessionView<'a> {
    pub query: &'a str,
    pub session: &'a str,
    pub tenant: Option<&'a str>,
    pub totals: &'a Totals,
    /// Every turn (the chart's), oldest first.
    pub turns: &'a [Turn],
    /// The journal records of this page, with their index, newest first.
    pub page: Vec<(usize, &'a Value)>,
    pub journal_total: usize,
    /// A link to older records.
    pub older: Option<String>,
    /// The newest page (the one that updates live).
    pub live: bool,
    pub poll_ms: u64,
}

pub fn session_page(viewer: &Viewer, s: &SessionView) -> Markup {
    layout(
        s.session,
        Some(viewer),
        html! {
            nav.crumbs { a href="/ui/" { "Sessions" } " / " span { (s.session) } }
            h1 { "Session " code { (s.session) } }
            @if let Some(t) = s.tenant { p.tenant { "Tenant: " (t) } }
            @if s.live {
                (live_section(s))
            } @else {
                (timeline(s))
            }
            @if let Some(older) = &s.older { p { a.older href=(older) { "Older requests →" } } }
            form.erase method="post" action="/ui/erase" {
                @for (k, v) in form_urlencoded::parse(s.query.as_bytes()) {
                    input type="hidden" name=(k) value=(v);
                }
                button.danger type="submit" data-confirm="Erase this session, its journal and everything it stored?" { "Erase this session" }
            }
        },
    )
}

/// The part of the newest page that the script replaces as new requests arrive.
pub fn live_section(s: &SessionView) -> Markup {
    html! {
        section #live data-poll=(format!("/ui/live?{}&n={}", s.query, s.journal_total)) data-every=(s.poll_ms) {
            (figures(s.totals))
            (session_chart(s.turns))
            (timeline(s))
        }
    }
}

/// The live part of a session that is no longer there: no `data-poll`, so polling stops.
pub fn gone() -> Markup {
    html! {
        section #live { p.empty { "This session is no longer in the store (erased, or expired)." } }
    }
}

fn figures(t: &Totals) -> Markup {
    html! {
        dl.figures {
            div { dt { "Turns" } dd #fig-turns { (t.turns) } }
            div { dt { "Tokens sent" } dd { (num(t.tokens_before)) } }
            div { dt { "Forwarded" } dd { (num(t.tokens_after)) } }
            div { dt { "Saved" } dd { (percent(t.saved_share())) } }
            div { dt { "Cached" } dd { (percent(t.cached_share())) } }
            div { dt { "Cost without / with" } dd #fig-cost { (cost(t.cost_without, t.dollars, false)) " / " (cost(t.cost_with, t.dollars, true)) } }
            div { dt { "Reload rounds" } dd { (t.reload_rounds) } }
            div { dt { "Summaries" } dd { (t.summaries) } }
        }
    }
}

fn timeline(s: &SessionView) -> Markup {
    let turn_of = |index: usize| s.turns.iter().find(|t| t.index == index);
    html! {
        table.timeline {
            thead { tr {
                th { "#" } th { "When" } th { "Actions" } th.num { "Tokens before → after" }
                th.num { "Prefix kept" } th.num { "Cost without / with" } th.num { "Latency" }
                th.num { "TTFB" } th { "Reload calls" } th {}
            } }
            tbody {
                @for (index, record) in &s.page {
                    @if let Some(turn) = turn_of(*index) {
                        (turn_row(s.query, turn))
                    } @else {
                        tr.event {
                            td {} td.when { (when(record.get("ts").and_then(Value::as_str).unwrap_or(""))) }
                            td colspan="8" { (event_text(record)) }
                        }
                    }
                }
            }
        }
    }
}

fn event_text(record: &Value) -> String {
    let event = record
        .get("event")
        .and_then(Value::as_str)
        .unwrap_or("event");
    match event {
        "decision" => format!(
            "decision: {} ({} → {} tokens)",
            record.get("actions").and_then(Value::as_str).unwrap_or(""),
            record.get("tokens_before").unwrap_or(&Value::Null),
            record.get("tokens_after").unwrap_or(&Value::Null),
        ),
        "stored" => format!(
            "stored {} item(s)",
            record
                .get("items")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        ),
        other => other.to_string(),
    }
}

fn turn_row(query: &str, turn: &Turn) -> Markup {
    let l = &turn.line;
    html! {
        tr.turn id=(format!("turn-{}", turn.number)) data-index=(turn.index) {
            td { (turn.number) }
            td.when { (when(&l.ts)) }
            td.actions {
                @for a in action_tags(&l.actions) { span.tag.(a.0) { (a.1) } " " }
                @if let Some(s) = &l.summary { span.tag.summarized { "summary: " (s) } }
            }
            td.num { (num(l.tokens_before as u64)) " → " (num(l.tokens_after as u64)) }
            td.num { (num(l.kept_prefix_tokens as u64)) }
            td.num.cost { (cost(turn.cost_without, turn.dollars, false)) " / " (cost(turn.cost_with, turn.dollars, true)) }
            td.num { (ms(l.latency_ms)) }
            td.num { (ms(l.ttfb_ms)) }
            td.reloads {
                @if l.reload_calls > 0 {
                    details {
                        summary { (l.reload_calls) " call(s), " (l.reload_rounds) " round(s)" }
                        (reload_list(&l.reloads))
                    }
                } @else { "–" }
            }
            td.nowrap { a href=(format!("/ui/request?{query}&i={}", turn.index)) { "side by side" } }
        }
    }
}

/// `minified=2,compacted=1` as tags: (class, text).
fn action_tags(actions: &str) -> Vec<(&'static str, String)> {
    if actions == "none" || actions.is_empty() {
        return vec![("none", "none".into())];
    }
    if actions.starts_with("skipped") {
        return vec![("skipped", actions.to_string())];
    }
    actions
        .split(',')
        .map(|part| {
            let name = part.split('=').next().unwrap_or(part);
            let class = match name {
                "truncated" => "truncated",
                "compacted" => "compacted",
                "offloaded" => "offloaded",
                "minified" => "minified",
                "deduped" => "deduped",
                "repeated" => "repeated",
                _ => "other",
            };
            (class, part.to_string())
        })
        .collect()
}

fn reload_list(calls: &[ReloadCall]) -> Markup {
    html! {
        ol.reload-calls {
            @for c in calls {
                li.reload-call {
                    span.tag.reload { "round " (c.round) ": " (c.tool) }
                    " " code { (c.arguments) }
                    @if !c.ok { " " span.tag.skipped { "error" } }
                    " " (c.lines) " line(s)"
                    pre.result { (c.result) @if c.clipped { "\n…" } }
                }
            }
        }
    }
}

/// One row of the side-by-side view.
pub enum Row {
    /// The same message on both sides.
    Same(usize, Value),
    /// The client's message and what the model received in its place.
    Changed(usize, Value, Value),
    /// Several of the client's messages the model received as one (a summary).
    Replaced(Vec<(usize, Value)>, Value),
    ClientOnly(usize, Value),
    ProxyOnly(Value),
}

/// Lines of a message shown inline; longer ones open paged.
pub const INLINE_LINES: usize = 60;

/// One request: what the client sent against what the model received.
pub struct RequestView<'a> {
    pub query: &'a str,
    pub session: &'a str,
    pub index: usize,
    pub line: &'a RequestLine,
    pub rows: Option<Vec<Row>>,
    /// References that are links (the ones the forwarded request's markers name).
    pub refs: HashSet<String>,
}

pub fn request_page(viewer: &Viewer, r: &RequestView) -> Markup {
    let l = r.line;
    let session_link = format!("/ui/session?{}", r.query);
    html! {
        (layout("Request", Some(viewer), html! {
            nav.crumbs {
                a href="/ui/" { "Sessions" } " / "
                a href=(session_link) { (r.session) } " / "
                span { "request " (l.request_id) }
            }
            h1 { "Request " code { (l.request_id) } }
            dl.figures {
                div { dt { "Route" } dd #route { (route_path(&l.route)) } }
                div { dt { "Model" } dd { (l.model.as_deref().unwrap_or("–")) } }
                div { dt { "Actions" } dd { (l.actions) } }
                div { dt { "Tokens" } dd { (num(l.tokens_before as u64)) " → " (num(l.tokens_after as u64)) } }
                div { dt { "Prefix kept" } dd { (num(l.kept_prefix_tokens as u64)) } }
                div { dt { "Latency / TTFB" } dd { (ms(l.latency_ms)) " / " (ms(l.ttfb_ms)) } }
                div { dt { "Upstream calls" } dd { (l.upstream_calls) } }
            }
            @match &r.rows {
                None => p.empty { "The messages of this request were not kept (" code { "[ui] keep_messages" } ", or larger than " code { "max_kept_bytes" } ")." },
                Some(rows) => {
                    table.side-by-side {
                        thead { tr { th { "What the client sent" } th { "What the model received" } } }
                        tbody {
                            @for row in rows { (side_row(r, row)) }
                            // Where they happened: after the last message the model received,
                            // before the answer the client got.
                            @if !l.reloads.is_empty() {
                                tr.hidden-rounds {
                                    td.client { p.empty { "(the client saw none of this)" } }
                                    td.proxy { (hidden_rounds(l)) }
                                }
                            }
                        }
                    }
                }
            }
            @if r.rows.is_none() && !l.reloads.is_empty() {
                section { (hidden_rounds(l)) }
            }
        }))
    }
}

/// The proxy's hidden rounds of a request: the calls of its own tools the model made and
/// what they returned.
fn hidden_rounds(l: &RequestLine) -> Markup {
    html! {
        div.hidden-rounds {
            h2 { "The proxy's hidden rounds" }
            p { "Here the model called the proxy's own tools; the proxy answered and asked again. The client never saw these." }
            (reload_list(&l.reloads))
        }
    }
}

/// The path a journal's `route` names.
fn route_path(route: &str) -> &str {
    match route {
        "chat" | "" => "/v1/chat/completions",
        "responses" => "/v1/responses",
        "messages" => "/v1/messages",
        "count_tokens" => "/v1/messages/count_tokens",
        other => other,
    }
}

fn side_row(r: &RequestView, row: &Row) -> Markup {
    let none = HashSet::new();
    match row {
        Row::Same(i, m) => html! {
            tr.same { td { (message(r, "client", *i, m, &none)) } td.unchanged { "unchanged" } }
        },
        Row::Changed(i, c, f) => html! {
            tr.changed { td { (message(r, "client", *i, c, &none)) } td.proxy { (message(r, "forwarded", usize::MAX, f, &r.refs)) } }
        },
        Row::Replaced(list, f) => html! {
            tr.changed.summarized {
                td { @for (i, c) in list { (message(r, "client", *i, c, &none)) } }
                td.proxy { (message(r, "forwarded", usize::MAX, f, &r.refs)) }
            }
        },
        Row::ClientOnly(i, c) => html! {
            tr.changed { td { (message(r, "client", *i, c, &none)) } td.proxy { em { "not sent" } } }
        },
        Row::ProxyOnly(f) => html! {
            tr.changed { td { em { "–" } } td.proxy { (message(r, "forwarded", usize::MAX, f, &r.refs)) } }
        },
    }
}

/// One message or item of any of the three wires, as the page shows it. The shapes do not
/// collide, so one reading serves them all: chat's messages (`role`, `content`, `tool_calls`,
/// `tool_call_id`), the Responses API's items (`message`, `function_call`,
/// `function_call_output`, `reasoning`) and Anthropic's messages (content blocks `text`,
/// `tool_use`, `tool_result`, `thinking`).
#[derive(Debug, Default, PartialEq)]
pub struct Shown {
    pub role: String,
    /// The tool call it answers (chat's `tool_call_id`, the Responses API's `call_id`,
    /// Anthropic's `tool_use_id`), or the call it makes.
    pub id: Option<String>,
    /// Tool calls it makes: name and arguments.
    pub calls: Vec<(String, String)>,
    pub text: String,
}

/// The text of a `content`: a string, or the text of its parts (a `tool_result` block's own
/// content included).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                Some("tool_result") => Some(content_text(p.get("content"))),
                Some("thinking") => p
                    .get("thinking")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                _ => p.get("text").and_then(Value::as_str).map(str::to_string),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// How the page shows `m` (see [`Shown`]).
pub fn shown(m: &Value) -> Shown {
    match m.get("type").and_then(Value::as_str) {
        Some("function_call") => {
            return Shown {
                role: "assistant".into(),
                id: str_of(m, "call_id"),
                calls: vec![(
                    str_of(m, "name").unwrap_or_else(|| "?".into()),
                    str_of(m, "arguments").unwrap_or_default(),
                )],
                text: String::new(),
            }
        }
        Some("function_call_output") => {
            return Shown {
                role: "tool".into(),
                id: str_of(m, "call_id"),
                calls: Vec::new(),
                text: content_text(m.get("output")),
            }
        }
        Some("reasoning") => {
            return Shown {
                role: "reasoning".into(),
                text: content_text(m.get("summary")),
                ..Shown::default()
            }
        }
        _ => {}
    }
    let content = m.get("content");
    let blocks = content.and_then(Value::as_array);
    let of_type = |t: &str| {
        blocks.map_or(Vec::new(), |b| {
            b.iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some(t))
                .collect::<Vec<_>>()
        })
    };
    let results = of_type("tool_result");
    let all_results = blocks.is_some_and(|b| !b.is_empty() && results.len() == b.len());
    let mut calls: Vec<(String, String)> = of_type("tool_use")
        .into_iter()
        .map(|c| {
            let input = c.get("input").map(Value::to_string).unwrap_or_default();
            (str_of(c, "name").unwrap_or_else(|| "?".into()), input)
        })
        .collect();
    if let Some(list) = m.get("tool_calls").and_then(Value::as_array) {
        calls.extend(list.iter().map(|c| {
            let at = |p: &str| c.pointer(p).and_then(Value::as_str).unwrap_or("");
            (
                at("/function/name").to_string(),
                at("/function/arguments").to_string(),
            )
        }));
    }
    let role = str_of(m, "role").unwrap_or_else(|| "?".into());
    Shown {
        // Anthropic's tool results come in a user message: shown as the tool's.
        role: if all_results { "tool".into() } else { role },
        id: str_of(m, "tool_call_id")
            .or_else(|| results.first().and_then(|r| str_of(r, "tool_use_id"))),
        calls,
        text: content_text(content),
    }
}

/// A message's text, as [`shown`] reads it.
pub fn message_text(m: &Value) -> String {
    shown(m).text
}

/// One message: role, tool calls, and its text (the first [`INLINE_LINES`] lines; the rest
/// opens paged). On the model's side, a line naming a reference of `refs` is a marker: it
/// is highlighted and the reference is a link to the stored original.
fn message(r: &RequestView, side: &str, index: usize, m: &Value, refs: &HashSet<String>) -> Markup {
    let Shown {
        role,
        id,
        calls,
        text,
    } = shown(m);
    let total = text.lines().count();
    html! {
        div.message.(role_class(&role)) {
            div.meta {
                span.role { (role) }
                @if let Some(id) = &id { " " code { (id) } }
            }
            @if !calls.is_empty() {
                ul.tool-calls {
                    @for (name, args) in &calls {
                        li { code { (name) } " " code.args { (args) } }
                    }
                }
            }
            pre.text {
                @for (n, line) in text.lines().take(INLINE_LINES).enumerate() {
                    @if n > 0 { "\n" }
                    (text_line(r.query, line, refs))
                }
            }
            @if total > INLINE_LINES && index != usize::MAX {
                a.more href=(format!("/ui/message?{}&i={}&side={side}&m={index}&offset={}", r.query, r.index, INLINE_LINES + 1)) {
                    (total - INLINE_LINES) " more line(s) →"
                }
            } @else if total > INLINE_LINES {
                p.more { (total - INLINE_LINES) " more line(s)" }
            }
        }
    }
}

fn role_class(role: &str) -> &'static str {
    match role {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        _ => "other",
    }
}

/// One line of text; references of `refs` in it become links, and the line a marker.
fn text_line(query: &str, line: &str, refs: &HashSet<String>) -> Markup {
    let pieces = split_refs(line, refs);
    let marked = pieces.iter().any(|p| p.1);
    let tenant = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "t")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let link = |r: &str| {
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("t", &tenant)
            .append_pair("r", r)
            .finish();
        format!("/ui/ref?{q}")
    };
    let body = html! {
        @for (piece, is_ref) in &pieces {
            @if *is_ref { a.ref href=(link(piece)) { (piece) } } @else { (piece) }
        }
    };
    if marked {
        html! { mark.marker { (body) } }
    } else {
        body
    }
}

/// `line` cut into text and the references of `refs` it names: (piece, is a reference).
fn split_refs<'a>(line: &'a str, refs: &HashSet<String>) -> Vec<(&'a str, bool)> {
    let mut out = Vec::new();
    let mut rest = line;
    let ref_len = 4 + 24;
    while let Some(at) = rest.find("ctx_") {
        let end = (at + ref_len).min(rest.len());
        let candidate = rest.get(at..end).unwrap_or("");
        if candidate.len() == ref_len && refs.contains(candidate) {
            if at > 0 {
                out.push((&rest[..at], false));
            }
            out.push((candidate, true));
            rest = &rest[end..];
        } else {
            out.push((&rest[..at + 4], false));
            rest = &rest[at + 4..];
        }
    }
    if !rest.is_empty() {
        out.push((rest, false));
    }
    out
}

/// Stored text (a reference's content, or one message), a page of lines.
pub struct TextPage<'a> {
    pub title: String,
    pub back: Option<(String, &'a str)>,
    pub lines: Vec<&'a str>,
    /// The number of the first line shown, from 1.
    pub offset: usize,
    pub total: usize,
    pub bytes: usize,
    pub prev: Option<String>,
    pub next: Option<String>,
}

pub fn text_page(viewer: &Viewer, p: &TextPage) -> Markup {
    let last = p.offset + p.lines.len().saturating_sub(1);
    layout(
        &p.title,
        Some(viewer),
        html! {
            nav.crumbs {
                a href="/ui/" { "Sessions" }
                @if let Some((href, label)) = &p.back { " / " a href=(href) { (label) } }
            }
            h1 { (p.title) }
            p.range { "Lines " (p.offset) "–" (last) " of " (p.total) " (" (num(p.bytes as u64)) " bytes)" }
            nav.pager {
                @if let Some(prev) = &p.prev { a.prev href=(prev) { "← previous lines" } }
                @if let Some(next) = &p.next { a.next href=(next) { "next lines →" } }
            }
            ol.stored start=(p.offset) {
                @for line in &p.lines { li { (line) } }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_references_are_split_out() {
        let known = "ctx_abcdefghijklmnopqrstuvwx".to_string();
        let refs: HashSet<String> = [known.clone()].into_iter().collect();
        let line = format!("stored as {known}. ctx_zzzzzzzzzzzzzzzzzzzzzzzz is not ours");
        let pieces = split_refs(&line, &refs);
        assert_eq!(pieces.iter().filter(|p| p.1).count(), 1);
        assert_eq!(pieces.iter().map(|p| p.0).collect::<String>(), line);
        let html = text_line("t=a&s=b", &line, &refs).into_string();
        assert!(html.contains("<mark class=\"marker\">"), "{html}");
        assert!(html.contains("href=\"/ui/ref?t=a&amp;r=ctx_abc"), "{html}");
    }

    /// The three wires' messages and items read as one: role, the call they answer or make,
    /// their calls and their text.
    #[test]
    fn every_wire_is_shown_by_one_reading() {
        use serde_json::json;
        let chat_call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]});
        assert_eq!(shown(&chat_call).calls, [("read".into(), "{}".into())]);
        let chat_result = json!({"role": "tool", "tool_call_id": "c1", "content": "a\nb"});
        let s = shown(&chat_result);
        assert_eq!(
            (s.role.as_str(), s.id.as_deref(), s.text.as_str()),
            ("tool", Some("c1"), "a\nb")
        );
        let call = json!({"type": "function_call", "call_id": "c2", "name": "grep", "arguments": "{\"p\":1}"});
        let s = shown(&call);
        assert_eq!(
            (s.role.as_str(), s.id.as_deref()),
            ("assistant", Some("c2"))
        );
        assert_eq!(s.calls, [("grep".into(), "{\"p\":1}".into())]);
        let output =
            json!({"type": "function_call_output", "call_id": "c2", "output": "[stored as ctx_x]"});
        assert_eq!(shown(&output).role, "tool");
        assert_eq!(shown(&output).text, "[stored as ctx_x]");
        let message = json!({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]});
        assert_eq!(shown(&message).text, "one\ntwo");
        let reasoning =
            json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}]});
        assert_eq!(shown(&reasoning).role, "reasoning");
        assert_eq!(shown(&reasoning).text, "thought");
        let tool_use = json!({"role": "assistant", "content": [
            {"type": "text", "text": "reading"},
            {"type": "tool_use", "id": "tu1", "name": "read", "input": {"path": "a"}}]});
        let s = shown(&tool_use);
        assert_eq!((s.role.as_str(), s.text.as_str()), ("assistant", "reading"));
        assert_eq!(s.calls, [("read".into(), r#"{"path":"a"}"#.into())]);
        let tool_result = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "body"}]}]});
        let s = shown(&tool_result);
        assert_eq!(
            (s.role.as_str(), s.id.as_deref(), s.text.as_str()),
            ("tool", Some("tu1"), "body")
        );
        assert_eq!(message_text(&tool_result), "body");
    }

    #[test]
    fn numbers_and_times_read_easily() {
        assert_eq!(num(0u64), "0");
        assert_eq!(num(999u64), "999");
        assert_eq!(num(63_104u64), "63,104");
        assert_eq!(num(113_725_000u64), "113,725,000");
        assert_eq!(usd(1.256), "$1.26");
        assert_eq!(usd(0.0042149), "$0.00421");
        assert_eq!(usd(0.5), "$0.500");
        assert_eq!(usd(0.0), "$0.00");
        assert_eq!(when("2026-11-26T01:19:43.016Z"), "2026-11-26 01:19:43");
        assert_eq!(when("t1"), "t1");
    }

    #[test]
    fn content_is_escaped() {
        let html = text_line(
            "t=a",
            "<script>alert(1)</script><img src=x onerror=alert(1)>",
            &HashSet::new(),
        )
        .into_string();
        assert!(
            !html.contains("<script>") && !html.contains("<img"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }
}
