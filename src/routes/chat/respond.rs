//! respond: the answer to the client, relayed as it arrives, with the context headers; the
//! answer is read on the way (its usage) and, once its body has ended or the client has left,
//! the record phase runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::record::record;
use super::{Answer, ChatCtx};
use crate::context::adapter::Wire;
use crate::context::{
    Managed, ACTIONS_HEADER, KEPT_PREFIX_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER,
};
use crate::http::body::ProxyBody;
use crate::routes::shared::Shared;
use crate::upstream::relay::{relay_observed, respond_observed, End, Observer, StreamErrors};
use crate::wire::UsageTap;

/// Response headers: the proxy's tool rounds, the upstream's cached tokens, what a summary did,
/// the upstream calls made and their cost (the names are the contract crate's).
pub use context_proxy_contract::{
    COST_HEADER, RELOAD_HEADER, SUMMARY_HEADER, UPSTREAM_CALLS_HEADER,
};

/// The client's response for `answer`.
pub fn respond(state: Arc<Shared>, ctx: ChatCtx, answer: Answer) -> Response<ProxyBody> {
    let mut headers = context_headers(&ctx.managed);
    if let Some(why) = &ctx.unmanaged {
        let actions = HeaderValue::from_str(&format!("unmanaged ({why})"))
            .unwrap_or(HeaderValue::from_static("unmanaged"));
        headers.retain(|(name, _)| *name != ACTIONS_HEADER);
        headers.push((ACTIONS_HEADER, actions));
    }
    let summary = ctx.summary;
    let rounds = ctx.stats.rounds.load(Ordering::Relaxed);
    if rounds > 0 {
        let calls = ctx.stats.calls.load(Ordering::Relaxed);
        let failed = ctx.stats.failed_calls.load(Ordering::Relaxed);
        if let Ok(v) =
            HeaderValue::from_str(&format!("rounds={rounds},calls={calls},failed={failed}"))
        {
            headers.push((RELOAD_HEADER, v));
        }
    }
    headers.extend(bill_headers(&ctx, matches!(answer, Answer::Stream { .. })));
    let upstream_name = crate::telemetry::metrics::UpstreamName(ctx.upstream.name.clone());
    state.metrics.chat_response_started();
    let kept = state
        .recorder
        .as_ref()
        .map(|r| Kept::new(r.max_response_bytes()));
    let errors = if ctx.format.anthropic_errors {
        StreamErrors::Anthropic {
            request_id: ctx.request_id().to_string(),
        }
    } else if ctx.format.wire == Wire::Responses {
        // One terminal event, whatever the upstream's stream does.
        StreamErrors::Responses
    } else {
        StreamErrors::OpenAi
    };
    let reader = |status| Reader {
        state,
        ctx: Some(ctx),
        tap: UsageTap::default(),
        status,
        kept,
    };
    let mut response = match answer {
        Answer::Relay(incoming) => {
            let status = incoming.status;
            relay_observed(incoming, reader(status), errors)
        }
        Answer::Json(done) => {
            let chunks = futures_util::stream::iter([Ok(done.body)]);
            respond_observed(
                done.status,
                done.headers,
                chunks,
                reader(done.status),
                errors,
            )
        }
        Answer::Stream {
            status,
            headers,
            events,
        } => respond_observed(status, headers, events, reader(status), errors),
    };
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    response.extensions_mut().insert(upstream_name);
    if let Some(summary) = summary {
        response
            .headers_mut()
            .insert(SUMMARY_HEADER, HeaderValue::from_static(summary));
    }
    response
}

/// `x-context-upstream-calls` and `x-context-cost-tokens`: the calls of a managed request made
/// so far and their cost. The tool rounds of a `live` stream come after its headers: there the
/// calls leave `reload` out, since it is not known yet.
fn bill_headers(ctx: &ChatCtx, live: bool) -> Vec<(&'static str, HeaderValue)> {
    let bill = ctx.stats.bill_so_far();
    if bill.is_empty() {
        return Vec::new();
    }
    let model = ctx.model.as_deref().unwrap_or("");
    let cost = bill.cost(&ctx.upstream.cache.for_model(model), model);
    let calls = if live {
        bill.calls_text_before_rounds()
    } else {
        bill.calls_text()
    };
    [
        (UPSTREAM_CALLS_HEADER, calls),
        (COST_HEADER, format!("{cost:.1}")),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, HeaderValue::from_str(&value).ok()?)))
    .collect()
}

/// Reads the answer as it passes and runs `record` at its end.
struct Reader {
    state: Arc<Shared>,
    /// Taken by `end`.
    ctx: Option<ChatCtx>,
    tap: UsageTap,
    status: http::StatusCode,
    /// The body as relayed, for the traffic recorder (when one runs).
    kept: Option<Kept>,
}

/// A response body kept up to a limit; past it, nothing is kept.
struct Kept {
    body: Option<bytes::BytesMut>,
    max: usize,
}

impl Kept {
    fn new(max: usize) -> Kept {
        Kept {
            body: Some(bytes::BytesMut::new()),
            max,
        }
    }

    fn push(&mut self, bytes: &Bytes) {
        if let Some(body) = &mut self.body {
            if body.len() + bytes.len() > self.max {
                self.body = None;
            } else {
                body.extend_from_slice(bytes);
            }
        }
    }
}

impl Observer for Reader {
    fn chunk(&mut self, bytes: &Bytes) {
        if let Some(ctx) = &mut self.ctx {
            ctx.timings.first_byte.get_or_insert_with(Instant::now);
            if let Some(kept) = &mut self.kept {
                kept.push(bytes);
            }
            // The usage is only compared with the proxy's count when the request was counted.
            let wanted =
                ctx.managed.counted || ctx.caller.as_ref().is_some_and(|c| c.has_token_budget());
            if wanted && self.tap.usage().is_none() {
                self.tap.feed(bytes);
            }
        }
    }

    fn end(&mut self, end: End) {
        if let Some(mut ctx) = self.ctx.take() {
            ctx.timings.done = Some(Instant::now());
            self.tap.finish();
            record(
                &self.state,
                &ctx,
                self.status,
                end,
                self.tap.usage(),
                self.kept
                    .take()
                    .and_then(|k| k.body)
                    .map(bytes::BytesMut::freeze),
            );
        }
    }
}

/// `x-context-tokens-before`, `x-context-tokens-after`, `x-context-kept-prefix-tokens` (when
/// counted) and `x-context-actions`.
pub fn context_headers(managed: &Managed) -> Vec<(&'static str, HeaderValue)> {
    let report = &managed.report;
    if !managed.counted {
        let off = if report.repeated {
            "off,repeated"
        } else {
            "off"
        };
        return vec![(ACTIONS_HEADER, HeaderValue::from_static(off))];
    }
    [
        (TOKENS_BEFORE_HEADER, report.tokens_before.to_string()),
        (TOKENS_AFTER_HEADER, report.tokens_after.to_string()),
        (KEPT_PREFIX_HEADER, report.kept_prefix_tokens.to_string()),
        (ACTIONS_HEADER, report.actions()),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, HeaderValue::from_str(&value).ok()?)))
    .collect()
}
