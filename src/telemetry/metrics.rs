//! Process-wide metrics, served at `GET /metrics` in the OpenMetrics text format (which
//! Prometheus scrapes) through the `prometheus-client` crate.
//!
//! Recording is cheap on the request path: relaxed atomic adds, and for labelled metrics one
//! read-locked map lookup. Labels are low-cardinality only: the route, the status class, the
//! upstream's configured name, a bounded set of model names ([`MAX_MODEL_LABELS`], the rest are
//! `other`), action kinds, the store backend. Never a session, a tenant or a key.
//!
//! The counters of the first version (`context_proxy_chat_requests_total`, …) keep their names;
//! they are plain atomics that callers add to, exposed at scrape time. The upstream's usage is
//! read by [`crate::wire::UsageTap`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::wire::Usage;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most distinct model names used as label values; later ones are counted as `other`.
pub const MAX_MODEL_LABELS: usize = 64;
/// Longest model name used as a label value (longer ones are `other`).
const MAX_MODEL_LABEL_LEN: usize = 100;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status_class: &'static str,
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    route: &'static str,
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 100 µs to about 105 s (×2 each).
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

/// Every metric the proxy keeps.
#[derive(Debug)]
pub struct Metrics {
    pub chat_requests: AtomicU64,
    /// Chat requests whose messages the proxy rewrote.
    pub context_rewritten: AtomicU64,
    /// Chat requests forwarded unchanged because the store failed (fail-open).
    pub context_fail_open: AtomicU64,
    /// Chat requests left alone because the conversation was malformed.
    pub context_malformed: AtomicU64,
    /// Conversations whose budget forced a cut costing more than going direct (warned once
    /// each).
    pub budget_unpaid_conversations: AtomicU64,
    pub tokens_before: AtomicU64,
    pub tokens_after: AtomicU64,
    /// Upstream answers whose `usage.prompt_tokens` was read.
    pub usage_samples: AtomicU64,
    /// Σ (upstream's prompt_tokens − proxy's count), and Σ of its absolute value.
    pub usage_diff_sum: AtomicI64,
    pub usage_diff_abs_sum: AtomicU64,
    /// Rounds of the proxy's own tool calls answered (context_read / context_search).
    pub reload_rounds: AtomicU64,
    pub reload_read_ok: AtomicU64,
    pub reload_read_failed: AtomicU64,
    pub reload_search_ok: AtomicU64,
    pub reload_search_failed: AtomicU64,
    /// Exchanges the traffic recorder dropped because its queue was full.
    pub record_dropped: AtomicU64,
    /// Exchanges the traffic recorder could not write (a full disk, …), shared with it.
    pub recorder_write_errors: std::sync::Arc<AtomicU64>,
    /// The page's journal lines dropped because its writer's queue was full, or could not be
    /// written (the store failed), shared with the writer.
    pub journal_dropped: std::sync::Arc<AtomicU64>,
    /// The summarizer's counters (`context_proxy_summary_*`).
    pub summarizer: std::sync::Arc<crate::telemetry::summarizer_stats::Stats>,
    /// Every upstream call of a managed request, by kind (`context_proxy_calls_*`; the
    /// summarizer's own, shared with its counters).
    pub calls: std::sync::Arc<crate::telemetry::calls::CallStats>,

    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: HistogramFamily<RouteLabels>,
    in_flight_requests: Gauge,
    open_responses: Gauge,
    proxy_seconds: HistogramFamily<RouteLabels>,
    upstream_calls: HistogramFamily<RouteLabels>,
    upstream_seconds: HistogramFamily<UpstreamLabels>,
    first_byte_seconds: HistogramFamily<UpstreamLabels>,
    response_seconds: HistogramFamily<UpstreamLabels>,
    model_tokens_before: Family<ModelLabels, Counter>,
    model_tokens_after: Family<ModelLabels, Counter>,
    model_tokens_saved: Family<ModelLabels, Counter>,
    model_tokens_kept_prefix: Family<ModelLabels, Counter>,
    upstream_prompt_tokens: Family<ModelLabels, Counter>,
    upstream_cached_tokens: Family<ModelLabels, Counter>,
    upstream_cache_creation_tokens: Family<ModelLabels, Counter>,
    upstream_completion_tokens: Family<ModelLabels, Counter>,
    actions: Family<KindLabels, Counter>,
    store_errors: Family<BackendLabels, Counter>,
    quota_exceeded: Family<ScopeLabels, Counter>,
    rejected_erased: Counter,
    compactions: Family<OutcomeLabels, Counter>,
    models: Mutex<HashSet<String>>,
}

