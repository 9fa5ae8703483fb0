//! The tool loop for a non-streaming answer: read it whole; while it calls only the proxy's
//! tools, run them and ask again; give the client the final answer with `usage` summed over
//! every round. When the model calls the client's tools too, the client gets its own calls only
//! and the proxy's are kept for the next turn. The wire's [`LoopWire`](super::LoopWire) reads
//! and rewrites the answers.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderMap, StatusCode};
use serde_json::Value;

use super::{Final, Round};
use crate::http::error::ProxyError;
use crate::upstream::{Incoming, UpstreamError};
use crate::wire::Usage;

/// Longest non-streaming answer the loop reads (a larger one is relayed as it is).
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Runs the loop from the first answer.
pub async fn run(mut round: Round, first: Incoming) -> Result<Final, ProxyError> {
    let wire = round.wire;
    let mut answer = first;
    let mut usage: Option<Usage> = None;
    // For a wire that shows earlier rounds: where the rounds begin, and the answers before the
    // last.
    let start = round.conversation_len();
    let mut earlier: Vec<Value> = Vec::new();
    loop {
        let status = answer.status;
        let mut headers = answer.headers.clone();
        headers.remove(header::CONTENT_LENGTH);
        let bytes = read_all(answer, &round).await?;
        let body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(body) if status.is_success() => body,
            // An error (in round 2 too) or something else than JSON: the client gets it as it is.
            _ => {
                return Ok(Final {
                    status,
                    headers,
                    body: bytes,
                })
            }
        };
        let Some(turn) = wire.answer(&body) else {
            return Ok(Final {
                status,
                headers,
                body: bytes,
            });
        };
        if let Some(u) = &turn.usage {
            match &mut usage {
                Some(sum) => sum.add(u),
                None => usage = Some(u.clone()),
            }
        }
        let (proxy, client) = round.kinds(&turn.calls);
        if !proxy {
            let last = wire.continued(&body, &turn);
            let body = merged(&round, body, &earlier, start, last, Vec::new()).await;
            return Ok(finish(status, headers, body, bytes, &usage, &round));
        }
        if round.tools_withdrawn() {
            return Ok(withdrawn(status, headers, body, &usage, &round, &earlier, start).await);
        }
        let results = round.run_calls(&turn.calls).await;
        if client {
            // Mixed: the client gets its own calls; the proxy's wait in the session.
            let mut body = body;
            let last = wire.continued(&body, &turn);
            let body = if wire.merges_rounds() {
                wire.split(&mut body, &|name| round.is_proxy(name));
                merged(&round, body, &earlier, start, last, results).await
            } else {
                // The earlier rounds' items first: the proxy's calls are kept at their
                // positions among every item the client gets (as a stream keeps them).
                let mut body = merged(&round, body, &earlier, start, last, Vec::new()).await;
                let split = wire.split(&mut body, &|name| round.is_proxy(name));
                round.keep(split, results).await;
                body
            };
            return Ok(finish(status, headers, body, Bytes::new(), &usage, &round));
        }
        let output = wire.continued(&body, &turn);
        if wire.shows_earlier_rounds() {
            earlier.push(body);
        }
        let request = round.next_request(output, results);
        answer = round.upstream.send(&request).await?;
        round.stats.upstream_calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// The model called the proxy's tools after they were withdrawn: the calls are not run and the
/// upstream is not asked again. The client gets the answer without them (its text, its own
/// calls), or a 502 saying why when nothing is left.
async fn withdrawn(
    status: StatusCode,
    headers: HeaderMap,
    mut body: Value,
    usage: &Option<Usage>,
    round: &Round,
    earlier: &[Value],
    start: usize,
) -> Final {
    let rounds = round.stats.rounds.load(Ordering::Relaxed) as usize;
    tracing::warn!(
        rounds,
        "the model called the proxy's tools after they were withdrawn: not run"
    );
    let split = round.wire.split(&mut body, &|name| round.is_proxy(name));
    if split.empty {
        let error = ProxyError::ToolLoopExhausted { rounds };
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        return Final {
            status: error.classify().0,
            headers,
            body: round.wire.error_body(&error, &round.request_id),
        };
    }
    // The calls not run are not in what the conversation continues with either.
    let last = round.wire.continued(&body, &Default::default());
    let body = merged(round, body, earlier, start, last, Vec::new()).await;
    finish(status, headers, body, Bytes::new(), usage, round)
}

/// For a wire that shows earlier rounds ([`super::LoopWire::shows_earlier_rounds`]): the final
/// `answer` with the client's part of the `earlier` ones before its own; for one that merges
/// them into one message ([`super::LoopWire::merges_rounds`]), the upstream transcript it
/// stands for (ending with `last`, and the proxy's `results` of a mixed last round) kept for
/// the next turn when there is one. Any other wire's answer is returned as it is.
async fn merged(
    round: &Round,
    mut answer: Value,
    earlier: &[Value],
    start: usize,
    last: Vec<Value>,
    results: Vec<Value>,
) -> Value {
    let wire = round.wire;
    if !wire.shows_earlier_rounds() {
        return answer;
    }
    wire.merge(&mut answer, earlier, &|name| round.is_proxy(name));
    if wire.merges_rounds() && (!earlier.is_empty() || !results.is_empty()) {
        let shown = wire
            .continued(&answer, &Default::default())
            .into_iter()
            .next()
            .unwrap_or(Value::Null);
        round.keep_rounds(start, last, &shown, results).await;
    }
    answer
}

/// The client's answer: the upstream's bytes when nothing needs changing, else the body with
/// `usage` summed over the rounds.
fn finish(
    status: StatusCode,
    mut headers: HeaderMap,
    mut body: Value,
    original: Bytes,
    usage: &Option<Usage>,
    round: &Round,
) -> Final {
    // The cached prefix the upstream reported, summed over the rounds: the answer is read
    // whole, so it can go in a header.
    if let Some(cached) = usage.as_ref().and_then(|u| u.cached_tokens) {
        headers.insert(
            crate::contract::UPSTREAM_CACHED_HEADER,
            http::HeaderValue::from(cached),
        );
    }
    let scrubbed = round.wire.scrub(&mut body, &round.reload.names);
    let rounds = round.stats.rounds.load(Ordering::Relaxed);
    if rounds == 0 && !original.is_empty() && !scrubbed {
        return Final {
            status,
            headers,
            body: original,
        };
    }
    if let Some(usage) = usage {
        round.wire.write_usage(&mut body, usage);
    }
    Final {
        status,
        headers,
        body: Bytes::from(body.to_string()),
    }
}

/// The whole body of `answer`, bounded in size, each chunk within the read timeout.
async fn read_all(answer: Incoming, round: &Round) -> Result<Bytes, ProxyError> {
    let mut out = Vec::new();
    let mut chunks = std::pin::pin!(answer.into_stream());
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            ProxyError::from(UpstreamError::Unreachable {
                upstream: round.upstream.name.clone(),
                detail: format!("its answer broke off: {e}"),
            })
        })?;
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(ProxyError::from(UpstreamError::Unreachable {
                upstream: round.upstream.name.clone(),
                detail: format!("its answer is larger than {MAX_ANSWER_BYTES} bytes"),
            }));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}
