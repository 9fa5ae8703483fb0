//! Natural-language text: sentences, paragraphs, web pages as a fetch tool returns them
//! (markdown-ish text with navigation, headings, lists, tables, CJK and emoji paragraphs), and the
//! research agent's written reports.

use super::rng::Rng;
use super::words::{self, put, Instant};

/// A noun phrase: determiner, optional adjective, noun.
fn noun_phrase(rng: &mut Rng) -> String {
    let noun = rng.pick(words::PROSE_NOUNS);
    let adjective = if rng.chance(40) {
        Some(rng.pick(words::PROSE_ADJECTIVES))
    } else {
        None
    };
    let head = match adjective {
        Some(a) => format!("{a} {noun}"),
        None => noun.to_string(),
    };
    match rng.below(6) {
        0 => format!("{} {head}", words::article(&head)),
        1 => format!("this {head}"),
        2 => format!("each {head}"),
        3 => words::plural(&head),
        _ => format!("the {head}"),
    }
}

/// One English sentence built from a small grammar, with figures now and then.
pub fn sentence(rng: &mut Rng) -> String {
    let s = match rng.below(9) {
        0 => format!(
            "{}, {} {} {} {} {}.",
            rng.pick(words::OPENERS),
            noun_phrase(rng),
            words::past(rng.pick(words::PROSE_VERBS)),
            noun_phrase(rng),
            rng.pick(words::PREPOSITIONS),
            noun_phrase(rng)
        ),
        1 => {
            let from = rng.between(1995, 2020);
            format!(
                "the {} of {} {} by {}% between {from} and {}.",
                rng.pick(words::NOUNS),
                words::plural(rng.pick(words::PROSE_NOUNS)),
                rng.pick(&["increased", "fell", "rose", "declined", "grew"]),
                rng.between(2, 90),
                from + rng.between(1, 5)
            )
        }
        2 => format!(
            "according to {}, {} {} {} {} {} {}.",
            words::person(rng),
            words::plural(rng.pick(words::PROSE_NOUNS)),
            rng.pick(&["could", "may", "will", "should", "rarely", "often"]),
            rng.pick(words::PROSE_VERBS),
            noun_phrase(rng),
            rng.pick(words::PREPOSITIONS),
            noun_phrase(rng)
        ),
        3 => format!(
            "{} {} {} {}, which {} {}.",
            noun_phrase(rng),
            rng.pick(words::PREPOSITIONS),
            noun_phrase(rng),
            rng.pick(&[
                "matters",
                "varies widely",
                "remains uncertain",
                "is still debated",
                "was expected"
            ]),
            words::third_person(rng.pick(words::PROSE_VERBS)),
            noun_phrase(rng)
        ),
        4 => format!(
            "{} {} about {} {} a year, roughly {} as many as in {}.",
            noun_phrase(rng),
            rng.pick(&["handles", "serves", "produces", "reports", "loses"]),
            rng.log_uniform(10, 5_000_000),
            words::plural(rng.pick(words::PROSE_NOUNS)),
            rng.pick(&["twice", "three times", "half", "a third"]),
            rng.between(1990, 2022)
        ),
        5 => format!(
            "most {} {} {} when the {} is {}.",
            words::plural(rng.pick(words::PROSE_NOUNS)),
            rng.pick(words::PROSE_VERBS),
            noun_phrase(rng),
            rng.pick(words::PROSE_NOUNS),
            rng.pick(words::PROSE_ADJECTIVES)
        ),
        6 => format!(
            "{} {} {}, but {} {} {}.",
            noun_phrase(rng),
            words::third_person(rng.pick(words::PROSE_VERBS)),
            noun_phrase(rng),
            noun_phrase(rng),
            rng.pick(&["does not", "cannot", "did not", "will not"]),
            rng.pick(words::PROSE_VERBS)
        ),
        7 => format!(
            "{} {} {} {} {} {}.",
            noun_phrase(rng),
            words::third_person(rng.pick(words::PROSE_VERBS)),
            noun_phrase(rng),
            rng.pick(words::PREPOSITIONS),
            noun_phrase(rng),
            rng.pick(&[
                "",
                "in practice",
                "at scale",
                "by a wide margin",
                "over time"
            ])
        )
        .replace(" .", "."),
        _ => format!(
            "{}, {} {} {}.",
            rng.pick(words::OPENERS),
            noun_phrase(rng),
            words::third_person(rng.pick(words::PROSE_VERBS)),
            noun_phrase(rng)
        ),
    };
    words::capitalize(&s)
}

