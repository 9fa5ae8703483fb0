//! The report as a chart a person opens: input tokens and effective cost per turn with and
//! without the proxy, and the latency distribution (with the direct run's, under `--compare`).
//! One SVG file, drawn with `plotters`.

use std::path::Path;

use plotters::prelude::*;

use super::report::{Report, TurnPoint};

const WITHOUT: RGBColor = RGBColor(200, 80, 40);
const WITH: RGBColor = RGBColor(30, 110, 190);

/// A panel's title; the cost panel names the provider whose prices it uses.
fn title_of(title: &str, provider: &str) -> String {
    if title.ends_with(" of") {
        format!("{title} {provider}")
    } else {
        title.to_string()
    }
}

/// Draws `report` into an SVG file at `path`.
pub fn draw(report: &Report, path: &Path) -> std::io::Result<()> {
    let root = SVGBackend::new(path, (1200, 420)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let panels = root.split_evenly((1, 3));
    let with = report.with_proxy.as_ref();
    let turns = |f: fn(&TurnPoint) -> f64, side: &[TurnPoint]| -> Vec<(f64, f64)> {
        side.iter().map(|p| (p.turn as f64, f(p))).collect()
    };
    let series = [
        (
            "input tokens per turn (mean)",
            "tokens",
            turns(|p| p.tokens, &report.without_proxy.per_turn),
            with.map(|w| turns(|p| p.tokens, &w.per_turn)),
        ),
        (
            "effective input cost per turn, prices of",
            "full-price tokens",
            turns(|p| p.cost, &report.without_proxy.per_turn),
            with.map(|w| turns(|p| p.cost, &w.per_turn)),
        ),
    ];
    for (area, (title, y_label, without, with)) in panels.iter().zip(series) {
        let x_max = without.len().max(1) as f64;
        let y_max = without
            .iter()
            .chain(with.iter().flatten())
            .map(|p| p.1)
            .fold(1.0, f64::max)
            * 1.05;
        let mut chart = ChartBuilder::on(area)
            .caption(title_of(title, &report.provider), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(1.0..x_max, 0.0..y_max)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("turn")
            .y_desc(y_label)
            .draw()
            .map_err(|e| fail(&e))?;
        chart
            .draw_series(LineSeries::new(without, WITHOUT.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label("without proxy")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], WITHOUT));
        if let Some(with) = with {
            chart
                .draw_series(LineSeries::new(with, WITH.stroke_width(2)))
                .map_err(|e| fail(&e))?
                .label("with proxy")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], WITH));
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(|e| fail(&e))?;
    }
    // Latency: the distribution as quantiles (x: share of requests, y: ms).
    let through = &report.latency_ms.quantiles;
    let direct = report.direct_latency_ms.as_ref().map(|d| &d.quantiles);
    let y_max = through
        .iter()
        .chain(direct.into_iter().flatten())
        .copied()
        .fold(1.0, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&panels[2])
        .caption("latency distribution", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..100.0, 0.0..y_max)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .draw()
        .map_err(|e| fail(&e))?;
    let points = |q: &Vec<f64>| -> Vec<(f64, f64)> {
        q.iter()
            .enumerate()
            .map(|(i, v)| ((i + 1) as f64, *v))
            .collect()
    };
    chart
        .draw_series(LineSeries::new(points(through), WITH.stroke_width(2)))
        .map_err(|e| fail(&e))?
        .label("through the proxy")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], WITH));
    if let Some(direct) = direct {
        chart
            .draw_series(LineSeries::new(points(direct), WITHOUT.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label("direct")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], WITHOUT));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}
