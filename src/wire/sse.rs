//! An incremental reader of a server-sent event stream, as the upstream sends it.
//!
//! Feed it the body's chunks as they arrive, cut anywhere; it hands back each complete event
//! with its fields (per the WHATWG SSE parsing rules: `\n`, `\r\n` or `\r` line endings,
//! comments, multi-line `data` joined with `\n`, one optional space after the colon) and with
//! its exact raw bytes, from its first byte through its terminating blank line. The raw
//! events tile the input: relaying them in order gives back the upstream's bytes, and dropping
//! or rewriting one leaves the others byte-identical.
//!
//! Each input byte is looked at once (the reader remembers where it stopped), and an event
//! longer than [`SseConfig::max_event_bytes`] is an error, so a hostile upstream costs linear
//! time and bounded memory. The reader does no I/O and knows nothing of chat completions.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// The default largest event, terminator included: far above any chat-completion chunk, even
/// a whole answer sent as one event.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// How a reader treats its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseConfig {
    /// The longest event, in bytes including its terminating blank line; a longer one is
    /// [`SseError::EventTooLarge`]. Default [`DEFAULT_MAX_EVENT_BYTES`].
    pub max_event_bytes: usize,
    /// Whether the stream must end with a `data: [DONE]` event (OpenAI's end marker);
    /// when it does not, [`SseReader::finish`] reports [`SseError::NoDone`]. Default true.
    pub expect_done: bool,
}

impl Default for SseConfig {
    fn default() -> Self {
        SseConfig {
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            expect_done: true,
        }
    }
}

/// One event: everything up to and including a blank line.
///
/// A block with no `data` field (a `: keep-alive` comment, a stray blank line) is an event
/// too, with `data: None`, so that its bytes are accounted for; the SSE spec would not
/// dispatch it, and a consumer of the data should skip it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's bytes exactly as received, terminating blank line included.
    pub raw: Bytes,
    /// Where `raw` starts in the stream (bytes fed before it).
    pub offset: u64,
    /// The `data` lines' values joined with `\n`; `None` when the event had no `data` line.
    pub data: Option<String>,
    /// The `event` field (the event type), when given.
    pub event: Option<String>,
    /// The `id` field, when given in this event (not carried over from earlier events).
    pub id: Option<String>,
    /// The `retry` field, when given and a valid number.
    pub retry: Option<u64>,
}

impl Event {
    /// The byte range of the event in the stream.
    pub fn span(&self) -> Range<u64> {
        self.offset..self.offset + self.raw.len() as u64
    }

    /// Whether this is OpenAI's end-of-stream marker, `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data.as_deref() == Some("[DONE]")
    }
}

/// What can go wrong reading an event stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event starting at byte {offset} is longer than {max} bytes")]
    EventTooLarge { max: usize, offset: u64 },
    #[error("the stream ended inside an event ({} bytes after byte {offset})", unfinished.len())]
    Truncated {
        /// Where the unfinished event starts.
        offset: u64,
        /// Its bytes, as received.
        unfinished: Bytes,
    },
    #[error("the stream ended without `data: [DONE]`")]
    NoDone,
}

