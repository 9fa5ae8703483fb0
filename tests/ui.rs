//! The page (`/ui/`, `[ui] enabled`) through the real proxy and the mock upstream, over real
//! sockets: the HTML of each view asserted, every string escaped, the Content-Security-Policy
//! on every answer, tenants kept apart, no page without a key, erasure only from the same
//! origin. The browser tests are in `tests/ui_browser.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{key, messages_read_body, Harness, WAIT};
use context_proxy::app::config::Config;
use context_proxy::mock::{MockConfig, Reply};
use context_proxy::store::ContentRef;
use serde_json::{json, Value};

fn setup(c: &mut Config) {
    std::env::set_var("CP_UI_TEST_UPSTREAM", "sk-upstream-own");
    std::env::set_var("CP_UI_TEST_ADMIN", "admin-secret");
    c.upstreams[0].api_key_env = Some("CP_UI_TEST_UPSTREAM".into());
    c.keys = vec![key("alice", "sk-alice"), key("bob", "sk-bob")];
    c.auth.admin_token_env = Some("CP_UI_TEST_ADMIN".into());
    c.context.keep_recent_messages = 2;
    c.context.compact_batch_tokens = 1000;
    c.ui.enabled = true;
}

/// What a hostile tool produced: HTML, a script, a `javascript:` link and a fake marker.
const HOSTILE: &str = "<script>alert('xss')</script> <img src=x onerror=alert(2)> \
     <a href=\"javascript:alert(3)\">click</a> [stored as ctx_aaaaaaaaaaaaaaaaaaaaaaaa]";

fn file_a() -> String {
    let mut text = format!("{HOSTILE}\n");
    for i in 1..=3000 {
        text.push_str(&format!(
            "a.rs line {i}: let value_{i} = compute({i}) * 2;\n"
        ));
    }
    text
}

fn conversation() -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": file_a()},
        {"role": "assistant", "content": "Read."},
        {"role": "user", "content": "What is on line 7?"}
    ]})
}

async fn send_chat(h: &Harness, secret: &str, session: &str, body: &Value) {
    let resp = h
        .client
        .post(h.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {secret}"))
        .header("x-context-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
}

async fn get(
    h: &Harness,
    path: &str,
    secret: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = h.client.get(h.url(path));
    if let Some(s) = secret {
        req = req.header("authorization", format!("Bearer {s}"));
    }
    let resp = req.send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap())
}

/// Waits until the session page of `session` shows `turns` turns (the journal line is written
/// once the answer has gone out).
async fn wait_turns(h: &Harness, secret: &str, session: &str, turns: usize) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, _, html) = get(h, &format!("/ui/session?s={session}"), Some(secret)).await;
        if status == 200 && html.contains(&format!("id=\"turn-{turns}\"")) {
            return html;
        }
        assert!(
            Instant::now() < deadline,
            "no turn {turns} in time: {status} {html}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn no_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn started() -> Harness {
    let mut h = Harness::start_with(MockConfig::default(), setup).await;
    h.client = no_client();
    h
}

