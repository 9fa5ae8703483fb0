//! Reading the upstream's `usage` from an answer as it streams past, in either shape, without
//! holding the answer: an event stream is read event by event; a JSON body is kept only up to
//! a cap and parsed the moment its top-level value closes.

use serde::Deserialize;
use serde_json::Value;

use super::sse::{SseConfig, SseReader};
use super::usage::Usage;

/// The default largest JSON body the tap keeps to read its usage.
pub const DEFAULT_MAX_JSON_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The tap's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapConfig {
    /// A JSON body longer than this is not read (no usage). Default
    /// [`DEFAULT_MAX_JSON_BODY_BYTES`].
    pub max_json_body_bytes: usize,
    /// Events longer than this end the reading of a stream (no usage unless already seen).
    /// Default [`super::sse::DEFAULT_MAX_EVENT_BYTES`].
    pub max_event_bytes: usize,
}

impl Default for TapConfig {
    fn default() -> Self {
        TapConfig {
            max_json_body_bytes: DEFAULT_MAX_JSON_BODY_BYTES,
            max_event_bytes: super::sse::DEFAULT_MAX_EVENT_BYTES,
        }
    }
}

/// Finds the usage of an answer fed chunk by chunk. The shape is told by the first byte that
/// is not whitespace: `{` is a JSON body, anything else an event stream. Each byte is looked
/// at a bounded number of times; memory stays under the configured limits.
#[derive(Debug)]
pub struct UsageTap {
    config: TapConfig,
    state: State,
    usage: Option<Usage>,
}

#[derive(Debug)]
enum State {
    /// Only whitespace so far (kept, it may be part of an event stream).
    Unknown(Vec<u8>),
    Json(JsonBody),
    Sse(SseReader),
    /// Read to the end, or given up.
    Done,
}

/// Just the `usage` of a chunk or body: serde skips the rest without building it.
#[derive(Deserialize)]
struct UsageOnly {
    #[serde(default)]
    usage: Option<Value>,
    /// A Responses API event carries its usage in its `response` (`response.completed`).
    #[serde(default)]
    response: Option<ResponseUsageOnly>,
    /// An Anthropic stream's `message_start` carries it in its `message` (small: its content
    /// comes later); any other `message` member is ignored.
    #[serde(default)]
    message: Option<Value>,
}

#[derive(Deserialize)]
struct ResponseUsageOnly {
    #[serde(default)]
    usage: Option<Value>,
}

impl UsageOnly {
    fn usage(&self) -> Option<&Value> {
        let response = self.response.as_ref().and_then(|r| r.usage.as_ref());
        let message = self.message.as_ref().and_then(|m| m.get("usage"));
        [self.usage.as_ref(), response, message]
            .into_iter()
            .flatten()
            .find(|v| v.is_object())
    }
}

impl Default for UsageTap {
    fn default() -> Self {
        UsageTap::new(TapConfig::default())
    }
}

impl UsageTap {
    pub fn new(config: TapConfig) -> UsageTap {
        UsageTap {
            config,
            state: State::Unknown(Vec::new()),
            usage: None,
        }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.state {
            State::Unknown(seen) => {
                let Some(first) = chunk.iter().position(|b| !b.is_ascii_whitespace()) else {
                    seen.extend_from_slice(chunk);
                    if seen.len() > self.config.max_json_body_bytes {
                        self.state = State::Done;
                    }
                    return;
                };
                if chunk[first] == b'{' {
                    self.state = State::Json(JsonBody::default());
                    self.feed(&chunk[first..]);
                } else {
                    let seen = std::mem::take(seen);
                    self.state = State::Sse(SseReader::new(SseConfig {
                        max_event_bytes: self.config.max_event_bytes,
                        expect_done: false,
                    }));
                    self.feed(&seen);
                    self.feed(chunk);
                }
            }
            State::Json(body) => match body.feed(chunk, self.config.max_json_body_bytes) {
                JsonProgress::More => {}
                JsonProgress::Complete(bytes) => {
                    if let Ok(parsed) = serde_json::from_slice::<UsageOnly>(&bytes) {
                        self.take(parsed);
                    }
                    self.state = State::Done;
                }
                JsonProgress::TooLong => self.state = State::Done,
            },
            State::Sse(reader) => {
                reader.push(chunk);
                self.read_events(false);
            }
            State::Done => {}
        }
    }

