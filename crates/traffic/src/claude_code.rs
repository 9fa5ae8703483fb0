//! Claude Code sessions on Anthropic Messages (`gen-traffic --shape claude-code`): the coding
//! agent's work (`coding.rs`) as Claude Code sends it — a long system prompt after the
//! per-conversation attribution line (`x-anthropic-billing-header: …`), its marked cache
//! breakpoint, Claude Code's tool set, a signed thinking block opening every assistant message,
//! `tool_use` blocks answered by `tool_result` blocks opening the next user message, large
//! `Read` and `Bash` results, `metadata.user_id` naming the session, and the cache breakpoint
//! Claude Code moves to the newest block of every request ([`Session::mark_newest`]). At least
//! 60 requests per session when `max_turns` allows.
//!
//! Thinking signatures are the upstream's: the generator is handed the signer of the upstream
//! the traffic is meant for (the mock's `rules::signed_thinking`), called with the request as
//! it stands before the assistant message, so that a strict upstream accepts the history.

use serde_json::{json, Map, Value};

use super::chat::{Echo, Transcript};
use super::coding;
use super::prose;
use super::rng::Rng;
use super::TrafficConfig;
use context_proxy_corpus::{AgentKind, Session, Wire};

/// Models Claude Code sessions are run with (none binds thinking to the prefix).
pub const MODELS: &[&str] = &["claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5"];

/// The fewest requests of a session, when `max_turns` allows.
pub const MIN_REQUESTS: usize = 60;

/// Signs a thinking block: the request as it stands before the assistant message and the
/// block's text give the block.
pub type Signer<'a> = &'a dyn Fn(&Value, &str) -> Value;

/// Separates these sessions' random streams from the other shapes'.
const STREAM: u64 = 0xc1a0_dec0;

/// Claude Code's tools: the coding agent's tools under Claude Code's names, then the rest.
const TOOLS: [(&str, Option<&str>); 16] = [
    ("Read", Some("read_file")),
    ("Bash", Some("run_command")),
    ("Grep", Some("search_code")),
    ("LS", Some("list_dir")),
    ("Edit", Some("edit_file")),
    ("Write", Some("write_file")),
    ("Glob", None),
    ("MultiEdit", None),
    ("NotebookEdit", None),
    ("WebFetch", None),
    ("WebSearch", None),
    ("TodoWrite", None),
    ("Task", None),
    ("ExitPlanMode", None),
    ("BashOutput", None),
    ("KillShell", None),
];

/// Claude Code's name for the coding agent's tool `name`.
fn tool_name(name: &str) -> &'static str {
    TOOLS
        .iter()
        .find(|(_, from)| *from == Some(name))
        .map_or("Bash", |(to, _)| to)
}

/// The tool definitions, the same for every session (Claude Code's are fixed per version).
fn tools() -> Value {
    let mut rng = Rng::new(STREAM);
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(name, _)| {
            json!({
                "name": name,
                "description": prose::sentences(&mut rng, 12),
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": prose::sentence(&mut rng)},
                        "command": {"type": "string", "description": prose::sentence(&mut rng)},
                    },
                    "additionalProperties": true,
                    "$schema": "http://json-schema.org/draft-07/schema#"
                }
            })
        })
        .collect();
    Value::Array(tools)
}

/// Claude Code's system prompt (long and fixed), then the agent's own instructions.
fn system_prompt(agent: &str) -> String {
    let mut rng = Rng::new(STREAM ^ 1);
    let mut text = String::from("You are Claude Code, Anthropic's official CLI for Claude.\n\n");
    for _ in 0..30 {
        text.push_str(&prose::paragraph(&mut rng));
        text.push_str("\n\n");
    }
    text.push_str(agent);
    text
}

