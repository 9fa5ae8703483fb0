//! Sending the sessions: requests of one session in their order (each waits for the previous
//! answer), sessions in parallel (`concurrency` at a time), on an open-loop schedule.
//!
//! With a rate, request slots are handed out at `rate` per second whatever the answers do, and
//! a request's latency counts from its slot, not from when it could finally be sent: a slow
//! answer shows up as latency of the requests behind it instead of silently lowering the load.
//! With a speed, a recording's own timing is kept (divided by `speed`), each gap between two
//! requests of a session at most `max_gap`. Without either, each session sends as fast as its
//! answers come (closed loop).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::source::{Api, Session};

/// How to send.
#[derive(Debug, Clone)]
pub struct DriveOptions {
    /// `…/chat/completions` of the proxy or the upstream (Anthropic's requests go to
    /// `…/messages` beside it).
    pub url: String,
    pub concurrency: usize,
    /// Requests per second over all sessions (open loop).
    pub rate: Option<f64>,
    /// Keep a recording's timing, sped up this many times.
    pub speed: Option<f64>,
    /// Longest wait between two requests of a session kept with `speed` (a recording's gap of
    /// days, or a hostile one of centuries, waits this long).
    pub max_gap: Duration,
    /// Stop starting requests after this long.
    pub duration: Option<Duration>,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: String,
    /// Prefixed to every session id in `x-context-session`, so runs do not share state.
    pub run_id: String,
    /// Print a progress line on stderr every second.
    pub progress: bool,
}

/// What one request got.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub session: usize,
    pub index: usize,
    /// The HTTP status; 0 when no answer came (connection error).
    pub status: u16,
    pub stream: bool,
    /// From the request's slot (or its send, in closed loop) to the last byte, ms.
    pub latency_ms: f64,
    /// From the send to the first body byte, ms.
    pub ttfb_ms: f64,
    pub tokens_before: Option<u64>,
    pub tokens_after: Option<u64>,
    /// Rounds of the proxy's own tools (`x-context-reload: rounds=…`).
    pub reload_rounds: u64,
    /// What an Anthropic answer's usage billed (Messages requests).
    pub billed: Option<Billed>,
    /// The thinking block an Anthropic answer opened with (fed back: [`super::live`]).
    pub thinking: Option<serde_json::Value>,
}

/// An Anthropic answer's usage: input, cache writes (5-minute and one-hour), cache reads and
/// output tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Billed {
    pub input: u64,
    pub cache_write: u64,
    pub cache_write_1h: u64,
    pub cache_read: u64,
    pub output: u64,
}

impl Billed {
    /// Reads a `usage` object onto `self` (fields it lacks keep their value: a stream's
    /// `message_delta` often reports `output_tokens` alone).
    fn read(&mut self, usage: &serde_json::Value) {
        self.input = n_of(usage, "input_tokens", self.input);
        self.cache_write = n_of(usage, "cache_creation_input_tokens", self.cache_write);
        self.cache_read = n_of(usage, "cache_read_input_tokens", self.cache_read);
        self.output = n_of(usage, "output_tokens", self.output);
        if let Some(split) = usage.get("cache_creation") {
            self.cache_write_1h = n_of(split, "ephemeral_1h_input_tokens", self.cache_write_1h);
        }
    }

