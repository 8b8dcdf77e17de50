//! The archive bench's aggregation over seeds and its terminal / Markdown table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ArchiveConfig, ArchiveRun, Arm};
use crate::report::{compact, thousands};
use crate::stats::{MeanSd, mean_sd, median};

/// The bars issue 22 sets for state+recall at the largest horizon.
pub const SCORE_BAR: f64 = 0.95;
pub const GROWTH_BAR: f64 = 0.10;
pub const TIME_RATIO_BAR: f64 = 1.25;

/// The runs of one arm at one horizon, aggregated over seeds (means unless said otherwise).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveGroup {
    pub horizon: u32,
    pub arm: Arm,
    pub seeds: usize,
    pub completed: usize,
    pub score: MeanSd,
    pub steps_per_event: f64,
    pub recalls_per_event: f64,
    pub prompt_first: f64,
    pub prompt_last: f64,
    pub prompt_max: f64,
    pub prompt_mean: f64,
    /// Over the runs with at least 200 steps; `None` when none has.
    pub prompt_growth: Option<f64>,
    pub total_tokens: f64,
    pub step_ms_median: f64,
    /// Over the runs with at least 300 steps; `None` when none has.
    pub step_time_ratio: Option<f64>,
    /// The CPU-time ratio, only when the runs ran one at a time (`--jobs 1`).
    pub step_cpu_ratio: Option<f64>,
    /// The wall-time ratio without the windows' recall steps and the steps reading their results.
    pub step_time_ratio_without_recalls: Option<f64>,
    pub rejected_answers: u64,
    pub tool_errors: u64,
    pub wall_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveReport {
    pub config: ArchiveConfig,
    pub groups: Vec<ArchiveGroup>,
    pub runs: Vec<ArchiveRun>,
}

fn mean_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    let values: Vec<f64> = values.collect();
    (!values.is_empty()).then(|| mean_sd(&values).mean)
}

/// The median over seeds: one run slowed by the machine (the 100-step windows are about 0.1 s
/// of work each) does not decide a time ratio.
fn median_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    let values: Vec<f64> = values.collect();
    (!values.is_empty()).then(|| median(&values))
}

impl ArchiveReport {
    pub fn new(config: ArchiveConfig, mut runs: Vec<ArchiveRun>) -> Self {
        runs.sort_by(|a, b| a.spec.cmp(&b.spec));
        let mut grouped: BTreeMap<(u32, Arm), Vec<&ArchiveRun>> = BTreeMap::new();
        for run in &runs {
            grouped
                .entry((run.spec.horizon, run.spec.arm))
                .or_default()
                .push(run);
        }
        let groups = grouped
            .into_iter()
            .map(|((horizon, arm), runs)| {
                let avg = |f: &dyn Fn(&ArchiveRun) -> f64| {
                    mean_of(runs.iter().map(|r| f(r))).unwrap_or(0.0)
                };
                ArchiveGroup {
                    horizon,
                    arm,
                    seeds: runs.len(),
                    completed: runs.iter().filter(|r| r.completed()).count(),
                    score: mean_sd(&runs.iter().map(|r| r.score).collect::<Vec<_>>()),
                    steps_per_event: avg(&|r| r.steps_per_event),
                    recalls_per_event: avg(&|r| r.recalls_per_event),
                    prompt_first: avg(&|r| r.prompt_first as f64),
                    prompt_last: avg(&|r| r.prompt_last as f64),
                    prompt_max: avg(&|r| r.prompt_max as f64),
                    prompt_mean: avg(&|r| r.prompt_mean),
                    prompt_growth: mean_of(runs.iter().filter_map(|r| r.prompt_growth)),
                    total_tokens: avg(&|r| r.total_tokens as f64),
                    step_ms_median: avg(&|r| r.step_ms_median),
                    step_time_ratio: median_of(runs.iter().filter_map(|r| r.step_time_ratio)),
                    step_time_ratio_without_recalls: median_of(
                        runs.iter()
                            .filter_map(|r| r.step_time_ratio_without_recalls),
                    ),
                    step_cpu_ratio: if config.jobs == 1 {
                        median_of(runs.iter().filter_map(|r| r.step_cpu_ratio))
                    } else {
                        None
                    },
                    rejected_answers: runs.iter().map(|r| r.rejected_answers).sum(),
                    tool_errors: runs.iter().map(|r| r.tool_errors).sum(),
                    wall_ms: avg(&|r| r.wall_ms as f64),
                }
            })
            .collect();
        Self {
            config,
            groups,
            runs,
        }
    }

    pub fn group(&self, horizon: u32, arm: Arm) -> Option<&ArchiveGroup> {
        self.groups
            .iter()
            .find(|g| g.horizon == horizon && g.arm == arm)
    }

    fn title(&self) -> String {
        format!(
            "warehouse-archive: state budget {} tokens, context budget {} tokens (window, summary), mean over {} seed(s), model {}",
            thousands(self.config.state_tokens as f64),
            thousands(self.config.budget as f64),
            self.config.seeds.len(),
            self.config.model
        )
    }

    const HEADER: [&'static str; 10] = [
        "T",
        "arm",
        "score",
        "steps/event",
        "recalls/event",
        "prompt first/last/max",
        "growth first→last 100",
        "total tokens",
        "ms/step",
        "time last 100 / 101–200 (wall, CPU)",
    ];

