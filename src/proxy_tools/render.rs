//! A span of moved-out messages (stored one JSON message per line) as text a model reads: each
//! message under a header line with its number, role, and tool name or calls.

use serde_json::Value;

/// The messages of `stored` rendered one after another, or `None` when `stored` is not a span
/// of messages (then it is read as it is).
pub fn messages(stored: &str) -> Option<String> {
    let mut out = String::with_capacity(stored.len());
    let mut names: Vec<(String, String)> = Vec::new();
    let mut count = 0;
    for line in stored.lines() {
        let message: Value = serde_json::from_str(line).ok()?;
        let role = message.get("role")?.as_str()?;
        count += 1;
        let mut header = format!("--- message {count}: {role}");
        if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
            let listed: Vec<String> = calls
                .iter()
                .map(|c| {
                    let id = c.get("id").and_then(Value::as_str).unwrap_or("");
                    let kind = c.get("type").and_then(Value::as_str).unwrap_or("function");
                    let body = c.get(kind);
                    let name = body
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or("?");
                    let args = body
                        .and_then(|f| f.get("arguments").or_else(|| f.get("input")))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    names.push((id.to_string(), name.to_string()));
                    format!("{name}({args}) [{id}]")
                })
                .collect();
            header.push_str(&format!(", calls {}", listed.join(", ")));
        }
        if role == "tool" {
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let name = names
                .iter()
                .find(|(i, _)| i == id)
                .map_or("?", |(_, n)| n.as_str());
            header.push_str(&format!(", result of {name} [{id}]"));
        }
        out.push_str(&header);
        out.push_str(" ---\n");
        let text = content(&message);
        if !text.is_empty() {
            out.push_str(&text);
            out.push('\n');
        }
    }
    (count > 0).then_some(out)
}

/// A message's content as text: a string, or its parts: text as it is, Anthropic's tool calls
/// as `[calls name(input) [id]]` and their results under `[result of id]`, other parts named.
fn content(message: &Value) -> String {
    let str_of =
        |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => str_of(p, "text"),
                Some("tool_use" | "server_tool_use" | "mcp_tool_use") => format!(
                    "[calls {}({}) [{}]]",
                    str_of(p, "name"),
                    p.get("input").map(Value::to_string).unwrap_or_default(),
                    str_of(p, "id")
                ),
                Some("tool_result") => {
                    let result = content(p);
                    format!("[result of {}]\n{result}", str_of(p, "tool_use_id"))
                }
                Some(other) => format!("[{other} part]"),
                None => String::new(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_reads_as_messages_with_tool_names() {
        let stored = [
            r#"{"role":"user","content":"Fix the crash."}"#,
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.rs\"}"}}]}"#,
            r#"{"role":"tool","tool_call_id":"c1","content":"fn main() {}\nline 2"}"#,
        ]
        .join("\n");
        let out = messages(&stored).unwrap();
        assert_eq!(
            out,
            "--- message 1: user ---\nFix the crash.\n\
             --- message 2: assistant, calls read_file({\"path\":\"a.rs\"}) [c1] ---\n\
             --- message 3: tool, result of read_file [c1] ---\nfn main() {}\nline 2\n"
        );
    }

    /// Anthropic Messages: the calls and their results read as text, thinking only named.
    #[test]
    fn messages_blocks_read_as_calls_and_results() {
        let stored = [
            r#"{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.rs"}}]}"#,
            r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"fn main() {}"}]},{"type":"text","text":"go on"}]}"#,
        ]
        .join("\n");
        let out = messages(&stored).unwrap();
        assert_eq!(
            out,
            "--- message 1: assistant ---\n[thinking part]\n[calls Read({\"path\":\"a.rs\"}) [toolu_1]]\n\
             --- message 2: user ---\n[result of toolu_1]\nfn main() {}\ngo on\n"
        );
    }

    #[test]
    fn plain_text_is_not_a_span() {
        assert_eq!(messages("just text\nmore"), None);
        assert_eq!(messages(r#"{"not":"a message"}"#), None);
        assert_eq!(messages(""), None);
    }
}
