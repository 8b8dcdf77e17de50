//! Progress of `batch run`: a bar on a terminal (done / failed / running, steps/s, tokens,
//! ETA), otherwise one line every few seconds, so logs stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use skillstate_runtime::WorkerEvent;
use skillstate_store::TaskStatus;
use tokio::sync::mpsc;

use super::render::duration;

/// How often a line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(10);

/// Counts as the worker reports them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub paused: u64,
    pub running: u64,
    pub steps: u64,
    pub tokens: u64,
}

impl Tally {
    fn finished(&self) -> u64 {
        self.completed + self.failed + self.paused
    }

    fn line(&self, elapsed: Duration, finished_here: u64) -> String {
        let secs = elapsed.as_secs_f64().max(0.001);
        let remaining = self.total.saturating_sub(self.finished());
        let eta = if remaining == 0 {
            "done".to_owned()
        } else if finished_here > 0 {
            duration((secs / finished_here as f64 * remaining as f64 * 1000.0) as i64)
        } else {
            "-".to_owned()
        };
        let paused = if self.paused > 0 {
            format!(" · {} paused", self.paused)
        } else {
            String::new()
        };
        format!(
            "{}/{} done · {} failed{paused} · {} running · {:.1} steps/s · {} tok · ETA {eta}",
            self.finished(),
            self.total,
            self.failed,
            self.running,
            self.steps as f64 / secs,
            short_count(self.tokens)
        )
    }
}

/// `950`, `12.3k`, `2.4M`.
fn short_count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Follows the worker's events until it stops; returns the final tally.
pub async fn follow(mut events: mpsc::UnboundedReceiver<WorkerEvent>, start: Tally) -> Tally {
    let started = Instant::now();
    let already = start.finished();
    let mut tally = start;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::with_draw_target(Some(tally.total), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{bar:20.cyan/blue} {wide_msg}") {
            bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
        }
        bar.enable_steady_tick(Duration::from_millis(250));
        bar
    });
    let mut ticker = tokio::time::interval(LINE_EVERY);
    ticker.tick().await;
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                let notice = apply(&mut tally, event);
                if let Some(notice) = notice {
                    match &bar {
                        Some(bar) => bar.suspend(|| errln!("{notice}")),
                        None => errln!("{notice}"),
                    }
                }
                if let Some(bar) = &bar {
                    bar.set_position(tally.finished());
                    bar.set_message(tally.line(started.elapsed(), tally.finished() - already));
                }
            }
            _ = ticker.tick(), if bar.is_none() => {
                errln!("{}", tally.line(started.elapsed(), tally.finished() - already));
            }
        }
    }
    match &bar {
        Some(bar) => bar.finish_and_clear(),
        None => errln!(
            "{}",
            tally.line(started.elapsed(), tally.finished() - already)
        ),
    }
    tally
}

/// Counts one event; returns a line worth printing (a failure, a stopped batch).
fn apply(tally: &mut Tally, event: WorkerEvent) -> Option<String> {
    match event {
        WorkerEvent::Claimed { .. } => tally.running += 1,
        WorkerEvent::Step {
            prompt_tokens,
            accepted,
            ..
        } => {
            tally.tokens += prompt_tokens as u64;
            if accepted {
                tally.steps += 1;
            }
        }
        WorkerEvent::Settled {
            task,
            status,
            steps,
            failure,
        } => {
            tally.running = tally.running.saturating_sub(1);
            match status {
                TaskStatus::Completed => tally.completed += 1,
                TaskStatus::Failed => {
                    tally.failed += 1;
                    return Some(format!(
                        "task {task} failed after {steps} step(s): {}",
                        failure.unwrap_or_default()
                    ));
                }
                _ => {
                    tally.paused += 1;
                    return Some(format!(
                        "task {task} is {} (see skillstate pending)",
                        status.as_str()
                    ));
                }
            }
        }
        WorkerEvent::Retrying {
            task,
            tries,
            failure,
            ..
        } => {
            tally.running = tally.running.saturating_sub(1);
            return Some(format!(
                "task {task} failed ({failure}); retry {tries} queued with backoff"
            ));
        }
        WorkerEvent::Released { .. } | WorkerEvent::LostLease { .. } => {
            tally.running = tally.running.saturating_sub(1);
        }
        WorkerEvent::BatchStopped { reason, .. } => {
            return Some(format!(
                "batch stopped (on_error: stop): {reason}; running tasks finish, queued ones stay queued"
            ));
        }
    }
    None
}