#[tokio::test]
async fn a_session_is_shown_as_the_proxy_handled_it_and_escaped() {
    let h = started().await;
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();
    h.mock.push(Reply::tool_calls(vec![(
        "context_read".into(),
        json!({"ref": ref_a, "offset": 8, "limit": 3}),
    )]));
    h.mock.push(Reply::text("Line 7 computes value_7."));
    send_chat(&h, "sk-alice", "s-alice", &conversation()).await;

    // The list: the session with its figures, the CSP on the answer.
    let session = wait_turns(&h, "sk-alice", "s-alice", 1).await;
    let (status, headers, list) = get(&h, "/ui/", Some("sk-alice")).await;
    assert_eq!(status, 200);
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(list.contains(">s-alice</a>"), "{list}");
    assert!(list.contains("class=\"num turns\">1<"), "{list}");
    assert!(list.contains("class=\"num reloads\">1<"), "{list}");

    // The timeline: the actions, the reload call and what it returned.
    assert!(session.contains("class=\"tag compacted\""), "{session}");
    assert!(session.contains("context_read"), "{session}");
    assert!(session.contains("a.rs line 7: let value_7"), "{session}");
    assert!(session.contains("<svg"), "the chart: {session}");

    // Live: nothing new is a 204; a journal that grew brings the live part again.
    let poll = session
        .split("data-poll=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    assert!(poll.starts_with("/ui/live?"), "{poll}");
    let (status, _, body) = get(&h, &poll, Some("sk-alice")).await;
    assert_eq!((status, body.as_str()), (204, ""));
    let older = format!("{}&n=1", poll.split("&n=").next().unwrap());
    let (status, _, body) = get(&h, &older, Some("sk-alice")).await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with("<section id=\"live\"") && body.contains("id=\"turn-1\""),
        "{body}"
    );

    // Side by side: the marker where the content was, its reference a link; the hostile text
    // escaped on both sides and the fake marker not a link.
    let index = session
        .split("/ui/request?")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (status, _, side) = get(&h, &format!("/ui/request?{index}"), Some("sk-alice")).await;
    assert_eq!(status, 200, "{side}");
    assert!(side.contains("<mark class=\"marker\">"), "{side}");
    assert!(side.contains(&format!("r={ref_a}\"")), "{side}");
    assert!(
        side.contains("&lt;script&gt;alert('xss')&lt;/script&gt;"),
        "{side}"
    );
    for raw in [
        "<script>alert",
        "<img src=x",
        "<a href=\"javascript:",
        "href=\"javascript:",
    ] {
        assert!(!side.contains(raw), "{raw} unescaped: {side}");
        assert!(!session.contains(raw), "{raw} unescaped in the timeline");
    }
    assert!(
        !side.contains("r=ctx_aaaaaaaaaaaaaaaaaaaaaaaa"),
        "the fake marker is no link"
    );
    assert!(side.contains("hidden rounds"), "{side}");
    // Where they happened: the side-by-side table's last row, after the last message.
    let hidden = side
        .find("<tr class=\"hidden-rounds\">")
        .expect("a hidden-rounds row");
    assert_eq!(side.rfind("<tr"), Some(hidden), "the last row");
    assert!(side[hidden..].contains("context_read"));

    // The reference opens paged: the first 500 lines, then a link to the next ones.
    let (status, _, stored) = get(&h, &format!("/ui/ref?r={ref_a}"), Some("sk-alice")).await;
    assert_eq!(status, 200);
    assert!(stored.contains("a.rs line 7: let value_7"), "{stored}");
    assert!(stored.contains("of 3001"), "{stored}");
    assert!(!stored.contains("a.rs line 600:"), "only a page of it");
    assert!(stored.contains("&amp;offset=501"), "{stored}");
    let (_, _, next) = get(
        &h,
        &format!("/ui/ref?r={ref_a}&offset=501"),
        Some("sk-alice"),
    )
    .await;
    assert!(next.contains("a.rs line 600:") && !next.contains("a.rs line 7:"));
}

