//! Builds a request body's JSON DOM: the same `serde_json::Value` as `serde_json::from_slice`
//! (keys in their original order, numbers as written), for about three quarters of its cost.
//!
//! A managed request is parsed whole, and on a large agent conversation the parse is most of
//! the proxy's work: serde_json reaches the DOM through its generic visitor machinery,
//! validates UTF-8 one string at a time and scans strings byte by byte. This parser checks
//! UTF-8 once for the whole body, finds the end of a string eight bytes at a time, and builds
//! the `Value` directly.
//!
//! It only ever builds well-formed JSON. On anything else — a syntax error, invalid UTF-8, an
//! escape that is not a whole character (a lone surrogate), nesting deeper than
//! [`MAX_DEPTH`], or the one key serde_json reads specially — it gives up with `None`, and the
//! caller asks serde_json, whose answer (a value or its error message) is authoritative. A
//! property test holds it to that: whatever this parser builds is what serde_json builds.

use serde_json::{Map, Value};

/// Deeper nesting is left to serde_json (whose own limit is 128).
const MAX_DEPTH: usize = 100;

/// The key that makes serde_json (with `arbitrary_precision`) read an object as a number.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// `serde_json::from_slice::<Value>(bytes)` when it is `Ok`, or `None` when this parser leaves
/// the answer to serde_json.
pub fn parse(bytes: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parser = Parser {
        text,
        bytes,
        at: 0,
        depth: 0,
    };
    parser.skip_whitespace();
    let value = parser.value()?;
    parser.skip_whitespace();
    (parser.at == bytes.len()).then_some(value)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Consumes `byte` (after whitespace), or fails.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_whitespace();
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn value(&mut self) -> Option<Value> {
        match self.peek()? {
            b'"' => self.string().map(Value::String),
            b'{' => self.nested(Parser::object),
            b'[' => self.nested(Parser::array),
            b't' => self.literal("true", Value::Bool(true)),
            b'f' => self.literal("false", Value::Bool(false)),
            b'n' => self.literal("null", Value::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&mut self, parse: fn(&mut Self) -> Option<Value>) -> Option<Value> {
        if self.depth == MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        self.at += 1;
        let value = parse(self);
        self.depth -= 1;
        value
    }

    fn literal(&mut self, word: &str, value: Value) -> Option<Value> {
        self.bytes[self.at..].starts_with(word.as_bytes()).then(|| {
            self.at += word.len();
            value
        })
    }

    /// After `{`.
    fn object(&mut self) -> Option<Value> {
        let mut map = Map::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Some(Value::Object(map));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return None;
            }
            let key = self.string()?;
            if key == NUMBER_TOKEN {
                return None;
            }
            self.expect(b':')?;
            self.skip_whitespace();
            let value = self.value()?;
            map.insert(key, value);
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(Value::Object(map));
                }
                _ => return None,
            }
        }
    }

    /// After `[`.
    fn array(&mut self) -> Option<Value> {
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value()?);
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(Value::Array(items));
                }
                _ => return None,
            }
        }
    }

    /// JSON's number grammar; the value is serde_json's reading of the same text (so it is
    /// kept exactly as `arbitrary_precision` keeps it).
    fn number(&mut self) -> Option<Value> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        serde_json::from_str(&self.text[start..self.at]).ok()
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    /// At `"`: the string, its escapes decoded.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let start = self.at;
        self.at = plain_end(self.bytes, self.at)?;
        if self.bytes[self.at] == b'"' {
            self.at += 1;
            return Some(self.text[start..self.at - 1].to_owned());
        }
        let mut out = String::with_capacity(self.at - start + 16);
        out.push_str(&self.text[start..self.at]);
        loop {
            match self.bytes[self.at] {
                b'"' => {
                    self.at += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.at += 1;
                    self.escape(&mut out)?;
                }
                // A control character: JSON wants it escaped.
                _ => return None,
            }
            let run = self.at;
            self.at = plain_end(self.bytes, self.at)?;
            out.push_str(&self.text[run..self.at]);
        }
    }

    /// After `\`: decodes one escape into `out`.
    fn escape(&mut self, out: &mut String) -> Option<()> {
        let decoded = match self.peek()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                self.at += 1;
                let unit = self.hex4()?;
                let code = match unit {
                    0xD800..=0xDBFF => {
                        // A high surrogate must be followed by a low one.
                        if !self.bytes[self.at..].starts_with(b"\\u") {
                            return None;
                        }
                        self.at += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    unit => unit,
                };
                out.push(char::from_u32(code)?);
                return Some(());
            }
            _ => return None,
        };
        self.at += 1;
        out.push(decoded);
        Some(())
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.at..self.at + 4)?;
        let mut value = 0;
        for &d in digits {
            value = value * 16 + char::from(d).to_digit(16)?;
        }
        self.at += 4;
        Some(value)
    }
}

