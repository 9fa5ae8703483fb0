//! `context-proxy probe`: a fidelity probe. It plants needle facts (an id, a number, a path, an
//! error line) deep inside tool outputs of sample sessions, drives each session through the
//! proxy, and at the end asks for every needle (`Recall the needles: …`).
//!
//! Against the mock upstream in reader mode (`mock-upstream --reader`), which answers only from
//! what its request shows or what it fetches with `context_search`, it measures reachability:
//! every needle should be answerable whatever the proxy compacted or moved out. Against a real
//! model it measures recall; `--compare-off` sends the same sessions with `x-context-mode: off`
//! as the baseline. The report gives every needle's result and the input tokens of each run.
//!
//! `--codex` plants them in Codex-shaped sessions on the Responses API instead (the largest
//! `function_call_output` of each): the requests go to `/v1/responses` as Codex sends them, and
//! the reader reads the stored outputs back with the proxy's `context_read`.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::{json, Value};

use context_proxy_corpus::{Session, Wire};
use context_proxy_mock::reader::{needle_line, QUESTION};
use context_proxy_tokens::{CountSettings, Counter, Encoding};
use context_proxy_traffic::TrafficConfig;

/// Options of the `probe` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct ProbeArgs {
    /// Base URL of the proxy, e.g. http://127.0.0.1:8080/v1.
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// Sample sessions to plant needles in (those with a tool output seen before the last
    /// request get four needles each).
    #[arg(long, default_value_t = 6)]
    pub sessions: usize,
    /// Seed of the sample sessions.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Model name sent in the requests (the sample traffic's by default).
    #[arg(long)]
    pub model: Option<String>,
    /// Also send the same sessions with `x-context-mode: off` and compare.
    #[arg(long)]
    pub compare_off: bool,
    /// Codex-shaped sessions on the Responses API (`POST /v1/responses`) instead of chat
    /// completions.
    #[arg(long)]
    pub codex: bool,
    /// API key sent as `Authorization: Bearer`.
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        default_value = "sk-probe",
        hide_env_values = true
    )]
    pub api_key: String,
    /// Write the report as JSON here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// One planted fact.
#[derive(Debug, Clone, Serialize)]
pub struct Needle {
    pub session: String,
    pub kind: &'static str,
    pub key: String,
    pub value: String,
}

/// What the model answered for one needle.
#[derive(Debug, Clone, Serialize)]
pub struct NeedleResult {
    pub key: String,
    pub kind: &'static str,
    pub expected: String,
    pub answered: Option<String>,
    pub found: bool,
}

/// One run of the probe.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeRun {
    /// `managed` or `off`.
    pub mode: String,
    pub needles: Vec<NeedleResult>,
    pub found: usize,
    pub recall: f64,
    pub requests: usize,
    /// Requests the proxy rewrote (`x-context-tokens-after` below `-before`).
    pub rewritten: usize,
    /// Input tokens forwarded (the proxy's header, else counted here).
    pub input_tokens: usize,
    /// Rounds of the proxy's own tools.
    pub reload_rounds: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the question got {0}")]
    Status(u16),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The sample sessions the probe uses.
pub fn sample_sessions(count: usize, seed: u64) -> Vec<Session> {
    context_proxy_traffic::generate(&TrafficConfig {
        seed,
        sessions: count,
        max_turns: 16,
        max_result_bytes: 80_000,
        model: None,
    })
}

/// Codex-shaped sample sessions on the Responses API (40 requests and more each).
pub fn sample_codex_sessions(count: usize, seed: u64) -> Vec<Session> {
    let cfg = TrafficConfig {
        seed,
        sessions: count,
        max_turns: 40,
        max_result_bytes: 80_000,
        model: None,
    };
    (0..count)
        .map(|i| context_proxy_traffic::generate_codex_session(&cfg, i))
        .collect()
}

/// Where a session's message `m` holds a tool's output as text: a chat `tool` message's
/// `content`, a Responses output item's `output`.
fn output_field(s: &Session, m: usize) -> Option<&'static str> {
    let message = &s.messages[m];
    let (field, is_output) = match s.wire {
        Wire::Responses => (
            "output",
            message["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("_call_output")),
        ),
        _ => ("content", message["role"] == "tool"),
    };
    (is_output && message[field].is_string()).then_some(field)
}

