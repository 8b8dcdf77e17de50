//! The software repository environment (the paper's second domain; the rules are ours, see
//! docs/paper.md, "Reproducing the paper"): feature requests arrive as issue assignments; the agent
//! commits to feature branches, fixes failing CI, opens pull requests, answers reviews and
//! merges. CI results and reviews arrive as webhooks in later observations, so the agent must
//! remember which PR belongs to which branch and what each branch's CI said.
//!
//! Everything exogenous — which features are requested and when, each CI run's outcome, which
//! PRs get a review — is drawn from the seed up front. When CI results and reviews arrive
//! depends on when the agent acts. Score = features merged into main with green CI and no open
//! review / features requested.

use std::sync::{Arc, Mutex};

use crate::lock;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use crate::noise::{syslog_lines, with_telemetry};
use crate::params::{ParamSpec, Params};
use crate::rng::SeededRng;

pub const KIND: &str = "repository";

const NAMES: [&str; 24] = [
    "search-cache",
    "rate-limit",
    "audit-log",
    "dark-mode",
    "csv-export",
    "retry-queue",
    "sso-login",
    "webhooks",
    "pagination",
    "metrics",
    "i18n",
    "billing-api",
    "thumbnails",
    "feature-flags",
    "backup-job",
    "healthcheck",
    "password-reset",
    "email-digest",
    "tagging",
    "bulk-import",
    "api-keys",
    "notifications",
    "archiving",
    "sharing",
];

