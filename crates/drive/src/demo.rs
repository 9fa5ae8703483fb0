//! What `context-proxy --demo` shows once it listens: one long scripted session of a coding
//! agent (reading large files, running commands) sent through the proxy request by request, as
//! the agent would, with what the proxy's response headers say about each request
//! (`x-context-tokens-before`, `x-context-tokens-after`, `x-context-actions`). Then where to
//! look next: the session through the inspection route and `context-proxy inspect`, and a
//! request of one's own.
//!
//! The session comes from the sample-traffic generator, so it is the same on every run. It is
//! sent under the session name [`SESSION`] with the key [`API_KEY`]: the proxy's tenant of
//! that key owns it, and the inspection route answers that key.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;

use context_proxy_contract::{
    ACTIONS_HEADER, SESSION_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER,
};
use context_proxy_corpus::{AgentKind, Session};
use context_proxy_traffic::TrafficConfig;

/// The session name the demo's requests carry (`x-context-session`).
pub const SESSION: &str = "demo";
/// The key the demo's requests carry; any key works against the demo's mock upstream.
pub const API_KEY: &str = "sk-demo";
/// Requests of the scripted session sent at most.
const MAX_TURNS: usize = 40;

/// What the proxy said about one request of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// 1-based.
    pub number: usize,
    pub status: u16,
    pub tokens_before: Option<u64>,
    pub tokens_after: Option<u64>,
    /// `x-context-actions`, as sent.
    pub actions: String,
}

/// Why the demo's session could not be shown (the proxy keeps serving).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("request {turn} of the demo session failed: {source}")]
    Http { turn: usize, source: reqwest::Error },
    #[error("request {turn} of the demo session got {status}: {body}")]
    Status {
        turn: usize,
        status: u16,
        body: String,
    },
    #[error("the sample traffic holds no coding session")]
    NoSession,
}

/// The scripted session: the longest coding-agent session of a small seeded sample, cut after
/// [`MAX_TURNS`] requests, answered in JSON. The same on every run.
pub fn session() -> Result<Session, DemoError> {
    let sessions = context_proxy_traffic::generate(&TrafficConfig {
        seed: 42,
        sessions: 12,
        max_turns: 150,
        max_result_bytes: 120_000,
        model: None,
    });
    let mut longest = sessions
        .into_iter()
        .filter(|s| s.kind == AgentKind::Coding)
        .max_by_key(Session::request_count)
        .ok_or(DemoError::NoSession)?;
    if longest.request_count() > MAX_TURNS {
        longest.request_ends.truncate(MAX_TURNS);
        // Up to the reply to the last request kept.
        let end = longest.request_ends[MAX_TURNS - 1] + 1;
        longest.messages.truncate(end);
    }
    longest.stream = false;
    Ok(longest)
}

/// Sends `session`'s requests to the proxy at `proxy` in order, each after the previous answer;
/// what the proxy said about each.
pub async fn drive(
    client: &reqwest::Client,
    proxy: SocketAddr,
    session: &Session,
) -> Result<Vec<Turn>, DemoError> {
    let url = format!("http://{proxy}/v1/chat/completions");
    let mut turns = Vec::with_capacity(session.request_count());
    for k in 0..session.request_count() {
        let turn = k + 1;
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {API_KEY}"))
            .header(SESSION_HEADER, SESSION)
            .body(session.request_body(k))
            .send()
            .await
            .map_err(|source| DemoError::Http { turn, source })?;
        let status = resp.status().as_u16();
        let header = |name: &str| -> Option<String> {
            Some(resp.headers().get(name)?.to_str().ok()?.to_string())
        };
        let number = |name: &str| header(name).and_then(|v| v.parse().ok());
        let t = Turn {
            number: turn,
            status,
            tokens_before: number(TOKENS_BEFORE_HEADER),
            tokens_after: number(TOKENS_AFTER_HEADER),
            actions: header(ACTIONS_HEADER).unwrap_or_else(|| "-".into()),
        };
        let body = resp
            .bytes()
            .await
            .map_err(|source| DemoError::Http { turn, source })?;
        if !(200..300).contains(&status) {
            return Err(DemoError::Status {
                turn,
                status,
                body: String::from_utf8_lossy(&body).chars().take(300).collect(),
            });
        }
        turns.push(t);
    }
    Ok(turns)
}

