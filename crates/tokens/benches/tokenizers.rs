//! Token counting benchmark: which BPE implementation the proxy counts with, and what the
//! count cache buys on a long conversation.
//!
//! Run with `cargo bench --bench tokenizers`. Plain `std::time` timing, median of several
//! runs; every input is generated here from a fixed seed (no downloads, no files).
//!
//! Part 1 counts the same inputs with `tiktoken-rs` and `bpe-openai` for o200k_base and
//! cl100k_base and checks that both give identical counts (a panic is reported, not fatal).
//! Part 2 checks that time grows linearly on a pathological single-piece input (256 KiB,
//! 1 MiB and 4 MiB of "a"). Part 3 counts a 200-message, ~128k-token conversation with
//! `context_proxy_tokens::Counter`: cold (empty cache), warm (every message cached) and
//! "next turn" (all but the newest message cached).

use std::hint::black_box;
use std::time::{Duration, Instant};

use context_proxy_tokens::{CountSettings, Counter, Encoding};
use serde_json::{json, Value};

fn main() {
    println!("## Token counting\n");
    libraries();
    println!();
    scaling();
    println!();
    counter();
}

// ---------------------------------------------------------------------------------------------
// Part 1: tiktoken-rs vs bpe-openai

fn libraries() {
    let conversation = conversation_text(1 << 20, 0x5eed);
    let base64 = base64_text(1 << 20, 0xb64);
    let a_1m = "a".repeat(1 << 20);
    let spaces = " ".repeat(1 << 20);
    let inputs: [(&str, &str, usize); 4] = [
        ("conversation mix", &conversation, 7),
        ("base64", &base64, 7),
        ("\"a\" x 1 MiB", &a_1m, 7),
        ("\" \" x 1 MiB", &spaces, 7),
    ];

    println!(
        "| input | bytes | encoding | tokens | tiktoken-rs | bpe-openai | speed-up | same count |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---|");
    for encoding in ENCODINGS {
        let (tk, bp) = libs(encoding);
        for (name, text, runs) in inputs {
            // tiktoken-rs unwraps its regex engine's result: see whether it survives the input.
            let tiktoken = survives(|| tk.encode_ordinary(text).len())
                .map(|_| median_time(runs, || tk.encode_ordinary(text).len()));
            let (t_bp, n_bp) = median_time(runs, || bp.count(text));
            let (tk_cell, speedup, same) = match &tiktoken {
                Ok((t_tk, n_tk)) => (
                    fmt_rate(*t_tk, text.len()),
                    format!("{:.1}x", t_tk.as_secs_f64() / t_bp.as_secs_f64()),
                    if *n_tk == n_bp {
                        "yes".to_string()
                    } else {
                        format!("NO (tiktoken-rs {n_tk})")
                    },
                ),
                Err(message) => (
                    format!("panics: {message}"),
                    "—".to_string(),
                    "—".to_string(),
                ),
            };
            println!(
                "| {name} | {} | {} | {n_bp} | {tk_cell} | {} | {speedup} | {same} |",
                text.len(),
                encoding.name(),
                fmt_rate(t_bp, text.len()),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Part 2: linear time on pathological input

/// Time on one run of "a" of growing length: linear time is x4 per step, quadratic x16.
fn scaling() {
    let sizes = [1usize << 18, 1 << 20, 1 << 22];
    println!("Scaling on a single run of \"a\" (median time; in brackets the ratio to the previous size, linear is ~4, quadratic ~16):\n");
    println!("| encoding | library | 256 KiB | 1 MiB | 4 MiB |");
    println!("|---|---|---:|---:|---:|");
    for encoding in ENCODINGS {
        let (tk, bp) = libs(encoding);
        let mut tk_row = Vec::new();
        let mut bp_row = Vec::new();
        for size in sizes {
            let text = "a".repeat(size);
            tk_row.push(
                survives(|| tk.encode_ordinary(&text).len())
                    .map(|_| median_time(5, || tk.encode_ordinary(&text).len()).0),
            );
            bp_row.push(Ok(median_time(7, || bp.count(&text)).0));
        }
        for (library, row) in [("tiktoken-rs", tk_row), ("bpe-openai", bp_row)] {
            let mut cells = Vec::new();
            let mut previous: Option<Duration> = None;
            for time in row {
                cells.push(match (&time, previous) {
                    (Ok(t), Some(p)) => {
                        format!(
                            "{} (x{:.1})",
                            fmt_duration(*t),
                            t.as_secs_f64() / p.as_secs_f64()
                        )
                    }
                    (Ok(t), None) => fmt_duration(*t),
                    (Err(message), _) => format!("panics: {message}"),
                });
                previous = time.ok();
            }
            println!(
                "| {} | {library} | {} |",
                encoding.name(),
                cells.join(" | ")
            );
        }
    }
}

const ENCODINGS: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

fn libs(
    encoding: Encoding,
) -> (
    &'static tiktoken_rs::CoreBPE,
    &'static bpe_openai::Tokenizer,
) {
    match encoding {
        Encoding::O200kBase => (
            tiktoken_rs::o200k_base_singleton(),
            bpe_openai::o200k_base(),
        ),
        Encoding::Cl100kBase => (
            tiktoken_rs::cl100k_base_singleton(),
            bpe_openai::cl100k_base(),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Part 3: the Counter and its cache on a long conversation

fn counter() {
    let body = long_conversation(200, 0xc0de);
    let settings = CountSettings::default();

    let probe = Counter::new(Encoding::O200kBase, settings.clone());
    let count = probe.count_request(&body);
    let bytes = serde_json::to_vec(&body).map(|b| b.len()).unwrap_or(0);
    println!(
        "Counter on a {}-message conversation ({} tokens, {} bytes of JSON), o200k_base:\n",
        count.per_message.len(),
        count.total,
        bytes
    );

    let (cold, n_cold) = median_time(7, || {
        let counter = Counter::new(Encoding::O200kBase, settings.clone());
        counter.count_request(&body).total
    });

    let warm_counter = Counter::new(Encoding::O200kBase, settings.clone());
    warm_counter.count_request(&body);
    let (warm, n_warm) = median_time(51, || warm_counter.count_request(&body).total);

    // The next turn: the client resends the history plus one new message.
    let mut next = body.clone();
    if let Some(messages) = next.get_mut("messages").and_then(Value::as_array_mut) {
        messages.push(json!({"role": "user", "content": conversation_text(2500, 0xfeed)}));
    }
    let (next_turn, n_next) = median_of(51, || {
        // Only the new message misses; a fresh counter per run keeps every run the same.
        let counter = Counter::new(Encoding::O200kBase, settings.clone());
        counter.count_request(&body);
        let start = Instant::now();
        let total = counter.count_request(&next).total;
        (start.elapsed(), total)
    });

    assert_eq!(n_cold, n_warm, "cache changed the count");
    println!("| case | median | tokens |");
    println!("|---|---:|---:|");
    println!("| cold (empty cache) | {} | {n_cold} |", fmt_duration(cold));
    println!(
        "| warm (all 200 messages cached) | {} | {n_warm} |",
        fmt_duration(warm)
    );
    println!(
        "| next turn (200 cached + 1 new message) | {} | {n_next} |",
        fmt_duration(next_turn)
    );
    println!(
        "\nwarm is {:.0}x faster than cold",
        cold.as_secs_f64() / warm.as_secs_f64()
    );
}

/// A tool-using agent's conversation: a system prompt, then rounds of user turn, assistant tool
/// call, tool result and assistant answer, sized so that 200 messages hold ~128k o200k tokens.
fn long_conversation(n: usize, seed: u64) -> Value {
    let mut rng = Rng(seed);
    let mut messages =
        vec![json!({"role": "system", "content": conversation_text(8000, rng.next())})];
    let mut call = 0usize;
    while messages.len() < n {
        let message = match messages.len() % 4 {
            1 => json!({"role": "user", "content": conversation_text(1100, rng.next())}),
            2 => {
                call += 1;
                json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": format!("call_{call:024}"),
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json!({"path": format!("src/module_{call}.rs"), "offset": call * 10}).to_string()}
                }]})
            }
            3 => json!({"role": "tool", "tool_call_id": format!("call_{call:024}"),
                "content": conversation_text(7200, rng.next())}),
            _ => json!({"role": "assistant", "content": conversation_text(1500, rng.next())}),
        };
        messages.push(message);
    }
    json!({"model": "gpt-4o", "messages": messages, "tools": [{
        "type": "function",
        "function": {"name": "read_file", "description": "Read a file of the workspace.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace root."},
                "offset": {"type": "integer", "description": "First line to read."}},
            "required": ["path"]}}
    }]})
}