/// Claude Code session number `index` of `cfg`'s seed, its thinking signed by `sign`.
pub fn generate_session(cfg: &TrafficConfig, index: usize, sign: Signer<'_>) -> Session {
    let mut rng = Rng::derive(cfg.seed ^ STREAM, index as u64);
    let lo = MIN_REQUESTS.min(cfg.max_turns.max(2));
    let requests = rng.between(lo, cfg.max_turns.max(lo));
    // Picked either way: the session's random stream does not depend on the override.
    let picked = rng.pick(MODELS).to_string();
    let model = cfg.model.clone().unwrap_or(picked);
    let stream = rng.chance(90);
    let mut t = Transcript::new(Echo::Minimal, cfg.max_result_bytes);
    coding::run(&mut rng, &mut t, requests);
    let (chat, chat_ends) = t.finish();

    let session_id = format!("{:08x}-cc{index:04}", rng.next_u64() as u32);
    let agent = chat
        .first()
        .filter(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let attribution = format!(
        "x-anthropic-billing-header: cc_version=2.1.{}.{:03x}; cc_entrypoint=cli; cch={:05x};",
        rng.below(40),
        rng.below(4096),
        rng.below(1 << 20)
    );
    let mut fields = Map::new();
    fields.insert(
        "system".into(),
        json!([
            {"type": "text", "text": attribution},
            {"type": "text", "text": system_prompt(agent), "cache_control": {"type": "ephemeral"}}
        ]),
    );
    fields.insert("max_tokens".into(), json!(32_000));
    fields.insert(
        "thinking".into(),
        json!({"type": "enabled", "budget_tokens": 16_000}),
    );
    fields.insert(
        "metadata".into(),
        json!({"user_id": json!({"device_id": "d0", "account_uuid": "", "session_id": session_id}).to_string()}),
    );
    let tools = tools();

    // The request as it stands, for signing (and its messages, in the end).
    let mut request = Value::Object(fields.clone());
    request["model"] = json!(model);
    request["tools"] = tools.clone();
    request["messages"] = json!([]);
    let push = |request: &mut Value, m: Value| {
        if let Some(list) = request["messages"].as_array_mut() {
            list.push(m);
        }
    };
    let len = |request: &Value| request["messages"].as_array().map_or(0, Vec::len);
    // Where each chat message went.
    let mut at = vec![0; chat.len()];
    let mut results: Vec<Value> = Vec::new();
    for (i, m) in chat.iter().enumerate() {
        if m["role"] != "tool" && !results.is_empty() {
            push(
                &mut request,
                json!({"role": "user", "content": std::mem::take(&mut results)}),
            );
        }
        at[i] = len(&request);
        match m["role"].as_str() {
            Some("system") if i == 0 => {}
            // The user's turns and the instructions (AGENTS.md) as text blocks of the user
            // message, after the results it opens with, as Claude Code sends them.
            Some("user" | "system" | "developer") => {
                let texts: Vec<Value> = match &m["content"] {
                    Value::Array(parts) => parts
                        .iter()
                        .map(|p| json!({"type": "text", "text": p["text"]}))
                        .collect(),
                    text => vec![json!({"type": "text", "text": text})],
                };
                let last = request["messages"]
                    .as_array_mut()
                    .and_then(|l| l.last_mut());
                match last {
                    Some(last) if last["role"] == "user" => {
                        if let Some(blocks) = last["content"].as_array_mut() {
                            blocks.extend(texts);
                        }
                    }
                    _ => push(&mut request, json!({"role": "user", "content": texts})),
                }
            }
            Some("assistant") => {
                let mut content = vec![sign(&request, &prose::sentence(&mut rng))];
                if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
                    content.push(json!({"type": "text", "text": text}));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
                    content.push(json!({
                        "type": "tool_use",
                        "id": tool_use_id(call["id"].as_str().unwrap_or("")),
                        "name": tool_name(call["function"]["name"].as_str().unwrap_or("")),
                        "input": serde_json::from_str::<Value>(arguments).unwrap_or(json!({})),
                    }));
                }
                push(
                    &mut request,
                    json!({"role": "assistant", "content": content}),
                );
            }
            _ => {
                at[i] = len(&request);
                results.push(json!({
                    "type": "tool_result",
                    "tool_use_id": tool_use_id(m["tool_call_id"].as_str().unwrap_or("")),
                    "content": m["content"],
                }));
            }
        }
    }
    if !results.is_empty() {
        push(&mut request, json!({"role": "user", "content": results}));
    }
    let messages = match request["messages"].take() {
        Value::Array(messages) => messages,
        _ => Vec::new(),
    };
    Session {
        wire: Wire::Messages,
        instructions: None,
        id: format!("{index:03}-claude-code"),
        kind: AgentKind::Coding,
        model,
        tools,
        stream,
        messages,
        request_ends: chat_ends.iter().map(|&e| at[e]).collect(),
        fields: Some(fields),
        mark_newest: true,
    }
}

/// Claude Code's id of the coding agent's call `id` (`call_…` → `toolu_…`).
fn tool_use_id(id: &str) -> String {
    format!("toolu_{}", id.trim_start_matches("call_"))
}
