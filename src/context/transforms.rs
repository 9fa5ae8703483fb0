//! Lossless transforms of a tool result: what carries no information goes, what the model reads
//! stays. Pure and deterministic: the same text always gives the same bytes, so the prompt
//! cache keeps hitting; the engine stores the original byte-exact under its reference.
//!
//! - **JSON minification**: a result that is one whole JSON document is re-emitted without
//!   insignificant whitespace. Strings (escapes included), numbers (their exact text) and key
//!   order are copied byte for byte: the document is validated with `serde_json`, never
//!   re-serialized.
//! - **Repeated lines**: a run of identical non-blank lines (at least [`MIN_RUN`]) becomes the
//!   line once and a count marker.
//!
//! Measured on the sample traffic before adding more (see BENCHMARKS.md): trailing whitespace,
//! ANSI colour codes and CRLF line ends do not occur in it, so no transform is spent on them.

/// Shortest run of identical lines collapsed.
pub const MIN_RUN: usize = 4;

/// What [`lossless`] made of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lossless {
    pub text: String,
    /// Whitespace was removed from a JSON document.
    pub minified: bool,
    /// Runs of repeated lines collapsed.
    pub deduped: usize,
}

/// The lossless form of a tool result, or `None` when no transform changes it.
pub fn lossless(text: &str) -> Option<Lossless> {
    if let Some(min) = minify_json(text) {
        return Some(Lossless {
            text: min,
            minified: true,
            deduped: 0,
        });
    }
    collapse_repeats(text).map(|(text, runs)| Lossless {
        text,
        minified: false,
        deduped: runs,
    })
}

fn is_json_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// `text` without the whitespace between JSON tokens, when the whole of it is one JSON object
/// or array and there is whitespace to remove.
pub fn minify_json(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let first = bytes.iter().copied().find(|b| !is_json_space(*b))?;
    if first != b'{' && first != b'[' {
        return None;
    }
    // Cheap exit before validating: nothing outside strings to remove is common (compact JSON).
    if !bytes.iter().any(|b| is_json_space(*b)) {
        return None;
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !is_json_space(b) {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
    if out.len() == bytes.len() {
        return None;
    }
    // Only ASCII whitespace was removed between tokens: still UTF-8.
    String::from_utf8(out).ok()
}

/// The marker standing for `n` more copies of the line above it.
fn repeat_marker(n: usize) -> String {
    format!("[previous line repeated {n} more times]")
}

/// `text` with every run of at least [`MIN_RUN`] identical non-blank lines written once and
/// followed by a count marker (when that is shorter); `None` when there is no such run. Line ends are kept as they
/// are.
pub fn collapse_repeats(text: &str) -> Option<(String, usize)> {
    let body = |p: &str| -> usize { p.strip_suffix('\n').map_or(p.len(), str::len) };
    // Most results have no run: find the first before copying anything.
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut runs = 0;
    let mut pieces = text.split_inclusive('\n').peekable();
    let mut at = 0;
    while let Some(first) = pieces.next() {
        let current = &first[..body(first)];
        let mut count = 1;
        let mut last = first;
        while let Some(next) = pieces.next_if(|p| &p[..body(p)] == current) {
            count += 1;
            last = next;
        }
        let run_end = at
            + first.len()
            + (count - 1) * (current.len() + 1) // every piece but the last ends with '\n'
            - usize::from(count > 1 && !last.ends_with('\n'));
        let marker = repeat_marker(count - 1);
        let shorter = (count - 1) * (current.len() + 1) > marker.len() + 1;
        if count >= MIN_RUN && shorter && !current.trim().is_empty() {
            let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
            o.push_str(&text[copied..at]);
            o.push_str(current);
            o.push('\n');
            o.push_str(&marker);
            if last.ends_with('\n') {
                o.push('\n');
            }
            copied = run_end;
            runs += 1;
        }
        at = run_end;
    }
    let mut out = out?;
    out.push_str(&text[copied..]);
    Some((out, runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minify_keeps_strings_numbers_and_key_order() {
        let text = "{\n  \"z\": 1.50,\n  \"a\": \"two  words\\n \\\" \\u00e9\",\n  \"n\": [ 1e3 , -0.0, 12345678901234567890 ],\n  \"t\": \"tab\\there\"\n}\n";
        let min = minify_json(text).unwrap();
        assert_eq!(
            min,
            "{\"z\":1.50,\"a\":\"two  words\\n \\\" \\u00e9\",\"n\":[1e3,-0.0,12345678901234567890],\"t\":\"tab\\there\"}"
        );
        let a: serde_json::Value = serde_json::from_str(text).unwrap();
        let b: serde_json::Value = serde_json::from_str(&min).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn minify_only_whole_json_documents() {
        assert_eq!(minify_json("{\"a\": 1} trailing"), None);
        assert_eq!(minify_json("result: {\"a\": 1}"), None);
        assert_eq!(minify_json("\"just a string\""), None);
        assert_eq!(minify_json("{\"a\":1}"), None, "already compact");
        assert_eq!(minify_json("{\"a\": }"), None, "invalid");
        assert_eq!(minify_json(" [1, 2] \n").as_deref(), Some("[1,2]"));
    }

    #[test]
    fn repeated_lines_collapse_with_a_count() {
        let text = "start\nwarn: retry\nwarn: retry\nwarn: retry\nwarn: retry\nwarn: retry\nend\n";
        let (out, runs) = collapse_repeats(text).unwrap();
        assert_eq!(
            out,
            "start\nwarn: retry\n[previous line repeated 4 more times]\nend\n"
        );
        assert_eq!(runs, 1);
        // At the very end without a newline, and CRLF kept.
        let line = "error: connection refused (retrying)\r\n";
        let (out, _) = collapse_repeats(&format!("{}end", line.repeat(5))).unwrap();
        assert_eq!(
            out,
            format!("{line}[previous line repeated 4 more times]\nend")
        );
        // Not when the marker is longer than the run.
        assert_eq!(collapse_repeats("ok\nok\nok\nok\n"), None);
        // Short runs and blank lines stay.
        assert_eq!(collapse_repeats("x\nx\nx\n\n\n\n\n\ny\n"), None);
    }

    #[test]
    fn lossless_prefers_json_then_lines() {
        assert!(lossless("{\n \"a\": 1\n}").unwrap().minified);
        let l = lossless(&"the same line again\n".repeat(6)).unwrap();
        assert_eq!((l.minified, l.deduped), (false, 1));
        assert_eq!(lossless("plain text"), None);
    }
}