/// One `data:` event carrying `value`, LF-terminated: what replaces an event the proxy
/// rewrote. JSON text has no raw line breaks, so one `data` line always suffices.
pub fn data_event(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The incremental reader. [`push`](Self::push) bytes, then take events with
/// [`next_event`](Self::next_event) (or both at once with [`feed`](Self::feed)); at the end of
/// the body call [`finish`](Self::finish) and drain it the same way.
///
/// An event whose blank line ends with a lone `\r` at the very end of what was fed is held
/// back until the next byte (or the end) shows whether a `\n` belongs to it. Errors are
/// sticky: once one is returned, every later call returns it again.
#[derive(Debug)]
pub struct SseReader {
    config: SseConfig,
    /// The current event's bytes from its first one, then whatever was fed after it.
    buf: BytesMut,
    /// Stream offset of `buf[0]`.
    offset: u64,
    /// Start of the current (unterminated) line in `buf`.
    line_start: usize,
    /// Where the search for the next line terminator resumes: `buf[line_start..search_from]`
    /// holds none.
    search_from: usize,
    /// What the current event's complete lines said.
    fields: Fields,
    done_seen: bool,
    eof: bool,
    failed: Option<SseError>,
    /// Bytes looked at while searching for line ends (the linearity test reads it).
    #[cfg(test)]
    scanned: u64,
}

#[derive(Debug, Default)]
struct Fields {
    data: Option<String>,
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl Default for SseReader {
    fn default() -> Self {
        SseReader::new(SseConfig::default())
    }
}

impl SseReader {
    pub fn new(config: SseConfig) -> SseReader {
        SseReader {
            config,
            buf: BytesMut::new(),
            offset: 0,
            line_start: 0,
            search_from: 0,
            fields: Fields::default(),
            done_seen: false,
            eof: false,
            failed: None,
            #[cfg(test)]
            scanned: 0,
        }
    }

    /// Appends a chunk of the body. Events are found when they are taken.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(chunk);
        }
    }

    /// Pushes `chunk` and iterates over the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Events<'_> {
        self.push(chunk);
        Events {
            reader: self,
            stopped: false,
        }
    }

    /// Marks the end of the body and iterates over what is left: an event held back by a
    /// trailing `\r`, then [`SseError::Truncated`] for the bytes of an unfinished event, or
    /// [`SseError::NoDone`] when `[DONE]` was expected and never came.
    pub fn finish(&mut self) -> Events<'_> {
        self.eof = true;
        Events {
            reader: self,
            stopped: false,
        }
    }

    /// Whether a `data: [DONE]` event has been returned.
    pub fn saw_done(&self) -> bool {
        self.done_seen
    }

    /// The next complete event, `Ok(None)` when more input is needed (or, after
    /// [`finish`](Self::finish), when the stream ended cleanly).
    pub fn next_event(&mut self) -> Result<Option<Event>, SseError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        loop {
            let rest = &self.buf[self.search_from..];
            let found = rest.iter().position(|&b| b == b'\n' || b == b'\r');
            #[cfg(test)]
            {
                self.scanned += found.map_or(rest.len(), |p| p + 1) as u64;
            }
            let Some(at) = found.map(|p| self.search_from + p) else {
                self.search_from = self.buf.len();
                return self.wait_or_end();
            };
            let terminator = if self.buf[at] == b'\n' {
                1
            } else if at + 1 < self.buf.len() {
                if self.buf[at + 1] == b'\n' {
                    2
                } else {
                    1
                }
            } else if self.eof {
                1
            } else {
                // A `\r` last: a `\n` may follow in the next chunk.
                self.search_from = at;
                return self.wait_or_end();
            };
            let end = at + terminator;
            if end > self.config.max_event_bytes {
                return self.too_large();
            }
            let mut start = self.line_start;
            if self.offset == 0 && start == 0 && self.buf[..at].starts_with(BOM) {
                start = BOM.len();
            }
            self.line_start = end;
            self.search_from = end;
            if at == start {
                return Ok(Some(self.dispatch(end)));
            }
            apply_field(&mut self.fields, &self.buf[start..at]);
        }
    }

    /// No terminator in what was fed: wait for more, or at the end report what is left.
    fn wait_or_end(&mut self) -> Result<Option<Event>, SseError> {
        if self.buf.len() > self.config.max_event_bytes {
            return self.too_large();
        }
        if !self.eof {
            return Ok(None);
        }
        if !self.buf.is_empty() {
            let unfinished = self.buf.split().freeze();
            return self.fail(SseError::Truncated {
                offset: self.offset,
                unfinished,
            });
        }
        if self.config.expect_done && !self.done_seen {
            return self.fail(SseError::NoDone);
        }
        Ok(None)
    }

    fn too_large(&mut self) -> Result<Option<Event>, SseError> {
        self.buf = BytesMut::new();
        self.fail(SseError::EventTooLarge {
            max: self.config.max_event_bytes,
            offset: self.offset,
        })
    }

    fn fail(&mut self, err: SseError) -> Result<Option<Event>, SseError> {
        self.failed = Some(err.clone());
        Err(err)
    }

    /// Ends the current event at `end` (just past its blank line).
    fn dispatch(&mut self, end: usize) -> Event {
        let raw = self.buf.split_to(end).freeze();
        let offset = self.offset;
        self.offset += end as u64;
        self.line_start = 0;
        self.search_from = 0;
        let Fields {
            data,
            event,
            id,
            retry,
        } = std::mem::take(&mut self.fields);
        let event = Event {
            raw,
            offset,
            data,
            event,
            id,
            retry,
        };
        if event.is_done() {
            self.done_seen = true;
        }
        event
    }

    /// Bytes examined so far while looking for line ends.
    #[cfg(test)]
    pub(crate) fn bytes_scanned(&self) -> u64 {
        self.scanned
    }
}

