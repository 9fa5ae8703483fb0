//! What the upstream bills for the tool definitions of a request (`tools`, and the legacy
//! `functions`) and for a `response_format` JSON schema. Pure functions, no caching.
//!
//! The upstream renders the definitions into the prompt in its own format, which OpenAI does
//! not publish. We use the approximation from OpenAI's cookbook ("How to count tokens with
//! tiktoken", section 7), which it checked against the API (101 prompt tokens for its weather
//! example on gpt-4o and gpt-4o-mini, 105 on gpt-4 and gpt-3.5-turbo; our unit tests reproduce
//! both):
//!
//! - 12 tokens once when any tool is defined, plus per function 7 tokens (10 for the
//!   cl100k_base models) and the tokens of `"{name}:{description}"`;
//! - if the parameters have properties, 3 tokens, then per property 3 tokens and the tokens of
//!   `"{key}:{type}:{description}"` (one trailing period of a description dropped);
//! - a property with an `enum`: −3 tokens, then per value 3 tokens and the value's tokens.
//!
//! The cookbook stops at flat parameters. We extend it the same way down the schema: the
//! properties of a nested object, or of an array's `items`, count like top-level ones, and any
//! other schema keyword (`anyOf`, `default`, `$defs`, `format`, `minimum`, …) counts the tokens
//! of `"{keyword}:{compact JSON of its value}"`, which over-counts a little rather than miss
//! it. A custom tool counts like a function whose parameters are its `format` as JSON text.
//! `response_format` of type `json_schema` counts the compact JSON text of its `json_schema`.
//! `tool_choice` is not counted (a few tokens at most).

use serde_json::{Map, Value};

use super::encoding::Encoding;
use super::message::leaf_tokens;

/// Tokens once per request that defines any tool (the namespace around the definitions).
const FUNC_END: i64 = 12;
/// Tokens at the start of every parameter list that has properties.
const PROP_INIT: i64 = 3;
/// Tokens per property.
const PROP_KEY: i64 = 3;
/// Tokens for a property that has an `enum` (negative: the enum replaces the type).
const ENUM_INIT: i64 = -3;
/// Tokens per enum value, besides the value itself.
const ENUM_ITEM: i64 = 3;

/// Schema keywords the formula above already accounts for (or that render as nothing).
const COUNTED_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "enum",
    "properties",
    "items",
    "required",
    "additionalProperties",
];

/// Tokens at the start of every function definition.
fn func_init(encoding: Encoding) -> i64 {
    match encoding {
        Encoding::O200kBase => 7,
        Encoding::Cl100kBase => 10,
    }
}

/// Tokens for a request's `tools` (or legacy `functions`) array; 0 when it is empty or not an
/// array.
pub fn tools_tokens(tools: &Value, encoding: Encoding) -> usize {
    let Some(list) = tools.as_array() else {
        return 0;
    };
    if list.is_empty() {
        return 0;
    }
    let total = list
        .iter()
        .map(|tool| tool_tokens(tool, encoding))
        .fold(FUNC_END, i64::saturating_add);
    usize::try_from(total).unwrap_or(0)
}

/// Tokens for a `response_format`; only a `json_schema` format puts text in the prompt.
pub fn response_format_tokens(format: &Value, encoding: Encoding) -> usize {
    match format.get("json_schema") {
        Some(schema) if format.get("type").and_then(Value::as_str) == Some("json_schema") => {
            encoding.count(&schema.to_string())
        }
        _ => 0,
    }
}

/// One entry of `tools`: `{type:"function", function:{…}}`, `{type:"custom", custom:{…}}`,
/// or a bare legacy `functions` entry `{name, description, parameters}`.
fn tool_tokens(tool: &Value, encoding: Encoding) -> i64 {
    let Value::Object(fields) = tool else {
        return func_init(encoding).saturating_add(as_i64(leaf_tokens(tool, encoding)));
    };
    if let Some(Value::Object(function)) = fields.get("function") {
        return function_tokens(function, encoding);
    }
    if let Some(Value::Object(custom)) = fields.get("custom") {
        let format = custom
            .get("format")
            .map_or(0, |f| encoding.count(&f.to_string()));
        return header_tokens(custom, encoding).saturating_add(as_i64(format));
    }
    if fields.contains_key("name") {
        return function_tokens(fields, encoding);
    }
    let rest = fields
        .iter()
        .filter(|(key, _)| key.as_str() != "type")
        .map(|(_, value)| leaf_tokens(value, encoding))
        .fold(0, usize::saturating_add);
    func_init(encoding).saturating_add(as_i64(rest))
}

