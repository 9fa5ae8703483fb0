//! Resident memory of the BPE tables: how much loading each encoding adds to a process.
//!
//! Run with `cargo run --release --example tokenizer_memory` (Linux: reads /proc/self/status).
//! The figures are quoted in BENCHMARKS.md ("Memory").

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    use context_proxy_tokens::Encoding;
    let mut last = rss_kib();
    println!("| step | RSS MiB | added MiB |\n|---|---:|---:|");
    println!("| start | {:.1} | |", last as f64 / 1024.0);
    let mut step = |name: &str, count: usize| {
        let now = rss_kib();
        println!(
            "| {name} ({count} tokens) | {:.1} | {:+.1} |",
            now as f64 / 1024.0,
            (now as f64 - last as f64) / 1024.0
        );
        last = now;
    };
    step(
        "bpe-openai o200k_base",
        Encoding::O200kBase.count("hello world"),
    );
    step(
        "bpe-openai cl100k_base",
        Encoding::Cl100kBase.count("hello world"),
    );
    let Ok(t) = tiktoken_rs::o200k_base() else {
        return;
    };
    step(
        "tiktoken-rs o200k_base",
        t.encode_ordinary("hello world").len(),
    );
}
