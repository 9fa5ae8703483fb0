//! Summaries of moved-out spans, the pure part: the `[context.summarizer]` settings, the
//! summarizer's prompt and input (the previous summary plus the newly covered span in its
//! compacted form, within the summarizer's own budget), the tolerant reading of its answer, and
//! the one message that stands for the span in the conversation. No I/O, no clock.
//!
//! The answer is plain text in a fixed layout (`## Task overview` … `## Context to preserve`),
//! so it works on providers that reject forced `tool_choice` or `response_format`; headings may
//! come at any level, in bold, in any case or order; a summary without a task overview and at
//! least two other sections is malformed.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::adapter::Adapter;
use super::markers::{self, Readback};
use crate::store::ContentRef;
use crate::tokens::Encoding;

/// `[context.summarizer]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SummarizerConfig {
    /// Write summaries of moved-out spans (`auto` and `compress` modes).
    pub enabled: bool,
    /// The summarizer's model; unset: the request's own model.
    pub model: Option<String>,
    /// The name of a configured upstream (with its own key) serving the summarizer; unset:
    /// the request's upstream, with the client's own credentials.
    pub upstream: Option<String>,
    /// Longest summary, in tokens (`max_tokens` of the summarizer's request).
    pub max_summary_tokens: usize,
    /// Longest input of one summarizer call, in tokens (the previous summary, the new span,
    /// the prompt): within the summarizer model's window.
    pub max_input_tokens: usize,
    /// Longest a summarizer call may take (and a request blocks on one), in milliseconds.
    pub timeout_ms: u64,
    /// Added to the summarizer's instructions.
    pub instructions: Option<String>,
    /// Soft watermark, as a share of the request's budget: above it (after compaction) the
    /// next span's summary is computed in the background while the request goes on as it is.
    pub soft_ratio: f64,
    /// A boundary move is summarized only when it frees at least this many tokens.
    pub min_freed_tokens: usize,
    /// Background summaries waiting to run, at most.
    pub queue_capacity: usize,
    /// Summarizer calls running at once, at most.
    pub concurrency: usize,
    /// After a failure, the same span is not tried again for this long (doubling up to 32×).
    pub retry_backoff_ms: u64,
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        SummarizerConfig {
            enabled: false,
            model: None,
            upstream: None,
            max_summary_tokens: 1_500,
            max_input_tokens: 24_000,
            timeout_ms: 30_000,
            instructions: None,
            soft_ratio: 0.7,
            min_freed_tokens: 4_000,
            queue_capacity: 64,
            concurrency: 2,
            retry_backoff_ms: 30_000,
        }
    }
}

impl SummarizerConfig {
    /// Checks the ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.soft_ratio > 0.0 && self.soft_ratio <= 1.0) {
            return Err(format!(
                "context.summarizer.soft_ratio must be above 0 and at most 1, not {}",
                self.soft_ratio
            ));
        }
        for (name, v) in [
            ("max_summary_tokens", self.max_summary_tokens),
            ("queue_capacity", self.queue_capacity),
            ("concurrency", self.concurrency),
            ("timeout_ms", self.timeout_ms as usize),
        ] {
            if v == 0 {
                return Err(format!("context.summarizer.{name} must be above 0"));
            }
        }
        if self.max_input_tokens < 2 * self.max_summary_tokens + 1_000 {
            return Err(format!(
                "context.summarizer.max_input_tokens must be at least 2 × max_summary_tokens + 1000 ({})",
                2 * self.max_summary_tokens + 1_000
            ));
        }
        Ok(())
    }
}

/// The sections of a summary, in order.
pub const SECTIONS: [&str; 5] = [
    "Task overview",
    "Current state",
    "Important discoveries",
    "Next steps",
    "Context to preserve",
];

/// The first words of the summarizer's system prompt: what makes its requests recognisable.
pub const PROMPT_OPENING: &str = "You are the context summarizer of context-proxy.";

/// The summarizer's system prompt.
pub fn system_prompt(instructions: Option<&str>) -> String {
    let mut p = format!(
        "{PROMPT_OPENING} An agent's conversation is too long for its model; older messages are moved \
out of its context and replaced by your summary, from which the agent must continue its work \
without losing anything it needs. Write a structured continuation summary in plain text with \
exactly these five sections, each starting with its heading on a line of its own:\n\n\
## Task overview\nThe user's request, its success criteria and constraints.\n\n\
## Current state\nWhat is done so far; the files, paths, ids and artefacts involved.\n\n\
## Important discoveries\nDecisions taken and why, errors met and how they were fixed, approaches that failed.\n\n\
## Next steps\nWhat remains to be done, in order.\n\n\
## Context to preserve\nUser preferences, promises made, anything the agent must not forget.\n\n\
Copy identifiers, paths, numbers, commands and error text verbatim. References such as ctx_… \
name stored originals the agent can read back: keep the ones that matter. When a previous \
summary is given, merge the new messages into it (keep what still holds, update what changed) \
and write one complete summary. Answer with the summary only, no preamble."
    );
    if let Some(extra) = instructions.filter(|s| !s.trim().is_empty()) {
        p.push_str("\n\n");
        p.push_str(extra.trim());
    }
    p
}

