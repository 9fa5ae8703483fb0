//! The support agent: a shop's customer-service bot in many short turns — greetings, order and
//! tracking lookups, FAQ searches, stock checks, refunds and escalations — mostly with small
//! JSON tool results, now and then a customer's whole order history.

use serde_json::json;

use super::chat::{ToolCall, Transcript};
use super::prose;
use super::records::{self, Customer, Order};
use super::rng::Rng;
use super::words::{self, put};

/// Models a support agent is run with.
pub const MODELS: &[&str] = &["gpt-4.1-mini", "gpt-4o-mini", "gpt-4o"];

fn system_prompt(rng: &mut Rng) -> String {
    let mut s = String::from("You are Nova, the customer support assistant of Acme Outfitters, an online shop for electronics, home and outdoor goods.\n\n## Tone\nBe warm, brief and concrete. Use the customer's name. Answer in the customer's language. Never promise what policy does not allow.\n\n## Policy\n");
    let policy = [
        "Returns are accepted within 30 days of delivery for unused items in their original packaging.",
        "Refunds go back to the original payment method within 5 to 10 business days.",
        "You may refund up to $150 without approval; above that, open a ticket with priority high.",
        "Orders can be cancelled free of charge while their status is processing.",
        "Shipping is free above $50; express shipping costs $12.90 and is not refundable.",
        "Never share another customer's data. Verify the email on file before discussing an order.",
        "Escalate to a human (create_ticket) when the customer asks for one, is upset twice, or reports a safety issue.",
    ];
    for p in policy {
        put!(&mut s, "- {p}\n");
    }
    s.push_str("\n## Frequently asked\n");
    for _ in 0..rng.between(4, 14) {
        put!(
            &mut s,
            "Q: {}?\nA: {}\n\n",
            prose::heading(rng),
            prose::sentences(rng, 2)
        );
    }
    s
}

fn pick_order<'a>(rng: &mut Rng, customer: &'a Customer) -> &'a Order {
    rng.pick_ref(&customer.orders)
}

/// An order that is on its way or delivered, if the customer has one.
fn shipped_order<'a>(rng: &mut Rng, customer: &'a Customer) -> &'a Order {
    let shipped: Vec<&Order> = customer
        .orders
        .iter()
        .filter(|o| o.status == "shipped" || o.status == "delivered")
        .collect();
    if shipped.is_empty() {
        pick_order(rng, customer)
    } else {
        rng.pick(&shipped)
    }
}

