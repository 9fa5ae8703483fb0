//! The `gen-traffic` command: generates the sample corpus into a directory and prints what it
//! wrote in one paragraph.

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use crate::{generate_shape, write_dir, CorpusStats, Shape, TrafficConfig};

/// `context-proxy gen-traffic --out DIR [--seed N] [--sessions N] [--max-turns N] [--shape S]`
#[derive(clap::Args, Debug)]
pub struct GenTrafficArgs {
    /// Directory to write `session-<id>.json` files and `index.json` into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed; the same seed and sizes give byte-identical files.
    #[arg(long, default_value_t = TrafficConfig::default().seed)]
    pub seed: u64,
    /// Number of sessions (kinds take turns: coding, research, support).
    #[arg(long, default_value_t = TrafficConfig::default().sessions)]
    pub sessions: usize,
    /// Most requests in one session.
    #[arg(long, default_value_t = TrafficConfig::default().max_turns)]
    pub max_turns: usize,
    /// Longest tool result in bytes.
    #[arg(long, default_value_t = TrafficConfig::default().max_result_bytes)]
    pub max_result_bytes: usize,
    /// `mixed`: coding, research and support sessions taking turns; `support`: support-desk
    /// sessions only (a long fixed policy prompt, 20 tool schemas, 5 to 30 short requests);
    /// `claude-code`: Claude Code sessions on Anthropic Messages (60 requests or more, thinking
    /// signed as the mock upstream signs it);
    /// `codex`: coding sessions on the Responses API as Codex CLI sends them (`store: false`,
    /// the whole input every turn, encrypted reasoning, `shell` calls, `apply_patch` custom
    /// calls, 40 requests and more).
    #[arg(long, value_enum, default_value_t = Shape::Mixed)]
    pub shape: Shape,
    /// `claude-code`: every session on this model (e.g. `claude-sonnet-5-5`, which binds
    /// thinking to the prefix; replay then feeds each answer's thinking back into the
    /// session's later requests); other shapes ignore it.
    #[arg(long)]
    pub model: Option<String>,
}

impl GenTrafficArgs {
    pub fn config(&self) -> TrafficConfig {
        TrafficConfig {
            seed: self.seed,
            sessions: self.sessions,
            max_turns: self.max_turns,
            max_result_bytes: self.max_result_bytes,
            model: self.model.clone(),
        }
    }
}

/// Human-readable byte count.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KB", "MB", "GB"];
    let mut unit = 0;
    let mut scaled = n * 10;
    while scaled >= 10_240 && unit + 1 < UNITS.len() {
        scaled /= 1024;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{}.{} {}", scaled / 10, scaled % 10, UNITS[unit])
    }
}

/// The one-paragraph summary `run` prints.
pub fn summary(stats: &CorpusStats, out: &std::path::Path, gen_ms: u128, write_ms: u128) -> String {
    let kinds: Vec<String> = stats
        .kinds
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    let histogram: Vec<String> = stats
        .tool_result_sizes
        .iter()
        .map(|b| match b.below {
            Some(below) => format!("<{}: {}", bytes(below as u64), b.count),
            None => format!("≥{}: {}", bytes(b.min as u64), b.count),
        })
        .collect();
    format!(
        "Wrote {} sessions ({}) to {}: {} requests (longest session {}), {} messages, {} tool results \
         from {} to {} (median {}; {}). Stored {} ({} as sent without a proxy; largest request {}). \
         Generated in {} ms, written in {} ms.",
        stats.sessions,
        kinds.join(", "),
        out.display(),
        stats.requests,
        stats.longest_session_requests,
        stats.messages,
        stats.tool_results,
        bytes(stats.smallest_tool_result_bytes as u64),
        bytes(stats.largest_tool_result_bytes as u64),
        bytes(stats.median_tool_result_bytes as u64),
        histogram.join(", "),
        bytes(stats.stored_bytes),
        bytes(stats.request_bytes),
        bytes(stats.largest_request_bytes as u64),
        gen_ms,
        write_ms,
    )
}

/// Generates the corpus `args` describe (thinking blocks signed by `sign`), writes it to
/// `args.out`, and prints a summary.
pub fn run(args: GenTrafficArgs, sign: crate::claude_code::Signer<'_>) -> io::Result<()> {
    let cfg = args.config();
    let started = Instant::now();
    let sessions = generate_shape(&cfg, args.shape, sign);
    let generated = started.elapsed();
    let index = write_dir(&args.out, &cfg, &sessions)?;
    let written = started.elapsed() - generated;
    println!(
        "{}",
        summary(
            &index.stats,
            &args.out,
            generated.as_millis(),
            written.as_millis()
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KB");
        assert_eq!(bytes(300 * 1024), "300.0 KB");
        assert_eq!(bytes(28 * 1024 * 1024 + 512 * 1024), "28.5 MB");
    }
}