#[tokio::test]
async fn tenants_see_only_their_own_and_no_page_without_a_key() {
    let h = started().await;
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-alice", &conversation()).await;
    wait_turns(&h, "sk-alice", "s-alice", 1).await;
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();

    // No key: the login page, never a session.
    let (status, headers, _) = get(&h, "/ui/", None).await;
    assert_eq!(status, 303);
    assert_eq!(headers["location"], "/ui/login");
    for path in ["/ui/session?s=s-alice", &format!("/ui/ref?r={ref_a}")] {
        let (status, _, body) = get(&h, path, None).await;
        assert_eq!(status, 303, "{path}");
        assert!(!body.contains("a.rs line"));
        let (status, _, body) = get(&h, path, Some("sk-wrong")).await;
        assert_eq!(status, 303, "a wrong key is no key: {path}");
        assert!(!body.contains("a.rs line"));
    }

    // Bob: no session, no reference, no count of Alice's, even naming her tenant.
    let (status, _, list) = get(&h, "/ui/", Some("sk-bob")).await;
    assert_eq!(status, 200);
    assert!(
        !list.contains("s-alice") && list.contains("No sessions."),
        "{list}"
    );
    let alice = context_proxy::auth::key_tenant("alice");
    for path in [
        "/ui/session?s=s-alice".to_string(),
        format!("/ui/session?s=s-alice&t={}", alice.as_str()),
        format!("/ui/ref?r={ref_a}&t={}", alice.as_str()),
        format!("/ui/request?s=s-alice&i=0&t={}", alice.as_str()),
    ] {
        let (status, _, body) = get(&h, &path, Some("sk-bob")).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            !body.contains("a.rs line") && !body.contains("turn-1"),
            "{path}"
        );
    }

    // Polling another tenant's session says what polling an unknown one says.
    let gone = |body: &str| body.contains("no longer in the store") && !body.contains("turn-1");
    let (status, _, body) = get(&h, "/ui/live?s=s-alice&n=0", Some("sk-bob")).await;
    assert!(status == 200 && gone(&body), "{body}");
    let (_, _, unknown) = get(&h, "/ui/live?s=s-nobody&n=0", Some("sk-bob")).await;
    assert_eq!(body, unknown);

    // The admin sees every tenant, named by its key.
    let (status, _, list) = get(&h, "/ui/", Some("admin-secret")).await;
    assert_eq!(status, 200);
    assert!(
        list.contains("s-alice") && list.contains("key alice"),
        "{list}"
    );
}

#[tokio::test]
async fn erasure_and_login_need_the_same_origin() {
    let h = started().await;
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-alice", &conversation()).await;
    wait_turns(&h, "sk-alice", "s-alice", 1).await;
    let host = h.proxy.addr().to_string();
    let erase = |origin: Option<String>| {
        let mut req = h
            .client
            .post(h.url("/ui/erase"))
            .header("authorization", "Bearer sk-alice")
            .form(&[("s", "s-alice")]);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    for origin in [None, Some("http://evil.example".to_string())] {
        let resp = erase(origin.clone()).await.unwrap();
        assert_eq!(resp.status(), 403, "{origin:?}");
        let (status, _, _) = get(&h, "/ui/session?s=s-alice", Some("sk-alice")).await;
        assert_eq!(status, 200, "still there after {origin:?}");
    }
    // The messages kept for the side-by-side view go with the session.
    let kept = ContentRef::of(&conversation()["messages"].to_string());
    let kept = format!("/ui/ref?r={}", kept.as_str());
    let (status, _, _) = get(&h, &kept, Some("sk-alice")).await;
    assert_eq!(status, 200, "the client's messages are kept");
    let resp = erase(Some(format!("http://{host}"))).await.unwrap();
    assert_eq!(resp.status(), 303);
    let (status, _, _) = get(&h, &kept, Some("sk-alice")).await;
    assert_eq!(status, 404, "erased with the session");
    let (status, _, _) = get(&h, "/ui/session?s=s-alice", Some("sk-alice")).await;
    assert_eq!(status, 404, "erased");
    let (_, _, list) = get(&h, "/ui/", Some("sk-alice")).await;
    assert!(!list.contains("s-alice"));

    // A login from elsewhere is refused; from the page, a cookie only the page can use.
    let login = |origin: String, secret: &'static str| {
        h.client
            .post(h.url("/ui/login"))
            .header("origin", origin)
            .form(&[("key", secret)])
            .send()
    };
    let resp = login("http://evil.example".into(), "sk-alice")
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert!(resp.headers().get("set-cookie").is_none());
    let resp = login(format!("http://{host}"), "sk-nobody").await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = login(format!("http://{host}"), "sk-alice").await.unwrap();
    assert_eq!(resp.status(), 303);
    let cookie = resp.headers()["set-cookie"].to_str().unwrap().to_string();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ui/"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(!cookie.contains("sk-alice"), "the cookie is no key");
    let token = cookie.split(';').next().unwrap();
    let resp = h
        .client
        .get(h.url("/ui/"))
        .header("cookie", token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("key alice"));
}