// ---------------------------------------------------------------------------------------------
// Inputs, all deterministic.

/// Splitmix64: a tiny deterministic generator, so every run sees the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "the",
    "proxy",
    "forwards",
    "every",
    "request",
    "to",
    "an",
    "upstream",
    "model",
    "and",
    "context",
    "window",
    "agent",
    "tool",
    "result",
    "summary",
    "of",
    "older",
    "messages",
    "is",
    "stored",
    "so",
    "nothing",
    "lost",
    "when",
    "conversation",
    "grows",
    "beyond",
    "budget",
    "however",
    "tokenizer",
    "counts",
    "bytes",
    "differently",
    "for",
    "code",
    "JSON",
    "while",
    "English",
    "prose",
    "averages",
    "about",
    "four",
    "characters",
    "per",
    "token",
    "compaction",
    "reversible",
    "reference",
    "opaque",
    "identifier",
    "streaming",
    "latency",
    "millisecond",
    "Kubernetes",
    "PostgreSQL",
    "idempotent",
    "retry",
    "timeout",
    "deadline",
    "2024",
    "3.14159",
    "don't",
    "it's",
    "we'll",
    "they're",
    "O'Brien",
    "naïve",
    "café",
    "résumé",
    "Zürich",
];

const CODE: &[&str] = &[
    "fn count_tokens(text: &str) -> usize {\n    let bpe = o200k_base();\n    bpe.count(text)\n}\n",
    "    for (i, message) in messages.iter().enumerate() {\n        if message.role == Role::Tool && i + 1 < len {\n            total += 3;\n        }\n    }\n",
    "def summarize(messages: list[dict], limit: int = 2000) -> str:\n    \"\"\"Summarize older turns.\"\"\"\n    return \"\\n\".join(m[\"content\"][:limit] for m in messages)\n",
    "const handler = async (req, res) => {\n\tconst body = await req.json();\n\tres.status(200).send({ ok: true, id: body.id ?? null });\n};\n",
    "SELECT id, created_at, payload->>'name' AS name\n  FROM events\n WHERE tenant_id = $1 AND created_at > now() - interval '30 days'\n ORDER BY created_at DESC\n LIMIT 100;\n",
    "#include <stdio.h>\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; ++i) printf(\"%d: %s\\n\", i, argv[i]);\n    return 0;\n}\n",
    "        \n\n\t\t    \r\n",
];

