//! What the page shows, computed from a session's journal: the figures of each turn (tokens
//! with and without the proxy, cost under prompt caching) and a session's totals. Pure: the
//! journal's lines and a price table in, numbers out.
//!
//! Cost is the replay report's: each upstream call's input priced under the provider's prompt
//! caching (`CachePricing::call_cost`, in full-price input tokens), the shared prefix being,
//! with the proxy, the prefix it kept (`kept_prefix_tokens`) and, without it, what the
//! client's request shares with its previous one (`client_shared_tokens`: the head and the
//! leading messages left as they were, counted by [`crate::tokens::shared_prefix`], the one
//! computation the replay's report uses too; in a line without it, the previous request's
//! whole count). With the proxy every call the request made is on it (the line's
//! `calls`, [`crate::pricing::Bill`], the forwarded request's figures counted again by the
//! journal writer from the body the upstream received, with the same computation, so the page
//! and the replay's report agree call by call): the forwarded request, each round of the proxy's tools
//! (the conversation again, mostly cached), a retry after "context too long" and the
//! summarizer's calls the request waited for, at the summarizer model's prices. In dollars with the model's list prices ([`ModelPrice::dollars`], the
//! replay's conversion too): the input so priced, plus the output the upstream reported
//! (`completion_tokens`, every call of the request), the same with and without the proxy
//! (the answer is the client's either way). A model missing from the price table has no
//! dollar figure; the page then shows full-price input tokens.
//!
//! A session's [`Summary`] (its totals and what the next turn's cost needs) is what the
//! session list shows: the journal writer keeps one per session as a state record
//! ([`SUMMARY_KEY`]), added to with every batch of lines, so the list reads one small record
//! per session instead of every journal whole.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::line::RequestLine;
use crate::pricing::{CachePricing, ModelPrice};

/// The state record a session's [`Summary`] is kept under.
pub const SUMMARY_KEY: &str = "ui-summary";

/// A request's caching terms from its upstream's name and its model (the upstream routed to
/// when that name is gone).
pub type Pricing = dyn Fn(&str, Option<&str>) -> CachePricing + Send + Sync;

/// The numbers of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Its index in the journal.
    pub index: usize,
    /// Its position among the session's requests, from 1.
    pub number: usize,
    pub line: RequestLine,
    /// Tokens the upstream received for it (the forwarded request, as the writer counted
    /// it; in a line written before, the proxy's `tokens_after`).
    pub tokens_with: usize,
    /// Input cost with the proxy and without it, in full-price input tokens.
    pub cost_with: f64,
    pub cost_without: f64,
    /// The same in dollars (input and output), when the model has list prices.
    pub dollars: Option<Dollars>,
}

/// A cost in dollars, with the proxy and without it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dollars {
    pub with: f64,
    pub without: f64,
}

/// A session's totals over its requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    pub turns: usize,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub cost_with: f64,
    pub cost_without: f64,
    /// The sum of the turns' dollars, when every turn has them.
    pub dollars: Option<Dollars>,
    pub reload_rounds: u64,
    pub summaries: u64,
    pub model: Option<String>,
    pub first_at: Option<String>,
    pub last_at: Option<String>,
}

impl Totals {
    /// Share of the upstream's prompt tokens read from its cache, when it reported any.
    pub fn cached_share(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }

    /// Share of the client's tokens the proxy did not forward.
    pub fn saved_share(&self) -> Option<f64> {
        (self.tokens_before > 0).then(|| 1.0 - self.tokens_after as f64 / self.tokens_before as f64)
    }
}

/// A session's totals, and what the cost of its next turn needs: read line by line, in the
/// journal's order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// The client's tokens of the last request read: the prefix the next one shares with it
    /// without the proxy, when its parts are not known.
    pub previous_before: Option<usize>,
    /// The prefix parts of the last request read ([`crate::tokens::Parts::ids`]), when the
    /// journal writer knew them: what the next request's shared prefix is counted against.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_parts: Vec<u64>,
    /// The same of the last request as the upstream received it: what the next forwarded
    /// request's shared prefix is counted against.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_sent: Vec<u64>,
    /// How many journal records are summed (the next record's index): a writer adds only the
    /// lines past it, so a line is never counted twice. `None` in a summary written before,
    /// which is then read again from the journal.
    pub records: Option<usize>,
    pub totals: Totals,
}