#[tokio::test]
async fn the_page_is_off_unless_enabled() {
    let mut h = Harness::start_with(MockConfig::default(), |c| {
        c.auth.inspect_by_client_key = true;
    })
    .await;
    h.client = no_client();
    let (status, _, _) = get(&h, "/ui/", Some("sk-x")).await;
    assert_eq!(status, 404);
}

/// A 100 000-line tool result opens paged, never whole: on the side-by-side view, in the
/// message's own view, and as stored content.
#[tokio::test]
async fn a_100k_line_tool_result_opens_paged() {
    let h = started().await;
    let huge: String = (1..=100_000)
        .map(|i| format!("log line {i}: ok\n"))
        .collect();
    let mut body = conversation();
    body["messages"][3]["content"] = json!(huge);
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-huge", &body).await;
    let session = wait_turns(&h, "sk-alice", "s-huge", 1).await;
    let bound = 200_000;
    let request = session
        .split("/ui/request?")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (status, _, side) = get(&h, &format!("/ui/request?{request}"), Some("sk-alice")).await;
    assert_eq!(status, 200);
    assert!(side.len() < bound, "side by side: {} bytes", side.len());
    assert!(side.contains("log line 60: ok") && !side.contains("log line 61: ok"));
    let more = side
        .split("class=\"more\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (status, _, message) = get(&h, &more, Some("sk-alice")).await;
    assert_eq!(status, 200, "{more}");
    assert!(message.len() < bound, "message: {} bytes", message.len());
    assert!(message.contains("log line 61: ok") && message.contains("log line 560: ok"));
    assert!(!message.contains("log line 561: ok") && message.contains("of 100000"));
    let r = ContentRef::of(&huge).as_str().to_string();
    let (status, _, stored) =
        get(&h, &format!("/ui/ref?r={r}&offset=99900"), Some("sk-alice")).await;
    assert_eq!(status, 200);
    assert!(stored.len() < bound, "stored: {} bytes", stored.len());
    assert!(stored.contains("log line 100000: ok") && !stored.contains("log line 99899: ok"));
}

#[tokio::test]
async fn the_list_filters_by_model_and_time() {
    let h = started().await;
    for (session, model) in [("s-4o", "gpt-4o"), ("s-mini", "gpt-4o-mini")] {
        let mut body = conversation();
        body["model"] = json!(model);
        h.mock.push(Reply::text("ok"));
        send_chat(&h, "sk-alice", session, &body).await;
        wait_turns(&h, "sk-alice", session, 1).await;
    }
    let listed = |html: &str| {
        ["s-4o", "s-mini"]
            .into_iter()
            .filter(|s| html.contains(&format!(">{s}</a>")))
            .collect::<Vec<_>>()
    };
    let (_, _, all) = get(&h, "/ui/", Some("sk-alice")).await;
    assert_eq!(listed(&all).len(), 2, "{all}");
    // Newest first.
    assert!(all.find(">s-mini</a>").unwrap() < all.find(">s-4o</a>").unwrap());
    let (_, _, mini) = get(&h, "/ui/?model=gpt-4o-mini", Some("sk-alice")).await;
    assert_eq!(listed(&mini), ["s-mini"]);
    assert!(
        mini.contains("<option value=\"gpt-4o-mini\" selected>"),
        "{mini}"
    );
    let (_, _, recent) = get(&h, "/ui/?since=1", Some("sk-alice")).await;
    assert_eq!(listed(&recent).len(), 2);
}

/// The page reads what every backend holds: the same session through a Redis store.
#[tokio::test]
async fn the_page_reads_a_redis_store() {
    let redis = tokio::task::spawn_blocking(common::redis::TestRedis::start)
        .await
        .unwrap();
    let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
    let mut h = Harness::start_with(MockConfig::default(), move |c| {
        setup(c);
        c.store.backend = context_proxy::store::Backend::Redis;
        c.store.redis_url = url;
        c.store.redis_key_prefix = prefix;
    })
    .await;
    h.client = no_client();
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-redis", &conversation()).await;
    let session = wait_turns(&h, "sk-alice", "s-redis", 1).await;
    assert!(session.contains("class=\"tag compacted\""), "{session}");
    let (_, _, list) = get(&h, "/ui/", Some("sk-alice")).await;
    assert!(list.contains(">s-redis</a>"), "{list}");
    let (_, _, other) = get(&h, "/ui/", Some("sk-bob")).await;
    assert!(!other.contains("s-redis"));
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();
    let (status, _, stored) = get(&h, &format!("/ui/ref?r={ref_a}"), Some("sk-alice")).await;
    assert_eq!(status, 200);
    assert!(stored.contains("a.rs line 7: let value_7"));
}

/// The journal writer gathers lines (here for a minute) and the page has it write what waits
/// before it reads: an answered request shows within `WAIT` (10 s), not a minute later.
#[tokio::test]
async fn opening_the_page_writes_the_lines_that_wait() {
    let mut h = Harness::start_with(MockConfig::default(), |c| {
        setup(c);
        c.ui.journal_flush_ms = 60_000;
    })
    .await;
    h.client = no_client();
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-wait", &conversation()).await;
    wait_turns(&h, "sk-alice", "s-wait", 1).await;
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-wait", &conversation()).await;
    wait_turns(&h, "sk-alice", "s-wait", 2).await;
}

/// A Responses API request is on the page as the chat route's are: its route named, its items
/// side by side (the instructions first, the tool call and its output), the marker where the
/// output was and its reference a link; the hostile output escaped. Its cost is in dollars.
#[tokio::test]
async fn a_responses_request_is_shown_item_by_item() {
    let h = started().await;
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();
    let body = json!({
        "model": "gpt-4o",
        "instructions": "You are a coding agent.",
        "store": false,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read the file."}]},
            {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{\"path\":\"a.rs\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": file_a()},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Read."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is on line 7?"}]}
        ]
    });
    h.mock.push(Reply::text("Line 7."));
    let resp = h
        .client
        .post(h.url("/v1/responses"))
        .header("authorization", "Bearer sk-alice")
        .header("x-context-session", "s-responses")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let actions = resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(actions.contains("compacted"), "{actions}");
    resp.bytes().await.unwrap();

    let session = wait_turns(&h, "sk-alice", "s-responses", 1).await;
    assert!(session.contains("class=\"tag compacted\""), "{session}");
    assert!(session.contains('$'), "cost in dollars: {session}");
    let index = session
        .split("/ui/request?")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (status, _, side) = get(&h, &format!("/ui/request?{index}"), Some("sk-alice")).await;
    assert_eq!(status, 200, "{side}");
    assert!(side.contains("/v1/responses"), "{side}");
    assert!(
        side.contains("You are a coding agent."),
        "the instructions: {side}"
    );
    assert!(side.contains("<code>read_file</code>"), "the call: {side}");
    assert!(
        side.contains("<code>call_a</code>"),
        "the output's call: {side}"
    );
    assert!(side.contains("<mark class=\"marker\">"), "{side}");
    assert!(side.contains(&format!("r={ref_a}\"")), "{side}");
    assert!(side.contains("&lt;script&gt;alert('xss')&lt;/script&gt;"));
    assert!(!side.contains("<script>alert"), "{side}");
}

