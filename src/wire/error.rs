//! The OpenAI error shape, `{"error":{"message","type","param","code"}}`, built here and
//! nowhere else: the body of every error response the proxy answers itself, and the data of
//! the final SSE event when a stream that had begun cannot go on.

use serde_json::{json, Value};

/// The error object in the OpenAI shape. `kind` is the OpenAI `type` (`invalid_request_error`,
/// `upstream_error`, `server_error`, …).
pub fn openai_error(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": code,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_has_the_four_keys_in_order() {
        let v = openai_error("no", "server_error", None, Some("x"));
        assert_eq!(
            v.to_string(),
            r#"{"error":{"message":"no","type":"server_error","param":null,"code":"x"}}"#
        );
    }
}