const CJK: &[&str] = &[
    "上下文管理",
    "代理服务器",
    "令牌计数",
    "お誕生日おめでとう",
    "東京都",
    "カタカナ",
    "한국어 텍스트",
    "안녕하세요",
    "中文、日本語、한국어。",
    "「引用」",
    "第三章",
];

const EMOJI: &[&str] = &[
    "😀",
    "🎉",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🇫🇷",
    "🇯🇵",
    "❤️",
    "🧑‍💻",
    "🏳️‍🌈",
    "✅",
    "🚀",
    "🤖",
    "👋🏿",
];

fn prose(rng: &mut Rng, out: &mut String, len: usize) {
    let end = out.len() + len;
    while out.len() < end {
        let words = 6 + rng.below(14);
        for i in 0..words {
            let w = rng.pick(WORDS);
            if i == 0 {
                let mut c = w.chars();
                if let Some(first) = c.next() {
                    out.extend(first.to_uppercase());
                    out.push_str(c.as_str());
                }
            } else {
                out.push(' ');
                out.push_str(w);
            }
        }
        out.push_str(rng.pick(&[". ", "? ", "! ", ".\n", "; ", ", and ", ":\n- "]));
    }
}

fn json_blob(rng: &mut Rng, out: &mut String, len: usize) {
    let end = out.len() + len;
    out.push('[');
    while out.len() < end {
        let id = rng.next() % 100_000;
        let v = json!({
            "id": id,
            "name": format!("{} {}", rng.pick(WORDS), rng.pick(WORDS)),
            "score": (rng.next() % 10_000) as f64 / 100.0,
            "tags": [rng.pick(WORDS), rng.pick(CJK), rng.pick(EMOJI)],
            "nested": {"ok": rng.below(2) == 1, "path": format!("/srv/data/{id}/index.json"), "note": "line\n\t\"quoted\""}
        });
        out.push_str(&v.to_string());
        out.push_str(",\n ");
    }
    out.push_str("{}]");
}