/// The lines above the table.
pub fn intro(session: &Session) -> String {
    format!(
        "\ndemo: a coding agent's session of {} requests (reading files, running commands), sent \
         through the proxy\nto the built-in mock upstream as session \"{SESSION}\"; per request, \
         the proxy's response headers:\n\n{:>4}  {:>23}  {:>22}  {}",
        session.request_count(),
        "turn",
        TOKENS_BEFORE_HEADER,
        TOKENS_AFTER_HEADER,
        ACTIONS_HEADER,
    )
}

/// One line of the table.
pub fn line(turn: &Turn) -> String {
    let tokens = |n: Option<u64>| n.map_or_else(|| "-".to_string(), thousands);
    let status = if turn.status == 200 {
        String::new()
    } else {
        format!("  (status {})", turn.status)
    };
    format!(
        "{:>4}  {:>23}  {:>22}  {}{status}",
        turn.number,
        tokens(turn.tokens_before),
        tokens(turn.tokens_after),
        turn.actions
    )
}

/// The lines below the table: the totals and where to look next. `inspect` is the command
/// that prints the session from the store, when the store outlives the process.
pub fn outro(turns: &[Turn], proxy: SocketAddr, inspect: Option<&str>) -> String {
    let sum = |f: fn(&Turn) -> Option<u64>| turns.iter().filter_map(f).sum::<u64>();
    let (before, after) = (sum(|t| t.tokens_before), sum(|t| t.tokens_after));
    let rewritten = turns
        .iter()
        .filter(|t| t.tokens_after < t.tokens_before)
        .count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} of {} requests rewritten; prompt tokens sent upstream: {} instead of {} ({:.0}% fewer).",
        rewritten,
        turns.len(),
        thousands(after),
        thousands(before),
        if before == 0 {
            0.0
        } else {
            100.0 * (before - after.min(before)) as f64 / before as f64
        }
    );
    let _ = writeln!(
        out,
        "Nothing is lost: what was cut or moved out is in the store, and the model reads it back \
         with the proxy's context_read tool."
    );
    let _ = writeln!(out, "\nSee what the proxy did with the session:");
    let _ = writeln!(
        out,
        "  curl -s http://{proxy}/v1/context/sessions/{SESSION} -H 'authorization: Bearer {API_KEY}'"
    );
    if let Some(inspect) = inspect {
        let _ = writeln!(out, "  {inspect}");
    }
    let _ = writeln!(
        out,
        "  or open http://{proxy}/ui/ in a browser, logged in with {API_KEY} (the page is on with \
         CONTEXT_PROXY_UI__ENABLED=true or [ui] enabled = true)"
    );
    let _ = writeln!(
        out,
        "\nThe proxy keeps serving. Send your own requests (any API key works against the demo):"
    );
    let _ = writeln!(
        out,
        "  curl -s http://{proxy}/v1/chat/completions -H 'content-type: application/json' \\\n    \
         -d '{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'"
    );
    let _ = writeln!(
        out,
        "  or point an OpenAI SDK at it: OPENAI_BASE_URL=http://{proxy}/v1 OPENAI_API_KEY=sk-anything"
    );
    let _ = write!(out, "Ctrl-C stops it.");
    out
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Sends the scripted session through the proxy at `proxy`, then shows it on stdout in one
/// block (so the proxy's log lines on stderr do not interleave with it): the intro, a line per
/// request, the totals and where to look next.
pub async fn run(proxy: SocketAddr, inspect: Option<&str>) -> Result<(), DemoError> {
    let session = session()?;
    let client = reqwest::Client::new();
    let turns = drive(&client, proxy, &session).await?;
    let shown = show(&session, &turns, proxy, inspect);
    let mut stdout = std::io::stdout().lock();
    // Nobody reading stdout any more is no reason to stop serving.
    let _ = writeln!(stdout, "{shown}").and_then(|()| stdout.flush());
    Ok(())
}

/// The whole block [`run`] prints.
pub fn show(session: &Session, turns: &[Turn], proxy: SocketAddr, inspect: Option<&str>) -> String {
    let mut out = intro(session);
    for t in turns {
        out.push('\n');
        out.push_str(&line(t));
    }
    out.push('\n');
    out.push_str(&outro(turns, proxy, inspect));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_long_and_the_same_on_every_run() {
        let s = session().unwrap();
        assert_eq!(s, session().unwrap());
        assert_eq!(s.kind, AgentKind::Coding);
        assert!(s.request_count() >= 20, "{}", s.request_count());
        assert!(s.request_count() <= MAX_TURNS);
        assert!(!s.stream);
        s.validate().unwrap();
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
