//! respond: the upstream's answer to the client, relayed as it arrives, with the context
//! headers; the answer is read on the way (its usage) and, once its body has ended or the client
//! has left, the record phase runs.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::record::record;
use super::ChatCtx;
use crate::body::ProxyBody;
use crate::context::{Managed, ACTIONS_HEADER, TOKENS_AFTER_HEADER, TOKENS_BEFORE_HEADER};
use crate::metrics::UsageProbe;
use crate::relay::{relay_observed, End, Observer};
use crate::state::AppState;
use crate::upstream::Incoming;

/// The client's response for `answer`.
pub fn respond(state: Arc<AppState>, ctx: ChatCtx, answer: Incoming) -> Response<ProxyBody> {
    let status = answer.status;
    let headers = context_headers(&ctx.managed);
    let reader = Reader {
        state,
        ctx: Some(ctx),
        probe: UsageProbe::default(),
        status,
    };
    let mut response = relay_observed(answer, reader);
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    response
}

/// Reads the answer as it passes and runs `record` at its end.
struct Reader {
    state: Arc<AppState>,
    /// Taken by `end`.
    ctx: Option<ChatCtx>,
    probe: UsageProbe,
    status: http::StatusCode,
}

impl Observer for Reader {
    fn chunk(&mut self, bytes: &Bytes) {
        if let Some(ctx) = &mut self.ctx {
            ctx.timings.first_byte.get_or_insert_with(Instant::now);
            // The usage is only compared with the proxy's count when the request was counted.
            if ctx.managed.counted && self.probe.prompt_tokens().is_none() {
                self.probe.feed(bytes);
            }
        }
    }

    fn end(&mut self, end: End) {
        if let Some(mut ctx) = self.ctx.take() {
            ctx.timings.done = Some(Instant::now());
            record(
                &self.state,
                &ctx,
                self.status,
                end,
                self.probe.prompt_tokens(),
            );
        }
    }
}

/// `x-context-tokens-before`, `x-context-tokens-after` (when counted) and `x-context-actions`.
fn context_headers(managed: &Managed) -> Vec<(&'static str, HeaderValue)> {
    let report = &managed.report;
    if !managed.counted {
        return vec![(ACTIONS_HEADER, HeaderValue::from_static("off"))];
    }
    [
        (TOKENS_BEFORE_HEADER, report.tokens_before.to_string()),
        (TOKENS_AFTER_HEADER, report.tokens_after.to_string()),
        (ACTIONS_HEADER, report.actions()),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, HeaderValue::from_str(&value).ok()?)))
    .collect()
}
