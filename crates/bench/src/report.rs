//! Aggregation over seeds, scaling fits, and the terminal / Markdown tables.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use skillstate_core::ContextStrategy;

use crate::BenchConfig;
use crate::job::RunResult;
use crate::stats::{LinearFit, MeanSd, linear_fit, mean_sd};

/// The runs of one strategy at one (horizon, noise, drift), aggregated over seeds.
///
/// The score averages every run (a failed run scores the events it handled before it stopped).
/// Token figures average only the `token_runs` runs that committed at least one step, and are
/// `None` when none did: a run that never ran has no prompt size to average.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub horizon: u32,
    pub noise: u32,
    pub drift: Option<String>,
    pub strategy: ContextStrategy,
    /// Runs in the group (one per seed).
    pub seeds: usize,
    /// Runs whose task completed; the others failed (see each run's `failure`).
    pub completed: usize,
    /// Runs that committed at least one step: the token figures average over these.
    pub token_runs: usize,
    pub score: MeanSd,
    pub prompt_mean: Option<MeanSd>,
    pub prompt_max: Option<MeanSd>,
    pub total_tokens: Option<MeanSd>,
    pub rejected_answers: u64,
    /// Tool calls that returned an error, over the group's runs.
    #[serde(default)]
    pub tool_errors: u64,
    /// Actions whose outcome a crash left unknown, over the group's runs: not tool errors.
    #[serde(default)]
    pub outcome_unknown: u64,
    /// Over the runs that reached a drift reveal; `None` when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_steps: Option<MeanSd>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered_runs: Option<usize>,
    pub wall_ms_mean: f64,
    /// Provider-reported tokens per run, averaged over seeds (absent for the oracle).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_input_tokens: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_output_tokens: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_cached_tokens: Option<f64>,
    /// Estimated cost per run in USD, from the configured price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// How a strategy's cost grows with the horizon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    pub strategy: ContextStrategy,
    pub horizon: u32,
    /// Linear fit of the seed-averaged prompt tokens against the step number.
    pub prompt_per_step: LinearFit,
    /// `slope · (T − 1) / intercept`: how much the prompt grows over the run, relative to its start.
    pub prompt_growth: f64,
    /// Slope of log(total tokens) against log(T) across horizons: ≈1 linear, ≈2 quadratic.
    pub total_tokens_exponent: Option<f64>,
    /// Fit of total tokens / T against T across horizons, i.e. total ≈ intercept·T + slope·T²:
    /// a slope near 0 means linear growth, a clear positive slope quadratic growth.
    pub total_tokens_quadratic: Option<LinearFit>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub config: BenchConfig,
    pub groups: Vec<Group>,
    pub scaling: Vec<Scaling>,
    pub runs: Vec<RunResult>,
}

type GroupKey = (u32, u32, Option<String>, ContextStrategy);