/// One customer turn: what they write and the tool rounds the agent runs before replying.
fn turn(rng: &mut Rng, c: &Customer, greeted: bool) -> (String, Vec<Vec<ToolCall>>, String) {
    let first = c.name.split(' ').next().unwrap_or(&c.name).to_string();
    if !greeted {
        let o = pick_order(rng, c);
        let text = match rng.below(4) {
            0 => format!("Hi, I have a question about my order {}", o.id),
            1 => format!(
                "hello, where is my package?? order {} email {}",
                o.id, c.email
            ),
            2 => format!("{} 注文番号は{}です。", words::CJK[11], o.id),
            _ => format!(
                "Hi there 👋 I ordered a {} and it hasn't arrived",
                o.lines[0].product
            ),
        };
        let order = records::order_status(rng, c, o);
        let calls = vec![vec![ToolCall::new(
            "lookup_order",
            json!({"order_id": o.id}),
            records::render(&order, rng.chance(50)),
        )]];
        let reply = format!(
            "Hi {first}! Your order {} is currently **{}**. {}",
            o.id,
            o.status,
            prose::sentence(rng)
        );
        return (text, calls, reply);
    }
    match rng.weighted(&[22, 14, 12, 10, 8, 6, 5, 23]) {
        0 => {
            let o = shipped_order(rng, c);
            let text = format!(
                "{} {}",
                rng.pick(&[
                    "Can you check the tracking for",
                    "what's the status of",
                    "Any update on"
                ]),
                o.id
            );
            let order = ToolCall::new(
                "lookup_order",
                json!({"order_id": o.id}),
                records::render(&records::order_status(rng, c, o), rng.chance(50)),
            );
            let track = ToolCall::new(
                "get_tracking",
                json!({"tracking_number": o.tracking}),
                records::render(&records::tracking(rng, o), rng.chance(50)),
            );
            let rounds = if rng.chance(50) {
                vec![vec![order, track]]
            } else {
                vec![vec![order], vec![track]]
            };
            let reply = format!(
                "The {} shipment {} was last scanned {}. {}",
                o.carrier,
                o.tracking,
                rng.pick(&["in transit", "at the local depot", "out for delivery"]),
                prose::sentence(rng)
            );
            (text, rounds, reply)
        }
        1 => {
            let q = rng.pick(&[
                "return policy",
                "change delivery address",
                "international shipping",
                "warranty claim",
                "gift cards",
                "price match",
            ]);
            let text = format!(
                "{} {q}?",
                rng.pick(&[
                    "What's your",
                    "How does the",
                    "Do you have a",
                    "question about"
                ])
            );
            let faq = ToolCall::new("search_faq", json!({"query": q}), records::faq(rng, q));
            (text, vec![vec![faq]], prose::sentences(rng, 2))
        }
        2 => {
            let o = pick_order(rng, c);
            let line = &o.lines[0];
            let cents = line.price_cents.min(15_000);
            let text = format!(
                "The {} arrived broken. I want a refund please.",
                line.product
            );
            let order = ToolCall::new(
                "lookup_order",
                json!({"order_id": o.id}),
                records::render(&records::order_status(rng, c, o), false),
            );
            let refund = ToolCall::new(
                "issue_refund",
                json!({"order_id": o.id, "amount_cents": cents, "reason": "damaged on arrival"}),
                records::render(&records::refund(rng, o, cents), false),
            );
            let reply = format!(
                "I'm sorry about that, {first}. I've issued a refund of ${}.{:02} for the {}; {}",
                cents / 100,
                cents % 100,
                line.product,
                prose::sentence(rng)
            );
            (text, vec![vec![order], vec![refund]], reply)
        }
        3 => {
            let product = rng.pick(words::PRODUCTS);
            let sku = format!("SKU-{}", rng.digits(6));
            let text = format!("Is the {product} back in stock?");
            let units = if rng.chance(40) {
                0
            } else {
                rng.log_uniform(1, 500)
            };
            let stock = ToolCall::new("check_inventory", json!({"sku": sku}), units.to_string());
            let reply = if units == 0 {
                format!(
                    "The {product} is out of stock right now. {}",
                    prose::sentence(rng)
                )
            } else {
                format!("Yes! We have {units} in stock.")
            };
            (text, vec![vec![stock]], reply)
        }
        4 => {
            let text =
                "Can you look at all my past orders? I think I was charged twice at some point."
                    .to_string();
            let target = rng.log_uniform(8_000, 200_000);
            let profile = records::customer_profile(rng, c, target);
            let lookup = ToolCall::new(
                "lookup_customer",
                json!({"email": c.email, "include_history": true}),
                records::render(&profile, rng.chance(30)),
            );
            (
                text,
                vec![vec![lookup]],
                format!(
                    "I went through your order history, {first}. {}",
                    prose::sentences(rng, 3)
                ),
            )
        }
        5 => {
            let text = rng
                .pick(&[
                    "I want to talk to a human.",
                    "This is the third time I'm asking. Get me a manager.",
                    "this is ridiculous",
                ])
                .to_string();
            let ticket = ToolCall::new(
                "create_ticket",
                json!({"subject": format!("Customer {} needs follow-up", c.email), "priority": "high", "summary": prose::sentences(rng, 2)}),
                records::render(&records::ticket(rng), false),
            );
            (
                text,
                vec![vec![ticket]],
                "I've passed this to a colleague; they will email you within 24 hours.".to_string(),
            )
        }
        6 => {
            let text = format!("what email do you have for me? is it {}", c.email);
            let lookup = ToolCall::new(
                "lookup_customer",
                json!({"email": c.email}),
                records::render(&records::customer_profile(rng, c, 0), false),
            );
            (
                text,
                vec![vec![lookup]],
                format!("Yes, {} is the email on your account.", c.email),
            )
        }
        _ => small_talk(rng),
    }
}

/// A turn the agent answers without tools.
fn small_talk(rng: &mut Rng) -> (String, Vec<Vec<ToolCall>>, String) {
    let text = rng
        .pick(&[
            "thanks",
            "ok",
            "great, thank you!",
            "👍",
            "no that's all",
            "yes please",
            "ok and how long does that take?",
            "谢谢！",
        ])
        .to_string();
    let reply = rng
        .pick(&[
            "You're welcome! Anything else I can help with?",
            "Happy to help 😊",
            "Usually 3–5 business days.",
            "Great — have a nice day!",
        ])
        .to_string();
    (text, Vec::new(), reply)
}

/// Writes a support session of exactly `requests` requests into `t`.
pub fn run(rng: &mut Rng, t: &mut Transcript, requests: usize) {
    let customer = Customer::random(rng);
    t.system(system_prompt(rng));
    if rng.chance(40) {
        t.developer(format!(
            "Signed-in customer: {} <{}>, tier {}. Locale: {}.",
            customer.name,
            customer.email,
            customer.tier,
            rng.pick(&["en-US", "de-DE", "ja-JP", "pt-PT"])
        ));
    }
    let mut greeted = false;
    while t.requests() < requests {
        let (text, rounds, reply) = turn(rng, &customer, greeted);
        greeted = true;
        let left = requests - t.requests() - 1;
        let (text, rounds, reply) = if rounds.len() > left {
            small_talk(rng)
        } else {
            (text, rounds, reply)
        };
        if rng.chance(10) {
            t.user_parts(vec![text]);
        } else {
            t.user(text);
        }
        for calls in rounds {
            t.act(rng, None, calls);
        }
        t.reply(reply);
    }
}
