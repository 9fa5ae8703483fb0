//! JSON API responses: web-search results, a code host's issue list, and the support desk's
//! records (customers, orders, tracking, FAQ entries, tickets, refunds).
//!
//! Records are built as `serde_json::Value` (key order preserved) and rendered compact or
//! pretty, as real APIs do.

use serde_json::{json, Value};

use super::prose;
use super::rng::Rng;
use super::words::{self, put, Instant};

/// `value` as an API prints it: pretty-printed or compact.
pub fn render(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    // Serializing a `Value` cannot fail (its keys are strings).
    text.unwrap_or_default()
}

/// One web-search hit.
#[derive(Debug, Clone)]
pub struct Hit {
    pub title: String,
    pub url: String,
}

/// A search API response for `query` with `n` hits, and the hits.
pub fn search_results(rng: &mut Rng, query: &str, n: usize) -> (String, Vec<Hit>) {
    let mut hits = Vec::with_capacity(n);
    let mut results = Vec::with_capacity(n);
    for _ in 0..n {
        let domain = rng.pick(words::DOMAINS);
        let slug: Vec<&str> = (0..rng.between(2, 6)).map(|_| words::word(rng)).collect();
        let url = format!("https://{domain}/{}", slug.join("-"));
        let title = format!("{} — {}", prose::heading(rng), domain);
        results.push(json!({
            "title": title,
            "url": url,
            "snippet": prose::sentences(rng, 2),
            "published": Instant::random(rng).date(),
        }));
        hits.push(Hit { title, url });
    }
    let body = json!({
        "query": query,
        "results": results,
        "total_estimated": rng.log_uniform(1_000, 50_000_000),
    });
    (render(&body, rng.chance(50)), hits)
}

/// A code host's JSON issue list of about `target` bytes.
pub fn issue_list(rng: &mut Rng, repo: &str, target: usize) -> String {
    let mut issues = Vec::new();
    let mut size = 0;
    while size < target {
        let number = rng.between(1, 4000);
        let issue = json!({
            "url": format!("https://api.github.com/repos/{repo}/issues/{number}"),
            "number": number,
            "title": prose::sentence(rng).trim_end_matches('.'),
            "user": {"login": words::snake(rng), "id": rng.between(1_000, 90_000_000), "type": "User"},
            "labels": [{"name": rng.pick(&["bug", "enhancement", "good first issue", "docs", "performance"]), "color": rng.hex(6)}],
            "state": rng.pick(&["open", "open", "closed"]),
            "comments": rng.below(40),
            "created_at": Instant::random(rng).iso(),
            "body": prose::paragraph(rng),
        });
        size += render(&issue, false).len();
        issues.push(issue);
    }
    render(&Value::Array(issues), rng.chance(30))
}

/// An order line.
#[derive(Debug, Clone)]
pub struct Line {
    pub product: &'static str,
    pub sku: String,
    pub quantity: usize,
    pub price_cents: usize,
}

/// One customer order.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: String,
    pub placed: Instant,
    pub status: &'static str,
    pub lines: Vec<Line>,
    pub carrier: &'static str,
    pub tracking: String,
}

/// A customer with their orders.
#[derive(Debug, Clone)]
pub struct Customer {
    pub id: String,
    pub name: String,
    pub email: String,
    pub city: &'static str,
    pub tier: &'static str,
    pub orders: Vec<Order>,
}

impl Customer {
    /// A customer with 1 to 8 orders.
    pub fn random(rng: &mut Rng) -> Customer {
        let first = rng.pick(words::FIRST_NAMES);
        let last = rng.pick(words::LAST_NAMES);
        let email = format!(
            "{}.{}{}@{}",
            first.to_lowercase(),
            last.to_lowercase().replace('ü', "ue"),
            rng.below(100),
            rng.pick(&[
                "gmail.com",
                "outlook.com",
                "proton.me",
                "yahoo.co.jp",
                "web.de"
            ])
        );
        let orders = (0..rng.between(1, 8))
            .map(|_| {
                let lines = (0..rng.between(1, 4))
                    .map(|_| Line {
                        product: rng.pick(words::PRODUCTS),
                        sku: format!("SKU-{}", rng.digits(6)),
                        quantity: rng.between(1, 3),
                        price_cents: rng.log_uniform(499, 129_900),
                    })
                    .collect();
                Order {
                    id: format!("A{}", rng.digits(7)),
                    placed: Instant::random(rng),
                    status: rng.pick(&[
                        "processing",
                        "shipped",
                        "shipped",
                        "delivered",
                        "delivered",
                        "cancelled",
                        "returned",
                    ]),
                    lines,
                    carrier: rng.pick(words::CARRIERS),
                    tracking: format!("1Z{}", rng.alnum(16).to_uppercase()),
                }
            })
            .collect();
        Customer {
            id: format!("cus_{}", rng.alnum(14)),
            name: format!("{first} {last}"),
            email,
            city: rng.pick(words::CITIES),
            tier: rng.pick(&["standard", "standard", "plus", "gold"]),
            orders,
        }
    }
}

fn money(cents: usize) -> Value {
    json!({"amount": cents, "currency": "USD", "formatted": format!("${}.{:02}", cents / 100, cents % 100)})
}