impl BenchReport {
    pub fn new(config: BenchConfig, mut runs: Vec<RunResult>) -> Self {
        runs.sort_by(|a, b| a.spec.cmp(&b.spec));
        let mut grouped: BTreeMap<GroupKey, Vec<&RunResult>> = BTreeMap::new();
        for run in &runs {
            let s = &run.spec;
            grouped
                .entry((s.horizon, s.noise, s.drift.clone(), s.strategy))
                .or_default()
                .push(run);
        }
        let groups: Vec<Group> = grouped
            .into_iter()
            .map(|((horizon, noise, drift, strategy), runs)| {
                let values =
                    |f: &dyn Fn(&RunResult) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<f64>>();
                let stepped: Vec<&RunResult> =
                    runs.iter().copied().filter(|r| r.steps > 0).collect();
                let over_stepped = |f: &dyn Fn(&RunResult) -> f64| {
                    let values: Vec<f64> = stepped.iter().map(|r| f(r)).collect();
                    (!values.is_empty()).then(|| mean_sd(&values))
                };
                let recoveries: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.recovery_steps)
                    .map(|steps| steps as f64)
                    .collect();
                let has_drift = drift.is_some();
                Group {
                    horizon,
                    noise,
                    drift,
                    strategy,
                    seeds: runs.len(),
                    completed: runs.iter().filter(|r| r.completed()).count(),
                    token_runs: stepped.len(),
                    score: mean_sd(&values(&|r| r.score)),
                    prompt_mean: over_stepped(&|r| r.prompt_mean.unwrap_or(0.0)),
                    prompt_max: over_stepped(&|r| r.prompt_max as f64),
                    total_tokens: over_stepped(&|r| r.total_tokens as f64),
                    rejected_answers: runs.iter().map(|r| r.rejected_answers).sum(),
                    tool_errors: runs.iter().map(|r| r.tool_errors).sum(),
                    outcome_unknown: runs.iter().map(|r| r.outcome_unknown).sum(),
                    recovery_steps: (has_drift && !recoveries.is_empty())
                        .then(|| mean_sd(&recoveries)),
                    recovered_runs: has_drift
                        .then(|| runs.iter().filter(|r| r.recovered == Some(true)).count()),
                    wall_ms_mean: mean_sd(&values(&|r| r.wall_ms as f64)).mean,
                    provider_input_tokens: usage_mean(&runs, |u| u.input_tokens),
                    provider_output_tokens: usage_mean(&runs, |u| u.output_tokens),
                    provider_cached_tokens: usage_mean(&runs, |u| {
                        u.cached_input_tokens.unwrap_or(0)
                    }),
                    cost_usd: config.price.and_then(|price| {
                        let costs: Vec<f64> = runs
                            .iter()
                            .filter_map(|r| r.provider_usage.as_ref())
                            .map(|u| price.cost(u))
                            .collect();
                        (!costs.is_empty()).then(|| mean_sd(&costs).mean)
                    }),
                }
            })
            .collect();
        let scaling = scaling(&config, &runs);
        Self {
            config,
            groups,
            scaling,
            runs,
        }
    }

    /// The (noise, drift) conditions present, in order.
    fn conditions(&self) -> Vec<(u32, Option<String>)> {
        let mut seen: Vec<(u32, Option<String>)> = Vec::new();
        for g in &self.groups {
            let key = (g.noise, g.drift.clone());
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
        seen.sort();
        seen
    }

    fn group(
        &self,
        horizon: u32,
        noise: u32,
        drift: &Option<String>,
        strategy: ContextStrategy,
    ) -> Option<&Group> {
        self.groups.iter().find(|g| {
            g.horizon == horizon && g.noise == noise && &g.drift == drift && g.strategy == strategy
        })
    }

    fn title(&self) -> String {
        format!(
            "{}: score / avg prompt tokens / total tokens per run, mean ± SD over {} seed(s), model {}{}",
            self.config.environment,
            self.config.seeds.len(),
            self.config.model,
            self.config
                .budget
                .map(|b| format!(", context budget {b}"))
                .unwrap_or_default()
        )
    }

    /// Rows of the comparison table: label cells, then one cell per strategy.
    fn rows(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let conditions = self.conditions();
        let show_noise = conditions.iter().any(|(n, _)| *n > 0);
        let show_drift = conditions.iter().any(|(_, d)| d.is_some());
        let mut header = vec!["T".to_owned()];
        if show_noise {
            header.push("noise".into());
        }
        if show_drift {
            header.push("drift".into());
        }
        header.extend(self.config.strategies.iter().map(|s| s.as_str().to_owned()));
        let mut rows = Vec::new();
        for (noise, drift) in &conditions {
            for &horizon in &self.config.horizons {
                let mut row = vec![horizon.to_string()];
                if show_noise {
                    row.push(noise.to_string());
                }
                if show_drift {
                    row.push(drift.clone().unwrap_or_else(|| "-".into()));
                }
                for &strategy in &self.config.strategies {
                    row.push(match self.group(horizon, *noise, drift, strategy) {
                        Some(g) => cell(g),
                        None => "-".into(),
                    });
                }
                rows.push(row);
            }
        }
        (header, rows)
    }

    /// The Table 1-shaped comparison for a terminal.
    pub fn table(&self) -> String {
        let (header, rows) = self.rows();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &rows {
            for (i, c) in row.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
                .collect::<Vec<_>>()
                .join(" | ")
                .trim_end()
                .to_owned()
        };
        let mut out = format!("{}\n", self.title());
        out.push_str(&line(&header));
        out.push('\n');
        out.push_str(
            &widths
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("-+-"),
        );
        out.push('\n');
        for row in &rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        if let Some(note) = failure_note(&self.groups) {
            out.push('\n');
            out.push_str(&note);
        }
        out.push_str(&tool_note(&self.groups));
        if !self.scaling.is_empty() {
            out.push_str(&self.scaling_text(false));
        }
        out
    }

    fn scaling_text(&self, markdown: bool) -> String {
        let mut out = String::new();
        let Some(first) = self.scaling.first() else {
            return out;
        };
        out.push_str(&format!(
            "\n{}Scaling at T={} (linear fit of prompt tokens per step; total tokens ≈ a·T + b·T² across horizons):\n",
            if markdown { "### " } else { "" },
            first.horizon
        ));
        if markdown {
            out.push_str("\n| strategy | intercept | slope/step | R² | growth over run | total tokens a | b | log-log exponent |\n|---|---|---|---|---|---|---|---|\n");
        }
        for s in &self.scaling {
            let exponent = s
                .total_tokens_exponent
                .map(|e| format!("{e:.2}"))
                .unwrap_or_else(|| "-".into());
            let (a, b) = s
                .total_tokens_quadratic
                .map(|q| (format!("{:.0}", q.intercept), format!("{:.2}", q.slope)))
                .unwrap_or_else(|| ("-".into(), "-".into()));
            let totals = match s.total_tokens_quadratic {
                Some(_) => format!("  total ≈ {a:>5}·T + {b:>6}·T² (log-log exponent {exponent})"),
                None => String::new(),
            };
            let fit = &s.prompt_per_step;
            let line = if markdown {
                format!(
                    "| {} | {:.0} | {:.2} | {:.3} | {:.1}% | {a} | {b} | {exponent} |\n",
                    s.strategy.as_str(),
                    fit.intercept,
                    fit.slope,
                    fit.r_squared,
                    s.prompt_growth * 100.0
                )
            } else {
                format!(
                    "  {:<9} intercept {:>6.0}  slope {:>7.2}/step  R² {:.3}  growth {:>7.1}%{totals}\n",
                    s.strategy.as_str(),
                    fit.intercept,
                    fit.slope,
                    fit.r_squared,
                    s.prompt_growth * 100.0
                )
            };
            out.push_str(&line);
        }
        out
    }

    pub fn markdown(&self) -> String {
        let (header, rows) = self.rows();
        let mut out = format!(
            "# skillbench report: {}\n\n{}.\n\n",
            self.config.environment,
            self.title()
        );
        out.push_str(&format!("| {} |\n", header.join(" | ")));
        out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
        for row in rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        if let Some(note) = failure_note(&self.groups) {
            out.push('\n');
            out.push_str(&note);
        }
        out.push_str(&tool_note(&self.groups));
        out.push_str(&self.scaling_text(true));
        out.push_str(&format!(
            "\nRuns: {} ({} horizon(s) × {} noise level(s) × {} drift condition(s) × {} seed(s) × {} strategies). \
             Tokens are o200k_base tokens counted locally for every strategy. ",
            self.runs.len(),
            self.config.horizons.len(),
            self.config.noise.len(),
            self.config.drifts.len().max(1),
            self.config.seeds.len(),
            self.config.strategies.len()
        ));
        if self.config.model == "oracle" {
            out.push_str(
                "The model is the oracle policy: it reads only the rendered prompt and acts optimally on it, so scores \
                 measure how much task-relevant information each strategy keeps in front of the model, an upper bound \
                 that real models can only approach.\n",
            );
        } else {
            out.push('\n');
        }
        out.push_str("\nPrompt tokens per step: `prompt_tokens.svg`. Every run: `results.json`.\n");
        out
    }
}

