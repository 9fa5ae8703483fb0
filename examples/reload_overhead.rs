//! Reload figures for BENCHMARKS.md ("Reload").
//!
//! The real proxy (in this process, embedded `fs` store in a temporary directory) in front of
//! the in-process mock upstream, on a conversation whose 10 KB tool result is compacted:
//! 1. the proxy's own time for one reload round: (a request whose answer takes one round of
//!    `context_read` of the 10 KB result) − (the same request answered at once) − (one direct
//!    call to the mock, the round's second upstream call);
//! 2. a streamed answer without reload: time to the first content byte through the proxy
//!    minus direct to the mock;
//! 3. the same reload round on the Responses API (`POST /v1/responses`, the proxy's call
//!    hidden as a `function_call` item), next to chat's, alternated with it;
//! 4. without a reload round, the latency the proxy adds to a managed request of each wire:
//!    (the request through the proxy, its 10 KB result compacted) − (the body the proxy
//!    forwarded, sent directly), the same conversation on both wires; and streamed, the time
//!    to the first content byte through the proxy minus direct, for each wire.
//!
//! Run: `cargo run --release --example reload_overhead`. Medians of `ROUNDS` alternated runs.

use std::error::Error;
use std::time::{Duration, Instant};

use context_proxy::app::config::Config;
use context_proxy::app::serve::RunningServer;
use context_proxy::mock::{MockConfig, MockUpstream, Reply};
use context_proxy::store::{Backend, ContentRef};
use context_proxy::upstream::UpstreamConfig;
use serde_json::{json, Value};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const ROUNDS: usize = 300;

fn result_10k() -> String {
    (0..)
        .map(|i| format!("{i:>4}: let value_{i} = compute({i}) * 2; // ok\n"))
        .scan(String::new(), |acc, line| {
            acc.push_str(&line);
            Some(acc.clone())
        })
        .find(|s| s.len() >= 10 * 1024)
        .unwrap_or_default()
}

fn conversation(result: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Read the file."}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_a", "content": result}),
        json!({"role": "assistant", "content": "Read it."}),
        json!({"role": "user", "content": "What is on line 7?"}),
    ]
}

/// The same conversation as Responses API input items.
fn input(result: &str) -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Read the file."}),
        json!({"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": "{\"path\":\"a.rs\"}"}),
        json!({"type": "function_call_output", "call_id": "call_a", "output": result}),
        json!({"role": "assistant", "content": "Read it."}),
        json!({"role": "user", "content": "What is on line 7?"}),
    ]
}

/// One wire's measurements: (answered at once, with one reload round, the round's second
/// upstream call made directly).
#[derive(Default)]
struct Leg {
    plain: Vec<Duration>,
    reload: Vec<Duration>,
    one_call: Vec<Duration>,
    /// The body the proxy forwarded for the request answered at once, sent directly.
    plain_direct: Vec<Duration>,
}

impl Leg {
    /// One alternated run: the request answered at once, then with a reload round, then the
    /// round's second upstream call sent directly.
    async fn run(
        &mut self,
        (mock, client): (&MockUpstream, &reqwest::Client),
        (proxied, direct): (&str, &str),
        body: &Value,
        read: Reply,
        keep: bool,
    ) -> Result<()> {
        mock.reset();
        mock.push(Reply::text("first answer"));
        let p = timed(client, proxied, body).await?;
        let forwarded = mock
            .received()
            .first()
            .map(|r| r.json())
            .ok_or("the mock did not see the request")?;
        mock.reset();
        mock.push(Reply::text("first answer"));
        let pd = timed(client, direct, &forwarded).await?;
        mock.reset();
        mock.push(read);
        mock.push(Reply::text("first answer"));
        let r = timed(client, proxied, body).await?;
        let second = mock
            .received()
            .get(1)
            .map(|r| r.json())
            .ok_or("the mock did not see the round's second call")?;
        mock.push(Reply::text("first answer"));
        let d = timed(client, direct, &second).await?;
        if keep {
            self.plain.push(p);
            self.reload.push(r);
            self.one_call.push(d);
            self.plain_direct.push(pd);
        }
        Ok(())
    }

    /// The latency the proxy adds to the request answered at once: through it − the
    /// forwarded body sent directly, medians in ms.
    fn added(&self) -> (f64, f64) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (p, d) = (
            ms(median(self.plain.clone())),
            ms(median(self.plain_direct.clone())),
        );
        (d, p - d)
    }

    /// (at once, reload, direct second call, the proxy's time of the round), medians in ms.
    fn medians(self) -> (f64, f64, f64, f64) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (p, r, d) = (
            ms(median(self.plain)),
            ms(median(self.reload)),
            ms(median(self.one_call)),
        );
        (p, r, d, r - p - d)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn timed(client: &reqwest::Client, url: &str, body: &Value) -> Result<Duration> {
    let t = Instant::now();
    let resp = client.post(url).json(body).send().await?;
    let status = resp.status();
    resp.bytes().await?;
    if !status.is_success() {
        return Err(format!("{url} answered {status}").into());
    }
    Ok(t.elapsed())
}

