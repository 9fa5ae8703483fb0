//! What the proxy adds to an Anthropic Messages request, written into its bytes so that
//! everything else keeps the bytes the client sent: the upstream transcript of its hidden tool
//! rounds put back in place of the client's merged assistant message
//! ([`crate::proxy_tools::hidden_rounds`]), and its tool definitions after the client's.

use serde_json::Value;

use super::messages::Messages;
use super::{scan, splice, Adapter, Piece};
use crate::proxy_tools::hidden_rounds::{opened_with, Restoration};

/// `raw` (whose parsed messages are `messages`) with each restoration written in: the client's
/// message replaced by the upstream's messages, the next one opened by the proxy's results when
/// there are some. `None` when the messages cannot be found in the bytes.
pub fn restored(raw: &[u8], messages: &[Value], restorations: &[Restoration]) -> Option<Vec<u8>> {
    let spans = Messages.spans(raw)?;
    if spans.items.len() != messages.len() {
        return None;
    }
    let opened: Vec<Option<Value>> = restorations
        .iter()
        .map(|r| {
            (!r.results.is_empty())
                .then(|| messages.get(r.at + 1).map(|m| opened_with(m, &r.results)))
                .flatten()
        })
        .collect();
    let mut pieces = Vec::with_capacity(messages.len() + 4 * restorations.len());
    let mut i = 0;
    let mut next = restorations.iter().zip(&opened).peekable();
    while i < messages.len() {
        match next.next_if(|(r, _)| r.at == i) {
            Some((r, opened)) => {
                pieces.extend(r.messages.iter().map(Piece::New));
                if let Some(opened) = opened {
                    pieces.push(Piece::New(opened));
                    i += 1;
                }
            }
            None => pieces.push(Piece::Kept(i)),
        }
        i += 1;
    }
    Some(splice(raw, &spans, &pieces))
}

/// `raw` with `definitions` appended to its `tools` (a `tools` member added at the end when it
/// has none). `None` when the body is not a JSON object or its `tools` not an array.
pub fn with_tools(raw: &[u8], definitions: &[Value]) -> Option<Vec<u8>> {
    let joined = definitions
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut out = Vec::with_capacity(raw.len() + joined.len() + 16);
    match scan::member(raw, b"tools") {
        Some(list) => {
            if raw.get(list.start) != Some(&b'[') {
                return None;
            }
            let empty = scan::elements(raw, list.clone())?.is_empty();
            let close = list.end - 1;
            out.extend_from_slice(&raw[..close]);
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(joined.as_bytes());
            out.extend_from_slice(&raw[close..]);
        }
        None => {
            let close = raw.iter().rposition(|b| !b.is_ascii_whitespace())?;
            if raw[close] != b'}' {
                return None;
            }
            let before = raw[..close]
                .iter()
                .rposition(|b| !b.is_ascii_whitespace())?;
            out.extend_from_slice(&raw[..close]);
            if raw[before] != b'{' {
                out.push(b',');
            }
            out.extend_from_slice(b"\"tools\":[");
            out.extend_from_slice(joined.as_bytes());
            out.push(b']');
            out.extend_from_slice(&raw[close..]);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_are_appended_and_everything_else_keeps_its_bytes() {
        let defs = [
            json!({"name": "context_read"}),
            json!({"name": "context_search"}),
        ];
        let raw = br#"{"model": "m",  "tools": [ {"name":"Bash"} ], "messages": []}"#;
        let out = with_tools(raw, &defs).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model": "m",  "tools": [ {"name":"Bash"} ,{"name":"context_read"},{"name":"context_search"}], "messages": []}"#
        );
        let none = br#"{"model": "m", "messages": [] }"#;
        let out = with_tools(none, &defs).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["tools"].as_array().unwrap().len(), 2);
        assert!(out.starts_with(br#"{"model": "m", "messages": [] ,"tools":["#));
        let empty = br#"{"tools":[]}"#;
        let v: Value = serde_json::from_slice(&with_tools(empty, &defs).unwrap()).unwrap();
        assert_eq!(v["tools"].as_array().unwrap().len(), 2);
        assert_eq!(with_tools(b"[1]", &defs), None);
    }

    #[test]
    fn a_restored_message_is_the_upstreams_and_the_rest_keeps_its_bytes() {
        let raw = br#"{"messages": [ {"role":"user", "content":"q"},
            {"role":"assistant","content":[{"type":"text","text":"shown"}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"ok"}]} ]}"#;
        let body: Value = serde_json::from_slice(raw).unwrap();
        let messages = body["messages"].as_array().unwrap().clone();
        let upstream = vec![
            json!({"role":"assistant","content":[{"type":"tool_use","id":"p","name":"context_read","input":{}}]}),
            json!({"role":"user","content":[{"type":"tool_result","tool_use_id":"p","content":"x"}]}),
            json!({"role":"assistant","content":[{"type":"text","text":"shown"},
                {"type":"tool_use","id":"p2","name":"context_read","input":{}},
                {"type":"tool_use","id":"c","name":"Bash","input":{}}]}),
        ];
        let r = Restoration {
            at: 1,
            messages: upstream.clone(),
            results: vec![json!({"type":"tool_result","tool_use_id":"p2","content":"y"})],
        };
        let out = restored(raw, &messages, &[r]).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with(r#"{"messages": [ {"role":"user", "content":"q"},"#));
        let expected_middle = format!("{},{},{}", upstream[0], upstream[1], upstream[2]);
        assert!(text.contains(&expected_middle), "{text}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        let last = &v["messages"][4]["content"];
        assert_eq!(last[0]["tool_use_id"], "p2");
        assert_eq!(last[1]["tool_use_id"], "c");
    }
}
