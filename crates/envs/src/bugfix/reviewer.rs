//! The reviewer's environment (`bugfix_reviewer`): its own copy of the seeded repository, on
//! which `apply_and_test` tries a change the coder proposed on the board and runs the whole
//! suite. A change is kept only when it makes at least one failing test pass and breaks none;
//! otherwise it is reverted and the failures are reported. `release` tags a patch version once
//! every test passes.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use super::codebase::Codebase;
use super::{
    BugfixConfig, WaitTool, code_schema, file_schema, line_arg, output, restore_error, text_arg,
};
use crate::lock;

pub const KIND: &str = "bugfix_reviewer";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Copy {
    config: BugfixConfig,
    code: Codebase,
    /// Tests each applied change made pass, in order.
    applied: Vec<String>,
    refused: u32,
    released: Option<String>,
}

fn version_schema() -> Value {
    json!({"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"})
}

impl Copy {
    fn apply_and_test(
        &mut self,
        change: u64,
        file: &str,
        line: u64,
        before: &str,
        after: &str,
    ) -> Result<String, String> {
        let failing_before = self.code.failing();
        let kept = self.code.clone();
        if let Err(e) = self.code.edit(file, line, before, after) {
            self.refused += 1;
            return Err(format!(
                "Change #{change} does not apply: {}; nothing changed.",
                e.text()
            ));
        }
        let failing_after = self.code.failing();
        let fixed: Vec<String> = failing_before
            .iter()
            .filter(|t| !failing_after.contains(t))
            .cloned()
            .collect();
        let broken: Vec<String> = failing_after
            .iter()
            .filter(|t| !failing_before.contains(t))
            .cloned()
            .collect();
        let total = self.code.modules.len();
        if fixed.is_empty() || !broken.is_empty() {
            let reasons: Vec<String> = broken
                .iter()
                .chain(failing_after.iter().filter(|t| {
                    // The test the change meant to fix, if it still fails.
                    self.code.by_test(t).is_some_and(|m| m.file() == file)
                }))
                .filter_map(|t| {
                    self.code
                        .by_test(t)
                        .and_then(|m| m.failure())
                        .map(|f| format!("{t}: {f}"))
                })
                .collect();
            self.code = kept;
            self.refused += 1;
            return Err(format!(
                "Change #{change} refused and reverted: it makes no failing test pass{}. {}",
                if broken.is_empty() {
                    String::new()
                } else {
                    format!(" and breaks {}", Codebase::list(&broken))
                },
                reasons.join("; ")
            ));
        }
        self.applied.extend(fixed.iter().cloned());
        Ok(format!(
            "Change #{change} applied: {} passes now; no regressions; {} of {total} tests pass; still failing: {}.",
            Codebase::list(&fixed),
            total - failing_after.len(),
            Codebase::list(&failing_after)
        ))
    }

    fn release(&mut self, version: &str) -> Result<String, String> {
        if let Some(done) = &self.released {
            return Err(format!(
                "Error: v{done} is released already; nothing changed."
            ));
        }
        let failing = self.code.failing();
        if !failing.is_empty() {
            return Err(format!(
                "Error: {} tests still fail ({}); nothing released.",
                failing.len(),
                Codebase::list(&failing)
            ));
        }
        self.released = Some(version.to_owned());
        let total = self.code.modules.len();
        Ok(format!(
            "Released v{version}: {total} of {total} tests pass; {} fixes: {}.",
            self.applied.len(),
            Codebase::list(&self.applied)
        ))
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    ApplyAndTest,
    Release,
}

struct ReviewerTool {
    op: Op,
    spec: ToolSpec,
    copy: Arc<Mutex<Copy>>,
}

fn spec(op: Op) -> ToolSpec {
    let (name, description, properties, side_effect) = match op {
        Op::ApplyAndTest => (
            "apply_and_test",
            "Apply a proposed change (its number, file, line, the line before and after) to your copy and run the whole suite. Kept only if a failing test passes and none breaks; reverted otherwise.",
            json!({"change": {"type": "integer", "minimum": 1}, "file": file_schema(), "line": {"type": "integer", "minimum": 1}, "before": code_schema(), "after": code_schema()}),
            SideEffect::Effectful,
        ),
        Op::Release => (
            "release",
            "Tag a release of your copy (only when every test passes).",
            json!({"version": version_schema()}),
            SideEffect::Effectful,
        ),
    };
    crate::env_tool(KIND, name, description, properties, side_effect)
}

#[async_trait]
impl Tool for ReviewerTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let mut copy = lock(&self.copy);
        let result = match self.op {
            Op::ApplyAndTest => copy.apply_and_test(
                args.get("change").and_then(Value::as_u64).unwrap_or(0),
                &text_arg(args, "file"),
                line_arg(args),
                &text_arg(args, "before"),
                &text_arg(args, "after"),
            ),
            Op::Release => copy.release(&text_arg(args, "version")),
        };
        Ok(output(result))
    }
}

/// The reviewer's world.
pub struct Reviewer {
    copy: Arc<Mutex<Copy>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl Reviewer {
    pub fn new(config: BugfixConfig) -> Self {
        let code = Codebase::generate(&config);
        let copy = Arc::new(Mutex::new(Copy {
            config,
            code,
            applied: Vec::new(),
            refused: 0,
            released: None,
        }));
        let mut tools: Vec<Arc<dyn Tool>> = [Op::ApplyAndTest, Op::Release]
            .into_iter()
            .map(|op| {
                Arc::new(ReviewerTool {
                    op,
                    spec: spec(op),
                    copy: Arc::clone(&copy),
                }) as Arc<dyn Tool>
            })
            .collect();
        tools.push(WaitTool::tool(KIND));
        Self { copy, tools }
    }
}

impl Environment for Reviewer {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        let copy = lock(&self.copy);
        format!(
            "You review changes to main ({} tests, {} failing now). Proposed changes arrive on the board.",
            copy.code.modules.len(),
            copy.code.failing().len()
        )
    }

    fn after_action(&mut self) -> Option<String> {
        None
    }

    fn episode_over(&self) -> bool {
        false
    }

    fn outcome(&self) -> Value {
        let copy = lock(&self.copy);
        json!({
            "applied": copy.applied.len(),
            "refused": copy.refused,
            "released": copy.released,
            "failing": copy.code.failing(),
        })
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.copy)).unwrap_or(Value::Null)
    }

    fn replayable(&self) -> bool {
        true
    }

    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError> {
        let restored: Copy =
            serde_json::from_value(checkpoint.clone()).map_err(|e| restore_error(KIND, e))?;
        *lock(&self.copy) = restored;
        Ok(())
    }
}
