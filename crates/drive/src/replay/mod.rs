//! `context-proxy replay`: sends recorded or sample traffic again, to the proxy (and with
//! `--compare` directly to the upstream too), and reports latency, tokens, prefix stability and
//! the effective input cost under prompt caching with and without the proxy.
//!
//! - `source.rs` — what to send: a recording, a corpus directory, or JSONL bodies, as sessions;
//! - `send.rs` — sending: sessions in parallel, each in order, on an open-loop schedule;
//! - `cost.rs` — prefix stability and the cost under prompt caching (the price table);
//! - `report.rs` — the numbers, the table and the JSON;
//! - `chart.rs` — the SVG chart.
//!
//! What the upstream received through the proxy is read from the mock upstream
//! (`GET /_mock/received`, `--mock URL`); with `--spawn` the replay starts the mock and the proxy
//! itself as child processes, so the benchmark is one command.

pub mod chart;
pub mod cost;
pub mod live;
pub mod report;
pub mod send;
pub mod source;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use context_proxy_pricing::CachePricing;
use context_proxy_tokens::{CountSettings, Counter, Encoding};
use cost::{Pricing, SummarizerCalls};
use report::{report, BilledSide, Report, Side, UsageCache};
use send::{drive, DriveOptions};
use source::Session;

/// Options of the `replay` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A recording (file or directory), a corpus directory (`gen-traffic --out`), or a JSONL
    /// file of request bodies with a `session` field.
    pub path: PathBuf,
    /// Base URL of the proxy (or any OpenAI-compatible server), e.g. http://127.0.0.1:8080/v1.
    #[arg(long, value_name = "URL", required_unless_present = "spawn")]
    pub target: Option<String>,
    /// Sessions replayed at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Requests per second over all sessions, on an open-loop schedule (default: as fast as
    /// the answers come).
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Sessions to send: fewer than the traffic has, or more (the traffic is repeated).
    #[arg(long, value_name = "K")]
    pub sessions: Option<usize>,
    /// Keep a recording's own timing, sped up X times.
    #[arg(long, value_name = "X")]
    pub speed: Option<f64>,
    /// With --speed: the longest wait between two requests of a session, in seconds (a longer
    /// gap in the recording is cut to it; prompt caches expire within minutes anyway).
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub max_gap: f64,
    /// Stop starting requests after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Also replay the same traffic directly to the upstream (`--upstream`, or the spawned
    /// mock) and compare.
    #[arg(long)]
    pub compare: bool,
    /// The upstream's base URL, for `--compare`.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// The mock upstream's address (e.g. http://127.0.0.1:8081), to read what it received.
    #[arg(long, value_name = "URL")]
    pub mock: Option<String>,
    /// Start the mock upstream and the proxy as child processes and replay through them.
    #[arg(long)]
    pub spawn: bool,
    /// Config file of the spawned proxy.
    #[arg(long, value_name = "FILE", default_value = "/dev/null")]
    pub proxy_config: PathBuf,
    /// The spawned mock's fixed latency (time to first token), in ms.
    #[arg(long, default_value_t = 0)]
    pub mock_latency_ms: u64,
    /// The spawned mock's extra latency per input token, in µs.
    #[arg(long, default_value_t = 0)]
    pub mock_latency_per_token_us: u64,
    /// API key sent as `Authorization: Bearer`.
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        default_value = "sk-replay",
        hide_env_values = true
    )]
    pub api_key: String,
    /// The provider whose prices the per-turn chart uses.
    #[arg(long, default_value = "openai-gpt4o")]
    pub provider: String,
    /// A custom price row: cached tokens' price as a share of the full price.
    #[arg(long, value_name = "SHARE")]
    pub cached_rate: Option<f64>,
    /// The custom row's cache-write premium (share of the full price, e.g. 0.25).
    #[arg(long, value_name = "SHARE", default_value_t = 0.0)]
    pub write_premium: f64,
    /// The custom row's shortest cached prefix, in tokens.
    #[arg(long, default_value_t = 0)]
    pub min_prefix: usize,
    /// Write the report as JSON here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Draw the chart (SVG) here.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read the traffic: {0}")]
    Source(std::io::Error),
    #[error("no requests to replay")]
    Empty,
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot read what the mock received: {0}")]
    Mock(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("--compare needs --upstream URL (or --spawn)")]
    NoUpstream,
    #[error("{0} must be a positive number")]
    NotPositive(&'static str),
    #[error("no request got an answer from {0}: is anything listening there?")]
    NoAnswer(String),
    #[error("unknown provider {0:?} ({names}, or custom with --cached-rate)", names = context_proxy_pricing::PRESET_NAMES)]
    Provider(String),
}