    /// The end of the body: reads an event held back by a final `\r`.
    pub fn finish(&mut self) {
        self.read_events(true);
        self.state = State::Done;
    }

    /// The last usage seen.
    pub fn usage(&self) -> Option<&Usage> {
        self.usage.as_ref()
    }

    /// The last `usage.prompt_tokens` seen.
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.usage.as_ref().map(|u| u.prompt_tokens)
    }

    fn read_events(&mut self, at_end: bool) {
        let State::Sse(reader) = &mut self.state else {
            return;
        };
        let mut failed = false;
        let events = if at_end {
            reader.finish()
        } else {
            reader.feed(&[])
        };
        let mut seen = Vec::new();
        for event in events {
            let Ok(event) = event else {
                failed = true;
                break;
            };
            // Only chunks that mention usage are parsed at all.
            let Some(data) = event.data.as_deref().filter(|d| d.contains("\"usage\"")) else {
                continue;
            };
            if let Ok(parsed) = serde_json::from_str::<UsageOnly>(data) {
                seen.push(parsed);
            }
        }
        for parsed in seen {
            self.take(parsed);
        }
        if failed {
            self.state = State::Done;
        }
    }

    /// The usage `parsed` reports: it replaces the last one seen, or, in an Anthropic stream,
    /// updates it (`message_delta` reports the output so far, often alone).
    fn take(&mut self, parsed: UsageOnly) {
        let Some(value) = parsed.usage() else {
            return;
        };
        let updated = match (&self.usage, value.as_object()) {
            (Some(before), Some(later)) if before.cache_creation_tokens.is_some() => {
                Some(before.updated(later))
            }
            _ => Usage::from_json(value),
        };
        if updated.is_some() {
            self.usage = updated;
        }
    }
}