/// Registers `metric` under `name` and gives it back: a metric is a handle, so the one kept and
/// the one registered count together.
fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = registered(
            &mut registry,
            "context_proxy_requests",
            "Requests answered, by route (chat, responses, messages, passthrough, context, ui, health, metrics, other), status class and upstream (none when no upstream was called).",
            Family::<RequestLabels, Counter>::default(),
        );
        let request_seconds: HistogramFamily<RouteLabels> = registered(
            &mut registry,
            "context_proxy_request_duration_seconds",
            "Time from the request's arrival to its response headers, by route.",
            Family::new_with_constructor(latency_histogram),
        );
        let in_flight_requests = registered(
            &mut registry,
            "context_proxy_in_flight_requests",
            "Requests received whose response headers are not sent yet.",
            Gauge::default(),
        );
        let open_responses = registered(
            &mut registry,
            "context_proxy_in_flight_chat_responses",
            "Chat responses (JSON or streams) being relayed: headers sent, body not ended.",
            Gauge::default(),
        );
        let proxy_seconds = registered(
            &mut registry,
            "context_proxy_chat_proxy_seconds",
            "The proxy's own time before forwarding a managed request (parse, identify, plan, apply), by route (chat, responses).",
            Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram),
        );
        let upstream_calls = registered(
            &mut registry,
            "context_proxy_chat_upstream_calls",
            "Upstream calls made for one managed request: 1, plus each round of the proxy's own tools and an overflow retry (at most [context.reload] max_rounds + 3), by route (chat, responses).",
            Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 24.0, 36.0])
            }),
        );
        let upstream_seconds: HistogramFamily<UpstreamLabels> = registered(
            &mut registry,
            "context_proxy_chat_upstream_seconds",
            "Time from forwarding a managed request to the upstream's response headers (first call), by route (chat, responses) and upstream.",
            Family::new_with_constructor(latency_histogram),
        );
        let first_byte_seconds: HistogramFamily<UpstreamLabels> = registered(
            &mut registry,
            "context_proxy_chat_first_byte_seconds",
            "Time from a managed request's arrival to the first body byte sent to the client (time to first token for streams), by route (chat, responses) and upstream.",
            Family::new_with_constructor(latency_histogram),
        );
        let response_seconds: HistogramFamily<UpstreamLabels> = registered(
            &mut registry,
            "context_proxy_chat_response_seconds",
            "Time from a managed request's arrival to the end of its response body, by route (chat, responses) and upstream.",
            Family::new_with_constructor(latency_histogram),
        );
        let model_counter = |registry: &mut Registry, name: &str, help: &str| {
            registered(
                registry,
                name,
                help,
                Family::<ModelLabels, Counter>::default(),
            )
        };
        let model_tokens_before = model_counter(
            &mut registry,
            "context_proxy_model_tokens_before",
            "Prompt tokens as the clients sent them (proxy count), by model.",
        );
        let model_tokens_after = model_counter(
            &mut registry,
            "context_proxy_model_tokens_after",
            "Prompt tokens as forwarded upstream (proxy count), by model.",
        );
        let model_tokens_saved = model_counter(
            &mut registry,
            "context_proxy_model_tokens_saved",
            "Prompt tokens removed by context management (before - after), by model.",
        );
        let model_tokens_kept_prefix = model_counter(
            &mut registry,
            "context_proxy_model_tokens_kept_prefix",
            "Prompt tokens forwarded exactly as in the conversation's previous request (the cached prefix the proxy kept; proxy count), by model.",
        );
        let upstream_prompt_tokens = model_counter(
            &mut registry,
            "context_proxy_upstream_prompt_tokens",
            "usage.prompt_tokens reported by the upstream (summed over its calls), by model.",
        );
        let upstream_cached_tokens = model_counter(
            &mut registry,
            "context_proxy_upstream_cached_tokens",
            "usage.prompt_tokens_details.cached_tokens (Anthropic: cache_read_input_tokens) reported by the upstream, by model.",
        );
        let upstream_cache_creation_tokens = model_counter(
            &mut registry,
            "context_proxy_upstream_cache_creation_tokens",
            "Anthropic's usage.cache_creation_input_tokens (prompt tokens written to the cache, billed at a premium) reported by the upstream, by model.",
        );
        let upstream_completion_tokens = model_counter(
            &mut registry,
            "context_proxy_upstream_completion_tokens",
            "usage.completion_tokens reported by the upstream, by model.",
        );
        let actions = registered(
            &mut registry,
            "context_proxy_actions",
            "What context management did, by kind: truncated, compacted and offloaded messages, reloaded (calls of the proxy's own tools answered).",
            Family::<KindLabels, Counter>::default(),
        );
        let store_errors = registered(
            &mut registry,
            "context_proxy_store_errors",
            "Chat requests served without context management because the store failed, by backend.",
            Family::<BackendLabels, Counter>::default(),
        );
        let quota_exceeded = registered(
            &mut registry,
            "context_proxy_store_quota_exceeded",
            "Chat requests forwarded unmanaged because storing what they remove would go over a daily write quota, by scope (tenant, store).",
            Family::<ScopeLabels, Counter>::default(),
        );
        let rejected_erased = registered(
            &mut registry,
            "context_proxy_rejected_key_items_erased",
            "Store items erased because the upstream refused (401/403) the key of a tenant it had not accepted before.",
            Counter::default(),
        );
        let compactions = registered(
            &mut registry,
            "context_proxy_responses_compactions",
            "Responses API compactions (/v1/responses/compact, compaction_trigger) and the proxy's sealed compaction items, by outcome: computed, hit (the summary was cached), native (forwarded to an upstream that compacts natively), marker (no summary could be had: the item sealed around the marker alone), forwarded (nothing could be sealed), expanded (a sealed item put back as its summary).",
            Family::<OutcomeLabels, Counter>::default(),
        );
        registry.register(
            "context_proxy_build",
            "The proxy's version.",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let calls = std::sync::Arc::<crate::telemetry::calls::CallStats>::default();
        Metrics {
            chat_requests: AtomicU64::new(0),
            context_rewritten: AtomicU64::new(0),
            context_fail_open: AtomicU64::new(0),
            context_malformed: AtomicU64::new(0),
            budget_unpaid_conversations: AtomicU64::new(0),
            tokens_before: AtomicU64::new(0),
            tokens_after: AtomicU64::new(0),
            usage_samples: AtomicU64::new(0),
            usage_diff_sum: AtomicI64::new(0),
            usage_diff_abs_sum: AtomicU64::new(0),
            reload_rounds: AtomicU64::new(0),
            reload_read_ok: AtomicU64::new(0),
            reload_read_failed: AtomicU64::new(0),
            reload_search_ok: AtomicU64::new(0),
            reload_search_failed: AtomicU64::new(0),
            record_dropped: AtomicU64::new(0),
            recorder_write_errors: std::sync::Arc::default(),
            journal_dropped: std::sync::Arc::default(),
            summarizer: std::sync::Arc::new(crate::telemetry::summarizer_stats::Stats {
                every_call: calls.clone(),
                ..Default::default()
            }),
            calls,
            registry,
            requests,
            request_seconds,
            in_flight_requests,
            open_responses,
            proxy_seconds,
            upstream_calls,
            upstream_seconds,
            first_byte_seconds,
            response_seconds,
            model_tokens_before,
            model_tokens_after,
            model_tokens_saved,
            model_tokens_kept_prefix,
            upstream_prompt_tokens,
            upstream_cached_tokens,
            upstream_cache_creation_tokens,
            upstream_completion_tokens,
            actions,
            store_errors,
            quota_exceeded,
            rejected_erased,
            compactions,
            models: Mutex::new(HashSet::new()),
        }
    }
}