/// `…/chat/completions` under a base URL (`http://host:port` gets `/v1`).
pub fn chat_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/chat/completions")
    } else {
        format!("{base}/v1/chat/completions")
    }
}

/// `count` sessions from `sessions`, repeating them (with new ids) when there are fewer.
pub fn take_sessions(sessions: Vec<Session>, count: Option<usize>) -> Vec<Session> {
    let Some(count) = count else {
        return sessions;
    };
    let n = sessions.len();
    if n == 0 {
        return sessions;
    }
    (0..count)
        .map(|i| {
            let mut s = sessions[i % n].clone();
            if i >= n {
                s.id = format!("{}~{}", s.id, i / n);
            }
            s
        })
        .collect()
}

/// What the mock received in a run: the chat bodies per session id (the replay's session
/// header without the run's prefix), in order, and the chat calls no client request carried
/// (the proxy's own: its summarizer's).
#[derive(Debug, Default)]
pub struct Received {
    pub by_session: HashMap<String, Vec<Value>>,
    pub unattributed: Vec<Value>,
}

/// The bodies the mock received since its last reset ([`Received`]).
pub async fn mock_received(
    client: &reqwest::Client,
    mock: &str,
    run_id: &str,
) -> Result<Received, ReplayError> {
    let url = format!("{}/_mock/received", mock.trim_end_matches('/'));
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| ReplayError::Mock(e.to_string()))?;
    whole_log(response.headers())?;
    let list: Value = response
        .json()
        .await
        .map_err(|e| ReplayError::Mock(e.to_string()))?;
    let mut received = Received::default();
    for r in list.as_array().into_iter().flatten() {
        if !["/v1/chat/completions", "/v1/messages", "/v1/responses"]
            .contains(&r["path"].as_str().unwrap_or(""))
        {
            continue;
        }
        let body = r["body"]
            .as_str()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or(Value::Null);
        match r["headers"][send::REPLAY_SESSION_HEADER].as_str() {
            Some(header) => {
                if let Some(session) = header.strip_prefix(run_id) {
                    received
                        .by_session
                        .entry(session.to_string())
                        .or_default()
                        .push(body);
                }
            }
            None => received.unattributed.push(body),
        }
    }
    Ok(received)
}

