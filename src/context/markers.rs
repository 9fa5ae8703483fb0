//! What the model sees in place of removed content: previews, head-and-tail cuts, and the
//! marker lines that say how much was removed and how to read it back. Pure text functions;
//! the same input always gives the same bytes (the upstream's prompt cache depends on it).

use crate::store::ContentRef;

/// How the markers of one request tell the model to read removed content back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readback {
    /// Through the proxy's tools, offered in this request under these names.
    Tools { read: String, search: String },
    /// The tools are not offered in this request (`tool_choice: "none"`, `n > 1`, reload
    /// disabled): the markers only say where the content is kept.
    Stored,
}

impl Default for Readback {
    fn default() -> Readback {
        Readback::Tools {
            read: "context_read".into(),
            search: "context_search".into(),
        }
    }
}

impl Readback {
    /// The sentence after "stored as <ref>." telling how to read it back.
    fn how(&self, reference: &ContentRef, limit: usize, what: &str) -> String {
        match self {
            Readback::Tools { read, search } => format!(
                " Call {read} {{\"ref\":\"{reference}\",\"offset\":1,\"limit\":{limit}}} to read {what}, \
                 or {search} {{\"pattern\":\"…\",\"ref\":\"{reference}\"}} to find something in it."
            ),
            Readback::Stored => " The context proxy keeps it; it cannot be read back in this request.".into(),
        }
    }
}

/// Longest line kept in a preview, in characters.
const PREVIEW_LINE_CHARS: usize = 200;

/// `text` cut to `max_chars` characters, with an ellipsis when cut.
fn clip_line(line: &str, max_chars: usize) -> String {
    match line.char_indices().nth(max_chars) {
        None => line.to_string(),
        Some((at, _)) => format!("{}…", &line[..at]),
    }
}

