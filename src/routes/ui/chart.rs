//! The per-session chart as inline SVG, drawn on the server: tokens per turn with and without
//! the proxy, and cost per turn with and without it (in dollars when the model has list
//! prices). No script, no library: two polylines per panel, scaled to the largest value.

use maud::{html, Markup};

use super::view::Turn;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 64.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 22.0;

/// Both panels for `turns` (oldest first); nothing when there are none.
pub fn session_chart(turns: &[Turn]) -> Markup {
    if turns.is_empty() {
        return html! {};
    }
    let tokens = |with: bool| -> Vec<f64> {
        turns
            .iter()
            .map(|t| {
                if with {
                    t.tokens_with as f64
                } else {
                    t.line.tokens_before as f64
                }
            })
            .collect()
    };
    // In dollars when every turn has them (the model's list prices), else in full-price
    // input tokens.
    let in_dollars = turns.iter().all(|t| t.dollars.is_some());
    let costs = |with: bool| -> Vec<f64> {
        turns
            .iter()
            .map(|t| match (in_dollars, t.dollars) {
                (true, Some(d)) if with => d.with,
                (true, Some(d)) => d.without,
                _ if with => t.cost_with,
                _ => t.cost_without,
            })
            .collect()
    };
    let (cost_title, cost_label): (&str, fn(f64) -> String) = if in_dollars {
        ("Cost per turn (dollars, input and output)", usd)
    } else {
        ("Input cost per turn (full-price tokens)", compact)
    };
    html! {
        div.charts {
            (panel("Tokens per turn", "tokens", &tokens(false), &tokens(true), compact))
            (panel(cost_title, "cost", &costs(false), &costs(true), cost_label))
        }
    }
}

/// One panel: the series without the proxy and with it; `label` writes the scale's top.
fn panel(title: &str, id: &str, without: &[f64], with: &[f64], label: fn(f64) -> String) -> Markup {
    let max = without.iter().chain(with).copied().fold(0.0_f64, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    let n = without.len().max(1);
    let plot_w = WIDTH - LEFT - 8.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| {
        if n == 1 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + plot_w * i as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| TOP + plot_h * (1.0 - v / max);
    let points = |series: &[f64]| {
        series
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        figure.chart id=(format!("chart-{id}")) {
            figcaption {
                (title) " "
                span.key.without { "without the proxy" }
                " "
                span.key.with { "with the proxy" }
            }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) {
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) {}
                line.axis x1=(LEFT) y1=(TOP + plot_h) x2=(WIDTH - 8.0) y2=(TOP + plot_h) {}
                text.tick x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" { (label(max)) }
                text.tick x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" { "0" }
                text.tick x=(LEFT) y=(HEIGHT - 4.0) { "turn 1" }
                text.tick x=(WIDTH - 8.0) y=(HEIGHT - 4.0) text-anchor="end" { "turn " (n) }
                polyline.series.without points=(points(without)) {}
                polyline.series.with points=(points(with)) {}
                @if n <= 60 {
                    @for (i, v) in with.iter().enumerate() {
                        circle.dot.with cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(*v))) r="2.5" {}
                    }
                }
            }
        }
    }
}

/// `1234567` as `1.2M`, `12345` as `12.3k`.
pub fn compact(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// `$1.26`, `$0.00421`: dollars to three significant figures under a dollar.
pub fn usd(v: f64) -> String {
    if v >= 1.0 || v == 0.0 {
        format!("${v:.2}")
    } else {
        let decimals = (2 - v.log10().floor() as i32).clamp(2, 9) as usize;
        format!("${v:.decimals$}")
    }
}
