//! The research agent: answers questions on one topic by searching the web, fetching pages (a
//! few KB to hundreds of KB of text, several in parallel), saving notes, and writing cited
//! reports; follow-up questions extend the same session.
//!
//! A page fetched twice returns the same text, as a real cache-less fetch of a static page would.

use serde_json::json;

use super::chat::{ToolCall, Transcript};
use super::prose;
use super::records::{self, Hit};
use super::rng::{Rng, SizeClass};
use super::words::{self, put};

/// Models a research agent is run with.
pub const MODELS: &[&str] = &["gpt-4o", "gpt-4.1", "gpt-4o-mini"];

/// Sizes of fetched pages in bytes.
const PAGE_SIZES: &[SizeClass] = &[
    (40, 1_500, 8_000),
    (40, 8_000, 30_000),
    (17, 30_000, 100_000),
    (3, 100_000, 360_000),
];

struct Desk {
    topic: &'static str,
    hits: Vec<Hit>,
    fetched: Vec<(String, String)>,
    cited: Vec<String>,
    notes: usize,
}

impl Desk {
    fn search(&mut self, rng: &mut Rng) -> ToolCall {
        let query = format!(
            "{} {} {}",
            self.topic,
            words::word(rng),
            rng.pick(&["2024", "data", "cost", "study", "review", "统计", "vs"])
        );
        let n = rng.between(5, 10);
        let (text, hits) = records::search_results(rng, &query, n);
        self.hits.extend(hits);
        let args = if rng.chance(40) {
            json!({"query": query, "max_results": n})
        } else {
            json!({"query": query})
        };
        ToolCall::new("search_web", args, text)
    }

    fn fetch(&mut self, rng: &mut Rng) -> ToolCall {
        if self.hits.is_empty() && self.fetched.is_empty() {
            return self.search(rng);
        }
        let refetch = !self.fetched.is_empty() && rng.chance(6);
        let hit = if refetch || self.hits.is_empty() {
            None
        } else {
            Some(
                self.hits
                    .swap_remove(rng.below(self.hits.len() as u64) as usize),
            )
        };
        let Some(hit) = hit else {
            let (url, text) = rng.pick_ref(&self.fetched).clone();
            return ToolCall::new("fetch_url", json!({"url": url}), text);
        };
        let text = match rng.weighted(&[92, 3, 2, 2, 1]) {
            0 => {
                let target = rng.size(PAGE_SIZES);
                prose::web_page(rng, &hit.url, &hit.title, target)
            }
            1 => "Error: HTTP 403 Forbidden".to_string(),
            2 => "Error: request timed out after 30s".to_string(),
            3 => "Error: HTTP 404 Not Found".to_string(),
            _ => format!(
                "URL: {}\n\nPlease enable JavaScript to view this page.\n",
                hit.url
            ),
        };
        if text.len() > 200 {
            self.cited.push(hit.url.clone());
        }
        self.fetched.push((hit.url.clone(), text.clone()));
        ToolCall::new("fetch_url", json!({"url": hit.url}), text)
    }

    fn note(&mut self, rng: &mut Rng) -> ToolCall {
        self.notes += 1;
        let mut text = prose::paragraph(rng);
        if let Some(url) = self.cited.last() {
            put!(&mut text, " (source: {url})");
        }
        let result = match rng.below(3) {
            0 => "ok".to_string(),
            1 => format!("Saved note #{}", self.notes),
            _ => "saved".to_string(),
        };
        ToolCall::new(
            "save_note",
            json!({"title": prose::heading(rng), "text": text}),
            result,
        )
    }
}

fn system_prompt(rng: &mut Rng) -> String {
    format!(
        "You are a meticulous research assistant. Today is {}.\n\nWork like this:\n1. Search the web for several independent, recent sources.\n2. Fetch and read the most relevant pages in full before relying on them; fetch several at once when you can.\n3. Save short notes of key facts with their source as you go.\n4. Answer in markdown with headings, concise bullet points and numbered citations [n] that map to a Sources list.\n5. Say clearly when sources disagree or when evidence is thin. Never invent a citation.\n\nAnswer in the language the user writes in.",
        words::Instant::random(rng).date()
    )
}

fn question(rng: &mut Rng, phrase: &str) -> String {
    match rng.below(6) {
        0 => {
            format!("What is the current state of {phrase}? I need a short briefing with sources.")
        }
        1 => format!("How has {phrase} changed since 2015, and what are the main drivers?"),
        2 => format!(
            "Compare the leading approaches to {phrase} and put the key numbers in a table."
        ),
        3 => format!("请帮我调研一下{phrase}的最新进展，并列出主要来源。"),
        4 => format!(
            "I'm writing a report on {phrase}. {} What do the best sources say?",
            prose::sentence(rng)
        ),
        _ => format!("Find the most cited studies about {phrase} and summarize their findings."),
    }
}

/// A follow-up question, and whether answering it needs new research.
fn follow_up(rng: &mut Rng, phrase: &str) -> (String, bool) {
    match rng.below(7) {
        0 => ("Can you put that in a table?".to_string(), false),
        1 => (
            format!("What about {} specifically?", rng.pick(words::CITIES)),
            true,
        ),
        2 => ("Summarize that in three bullet points.".to_string(), false),
        3 => (
            "Which of these sources is the most reliable, and why?".to_string(),
            false,
        ),
        4 => ("thanks!".to_string(), false),
        5 => (
            format!(
                "Now look into how {phrase} affects {}.",
                rng.pick(words::WORDS)
            ),
            true,
        ),
        _ => (question(rng, phrase), true),
    }
}

/// Writes a research session of exactly `requests` requests into `t`.
pub fn run(rng: &mut Rng, t: &mut Transcript, requests: usize) {
    let (topic, phrase) = rng.pick(words::TOPICS);
    let mut desk = Desk {
        topic,
        hits: Vec::new(),
        fetched: Vec::new(),
        cited: Vec::new(),
        notes: 0,
    };
    t.system(system_prompt(rng));
    let mut first = true;
    while t.requests() < requests {
        let (text, research) = if first {
            (question(rng, phrase), true)
        } else {
            follow_up(rng, phrase)
        };
        first = false;
        let chinese = !text.is_ascii();
        if rng.chance(8) {
            t.user_parts(vec![text, prose::paragraph(rng)]);
        } else {
            t.user(text);
        }
        let left = requests - t.requests() - 1;
        let steps = if research {
            rng.size(&[(25, 1, 3), (50, 3, 10), (25, 10, 30)]).min(left)
        } else {
            0
        };
        desk.cited.clear();
        for s in 0..steps {
            let calls = match rng.weighted(&[
                if s == 0 || desk.hits.is_empty() {
                    60
                } else {
                    18
                },
                64,
                12,
            ]) {
                0 => vec![desk.search(rng)],
                1 => {
                    let n = if rng.chance(40) { rng.between(2, 3) } else { 1 };
                    (0..n).map(|_| desk.fetch(rng)).collect()
                }
                _ => vec![desk.note(rng)],
            };
            let text = if rng.chance(10) {
                Some(prose::sentence(rng))
            } else {
                None
            };
            t.act(rng, text, calls);
        }
        let target = rng.log_uniform(400, 8_000);
        let mut answer = prose::report(rng, phrase, &desk.cited, target);
        if chinese {
            answer = format!(
                "{}\n\n{}\n\n{answer}",
                prose::cjk_paragraph(rng),
                prose::cjk_paragraph(rng)
            );
        }
        t.reply(answer);
    }
}
