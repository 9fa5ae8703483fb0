//! One summarizer call: the request (see `context::summary`) sent to the upstream, its JSON
//! answer read whole (bounded) and its text and usage taken out.

use futures_util::StreamExt;
use http::HeaderValue;
use serde_json::Value;

use super::Failure;
use crate::context::summary::{self, SummarizerConfig};
use crate::context::SummaryJob;
use crate::upstream::Upstream;

/// Longest summarizer answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What the summarizer answered.
pub struct Answer {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

pub async fn ask(
    upstream: &Upstream,
    authorization: Option<&HeaderValue>,
    model: &str,
    config: &SummarizerConfig,
    job: &SummaryJob,
) -> Result<Answer, Failure> {
    let body = summary::request_body(
        model,
        config.max_summary_tokens,
        config.instructions.as_deref(),
        job.previous.as_deref(),
        &job.span,
    );
    let request = upstream.json_post(
        "/chat/completions",
        authorization,
        bytes::Bytes::from(body.to_string()),
    );
    let incoming = upstream
        .send(&request)
        .await
        .map_err(|e| Failure::Upstream(e.to_string()))?;
    let status = incoming.status;
    let mut bytes = Vec::new();
    let mut chunks = std::pin::pin!(incoming.into_stream());
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| Failure::Upstream(e.to_string()))?;
        if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(Failure::Upstream("answer too long".into()));
        }
        bytes.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(Failure::Upstream(format!("status {status}")));
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| Failure::Malformed)?;
    let text = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let usage = |k: &str| {
        v.pointer(&format!("/usage/{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(Answer {
        text,
        prompt_tokens: usage("prompt_tokens"),
        completion_tokens: usage("completion_tokens"),
    })
}