/// The summarizer's completion tokens the proxy counted (`/metrics`), or `None` when its
/// metrics cannot be read.
async fn summary_tokens_out(client: &reqwest::Client, target: &str) -> Option<usize> {
    let base = target.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let text = client
        .get(format!("{root}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("context_proxy_summary_tokens_out_total "))?;
    value.trim().parse::<f64>().ok().map(|v| v as usize)
}

/// Refuses a mock log that dropped older requests: figures from part of the traffic would look
/// better or worse than the traffic is.
fn whole_log(headers: &http::HeaderMap) -> Result<(), ReplayError> {
    let dropped = headers
        .get(context_proxy_mock::DROPPED_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    if dropped > 0 {
        return Err(ReplayError::Mock(format!(
            "the mock's log dropped the {dropped} oldest requests of this run (it keeps at most \
             10 000 requests and 256 MiB of bodies): replay fewer sessions (--sessions N)"
        )));
    }
    Ok(())
}

async fn reset_mock(client: &reqwest::Client, mock: &str) -> Result<(), ReplayError> {
    client
        .post(format!("{}/_mock/reset", mock.trim_end_matches('/')))
        .send()
        .await
        .map_err(|e| ReplayError::Mock(e.to_string()))?;
    Ok(())
}

fn pricing(args: &ReplayArgs) -> Result<(Vec<Pricing>, Pricing), ReplayError> {
    let mut providers = cost::providers();
    if let Some(rate) = args.cached_rate {
        providers.push(Pricing {
            name: "custom",
            terms: CachePricing {
                cached_read_rate: rate,
                cache_write_premium: args.write_premium,
                min_cacheable_prefix: args.min_prefix,
                cache_ttl_secs: 0,
            },
        });
    }
    let headline = headline(&providers, &args.provider)?;
    Ok((providers, headline))
}

/// The row named `name` (`--provider`); `openai`, as in `cache_pricing`, is gpt-4o's row, the
/// sample traffic's model.
fn headline(providers: &[Pricing], name: &str) -> Result<Pricing, ReplayError> {
    let wanted = match name {
        "openai" => "openai-gpt4o",
        name => name,
    };
    providers
        .iter()
        .find(|p| p.name == wanted)
        .copied()
        .ok_or_else(|| ReplayError::Provider(name.to_string()))
}

/// Runs the replay, prints the table and writes the JSON and the chart when asked.
pub async fn run(args: ReplayArgs) -> Result<(), ReplayError> {
    let report = replay(&args).await?;
    println!("{}", report.table());
    if let Some(path) = &args.out {
        let mut bytes = serde_json::to_vec_pretty(&report).unwrap_or_default();
        bytes.push(b'\n');
        std::fs::write(path, bytes).map_err(|source| ReplayError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    if let Some(path) = &args.chart {
        chart::draw(&report, path).map_err(|source| ReplayError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Loads, sends and measures; the report.
pub async fn replay(args: &ReplayArgs) -> Result<Report, ReplayError> {
    for (name, value) in [
        ("--rate", args.rate),
        ("--speed", args.speed),
        ("--max-gap", Some(args.max_gap)),
        ("--duration", args.duration),
    ] {
        if value.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            return Err(ReplayError::NotPositive(name));
        }
    }
    let (providers, headline) = pricing(args)?;
    let sessions = source::load(&args.path).map_err(ReplayError::Source)?;
    let sessions = Arc::new(take_sessions(sessions, args.sessions));
    if sessions.iter().all(|s| s.requests.is_empty()) {
        return Err(ReplayError::Empty);
    }
    let spawned = if args.spawn { Some(spawn(args)?) } else { None };
    let (target, upstream, mock) = match &spawned {
        Some(s) => (
            s.proxy_url.clone(),
            Some(s.mock_url.clone() + "/v1"),
            Some(s.mock_url.clone()),
        ),
        None => (
            args.target.clone().unwrap_or_default(),
            args.upstream.clone(),
            args.mock.clone(),
        ),
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency.max(1))
        .build()
        .map_err(|e| ReplayError::Spawn {
            what: "the HTTP client",
            source: std::io::Error::other(e),
        })?;
    let run_id = format!("replay-{}-", std::process::id());
    let options = |url: String, run_id: String| DriveOptions {
        url,
        concurrency: args.concurrency,
        rate: args.rate,
        speed: args.speed,
        // At most a day: a deadline that far stays a valid instant.
        max_gap: Duration::try_from_secs_f64(args.max_gap)
            .unwrap_or(Duration::MAX)
            .min(Duration::from_secs(86_400)),
        duration: args.duration.map(Duration::from_secs_f64),
        api_key: args.api_key.clone(),
        run_id,
        progress: !args.quiet,
    };
    let direct = if args.compare {
        let upstream = upstream.clone().ok_or(ReplayError::NoUpstream)?;
        // Both runs start with the mock's prompt cache empty.
        if let Some(mock) = &mock {
            reset_mock(&client, mock).await?;
        }
        let started = Instant::now();
        let outcomes = drive(
            &client,
            sessions.clone(),
            &options(chat_url(&upstream), format!("{run_id}direct-")),
        )
        .await;
        Some((outcomes, started.elapsed().as_secs_f64()))
    } else {
        None
    };
    if let Some(mock) = &mock {
        reset_mock(&client, mock).await?;
    }
    let summary_out_before = summary_tokens_out(&client, &target).await;
    let started = Instant::now();
    let outcomes = drive(
        &client,
        sessions.clone(),
        &options(chat_url(&target), run_id.clone()),
    )
    .await;
    let duration = started.elapsed().as_secs_f64();
    if !outcomes.is_empty() && outcomes.iter().all(|o| o.status == 0) {
        return Err(ReplayError::NoAnswer(chat_url(&target)));
    }

    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    let without = Side::measure(
        &counter,
        &sent_direct(&sessions, &outcomes),
        &providers,
        &headline,
    );
    let with = match &mock {
        Some(mock) => {
            let mut received = mock_received(&client, mock, &run_id).await?;
            let bodies: Vec<Vec<Value>> = sessions
                .iter()
                .map(|s| received.by_session.remove(&s.id).unwrap_or_default())
                .collect();
            let output = match (
                summary_out_before,
                summary_tokens_out(&client, &target).await,
            ) {
                (Some(before), Some(after)) => Some(after.saturating_sub(before)),
                _ => None,
            };
            // Costs are in full-price input tokens of each conversation's model; a summary
            // by another model in those of the traffic's (its first session's).
            let mut models: Vec<String> = Vec::new();
            for m in sessions.iter().filter_map(|s| s.model()) {
                if !models.contains(&m) {
                    models.push(m);
                }
            }
            let summarizer =
                SummarizerCalls::price(&counter, &received.unattributed, output, &models);
            let side = Side::measure(&counter, &bodies, &providers, &headline);
            Some(side.with_summarizer(&summarizer))
        }
        None => None,
    };
    let mut report = report(&outcomes, duration, without, with, headline.name);
    report.sessions = sessions.iter().map(|s| s.id.clone()).collect();
    report.billed = BilledSide::of(&outcomes, &headline.terms);
    // Anthropic caches at breakpoints, and its answers say what it read: on Messages traffic
    // the prefix rows come from the usage, not from the prefix model.
    let messages = sessions
        .iter()
        .any(|s| s.requests.iter().any(|r| r.api == source::Api::Messages));
    if messages {
        if let (Some(side), Some(usage)) = (
            report.with_proxy.as_mut(),
            UsageCache::of(&outcomes, sessions.len()),
        ) {
            usage.onto(side);
        }
        match direct
            .as_ref()
            .and_then(|(d, _)| UsageCache::of(d, sessions.len()))
        {
            Some(usage) => usage.onto(&mut report.without_proxy),
            None => UsageCache::unknown(&mut report.without_proxy),
        }
    }
    if let Some((direct, seconds)) = direct {
        report.billed_direct = BilledSide::of(&direct, &headline.terms);
        report.direct_latency_ms = Some(report::Percentiles::of(
            direct.iter().map(|o| o.latency_ms).collect(),
        ));
        report.direct_throughput_rps = Some(direct.len() as f64 / seconds.max(1e-9));
    }
    drop(spawned);
    Ok(report)
}

/// The mock and the proxy as child processes (killed when dropped).
struct Spawned {
    _mock: crate::children::ChildGuard,
    _proxy: crate::children::ChildGuard,
    mock_url: String,
    proxy_url: String,
}

fn spawn(args: &ReplayArgs) -> Result<Spawned, ReplayError> {
    let latency = args.mock_latency_ms.to_string();
    let per_token = args.mock_latency_per_token_us.to_string();
    let (mock, mock_addr) = crate::children::spawn_self(&[
        "mock-upstream",
        "--listen",
        "127.0.0.1:0",
        "--latency-ms",
        &latency,
        "--latency-per-token-us",
        &per_token,
    ])
    .map_err(|source| ReplayError::Spawn {
        what: "the mock upstream",
        source,
    })?;
    let mock_url = format!("http://{mock_addr}");
    let config = args.proxy_config.to_string_lossy().into_owned();
    let upstream = format!("{mock_url}/v1");
    let (proxy, proxy_addr) = crate::children::spawn_self(&[
        "--config",
        &config,
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
    ])
    .map_err(|source| ReplayError::Spawn {
        what: "the proxy",
        source,
    })?;
    Ok(Spawned {
        _mock: mock,
        _proxy: proxy,
        mock_url,
        proxy_url: format!("http://{proxy_addr}/v1"),
    })
}

/// What the upstream bills going direct, session by session: the requests that were sent but
/// Anthropic's `count_tokens` calls, which are free and no model call (the mock's log of what
/// came through the proxy holds none either).
fn sent_direct(sessions: &[Session], outcomes: &[send::Outcome]) -> Vec<Vec<Value>> {
    let mut sent: Vec<Vec<Value>> = vec![Vec::new(); sessions.len()];
    for o in outcomes {
        let Some(request) = sessions
            .get(o.session)
            .and_then(|s| s.requests.get(o.index))
        else {
            continue;
        };
        if request.api != source::Api::CountTokens {
            sent[o.session].push(serde_json::from_slice(&request.body).unwrap_or(Value::Null));
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded Claude Code session asks `count_tokens` before its request: going direct
    /// bills the request only, as Anthropic does (and as the proxy's side, from what the mock
    /// received, already did).
    #[test]
    fn count_tokens_calls_are_not_billed_going_direct() {
        let request = |api, text: &str| source::Request {
            body: bytes::Bytes::from(
                serde_json::json!({"messages": [{"role": "user", "content": text}]}).to_string(),
            ),
            offset_ms: None,
            stream: false,
            api,
        };
        let sessions = vec![Session {
            id: "s".into(),
            requests: vec![
                request(source::Api::CountTokens, "how long is this?"),
                request(source::Api::Messages, "answer this"),
            ],
        }];
        let outcomes: Vec<send::Outcome> = (0..2)
            .map(|index| send::Outcome {
                session: 0,
                index,
                status: 200,
                ..Default::default()
            })
            .collect();
        let sent = sent_direct(&sessions, &outcomes);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].len(), 1, "{sent:?}");
        assert_eq!(sent[0][0]["messages"][0]["content"], "answer this");
    }

    #[test]
    fn providers_are_named_as_in_cache_pricing() {
        let providers = cost::providers();
        assert_eq!(headline(&providers, "openai").unwrap().name, "openai-gpt4o");
        assert_eq!(headline(&providers, "anthropic").unwrap().name, "anthropic");
        let err = headline(&providers, "opneai").unwrap_err().to_string();
        assert!(
            err.contains("openai-gpt5") && err.contains("--cached-rate"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_log_that_dropped_requests_is_refused() {
        let mock =
            context_proxy_mock::MockUpstream::start(context_proxy_mock::MockConfig::default())
                .await
                .unwrap();
        let client = reqwest::Client::new();
        let url = mock.base_url();
        let root = url.trim_end_matches("/v1");
        let response = client
            .get(format!("{root}/_mock/received"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()[context_proxy_mock::DROPPED_HEADER], "0");
        assert!(whole_log(response.headers()).is_ok());
        let received = mock_received(&client, root, "run").await.unwrap();
        assert!(received.by_session.is_empty() && received.unattributed.is_empty());
        let mut dropped = http::HeaderMap::new();
        dropped.insert(
            context_proxy_mock::DROPPED_HEADER,
            http::HeaderValue::from(3),
        );
        let err = whole_log(&dropped).unwrap_err().to_string();
        assert!(err.contains("dropped the 3 oldest requests"), "{err}");
    }
}