/// The `/v1/context/` routes have the journal writer write what waits before they read or
/// erase: the request line shows in the session's journal (else it would wait a minute here),
/// and `DELETE` then erases it with the rest: the page has nothing of the session.
#[tokio::test]
async fn the_context_routes_see_and_erase_the_lines_that_wait() {
    let mut h = Harness::start_with(MockConfig::default(), |c| {
        setup(c);
        c.ui.journal_flush_ms = 60_000;
    })
    .await;
    h.client = no_client();
    h.mock.push(Reply::text("ok"));
    send_chat(&h, "sk-alice", "s-del", &conversation()).await;
    let path = "/v1/context/sessions/s-del?tenant=alice";
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, detail) = h.get_json(path, "admin-secret").await;
        if detail.to_string().contains("\"event\":\"request\"") {
            break;
        }
        assert!(Instant::now() < deadline, "no request line: {detail}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resp = h
        .client
        .delete(h.url(path))
        .header("authorization", "Bearer admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (status, _, body) = get(&h, "/ui/session?s=s-del", Some("sk-alice")).await;
    assert_eq!(status, 404, "{body}");
}

/// An Anthropic Messages request is on the page too: its route named, its blocks read as
/// messages (the system prompt first, the tool_use call, the tool_result with the marker
/// where its content was). A count of tokens is no turn: it leaves no line.
#[tokio::test]
async fn a_messages_request_is_shown_block_by_block() {
    let h = started().await;
    let ref_a = ContentRef::of(&file_a()).as_str().to_string();
    let body = messages_read_body(file_a());
    let post = |path: &'static str| {
        h.client
            .post(h.url(path))
            .header("x-api-key", "sk-alice")
            .header("anthropic-version", "2023-06-01")
            .header("x-context-session", "s-messages")
            .json(&body)
    };
    h.mock.push(Reply::text("Line 7."));
    let resp = post("/v1/messages").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let actions = resp.headers()["x-context-actions"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(actions.contains("compacted"), "{actions}");
    resp.bytes().await.unwrap();
    let session = wait_turns(&h, "sk-alice", "s-messages", 1).await;
    let resp = post("/v1/messages/count_tokens").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let index = session
        .split("/ui/request?")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    let (status, _, side) = get(&h, &format!("/ui/request?{index}"), Some("sk-alice")).await;
    assert_eq!(status, 200, "{side}");
    assert!(side.contains("/v1/messages"), "{side}");
    assert!(
        side.contains("You are a coding agent."),
        "the system prompt: {side}"
    );
    assert!(side.contains("<code>read_file</code>"), "the call: {side}");
    assert!(
        side.contains("<code>toolu_a</code>"),
        "the result's call: {side}"
    );
    assert!(side.contains("<mark class=\"marker\">"), "{side}");
    assert!(side.contains(&format!("r={ref_a}\"")), "{side}");
    assert!(!side.contains("<script>alert"), "{side}");
    // The count left no turn (the page writes what waits before it reads).
    let (_, _, again) = get(&h, "/ui/session?s=s-messages", Some("sk-alice")).await;
    assert!(again.contains("id=\"turn-1\"") && !again.contains("id=\"turn-2\""));
}

/// The row of `session` in a list page.
fn list_row<'a>(html: &'a str, session: &str) -> &'a str {
    let at = html
        .find(&format!(">{session}</a>"))
        .unwrap_or_else(|| panic!("{session} is not listed: {html}"));
    let end = at + html[at..].find("</tr>").unwrap();
    &html[at..end]
}