/// The name of the upstream that answered a request, left in the response's extensions by the
/// route so the router can label the request with it.
#[derive(Debug, Clone)]
pub struct UpstreamName(pub String);

/// The route label of a request path.
pub fn route_of(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat",
        "/v1/responses" => "responses",
        "/v1/messages" | "/v1/messages/count_tokens" => "messages",
        "/healthz" | "/readyz" => "health",
        "/metrics" => "metrics",
        _ if path.starts_with("/v1/context/") => "context",
        "/ui" => "ui",
        _ if path.starts_with("/ui/") => "ui",
        _ if path.starts_with("/v1/") => "passthrough",
        _ => "other",
    }
}

fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Counts a request as in flight until dropped (when its response headers are out).
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One chat request, once its response has ended: what the record phase knows.
pub struct ChatSample<'a> {
    /// The managed route (`chat`, `responses`): the label of the histograms.
    pub route: &'static str,
    pub model: Option<&'a str>,
    pub upstream: &'a str,
    pub tokens_before: usize,
    pub tokens_after: usize,
    /// Tokens of the forwarded request its conversation's previous request also had.
    pub kept_prefix_tokens: usize,
    pub truncated: usize,
    pub compacted: usize,
    pub offloaded: usize,
    /// Calls of the proxy's own tools answered.
    pub reloaded: u32,
    /// The request went in the form its conversation forwarded before (a model binding
    /// thinking to its prefix), not the client's.
    pub repeated: bool,
    /// Upstream calls made for the request (the first, the tool loop's, an overflow retry).
    pub upstream_calls: u32,
    pub usage: Option<&'a Usage>,
    /// The store failed and the request went out unmanaged; the backend's name.
    pub store_error: Option<&'static str>,
    /// Arrival → forwarded (the proxy's own time).
    pub proxy: Option<Duration>,
    /// Forwarded → the upstream's response headers.
    pub upstream_wait: Option<Duration>,
    /// Arrival → first body byte to the client.
    pub first_byte: Option<Duration>,
    /// Arrival → end of the response body.
    pub total: Option<Duration>,
}