/// A function definition: its header, then its parameters.
fn function_tokens(function: &Map<String, Value>, encoding: Encoding) -> i64 {
    let params = function
        .get("parameters")
        .map_or(0, |p| schema_tokens(p, encoding));
    header_tokens(function, encoding).saturating_add(params)
}

/// `func_init` plus the tokens of `"{name}:{description}"`.
fn header_tokens(function: &Map<String, Value>, encoding: Encoding) -> i64 {
    let name = function.get("name").and_then(Value::as_str).unwrap_or("");
    let description = text_field(function, "description");
    let line = format!("{name}:{description}");
    func_init(encoding).saturating_add(as_i64(encoding.count(&line)))
}

/// A JSON schema: its properties (recursively), its array items, its other keywords.
fn schema_tokens(schema: &Value, encoding: Encoding) -> i64 {
    let Value::Object(fields) = schema else {
        return as_i64(leaf_tokens(schema, encoding));
    };
    let mut total: i64 = 0;
    if let Some(Value::Object(properties)) = fields.get("properties") {
        if !properties.is_empty() {
            total = total.saturating_add(PROP_INIT);
            for (key, property) in properties {
                total = total.saturating_add(property_tokens(key, property, encoding));
            }
        }
    }
    if let Some(items) = fields.get("items") {
        total = total.saturating_add(enum_tokens(items, encoding));
        total = total.saturating_add(schema_tokens(items, encoding));
    }
    total.saturating_add(other_keywords(fields, encoding))
}

/// One property: `"{key}:{type}:{description}"`, its enum, and whatever is nested in it.
fn property_tokens(key: &str, property: &Value, encoding: Encoding) -> i64 {
    let Value::Object(fields) = property else {
        return PROP_KEY.saturating_add(as_i64(encoding.count(key)));
    };
    let ty = match fields.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" | "),
        _ => String::new(),
    };
    let description = text_field(fields, "description");
    let line = format!("{key}:{ty}:{description}");
    PROP_KEY
        .saturating_add(enum_tokens(property, encoding))
        .saturating_add(as_i64(encoding.count(&line)))
        .saturating_add(schema_tokens(property, encoding))
}

/// The enum of a schema, if it has one.
fn enum_tokens(schema: &Value, encoding: Encoding) -> i64 {
    let Some(Value::Array(values)) = schema.get("enum") else {
        return 0;
    };
    values.iter().fold(ENUM_INIT, |total, value| {
        let n = match value {
            Value::String(s) => encoding.count(s),
            other => encoding.count(&other.to_string()),
        };
        total.saturating_add(ENUM_ITEM).saturating_add(as_i64(n))
    })
}

/// Keywords outside [`COUNTED_KEYWORDS`], as `"{keyword}:{compact JSON}"`.
fn other_keywords(fields: &Map<String, Value>, encoding: Encoding) -> i64 {
    fields
        .iter()
        .filter(|(key, _)| !COUNTED_KEYWORDS.contains(&key.as_str()))
        .map(|(key, value)| as_i64(encoding.count(&format!("{key}:{value}"))))
        .fold(0, i64::saturating_add)
}

