//! Part of plan: what the summarizer does for this request. A ready summary was placed by the
//! plan (`hit`); a span worth summarizing ahead of time is queued in the background; a span
//! moved out just now, over the hard budget, without its summary waits for it at most the
//! summarizer's timeout (`computed`), else the marker stands (`fallback`), and a later request
//! finds the summary made in the background. A summary that would cost more than going direct
//! saves is not asked for (`unpaid`): the marker stands.

use tokio::time::Instant;

use super::ChatCtx;
use crate::context::{SummaryJob, SummaryPlan};
use crate::routes::shared::Shared;
use crate::summarizer::{Source, Task};
use crate::telemetry::summarizer_stats::Stats;

pub async fn settle(state: &Shared, ctx: &mut ChatCtx) {
    let (Some(summarizer), Some(identity)) = (&state.summarizer, &ctx.identity) else {
        return;
    };
    let Some(plan) = ctx.plan.as_mut() else {
        return;
    };
    let stats = &summarizer.stats;
    let task = |job: SummaryJob| Task {
        identity: identity.clone(),
        job,
        upstream: ctx.upstream.clone(),
        // The summarizer speaks chat completions: a key sent as `x-api-key` (Anthropic's
        // clients) goes as a bearer token, which Anthropic's OpenAI-compatible endpoint takes.
        authorization: ctx
            .headers
            .get(http::header::AUTHORIZATION)
            .cloned()
            .or_else(|| {
                crate::http::headers::api_key(&ctx.headers)
                    .and_then(|key| http::HeaderValue::from_str(&format!("Bearer {key}")).ok())
            }),
        model: ctx.request.model().unwrap_or("").to_string(),
        bill: None,
    };
    let job = match std::mem::take(&mut plan.summary) {
        SummaryPlan::None => return,
        SummaryPlan::Hit => {
            Stats::add(&stats.hits);
            ctx.summary = Some("hit");
            return;
        }
        SummaryPlan::Ahead(job) => {
            summarizer.enqueue(task(job));
            return;
        }
        SummaryPlan::Unpaid { ahead } => {
            Stats::add(&stats.unpaid);
            if !ahead {
                ctx.summary = Some("unpaid");
            }
            return;
        }
        SummaryPlan::Missing(job) => job,
    };
    let blocking = job.blocking;
    // The request waits for this one: its calls go on the request's bill.
    let task = Task {
        bill: blocking.then(|| ctx.stats.bill.clone()),
        ..task(job)
    };
    if !blocking {
        summarizer.enqueue(task);
        Stats::add(&stats.fallbacks);
        ctx.summary = Some("fallback");
        return;
    }
    let deadline = Instant::now() + summarizer.timeout();
    match summarizer.obtain(&task, deadline).await {
        Ok((text, source)) if state.context.place_summary(plan, &text) => {
            let (counter, label) = match source {
                Source::Cached => (&stats.hits, "hit"),
                Source::Computed => (&stats.computed, "computed"),
            };
            Stats::add(counter);
            ctx.summary = Some(label);
        }
        Ok(_) => {
            Stats::add(&stats.fallbacks);
            ctx.summary = Some("fallback");
        }
        Err(e) => {
            tracing::warn!(error = %e, "no summary for the moved-out span: the marker stands");
            Stats::add(&stats.fallbacks);
            ctx.summary = Some("fallback");
        }
    }
}
