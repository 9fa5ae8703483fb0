//! Codex-shaped sessions on the Responses API (`gen-traffic --shape codex`): the coding agent's
//! work, written the way Codex CLI sends it — `instructions`, a developer message and the
//! environment as a user message, then the whole `input` every turn with `store: false`: an
//! encrypted `reasoning` item before each answer, commands as `shell` function calls,
//! file edits as `apply_patch` custom tool calls (freeform text), the outputs paired by
//! `call_id`, the assistant's text as `message` items. 40 requests and more per session.

use serde_json::{json, Value};

use super::chat::{Echo, Transcript};
use super::coding;
use super::rng::Rng;
use context_proxy_corpus::{AgentKind, Session, Wire};

/// Models Codex runs on.
pub const MODELS: &[&str] = &["gpt-5-codex", "gpt-5.1-codex", "gpt-5"];

/// Fewest requests in a Codex session.
pub const MIN_REQUESTS: usize = 40;

/// Separates the Codex sessions' random streams from the other shapes'.
const CODEX_STREAM: u64 = 0xc0de_c5e5;

const INSTRUCTIONS: &str = "You are Codex, a coding agent based on GPT-5. You and the user share the same workspace and collaborate to achieve the user's goals.\n\n## General\n\n- When searching for text or files, prefer using `rg`.\n- Edit files with the `apply_patch` tool; never write files with shell redirection.\n- Keep changes minimal and focused on the task; run the tests before you finish.";

/// The tools Codex declares: `shell` (a function) and `apply_patch` (a custom, freeform tool).
fn tools() -> Value {
    json!([
        {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": false,
         "parameters": {"type": "object", "properties": {
             "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute."},
             "workdir": {"type": "string", "description": "The working directory."},
             "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds."}},
          "required": ["command"], "additionalProperties": false}},
        {"type": "custom", "name": "apply_patch",
         "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}},
        {"type": "function", "name": "update_plan", "description": "Updates the task plan.",
         "strict": false,
         "parameters": {"type": "object", "properties": {"plan": {"type": "array", "items": {"type": "object"}}},
          "required": ["plan"], "additionalProperties": false}},
    ])
}

/// Codex session number `index` of `seed`: between [`MIN_REQUESTS`] and `max_turns` requests
/// (at least [`MIN_REQUESTS`]), every tool result at most `max_result_bytes`.
pub fn session(seed: u64, index: usize, max_turns: usize, max_result_bytes: usize) -> Session {
    let mut rng = Rng::derive(seed ^ CODEX_STREAM, index as u64);
    let requests = rng.between(MIN_REQUESTS, max_turns.max(MIN_REQUESTS));
    let model = rng.pick(MODELS).to_string();
    let mut t = Transcript::new(Echo::Minimal, max_result_bytes);
    coding::run(&mut rng, &mut t, requests);
    let (messages, ends) = t.finish();
    let (items, request_ends) = convert(&mut rng, &messages, &ends);
    Session {
        id: format!("{index:03}-codex"),
        kind: AgentKind::Coding,
        model,
        tools: tools(),
        stream: true,
        messages: items,
        request_ends,
        wire: Wire::Responses,
        instructions: Some(INSTRUCTIONS.into()),
        fields: None,
        mark_newest: false,
    }
}

/// The chat history as Codex's input items, and where each request's answer starts.
fn convert(rng: &mut Rng, messages: &[Value], ends: &[usize]) -> (Vec<Value>, Vec<usize>) {
    let mut items = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions instructions>\nFilesystem sandboxing: workspace-write. Network access is restricted. Approval policy: on-request.\n</permissions instructions>"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/home/dev/workspace</cwd>\n  <shell>bash</shell>\n</environment_context>"}]}),
    ];
    // Where each chat message starts among the items.
    let mut starts = Vec::with_capacity(messages.len() + 1);
    // The calls of the last assistant message: the custom ones are answered by custom outputs.
    let mut custom: Vec<String> = Vec::new();
    for m in messages {
        starts.push(items.len());
        let text = |m: &Value| m["content"].as_str().unwrap_or("").to_string();
        match m["role"].as_str() {
            Some("system") => {}
            Some("developer") => items.push(json!({"type": "message", "role": "developer",
                "content": [{"type": "input_text", "text": text(m)}]})),
            Some("user") => items.push(json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text(m)}]})),
            Some("assistant") => {
                items.push(reasoning(rng));
                if !text(m).is_empty() {
                    items.push(json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text(m), "annotations": []}]}));
                }
                custom.clear();
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let (item, is_custom) = call_item(call);
                    if is_custom {
                        custom.push(call["id"].as_str().unwrap_or("").to_string());
                    }
                    items.push(item);
                }
            }
            Some("tool") => {
                let call_id = m["tool_call_id"].as_str().unwrap_or("");
                let output = if custom.iter().any(|c| c == call_id) {
                    "custom_tool_call_output"
                } else {
                    "function_call_output"
                };
                items.push(json!({"type": output, "call_id": call_id, "output": text(m)}));
            }
            _ => {}
        }
    }
    starts.push(items.len());
    let request_ends = ends.iter().map(|&end| starts[end]).collect();
    (items, request_ends)
}