async fn first_content_byte(client: &reqwest::Client, url: &str, body: &Value) -> Result<Duration> {
    let t = Instant::now();
    let mut resp = client.post(url).json(body).send().await?;
    let mut seen = String::new();
    while let Some(chunk) = resp.chunk().await? {
        seen.push_str(&String::from_utf8_lossy(&chunk));
        // A chat chunk's `content`, a Responses `response.output_text.delta`'s `delta`.
        let text = seen.contains("\"content\":\"") || seen.contains("\"delta\":\"");
        if text && seen.contains("first") {
            let at = t.elapsed();
            while resp.chunk().await?.is_some() {}
            return Ok(at);
        }
    }
    Err("no content in the stream".into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".parse()?;
    config.store.backend = Backend::Fs;
    config.store.path = dir.path().join("data");
    config.context.keep_recent_messages = 2;
    config.context.compact_batch_tokens = 500;
    config.context.tool_result_max_tokens = 500;
    config.upstreams = vec![UpstreamConfig {
        base_url: mock.base_url(),
        default: true,
        ..UpstreamConfig::default()
    }];
    let proxy = RunningServer::start(config.validate()?).await?;
    let client = reqwest::Client::new();
    let proxied = format!("http://{}/v1/chat/completions", proxy.addr());
    let direct = format!("{}/chat/completions", mock.base_url());
    let result = result_10k();
    let reference = ContentRef::of(&result).as_str().to_string();
    let body = json!({"model": "gpt-4o", "messages": conversation(&result)});
    let read = || {
        Reply::tool_calls(vec![(
            "context_read".into(),
            json!({"ref": reference, "offset": 1, "limit": 400}),
        )])
    };
    let stream = |model: &str| json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]});

    let responses_proxied = format!("http://{}/v1/responses", proxy.addr());
    let responses_direct = format!("{}/responses", mock.base_url());
    let responses_body = json!({"model": "gpt-4o", "input": input(&result), "store": false});

    let (mut chat, mut responses) = (Leg::default(), Leg::default());
    let (mut ttfb_proxy, mut ttfb_direct) = (Vec::new(), Vec::new());
    let (mut rttfb_proxy, mut rttfb_direct) = (Vec::new(), Vec::new());
    let responses_stream =
        json!({"model": "gpt-4o", "stream": true, "input": [{"role": "user", "content": "hi"}]});
    for i in 0..ROUNDS + 20 {
        let keep = i >= 20;
        let at = (&mock, &client);
        chat.run(at, (&proxied, &direct), &body, read(), keep)
            .await?;
        let urls = (responses_proxied.as_str(), responses_direct.as_str());
        responses
            .run(at, urls, &responses_body, read(), keep)
            .await?;
        mock.push(Reply::text("first answer, streamed").stream_chunks(4));
        let tp = first_content_byte(&client, &proxied, &stream("gpt-4o")).await?;
        mock.push(Reply::text("first answer, streamed").stream_chunks(4));
        let td = first_content_byte(&client, &direct, &stream("gpt-4o")).await?;
        mock.push(Reply::text("first answer, streamed").stream_chunks(4));
        let rp = first_content_byte(&client, &responses_proxied, &responses_stream).await?;
        mock.push(Reply::text("first answer, streamed").stream_chunks(4));
        let rd = first_content_byte(&client, &responses_direct, &responses_stream).await?;
        if keep {
            ttfb_proxy.push(tp);
            ttfb_direct.push(td);
            rttfb_proxy.push(rp);
            rttfb_direct.push(rd);
        }
    }
    let ((cdir, cadd), (rdir, radd)) = (chat.added(), responses.added());
    let (tp, td) = (median(ttfb_proxy), median(ttfb_direct));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (cp, cr, cd, ct) = chat.medians();
    let (rp, rr, rd, rt) = responses.medians();
    println!("Reload round ({ROUNDS} runs, medians; 10 KB context_read from the fs store):\n");
    println!("| measurement | chat ms | responses ms |\n|---|---:|---:|");
    println!("| request answered at once, through the proxy | {cp:.3} | {rp:.3} |");
    println!("| same request with one reload round | {cr:.3} | {rr:.3} |");
    println!("| the round's second upstream call (its body as the proxy sent it) made directly | {cd:.3} | {rd:.3} |");
    println!(
        "| **proxy time of the reload round** (reload − at once − direct call) | **{ct:.3}** | **{rt:.3}** |"
    );
    println!(
        "\nresponses / chat, proxy time of the round: {:.2}",
        rt / ct
    );
    println!(
        "| streamed answer, first content byte: direct | {:.3} |",
        ms(td)
    );
    println!(
        "| streamed answer, first content byte: through the proxy | {:.3} |",
        ms(tp)
    );
    println!(
        "| **added to the first content byte** | **{:.3}** |",
        ms(tp) - ms(td)
    );
    let (rtp, rtd) = (median(rttfb_proxy), median(rttfb_direct));
    println!("\nWithout a reload round ({ROUNDS} runs, medians; the same conversation, its 10 KB result compacted):\n");
    println!("| measurement | chat ms | responses ms |\n|---|---:|---:|");
    println!("| the forwarded body sent directly | {cdir:.3} | {rdir:.3} |");
    println!("| **added by the proxy** (through it − directly) | **{cadd:.3}** | **{radd:.3}** |");
    println!(
        "| streamed answer, first content byte: direct | {:.3} | {:.3} |",
        ms(td),
        ms(rtd)
    );
    println!(
        "| streamed answer, first content byte: through the proxy | {:.3} | {:.3} |",
        ms(tp),
        ms(rtp)
    );
    println!(
        "| **added to the first content byte** | **{:.3}** | **{:.3}** |",
        ms(tp) - ms(td),
        ms(rtp) - ms(rtd)
    );
    println!("\nresponses / chat, added by the proxy: {:.2}", radd / cadd);
    proxy.shutdown().await;
    Ok(())
}
