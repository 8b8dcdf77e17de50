//! The coder's environment (`bugfix_coder`): a working copy of the seeded repository. The
//! opening observation lists the failing tests; `inspect` shows where one fails and what it
//! asserts, `edit` changes one line of the working copy, `run_test` runs one test. Nothing
//! here reaches the reviewer: the coder proposes each change on the board.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use super::codebase::Codebase;
use super::{
    BugfixConfig, WaitTool, code_schema, file_schema, line_arg, output, restore_error, test_schema,
    text_arg,
};
use crate::lock;

pub const KIND: &str = "bugfix_coder";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Copy {
    config: BugfixConfig,
    code: Codebase,
    edits: u32,
}

impl Copy {
    fn inspect(&self, test: &str) -> Result<String, String> {
        let module = self.code.by_test(test).ok_or_else(|| {
            format!(
                "Error: there is no test {test} (failing: {}); nothing changed.",
                Codebase::list(&self.code.failing())
            )
        })?;
        match module.failure() {
            None => Ok(format!("{test} passes; nothing to fix there.")),
            Some(failure) => Ok(format!(
                "{test} failed at {}:{}\nline {}: `{}`\n{failure}",
                module.file(),
                module.line,
                module.line,
                module.text
            )),
        }
    }

    fn edit(&mut self, file: &str, line: u64, before: &str, after: &str) -> Result<String, String> {
        self.code
            .edit(file, line, before, after)
            .map_err(|e| format!("Error: {}; nothing changed.", e.text()))?;
        self.edits += 1;
        Ok(format!("Edited {file}:{line} in the working copy."))
    }

    fn run_test(&self, test: &str) -> Result<String, String> {
        let module = self
            .code
            .by_test(test)
            .ok_or_else(|| format!("Error: there is no test {test}."))?;
        Ok(match module.failure() {
            None => format!("{test} passed."),
            Some(failure) => format!("{test} still fails: {failure}"),
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Inspect,
    Edit,
    RunTest,
}

struct CoderTool {
    op: Op,
    spec: ToolSpec,
    copy: Arc<Mutex<Copy>>,
}

fn spec(op: Op) -> ToolSpec {
    let (name, description, properties, side_effect) = match op {
        Op::Inspect => (
            "inspect",
            "Show where a failing test fails: the file, the line it checks as the working copy has it, and what it asserts.",
            json!({"test": test_schema()}),
            SideEffect::ReadOnly,
        ),
        Op::Edit => (
            "edit",
            "Replace one line of a file in the working copy; `before` must be the line as it reads now (leading spaces included).",
            json!({"file": file_schema(), "line": {"type": "integer", "minimum": 1}, "before": code_schema(), "after": code_schema()}),
            SideEffect::Idempotent,
        ),
        Op::RunTest => (
            "run_test",
            "Run one test against the working copy.",
            json!({"test": test_schema()}),
            SideEffect::ReadOnly,
        ),
    };
    crate::env_tool(KIND, name, description, properties, side_effect)
}

#[async_trait]
impl Tool for CoderTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let mut copy = lock(&self.copy);
        let result = match self.op {
            Op::Inspect => copy.inspect(&text_arg(args, "test")),
            Op::Edit => copy.edit(
                &text_arg(args, "file"),
                line_arg(args),
                &text_arg(args, "before"),
                &text_arg(args, "after"),
            ),
            Op::RunTest => copy.run_test(&text_arg(args, "test")),
        };
        Ok(output(result))
    }
}

/// The coder's world.
pub struct Coder {
    copy: Arc<Mutex<Copy>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl Coder {
    pub fn new(config: BugfixConfig) -> Self {
        let code = Codebase::generate(&config);
        let copy = Arc::new(Mutex::new(Copy {
            config,
            code,
            edits: 0,
        }));
        let mut tools: Vec<Arc<dyn Tool>> = [Op::Inspect, Op::Edit, Op::RunTest]
            .into_iter()
            .map(|op| {
                Arc::new(CoderTool {
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

impl Environment for Coder {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        let copy = lock(&self.copy);
        let failing = copy.code.failing();
        format!(
            "CI on main is red: {} of {} tests fail: {}.",
            failing.len(),
            copy.code.modules.len(),
            Codebase::list(&failing)
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
            "failing": copy.code.failing(),
            "edits": copy.edits,
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
