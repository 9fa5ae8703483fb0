//! The function-tool schemas each agent kind sends in `tools`.

use serde_json::{json, Value};

use super::AgentKind;

fn function(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
        },
    })
}

/// The `tools` array of `kind`.
pub fn schemas(kind: AgentKind) -> Value {
    let tools = match kind {
        AgentKind::Coding => vec![
            function(
                "read_file",
                "Read a file from the workspace. Returns its lines numbered like `cat -n`. Use offset and limit (in lines) for large files.",
                json!({
                    "path": {"type": "string", "description": "Path relative to the workspace root."},
                    "offset": {"type": "integer", "description": "First line to read (1-based)."},
                    "limit": {"type": "integer", "description": "Number of lines to read."},
                }),
                &["path"],
            ),
            function(
                "run_command",
                "Run a shell command in the workspace and return its combined stdout and stderr.",
                json!({
                    "command": {"type": "string"},
                    "timeout_ms": {"type": "integer", "description": "Kill the command after this many milliseconds."},
                }),
                &["command"],
            ),
            function(
                "search_code",
                "Search the workspace with ripgrep. Returns matching lines as path:line:text.",
                json!({
                    "pattern": {"type": "string", "description": "A regular expression."},
                    "path": {"type": "string", "description": "Directory or file to search in."},
                }),
                &["pattern"],
            ),
            function(
                "list_dir",
                "List a directory like `ls -la`.",
                json!({"path": {"type": "string"}}),
                &["path"],
            ),
            function(
                "edit_file",
                "Replace one exact occurrence of old_string with new_string in a file.",
                json!({
                    "path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                }),
                &["path", "old_string", "new_string"],
            ),
            function(
                "write_file",
                "Create or overwrite a file with the given content.",
                json!({"path": {"type": "string"}, "content": {"type": "string"}}),
                &["path", "content"],
            ),
        ],
        AgentKind::Research => vec![
            function(
                "search_web",
                "Search the web. Returns JSON with title, url and snippet for each result.",
                json!({
                    "query": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 20},
                }),
                &["query"],
            ),
            function(
                "fetch_url",
                "Fetch a web page and return its main text as markdown.",
                json!({"url": {"type": "string", "format": "uri"}}),
                &["url"],
            ),
            function(
                "save_note",
                "Save a note to the research notebook for later.",
                json!({"title": {"type": "string"}, "text": {"type": "string"}}),
                &["title", "text"],
            ),
        ],
        AgentKind::Support => vec![
            function(
                "lookup_order",
                "Look up an order by its id (e.g. A1234567).",
                json!({"order_id": {"type": "string"}}),
                &["order_id"],
            ),
            function(
                "lookup_customer",
                "Look up a customer by email. Set include_history to get every past order.",
                json!({
                    "email": {"type": "string"},
                    "include_history": {"type": "boolean"},
                }),
                &["email"],
            ),
            function(
                "get_tracking",
                "Get the carrier's tracking events for a shipment.",
                json!({"tracking_number": {"type": "string"}}),
                &["tracking_number"],
            ),
            function(
                "search_faq",
                "Search the help-center FAQ.",
                json!({"query": {"type": "string"}}),
                &["query"],
            ),
            function(
                "check_inventory",
                "Units in stock for a SKU.",
                json!({"sku": {"type": "string"}}),
                &["sku"],
            ),
            function(
                "create_ticket",
                "Escalate to a human agent by opening a ticket.",
                json!({
                    "subject": {"type": "string"},
                    "priority": {"type": "string", "enum": ["low", "normal", "high"]},
                    "summary": {"type": "string"},
                }),
                &["subject", "priority", "summary"],
            ),
            function(
                "issue_refund",
                "Refund an order, fully or partly. Amount in cents.",
                json!({
                    "order_id": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                    "reason": {"type": "string"},
                }),
                &["order_id", "amount_cents", "reason"],
            ),
        ],
    };
    Value::Array(tools)
}
