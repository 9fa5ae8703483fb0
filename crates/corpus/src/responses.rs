//! The rules a Responses session keeps (`Wire::Responses`, the way Codex sends its history):
//! every request ends on a user message or a tool output and is answered by the model's output
//! items; every call is answered once, by the output of its kind, after it; a reasoning item is
//! followed by what it reasons for; calls name declared tools.

use std::collections::HashMap;

use serde_json::Value;

use crate::Session;

/// The output type answering each call type.
const PAIRS: [(&str, &str); 3] = [
    ("function_call", "function_call_output"),
    ("custom_tool_call", "custom_tool_call_output"),
    ("shell_call", "shell_call_output"),
];

fn kind(item: &Value) -> &str {
    item["type"].as_str().unwrap_or("message")
}

fn is_user(item: &Value) -> bool {
    kind(item) == "message" && item["role"] == "user"
}

fn is_output(item: &Value) -> bool {
    PAIRS.iter().any(|(_, output)| kind(item) == *output)
}

/// Checks `s`'s Responses rules, naming the first one broken.
pub fn validate(s: &Session) -> Result<(), String> {
    let id = &s.id;
    let items = &s.messages;
    if s.request_ends.is_empty() {
        return Err(format!("session {id}: no requests"));
    }
    let mut prev = 0;
    for (k, &end) in s.request_ends.iter().enumerate() {
        if end <= prev || end >= items.len() {
            return Err(format!(
                "session {id}: request {k} ends at {end}, after {prev} of {}",
                items.len()
            ));
        }
        if !is_user(&items[end - 1]) && !is_output(&items[end - 1]) {
            return Err(format!(
                "session {id}: request {k} ends with a {} item",
                kind(&items[end - 1])
            ));
        }
        if is_user(&items[end]) || is_output(&items[end]) {
            return Err(format!(
                "session {id}: request {k} is not answered by the model's output"
            ));
        }
        prev = end;
    }
    let declared = |wanted: &str, name: &str| {
        s.tools.as_array().is_some_and(|tools| {
            tools
                .iter()
                .any(|t| t["type"] == wanted && t["name"] == name)
        })
    };
    // Open calls by id: the output type answering them.
    let mut open: HashMap<&str, &str> = HashMap::new();
    let mut seen: Vec<&str> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let what = kind(item);
        if what == "reasoning"
            && items
                .get(i + 1)
                .is_none_or(|next| kind(next) == "reasoning")
        {
            return Err(format!(
                "session {id}: item {i}: reasoning without its item"
            ));
        }
        if let Some((_, output)) = PAIRS.iter().find(|(call, _)| *call == what) {
            let call_id = item["call_id"].as_str().unwrap_or("");
            if call_id.is_empty() || seen.contains(&call_id) {
                return Err(format!("session {id}: item {i}: bad or repeated call id"));
            }
            let name = item["name"].as_str().unwrap_or("");
            let tool = if what == "custom_tool_call" {
                "custom"
            } else {
                "function"
            };
            if what != "shell_call" && !declared(tool, name) {
                return Err(format!("session {id}: item {i}: undeclared tool {name:?}"));
            }
            if what == "function_call"
                && !item["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str::<Value>(a).ok())
                    .is_some_and(|v| v.is_object())
            {
                return Err(format!(
                    "session {id}: item {i}: arguments are not a JSON object"
                ));
            }
            seen.push(call_id);
            open.insert(call_id, output);
        }
        if is_output(item) {
            let call_id = item["call_id"].as_str().unwrap_or("");
            if open.remove(call_id) != Some(what) {
                return Err(format!(
                    "session {id}: item {i}: {what} answers no open call {call_id:?}"
                ));
            }
        }
    }
    if let Some(call_id) = open.keys().next() {
        return Err(format!("session {id}: call {call_id:?} is never answered"));
    }
    Ok(())
}