/// The repository's `[environment]` parameters.
pub const PARAMETERS: &[ParamSpec] = &[
    ParamSpec::whole("seed", 0, 0, u64::MAX),
    ParamSpec::whole("events", 30, 1, 100_000),
    ParamSpec::whole("noise", 0, 0, 1000),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryConfig {
    pub seed: u64,
    /// Steps in the episode (the horizon T).
    pub events: u32,
    /// Syslog lines appended to every observation.
    #[serde(default)]
    pub noise: u32,
}

impl RepositoryConfig {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let p = Params::new(KIND, PARAMETERS, params);
        let config = Self {
            seed: p.u64("seed")?,
            events: p.u64("events")? as u32,
            noise: p.u64("noise")? as u32,
        };
        p.finish()?;
        Ok(config)
    }

    /// One feature per seven steps, requested during the first two thirds of the episode.
    pub fn feature_count(&self) -> usize {
        (self.events as usize / 7).max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Ci {
    None,
    Pending,
    Passed,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Feature {
    issue: u32,
    branch: String,
    file: String,
    requested_at: usize,
    /// Outcome of each CI run, drawn up front (the first run fails more often; later runs are flaky).
    ci_plan: Vec<bool>,
    /// Whether its PR gets a review comment.
    gets_review: bool,
    runs: usize,
    ci: Ci,
    ci_ready_at: usize,
    commits: u32,
    pr: Option<u32>,
    review_due: Option<usize>,
    review_open: bool,
    merged_clean: Option<bool>,
}

fn plan(config: &RepositoryConfig) -> Vec<Feature> {
    let mut rng = SeededRng::new(config.seed ^ 0x0E90_0E90);
    let count = config.feature_count();
    let window = (config.events as usize * 2 / 3).max(1);
    let mut names: Vec<&str> = NAMES.to_vec();
    (0..count)
        .map(|k| {
            let name = if names.is_empty() {
                format!("feature-{k}")
            } else {
                names.remove(rng.index(names.len())).to_owned()
            };
            let name = if k >= NAMES.len() {
                format!("{name}-{k}")
            } else {
                name
            };
            Feature {
                issue: 100 + k as u32,
                branch: format!("feature/{name}"),
                file: format!("src/{}.rs", name.replace('-', "_")),
                requested_at: k * window / count,
                ci_plan: (0..6)
                    .map(|run| rng.below(100) >= if run == 0 { 35 } else { 15 })
                    .collect(),
                gets_review: rng.below(100) < 40,
                runs: 0,
                ci: Ci::None,
                ci_ready_at: 0,
                commits: 0,
                pr: None,
                review_due: None,
                review_open: false,
                merged_clean: None,
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Repo {
    config: RepositoryConfig,
    features: Vec<Feature>,
    /// The step whose observation is being built / acted on.
    step: usize,
    next_pr: u32,
    main_broken: bool,
}

impl Repo {
    fn feature(&mut self, branch: &str) -> Result<&mut Feature, String> {
        let known: Vec<String> = self
            .features
            .iter()
            .filter(|f| f.requested_at <= self.step)
            .map(|f| f.branch.clone())
            .collect();
        self.features
            .iter_mut()
            .find(|f| f.branch == branch && f.requested_at <= self.step)
            .ok_or_else(|| {
                format!(
                    "Error: there is no branch {branch} (open branches: {}); nothing changed.",
                    known.join(", ")
                )
            })
    }

    fn start_ci(feature: &mut Feature, step: usize) {
        feature.ci = Ci::Pending;
        // Results arrive one or two steps later, alternating so that runs overlap.
        feature.ci_ready_at = step + 1 + (feature.runs + feature.issue as usize) % 2;
        feature.runs += 1;
    }

    fn commit(&mut self, branch: &str, file: &str) -> Result<String, String> {
        let step = self.step;
        let feature = self.feature(branch)?;
        if feature.merged_clean.is_some() {
            return Err(format!(
                "Error: {branch} was merged and deleted; nothing changed."
            ));
        }
        if feature.file != file {
            return Err(format!(
                "Error: {file} is not part of {branch} (it changes {}); nothing changed.",
                feature.file
            ));
        }
        feature.commits += 1;
        feature.review_open = false;
        Self::start_ci(feature, step);
        Ok(format!(
            "Success: committed {file} to {branch}. CI started."
        ))
    }

    fn fix_ci(&mut self, branch: &str) -> Result<String, String> {
        let step = self.step;
        let feature = self.feature(branch)?;
        if feature.ci != Ci::Failed {
            return Err(format!(
                "Error: CI on {branch} is not failing; nothing changed."
            ));
        }
        feature.commits += 1;
        Self::start_ci(feature, step);
        Ok(format!("Success: pushed a CI fix to {branch}. CI started."))
    }

    fn create_pr(&mut self, branch: &str) -> Result<String, String> {
        let step = self.step;
        let pr = self.next_pr;
        let feature = self.feature(branch)?;
        if let Some(existing) = feature.pr {
            return Err(format!(
                "Error: {branch} already has PR #{existing}; nothing changed."
            ));
        }
        if feature.commits == 0 {
            return Err(format!(
                "Error: {branch} has no commits yet; nothing changed."
            ));
        }
        feature.pr = Some(pr);
        if feature.gets_review {
            feature.review_due = Some(step + 1);
        }
        self.next_pr += 1;
        Ok(format!("Success: opened PR #{pr} for {branch}."))
    }

    fn merge(&mut self, pr: u64) -> Result<String, String> {
        let Some(feature) = self
            .features
            .iter_mut()
            .find(|f| f.pr.map(u64::from) == Some(pr))
        else {
            return Err(format!(
                "Error: there is no open PR #{pr}; nothing changed."
            ));
        };
        if feature.merged_clean.is_some() {
            return Err(format!(
                "Error: PR #{pr} is already merged; nothing changed."
            ));
        }
        let clean = feature.ci == Ci::Passed && !feature.review_open;
        feature.merged_clean = Some(clean);
        let branch = feature.branch.clone();
        if clean {
            Ok(format!(
                "Success: merged PR #{pr} into main; branch {branch} deleted."
            ))
        } else {
            self.main_broken = true;
            Ok(format!(
                "Merged PR #{pr} into main, but its CI was not green or a review was unresolved: main is broken."
            ))
        }
    }

    /// Webhooks and assignments that arrive at the current step.
    fn arrivals(&mut self) -> Vec<String> {
        let step = self.step;
        let mut lines = Vec::new();
        for feature in &mut self.features {
            if feature.ci == Ci::Pending && feature.ci_ready_at == step {
                let passed = feature
                    .ci_plan
                    .get(feature.runs - 1)
                    .copied()
                    .unwrap_or(true);
                feature.ci = if passed { Ci::Passed } else { Ci::Failed };
                lines.push(if passed {
                    format!("CI Pipeline Passed for {}.", feature.branch)
                } else {
                    format!(
                        "CI Pipeline Failed for {}. Linter error on line {}.",
                        feature.branch,
                        10 + feature.issue % 80
                    )
                });
            }
            if feature.review_due == Some(step) && feature.merged_clean.is_none() {
                feature.review_open = true;
                lines.push(format!(
                    "Review on PR #{}: please rename the helper in {} before merging.",
                    feature.pr.unwrap_or(0),
                    feature.file
                ));
            }
        }
        for feature in self.features.iter().filter(|f| f.requested_at == step) {
            lines.push(format!(
                "Issue #{} assigned to you: implement {}. Work on branch {}, file {}.",
                feature.issue,
                feature
                    .branch
                    .trim_start_matches("feature/")
                    .replace('-', " "),
                feature.branch,
                feature.file
            ));
        }
        lines
    }

    fn observation(&mut self, result: Option<String>) -> String {
        let mut lines: Vec<String> = result.into_iter().collect();
        let arrivals = self.arrivals();
        if arrivals.is_empty() {
            lines.push("No new events.".into());
        }
        lines.extend(arrivals);
        with_telemetry(
            lines.join("\n"),
            syslog_lines(self.config.seed, self.step, self.config.noise),
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Commit,
    CreatePr,
    Merge,
    FixCi,
    Wait,
}

struct RepoTool {
    op: Op,
    spec: ToolSpec,
    repo: Arc<Mutex<Repo>>,
}

fn branch_schema() -> Value {
    json!({"type": "string", "pattern": "^feature/[a-z0-9-]+$"})
}

fn spec(op: Op) -> ToolSpec {
    let (name, description, properties, side_effect) = match op {
        Op::Commit => (
            "commit",
            "Commit a change to a file on a feature branch (starts CI on that branch).",
            json!({"branch": branch_schema(), "file": {"type": "string", "pattern": "^src/[a-z0-9_]+\\.rs$"}}),
            SideEffect::Effectful,
        ),
        Op::CreatePr => (
            "create_pr",
            "Open a pull request for a feature branch.",
            json!({"branch": branch_schema()}),
            SideEffect::Effectful,
        ),
        Op::Merge => (
            "merge",
            "Merge a pull request into main. Merging a PR whose CI is not green, or with an unresolved review, breaks main.",
            json!({"pr": {"type": "integer", "minimum": 1}}),
            SideEffect::Effectful,
        ),
        Op::FixCi => (
            "fix_ci",
            "Push a fix for a failing CI run on a branch (starts CI again).",
            json!({"branch": branch_schema()}),
            SideEffect::Effectful,
        ),
        Op::Wait => (
            "wait",
            "Do nothing this step.",
            json!({}),
            SideEffect::ReadOnly,
        ),
    };
    crate::env_tool(KIND, name, description, properties, side_effect)
}

#[async_trait]
impl Tool for RepoTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let text = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut repo = lock(&self.repo);
        let result = match self.op {
            Op::Commit => repo.commit(&text("branch"), &text("file")),
            Op::CreatePr => repo.create_pr(&text("branch")),
            Op::Merge => repo.merge(args.get("pr").and_then(Value::as_u64).unwrap_or(0)),
            Op::FixCi => repo.fix_ci(&text("branch")),
            Op::Wait => Ok("Waited.".to_owned()),
        };
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(text),
        })
    }
}

pub struct Repository {
    repo: Arc<Mutex<Repo>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl Repository {
    pub fn new(config: RepositoryConfig) -> Self {
        let features = plan(&config);
        let repo = Arc::new(Mutex::new(Repo {
            config,
            features,
            step: 0,
            next_pr: 1,
            main_broken: false,
        }));
        let tools = [Op::Commit, Op::CreatePr, Op::Merge, Op::FixCi, Op::Wait]
            .into_iter()
            .map(|op| {
                Arc::new(RepoTool {
                    op,
                    spec: spec(op),
                    repo: Arc::clone(&repo),
                }) as Arc<dyn Tool>
            })
            .collect();
        Self { repo, tools }
    }
}

impl Environment for Repository {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        lock(&self.repo).observation(None)
    }

    fn after_action(&mut self) -> Option<String> {
        let mut repo = lock(&self.repo);
        repo.step += 1;
        // The runtime puts the tool's output first; the environment adds what arrived.
        if repo.step >= repo.config.events as usize {
            return None;
        }
        Some(repo.observation(None))
    }

    fn episode_over(&self) -> bool {
        let repo = lock(&self.repo);
        repo.step >= repo.config.events as usize
    }

    fn outcome(&self) -> Value {
        let repo = lock(&self.repo);
        let requested = repo
            .features
            .iter()
            .filter(|f| f.requested_at < repo.config.events as usize)
            .count()
            .max(1);
        let clean = repo
            .features
            .iter()
            .filter(|f| f.merged_clean == Some(true))
            .count();
        json!({
            "score": clean as f64 / requested as f64,
            "merged_clean": clean,
            "merged_broken": repo.features.iter().filter(|f| f.merged_clean == Some(false)).count(),
            "features_requested": requested,
            "main_broken": repo.main_broken,
        })
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.repo)).unwrap_or(Value::Null)
    }

    fn replayable(&self) -> bool {
        true
    }

    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError> {
        let restored: Repo =
            serde_json::from_value(checkpoint.clone()).map_err(|e| EnvironmentError::Restore {
                kind: KIND.into(),
                message: e.to_string(),
            })?;
        *lock(&self.repo) = restored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(seed: u64, events: u32) -> Repository {
        Repository::new(RepositoryConfig {
            seed,
            events,
            noise: 0,
        })
    }

    async fn call(env: &Repository, tool: &str, args: Value) -> ToolOutput {
        let tools = env.tools();
        skillstate_tools::find_tool(&tools, tool)
            .unwrap()
            .call(&args, &CallContext::new("t", 1))
            .await
            .unwrap()
    }

    #[test]
    fn plans_are_deterministic() {
        let a = plan(&RepositoryConfig {
            seed: 4,
            events: 70,
            noise: 0,
        });
        assert_eq!(
            a,
            plan(&RepositoryConfig {
                seed: 4,
                events: 70,
                noise: 0
            })
        );
        assert_eq!(a.len(), 10);
        assert_ne!(
            a,
            plan(&RepositoryConfig {
                seed: 5,
                events: 70,
                noise: 0
            })
        );
        assert!(a.windows(2).all(|w| w[0].requested_at <= w[1].requested_at));
    }

    /// Drives the repository through one feature by hand: the rules on CI, reviews and merges.
    #[tokio::test]
    async fn a_feature_goes_from_issue_to_a_clean_merge() {
        let mut env = repo(3, 40);
        let opening = env.opening_observation();
        let feature = lock(&env.repo).features[0].clone();
        assert!(
            opening.contains(&format!(
                "Work on branch {}, file {}.",
                feature.branch, feature.file
            )),
            "{opening}"
        );
        let bad = call(
            &env,
            "commit",
            json!({"branch": feature.branch, "file": "src/other.rs"}),
        )
        .await;
        assert!(!bad.ok && bad.text.contains("nothing changed"));
        assert!(
            !call(&env, "create_pr", json!({"branch": feature.branch}))
                .await
                .ok,
            "no PR before a commit"
        );
        assert!(
            call(
                &env,
                "commit",
                json!({"branch": feature.branch, "file": feature.file})
            )
            .await
            .ok
        );
        let mut log = String::new();
        // Wait for CI, fixing it whenever it fails.
        for _ in 0..12 {
            let arrived = env.after_action().unwrap_or_default();
            log.push_str(&arrived);
            let ci = lock(&env.repo).features[0].ci;
            match ci {
                Ci::Failed => assert!(
                    call(&env, "fix_ci", json!({"branch": feature.branch}))
                        .await
                        .ok
                ),
                Ci::Passed => break,
                _ => assert!(call(&env, "wait", json!({})).await.ok),
            }
        }
        assert!(log.contains("CI Pipeline"), "{log}");
        let opened = call(&env, "create_pr", json!({"branch": feature.branch})).await;
        assert_eq!(
            opened.text,
            format!("Success: opened PR #1 for {}.", feature.branch)
        );
        let next = env.after_action().unwrap_or_default();
        if feature.gets_review {
            assert!(next.contains("Review on PR #1"), "{next}");
            // Merging with the review open breaks main.
            let merged = call(&env, "merge", json!({"pr": 1})).await;
            assert!(merged.text.contains("main is broken"), "{}", merged.text);
            assert_eq!(env.outcome()["merged_broken"], 1);
        } else {
            let merged = call(&env, "merge", json!({"pr": 1})).await;
            assert!(
                merged.ok && merged.text.contains("merged PR #1"),
                "{}",
                merged.text
            );
            assert_eq!(env.outcome()["merged_clean"], 1);
            assert!(
                !call(&env, "merge", json!({"pr": 1})).await.ok,
                "a PR merges once"
            );
        }
        let checkpoint = env.checkpoint();
        let mut copy = repo(0, 1);
        copy.restore(&checkpoint).unwrap();
        assert_eq!(copy.outcome(), env.outcome());
    }

    #[tokio::test]
    async fn merging_red_ci_breaks_main() {
        let mut env = repo(3, 40);
        env.opening_observation();
        let feature = lock(&env.repo).features[0].clone();
        call(
            &env,
            "commit",
            json!({"branch": feature.branch, "file": feature.file}),
        )
        .await;
        call(&env, "create_pr", json!({"branch": feature.branch})).await;
        let merged = call(&env, "merge", json!({"pr": 1})).await;
        assert!(
            merged.text.contains("main is broken"),
            "CI is still pending: {}",
            merged.text
        );
        assert_eq!(env.outcome()["main_broken"], true);
        assert_eq!(env.outcome()["score"], 0.0);
    }
}
