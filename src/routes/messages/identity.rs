//! Whose conversation a Messages request is: the session the client names — the proxy's
//! `x-context-session`, else Claude Code's `x-claude-code-session-id`, else the `session_id`
//! Claude Code puts in `metadata.user_id` (a JSON string), else `metadata.user_id` itself — or,
//! when it names none, one derived from the conversation's opening (its `system` and first user
//! message) without Claude Code's attribution line (`x-anthropic-billing-header: …`), which
//! changes from one conversation and one version to the next but says nothing about which
//! conversation this is.

use http::HeaderMap;
use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use crate::context::adapter::messages::{block_type, blocks};
use crate::tokens::{field, stable_hash, str_field};

/// Claude Code's session header.
pub const CLAUDE_CODE_SESSION_HEADER: &str = "x-claude-code-session-id";
/// The start of Claude Code's attribution line in `system`.
pub const ATTRIBUTION_PREFIX: &str = "x-anthropic-billing-header:";

/// The session a request names, or one derived from its opening.
pub fn session_hint(headers: &HeaderMap, body: &Value) -> Option<String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    header(crate::context::session::SESSION_HEADER)
        .or_else(|| header(CLAUDE_CODE_SESSION_HEADER))
        .or_else(|| metadata_session(body))
        .or_else(|| opening(body))
}

/// The session named in `metadata.user_id`: Claude Code's JSON string's `session_id`, else the
/// whole value.
fn metadata_session(body: &Value) -> Option<String> {
    let user_id = str_field(field(body, "metadata")?, "user_id")?;
    if user_id.is_empty() {
        return None;
    }
    let inner = serde_json::from_str::<Value>(user_id).ok();
    match inner.as_ref().and_then(|v| str_field(v, "session_id")) {
        Some(session) if !session.is_empty() => Some(session.to_string()),
        _ => Some(user_id.to_string()),
    }
}

/// A name for the conversation from its `system` (without the attribution line) and first user
/// message; `None` when it has no user message.
fn opening(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let first_user = messages
        .iter()
        .find(|m| str_field(m, "role") == Some("user"))?;
    let mut hasher = Xxh3::new();
    for block in blocks(body.get("system")).iter() {
        let attribution = block_type(block) == "text"
            && str_field(block, "text").is_some_and(|t| t.starts_with(ATTRIBUTION_PREFIX));
        if !attribution {
            hasher.update(&stable_hash(block).to_le_bytes());
        }
    }
    hasher.update(b"\0user\0");
    for block in blocks(field(first_user, "content")).iter() {
        hasher.update(&stable_hash(block).to_le_bytes());
    }
    Some(format!("messages-{:032x}", hasher.digest128()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    fn body(billing: &str) -> Value {
        json!({
            "system": [{"type": "text", "text": format!("x-anthropic-billing-header: cc_version={billing}; cc_entrypoint=cli; cch=00000;")},
                       {"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": "fix the bug"}],
        })
    }

    #[test]
    fn the_attribution_line_does_not_change_the_session() {
        let none = HeaderMap::new();
        let a = session_hint(&none, &body("2.1.3.abc")).unwrap();
        let b = session_hint(&none, &body("2.1.4.def")).unwrap();
        assert_eq!(a, b);
        let mut other = body("2.1.3.abc");
        other["messages"][0]["content"] = json!("another task");
        assert_ne!(session_hint(&none, &other).unwrap(), a);
        let mut system = body("2.1.3.abc");
        system["system"][1]["text"] = json!("You are someone else.");
        assert_ne!(session_hint(&none, &system).unwrap(), a);
    }

    #[test]
    fn named_sessions_come_first() {
        let mut b = body("1");
        b["metadata"] = json!({"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s-meta\"}"});
        assert_eq!(
            session_hint(&HeaderMap::new(), &b).as_deref(),
            Some("s-meta")
        );
        let mut h = HeaderMap::new();
        h.insert(CLAUDE_CODE_SESSION_HEADER, HeaderValue::from_static("s-cc"));
        assert_eq!(session_hint(&h, &b).as_deref(), Some("s-cc"));
        h.insert("x-context-session", HeaderValue::from_static("s-mine"));
        assert_eq!(session_hint(&h, &b).as_deref(), Some("s-mine"));
        b["metadata"] = json!({"user_id": "plain-user"});
        assert_eq!(
            session_hint(&HeaderMap::new(), &b).as_deref(),
            Some("plain-user")
        );
    }
}
