//! Reading fields of the small JSON objects a request is made of.

use serde_json::Value;

/// Objects with at most this many keys are searched key by key.
const SCANNED: usize = 8;

/// `value[key]` when `value` is an object holding `key`, as [`Value::get`] finds it.
///
/// A chat message or content part has a handful of keys, and comparing them in order is
/// several times cheaper than hashing `key` (SipHash) to look it up in the object's index, on
/// a path that reads a few fields of every message of a request. A larger object is looked up
/// through its index.
pub fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    let object = value.as_object()?;
    if object.len() > SCANNED {
        return object.get(key);
    }
    object.iter().find_map(|(k, v)| (k == key).then_some(v))
}

/// The string at `value[key]`, if it is one.
pub fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    field(value, key).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn field_finds_what_get_finds_in_small_and_large_objects() {
        let small = json!({"role": "tool", "tool_call_id": "c1", "content": "ok"});
        let large: Value = (0..40)
            .map(|i| (format!("k{i}"), json!(i)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        for value in [&small, &large, &json!([1, 2]), &json!("role"), &Value::Null] {
            for key in [
                "role",
                "content",
                "tool_call_id",
                "k0",
                "k39",
                "k40",
                "",
                "rol",
            ] {
                assert_eq!(field(value, key), value.get(key), "{key} in {value}");
            }
        }
        assert_eq!(str_field(&small, "role"), Some("tool"));
        assert_eq!(str_field(&json!({"role": 1}), "role"), None);
    }
}
