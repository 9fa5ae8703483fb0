//! Running one call of the proxy's tools against the store. Arguments and references are
//! checked before any lookup; whatever goes wrong (bad arguments, a ref that is not one, a ref
//! of another tenant or unknown, a bad regular expression, a store that does not answer)
//! becomes a tool result that says so — never content that is not the caller's, never an error
//! to the client.

use std::borrow::Cow;

use serde_json::Value;

use super::{render, ReloadConfig, Tool, ToolNames};
use crate::store::{ContentRef, Store, Tenant};

/// Longest line shown in search results, in characters.
const SEARCH_LINE_CHARS: usize = 300;
/// Longest regular expression program (bytes of compiled automaton) accepted.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Longest search pattern accepted, in characters (a longer one is a tool error).
const MAX_PATTERN_CHARS: usize = 1_000;
/// Longest piece of a model-supplied value (a pattern, a bad ref) repeated in a tool result:
/// the model's own text is never echoed whole into the next request.
const ECHO_CHARS: usize = 120;

/// What a call needs: whose store, which content is in scope, the limits, and a token counter.
pub struct Exec<'a> {
    pub store: &'a dyn Store,
    pub tenant: &'a Tenant,
    /// The references the conversation's forwarded request points to: the scope of a search
    /// without `ref`.
    pub refs: &'a [ContentRef],
    pub names: &'a ToolNames,
    pub config: &'a ReloadConfig,
    pub count: &'a (dyn Fn(&str) -> usize + Send + Sync),
}

/// The result of one call, for the model and for the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The tool message's content.
    pub text: String,
    /// Whether the call did what was asked (false: `text` explains why not).
    pub ok: bool,
    /// Lines of stored content returned (read) or matches found (search).
    pub lines: usize,
}

impl Outcome {
    fn error(text: String) -> Outcome {
        Outcome {
            text: format!("error: {text}"),
            ok: false,
            lines: 0,
        }
    }
}