/// Plants four needles in the middle of the largest tool output of each session that the model
/// has seen before the last request (so the proxy may compact it).
pub fn plant(sessions: &mut [Session]) -> Vec<Needle> {
    let mut needles = Vec::new();
    for (i, s) in sessions.iter_mut().enumerate() {
        let seen = s.request_ends[s.request_ends.len().saturating_sub(2)];
        let Some((target, field)) = (0..seen)
            .filter_map(|m| Some((m, output_field(s, m)?)))
            .max_by_key(|&(m, field)| s.messages[m][field].as_str().map_or(0, str::len))
        else {
            continue;
        };
        let planted = [
            (
                "id",
                format!("s{i}_id"),
                format!("req-{:08x}", 0x5eed_0000u32 + i as u32 * 7919),
            ),
            (
                "number",
                format!("s{i}_num"),
                format!("{}", 48_213 + i * 1_009),
            ),
            (
                "path",
                format!("s{i}_path"),
                format!("/srv/app/conf/shard-{i}.toml"),
            ),
            (
                "error",
                format!("s{i}_err"),
                format!("error[E0425]:unresolved-name-{i}-at-src/lib.rs:{}", 100 + i),
            ),
        ];
        let Some(Value::String(content)) = s.messages[target].get_mut(field) else {
            continue;
        };
        let middle = content[..content.len() / 2]
            .rfind('\n')
            .map_or(0, |n| n + 1);
        let lines: String = planted
            .iter()
            .map(|(_, k, v)| needle_line(k, v) + "\n")
            .collect();
        content.insert_str(middle, &lines);
        for (kind, key, value) in planted {
            needles.push(Needle {
                session: s.id.clone(),
                kind,
                key,
                value,
            });
        }
    }
    needles
}

/// Drives every session through `url` and asks for its needles.
pub async fn probe(
    client: &reqwest::Client,
    url: &str,
    api_key: &str,
    sessions: &[Session],
    needles: &[Needle],
    off: bool,
    model: Option<&str>,
) -> Result<ProbeRun, ProbeError> {
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let mode = if off { "off" } else { "managed" };
    let run = format!("probe-{}-{mode}-", std::process::id());
    let mut results = Vec::new();
    let (mut requests, mut rewritten, mut input_tokens, mut reload_rounds) = (0, 0, 0, 0);
    for s in sessions {
        let mut bodies: Vec<Value> = s.requests().collect();
        let last = s.request_count() - 1;
        let mut question = s.request(last);
        let keys: Vec<&Needle> = needles.iter().filter(|n| n.session == s.id).collect();
        let list: Vec<&str> = keys.iter().map(|n| n.key.as_str()).collect();
        let ask = json!({"role": "user", "content": format!("{QUESTION} {}", list.join(", "))});
        if let Some(messages) = question["messages"].as_array_mut() {
            messages.extend(s.reply(last).cloned());
            messages.push(ask);
        } else if let Some(input) = question["input"].as_array_mut() {
            input.extend(said(&s.messages[s.request_ends[last]..]).iter().cloned());
            input.push(ask);
        }
        if let Some(o) = question.as_object_mut() {
            o.remove("stream");
            o.remove("stream_options");
        }
        bodies.push(question);
        let mut answer = String::new();
        for (k, mut body) in bodies.into_iter().enumerate() {
            if let Some(model) = model {
                body["model"] = json!(model);
            }
            let mut request = client
                .post(url)
                .header("authorization", format!("Bearer {api_key}"))
                .header(
                    context_proxy_contract::SESSION_HEADER,
                    format!("{run}{}", s.id),
                )
                .json(&body);
            if off {
                request = request.header(context_proxy_contract::MODE_HEADER, "off");
            }
            let resp = request.send().await?;
            let status = resp.status().as_u16();
            let header = |name: &str| -> Option<usize> {
                resp.headers().get(name)?.to_str().ok()?.parse().ok()
            };
            let (before, after) = (
                header(context_proxy_contract::TOKENS_BEFORE_HEADER),
                header(context_proxy_contract::TOKENS_AFTER_HEADER),
            );
            reload_rounds += crate::replay::send::reload_rounds(resp.headers());
            if let (Some(b), Some(a)) = (before, after) {
                rewritten += usize::from(a < b);
            }
            input_tokens += after.unwrap_or_else(|| counter.count_request(&body).total);
            requests += 1;
            let bytes = resp.bytes().await?;
            if k == s.request_count() {
                if !(200..300).contains(&status) {
                    return Err(ProbeError::Status(status));
                }
                let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                answer = answer_text(&v);
            }
        }
        for n in keys {
            let answered = answer.lines().find_map(|l| {
                let (k, v) = l.trim().split_once('=')?;
                (k.trim() == n.key).then(|| v.trim().to_string())
            });
            let found = answered.as_deref() == Some(n.value.as_str())
                || (answered.is_none() && answer.contains(&n.value));
            results.push(NeedleResult {
                key: n.key.clone(),
                kind: n.kind,
                expected: n.value.clone(),
                answered,
                found,
            });
        }
    }
    let found = results.iter().filter(|r| r.found).count();
    Ok(ProbeRun {
        mode: mode.into(),
        recall: if results.is_empty() {
            0.0
        } else {
            found as f64 / results.len() as f64
        },
        found,
        needles: results,
        requests,
        rewritten,
        input_tokens,
        reload_rounds,
    })
}

