//! Reader mode (`MockConfig::reader`): the mock plays a model that answers a recall question
//! only from what its request shows, or from what it fetches with the proxy's tools.
//!
//! The question is a user message `Recall the needles: KEY, KEY, …`; a needle is a line
//! `NEEDLE KEY=VALUE` somewhere in the conversation. For the question itself (the last
//! message), keys not visible are searched with `context_search` when that tool is offered
//! and a `ctx_…` reference is present; on the next request (after the tool results) the mock
//! answers `KEY=VALUE` per line, `KEY=?` for a needle it cannot see. A request whose system
//! prompt asks for `## ` sections (the proxy's summarizer's) gets a summary with those headings.
//!
//! On the Responses API ([`reply_responses`]) the reader reads instead: while a needle is not
//! visible and `context_read` is offered, it reads every stored reference the input names,
//! page after page as the proxy's answers say (`Next: context_read {…}`), several references
//! at once, and answers once it sees every needle or has read everything.

use serde_json::{json, Value};

use crate::script::{Completion, Reply, ToolCall};

/// The start of a recall question.
pub const QUESTION: &str = "Recall the needles:";

/// A needle's line as planted in a conversation.
pub fn needle_line(key: &str, value: &str) -> String {
    format!("NEEDLE {key}={value}")
}

fn texts(message: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    match message.get("content") {
        Some(Value::String(s)) => out.push(s.as_str()),
        Some(Value::Array(parts)) => out.extend(parts.iter().filter_map(|p| p["text"].as_str())),
        _ => {}
    }
    out
}

/// The value of needle `key` in `text`, if shown.
fn find(text: &str, key: &str) -> Option<String> {
    let marker = format!("NEEDLE {key}=");
    text.match_indices(&marker).find_map(|(at, _)| {
        let value: String = text[at + marker.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '\\' | ','))
            .collect();
        (!value.is_empty()).then_some(value)
    })
}

/// The reader's reply to `body`, or `None` when it holds no recall question nor asks for a
/// structured summary.
pub fn reply(body: &Value) -> Option<Reply> {
    let messages = body.get("messages")?.as_array()?;
    if let Some(summary) = summary(messages) {
        return Some(Reply::text(summary));
    }
    let (at, question) = messages.iter().enumerate().rev().find_map(|(i, m)| {
        let text = (m["role"] == "user").then(|| texts(m).concat())?;
        Some((i, text.strip_prefix(QUESTION)?.to_string()))
    })?;
    let keys: Vec<&str> = question
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    let seen: String = messages
        .iter()
        .flat_map(texts)
        .collect::<Vec<_>>()
        .join("\n");
    let found: Vec<(&str, Option<String>)> = keys.iter().map(|k| (*k, find(&seen, k))).collect();
    let offered = body["tools"].as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t["function"]["name"] == "context_search")
    });
    let missing: Vec<&str> = found
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| *k)
        .collect();
    if at + 1 == messages.len() && !missing.is_empty() && offered && seen.contains("ctx_") {
        return Some(Reply::Completion(Completion {
            content: None,
            tool_calls: missing
                .iter()
                .map(|k| ToolCall {
                    id: None,
                    name: "context_search".into(),
                    arguments: json!({ "pattern": format!("NEEDLE {k}=") }),
                })
                .collect(),
            content_chunks: None,
            thinking: None,
        }));
    }
    Some(answer(&found))
}

/// The answer to a recall question: `KEY=VALUE` per line, `KEY=?` when not found.
fn answer(found: &[(&str, Option<String>)]) -> Reply {
    let text = found
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("?")))
        .collect::<Vec<_>>()
        .join("\n");
    Reply::text(text)
}

/// The texts of a Responses input item: a message's content, a tool output's.
fn item_texts(item: &Value) -> Vec<&str> {
    let kind = item["type"].as_str().unwrap_or("message");
    let field = if kind == "message" {
        "content"
    } else if kind.ends_with("_output") {
        "output"
    } else {
        return Vec::new();
    };
    match item.get(field) {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => Vec::new(),
    }
}