impl Summary {
    /// Reads one journal record (its index `index`) into the totals; its turn, when it is a
    /// request line. `pricing` gives a request's caching terms from its upstream and model.
    pub fn read(&mut self, index: usize, record: &Value, pricing: &Pricing) -> Option<Turn> {
        self.records = Some(index + 1);
        let Some(line) = RequestLine::of(record) else {
            // Another kind of line: only its time counts.
            let ts = record.get("ts").and_then(Value::as_str);
            self.saw(ts);
            return None;
        };
        let (cost_with, cost_without, dollars) = self.add(&line, pricing);
        Some(Turn {
            index,
            number: self.totals.turns,
            tokens_with: line.calls.forwarded_tokens().unwrap_or(line.tokens_after),
            line,
            cost_with,
            cost_without,
            dollars,
        })
    }

    /// A record written at `ts`.
    fn saw(&mut self, ts: Option<&str>) {
        if let Some(ts) = ts {
            if self.totals.first_at.is_none() {
                self.totals.first_at = Some(ts.to_string());
            }
            self.totals.last_at = Some(ts.to_string());
        }
    }

    /// Adds a request line to the totals (what the journal writer does with the lines it has
    /// just written, without reading them back); its input cost with and without the proxy,
    /// and its dollars.
    pub fn add(&mut self, line: &RequestLine, pricing: &Pricing) -> (f64, f64, Option<Dollars>) {
        self.saw(Some(line.ts.as_str()).filter(|ts| !ts.is_empty()));
        let price = pricing(&line.upstream, line.model.as_deref());
        let shared_without = line
            .client_shared_tokens
            .or(self.previous_before)
            .map_or(0, |p| p.min(line.tokens_before));
        let cost_without = price.call_cost(line.tokens_before, shared_without);
        // With the proxy, every upstream call the request made (its bill); a line written
        // before the bill, its forwarded request alone.
        let cost_with = if line.calls.is_empty() {
            price.call_cost(
                line.tokens_after,
                line.kept_prefix_tokens.min(line.tokens_after),
            )
        } else {
            line.calls.cost(&price, line.model.as_deref().unwrap_or(""))
        };
        self.previous_before = Some(line.tokens_before);
        let dollars = line.model.as_deref().and_then(ModelPrice::of).map(|list| {
            let output = line.completion_tokens.unwrap_or(0);
            Dollars {
                with: list.dollars(cost_with, output),
                without: list.dollars(cost_without, output),
            }
        });
        let t = &mut self.totals;
        t.dollars = match (t.turns, t.dollars, dollars) {
            (0, _, turn) => turn,
            (_, Some(sum), Some(turn)) => Some(Dollars {
                with: sum.with + turn.with,
                without: sum.without + turn.without,
            }),
            _ => None,
        };
        t.turns += 1;
        t.tokens_before += line.tokens_before as u64;
        t.tokens_after += line.tokens_after as u64;
        t.prompt_tokens += line.prompt_tokens.unwrap_or(0);
        t.cached_tokens += line.cached_tokens.unwrap_or(0);
        t.cost_with += cost_with;
        t.cost_without += cost_without;
        t.reload_rounds += u64::from(line.reload_rounds);
        t.summaries += u64::from(matches!(line.summary.as_deref(), Some("hit" | "computed")));
        if line.model.is_some() {
            t.model.clone_from(&line.model);
        }
        (cost_with, cost_without, dollars)
    }
}

/// Turns the request lines of a journal into turns, in order, with the session's totals.
#[derive(Debug, Default)]
pub struct Reader {
    pub summary: Summary,
    /// The turns read, oldest first.
    pub turns: Vec<Turn>,
}

impl Reader {
    /// Reads one journal record (its index `index`), keeping its turn.
    pub fn read(&mut self, index: usize, record: &Value, pricing: &Pricing) {
        if let Some(turn) = self.summary.read(index, record, pricing) {
            self.turns.push(turn);
        }
    }