/// A JSON body kept until its top-level value closes: a scanner that follows strings and
/// nesting, one byte at a time, never going back.
#[derive(Debug, Default)]
struct JsonBody {
    bytes: Vec<u8>,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

enum JsonProgress {
    More,
    Complete(Vec<u8>),
    TooLong,
}

impl JsonBody {
    fn feed(&mut self, chunk: &[u8], max: usize) -> JsonProgress {
        for (i, &b) in chunk.iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        if self.bytes.len() + i + 1 > max {
                            return JsonProgress::TooLong;
                        }
                        self.bytes.extend_from_slice(&chunk[..=i]);
                        return JsonProgress::Complete(std::mem::take(&mut self.bytes));
                    }
                }
                _ => {}
            }
        }
        if self.bytes.len() + chunk.len() > max {
            return JsonProgress::TooLong;
        }
        self.bytes.extend_from_slice(chunk);
        JsonProgress::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{TEXT_STREAM, TOOL_CALL_COMPLETION, TOOL_CALL_STREAM};
    use proptest::prelude::*;

    fn tap_split(body: &[u8], cut: usize) -> UsageTap {
        let mut tap = UsageTap::default();
        tap.feed(&body[..cut]);
        tap.feed(&body[cut..]);
        tap
    }

    #[test]
    fn reads_usage_from_a_stream_at_every_split() {
        for stream in [TOOL_CALL_STREAM, TEXT_STREAM] {
            let body = stream.as_bytes();
            let expected = if stream == TEXT_STREAM { 9 } else { 812 };
            for cut in 0..=body.len() {
                let tap = tap_split(body, cut);
                assert_eq!(tap.prompt_tokens(), Some(expected), "cut at {cut}");
            }
        }
        let tap = tap_split(TOOL_CALL_STREAM.as_bytes(), 0);
        assert_eq!(tap.usage().unwrap().cached_tokens, Some(768));
    }

    #[test]
    fn reads_usage_from_a_json_body_as_soon_as_it_closes() {
        let body = format!("\n {TOOL_CALL_COMPLETION}");
        let body = body.as_bytes();
        for cut in 0..=body.len() {
            let tap = tap_split(body, cut);
            assert_eq!(tap.prompt_tokens(), Some(812), "cut at {cut}");
        }
        // Braces inside strings do not close the body early.
        let tricky =
            br#"{"choices":[{"message":{"content":"} \" ] {"}}],"usage":{"prompt_tokens":7}}"#;
        for cut in 0..=tricky.len() {
            assert_eq!(
                tap_split(tricky, cut).prompt_tokens(),
                Some(7),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn reads_the_responses_apis_usage_in_json_and_in_its_stream() {
        let body = br#"{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":1200,"input_tokens_details":{"cached_tokens":1024},"output_tokens":3,"total_tokens":1203}}"#;
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":1200,\"input_tokens_details\":{\"cached_tokens\":1024},\"output_tokens\":3,\"total_tokens\":1203}}}\n\n",
        );
        for body in [&body[..], stream.as_bytes()] {
            for cut in 0..=body.len() {
                let mut tap = tap_split(body, cut);
                tap.finish();
                assert_eq!(tap.prompt_tokens(), Some(1200), "cut at {cut}");
                assert_eq!(tap.usage().unwrap().cached_tokens, Some(1024));
            }
        }
    }

    #[test]
    fn reads_anthropics_usage_in_json_and_in_its_stream() {
        let body = br#"{"type":"message","content":[],"usage":{"input_tokens":25,"cache_creation_input_tokens":1000,"cache_read_input_tokens":12000,"output_tokens":7}}"#;
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":1000,\"cache_read_input_tokens\":12000,\"output_tokens\":1}}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        for body in [&body[..], stream.as_bytes()] {
            for cut in 0..=body.len() {
                let mut tap = tap_split(body, cut);
                tap.finish();
                let usage = tap.usage().unwrap();
                assert_eq!(usage.prompt_tokens, 13_025, "cut at {cut}");
                assert_eq!(usage.completion_tokens, 7, "cut at {cut}");
                assert_eq!(usage.cached_tokens, Some(12_000));
                assert_eq!(usage.cache_creation_tokens, Some(1_000));
            }
        }
    }

    #[test]
    fn no_usage_errors_and_limits() {
        let mut tap = UsageTap::default();
        tap.feed(br#"{"error":{"message":"x","type":"t","param":null,"code":null}}"#);
        assert_eq!(tap.prompt_tokens(), None);

        let mut tap = UsageTap::default();
        tap.feed(b"data: {\"usage\":null,\"choices\":[]}\n\ndata: [DONE]\n\n");
        tap.finish();
        assert_eq!(tap.prompt_tokens(), None);

        // A body over the cap is dropped, not read.
        let mut tap = UsageTap::new(TapConfig {
            max_json_body_bytes: 64,
            ..TapConfig::default()
        });
        tap.feed(TOOL_CALL_COMPLETION.as_bytes());
        assert_eq!(tap.prompt_tokens(), None);

        // The usage event held back by a final lone CR is read at the end.
        let mut tap = UsageTap::default();
        tap.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\r\r");
        assert_eq!(tap.prompt_tokens(), None);
        tap.finish();
        assert_eq!(tap.prompt_tokens(), Some(3));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            json in any::<bool>(),
        ) {
            let mut tap = UsageTap::new(TapConfig { max_json_body_bytes: 200, max_event_bytes: 100 });
            if json {
                tap.feed(b"{");
            }
            for chunk in &chunks {
                tap.feed(chunk);
            }
            tap.finish();
        }
    }
}