/// `n` sentences joined by spaces.
pub fn sentences(rng: &mut Rng, n: usize) -> String {
    let mut p = String::new();
    for i in 0..n {
        if i > 0 {
            p.push(' ');
        }
        p.push_str(&sentence(rng));
    }
    p
}

/// An English paragraph of 2 to 7 sentences.
pub fn paragraph(rng: &mut Rng) -> String {
    let n = rng.between(2, 7);
    sentences(rng, n)
}

/// A paragraph of 2 to 6 Chinese, Japanese or Korean sentences.
pub fn cjk_paragraph(rng: &mut Rng) -> String {
    let n = rng.between(2, 6);
    (0..n).map(|_| rng.pick(words::CJK)).collect()
}

/// A short, chatty paragraph sprinkled with emoji.
pub fn emoji_paragraph(rng: &mut Rng) -> String {
    let n = rng.between(1, 3);
    let mut p = String::new();
    for _ in 0..n {
        p.push_str(rng.pick(words::EMOJI));
        p.push(' ');
        p.push_str(&sentence(rng));
        p.push(' ');
    }
    p.push_str(rng.pick(words::EMOJI));
    p
}

/// A heading of 2 to 6 capitalized words.
pub fn heading(rng: &mut Rng) -> String {
    let n = rng.between(2, 6);
    let parts: Vec<String> = (0..n)
        .map(|_| words::capitalize(words::word(rng)))
        .collect();
    parts.join(" ")
}

/// A markdown table of `rows` rows with a header, figures in all but the first column.
pub fn table(rng: &mut Rng, rows: usize) -> String {
    let cols = rng.between(3, 6);
    let mut t = String::from("|");
    for c in 0..cols {
        if c == 0 {
            t.push_str(" Item |");
        } else {
            put!(&mut t, " {} |", words::capitalize(words::word(rng)));
        }
    }
    t.push_str("\n|");
    for _ in 0..cols {
        t.push_str("---|");
    }
    for _ in 0..rows {
        put!(
            &mut t,
            "\n| {} {} |",
            words::capitalize(words::word(rng)),
            words::word(rng)
        );
        for _ in 1..cols {
            if rng.chance(15) {
                t.push_str(" — |");
            } else {
                put!(&mut t, " {}.{} |", rng.between(0, 999), rng.below(100));
            }
        }
    }
    t
}

/// A bullet (or numbered) list of 3 to 9 items.
pub fn list(rng: &mut Rng) -> String {
    let n = rng.between(3, 9);
    let numbered = rng.chance(30);
    let mut l = String::new();
    for i in 0..n {
        if numbered {
            put!(&mut l, "{}. ", i + 1);
        } else {
            l.push_str("- ");
        }
        if rng.chance(40) {
            put!(&mut l, "**{}**: ", words::capitalize(words::word(rng)));
        }
        l.push_str(&sentence(rng));
        l.push('\n');
    }
    l.pop();
    l
}