fn cjk_emoji(rng: &mut Rng, out: &mut String, len: usize, emoji_share: usize) {
    let end = out.len() + len;
    while out.len() < end {
        if rng.below(100) < emoji_share {
            out.push_str(rng.pick(EMOJI));
        } else {
            out.push_str(rng.pick(CJK));
        }
        if rng.below(5) == 0 {
            out.push(' ');
        }
    }
}

/// About `target` bytes of chat-like text: English prose, source code, JSON, CJK and emoji in
/// segments of a few hundred bytes, mixed in a fixed pseudo-random order.
fn conversation_text(target: usize, seed: u64) -> String {
    let mut rng = Rng(seed);
    let mut out = String::with_capacity(target + 4096);
    while out.len() < target {
        let len = 200 + rng.below(1800);
        match rng.below(100) {
            0..=39 => prose(&mut rng, &mut out, len),
            40..=64 => {
                let start = out.len();
                while out.len() < start + len {
                    out.push_str(rng.pick(CODE));
                }
            }
            65..=84 => json_blob(&mut rng, &mut out, len),
            85..=94 => cjk_emoji(&mut rng, &mut out, len, 10),
            _ => cjk_emoji(&mut rng, &mut out, len, 90),
        }
        out.push_str("\n\n");
    }
    let mut cut = target.min(out.len());
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out.truncate(cut);
    out
}

/// `target` bytes of standard base64 (with `+`, `/`), encoding pseudo-random bytes.
fn base64_text(target: usize, seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = Rng(seed);
    let mut out = String::with_capacity(target);
    while out.len() < target {
        let word = rng.next();
        // 3 random bytes -> 4 characters, 6 bits each.
        for shift in [18u32, 12, 6, 0] {
            out.push(ALPHABET[((word >> shift) & 63) as usize] as char);
        }
    }
    out.truncate(target);
    out
}

// ---------------------------------------------------------------------------------------------
// Timing helpers

/// Runs `f` once, turning a panic into its message (and keeping the default hook quiet).
fn survives(f: impl FnOnce() -> usize) -> Result<usize, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".to_string())
    })
}

/// Median wall time of `runs` calls of `f` (after one warm-up call) and the last result.
fn median_time(runs: usize, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    median_of(runs, || {
        let start = Instant::now();
        let result = black_box(f());
        (start.elapsed(), result)
    })
}

/// Median of the durations that `f` measures itself, over `runs` calls after one warm-up call.
fn median_of(runs: usize, mut f: impl FnMut() -> (Duration, usize)) -> (Duration, usize) {
    let (_, mut result) = f();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (elapsed, r) = f();
        samples.push(elapsed);
        result = r;
    }
    (median(samples), result)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn fmt_rate(d: Duration, bytes: usize) -> String {
    format!(
        "{} ({:.1} MB/s)",
        fmt_duration(d),
        bytes as f64 / 1e6 / d.as_secs_f64()
    )
}