/// The order-lookup API's answer for `order`.
pub fn order_status(rng: &mut Rng, customer: &Customer, order: &Order) -> Value {
    let total: usize = order.lines.iter().map(|l| l.price_cents * l.quantity).sum();
    let mut v = json!({
        "order_id": order.id,
        "customer_id": customer.id,
        "status": order.status,
        "placed_at": order.placed.iso(),
        "items": order.lines.iter().map(|l| json!({
            "sku": l.sku, "name": l.product, "quantity": l.quantity, "unit_price": money(l.price_cents),
        })).collect::<Vec<_>>(),
        "total": money(total),
        "shipping": {
            "method": rng.pick(&["standard", "express", "pickup"]),
            "carrier": order.carrier,
            "tracking_number": order.tracking,
            "address": {"city": customer.city, "country": rng.pick(&["US", "DE", "JP", "PT", "CA"])},
        },
    });
    if order.status == "shipped" || order.status == "delivered" {
        v["estimated_delivery"] = json!(order
            .placed
            .plus_ms(rng.between(2, 9) as u64 * 86_400_000)
            .date());
    }
    v
}

/// The carrier's tracking events for `order`.
pub fn tracking(rng: &mut Rng, order: &Order) -> Value {
    let mut at = order.placed.plus_ms(rng.below(86_400_000));
    let mut events = Vec::new();
    for label in [
        "Label created",
        "Picked up",
        "Departed facility",
        "Arrived at facility",
        "In transit",
        "Out for delivery",
        "Delivered",
    ] {
        if order.status != "delivered" && label == "Delivered" {
            break;
        }
        events
            .push(json!({"time": at.iso(), "status": label, "location": rng.pick(words::CITIES)}));
        at = at.plus_ms(rng.log_uniform(3_600_000, 2 * 86_400_000) as u64);
        if order.status == "processing" {
            break;
        }
    }
    json!({"tracking_number": order.tracking, "carrier": order.carrier, "events": events})
}

/// The customer-lookup API's answer; `full_history` adds every past order at length, which
/// makes it large.
pub fn customer_profile(rng: &mut Rng, customer: &Customer, history_target: usize) -> Value {
    let mut v = json!({
        "id": customer.id,
        "name": customer.name,
        "email": customer.email,
        "tier": customer.tier,
        "city": customer.city,
        "created_at": Instant::random(rng).iso(),
        "open_orders": customer.orders.iter().filter(|o| o.status == "processing" || o.status == "shipped").map(|o| o.id.clone()).collect::<Vec<_>>(),
        "lifetime_orders": customer.orders.len() + rng.below(40) as usize,
    });
    if history_target > 0 {
        let mut history = Vec::new();
        let mut size = 0;
        while size < history_target {
            let mut past = Customer::random(rng);
            past.id = customer.id.clone();
            for order in &past.orders {
                let record = order_status(rng, customer, order);
                size += render(&record, false).len();
                history.push(record);
            }
        }
        v["order_history"] = Value::Array(history);
    }
    v
}

/// FAQ entries matching a support question, as plain text.
pub fn faq(rng: &mut Rng, topic: &str) -> String {
    let mut s = String::new();
    for i in 0..rng.between(1, 4) {
        let title = if i == 0 {
            topic.to_string()
        } else {
            prose::heading(rng)
        };
        let n = rng.between(1, 5);
        put!(
            &mut s,
            "[FAQ-{}] {title}: {}\n{}\n\n",
            rng.digits(4),
            prose::sentence(rng),
            prose::sentences(rng, n)
        );
    }
    s
}

/// A created support ticket.
pub fn ticket(rng: &mut Rng) -> Value {
    json!({"ticket_id": format!("TCK-{}", rng.digits(6)), "status": "open", "queue": rng.pick(&["billing", "shipping", "returns"])})
}

/// A refund decision.
pub fn refund(rng: &mut Rng, order: &Order, cents: usize) -> Value {
    json!({"refund_id": format!("re_{}", rng.alnum(12)), "order_id": order.id, "amount": money(cents), "status": rng.pick(&["pending", "approved"])})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_results_are_json_with_their_hits() {
        let mut rng = Rng::new(1);
        let (text, hits) = search_results(&mut rng, "battery costs", 5);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["results"].as_array().unwrap().len(), 5);
        assert_eq!(v["results"][2]["url"], hits[2].url.as_str());
    }

    #[test]
    fn order_records_total_their_lines() {
        let mut rng = Rng::new(2);
        let c = Customer::random(&mut rng);
        let o = &c.orders[0];
        let v = order_status(&mut rng, &c, o);
        let total: usize = o.lines.iter().map(|l| l.price_cents * l.quantity).sum();
        assert_eq!(v["total"]["amount"], total);
        assert_eq!(v["order_id"], o.id.as_str());
    }

    #[test]
    fn large_records_reach_their_target() {
        let mut rng = Rng::new(3);
        let c = Customer::random(&mut rng);
        let v = customer_profile(&mut rng, &c, 60_000);
        assert!(render(&v, false).len() > 60_000);
        assert!(issue_list(&mut rng, "o/r", 20_000).len() > 20_000);
    }
}