/// The text of a fetched web page of about `target` bytes: navigation, title, byline, sections
/// of prose, lists and tables, and a footer, as a fetch tool's HTML-to-text conversion yields.
pub fn web_page(rng: &mut Rng, url: &str, title: &str, target: usize) -> String {
    let cjk_heavy = url.contains("zh.") || url.contains("nikkei") || rng.chance(8);
    let mut page = String::with_capacity(target + 2048);
    put!(&mut page, "URL: {url}\n\n");
    if rng.chance(60) {
        page.push_str(
            "Skip to main content\n\nHome | News | Topics | Data | About | Subscribe\n\n",
        );
    }
    put!(&mut page, "# {title}\n\n");
    let published = Instant::random(rng);
    put!(
        &mut page,
        "By {} · Published {} · {} min read\n\n",
        words::person(rng),
        published.date(),
        rng.between(3, 25)
    );
    let mut section = 0;
    while page.len() < target {
        if section > 0 || rng.chance(50) {
            put!(&mut page, "## {}\n\n", heading(rng));
        }
        section += 1;
        for _ in 0..rng.between(1, 5) {
            let block = match rng.weighted(&[60, 12, 8, if cjk_heavy { 30 } else { 3 }, 3, 4]) {
                0 => paragraph(rng),
                1 => list(rng),
                2 => {
                    let rows = rng.between(3, 14);
                    table(rng, rows)
                }
                3 => cjk_paragraph(rng),
                4 => emoji_paragraph(rng),
                _ => format!("> {}", sentences(rng, 2)),
            };
            page.push_str(&block);
            page.push_str("\n\n");
            if page.len() >= target {
                break;
            }
        }
    }
    if rng.chance(50) {
        page.push_str("Related articles\n");
        for _ in 0..rng.between(3, 6) {
            put!(&mut page, "- {}\n", heading(rng));
        }
        page.push('\n');
    }
    page.push_str("© 2025 All rights reserved. Privacy · Terms · Cookie settings\n");
    page
}

/// A research report in markdown of about `target` bytes, citing `sources` as [n].
pub fn report(rng: &mut Rng, question: &str, sources: &[String], target: usize) -> String {
    let mut r = String::with_capacity(target + 1024);
    put!(
        &mut r,
        "## {}\n\n",
        words::capitalize(question.trim_end_matches('?'))
    );
    r.push_str(&paragraph(rng));
    r.push_str("\n\n### Key findings\n\n");
    let mut n = 0;
    while r.len() < target {
        n += 1;
        put!(&mut r, "- **{}**: {}", heading(rng), sentence(rng));
        if !sources.is_empty() {
            put!(&mut r, " [{}]", rng.below(sources.len() as u64) + 1);
        }
        r.push('\n');
        if n % 4 == 0 {
            put!(&mut r, "\n{}\n\n", paragraph(rng));
        }
        if n == 6 && rng.chance(40) {
            put!(&mut r, "\n{}\n\n", table(rng, 5));
        }
    }
    if !sources.is_empty() {
        r.push_str("\n### Sources\n\n");
        for (i, s) in sources.iter().enumerate() {
            put!(&mut r, "[{}] {}\n", i + 1, s);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_pages_reach_their_target_size() {
        let mut rng = Rng::new(3);
        for target in [200, 5_000, 120_000] {
            let page = web_page(&mut rng, "https://zh.wikipedia.org/wiki/x", "储能", target);
            assert!(page.len() >= target, "{} < {target}", page.len());
            assert!(page.len() < target + 8_000);
            assert!(page.starts_with("URL: https://"));
        }
    }

    #[test]
    fn sentences_end_with_a_period_and_start_upper_case() {
        let mut rng = Rng::new(4);
        for _ in 0..50 {
            let s = sentence(&mut rng);
            assert!(s.ends_with('.'));
            assert!(s.starts_with(|c: char| c.is_uppercase()), "{s}");
        }
    }

    #[test]
    fn tables_have_a_header_and_rows() {
        let mut rng = Rng::new(5);
        let t = table(&mut rng, 4);
        assert_eq!(t.lines().count(), 6);
        assert!(t.lines().nth(1).is_some_and(|l| l.starts_with("|---|")));
    }
}