/// One non-blank line (without its terminator) into the event's fields.
fn apply_field(fields: &mut Fields, line: &[u8]) {
    if line.first() == Some(&b':') {
        return; // a comment
    }
    let (name, value) = match line.iter().position(|&b| b == b':') {
        Some(colon) => {
            let value = &line[colon + 1..];
            (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &[][..]),
    };
    let value = String::from_utf8_lossy(value);
    match name {
        b"data" => match &mut fields.data {
            Some(data) => {
                data.push('\n');
                data.push_str(&value);
            }
            None => fields.data = Some(value.into_owned()),
        },
        b"event" => fields.event = Some(value.into_owned()),
        b"id" if !value.contains('\0') => fields.id = Some(value.into_owned()),
        b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
            fields.retry = value.parse().ok();
        }
        _ => {}
    }
}

/// The events available now; see [`SseReader::feed`] and [`SseReader::finish`]. Stops after
/// the first error.
#[derive(Debug)]
pub struct Events<'a> {
    reader: &'a mut SseReader,
    stopped: bool,
}

impl Iterator for Events<'_> {
    type Item = Result<Event, SseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.stopped {
            return None;
        }
        match self.reader.next_event() {
            Ok(Some(event)) => Some(Ok(event)),
            Ok(None) => {
                self.stopped = true;
                None
            }
            Err(err) => {
                self.stopped = true;
                Some(Err(err))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::TOOL_CALL_STREAM;
    use proptest::prelude::*;

    /// Every event of `input` fed in `chunks`, then the end: the events and the end's error.
    fn read_chunked<'a>(
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> (Vec<Event>, Option<SseError>) {
        let mut reader = SseReader::default();
        let mut events = Vec::new();
        for chunk in chunks {
            for event in reader.feed(chunk) {
                match event {
                    Ok(e) => events.push(e),
                    Err(err) => return (events, Some(err)),
                }
            }
        }
        for event in reader.finish() {
            match event {
                Ok(e) => events.push(e),
                Err(err) => return (events, Some(err)),
            }
        }
        (events, None)
    }

    fn read_all(input: &[u8]) -> (Vec<Event>, Option<SseError>) {
        read_chunked([input])
    }

    fn datas(events: &[Event]) -> Vec<Option<String>> {
        events.iter().map(|e| e.data.clone()).collect()
    }

    fn assert_tiles(input: &[u8], events: &[Event]) {
        let mut at = 0u64;
        for e in events {
            assert_eq!(e.offset, at);
            let span = e.span();
            assert_eq!(&input[span.start as usize..span.end as usize], &e.raw[..]);
            at = span.end;
        }
        assert_eq!(at, input.len() as u64, "the events cover the whole input");
    }

    #[test]
    fn reads_a_real_stream_with_raw_spans() {
        let input = TOOL_CALL_STREAM.as_bytes();
        let (events, err) = read_all(input);
        assert_eq!(err, None);
        assert_tiles(input, &events);
        assert!(events.last().unwrap().is_done());
        for e in &events[..events.len() - 1] {
            let data = e.data.as_deref().unwrap();
            let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert!(e.raw.starts_with(b"data: {") && e.raw.ends_with(b"}\n\n"));
        }
    }

    #[test]
    fn any_split_point_and_byte_by_byte_give_the_same_events() {
        let input = TOOL_CALL_STREAM.as_bytes();
        let (whole, err) = read_all(input);
        assert_eq!(err, None);
        for cut in 0..=input.len() {
            let (events, err) = read_chunked([&input[..cut], &input[cut..]]);
            assert_eq!(err, None, "cut at {cut}");
            assert_eq!(events, whole, "cut at {cut}");
        }
        let (events, err) = read_chunked(input.chunks(1));
        assert_eq!((events, err), (whole, None));
    }

    #[test]
    fn crlf_and_cr_line_endings_at_every_split() {
        let lf = TOOL_CALL_STREAM;
        let (expected, _) = read_all(lf.as_bytes());
        for ending in ["\r\n", "\r"] {
            let input = lf.replace('\n', ending);
            let input = input.as_bytes();
            for cut in 0..=input.len() {
                let (events, err) = read_chunked([&input[..cut], &input[cut..]]);
                assert_eq!(err, None, "{ending:?} cut at {cut}");
                assert_eq!(datas(&events), datas(&expected), "{ending:?} cut at {cut}");
                assert_tiles(input, &events);
                let terminator = format!("{ending}{ending}");
                assert!(events
                    .iter()
                    .all(|e| e.raw.ends_with(terminator.as_bytes())));
            }
        }
    }

    #[test]
    fn a_lone_cr_at_the_end_of_a_chunk_waits_for_the_next_byte() {
        let mut reader = SseReader::default();
        assert_eq!(reader.feed(b"data: a\r\n\r").count(), 0);
        let events: Vec<_> = reader
            .feed(b"\ndata: [DONE]\r\r")
            .map(Result::unwrap)
            .collect();
        assert_eq!(&events[0].raw[..], b"data: a\r\n\r\n");
        assert_eq!(events.len(), 1, "[DONE] ends with a lone CR: held back");
        let rest: Vec<_> = reader.finish().collect();
        assert_eq!(rest.len(), 1);
        let done = rest[0].as_ref().unwrap();
        assert!(done.is_done());
        assert_eq!(&done.raw[..], b"data: [DONE]\r\r");
        assert_eq!(reader.next_event(), Ok(None));
    }

    #[test]
    fn comments_fields_and_multiline_data() {
        let input = b": keep-alive\n\n\
            event: message\nid: 7\nretry: 1500\ndata: first\ndata:second\ndata:  two spaces\n\n\
            data\n\n\
            data:\n\n\
            : comment inside\ndata: x\nbogus: field\nid: a\0b\nretry: 1s\n\n\
            \n\
            data: [DONE]\n\n";
        let (events, err) = read_all(input);
        assert_eq!(err, None);
        assert_tiles(input, &events);
        assert_eq!(events.len(), 7);
        assert_eq!(events[0].data, None, "a keep-alive has no data");
        assert_eq!(&events[0].raw[..], b": keep-alive\n\n");
        let e = &events[1];
        assert_eq!(e.data.as_deref(), Some("first\nsecond\n two spaces"));
        assert_eq!(e.event.as_deref(), Some("message"));
        assert_eq!(e.id.as_deref(), Some("7"));
        assert_eq!(e.retry, Some(1500));
        assert_eq!(events[2].data.as_deref(), Some(""), "a bare `data` line");
        assert_eq!(events[3].data.as_deref(), Some(""));
        let e = &events[4];
        assert_eq!(e.data.as_deref(), Some("x"));
        assert_eq!(
            (e.id.as_deref(), e.retry, e.event.as_deref()),
            (None, None, None)
        );
        assert_eq!(
            (&events[5].raw[..], events[5].data.as_deref()),
            (&b"\n"[..], None)
        );
        assert!(events[6].is_done());
    }

    #[test]
    fn a_written_event_reads_back() {
        let value = serde_json::json!({"text": "two\nlines\r\n", "n": 1});
        let raw = data_event(&value);
        let (events, err) = read_chunked([&raw[..], b"data: [DONE]\n\n"]);
        assert_eq!(err, None);
        assert_eq!(events[0].raw, raw);
        let back: serde_json::Value =
            serde_json::from_str(events[0].data.as_deref().unwrap()).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn a_leading_bom_is_skipped_but_kept_in_raw() {
        let input = b"\xEF\xBB\xBFdata: a\n\ndata: [DONE]\n\n";
        for cut in 0..=input.len() {
            let (events, err) = read_chunked([&input[..cut], &input[cut..]]);
            assert_eq!(err, None);
            assert_eq!(events[0].data.as_deref(), Some("a"));
            assert_eq!(&events[0].raw[..], b"\xEF\xBB\xBFdata: a\n\n");
        }
    }

    #[test]
    fn a_stream_without_done_or_cut_mid_event_is_reported() {
        let (events, err) = read_all(b"data: {\"a\":1}\n\n");
        assert_eq!(events.len(), 1);
        assert_eq!(err, Some(SseError::NoDone));

        let (events, err) = read_all(b"data: {\"a\":1}\n\ndata: {\"b\"");
        assert_eq!(events.len(), 1);
        assert_eq!(
            err,
            Some(SseError::Truncated {
                offset: 15,
                unfinished: Bytes::from_static(b"data: {\"b\"")
            })
        );
        // One newline short of the blank line is still an unfinished event.
        let (_, err) = read_all(b"data: [DONE]\n");
        assert!(matches!(err, Some(SseError::Truncated { .. })), "{err:?}");

        let mut lenient = SseReader::new(SseConfig {
            expect_done: false,
            ..SseConfig::default()
        });
        assert_eq!(lenient.feed(b"data: 1\n\n").count(), 1);
        assert_eq!(lenient.finish().count(), 0);
    }

    #[test]
    fn an_over_long_event_is_an_error_and_the_reader_stays_failed() {
        let config = SseConfig {
            max_event_bytes: 16,
            ..SseConfig::default()
        };
        let mut reader = SseReader::new(config);
        let ok: Vec<_> = reader.feed(b"data: 123456789\n\n").collect();
        assert_eq!(ok.len(), 1, "17 bytes with its terminator: one too many");
        assert!(ok[0].is_err());

        // Exactly at the limit is fine; one byte over is not, even before its end arrives.
        let mut reader = SseReader::new(config);
        let events: Vec<_> = reader.feed(b"data: 12345678\n\n").collect();
        assert!(events[0].is_ok());
        let mut errs = reader.feed(b"data: 12345678901234567890");
        let err = errs.next().unwrap().unwrap_err();
        assert_eq!(
            err,
            SseError::EventTooLarge {
                max: 16,
                offset: 16
            }
        );
        assert_eq!(reader.next_event(), Err(err.clone()));
        reader.push(b"\n\n");
        assert_eq!(reader.next_event(), Err(err));
    }

    #[test]
    fn scanning_is_linear_in_the_input() {
        // One long line fed a byte at a time, then many small events in one chunk, each
        // repeated ten times longer: the bytes looked at stay a small multiple of the input.
        for n in [1_000usize, 10_000] {
            let mut reader = SseReader::new(SseConfig {
                max_event_bytes: 1 << 20,
                expect_done: false,
            });
            let line = format!("data: {}\n\n", "x".repeat(n));
            for b in line.as_bytes() {
                for e in reader.feed(std::slice::from_ref(b)) {
                    e.unwrap();
                }
            }
            assert!(reader.bytes_scanned() <= 2 * line.len() as u64);

            let mut reader = SseReader::default();
            let many = "data: {\"x\":1}\r\n\r\n".repeat(n) + "data: [DONE]\r\n\r\n";
            let mut count = 0;
            for chunk in many.as_bytes().chunks(7) {
                count += reader.feed(chunk).map(Result::unwrap).count();
            }
            assert_eq!(count, n + 1);
            assert!(reader.bytes_scanned() <= 2 * many.len() as u64);
        }
    }

    /// A generated stream: events of chat-like JSON, comments and multi-line data.
    fn stream_strategy() -> impl Strategy<Value = String> {
        let event = prop_oneof![
            "[ -~]{0,40}".prop_map(|s| format!("data: {{\"s\":{:?}}}\n\n", s)),
            "[a-z ]{0,10}".prop_map(|s| format!(": {s}\n\n")),
            ("[a-z]{1,8}", "[ -~]{0,20}", "[ -~]{0,20}")
                .prop_map(|(e, a, b)| format!("event: {e}\ndata:{a}\ndata: {b}\n\n")),
        ];
        let ending = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        (proptest::collection::vec(event, 0..12), ending).prop_map(|(events, ending)| {
            (events.concat() + "data: [DONE]\n\n").replace('\n', ending)
        })
    }

    proptest! {
        #[test]
        fn arbitrary_chunkings_give_the_same_events(
            input in stream_strategy(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let input = input.as_bytes();
            let (whole, err) = read_all(input);
            prop_assert_eq!(&err, &None);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
            points.push(0);
            points.push(input.len());
            points.sort_unstable();
            let chunks = points.windows(2).map(|w| &input[w[0]..w[1]]);
            let (events, err) = read_chunked(chunks);
            prop_assert_eq!(err, None);
            prop_assert_eq!(events, whole);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_spans_tile(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
        ) {
            let mut reader = SseReader::new(SseConfig { max_event_bytes: 100, expect_done: true });
            let mut next_offset = 0;
            for chunk in &chunks {
                for e in reader.feed(chunk) {
                    let Ok(e) = e else { break };
                    prop_assert_eq!(e.offset, next_offset);
                    next_offset = e.span().end;
                }
            }
            for e in reader.finish() {
                let Ok(e) = e else { break };
                prop_assert_eq!(e.offset, next_offset);
                next_offset = e.span().end;
            }
        }
    }
}
