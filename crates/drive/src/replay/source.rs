//! The traffic a replay sends, read from one of three sources and cut into sessions:
//!
//! - a recording (`context-proxy --record DIR`): each exchange's request as received, grouped
//!   by session, with the time it arrived;
//! - a corpus directory (`context-proxy gen-traffic --out DIR`): every request of every session;
//! - a JSONL file of request bodies, one per line, each with a `session` field (removed before
//!   sending; lines without one are sessions of their own).

use std::collections::HashMap;
use std::io::{self, BufRead};
use std::path::Path;

use bytes::Bytes;
use serde_json::Value;

use context_proxy_corpus::{recording, Wire};

/// The API a request speaks, and so the path it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// `…/chat/completions`.
    #[default]
    Chat,
    /// Anthropic's `…/messages`.
    Messages,
    /// Anthropic's `…/messages/count_tokens`.
    CountTokens,
    /// The Responses API's `…/responses` (`input` items).
    Responses,
}

impl Api {
    /// The API of a recorded exchange's route (`messages`, `count_tokens`; absent: chat).
    pub fn of_route(route: Option<&str>) -> Api {
        match route {
            Some("messages") => Api::Messages,
            Some("count_tokens") => Api::CountTokens,
            Some("responses") => Api::Responses,
            _ => Api::Chat,
        }
    }

    /// Whether the request speaks Anthropic's API.
    pub fn is_anthropic(self) -> bool {
        matches!(self, Api::Messages | Api::CountTokens)
    }
}

/// One request of a session.
#[derive(Debug, Clone)]
pub struct Request {
    pub body: Bytes,
    /// When it was sent, in ms after the session's first request (recordings only).
    pub offset_ms: Option<u64>,
    pub stream: bool,
    pub api: Api,
}

/// Requests that must go in order, each after the previous one's answer.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub requests: Vec<Request>,
}

impl Session {
    /// The model its first request names.
    pub fn model(&self) -> Option<String> {
        let first = self.requests.first()?;
        let body: Value = serde_json::from_slice(&first.body).ok()?;
        Some(body.get("model")?.as_str()?.to_string())
    }
}

fn request(body: &Value, offset_ms: Option<u64>, api: Api) -> Request {
    Request {
        body: Bytes::from(body.to_string()),
        offset_ms,
        stream: body.get("stream") == Some(&Value::Bool(true)),
        // A chat-looking line or exchange with `input` items and no `messages` is a Responses
        // request.
        api: match api {
            Api::Chat if body.get("messages").is_none() && body.get("input").is_some() => {
                Api::Responses
            }
            api => api,
        },
    }
}

/// Reads the sessions at `path` (see the module docs for what it may be): a regular file or
/// a directory, never a FIFO or a device (read without end).
pub fn load(path: &Path) -> io::Result<Vec<Session>> {
    let kind = std::fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if !kind.is_file() && !kind.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: neither a regular file nor a directory (a FIFO or a device is not read)",
                path.display()
            ),
        ));
    }
    if recording::is_recording(path) {
        return Ok(from_recording(&recording::read(path)?.exchanges));
    }
    if path.is_dir() && path.join("index.json").is_file() {
        let sessions = context_proxy_corpus::load_dir(path)?;
        return Ok(sessions
            .iter()
            .map(|s| Session {
                id: s.id.clone(),
                requests: (0..s.request_count())
                    .map(|k| Request {
                        body: Bytes::from(s.request_body(k)),
                        offset_ms: None,
                        stream: s.stream,
                        api: match s.wire {
                            Wire::Chat => Api::Chat,
                            Wire::Responses => Api::Responses,
                            Wire::Messages => Api::Messages,
                        },
                    })
                    .collect(),
            })
            .collect());
    }
    if path.is_file() {
        return from_jsonl(io::BufReader::new(std::fs::File::open(path)?));
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{}: neither a recording, a corpus directory (index.json) nor a JSONL file",
            path.display()
        ),
    ))
}

/// Sessions of recorded exchanges, in order of arrival.
pub fn from_recording(exchanges: &[recording::Exchange]) -> Vec<Session> {
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, (u64, Vec<Request>)> = HashMap::new();
    let mut sorted: Vec<&recording::Exchange> = exchanges.iter().collect();
    sorted.sort_by_key(|x| x.at_ms);
    for x in sorted {
        if x.request.is_null() {
            continue;
        }
        let id = x.session.clone().unwrap_or_else(|| x.request_id.clone());
        let entry = by_id.entry(id.clone()).or_insert_with(|| {
            order.push(id);
            (x.at_ms, Vec::new())
        });
        let offset = x.at_ms.saturating_sub(entry.0);
        entry.1.push(request(
            &x.request,
            Some(offset),
            Api::of_route(x.route.as_deref()),
        ));
    }
    order
        .into_iter()
        .filter_map(|id| {
            let (_, requests) = by_id.remove(&id)?;
            Some(Session { id, requests })
        })
        .collect()
}

fn from_jsonl(reader: impl BufRead) -> io::Result<Vec<Session>> {
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, Vec<Request>> = HashMap::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let mut body: Value = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("line {}: {e}", n + 1))
        })?;
        let session = body
            .as_object_mut()
            .and_then(|o| o.remove("session"))
            .and_then(|s| s.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("line-{}", n + 1));
        by_id
            .entry(session.clone())
            .or_insert_with(|| {
                order.push(session);
                Vec::new()
            })
            .push(request(&body, None, Api::Chat));
    }
    Ok(order
        .into_iter()
        .filter_map(|id| {
            let requests = by_id.remove(&id)?;
            Some(Session { id, requests })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_groups_by_session_in_order() {
        let text = r#"{"session":"a","model":"m","messages":[{"role":"user","content":"1"}]}
{"session":"b","model":"m","stream":true,"messages":[]}

{"session":"a","model":"m","messages":[{"role":"user","content":"2"}]}
{"model":"m","messages":[]}
"#;
        let sessions = from_jsonl(io::Cursor::new(text)).unwrap();
        let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "line-5"]);
        assert_eq!(sessions[0].requests.len(), 2);
        assert!(sessions[1].requests[0].stream);
        let second: Value = serde_json::from_slice(&sessions[0].requests[1].body).unwrap();
        assert_eq!(second["messages"][0]["content"], "2");
        assert!(second.get("session").is_none());
    }
}