/// The user message of a summarizer call.
pub fn user_prompt(previous: Option<&str>, span: &str) -> String {
    match previous {
        Some(prev) => format!(
            "Previous summary:\n\n{prev}\n\nMessages since then:\n\n{span}\n\nWrite the updated summary."
        ),
        None => format!("Messages to summarize:\n\n{span}\n\nWrite the summary."),
    }
}

/// The body of one summarizer request.
pub fn request_body(
    model: &str,
    max_summary_tokens: usize,
    instructions: Option<&str>,
    previous: Option<&str>,
    span: &str,
) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system_prompt(instructions)},
            {"role": "user", "content": user_prompt(previous, span)},
        ],
        "max_tokens": max_summary_tokens,
        "temperature": 0,
        "stream": false,
    })
}

/// The items of a span as the summarizer reads them (each read by `adapter`): one block per
/// item, texts over `per_message_tokens` in their compacted form (preview and reference), the
/// whole within `max_tokens` (the per-item allowance halves until it fits; at worst the text
/// is cut, the originals staying readable by reference). `count` counts tokens of a text.
pub fn render_span(
    adapter: &dyn Adapter,
    messages: &[Value],
    per_message_tokens: usize,
    max_tokens: usize,
    count: &dyn Fn(&str) -> usize,
) -> String {
    let mut allowance = per_message_tokens.max(1);
    loop {
        let text = render_with(adapter, messages, allowance, count);
        let tokens = count(&text);
        if tokens <= max_tokens {
            return text;
        }
        if allowance <= 100 {
            // Keep the head within the budget (about 3 characters per token to be safe).
            let mut cut = max_tokens.saturating_mul(3).min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return format!("{}\n[… cut to fit the summarizer's input]", &text[..cut]);
        }
        allowance /= 2;
    }
}

fn render_with(
    adapter: &dyn Adapter,
    messages: &[Value],
    allowance: usize,
    count: &dyn Fn(&str) -> usize,
) -> String {
    let mut out = String::new();
    for m in messages {
        let item = adapter.readable(m);
        let text = item.text.map(|t| t.into_owned()).unwrap_or_default();
        let tokens = count(&text);
        let shown = if tokens > allowance {
            let reference = ContentRef::of(&text);
            markers::compacted(&text, tokens, &reference, 8, 4, &Readback::default())
        } else {
            text
        };
        out.push_str(&format!("[{}]", item.who));
        if let Some(id) = item.answers {
            out.push_str(&format!(" (result of {id})"));
        }
        out.push('\n');
        if !shown.is_empty() {
            out.push_str(&shown);
            out.push('\n');
        }
        for call in &item.calls {
            out.push_str(&format!("call {call}\n"));
        }
        out.push('\n');
    }
    out
}

/// The canonical key of a heading line, if it names one of [`SECTIONS`].
fn section_of(line: &str) -> Option<usize> {
    let t = line
        .trim()
        .trim_start_matches('#')
        .trim()
        .trim_matches('*')
        .trim_matches('_')
        .trim()
        .trim_end_matches(':')
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.' || c == ')')
        .trim()
        .to_ascii_lowercase();
    SECTIONS.iter().position(|s| t == s.to_ascii_lowercase())
}

/// Reads a summarizer's answer tolerantly: any heading level, bold, numbering, case, order,
/// a code fence around it. Gives the summary in the canonical layout, or `None` when it is
/// malformed (no task overview, fewer than three sections, or nothing in them).
pub fn parse(answer: &str) -> Option<String> {
    let mut bodies: [Option<String>; 5] = Default::default();
    let mut current: Option<usize> = None;
    for line in answer.lines() {
        if line.trim_start().starts_with("```") {
            continue;
        }
        if let Some(s) = section_of(line) {
            current = Some(s);
            bodies[s].get_or_insert_with(String::new);
            continue;
        }
        if let Some(s) = current {
            let body = bodies[s].get_or_insert_with(String::new);
            body.push_str(line.trim_end());
            body.push('\n');
        }
    }
    let present = bodies.iter().filter(|b| b.is_some()).count();
    let substance: usize = bodies
        .iter()
        .flatten()
        .map(|b| b.trim().len())
        .sum::<usize>();
    if bodies[0].is_none() || present < 3 || substance == 0 {
        return None;
    }
    let mut out = String::new();
    for (name, body) in SECTIONS.iter().zip(bodies.iter()) {
        let body = body.as_deref().map(str::trim).filter(|b| !b.is_empty());
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!("## {name}\n{}", body.unwrap_or("(none)")));
    }
    Some(out)
}