/// The items of a Responses answer a recall question can follow: its reasoning and text up to
/// its last message, none of its calls (their outputs are not in the session).
fn said(answer: &[Value]) -> &[Value] {
    let before_calls = answer
        .iter()
        .take_while(|i| matches!(i["type"].as_str(), Some("reasoning" | "message")))
        .count();
    let end = answer[..before_calls]
        .iter()
        .rposition(|i| i["type"] == "message")
        .map_or(0, |at| at + 1);
    &answer[..end]
}

/// The text of an answer: a chat completion's message, a Responses answer's message items.
fn answer_text(v: &Value) -> String {
    if let Some(text) = v["choices"][0]["message"]["content"].as_str() {
        return text.to_string();
    }
    v["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().into_iter().flatten())
        .filter_map(|part| part["text"].as_str())
        .collect()
}

/// The URL the probe's sessions go to: chat completions, or the Responses API for Codex's.
pub fn url_for(target: &str, sessions: &[Session]) -> String {
    let chat = crate::replay::chat_url(target);
    if sessions.iter().any(|s| s.wire == Wire::Responses) {
        crate::replay::send::url_for(&chat, crate::replay::source::Api::Responses)
    } else {
        chat
    }
}

/// Runs the probe (and the `off` baseline when asked), prints and writes the report.
pub async fn run(args: ProbeArgs) -> Result<(), ProbeError> {
    let mut sessions = if args.codex {
        sample_codex_sessions(args.sessions, args.seed)
    } else {
        sample_sessions(args.sessions, args.seed)
    };
    let needles = plant(&mut sessions);
    let client = reqwest::Client::new();
    let url = url_for(&args.target, &sessions);
    let mut runs = vec![
        probe(
            &client,
            &url,
            &args.api_key,
            &sessions,
            &needles,
            false,
            args.model.as_deref(),
        )
        .await?,
    ];
    if args.compare_off {
        runs.push(
            probe(
                &client,
                &url,
                &args.api_key,
                &sessions,
                &needles,
                true,
                args.model.as_deref(),
            )
            .await?,
        );
    }
    for run in &runs {
        println!(
            "{:<8} {}/{} needles ({:.0}%), {} requests ({} rewritten), {} input tokens, {} reload rounds",
            run.mode,
            run.found,
            run.needles.len(),
            run.recall * 1e2,
            run.requests,
            run.rewritten,
            run.input_tokens,
            run.reload_rounds
        );
        for n in &run.needles {
            println!(
                "  {} {:<10} {:<7} expected {:<48} answered {}",
                if n.found { "ok  " } else { "MISS" },
                n.key,
                n.kind,
                n.expected,
                n.answered.as_deref().unwrap_or("-")
            );
        }
    }
    if let Some(path) = &args.out {
        let mut bytes = serde_json::to_vec_pretty(&runs).unwrap_or_default();
        bytes.push(b'\n');
        std::fs::write(path, bytes).map_err(|source| ProbeError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}