    /// The usage of an answer, JSON or an event stream.
    pub fn of_answer(body: &[u8]) -> Option<Billed> {
        let mut billed = None::<Billed>;
        if let Ok(message) = serde_json::from_slice::<serde_json::Value>(body) {
            let usage = message.get("usage")?;
            billed.get_or_insert_default().read(usage);
            return billed;
        }
        for line in String::from_utf8_lossy(body).lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
                continue;
            };
            let usage = event
                .get("message")
                .and_then(|m| m.get("usage"))
                .or_else(|| event.get("usage"));
            if let Some(usage) = usage.filter(|u| u.is_object()) {
                billed.get_or_insert_default().read(usage);
            }
        }
        billed
    }

    /// The cost in full-price input tokens under `terms` (a one-hour write costs 2×).
    pub fn cost(&self, terms: &context_proxy_pricing::CachePricing) -> f64 {
        let five = self.cache_write.saturating_sub(self.cache_write_1h);
        self.input as f64
            + five as f64 * (1.0 + terms.cache_write_premium)
            + self.cache_write_1h as f64 * 2.0
            + self.cache_read as f64 * terms.cached_read_rate
    }

    pub fn add(&mut self, other: &Billed) {
        self.input += other.input;
        self.cache_write += other.cache_write;
        self.cache_write_1h += other.cache_write_1h;
        self.cache_read += other.cache_read;
        self.output += other.output;
    }
}

fn n_of(v: &serde_json::Value, key: &str, old: u64) -> u64 {
    v.get(key).and_then(|v| v.as_u64()).unwrap_or(old)
}

/// The URL of `api` beside `chat_url` (`…/chat/completions`).
pub fn url_for(chat_url: &str, api: Api) -> String {
    let base = chat_url
        .strip_suffix("/chat/completions")
        .unwrap_or(chat_url);
    match api {
        Api::Chat => chat_url.to_string(),
        Api::Messages => format!("{base}/messages"),
        Api::CountTokens => format!("{base}/messages/count_tokens"),
        Api::Responses => format!("{base}/responses"),
    }
}

/// Longest answer read for its usage.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Sends every session and returns every outcome, ordered by session then index.
pub async fn drive(
    client: &reqwest::Client,
    sessions: Arc<Vec<Session>>,
    options: &DriveOptions,
) -> Vec<Outcome> {
    let total: usize = sessions.iter().map(|s| s.requests.len()).sum();
    let next_session = Arc::new(AtomicUsize::new(0));
    let slots = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = options.duration.map(|d| started + d);
    let finished = Arc::new(AtomicBool::new(false));
    let progress = options.progress.then(|| {
        let (done, errors, finished) = (done.clone(), errors.clone(), finished.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            while !finished.load(Ordering::Relaxed) {
                tick.tick().await;
                let n = done.load(Ordering::Relaxed);
                eprint!(
                    "\r{n}/{total} requests, {:.0} req/s, {} errors   ",
                    n as f64 / started.elapsed().as_secs_f64(),
                    errors.load(Ordering::Relaxed)
                );
            }
        })
    });
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..options.concurrency.max(1) {
        let (client, sessions, options) = (client.clone(), sessions.clone(), options.clone());
        let (next_session, slots, done, errors) = (
            next_session.clone(),
            slots.clone(),
            done.clone(),
            errors.clone(),
        );
        workers.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let s = next_session.fetch_add(1, Ordering::Relaxed);
                let Some(session) = sessions.get(s) else {
                    break;
                };
                // With `speed`: when the previous request of the session was due, and its
                // offset in the recording.
                let mut planned = (Instant::now(), 0u64);
                let mut live = super::live::LiveThinking::default();
                for (index, request) in session.requests.iter().enumerate() {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        break;
                    }
                    let slot = match (options.rate, options.speed, request.offset_ms) {
                        (Some(rate), _, _) => {
                            let k = slots.fetch_add(1, Ordering::Relaxed);
                            started + Duration::from_secs_f64(k as f64 / rate)
                        }
                        (None, Some(speed), Some(offset)) => {
                            let gap = offset.saturating_sub(planned.1) as f64 / 1e3 / speed;
                            let gap = Duration::try_from_secs_f64(gap)
                                .unwrap_or(options.max_gap)
                                .min(options.max_gap);
                            planned = (planned.0 + gap, offset.max(planned.1));
                            planned.0
                        }
                        _ => now,
                    };
                    tokio::time::sleep_until(slot.into()).await;
                    let fed = (request.api == Api::Messages
                        && super::live::LiveThinking::needed(&request.body))
                    .then(|| live.apply(&request.body));
                    let body = fed.as_ref().map_or(&request.body, |(b, _)| b.as_ref());
                    let mut outcome =
                        send(&client, &options, &session.id, body, request.api, slot).await;
                    if let Some((_, ordinal)) = fed {
                        live.answered(ordinal, outcome.thinking.take());
                    }
                    outcome.session = s;
                    outcome.index = index;
                    outcome.stream = request.stream;
                    if !(200..300).contains(&outcome.status) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    outcomes.push(outcome);
                }
            }
            outcomes
        });
    }
    let mut all = Vec::with_capacity(total);
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(outcomes) => all.extend(outcomes),
            Err(e) => tracing::warn!(error = %e, "a replay worker failed"),
        }
    }
    finished.store(true, Ordering::Relaxed);
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }
    all.sort_by_key(|o| (o.session, o.index));
    all
}