/// Shown instead of a token figure when no run of the cell committed a step.
const NO_FIGURE: &str = "—";

fn cell(g: &Group) -> String {
    let prompt = g
        .prompt_mean
        .map(|m| format!("{}±{}", thousands(m.mean), thousands(m.sd)))
        .unwrap_or_else(|| NO_FIGURE.to_owned());
    let total = g
        .total_tokens
        .map(|m| format!("{}±{}", compact(m.mean), compact(m.sd)))
        .unwrap_or_else(|| NO_FIGURE.to_owned());
    let mut text = format!("{:.2}±{:.2} / {prompt} / {total}", g.score.mean, g.score.sd);
    if let Some(input) = g.provider_input_tokens {
        text.push_str(&format!(
            " / provider {}+{}",
            compact(input),
            compact(g.provider_output_tokens.unwrap_or(0.0))
        ));
    }
    if let Some(cost) = g.cost_usd {
        text.push_str(&format!(" / ${cost:.4}"));
    }
    if let Some(recovered) = g.recovered_runs {
        let recovery = g
            .recovery_steps
            .map(|r| format!("{:.1}", r.mean))
            .unwrap_or_else(|| NO_FIGURE.to_owned());
        text.push_str(&format!(" / rec {recovery} ({recovered}/{})", g.seeds));
    }
    if g.completed < g.seeds {
        text.push_str(&format!(" ({}/{} ok)", g.completed, g.seeds));
    }
    text
}