/// The position of the first `"`, `\` or control character at or after `from`, or `None` when
/// the input ends first. Eight bytes at a time: a byte is found by the classic test for a zero
/// byte in a word (`(x - 0x01…) & !x & 0x80…`).
fn plain_end(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let quote = has_zero(word ^ (ONES * u64::from(b'"')));
        let backslash = has_zero(word ^ (ONES * u64::from(b'\\')));
        // A byte below 0x20 is a zero byte once its low five bits are cleared.
        let control = has_zero(word & (ONES * 0xE0));
        if quote | backslash | control != 0 {
            break;
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|k| at + k)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde_json makes of `bytes`, and what this parser makes of it, agree.
    fn agrees(bytes: &[u8]) -> Result<(), TestCaseError> {
        let ours = parse(bytes);
        let theirs = serde_json::from_slice::<Value>(bytes);
        if let Some(value) = &ours {
            let theirs = theirs.as_ref().map_err(|e| {
                TestCaseError::fail(format!("built a value serde_json refuses ({e}): {bytes:?}"))
            })?;
            // Equal, and in the same key order.
            prop_assert_eq!(value, theirs);
            prop_assert_eq!(value.to_string(), theirs.to_string());
        }
        Ok(())
    }

    #[test]
    fn builds_what_serde_json_builds() {
        let cases: &[&str] = &[
            r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0.7}"#,
            " \t\n\r{ \"a\" : [ 1 , -2 , 3.5e10 , 1E2 , -0 , 0.0 , true , false , null ] } \n",
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"s":"\"\\\/\b\f\n\r\t \u00e9 \ud83d\ude00 \u0000 é 😀"}"#,
            r#"[18446744073709551616, -9223372036854775809, 1.7976931348623157e309, 1.50]"#,
            r#"{"":{"":[[],{}]}}"#,
            r#""just a string""#,
            "123",
            r#"{"k":"a string longer than eight bytes with an escape at the end\n"}"#,
        ];
        for case in cases {
            let value = parse(case.as_bytes()).unwrap_or_else(|| panic!("gave up on {case}"));
            assert_eq!(
                value,
                serde_json::from_str::<Value>(case).unwrap(),
                "{case}"
            );
            agrees(case.as_bytes()).unwrap();
        }
    }

    #[test]
    fn leaves_everything_else_to_serde_json() {
        let cases: &[&[u8]] = &[
            b"",
            b" ",
            b"{",
            b"{\"a\":1,}",
            b"[1,]",
            b"[01]",
            b"[1.]",
            b"[.5]",
            b"[1e]",
            b"[+1]",
            b"[tru]",
            b"{\"a\" 1}",
            b"{a:1}",
            b"{} {}",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"\\x\"",
            b"\"\\u12\"",
            b"\"tab\there\"",
            b"\"\xff\"",
            b"\xef\xbb\xbf{}",
            br#"{"$serde_json::private::Number":"1"}"#,
        ];
        for case in cases {
            assert_eq!(parse(case), None, "{:?}", String::from_utf8_lossy(case));
        }
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(parse(deep.as_bytes()), None);
        let allowed = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(allowed.as_bytes()).is_some());
    }

    #[test]
    fn plain_end_finds_the_first_special_byte_anywhere_in_a_word() {
        for len in 0..24 {
            for special in [b'"', b'\\', 0x00, 0x1f] {
                for at in 0..len {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = special;
                    assert_eq!(plain_end(&bytes, 0), Some(at), "{len} {special} {at}");
                }
            }
            // Bytes that look close: none of them ends a plain run.
            let near: Vec<u8> = (0..len)
                .map(|k| [0x20, 0x21, 0x23, 0x5b, 0x5d, 0xa2, 0xdc, 0xff][k % 8])
                .collect();
            assert_eq!(plain_end(&near, 0), None, "{near:?}");
        }
    }

    /// JSON text, mostly valid, with the odd corner: escapes, surrogates, numbers of every
    /// spelling, duplicate keys, deep nesting, stray whitespace.
    fn json_text() -> impl Strategy<Value = String> {
        let string = prop::collection::vec(
            prop_oneof![
                "[a-z ]{0,12}",
                Just("\\\"".to_owned()),
                Just("\\\\".to_owned()),
                Just("\\n\\t\\/\\b\\f\\r".to_owned()),
                "\\\\u[0-9a-fA-F]{4}",
                Just("\\ud83d\\ude00".to_owned()),
                Just("é😀\u{7f}".to_owned()),
            ],
            0..4,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let number = prop_oneof![
            "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
            Just("1e400".to_owned()),
        ];
        let leaf = prop_oneof![
            string.clone(),
            number,
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
        ];
        let ws = prop_oneof![Just(""), Just(" "), Just("\n\t "), Just("\r\n")];
        leaf.prop_recursive(6, 64, 6, move |inner| {
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws.clone()), 0..6)).prop_map(|items| {
                    let items: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", items.join(","))
                }),
                (prop::collection::vec(
                    (
                        prop_oneof!["\"[a-c]{0,2}\"", Just("\"k\\u0041\"".to_owned())],
                        inner
                    ),
                    0..6
                ))
                .prop_map(|entries| {
                    let entries: Vec<String> = entries
                        .into_iter()
                        .map(|(k, v)| format!("{k} : {v}"))
                        .collect();
                    format!("{{{}}}", entries.join(","))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn valid_json_is_built_as_serde_json_builds_it(text in json_text()) {
            let theirs = serde_json::from_str::<Value>(&text);
            let ours = parse(text.as_bytes());
            // Everything the generator writes is JSON; only a lone surrogate escape (from a
            // random \u) is left to serde_json.
            if theirs.is_ok() {
                prop_assert!(ours.is_some(), "gave up on valid JSON: {}", text);
            }
            agrees(text.as_bytes())?;
        }

        #[test]
        fn mangled_json_is_never_built_differently(
            text in json_text(),
            cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = text.into_bytes();
            for (at, byte) in cuts {
                if bytes.is_empty() {
                    break;
                }
                let at = at.index(bytes.len());
                match byte % 3 {
                    0 => { bytes.remove(at); }
                    1 => bytes.insert(at, byte),
                    _ => bytes[at] = byte,
                }
            }
            agrees(&bytes)?;
        }

        #[test]
        fn arbitrary_bytes_are_never_built_differently(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            agrees(&bytes)?;
        }
    }
}