/// The text of the one message standing for a moved-out span: the marker naming the stored
/// originals, then the summary.
pub fn message_text(marker: &str, summary: &str) -> String {
    format!("{marker}\n\nSummary of the messages moved out:\n\n{summary}")
}

/// The line that ends a summary cut at its budget.
pub const CUT_NOTE: &str =
    "\n\n[… summary cut at its budget: context.summarizer.max_summary_tokens]";

/// `summary` within `max_tokens` (in `encoding`): as it is when it fits, else its head cut so
/// that it and [`CUT_NOTE`] fit. A summarizer may ignore its `max_tokens`; what is remembered
/// and injected never exceeds the budget.
pub fn bounded(summary: &str, max_tokens: usize, encoding: Encoding) -> std::borrow::Cow<'_, str> {
    if encoding.count(summary) <= max_tokens {
        return std::borrow::Cow::Borrowed(summary);
    }
    let room = max_tokens.saturating_sub(encoding.count(CUT_NOTE));
    let head = encoding.truncate(summary, room).trim_end();
    std::borrow::Cow::Owned(format!("{head}{CUT_NOTE}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_over_its_budget_is_cut_and_says_so() {
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(bounded(GOOD, 1_000, encoding), GOOD);
            let long = format!("{GOOD}\n{}", "more detail, ".repeat(50_000));
            let cut = bounded(&long, 300, encoding);
            assert!(encoding.count(&cut) <= 300, "{}", encoding.count(&cut));
            assert!(encoding.count(&cut) >= 290, "{}", encoding.count(&cut));
            assert!(cut.starts_with("## Task overview\nFix the build."));
            assert!(cut.ends_with(CUT_NOTE));
        }
    }

    const GOOD: &str = "## Task overview\nFix the build.\n\n## Current state\nEdited src/a.rs.\n\n\
## Important discoveries\nerror[E0308] fixed.\n\n## Next steps\nRun tests.\n\n## Context to preserve\nUse tabs.";

    #[test]
    fn a_canonical_summary_reads_back_as_itself() {
        assert_eq!(parse(GOOD).as_deref(), Some(GOOD));
    }

    #[test]
    fn headings_are_read_tolerantly() {
        let loose = "Here you go:\n```\n# 1. TASK OVERVIEW:\nFix it\n**Next steps**\n- test\n### current state\ndone\n```";
        let got = parse(loose).unwrap();
        assert!(got.starts_with("## Task overview\nFix it\n\n## Current state\ndone"));
        assert!(got.contains("## Important discoveries\n(none)"));
        assert!(got.contains("## Next steps\n- test"));
    }

    #[test]
    fn garbage_is_malformed() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("I cannot help with that."), None);
        assert_eq!(
            parse("## Next steps\na\n## Current state\nb\n## Context to preserve\nc"),
            None
        );
        assert_eq!(
            parse("## Task overview\n## Current state\n## Next steps\n"),
            None
        );
    }

    #[test]
    fn the_span_is_compacted_and_bounded() {
        let count = |s: &str| s.len() / 4;
        let big = "line\n".repeat(4_000);
        let msgs = vec![
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\":\"a.rs\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": big}),
        ];
        let text = render_span(&crate::context::adapter::Chat, &msgs, 500, 100_000, &count);
        assert!(text.contains("call c1 read({\"p\":\"a.rs\"})"));
        assert!(text.contains(ContentRef::of(&big).as_str()));
        assert!(count(&text) < 1_000);
        let tight = render_span(&crate::context::adapter::Chat, &msgs, 500, 50, &count);
        assert!(count(&tight) <= 60, "{}", count(&tight));
    }

    #[test]
    fn the_prompt_is_recognisable_and_takes_extra_instructions() {
        let body = request_body("m", 100, Some("Be brief."), Some("old"), "span");
        let sys = body["messages"][0]["content"].as_str().unwrap();
        assert!(sys.starts_with(PROMPT_OPENING) && sys.ends_with("Be brief."));
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(user.contains("Previous summary:\n\nold") && user.contains("span"));
    }
}