/// The stored references `text` names (`ctx_…`), in order of first mention.
fn references(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (at, _) in text.match_indices("ctx_") {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.len() > 4 && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Where reading `reference` stands after the proxy's `context_read` answers in `outputs`:
/// `None` when it has been read to its end (or cannot be read), else the next call's
/// arguments.
fn next_read(reference: &str, outputs: &[&str]) -> Option<Value> {
    let head = format!("[context_read {reference}: ");
    let Some(last) = outputs.iter().rev().find(|o| o.starts_with(&head)) else {
        let refused = outputs.iter().any(|o| o.contains(reference));
        return (!refused).then(|| json!({"ref": reference, "offset": 1, "limit": 100_000}));
    };
    let first_line = last.lines().next().unwrap_or("");
    let (_, next) = first_line.split_once("Next: context_read ")?;
    let args = &next[..next.find('}')? + 1];
    serde_json::from_str(args).ok()
}

/// The reader's reply to a Responses `body`, or `None` when it holds no recall question.
pub fn reply_responses(body: &Value) -> Option<Reply> {
    let items = body.get("input")?.as_array()?;
    let (at, question) = items.iter().enumerate().rev().find_map(|(i, item)| {
        let user =
            item["role"] == "user" && item["type"].as_str().unwrap_or("message") == "message";
        let text = user.then(|| item_texts(item).concat())?;
        Some((i, text.strip_prefix(QUESTION)?.to_string()))
    })?;
    let keys: Vec<&str> = question
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    let seen = items
        .iter()
        .flat_map(item_texts)
        .collect::<Vec<_>>()
        .join("\n");
    let found: Vec<(&str, Option<String>)> = keys.iter().map(|k| (*k, find(&seen, k))).collect();
    let offered = body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["name"] == "context_read"));
    if !offered || found.iter().all(|(_, v)| v.is_some()) {
        return Some(answer(&found));
    }
    // What the proxy answered the reader's reads so far (its `context_read` calls after the
    // question; the client's own tool outputs may come after the question too).
    let reads: Vec<&str> = items[at + 1..]
        .iter()
        .filter(|i| i["type"] == "function_call" && i["name"] == "context_read")
        .filter_map(|i| i["call_id"].as_str())
        .collect();
    let outputs: Vec<&str> = items[at + 1..]
        .iter()
        .filter(|i| {
            i["type"] == "function_call_output"
                && i["call_id"].as_str().is_some_and(|id| reads.contains(&id))
        })
        .flat_map(item_texts)
        .collect();
    let reads: Vec<ToolCall> = references(&seen)
        .iter()
        .filter_map(|r| next_read(r, &outputs))
        .map(|arguments| ToolCall {
            id: None,
            name: "context_read".into(),
            arguments,
        })
        .collect();
    if reads.is_empty() {
        return Some(answer(&found));
    }
    Some(Reply::Completion(Completion {
        content: None,
        tool_calls: reads,
        content_chunks: None,
        thinking: None,
    }))
}

