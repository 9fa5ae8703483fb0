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

/// The support desk's `tools`: the support agent's seven and thirteen more, with the longer
/// descriptions a deployed desk gives its model (20 schemas, about 2,400 tokens).
pub fn desk() -> Value {
    let Value::Array(mut tools) = schemas(AgentKind::Support) else {
        return Value::Array(Vec::new());
    };
    let id = |what: &str| json!({"type": "string", "description": what});
    let extra = [
        function(
            "cancel_order",
            "Cancel an order that has not shipped yet. Fails with status_not_cancellable once the warehouse has handed it to the carrier; then offer a return instead. Always confirm with the customer before calling: a cancellation cannot be undone.",
            json!({
                "order_id": id("The order's id, e.g. A1234567."),
                "reason": {"type": "string", "enum": ["changed_mind", "ordered_by_mistake", "found_cheaper", "delivery_too_slow", "other"], "description": "Why the customer cancels, for the monthly report."},
            }),
            &["order_id", "reason"],
        ),
        function(
            "update_address",
            "Change the delivery address of an order the carrier has not scanned yet. The new address is validated; an undeliverable one is refused with a list of suggestions to read back to the customer.",
            json!({
                "order_id": id("The order's id."),
                "line1": id("Street and number."),
                "line2": id("Apartment, suite, floor (optional)."),
                "city": id("City."),
                "postcode": id("Postal code."),
                "country": id("ISO 3166-1 alpha-2 country code, e.g. US or DE."),
            }),
            &["order_id", "line1", "city", "postcode", "country"],
        ),
        function(
            "apply_coupon",
            "Apply a coupon code to an order still processing. One coupon per order; a coupon that does not apply returns the reason (expired, minimum not reached, excluded product).",
            json!({"order_id": id("The order's id."), "code": id("The coupon code as the customer typed it.")}),
            &["order_id", "code"],
        ),
        function(
            "get_invoice",
            "Send the invoice of an order again to the email on file. Set company and vat_id only for an invoice not yet issued.",
            json!({
                "order_id": id("The order's id."),
                "company": id("Company name to print on the invoice."),
                "vat_id": id("VAT identification number."),
            }),
            &["order_id"],
        ),
        function(
            "check_warranty",
            "Warranty status of one item of an order: the end date, whether it is still covered, and the repair and replacement options.",
            json!({"order_id": id("The order's id."), "sku": id("The item's SKU, as listed in the order.")}),
            &["order_id", "sku"],
        ),
        function(
            "list_stores",
            "Stores near a postcode with their opening hours and whether they offer pick-up, returns and repairs.",
            json!({
                "postcode": id("The customer's postal code."),
                "country": id("ISO 3166-1 alpha-2 country code."),
                "radius_km": {"type": "integer", "minimum": 1, "maximum": 100, "description": "Search radius; 25 by default."},
            }),
            &["postcode", "country"],
        ),
        function(
            "schedule_callback",
            "Book a phone callback by a human agent. Callbacks happen between 9:00 and 18:00 in the customer's time zone on business days.",
            json!({
                "email": id("The customer's email on file."),
                "phone": id("Phone number in E.164 format."),
                "preferred_time": id("ISO 8601 date and time the customer prefers."),
                "topic": id("One sentence on what the call is about."),
            }),
            &["email", "phone", "topic"],
        ),
        function(
            "send_email",
            "Send the customer an email from the support address, e.g. a return label or a summary of what was agreed. Plain text; no attachments other than the documents the other tools produce.",
            json!({
                "email": id("The customer's email on file."),
                "subject": id("Subject line."),
                "body": id("Plain-text body."),
            }),
            &["email", "subject", "body"],
        ),
        function(
            "verify_identity",
            "Send the customer a one-time verification link at the email on file; returns verified once they have opened it. Required before discussing an order when the customer cannot confirm their email and order number.",
            json!({"email": id("The email the customer claims is on file.")}),
            &["email"],
        ),
    ];
    let more = [
        function(
            "get_loyalty_points",
            "The customer's loyalty tier (bronze, silver, gold), points balance and the points that expire within 90 days.",
            json!({"email": id("The customer's email on file.")}),
            &["email"],
        ),
        function(
            "redeem_points",
            "Turn loyalty points into store credit at 100 points per dollar, in steps of 500 points. The credit is usable at once and never expires.",
            json!({"email": id("The customer's email on file."), "points": {"type": "integer", "minimum": 500, "multipleOf": 500, "description": "Points to redeem."}}),
            &["email", "points"],
        ),
        function(
            "report_safety_issue",
            "Report a product that overheated, smoked, sparked or injured someone. Creates a high-priority case for the product safety team and blocks further sales of the batch when several reports agree.",
            json!({
                "order_id": id("The order's id."),
                "sku": id("The item's SKU."),
                "description": id("What happened, in the customer's words."),
                "injury": {"type": "boolean", "description": "Whether anyone was hurt."},
            }),
            &["order_id", "sku", "description", "injury"],
        ),
        function(
            "get_product_specs",
            "Published specifications of a product: dimensions, weight, materials, power, compatibility and what is in the box.",
            json!({"sku": id("The product's SKU.")}),
            &["sku"],
        ),
    ];
    tools.extend(extra);
    tools.extend(more);
    // What every desk tool's description ends with, as deployed desks repeat it per tool.
    for tool in &mut tools {
        if let Some(Value::String(d)) = tool.pointer_mut("/function/description") {
            d.push_str(DESK_TOOL_NOTE);
        }
    }
    Value::Array(tools)
}

/// The usage note every support-desk tool's description ends with.
const DESK_TOOL_NOTE: &str = " Returns JSON. On failure it returns {\"error\": {\"code\", \"message\"}}: retry once when the code is timeout or unavailable, otherwise apologise, explain in plain words what could not be done and offer to escalate with create_ticket. Never show raw error codes, internal ids other than order and ticket numbers, or another customer's data to the customer.";