impl Exec<'_> {
    /// Runs `tool` with `arguments` (the JSON text the model wrote).
    pub async fn run(&self, tool: Tool, arguments: &str) -> Outcome {
        let args: Value = match serde_json::from_str(arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Outcome::error(format!(
                    "the arguments must be a JSON object, e.g. {}",
                    self.example(tool)
                ))
            }
        };
        match tool {
            Tool::Read => self.read(&args).await,
            Tool::Search => self.search(&args).await,
        }
    }

    fn example(&self, tool: Tool) -> String {
        match tool {
            Tool::Read => r#"{"ref":"ctx_…","offset":1,"limit":200}"#.to_string(),
            Tool::Search => r#"{"pattern":"text to find","ref":"ctx_…"}"#.to_string(),
        }
    }

    /// The reference in `args["ref"]`, checked.
    fn reference(&self, args: &Value) -> Result<Option<ContentRef>, Outcome> {
        match args.get("ref") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => ContentRef::parse(s.trim()).map(Some).map_err(|_| {
                Outcome::error(format!(
                    "{:?} is not a reference: references look like ctx_ followed by 24 letters \
                     and digits, as written in the markers",
                    clip(s, ECHO_CHARS)
                ))
            }),
            Some(other) => Err(Outcome::error(format!(
                "\"ref\" must be a string like \"ctx_…\", not {}",
                clip(&other.to_string(), ECHO_CHARS)
            ))),
        }
    }

    /// The stored text behind `r` for this tenant, as the model reads it.
    async fn fetch(&self, r: &ContentRef) -> Result<String, Outcome> {
        match self.store.get_content(self.tenant, r).await {
            Ok(Some(text)) => Ok(render::messages(&text).unwrap_or(text)),
            // Unknown, expired, or another tenant's: the same answer, so nothing leaks.
            Ok(None) => Err(Outcome::error(format!(
                "nothing is stored under {r} for this conversation (unknown or expired reference)"
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "reload: store read failed");
                Err(Outcome::error(
                    "the proxy's store did not answer; try again later".into(),
                ))
            }
        }
    }

    async fn read(&self, args: &Value) -> Outcome {
        let r = match self.reference(args) {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Outcome::error(format!(
                    "\"ref\" is required, e.g. {}",
                    self.example(Tool::Read)
                ))
            }
            Err(e) => return e,
        };
        let offset = match positive(args, "offset", 1) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let limit = match positive(args, "limit", self.config.read_default_lines) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let text = match self.fetch(&r).await {
            Ok(t) => t,
            Err(e) => return e,
        };
        let lines: Vec<&str> = text.lines().collect();
        let total = lines.len();
        if offset > total.max(1) {
            return Outcome::error(format!(
                "offset {offset} is past the end: {r} has {total} lines"
            ));
        }
        let start = offset - 1;
        let wanted_end = start.saturating_add(limit).min(total);
        // Within the token budget of one call: whole lines, at least one (clipped if alone it
        // is over the budget).
        let budget = self.config.read_max_tokens;
        let mut body = String::new();
        let mut used = 0;
        let mut end = start;
        let mut clipped = false;
        while end < wanted_end {
            let line = lines[end];
            let tokens = (self.count)(line) + 1;
            if used + tokens > budget {
                if end == start {
                    let chars = budget.saturating_mul(3);
                    body.push_str(&clip(line, chars));
                    body.push('\n');
                    end += 1;
                    clipped = true;
                }
                break;
            }
            used += tokens;
            body.push_str(line);
            body.push('\n');
            end += 1;
        }
        let mut header = format!(
            "[{} {r}: lines {}–{end} of {total}",
            self.names.read, offset
        );
        if clipped {
            header.push_str(&format!(
                "; line {offset} is longer than one call returns and was clipped"
            ));
        }
        if end < total {
            header.push_str(&format!(
                ". Next: {} {{\"ref\":\"{r}\",\"offset\":{},\"limit\":{limit}}}",
                self.names.read,
                end + 1
            ));
        } else {
            header.push_str(". End of content");
        }
        header.push_str("]\n");
        Outcome {
            text: header + &body,
            ok: true,
            lines: end - start,
        }
    }

    async fn search(&self, args: &Value) -> Outcome {
        let pattern = match args.get("pattern") {
            Some(Value::String(p)) if p.chars().count() > MAX_PATTERN_CHARS => {
                return Outcome::error(format!(
                    "\"pattern\" is longer than {MAX_PATTERN_CHARS} characters: search for a \
                     shorter piece of it"
                ))
            }
            Some(Value::String(p)) if !p.is_empty() => p.as_str(),
            _ => {
                return Outcome::error(format!(
                    "\"pattern\" must be a non-empty string, e.g. {}",
                    self.example(Tool::Search)
                ))
            }
        };
        let matcher = match Matcher::new(pattern) {
            Ok(m) => m,
            Err(e) => return e,
        };
        let scope: Vec<ContentRef> = match self.reference(args) {
            Ok(Some(r)) => vec![r],
            Ok(None) => {
                let mut all = self.refs.to_vec();
                all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
                all.dedup();
                all
            }
            Err(e) => return e,
        };
        if scope.is_empty() {
            return Outcome::error("nothing of this conversation is stored".into());
        }
        let max = self.config.search_max_matches;
        let mut found = 0;
        let mut shown = String::new();
        let mut truncated = false;
        for r in &scope {
            let text = match self.fetch(r).await {
                Ok(t) => t,
                // Searching one ref: say what is wrong with it. Searching all: skip what is gone.
                Err(e) if scope.len() == 1 => return e,
                Err(_) => continue,
            };
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if !matcher.is_match(line) {
                    continue;
                }
                found += 1;
                if found > max {
                    truncated = true;
                    continue;
                }
                if i > 0 {
                    shown.push_str(&format!(
                        "{r}:{}- {}\n",
                        i,
                        clip(lines[i - 1], SEARCH_LINE_CHARS)
                    ));
                }
                shown.push_str(&format!(
                    "{r}:{}: {}\n",
                    i + 1,
                    clip(line, SEARCH_LINE_CHARS)
                ));
                if let Some(next) = lines.get(i + 1) {
                    shown.push_str(&format!(
                        "{r}:{}- {}\n",
                        i + 2,
                        clip(next, SEARCH_LINE_CHARS)
                    ));
                }
            }
        }
        let kind = if matcher.is_regex() {
            "regular expression"
        } else {
            "text"
        };
        let mut header = format!(
            "[{}: {found} matching lines for {kind} {:?} in {} stored item{}",
            self.names.search,
            clip(pattern, ECHO_CHARS),
            scope.len(),
            if scope.len() == 1 { "" } else { "s" }
        );
        if truncated {
            header.push_str(&format!(
                "; the first {max} are shown, narrow the pattern or give a ref"
            ));
        }
        if found > 0 {
            header.push_str(&format!(
                ". Read around a line with {} {{\"ref\":…,\"offset\":…}}",
                self.names.read
            ));
        }
        header.push_str("]\n");
        Outcome {
            text: header + &shown,
            ok: true,
            lines: found.min(max),
        }
    }
}