/// Request header naming the replayed session, forwarded by the proxy to the upstream.
pub const REPLAY_SESSION_HEADER: &str = "x-replay-session";

fn header_u64(resp: &reqwest::Response, name: &str) -> Option<u64> {
    resp.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// `rounds=N` of `x-context-reload` (0 without it).
pub(crate) fn reload_rounds(headers: &http::HeaderMap) -> u64 {
    headers
        .get(context_proxy_contract::RELOAD_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').find_map(|kv| kv.strip_prefix("rounds=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn send(
    client: &reqwest::Client,
    options: &DriveOptions,
    session: &str,
    body: &bytes::Bytes,
    api: Api,
    slot: Instant,
) -> Outcome {
    let sent = Instant::now();
    let ms = |from: Instant| from.elapsed().as_secs_f64() * 1e3;
    let request = client
        .post(url_for(&options.url, api))
        .header("content-type", "application/json");
    // Anthropic's clients send their key as `x-api-key`, with the API version and Claude
    // Code's betas.
    let request = if api.is_anthropic() {
        request
            .header("x-api-key", &options.api_key)
            .header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14",
            )
    } else {
        request.header("authorization", format!("Bearer {}", options.api_key))
    };
    let response = request
        .header(
            context_proxy_contract::SESSION_HEADER,
            format!("{}{session}", options.run_id),
        )
        // The proxy keeps its own `x-context-*` headers: this one reaches the upstream, so the
        // replay finds each session's calls among what the mock received.
        .header(
            REPLAY_SESSION_HEADER,
            format!("{}{session}", options.run_id),
        )
        .body(body.clone())
        .send()
        .await;
    let mut resp = match response {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(error = %e, "replay request failed");
            return Outcome {
                latency_ms: ms(slot),
                ..Outcome::default()
            };
        }
    };
    let mut outcome = Outcome {
        status: resp.status().as_u16(),
        tokens_before: header_u64(&resp, context_proxy_contract::TOKENS_BEFORE_HEADER),
        tokens_after: header_u64(&resp, context_proxy_contract::TOKENS_AFTER_HEADER),
        reload_rounds: reload_rounds(resp.headers()),
        ..Outcome::default()
    };
    let mut first = None;
    let mut answer = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                first.get_or_insert_with(|| ms(sent));
                if api == Api::Messages && answer.len() + chunk.len() <= MAX_ANSWER_BYTES {
                    answer.extend_from_slice(&chunk);
                }
            }
            Ok(None) => break,
            Err(_) => {
                outcome.status = 0;
                break;
            }
        }
    }
    if api == Api::Messages && (200..300).contains(&outcome.status) {
        outcome.billed = Billed::of_answer(&answer);
        outcome.thinking = super::live::answer_thinking(&answer);
    }
    outcome.ttfb_ms = first.unwrap_or_else(|| ms(sent));
    outcome.latency_ms = ms(slot);
    outcome
}