/// An encrypted reasoning item, Fernet-looking like the API's, of a plausible size.
fn reasoning(rng: &mut Rng) -> Value {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let len = rng.between(400, 2_400);
    let body: String = (0..len)
        .map(|_| char::from(ALPHABET[rng.below(ALPHABET.len() as u64) as usize]))
        .collect();
    json!({"type": "reasoning", "summary": [], "encrypted_content": format!("gAAAAB{body}")})
}

/// A chat tool call as Codex's item: file writes and edits an `apply_patch` custom call, every
/// other tool a `shell` command.
fn call_item(call: &Value) -> (Value, bool) {
    let call_id = call["id"].as_str().unwrap_or("");
    let name = call["function"]["name"].as_str().unwrap_or("");
    let args: Value = call["function"]["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    let arg = |key: &str| args[key].as_str().unwrap_or("").to_string();
    let patch = |body: String| json!({"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": body});
    let plus = |text: &str| -> String { text.lines().map(|l| format!("+{l}\n")).collect() };
    let minus = |text: &str| -> String { text.lines().map(|l| format!("-{l}\n")).collect() };
    match name {
        "write_file" => {
            let body = format!(
                "*** Begin Patch\n*** Add File: {}\n{}*** End Patch",
                arg("path"),
                plus(&arg("content"))
            );
            (patch(body), true)
        }
        "edit_file" => {
            let body = format!(
                "*** Begin Patch\n*** Update File: {}\n@@\n{}{}*** End Patch",
                arg("path"),
                minus(&arg("old_string")),
                plus(&arg("new_string"))
            );
            (patch(body), true)
        }
        _ => {
            let command = match name {
                "read_file" => format!("cat -n {}", arg("path")),
                "run_command" => arg("command"),
                "search_code" => format!("rg -n '{}' {}", arg("pattern"), arg("path")),
                "list_dir" => format!("ls -la {}", arg("path")),
                other => format!("{other} {args}"),
            };
            let arguments =
                json!({"command": ["bash", "-lc", command], "workdir": "/home/dev/workspace"});
            (
                json!({"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments.to_string()}),
                false,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_sessions_are_long_valid_and_deterministic() {
        for index in 0..4 {
            let s = session(7, index, 60, 40_000);
            s.validate().unwrap();
            assert!(s.request_count() >= MIN_REQUESTS, "{}", s.request_count());
            assert_eq!(s, session(7, index, 60, 40_000));
            let kinds: Vec<&str> = s
                .messages
                .iter()
                .filter_map(|i| i["type"].as_str())
                .collect();
            for kind in [
                "reasoning",
                "function_call",
                "function_call_output",
                "message",
            ] {
                assert!(kinds.contains(&kind), "{kind} in session {index}");
            }
            let body = s.request(s.request_count() - 1);
            assert_eq!(body["store"], false);
            assert_eq!(body["prompt_cache_key"], s.id);
            assert!(body["instructions"]
                .as_str()
                .unwrap()
                .starts_with("You are Codex"));
            assert!(body.get("messages").is_none());
        }
        let patched = (0..8).any(|i| {
            session(7, i, 60, 40_000)
                .messages
                .iter()
                .any(|m| m["type"] == "custom_tool_call")
        });
        assert!(patched, "apply_patch appears");
    }
}