impl Metrics {
    /// Records the upstream's billed prompt tokens against the proxy's own count.
    pub fn record_usage(&self, counted: usize, billed: u64) {
        let diff = billed as i64 - counted as i64;
        self.usage_samples.fetch_add(1, Ordering::Relaxed);
        self.usage_diff_sum.fetch_add(diff, Ordering::Relaxed);
        self.usage_diff_abs_sum
            .fetch_add(diff.unsigned_abs(), Ordering::Relaxed);
        tracing::debug!(
            counted,
            billed,
            diff,
            "prompt tokens: proxy count vs upstream usage"
        );
    }

    /// Marks a request as in flight until the returned guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight_requests.inc();
        InFlight(&self.in_flight_requests)
    }

    /// Counts one answered request (its response headers are out).
    pub fn record_request(
        &self,
        route: &'static str,
        status: http::StatusCode,
        upstream: Option<&UpstreamName>,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                status_class: status_class(status),
                upstream: upstream.map_or_else(|| "none".to_string(), |u| u.0.clone()),
            })
            .inc();
        self.request_seconds
            .get_or_create(&RouteLabels { route })
            .observe(elapsed.as_secs_f64());
    }

    /// A chat response starts being relayed; [`Metrics::record_chat`] ends it.
    pub fn chat_response_started(&self) {
        self.open_responses.inc();
    }

    /// Records a chat request whose response has ended (or whose client left).
    pub fn record_chat(&self, s: &ChatSample<'_>) {
        self.open_responses.dec();
        let upstream = UpstreamLabels {
            route: s.route,
            upstream: s.upstream.to_string(),
        };
        let route = RouteLabels { route: s.route };
        if let Some(d) = s.proxy {
            self.proxy_seconds
                .get_or_create(&route)
                .observe(d.as_secs_f64());
        }
        if s.upstream_calls > 0 {
            self.upstream_calls
                .get_or_create(&route)
                .observe(f64::from(s.upstream_calls));
        }
        for (family, d) in [
            (&self.upstream_seconds, s.upstream_wait),
            (&self.first_byte_seconds, s.first_byte),
            (&self.response_seconds, s.total),
        ] {
            if let Some(d) = d {
                family.get_or_create(&upstream).observe(d.as_secs_f64());
            }
        }
        let model = ModelLabels {
            model: self.model_label(s.model),
        };
        let add = |family: &Family<ModelLabels, Counter>, n: u64| {
            if n > 0 {
                family.get_or_create(&model).inc_by(n);
            }
        };
        add(&self.model_tokens_before, s.tokens_before as u64);
        add(&self.model_tokens_after, s.tokens_after as u64);
        add(
            &self.model_tokens_saved,
            s.tokens_before.saturating_sub(s.tokens_after) as u64,
        );
        add(&self.model_tokens_kept_prefix, s.kept_prefix_tokens as u64);
        if let Some(usage) = s.usage {
            add(&self.upstream_prompt_tokens, usage.prompt_tokens);
            add(&self.upstream_completion_tokens, usage.completion_tokens);
            add(
                &self.upstream_cached_tokens,
                usage.cached_tokens.unwrap_or(0),
            );
            add(
                &self.upstream_cache_creation_tokens,
                usage.cache_creation_tokens.unwrap_or(0),
            );
        }
        for (kind, n) in [
            ("truncated", s.truncated as u64),
            ("compacted", s.compacted as u64),
            ("offloaded", s.offloaded as u64),
            ("reloaded", u64::from(s.reloaded)),
            ("repeated", u64::from(s.repeated)),
        ] {
            if n > 0 {
                self.actions.get_or_create(&KindLabels { kind }).inc_by(n);
            }
        }
        if let Some(backend) = s.store_error {
            self.store_errors
                .get_or_create(&BackendLabels { backend })
                .inc();
        }
    }

    /// `model` as a label value: itself while fewer than [`MAX_MODEL_LABELS`] names were seen,
    /// `none` when there is none, `other` beyond the limit.
    fn model_label(&self, model: Option<&str>) -> String {
        let Some(model) = model.filter(|m| !m.is_empty()) else {
            return "none".into();
        };
        if model.len() > MAX_MODEL_LABEL_LEN {
            return "other".into();
        }
        let mut seen = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(model) {
            return model.to_string();
        }
        if seen.len() < MAX_MODEL_LABELS {
            seen.insert(model.to_string());
            return model.to_string();
        }
        "other".into()
    }

    /// A request forwarded unmanaged because of a daily write quota, by the quota's scope
    /// (`tenant` or `store`: the names of the context layer's `quota::Exceeded`).
    pub fn record_quota_exceeded(&self, scope: &'static str) {
        self.quota_exceeded
            .get_or_create(&ScopeLabels { scope })
            .inc();
    }

    /// Items erased after the upstream refused a new tenant's key.
    pub fn record_rejected_erased(&self, items: usize) {
        self.rejected_erased.inc_by(items as u64);
    }

    /// A Responses API compaction, by outcome (`computed`, `hit`, `native`, `forwarded`,
    /// `expanded`).
    pub fn record_compaction(&self, outcome: &'static str) {
        self.compactions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut legacy = Registry::default();
        for (name, help, value) in [
            (
                "context_proxy_chat_requests",
                "Chat-completions requests handled.",
                &self.chat_requests,
            ),
            (
                "context_proxy_context_rewritten",
                "Chat requests whose messages were rewritten.",
                &self.context_rewritten,
            ),
            (
                "context_proxy_context_fail_open",
                "Chat requests forwarded unchanged because the store failed.",
                &self.context_fail_open,
            ),
            (
                "context_proxy_context_malformed",
                "Chat requests left alone because the conversation was malformed.",
                &self.context_malformed,
            ),
            (
                "context_proxy_budget_unpaid_conversations",
                "Conversations whose context budget forced a cut costing more than going direct under the upstream's cache prices (each warned once).",
                &self.budget_unpaid_conversations,
            ),
            (
                "context_proxy_tokens_before",
                "Prompt tokens as the clients sent them (proxy count).",
                &self.tokens_before,
            ),
            (
                "context_proxy_tokens_after",
                "Prompt tokens as forwarded upstream (proxy count).",
                &self.tokens_after,
            ),
            (
                "context_proxy_usage_samples",
                "Upstream answers whose usage.prompt_tokens was read.",
                &self.usage_samples,
            ),
            (
                "context_proxy_usage_diff_abs_tokens",
                "Sum of |upstream prompt_tokens - proxy count|.",
                &self.usage_diff_abs_sum,
            ),
            (
                "context_proxy_reload_rounds",
                "Rounds of the proxy's own tool calls answered before calling the upstream again.",
                &self.reload_rounds,
            ),
            (
                "context_proxy_reload_read_ok",
                "context_read calls answered with content.",
                &self.reload_read_ok,
            ),
            (
                "context_proxy_reload_read_failed",
                "context_read calls answered with an error (bad arguments, unknown ref, store down).",
                &self.reload_read_failed,
            ),
            (
                "context_proxy_reload_search_ok",
                "context_search calls answered with results.",
                &self.reload_search_ok,
            ),
            (
                "context_proxy_reload_search_failed",
                "context_search calls answered with an error (bad pattern, unknown ref, store down).",
                &self.reload_search_failed,
            ),
            (
                "context_proxy_record_dropped",
                "Exchanges the traffic recorder dropped because its queue was full.",
                &self.record_dropped,
            ),
            (
                "context_proxy_recorder_write_errors",
                "Exchanges the traffic recorder could not write (a full disk, the file size limit); none is left half written.",
                &self.recorder_write_errors,
            ),
            (
                "context_proxy_journal_dropped",
                "The page's journal lines dropped: its writer's queue was full, or the store failed.",
                &self.journal_dropped,
            ),
        ] {
            legacy.register(name, help, ConstCounter::new(value.load(Ordering::Relaxed)));
        }
        for (name, help, value) in self.summarizer.entries() {
            legacy.register(
                format!("context_proxy_summary_{name}"),
                help,
                ConstCounter::new(value.load(Ordering::Relaxed)),
            );
        }
        let (calls, input_tokens, cost) = (
            Family::<KindLabels, Counter>::default(),
            Family::<KindLabels, Counter>::default(),
            Family::<KindLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default(),
        );
        for f in self.calls.figures() {
            let kind = KindLabels { kind: f.kind };
            calls.get_or_create(&kind).inc_by(f.calls);
            input_tokens.get_or_create(&kind).inc_by(f.input_tokens);
            cost.get_or_create(&kind).inc_by(f.cost);
        }
        legacy.register(
            "context_proxy_calls",
            "Upstream calls made for managed requests, by kind: forwarded (the request), reload (a round of the proxy's own tools), retry (after \"context too long\"), summarizer (a summary, in the background too).",
            calls,
        );
        legacy.register(
            "context_proxy_call_input_tokens",
            "Input tokens of those calls by the proxy's count (the summarizer's: as its upstream reported them), by kind.",
            input_tokens,
        );
        legacy.register(
            "context_proxy_call_cost_tokens",
            "What those calls cost, in full-price input tokens of each request's model under its upstream's cache prices (a summary at its model's list prices, output included), by kind.",
            cost,
        );
        legacy.register(
            "context_proxy_usage_diff_tokens_sum",
            "Sum of (upstream prompt_tokens - proxy count); negative when the proxy over-counts.",
            ConstGauge::new(self.usage_diff_sum.load(Ordering::Relaxed)),
        );
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &legacy);
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_eof(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_openmetrics_text() {
        let m = Metrics::default();
        m.record_usage(100, 103);
        m.record_usage(100, 98);
        let text = m.render();
        assert!(
            text.contains("context_proxy_usage_samples_total 2\n"),
            "{text}"
        );
        assert!(text.contains("context_proxy_usage_diff_abs_tokens_total 5\n"));
        assert!(text.contains("context_proxy_usage_diff_tokens_sum 1\n"));
        assert!(text.contains("context_proxy_build_info{version=\""));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn labels_are_bounded_and_counted() {
        let m = Metrics::default();
        for i in 0..MAX_MODEL_LABELS + 10 {
            let model = format!("model-{i}");
            m.chat_response_started();
            m.record_chat(&ChatSample {
                route: "chat",
                model: Some(&model),
                upstream: "u",
                tokens_before: 10,
                tokens_after: 4,
                kept_prefix_tokens: 3,
                truncated: 0,
                compacted: 1,
                offloaded: 0,
                reloaded: 0,
                repeated: false,
                upstream_calls: 1,
                usage: None,
                store_error: None,
                proxy: Some(Duration::from_micros(300)),
                upstream_wait: None,
                first_byte: None,
                total: None,
            });
        }
        let text = m.render();
        assert!(text.contains("context_proxy_model_tokens_saved_total{model=\"other\"} 60\n"));
        assert!(text.contains("context_proxy_model_tokens_saved_total{model=\"model-0\"} 6\n"));
        assert!(
            text.contains("context_proxy_model_tokens_kept_prefix_total{model=\"model-0\"} 3\n")
        );
        assert!(text.contains(&format!(
            "context_proxy_actions_total{{kind=\"compacted\"}} {}\n",
            MAX_MODEL_LABELS + 10
        )));
        assert!(text.contains(&format!(
            "context_proxy_chat_proxy_seconds_count{{route=\"chat\"}} {}\n",
            MAX_MODEL_LABELS + 10
        )));
        assert!(text.contains("context_proxy_in_flight_chat_responses 0\n"));
    }
}