/// A compacted tool result: a marker, then the first and last lines of the original.
pub fn compacted(
    text: &str,
    tokens: usize,
    reference: &ContentRef,
    head: usize,
    tail: usize,
    readback: &Readback,
) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    let mut out = format!(
        "[context-proxy: tool result compacted: {tokens} tokens, {total} lines, stored as {reference}.{}]\n",
        readback.how(reference, 200, "its lines")
    );
    if total <= head + tail {
        for line in &lines {
            out.push_str(&clip_line(line, PREVIEW_LINE_CHARS));
            out.push('\n');
        }
    } else {
        for line in &lines[..head] {
            out.push_str(&clip_line(line, PREVIEW_LINE_CHARS));
            out.push('\n');
        }
        out.push_str(&format!(
            "[… lines {}–{} not shown …]\n",
            head + 1,
            total - tail
        ));
        for line in &lines[total - tail..] {
            out.push_str(&clip_line(line, PREVIEW_LINE_CHARS));
            out.push('\n');
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// A text over the hard cap: its head and tail inline, with a marker between them. `tokens` is
/// the whole text's count; `keep_tokens` roughly how many to keep (2/3 head, 1/3 tail).
pub fn truncated(
    text: &str,
    tokens: usize,
    keep_tokens: usize,
    reference: &ContentRef,
    readback: &Readback,
) -> String {
    let (head, tail) = head_and_tail(text, tokens, keep_tokens);
    let omitted_lines = text[head.len()..text.len() - tail.len()].lines().count();
    let total_lines = text.lines().count();
    format!(
        "{head}\n[context-proxy: truncated: {tokens} tokens in all, about {} tokens ({omitted_lines} of {total_lines} lines) \
         cut here; the whole text is stored as {reference}.{}]\n{tail}",
        tokens.saturating_sub(keep_tokens),
        readback.how(reference, 200, "it by lines"),
    )
}

/// The head and tail of `text` holding about `keep_tokens` tokens together. Cuts by the
/// text's own characters-per-token ratio, at a line break when one is near.
fn head_and_tail(text: &str, tokens: usize, keep_tokens: usize) -> (&str, &str) {
    let chars = text.chars().count();
    let per_token = chars as f64 / tokens.max(1) as f64;
    let head_chars = ((keep_tokens * 2 / 3) as f64 * per_token) as usize;
    let tail_chars = ((keep_tokens / 3) as f64 * per_token) as usize;
    let head_end = snap_back(text, char_to_byte(text, head_chars));
    let tail_start =
        snap_forward(text, char_to_byte(text, chars.saturating_sub(tail_chars))).max(head_end);
    (&text[..head_end], &text[tail_start..])
}

fn char_to_byte(text: &str, chars: usize) -> usize {
    text.char_indices()
        .nth(chars)
        .map_or(text.len(), |(i, _)| i)
}

/// Moves a cut back to just after a line break within the last fifth before it.
fn snap_back(text: &str, at: usize) -> usize {
    let from = floor_char_boundary(text, at - at / 5);
    match text[from..at].rfind('\n') {
        Some(i) => from + i + 1,
        None => at,
    }
}

/// Moves a cut forward to just after a line break within the next fifth after it.
fn snap_forward(text: &str, at: usize) -> usize {
    let window = (text.len() - at) / 5;
    let end = floor_char_boundary(text, at + window);
    match text[at..end].find('\n') {
        Some(i) => at + i + 1,
        None => at,
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The one message standing for a run of older messages moved to the store.
pub fn offloaded(
    messages: usize,
    tokens: usize,
    reference: &ContentRef,
    readback: &Readback,
) -> String {
    format!(
        "[context-proxy: {messages} earlier messages ({tokens} tokens) were moved out of the context to keep it \
         within budget. They are stored as {reference}.{}]",
        readback.how(reference, 50, "them as messages")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> ContentRef {
        ContentRef::of("x")
    }

    #[test]
    fn compacted_shows_head_tail_and_ref() {
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        let out = compacted(&text, 500, &r(), 3, 2, &Readback::default());
        assert!(out.contains(r().as_str()));
        assert!(
            out.contains("line 1\nline 2\nline 3\n[… lines 4–98 not shown …]\nline 99\nline 100")
        );
        assert!(!out.contains("line 50\n"));
    }

    #[test]
    fn short_texts_keep_every_line_and_long_lines_are_clipped() {
        let long = "é".repeat(500);
        let out = compacted(
            &format!("a\n{long}\nb"),
            500,
            &r(),
            3,
            2,
            &Readback::default(),
        );
        assert!(out.ends_with("b"));
        assert!(out.contains(&format!("{}…", "é".repeat(PREVIEW_LINE_CHARS))));
    }

    #[test]
    fn truncated_keeps_head_and_tail_on_char_boundaries() {
        for text in [
            "日本語のテキスト\n".repeat(2000),
            "a".repeat(50_000),
            "x\n".repeat(30_000),
        ] {
            let out = truncated(&text, 40_000, 1000, &r(), &Readback::default());
            assert!(
                out.len() < text.len() / 5,
                "{} of {}",
                out.len(),
                text.len()
            );
            let (head, rest) = out.split_once("\n[context-proxy: truncated").unwrap();
            assert!(text.starts_with(head));
            let tail = rest.split_once(".]\n").unwrap().1;
            assert!(text.ends_with(tail));
            assert!(!head.is_empty() && !tail.is_empty());
        }
    }

    #[test]
    fn markers_name_the_tools_offered_or_say_they_are_not() {
        let text: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        let renamed = Readback::Tools {
            read: "proxy_context_read".into(),
            search: "context_search".into(),
        };
        let out = compacted(&text, 500, &r(), 3, 2, &renamed);
        assert!(out.contains("Call proxy_context_read {"), "{out}");
        let out = offloaded(3, 900, &r(), &Readback::Stored);
        assert!(
            !out.contains("context_read") && !out.contains("context_search"),
            "{out}"
        );
        assert!(
            out.contains(r().as_str()) && out.contains("cannot be read back"),
            "{out}"
        );
        let out = truncated(&"a".repeat(50_000), 40_000, 1000, &r(), &Readback::Stored);
        assert!(!out.contains("context_read"), "{out}");
    }
}