/// An exact substring, or a regular expression when written `/between slashes/`.
enum Matcher<'a> {
    Text(&'a str),
    Regex(regex::Regex),
}

impl<'a> Matcher<'a> {
    fn new(pattern: &'a str) -> Result<Matcher<'a>, Outcome> {
        let inner = pattern
            .strip_prefix('/')
            .and_then(|p| p.strip_suffix('/'))
            .filter(|p| !p.is_empty());
        match inner {
            None => Ok(Matcher::Text(pattern)),
            Some(expr) => regex::RegexBuilder::new(expr)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map(Matcher::Regex)
                .map_err(|e| {
                    Outcome::error(format!(
                        "/{}/ is not a valid regular expression: {}. Without the slashes the \
                         pattern is searched as exact text",
                        clip(expr, ECHO_CHARS),
                        clip(&first_line(&e.to_string()), ECHO_CHARS)
                    ))
                }),
        }
    }

    fn is_match(&self, line: &str) -> bool {
        match self {
            Matcher::Text(t) => line.contains(t),
            Matcher::Regex(r) => r.is_match(line),
        }
    }

    fn is_regex(&self) -> bool {
        matches!(self, Matcher::Regex(_))
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or(s)
        .to_string()
}

/// A positive integer argument (an integer, or an integer written as a string), or `default`.
fn positive(args: &Value, key: &str, default: usize) -> Result<usize, Outcome> {
    let value = match args.get(key) {
        None | Some(Value::Null) => return Ok(default),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        Some(_) => None,
    };
    match value {
        Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(Outcome::error(format!(
            "\"{key}\" must be a whole number of lines, 1 or more"
        ))),
    }
}

/// `line` cut to `max_chars` characters, with an ellipsis when cut.
fn clip(line: &str, max_chars: usize) -> Cow<'_, str> {
    match line.char_indices().nth(max_chars) {
        None => Cow::Borrowed(line),
        Some((at, _)) => Cow::Owned(format!("{}…", &line[..at])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{self, Backend, ContentKind, SessionId, StoreConfig};
    use std::sync::Arc;

    async fn setup() -> (Arc<dyn Store>, Tenant, Vec<ContentRef>) {
        let cfg = StoreConfig {
            backend: Backend::Memory,
            ..StoreConfig::default()
        };
        let store = store::open(&cfg).await.unwrap();
        let tenant = Tenant::from_api_key(Some("sk-a"));
        let session = SessionId::parse("s").unwrap();
        let text: String = (1..=500)
            .map(|i| format!("line {i}: value={}\n", i * 7))
            .collect();
        let a = store
            .put_content(&tenant, &session, ContentKind::ToolResult, &text)
            .await
            .unwrap();
        let span = [
            r#"{"role":"user","content":"the task"}"#,
            r#"{"role":"assistant","content":"ERROR 42 found in worker 7"}"#,
        ]
        .join("\n");
        let b = store
            .put_content(&tenant, &session, ContentKind::Messages, &span)
            .await
            .unwrap();
        (store, tenant, vec![a, b])
    }

    fn names() -> ToolNames {
        ToolNames {
            read: "context_read".into(),
            search: "context_search".into(),
        }
    }

    fn count(text: &str) -> usize {
        text.len() / 4 + 1
    }

    fn exec<'a>(
        store: &'a Arc<dyn Store>,
        tenant: &'a Tenant,
        refs: &'a [ContentRef],
        names: &'a ToolNames,
        config: &'a ReloadConfig,
    ) -> Exec<'a> {
        Exec {
            store: store.as_ref(),
            tenant,
            refs,
            names,
            config,
            count: &count,
        }
    }

    #[tokio::test]
    async fn read_pages_by_lines_with_a_header() {
        let (store, tenant, refs) = setup().await;
        let (n, cfg) = (names(), ReloadConfig::default());
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let args = format!(r#"{{"ref":"{}","offset":10,"limit":3}}"#, refs[0]);
        let out = e.run(Tool::Read, &args).await;
        assert!(out.ok);
        assert_eq!(out.lines, 3);
        assert_eq!(
            out.text,
            format!(
                "[context_read {r}: lines 10–12 of 500. Next: context_read {{\"ref\":\"{r}\",\"offset\":13,\"limit\":3}}]\nline 10: value=70\nline 11: value=77\nline 12: value=84\n",
                r = refs[0]
            )
        );
        // The last page says so; a read past the end is an error naming the size.
        let last = e
            .run(
                Tool::Read,
                &format!(r#"{{"ref":"{}","offset":499}}"#, refs[0]),
            )
            .await;
        assert!(
            last.text.contains("lines 499–500 of 500. End of content"),
            "{}",
            last.text
        );
        let past = e
            .run(
                Tool::Read,
                &format!(r#"{{"ref":"{}","offset":501}}"#, refs[0]),
            )
            .await;
        assert!(!past.ok);
        assert!(past.text.contains("past the end") && past.text.contains("500 lines"));
    }

    #[tokio::test]
    async fn one_read_stays_within_its_token_budget() {
        let (store, tenant, refs) = setup().await;
        let n = names();
        let cfg = ReloadConfig {
            read_max_tokens: 50,
            ..ReloadConfig::default()
        };
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let out = e
            .run(
                Tool::Read,
                &format!(r#"{{"ref":"{}","limit":400}}"#, refs[0]),
            )
            .await;
        assert!(out.ok);
        assert!(out.lines > 0 && out.lines < 20, "{}", out.lines);
        let body: usize = out.text.lines().skip(1).map(|l| count(l) + 1).sum();
        assert!(body <= 50, "{body}");
        assert!(out.text.contains(&format!("\"offset\":{}", out.lines + 1)));
    }

    #[tokio::test]
    async fn a_moved_out_span_reads_as_messages() {
        let (store, tenant, refs) = setup().await;
        let (n, cfg) = (names(), ReloadConfig::default());
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let out = e
            .run(Tool::Read, &format!(r#"{{"ref":"{}"}}"#, refs[1]))
            .await;
        assert!(out
            .text
            .contains("--- message 2: assistant ---\nERROR 42 found in worker 7\n"));
    }

    #[tokio::test]
    async fn bad_refs_and_arguments_are_tool_errors() {
        let (store, tenant, refs) = setup().await;
        let (n, cfg) = (names(), ReloadConfig::default());
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let cases = [
            ("not json", "arguments must be a JSON object"),
            ("[1]", "arguments must be a JSON object"),
            (r#"{"offset":1}"#, "\"ref\" is required"),
            (r#"{"ref":"../../etc/passwd"}"#, "is not a reference"),
            (r#"{"ref":"/data/x/tool_result.txt"}"#, "is not a reference"),
            (r#"{"ref":42}"#, "must be a string"),
            (
                r#"{"ref":"ctx_aaaaaaaaaaaaaaaaaaaaaaaa"}"#,
                "nothing is stored under",
            ),
        ];
        for (args, wanted) in cases {
            let out = e.run(Tool::Read, args).await;
            assert!(!out.ok, "{args}");
            assert!(out.text.starts_with("error: "), "{args}: {}", out.text);
            assert!(out.text.contains(wanted), "{args}: {}", out.text);
        }
        let zero = e
            .run(
                Tool::Read,
                &format!(r#"{{"ref":"{}","offset":0}}"#, refs[0]),
            )
            .await;
        assert!(zero.text.contains("\"offset\" must be a whole number"));
        // Another tenant's content reads exactly like an unknown ref.
        let other = Tenant::from_api_key(Some("sk-b"));
        let foreign = exec(&store, &other, &refs, &n, &cfg);
        let out = foreign
            .run(Tool::Read, &format!(r#"{{"ref":"{}"}}"#, refs[0]))
            .await;
        assert!(!out.ok);
        assert!(out.text.contains("nothing is stored under"));
        assert!(!out.text.contains("value="));
    }

    #[tokio::test]
    async fn search_finds_text_and_regexes_ordered_by_ref_then_line() {
        let (store, tenant, refs) = setup().await;
        let (n, cfg) = (names(), ReloadConfig::default());
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let out = e.run(Tool::Search, r#"{"pattern":"value=70"}"#).await;
        assert!(out.ok);
        // value=70 (line 10), value=700 (line 100) and value=707 (line 101).
        assert_eq!(out.lines, 3, "{}", out.text);
        assert!(out
            .text
            .contains(&format!("{}:10: line 10: value=70\n", refs[0])));
        assert!(out
            .text
            .contains(&format!("{}:9- line 9: value=63\n", refs[0])));
        let re = e
            .run(Tool::Search, r#"{"pattern":"/ERROR \\d+ found/"}"#)
            .await;
        assert_eq!(re.lines, 1, "{}", re.text);
        assert!(re.text.contains("regular expression"));
        assert!(re
            .text
            .contains(&format!("{}:4: ERROR 42 found in worker 7", refs[1])));
        // Ordered by ref, then line.
        let all = e
            .run(Tool::Search, r#"{"pattern":"/(value=77$|ERROR)/"}"#)
            .await;
        // Match lines are `ref:N: text`; context lines `ref:N- text`.
        let key = |l: &str| -> Option<(String, usize)> {
            let (r, rest) = l.split_once(':')?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            rest[digits.len()..]
                .starts_with(':')
                .then(|| (r.to_string(), digits.parse().unwrap()))
        };
        let order: Vec<&str> = all
            .text
            .lines()
            .skip(1)
            .filter(|l| key(l).is_some())
            .collect();
        assert_eq!(order.len(), 2, "{}", all.text);
        let mut sorted = order.clone();
        sorted.sort_by_key(|l| key(l));
        assert_eq!(order, sorted);
        let bad = e.run(Tool::Search, r#"{"pattern":"/(unclosed/"}"#).await;
        assert!(!bad.ok);
        assert!(
            bad.text.contains("not a valid regular expression"),
            "{}",
            bad.text
        );
    }

    #[tokio::test]
    async fn search_results_are_limited() {
        let (store, tenant, refs) = setup().await;
        let n = names();
        let cfg = ReloadConfig {
            search_max_matches: 5,
            ..ReloadConfig::default()
        };
        let e = exec(&store, &tenant, &refs, &n, &cfg);
        let out = e.run(Tool::Search, r#"{"pattern":"line"}"#).await;
        assert_eq!(out.lines, 5);
        assert!(out.text.contains("500 matching lines") || out.text.contains("matching lines"));
        assert!(out.text.contains("the first 5 are shown"));
        assert_eq!(
            out.text.lines().filter(|l| l.contains(": line ")).count(),
            5
        );
    }
}