/// The text of the first element after `after` (up to the next tag).
fn text_after<'a>(html: &'a str, after: &str) -> &'a str {
    let at = html
        .find(after)
        .unwrap_or_else(|| panic!("no {after:?} in {html}"))
        + after.len();
    &html[at..at + html[at..].find('<').unwrap()]
}

/// Many sessions through the journal writer, all in one batch (it waits a minute; the page
/// has it write what waits): the list pages them, 50 a page, newest first, each with the
/// figures its own page sums from its journal (the list reads the summary the writer kept),
/// and every request's messages are kept (one store call for the batch), escaped when shown.
async fn many_sessions_are_listed_from_their_summaries(mut h: Harness) {
    h.client = no_client();
    const SESSIONS: usize = 60;
    for i in 0..SESSIONS {
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": format!("Task {i}: <b>read</b> the file.")}
        ]});
        // The first session sends its request twice: two turns, one kept body.
        for _ in 0..if i == 0 { 2 } else { 1 } {
            h.mock.push(Reply::text("ok"));
            send_chat(&h, "sk-alice", &format!("s-{i:03}"), &body).await;
        }
    }
    let started = Instant::now();
    let (status, _, first) = get(&h, "/ui/", Some("sk-alice")).await;
    eprintln!("the list of {SESSIONS} sessions: {:?}", started.elapsed());
    assert_eq!(status, 200);
    let rows = |html: &str| html.matches("<tr class=\"session\">").count();
    assert_eq!(rows(&first), 50, "{first}");
    assert!(first.contains(">s-059</a>") && !first.contains(">s-009</a>"));
    assert!(first.contains("offset=50"), "a link to the older sessions");
    let (_, _, second) = get(&h, "/ui/?offset=50", Some("sk-alice")).await;
    assert_eq!(rows(&second), 10, "{second}");
    assert!(second.contains(">s-000</a>") && !second.contains(">s-010</a>"));
    let (_, _, other) = get(&h, "/ui/", Some("sk-bob")).await;
    assert_eq!(rows(&other), 0, "another key sees no session of alice's");
    // The list's figures are those the session's page sums from its journal.
    let row = list_row(&second, "s-000");
    assert_eq!(text_after(row, "class=\"num turns\">"), "2");
    let session = wait_turns(&h, "sk-alice", "s-000", 2).await;
    assert_eq!(
        text_after(row, "class=\"num sent\">"),
        text_after(&session, "<dt>Tokens sent</dt><dd>")
    );
    let cost = format!(
        "{} / {}",
        text_after(row, "class=\"num cost-without\">"),
        text_after(row, "class=\"num cost-with\">")
    );
    assert_eq!(cost, text_after(&session, "id=\"fig-cost\">").trim_end());
    // Both turns' messages were kept, and shown as text.
    for turn in 1..=2 {
        let (status, _, request) = get(
            &h,
            &format!("/ui/request?s=s-000&i={}", turn_index(&session, turn)),
            Some("sk-alice"),
        )
        .await;
        assert_eq!(status, 200);
        assert!(
            request.contains("Task 0: &lt;b&gt;read&lt;/b&gt; the file."),
            "{request}"
        );
        assert!(!request.contains("not kept"), "{request}");
    }
}