    /// The session's totals so far.
    pub fn totals(&self) -> &Totals {
        &self.summary.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn costs_follow_the_cached_prefix_with_and_without_the_proxy() {
        let price = CachePricing {
            cached_read_rate: 0.5,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        let pricing = move |_: &str, _: Option<&str>| price;
        let mut r = Reader::default();
        let line = |before: usize, after: usize, kept: usize| {
            json!({"event": "request", "ts": "t", "tokens_before": before, "tokens_after": after,
                   "kept_prefix_tokens": kept, "upstream": "u", "summary": "hit"})
        };
        r.read(0, &line(1000, 1000, 0), &pricing);
        r.read(1, &json!({"event": "decision", "ts": "t2"}), &pricing);
        r.read(2, &line(3000, 1200, 800), &pricing);
        assert_eq!(r.turns.len(), 2);
        assert_eq!(r.turns[0].cost_without, 1000.0);
        // Without: 1000 cached at half price, 2000 new. With: 800 kept, 400 new.
        assert_eq!(r.turns[1].cost_without, 500.0 + 2000.0);
        assert_eq!(r.turns[1].cost_with, 400.0 + 400.0);
        assert_eq!(r.turns[1].index, 2);
        assert_eq!(r.totals().turns, 2);
        assert_eq!(r.totals().tokens_before, 4000);
        assert_eq!(r.totals().summaries, 2);
        assert_eq!(r.totals().last_at.as_deref(), Some("t"));
        assert_eq!(r.totals().saved_share(), Some(1.0 - 2200.0 / 4000.0));
    }

    /// With the proxy a turn costs every call it made: its forwarded request, a round of the
    /// proxy's tools (the request again, read from the cache, and the round after it) and a
    /// summary it waited for, at the summarizer's list prices (gpt-4o-mini: $0.15 in, $0.60
    /// out per 1M, against gpt-4o's $2.50 in).
    #[test]
    fn the_cost_with_the_proxy_counts_reload_rounds_and_summaries() {
        let price = CachePricing {
            cached_read_rate: 0.5,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        let pricing = move |_: &str, _: Option<&str>| price;
        let mut r = Reader::default();
        r.read(
            0,
            &json!({"event": "request", "model": "gpt-4o", "tokens_before": 3000,
                    "tokens_after": 1200, "kept_prefix_tokens": 800, "upstream": "u",
                    "calls": [
                        {"kind": "summarizer", "tokens": 2000, "output": 300, "model": "gpt-4o-mini"},
                        {"kind": "forwarded", "tokens": 1200, "shared": 800},
                        {"kind": "reload", "tokens": 1500, "shared": 1200}]}),
            &pricing,
        );
        let summary = (2000.0 * 0.15 + 300.0 * 0.60) / 2.50;
        let forwarded = 400.0 + 400.0;
        let reload = 300.0 + 600.0;
        let t = &r.turns[0];
        assert!(
            (t.cost_with - (summary + forwarded + reload)).abs() < 1e-9,
            "{t:?}"
        );
        assert_eq!(t.cost_without, 3000.0);
        assert!((r.totals().cost_with - t.cost_with).abs() < 1e-9);
        // Dollars: those units at gpt-4o's input price.
        let d = t.dollars.unwrap();
        assert!((d.with - t.cost_with * 2.5 / 1e6).abs() < 1e-12, "{d:?}");
    }

    /// Dollars are the units at the model's list prices, plus its output; a turn of a model
    /// the table does not know leaves the session without a dollar total.
    #[test]
    fn dollars_follow_the_list_prices_of_the_model() {
        let price = CachePricing {
            cached_read_rate: 0.1,
            cache_write_premium: 0.0,
            min_cacheable_prefix: 0,
            cache_ttl_secs: 300,
        };
        let pricing = move |_: &str, _: Option<&str>| price;
        let line = |model: &str, before: usize, out: u64| {
            json!({"event": "request", "model": model, "tokens_before": before,
                   "tokens_after": before, "kept_prefix_tokens": 0, "upstream": "u",
                   "completion_tokens": out})
        };
        let mut r = Reader::default();
        // gpt-5: $1.25 in, $10 out per million.
        r.read(0, &line("gpt-5", 1_000_000, 1_000), &pricing);
        let d = r.turns[0].dollars.unwrap();
        assert!((d.without - 1.26).abs() < 1e-9, "{d:?}");
        assert!((d.with - 1.26).abs() < 1e-9);
        // Without: 1M cached at a tenth, 1M new; with: nothing kept, 2M at full price.
        r.read(1, &line("gpt-5", 2_000_000, 0), &pricing);
        let d = r.turns[1].dollars.unwrap();
        assert!((d.without - (0.125 + 1.25)).abs() < 1e-9, "{d:?}");
        assert!((d.with - 2.5).abs() < 1e-9);
        let total = r.totals().dollars.unwrap();
        assert!((total.with - 3.76).abs() < 1e-9);
        r.read(2, &line("my-local-llama", 10, 0), &pricing);
        assert_eq!(r.turns[2].dollars, None);
        assert_eq!(r.totals().dollars, None);
    }
}