/// A system prompt that asks for sections, each a `## Heading` line of its own (the proxy's
/// summarizer does): a summary with every heading and one line under it, saying how many
/// messages it read and nothing of what they said (so a needle it read is not shown again:
/// it is found by searching the stored originals).
fn summary(messages: &[Value]) -> Option<String> {
    let first = messages.first().filter(|m| m["role"] == "system")?;
    let headings: Vec<&str> = texts(first)
        .into_iter()
        .flat_map(str::lines)
        .filter(|l| l.starts_with("## "))
        .collect();
    if headings.is_empty() {
        return None;
    }
    let read = messages.len() - 1;
    Some(
        headings
            .iter()
            .map(|h| {
                format!(
                    "{h}
The mock read {read} messages here.
"
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_responses_it_reads_every_reference_page_by_page() {
        let question = json!({"role": "user", "content": "Recall the needles: a"});
        let marker = json!({"type": "function_call_output", "call_id": "call_1",
            "output": "[context-proxy: tool result compacted: 900 tokens, 40 lines, stored as ctx_abc2.]\nfirst"});
        let read = json!([{"type": "function", "name": "context_read"}]);
        // The marker may come after the question too (the client's own tool round).
        let body = json!({"input": [question, marker], "tools": read});
        let c = content(reply_responses(&body).unwrap());
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "context_read");
        assert_eq!(c.tool_calls[0].arguments["ref"], "ctx_abc2");
        assert_eq!(c.tool_calls[0].arguments["offset"], 1);
        // A first page without the needle: the next one, as the proxy says.
        let mut after = body.clone();
        after["input"].as_array_mut().unwrap().extend([
            json!({"type": "function_call", "call_id": "r1", "name": "context_read", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "r1",
                "output": "[context_read ctx_abc2: lines 1–20 of 40. Next: context_read {\"ref\":\"ctx_abc2\",\"offset\":21,\"limit\":100000}]\nx\n"}),
        ]);
        let c = content(reply_responses(&after).unwrap());
        assert_eq!(c.tool_calls[0].arguments["offset"], 21);
        // The page with the needle: answered.
        after["input"].as_array_mut().unwrap().extend([
            json!({"type": "function_call", "call_id": "r2", "name": "context_read", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "r2",
                "output": format!("[context_read ctx_abc2: lines 21–40 of 40. End of content]\n{}\n", needle_line("a", "42"))}),
        ]);
        let c = content(reply_responses(&after).unwrap());
        assert_eq!(c.content.as_deref(), Some("a=42"));
        // Read to the end without it, or nothing offered: what it can see.
        let ended = after["input"].as_array().unwrap()[..5].to_vec();
        let mut ended = json!({"input": ended, "tools": read});
        ended["input"].as_array_mut().unwrap().push(json!({"type": "function_call_output",
            "call_id": "r2", "output": "[context_read ctx_abc2: lines 21–40 of 40. End of content]\n"}));
        let c = content(reply_responses(&ended).unwrap());
        assert_eq!(c.content.as_deref(), Some("a=?"));
        let c = content(reply_responses(&json!({"input": body["input"]})).unwrap());
        assert_eq!(c.content.as_deref(), Some("a=?"));
        assert!(reply_responses(&json!({"input": "hi"})).is_none());
    }

    fn content(reply: Reply) -> Completion {
        match reply {
            Reply::Completion(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn answers_what_it_sees_and_searches_for_the_rest() {
        let question = json!({"role": "user", "content": "Recall the needles: a, b"});
        let tool = json!({"role": "tool", "tool_call_id": "call_1",
            "content": format!("x\n{}\n[ctx_abc: 40 lines moved]", needle_line("a", "42"))});
        let search = json!([{"type": "function", "function": {"name": "context_search"}}]);
        let body = json!({"messages": [tool, question], "tools": search});
        let c = content(reply(&body).unwrap());
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].arguments["pattern"], "NEEDLE b=");
        let mut after = body.clone();
        after["messages"].as_array_mut().unwrap().extend([
            json!({"role": "assistant", "content": null}),
            json!({"role": "tool", "tool_call_id": "call_2", "content": "ctx_abc:7: NEEDLE b=/srv/x.toml"}),
        ]);
        let c = content(reply(&after).unwrap());
        assert_eq!(c.content.as_deref(), Some("a=42\nb=/srv/x.toml"));
        let no_tools = json!({"messages": body["messages"]});
        let c = content(reply(&no_tools).unwrap());
        assert_eq!(c.content.as_deref(), Some("a=42\nb=?"));
        assert!(reply(&json!({"messages": [{"role": "user", "content": "hi"}]})).is_none());
    }

    #[test]
    fn a_request_for_sections_gets_each_heading_and_no_needle() {
        let system = json!({"role": "system", "content": "Write these sections:\n\n## Task overview\nWhat.\n\n## Next steps\nThen."});
        let span = json!({"role": "user", "content": needle_line("a", "42")});
        let c = content(reply(&json!({"messages": [system, span]})).unwrap());
        let text = c.content.unwrap();
        assert_eq!(
            text,
            "## Task overview\nThe mock read 1 messages here.\n\n## Next steps\nThe mock read 1 messages here.\n"
        );
        assert!(!text.contains("NEEDLE"));
    }
}