/// A string field with one trailing period removed (as the cookbook does); "" if absent.
fn text_field<'a>(fields: &'a Map<String, Value>, key: &str) -> &'a str {
    let text = fields.get(key).and_then(Value::as_str).unwrap_or("");
    text.strip_suffix('.').unwrap_or(text)
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn weather() -> Value {
        json!([{
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "description": "Get the current weather in a given location",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {
                            "type": "string",
                            "description": "The city and state, e.g. San Francisco, CA",
                        },
                        "unit": {"type": "string",
                            "description": "The unit of temperature to return",
                            "enum": ["celsius", "fahrenheit"]},
                    },
                    "required": ["location"],
                },
            }
        }])
    }

    #[test]
    fn cookbook_formula_by_hand() {
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let t = |s: &str| enc.count(s) as i64;
            let expected = FUNC_END
                + func_init(enc)
                + t("get_current_weather:Get the current weather in a given location")
                + PROP_INIT
                + PROP_KEY
                + t("location:string:The city and state, e.g. San Francisco, CA")
                + PROP_KEY
                + ENUM_INIT
                + ENUM_ITEM
                + t("celsius")
                + ENUM_ITEM
                + t("fahrenheit")
                + t("unit:string:The unit of temperature to return");
            assert_eq!(tools_tokens(&weather(), enc) as i64, expected, "{enc}");
        }
    }

    #[test]
    fn empty_or_malformed_tools() {
        let enc = Encoding::O200kBase;
        assert_eq!(tools_tokens(&json!([]), enc), 0);
        assert_eq!(tools_tokens(&json!(null), enc), 0);
        assert_eq!(tools_tokens(&json!("tools"), enc), 0);
        assert_eq!(
            tools_tokens(&json!([null]), enc),
            (FUNC_END + func_init(enc)) as usize
        );
        // A function with no description and no parameters still pays its framing.
        assert_eq!(
            tools_tokens(
                &json!([{"type": "function", "function": {"name": "ping"}}]),
                enc
            ),
            (FUNC_END + func_init(enc)) as usize + enc.count("ping:")
        );
        assert!(
            tools_tokens(
                &json!([{"type": "function", "function": {"name": 5,
            "parameters": {"properties": {"a": null, "b": 3, "c": {"enum": "x"}}}}}]),
                enc
            ) > 0
        );
    }

    #[test]
    fn nested_schemas_and_other_keywords_count() {
        let enc = Encoding::O200kBase;
        let flat = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"q": {"type": "object"}}}}}]);
        let nested = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"q": {"type": "object", "properties": {
                "inner": {"type": "string", "description": "An inner field."}}}}}}}]);
        let array = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"q": {"type": "array", "items": {
                "type": "string", "enum": ["a", "b"]}}}}}}]);
        let any_of = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"q": {"anyOf": [{"type": "string"}, {"type": "null"}],
                "default": null}}}}}]);
        let base = tools_tokens(&flat, enc);
        assert_eq!(
            tools_tokens(&nested, enc),
            base + (PROP_INIT + PROP_KEY) as usize + enc.count("inner:string:An inner field")
        );
        assert_eq!(
            tools_tokens(&array, enc),
            base - enc.count("q:object:")
                + enc.count("q:array:")
                + (ENUM_INIT + 2 * ENUM_ITEM) as usize
                + enc.count("a")
                + enc.count("b")
        );
        assert_eq!(
            tools_tokens(&any_of, enc),
            base - enc.count("q:object:")
                + enc.count("q::")
                + enc.count(r#"anyOf:[{"type":"string"},{"type":"null"}]"#)
                + enc.count("default:null")
        );
    }

    #[test]
    fn legacy_functions_and_custom_tools() {
        let enc = Encoding::O200kBase;
        let tools = weather();
        let legacy = json!([tools[0]["function"].clone()]);
        assert_eq!(tools_tokens(&legacy, enc), tools_tokens(&tools, enc));
        let custom = json!([{"type": "custom", "custom": {"name": "apply_patch",
            "description": "Apply a patch.", "format": {"type": "grammar", "grammar":
            {"syntax": "lark", "definition": "start: /.+/"}}}}]);
        let format = custom[0]["custom"]["format"].to_string();
        assert_eq!(
            tools_tokens(&custom, enc),
            (FUNC_END + func_init(enc)) as usize
                + enc.count("apply_patch:Apply a patch")
                + enc.count(&format)
        );
    }

    #[test]
    fn response_format_schema() {
        let enc = Encoding::O200kBase;
        let schema = json!({"name": "answer", "strict": true, "schema": {"type": "object",
            "properties": {"answer": {"type": "string"}}, "required": ["answer"]}});
        let rf = json!({"type": "json_schema", "json_schema": schema});
        assert_eq!(
            response_format_tokens(&rf, enc),
            enc.count(&schema.to_string())
        );
        assert_eq!(
            response_format_tokens(&json!({"type": "json_object"}), enc),
            0
        );
        assert_eq!(response_format_tokens(&json!({"type": "text"}), enc), 0);
        assert_eq!(response_format_tokens(&json!("json"), enc), 0);
    }
}
