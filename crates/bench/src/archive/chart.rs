//! The archive's prompt-size chart: seed-averaged prompt tokens at every step of the largest
//! horizon, one line per arm (state+recall has more steps than events: one per recall).

use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use super::ArchiveReport;

/// Most points drawn per line: longer series are averaged over buckets of steps.
const MAX_POINTS: usize = 2_000;

pub fn prompt_chart(report: &ArchiveReport, path: &Path) -> Result<(), String> {
    let Some(&horizon) = report.config.horizons.iter().max() else {
        return Err("no horizons".into());
    };
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for &arm in &report.config.arms {
        let series: Vec<&Vec<u64>> = report
            .runs
            .iter()
            .filter(|r| r.completed() && r.spec.horizon == horizon && r.spec.arm == arm)
            .map(|r| &r.prompt_tokens_per_step)
            .collect();
        let steps = series.iter().map(|s| s.len()).min().unwrap_or(0);
        let bucket = steps.div_ceil(MAX_POINTS).max(1);
        let points = (0..steps)
            .step_by(bucket)
            .map(|start| {
                let end = (start + bucket).min(steps);
                let sum: f64 = series
                    .iter()
                    .map(|s| s[start..end].iter().sum::<u64>() as f64)
                    .sum();
                let mid = (start + end + 1) as f64 / 2.0;
                (mid, sum / (series.len() * (end - start)) as f64)
            })
            .collect();
        let name = if series.is_empty() {
            format!("{} (no completed run)", arm.as_str())
        } else {
            arm.as_str().to_owned()
        };
        lines.push((name, points));
    }
    let max_x = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(2.0_f64, f64::max);
    let caption = format!(
        "warehouse-archive: prompt tokens per step (T={horizon}, mean over {} seed(s), model {})",
        report.config.seeds.len(),
        report.config.model
    );
    crate::chart::draw_lines(
        path,
        &caption,
        max_x,
        lines,
        SeriesLabelPosition::LowerRight,
    )
}