/// The note under a table whose cells include failed runs; `None` when every run completed.
fn failure_note(groups: &[Group]) -> Option<String> {
    let runs: usize = groups.iter().map(|g| g.seeds).sum();
    let failed: usize = groups.iter().map(|g| g.seeds - g.completed).sum();
    (failed > 0).then(|| {
        format!(
            "{failed} of {runs} runs failed. (k/n ok): k of the cell's n runs completed; the others failed\n\
             (results.json gives each run's status and reason). Scores count every run, a failed run\n\
             scoring the events it handled before it stopped; token figures average only the runs that\n\
             committed at least one step ({NO_FIGURE} when none did).\n"
        )
    })
}

/// The tool figures under a table: tool errors, and actions whose outcome a crash left
/// unknown as their own figure (they are not tool errors).
fn tool_note(groups: &[Group]) -> String {
    let errors: u64 = groups.iter().map(|g| g.tool_errors).sum();
    let unknown: u64 = groups.iter().map(|g| g.outcome_unknown).sum();
    format!(
        "\nTool calls that returned an error: {errors}. Outcome unknown (actions a crash left unknown, not counted as tool errors): {unknown}.\n"
    )
}

/// `12,345`
pub fn thousands(value: f64) -> String {
    let n = value.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// `950`, `12.6k`, `1.06M`
pub fn compact(value: f64) -> String {
    if value >= 1_000_000.0 {
        format!("{:.2}M", value / 1_000_000.0)
    } else if value >= 1_000.0 {
        format!("{:.1}k", value / 1_000.0)
    } else {
        format!("{value:.0}")
    }
}

/// Scaling fits for the largest horizon of the first noise level without drift, over the runs
/// that completed (a failed run's prompts stop early and its totals cover part of the run).
fn scaling(config: &BenchConfig, runs: &[RunResult]) -> Vec<Scaling> {
    let Some(&horizon) = config.horizons.iter().max() else {
        return Vec::new();
    };
    let Some(&noise) = config.noise.first() else {
        return Vec::new();
    };
    if !config.drifts.is_empty() {
        return Vec::new();
    }
    config
        .strategies
        .iter()
        .filter_map(|&strategy| {
            let series: Vec<&Vec<u64>> = runs
                .iter()
                .filter(|r| {
                    r.completed()
                        && r.spec.horizon == horizon
                        && r.spec.noise == noise
                        && r.spec.strategy == strategy
                })
                .map(|r| &r.prompt_tokens_per_step)
                .collect();
            let steps = series.iter().map(|s| s.len()).min()?;
            if steps < 2 {
                return None;
            }
            let xs: Vec<f64> = (1..=steps).map(|s| s as f64).collect();
            let ys: Vec<f64> = (0..steps)
                .map(|i| series.iter().map(|s| s[i] as f64).sum::<f64>() / series.len() as f64)
                .collect();
            let fit = linear_fit(&xs, &ys);
            let mean_totals = completed_totals(runs, strategy, noise);
            let totals: Vec<(f64, f64)> = mean_totals
                .iter()
                .map(|&(horizon, total)| (f64::from(horizon).ln(), total.max(1.0).ln()))
                .collect();
            let total_tokens_exponent = (totals.len() >= 2).then(|| {
                let (lx, ly): (Vec<f64>, Vec<f64>) = totals.into_iter().unzip();
                linear_fit(&lx, &ly).slope
            });
            let per_horizon: Vec<(f64, f64)> = mean_totals
                .iter()
                .map(|&(horizon, total)| (f64::from(horizon), total / f64::from(horizon.max(1))))
                .collect();
            let total_tokens_quadratic = (per_horizon.len() >= 2).then(|| {
                let (t, per_step): (Vec<f64>, Vec<f64>) = per_horizon.into_iter().unzip();
                linear_fit(&t, &per_step)
            });
            Some(Scaling {
                strategy,
                horizon,
                prompt_growth: if fit.intercept.abs() > f64::EPSILON {
                    fit.slope * (steps as f64 - 1.0) / fit.intercept
                } else {
                    0.0
                },
                prompt_per_step: fit,
                total_tokens_exponent,
                total_tokens_quadratic,
            })
        })
        .collect()
}

/// Mean total tokens per run of the completed runs without drift, per horizon (ascending).
fn completed_totals(runs: &[RunResult], strategy: ContextStrategy, noise: u32) -> Vec<(u32, f64)> {
    let mut by_horizon: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for run in runs.iter().filter(|r| {
        r.completed()
            && r.spec.strategy == strategy
            && r.spec.noise == noise
            && r.spec.drift.is_none()
    }) {
        by_horizon
            .entry(run.spec.horizon)
            .or_default()
            .push(run.total_tokens as f64);
    }
    by_horizon
        .into_iter()
        .map(|(horizon, totals)| (horizon, mean_sd(&totals).mean))
        .collect()
}

/// Mean of one provider-usage field over the runs that report usage.
fn usage_mean(
    runs: &[&RunResult],
    field: impl Fn(&skillstate_providers::Usage) -> u64,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.provider_usage.as_ref())
        .map(|u| field(u) as f64)
        .collect();
    (!values.is_empty()).then(|| mean_sd(&values).mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(compact(12_600.0), "12.6k");
        assert_eq!(compact(1_062_387.0), "1.06M");
        assert_eq!(compact(950.0), "950");
    }

    #[test]
    fn unknown_outcomes_are_their_own_figure_in_both_renderings() {
        let spec = crate::job::RunSpec {
            horizon: 3,
            noise: 0,
            drift: None,
            seed: 1,
            strategy: ContextStrategy::State,
        };
        let run = |seed: u64, tool_errors: u64, outcome_unknown: u64| RunResult {
            spec: crate::job::RunSpec {
                seed,
                ..spec.clone()
            },
            status: "completed".into(),
            failure: None,
            score: 1.0,
            steps: 3,
            prompt_tokens_per_step: vec![10, 10, 10],
            prompt_mean: Some(10.0),
            prompt_max: 10,
            prompt_last: 10,
            total_prompt_tokens: 30,
            total_completion_tokens: 3,
            total_tokens: 33,
            rejected_answers: 0,
            tool_errors,
            outcome_unknown,
            provider_usage: None,
            recovery_steps: None,
            recovered: None,
            wall_ms: 1,
        };
        let config = BenchConfig {
            environment: "warehouse".into(),
            horizons: vec![3],
            seeds: vec![1, 2],
            strategies: vec![ContextStrategy::State],
            budget: None,
            noise: vec![0],
            drifts: Vec::new(),
            model: "oracle".into(),
            price: None,
            jobs: 1,
        };
        let report = BenchReport::new(config, vec![run(1, 1, 2), run(2, 0, 1)]);
        assert_eq!(
            (
                report.groups[0].tool_errors,
                report.groups[0].outcome_unknown
            ),
            (1, 3)
        );
        for text in [report.table(), report.markdown()] {
            assert!(
                text.contains("Tool calls that returned an error: 1. Outcome unknown (actions a crash left unknown, not counted as tool errors): 3."),
                "{text}"
            );
        }
    }
}
