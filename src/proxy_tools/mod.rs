//! Reload: the proxy's own tools, `context_read` and `context_search`, through which the model
//! reads back anything the proxy moved out of its context. They are offered only when the
//! forwarded request refers to stored content, appended after the client's tools with the same
//! bytes every time (so the client's prefix, and the upstream's prompt cache, are untouched),
//! executed by the proxy itself, and never shown to the client (see `routes::tool_loop`).
//!
//! - `mod.rs` — the settings, choosing the tools' names (never a client tool's), injecting them;
//! - `exec.rs` — running one call against the store: paging by lines, searching;
//! - `render.rs` — a moved-out span of messages as text a model reads;
//! - `hidden.rs` — calls of the proxy's tools hidden from the client, kept in the session and
//!   put back in place when the client sends the conversation again;
//! - `hidden_rounds.rs` — the same on Anthropic Messages: the upstream transcript one client
//!   assistant message stands for, put back in its place.

pub mod exec;
pub mod hidden;
pub mod hidden_rounds;
pub mod render;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `[context.reload]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReloadConfig {
    /// Offer the tools when the forwarded request refers to stored content.
    pub enabled: bool,
    /// Rounds of the proxy's own tool calls answered for one client request; after the last
    /// one the upstream is asked once more without the tools.
    pub max_rounds: usize,
    /// Most tokens one `context_read` returns.
    pub read_max_tokens: usize,
    /// Lines one `context_read` returns when the model gives no `limit`.
    pub read_default_lines: usize,
    /// Most matches one `context_search` returns.
    pub search_max_matches: usize,
    /// Calls of the proxy's tools run from one answer of the model; each further call gets a
    /// short tool error instead (every call still needs its result).
    pub max_calls_per_round: usize,
}

impl Default for ReloadConfig {
    fn default() -> ReloadConfig {
        ReloadConfig {
            enabled: true,
            max_rounds: 4,
            read_max_tokens: 4_000,
            read_default_lines: 200,
            search_max_matches: 50,
            max_calls_per_round: 16,
        }
    }
}

impl ReloadConfig {
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_rounds", self.max_rounds),
            ("read_max_tokens", self.read_max_tokens),
            ("read_default_lines", self.read_default_lines),
            ("search_max_matches", self.search_max_matches),
            ("max_calls_per_round", self.max_calls_per_round),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("context.reload.{key} must be above 0"));
            }
        }
        if self.max_rounds > 32 {
            return Err("context.reload.max_rounds must be at most 32".into());
        }
        Ok(())
    }
}

/// The names the proxy's tools go by in one request (never the name of a client tool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolNames {
    pub read: String,
    pub search: String,
}

/// Which of the proxy's tools a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Read,
    Search,
}

impl ToolNames {
    /// The proxy's tool called `name`, if it is one.
    pub fn tool(&self, name: &str) -> Option<Tool> {
        if name == self.read {
            Some(Tool::Read)
        } else if name == self.search {
            Some(Tool::Search)
        } else {
            None
        }
    }
}

/// Whether the tools can be offered for a request, and under which names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    Tools(ToolNames),
    /// They cannot be: markers then say where the content is kept instead.
    NotOffered(NotOffered),
}

/// Why the tools are not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOffered {
    /// `[context.reload] enabled = false`.
    Disabled,
    /// The client asked for no tool calls (`tool_choice: "none"`).
    ToolChoiceNone,
    /// Several choices (`n > 1`): the proxy could not continue each one's tool calls.
    SeveralChoices,
    /// Every candidate name is a client tool's.
    NoFreeName,
    /// Anthropic Messages on a model that binds each thinking block to the tools and messages
    /// before it: tools added mid-conversation would invalidate every thinking block so far,
    /// and the client's betas do not let the API drop them.
    ThinkingBound,
}

const READ_NAMES: [&str; 4] = [
    "context_read",
    "proxy_context_read",
    "context_proxy_read",
    "stored_context_read",
];
const SEARCH_NAMES: [&str; 4] = [
    "context_search",
    "proxy_context_search",
    "context_proxy_search",
    "stored_context_search",
];

/// Decides whether the tools can be offered for `body` and under which names.
pub fn offer(body: &Value, config: &ReloadConfig) -> Offer {
    if !config.enabled {
        return Offer::NotOffered(NotOffered::Disabled);
    }
    let choice = body.get("tool_choice");
    // Chat's `"none"`, or Anthropic Messages' `{"type": "none"}`.
    if choice.and_then(Value::as_str) == Some("none")
        || choice.and_then(|c| c.get("type")).and_then(Value::as_str) == Some("none")
    {
        return Offer::NotOffered(NotOffered::ToolChoiceNone);
    }
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Offer::NotOffered(NotOffered::SeveralChoices);
    }
    names(body, config)
}

/// The names the tools would be offered under for `body`, whatever its `tool_choice`: what a
/// conversation holding the proxy's earlier calls must define, even when the model may call
/// no tool now.
pub fn names(body: &Value, config: &ReloadConfig) -> Offer {
    if !config.enabled {
        return Offer::NotOffered(NotOffered::Disabled);
    }
    let taken = client_tool_names(body);
    let free = |candidates: &[&str]| {
        candidates
            .iter()
            .find(|c| !taken.iter().any(|t| t == *c))
            .map(|c| c.to_string())
    };
    match (free(&READ_NAMES), free(&SEARCH_NAMES)) {
        (Some(read), Some(search)) => Offer::Tools(ToolNames { read, search }),
        _ => Offer::NotOffered(NotOffered::NoFreeName),
    }
}

/// The names of the client's own tools (function and custom; nested as chat completions
/// writes them, or flat as the Responses API does), those of `tools` and those a Responses
/// `additional_tools` input item defines (Codex 0.171 sends its tools that way): a name the
/// model already knows from either is not free.
fn client_tool_names(body: &Value) -> Vec<&str> {
    fn listed(tools: Option<&Value>) -> impl Iterator<Item = &str> {
        tools
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(tool_name)
    }
    let added = body
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|item| item.get("type").and_then(Value::as_str) == Some("additional_tools"))
        .flat_map(|item| listed(item.get("tools")));
    listed(body.get("tools")).chain(added).collect()
}

/// A tool definition's name: `{"type": k, k: {"name"}}` (chat) or `{"type", "name"}` (flat).
fn tool_name(tool: &Value) -> Option<&str> {
    let kind = tool
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    tool.get(kind)
        .and_then(|t| t.get("name"))
        .or_else(|| tool.get("name"))?
        .as_str()
}

/// The tokens the two definitions add to a request (counted as the upstream counts a `tools`
/// array; when the client has tools of its own this over-counts the array's fixed overhead by
/// a few tokens, which errs on the side of fitting). Counted once per names and encoding (the
/// names come from short fixed lists, so the memo stays small): every managed request asks.
pub fn definitions_tokens(names: &ToolNames, encoding: crate::tokens::Encoding) -> usize {
    type Memo = std::collections::HashMap<(String, String, crate::tokens::Encoding), usize>;
    static MEMO: std::sync::OnceLock<std::sync::Mutex<Memo>> = std::sync::OnceLock::new();
    let key = (names.read.clone(), names.search.clone(), encoding);
    let memo = MEMO.get_or_init(Default::default);
    if let Some(&tokens) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return tokens;
    }
    let tokens = crate::tokens::tools_tokens(&Value::Array(definitions(names).to_vec()), encoding);
    memo.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, tokens);
    tokens
}

/// The two tool definitions, in a fixed order with fixed bytes for given names.
pub fn definitions(names: &ToolNames) -> [Value; 2] {
    let read = json!({
        "type": "function",
        "function": {
            "name": names.read,
            "description": format!(
                "Read content that the context proxy moved out of this conversation to keep it \
                 within budget. Markers in earlier messages name it by a reference such as \
                 ctx_abcdefghijklmnopqrstuvwx. Returns lines offset..offset+limit-1 (1-based) with \
                 a header giving the total number of lines and how to read the next page; a span \
                 of moved-out messages reads as those messages one after another. Use {} to find \
                 the lines you need first.",
                names.search
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "ref": {"type": "string", "description": "The reference from the marker, e.g. ctx_abcdefghijklmnopqrstuvwx."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based). Default 1."},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to return. Default 200."}
                },
                "required": ["ref"],
                "additionalProperties": false
            }
        }
    });
    let search = json!({
        "type": "function",
        "function": {
            "name": names.search,
            "description": "Search the content the context proxy moved out of this conversation \
                (all of it, or one reference). The pattern is an exact, case-sensitive substring; \
                written between slashes (/like (this|that)/) it is a regular expression in Rust \
                regex syntax. Returns the reference, line number and matching line with one line \
                of context around it, ordered by reference then line.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Exact text to find, or /regular expression/."},
                    "ref": {"type": "string", "description": "Search only this reference (optional)."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }
        }
    });
    [read, search]
}

/// The two definitions as the Responses API takes them: flat (`{"type":"function","name",…}`),
/// and not `strict` (a strict schema must require every property; `offset` and `limit` are
/// optional).
pub fn flat_definitions(names: &ToolNames) -> [Value; 2] {
    definitions(names).map(|tool| {
        let function = &tool["function"];
        json!({
            "type": "function",
            "name": function["name"],
            "description": function["description"],
            "parameters": function["parameters"],
            "strict": false,
        })
    })
}

/// The two definitions in Anthropic Messages' shape (`{name, description, input_schema}`):
/// the same names, texts and schemas as [`definitions`], with fixed bytes.
pub fn messages_definitions(names: &ToolNames) -> [Value; 2] {
    definitions(names).map(|chat| {
        let function = &chat["function"];
        json!({
            "name": function["name"],
            "description": function["description"],
            "input_schema": function["parameters"],
        })
    })
}

/// Appends the proxy's tools after the client's (creating `tools` when there is none).
pub fn inject(body: &mut Value, names: &ToolNames) {
    append(body, definitions(names));
}

/// [`inject`] with the Responses API's flat definitions ([`flat_definitions`]).
pub fn inject_flat(body: &mut Value, names: &ToolNames) {
    append(body, flat_definitions(names));
}

/// [`inject`] for an Anthropic Messages request.
pub fn inject_messages(body: &mut Value, names: &ToolNames) {
    append(body, messages_definitions(names));
}

fn append(body: &mut Value, definitions: [Value; 2]) {
    let Some(object) = body.as_object_mut() else {
        return;
    };
    let tools = object
        .entry("tools")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = tools {
        list.extend(definitions);
    }
}

/// Whether `tool` is the definition of one of the proxy's tools (either shape).
pub fn is_definition(tool: &Value, names: &ToolNames) -> bool {
    tool_name(tool).is_some_and(|n| names.tool(n).is_some())
}

/// Removes the proxy's tools again (the last request of a loop that ran out of rounds), and
/// `tools` itself when the client sent none.
pub fn remove(body: &mut Value, names: &ToolNames, client_had_tools: bool) {
    let Some(object) = body.as_object_mut() else {
        return;
    };
    if !client_had_tools {
        object.shift_remove("tools");
        return;
    }
    if let Some(Value::Array(list)) = object.get_mut("tools") {
        list.retain(|t| !is_definition(t, names));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ToolNames {
        ToolNames {
            read: "context_read".into(),
            search: "context_search".into(),
        }
    }

    #[test]
    fn offered_under_free_names_after_the_clients_tools() {
        let cfg = ReloadConfig::default();
        let mut body = json!({"model": "m", "messages": [], "tools": [
            {"type": "function", "function": {"name": "context_read"}},
            {"type": "custom", "custom": {"name": "proxy_context_read"}}
        ]});
        let Offer::Tools(n) = offer(&body, &cfg) else {
            panic!("not offered")
        };
        assert_eq!(n.read, "context_proxy_read");
        assert_eq!(n.search, "context_search");
        inject(&mut body, &n);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 4);
        assert_eq!(tools[0]["function"]["name"], "context_read");
        assert_eq!(tools[2]["function"]["name"], "context_proxy_read");
        assert_eq!(tools[3]["function"]["name"], "context_search");
        // The description of read names the search tool by its name in this request.
        assert!(tools[2]["function"]["description"]
            .as_str()
            .unwrap()
            .contains("Use context_search"));
    }

    #[test]
    fn definitions_are_byte_stable() {
        let a = serde_json::to_string(&definitions(&names())).unwrap();
        let b = serde_json::to_string(&definitions(&names())).unwrap();
        assert_eq!(a, b);
        let mut with = json!({"model": "m"});
        inject(&mut with, &names());
        assert!(with["tools"].as_array().unwrap().len() == 2);
        remove(&mut with, &names(), false);
        assert_eq!(with, json!({"model": "m"}));
        let mut theirs = json!({"tools": [{"type": "function", "function": {"name": "x"}}]});
        inject(&mut theirs, &names());
        remove(&mut theirs, &names(), true);
        assert_eq!(
            theirs,
            json!({"tools": [{"type": "function", "function": {"name": "x"}}]})
        );
    }

    #[test]
    fn flat_definitions_for_the_responses_api() {
        let cfg = ReloadConfig::default();
        // A flat client tool's name is taken as well.
        let mut body =
            json!({"input": [], "tools": [{"type": "function", "name": "context_read"}]});
        let Offer::Tools(n) = offer(&body, &cfg) else {
            panic!("not offered")
        };
        assert_eq!(n.read, "proxy_context_read");
        inject_flat(&mut body, &n);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 3);
        assert_eq!(tools[1]["name"], "proxy_context_read");
        assert_eq!(tools[1]["strict"], false);
        assert_eq!(
            tools[1]["parameters"],
            definitions(&n)[0]["function"]["parameters"]
        );
        assert!(tools[1].get("function").is_none());
        remove(&mut body, &n, true);
        assert_eq!(
            body,
            json!({"input": [], "tools": [{"type": "function", "name": "context_read"}]})
        );
    }

    #[test]
    fn names_defined_by_an_additional_tools_item_are_taken() {
        let cfg = ReloadConfig::default();
        let body = json!({"input": [
            {"type": "additional_tools", "id": "at_1", "role": "developer",
             "tools": [{"type": "function", "name": "context_read"},
                       {"type": "function", "name": "context_search"}]},
            {"type": "message", "role": "user", "content": "hi"}
        ], "tools": [{"type": "function", "name": "proxy_context_read"}]});
        let Offer::Tools(n) = offer(&body, &cfg) else {
            panic!("not offered")
        };
        assert_eq!(n.read, "context_proxy_read");
        assert_eq!(n.search, "proxy_context_search");
    }

    #[test]
    fn messages_tools_have_anthropics_shape_and_names_are_read_from_it() {
        let cfg = ReloadConfig::default();
        let mut body = json!({"tools": [{"name": "context_read", "input_schema": {}},
            {"type": "web_search_20250305", "name": "web_search"}]});
        let Offer::Tools(n) = offer(&body, &cfg) else {
            panic!("not offered")
        };
        assert_eq!(n.read, "proxy_context_read");
        inject_messages(&mut body, &n);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools[2]["name"], "proxy_context_read");
        assert_eq!(tools[2]["input_schema"]["required"], json!(["ref"]));
        assert_eq!(
            tools[3].as_object().unwrap().keys().collect::<Vec<_>>(),
            ["name", "description", "input_schema"]
        );
        assert!(tools.iter().all(|t| t.get("cache_control").is_none()));
        remove(&mut body, &n, true);
        assert_eq!(body["tools"].as_array().unwrap().len(), 2);
        assert_eq!(
            offer(&json!({"tool_choice": {"type": "none"}}), &cfg),
            Offer::NotOffered(NotOffered::ToolChoiceNone)
        );
    }

    #[test]
    fn not_offered_when_they_cannot_be_used() {
        let cfg = ReloadConfig::default();
        let none = json!({"tool_choice": "none"});
        assert_eq!(
            offer(&none, &cfg),
            Offer::NotOffered(NotOffered::ToolChoiceNone)
        );
        let n = json!({"n": 3});
        assert_eq!(
            offer(&n, &cfg),
            Offer::NotOffered(NotOffered::SeveralChoices)
        );
        let all: Vec<Value> = READ_NAMES
            .iter()
            .map(|n| json!({"type": "function", "function": {"name": n}}))
            .collect();
        assert_eq!(
            offer(&json!({ "tools": all }), &cfg),
            Offer::NotOffered(NotOffered::NoFreeName)
        );
        let off = ReloadConfig {
            enabled: false,
            ..ReloadConfig::default()
        };
        assert_eq!(
            offer(&json!({}), &off),
            Offer::NotOffered(NotOffered::Disabled)
        );
        // A forced client tool leaves the tools offered (and the choice untouched).
        let forced = json!({"tool_choice": {"type": "function", "function": {"name": "x"}}});
        assert!(matches!(offer(&forced, &cfg), Offer::Tools(_)));
    }
}