/// The journal index of turn `turn` on a session page (its "side by side" link).
fn turn_index(session: &str, turn: usize) -> usize {
    let row = &session[session.find(&format!("id=\"turn-{turn}\"")).unwrap()..];
    let link = &row[row.find("&amp;i=").unwrap() + "&amp;i=".len()..];
    link[..link.find('"').unwrap()].parse().unwrap()
}

#[tokio::test]
async fn many_sessions_are_listed_from_their_summaries_in_memory() {
    let h = Harness::start_with(MockConfig::default(), |c| {
        setup(c);
        c.ui.journal_flush_ms = 60_000;
    })
    .await;
    many_sessions_are_listed_from_their_summaries(h).await;
}

#[tokio::test]
async fn many_sessions_are_listed_from_their_summaries_on_redis() {
    let redis = tokio::task::spawn_blocking(common::redis::TestRedis::start)
        .await
        .unwrap();
    let (url, prefix) = (redis.url.clone(), redis.prefix.clone());
    let h = Harness::start_with(MockConfig::default(), move |c| {
        setup(c);
        c.ui.journal_flush_ms = 60_000;
        c.store.backend = context_proxy::store::Backend::Redis;
        c.store.redis_url = url;
        c.store.redis_key_prefix = prefix;
    })
    .await;
    many_sessions_are_listed_from_their_summaries(h).await;
}

#[tokio::test]
async fn many_sessions_are_listed_from_their_summaries_on_fs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let h = Harness::start_with(MockConfig::default(), move |c| {
        setup(c);
        c.ui.journal_flush_ms = 60_000;
        c.store.backend = context_proxy::store::Backend::Fs;
        c.store.path = path;
        c.store.fsync = false;
    })
    .await;
    many_sessions_are_listed_from_their_summaries(h).await;
}

