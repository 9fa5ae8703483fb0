//! Reading and rewriting the Responses API's output items for the tool loop: the calls of an
//! answer, which items are the proxy's (its calls and the reasoning bound to them), whether an
//! item says anything to the client, and the proxy's tools taken out of a response's echo.

use serde_json::Value;

use crate::proxy_tools::{self, ToolNames};
use crate::wire::ToolCall;

/// The calls of output items (function and custom tool calls), in order.
pub fn calls(output: &[Value]) -> Vec<ToolCall> {
    output
        .iter()
        .filter_map(|item| {
            let kind = item.get("type").and_then(Value::as_str)?;
            let (kind, arguments) = match kind {
                "function_call" => ("function", "arguments"),
                "custom_tool_call" => ("custom", "input"),
                _ => return None,
            };
            let text = |key: &str| {
                item.get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Some(ToolCall {
                id: text("call_id"),
                kind: kind.into(),
                name: text("name"),
                arguments: text(arguments),
            })
        })
        .collect()
}

/// Which output items are the proxy's: its function calls, and each reasoning item bound to
/// one (a reasoning item goes with the item after it).
pub fn hidden_positions(output: &[Value], is_proxy: &dyn Fn(&str) -> bool) -> Vec<bool> {
    let mut hide = vec![false; output.len()];
    let mut bound_to_proxy = false;
    for (position, item) in output.iter().enumerate().rev() {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        hide[position] = match kind {
            "function_call" => {
                let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                bound_to_proxy = is_proxy(name);
                bound_to_proxy
            }
            "reasoning" => bound_to_proxy,
            _ => {
                bound_to_proxy = false;
                false
            }
        };
    }
    hide
}

/// Whether an output item says something to the client: a message with text.
pub fn has_text(item: &Value) -> bool {
    item.get("type").and_then(Value::as_str) == Some("message")
        && item
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|part| {
                part.get("text")
                    .or_else(|| part.get("refusal"))
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.trim().is_empty())
            })
}

/// Takes the proxy's tools out of the `tools` a response object echoes; whether any were there.
pub fn scrub_tools(response: &mut Value, names: &ToolNames) -> bool {
    let Some(Value::Array(tools)) = response.get_mut("tools") else {
        return false;
    };
    let before = tools.len();
    tools.retain(|t| !proxy_tools::is_definition(t, names));
    tools.len() != before
}