    fn rows(&self) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for &horizon in &self.config.horizons {
            for &arm in &self.config.arms {
                let Some(g) = self.group(horizon, arm) else {
                    continue;
                };
                let mut score = format!("{:.3}±{:.3}", g.score.mean, g.score.sd);
                if g.completed < g.seeds {
                    score.push_str(&format!(" ({}/{} ok)", g.completed, g.seeds));
                }
                rows.push(vec![
                    thousands(f64::from(horizon)),
                    arm.as_str().to_owned(),
                    score,
                    format!("{:.2}", g.steps_per_event),
                    format!("{:.2}", g.recalls_per_event),
                    format!(
                        "{} / {} / {}",
                        thousands(g.prompt_first),
                        thousands(g.prompt_last),
                        thousands(g.prompt_max)
                    ),
                    g.prompt_growth
                        .map_or("—".into(), |v| format!("{:+.1}%", v * 100.0)),
                    compact(g.total_tokens),
                    format!("{:.2}", g.step_ms_median),
                    {
                        let mut cell = match (g.step_time_ratio, g.step_cpu_ratio) {
                            (Some(wall), Some(cpu)) => format!("{wall:.2}, {cpu:.2}"),
                            (Some(wall), None) => format!("{wall:.2}"),
                            _ => "—".into(),
                        };
                        if let (Some(without), true) =
                            (g.step_time_ratio_without_recalls, g.recalls_per_event > 0.0)
                        {
                            cell.push_str(&format!(" (no recalls {without:.2})"));
                        }
                        cell
                    },
                ]);
            }
        }
        rows
    }

    /// The verdict on the workload's bars for state+recall at the largest horizon.
    pub fn acceptance(&self) -> Option<String> {
        let horizon = *self.config.horizons.iter().max()?;
        let g = self.group(horizon, Arm::StateRecall)?;
        let mark = |ok: bool| if ok { "met" } else { "NOT met" };
        let growth = g
            .prompt_growth
            .map_or("— (fewer than 200 steps)".into(), |v| {
                format!("{:+.1}% ({})", v * 100.0, mark(v < GROWTH_BAR))
            });
        let mut ratio = match (g.step_time_ratio, g.step_cpu_ratio) {
            (Some(wall), Some(cpu)) => format!(
                "{wall:.2} wall ({}), {cpu:.2} CPU ({})",
                mark(wall <= TIME_RATIO_BAR),
                mark(cpu <= TIME_RATIO_BAR)
            ),
            (Some(wall), None) => format!(
                "{wall:.2} wall ({}; CPU time is measured with --jobs 1)",
                mark(wall <= TIME_RATIO_BAR)
            ),
            _ => "— (fewer than 300 steps)".into(),
        };
        if let Some(without) = g.step_time_ratio_without_recalls {
            ratio.push_str(&format!(
                "; without the windows' recall steps and the steps reading their results {without:.2} wall ({})",
                mark(without <= TIME_RATIO_BAR)
            ));
        }
        Some(format!(
            "state+recall at T = {}: score {:.3} (bar ≥ {SCORE_BAR}: {}); prompt growth first→last 100 steps {growth} (bar < {:.0}%); step time last 100 / 101–200 {ratio} (bar ≤ {TIME_RATIO_BAR}).\n",
            thousands(f64::from(horizon)),
            g.score.mean,
            mark(g.score.mean >= SCORE_BAR),
            GROWTH_BAR * 100.0
        ))
    }

    fn notes(&self) -> String {
        let rejected: u64 = self.groups.iter().map(|g| g.rejected_answers).sum();
        let errors: u64 = self.groups.iter().map(|g| g.tool_errors).sum();
        let failed: usize = self.groups.iter().map(|g| g.seeds - g.completed).sum();
        let mut out = format!(
            "Rejected answers: {rejected}. Tool calls that returned an error: {errors}. Runs that did not complete: {failed}.\n"
        );
        if let Some(verdict) = self.acceptance() {
            out.push_str(&verdict);
        }
        out
    }

    pub fn table(&self) -> String {
        let header: Vec<String> = Self::HEADER.iter().map(|h| (*h).to_owned()).collect();
        let rows = self.rows();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in &rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
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
        let mut out = format!("{}\n{}\n", self.title(), line(&header));
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
        out.push('\n');
        out.push_str(&self.notes());
        out
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "# skillbench report: warehouse archive\n\n{}.\n\n| {} |\n|{}\n",
            self.title(),
            Self::HEADER.join(" | "),
            "---|".repeat(Self::HEADER.len())
        );
        for row in self.rows() {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out.push('\n');
        out.push_str(&self.notes());
        out.push_str(
            "\nArms: `state+recall` is the skill as shipped (bounded state, the journal's `recall` tool); `state` is the same \
             skill without the recall tool; `window` and `summary` show the transcript within the context budget. Tokens are \
             o200k_base tokens counted locally. ms/step is the median in-loop time of a step (commit, tool, next prompt, \
             model); the time ratio compares the medians of the last 100 steps and of steps 101–200 (the median over seeds), in wall time and, \
             with `--jobs 1`, in the process's CPU time (which other programs on the machine do not stretch); `no recalls` \
             is the wall-time ratio over the same windows without their recall steps and the steps that read a recall's \
             result (a recall step also searches the journal, the step after it reads the hits, and steps 101–200 have \
             neither). Per-step prompt \
             sizes: `archive_prompt_tokens.svg`; every run: `archive.json`.\n",
        );
        out
    }
}