/// Turn `i` of a coding session: the user's step, a tool call, its result (~400 tokens), the
/// model's answer.
fn coding_turn(i: usize) -> Vec<Value> {
    let result: String = (0..25)
        .map(|l| format!("fn item_{i}_{l}() -> u32 {{ {l} }} // from src/f{i}.rs line {l}\n"))
        .collect();
    vec![
        json!({"role": "user", "content": format!("Continue with step {i}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}),
        json!({"role": "assistant", "content": format!("Step {i} done.")}),
    ]
}

/// The chart is the replay's report: a session replayed through the proxy (`replay`, as its
/// command runs it), compacted on the way, shows on the page, turn by turn, the tokens and
/// the cost without the proxy that the report computes per turn (one session: its per-turn
/// figures are the session's own), and with it, to the token: both count what each call sent
/// with the route's count and the prefix it shares with the previous call with one function,
/// `tokens::shared_prefix` over the calls' parts (the page's journal writer counts the body the
/// upstream received again, off the request path; the proxy's own figures, its kept prefix
/// with the reply priming and its tools counted apart, were off by 1% in tokens and 3% in
/// cost). The page reads the journal as its chart does (`Reader`).
#[tokio::test]
async fn the_chart_shows_the_replay_reports_numbers_per_turn() {
    std::env::set_var("CP_UI_TEST_UPSTREAM", "sk-upstream-own");
    let h = Harness::start_with(MockConfig::default(), |c| {
        c.upstreams[0].api_key_env = Some("CP_UI_TEST_UPSTREAM".into());
        c.keys = vec![key("replay", "sk-replay")];
        c.ui.enabled = true;
        c.upstreams[0].cache_pricing = Some("deepseek".into());
        c.context.mode = context_proxy::context::Mode::Compact;
        c.context.max_context_tokens = Some(2_500);
        c.context.keep_recent_messages = 2;
        c.context.compact_batch_tokens = 600;
        c.context.tool_result_max_tokens = 300;
    })
    .await;
    let tools = json!([{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Task: fix the parser in src/parse.rs."}),
    ];
    // As an agent sends it: the user's step, then the tool's result; each request the
    // previous one, the model's answer and what comes next.
    let mut traffic = Vec::new();
    for i in 0..5 {
        let turn = coding_turn(i);
        for sent in [1, 3] {
            let mut request = messages.clone();
            request.extend_from_slice(&turn[..sent]);
            traffic.push(
                json!({"session": "s", "model": "gpt-4o", "messages": request, "tools": tools}),
            );
        }
        messages.extend(turn);
    }
    let args = ["--provider", "deepseek", "--concurrency", "1"];
    let report = common::replay(&h, &traffic, &args).await;
    assert_eq!(report.status.get("200"), Some(&10), "{report:?}");
    let (without, with) = (
        &report.without_proxy.per_turn,
        &report.with_proxy.as_ref().unwrap().per_turn,
    );

    // The page's session, as its chart reads it (the context routes write what waits first).
    let (_, list) = h.get_json("/v1/context/sessions", "sk-replay").await;
    let id = list["data"][0]["id"].as_str().unwrap().to_string();
    let (_, detail) = h
        .get_json(
            &format!("/v1/context/sessions/{id}?limit=1000"),
            "sk-replay",
        )
        .await;
    let deepseek = context_proxy::pricing::PRESETS
        .iter()
        .find(|(name, _)| *name == "deepseek")
        .unwrap()
        .1;
    let pricing = move |_: &str, _: Option<&str>| deepseek;
    let mut page = context_proxy::sessions::view::Reader::default();
    for (i, record) in detail["journal"].as_array().unwrap().iter().enumerate() {
        page.read(i, record, &pricing);
    }
    let turns = &page.turns;
    assert_eq!(turns.len(), 10);
    assert!(
        turns
            .iter()
            .any(|t| t.line.tokens_after < t.line.tokens_before),
        "the proxy compacted nothing: {turns:#?}"
    );
    assert_eq!((without.len(), with.len()), (10, 10));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    for (i, turn) in turns.iter().enumerate() {
        let line = &turn.line;
        assert_eq!(
            line.tokens_before as f64,
            without[i].tokens,
            "turn {}",
            i + 1
        );
        assert!(
            close(turn.cost_without, without[i].cost),
            "turn {}: {} on the page, {} in the report",
            i + 1,
            turn.cost_without,
            without[i].cost
        );
        assert_eq!(turn.tokens_with as f64, with[i].tokens, "turn {}", i + 1);
        assert!(
            close(turn.cost_with, with[i].cost),
            "turn {}: {} on the page, {} in the report",
            i + 1,
            turn.cost_with,
            with[i].cost
        );
    }
}
