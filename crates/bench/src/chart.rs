//! The prompt-size chart: seed-averaged prompt tokens at every step, one line per strategy,
//! at the largest horizon.

use std::path::Path;

use plotters::prelude::*;

use crate::BenchReport;

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];

/// Only completed runs are drawn: a failed run's prompts stop where it failed. A strategy
/// without a completed run has an empty line and says so in the legend.
pub fn prompt_chart(report: &BenchReport, path: &Path) -> Result<(), String> {
    let Some(&horizon) = report.config.horizons.iter().max() else {
        return Err("no horizons".into());
    };
    let noise = report.config.noise.first().copied().unwrap_or(0);
    let drift = report.config.drifts.first().cloned();
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for &strategy in &report.config.strategies {
        let series: Vec<&Vec<u64>> = report
            .runs
            .iter()
            .filter(|r| {
                r.completed()
                    && r.spec.horizon == horizon
                    && r.spec.noise == noise
                    && r.spec.drift == drift
                    && r.spec.strategy == strategy
            })
            .map(|r| &r.prompt_tokens_per_step)
            .collect();
        let steps = series.iter().map(|s| s.len()).min().unwrap_or(0);
        let points = (0..steps)
            .map(|i| {
                (
                    (i + 1) as f64,
                    series.iter().map(|s| s[i] as f64).sum::<f64>() / series.len() as f64,
                )
            })
            .collect();
        let name = if series.is_empty() {
            format!("{} (no completed run)", strategy.as_str())
        } else {
            strategy.as_str().to_owned()
        };
        lines.push((name, points));
    }
    let caption = format!(
        "{}: prompt tokens per step (T={horizon}, mean over {} seed(s), model {})",
        report.config.environment,
        report.config.seeds.len(),
        report.config.model
    );
    draw_lines(
        path,
        &caption,
        f64::from(horizon.max(2)),
        lines,
        SeriesLabelPosition::UpperLeft,
    )
}

/// Draws `lines` (label, points) as an SVG line chart of prompt tokens per step at `path`.
pub(crate) fn draw_lines(
    path: &Path,
    caption: &str,
    max_x: f64,
    lines: Vec<(String, Vec<(f64, f64)>)>,
    legend: SeriesLabelPosition,
) -> Result<(), String> {
    let max_y = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(1.0_f64, f64::max);
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(1.0..max_x, 0.0..max_y * 1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("prompt tokens (o200k_base)")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, points)) in lines.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .position(legend)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
