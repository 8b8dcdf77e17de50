//! The pure core of skillstate: skills, state, patches, validation, prompt rendering and token
//! counting. No async, no network, no database; the only I/O is reading a skill directory.

pub mod board;
pub mod json;
pub mod output;
pub mod output_schema;
pub mod outside;
pub mod patch;
pub mod prompt;
pub mod recall;
pub mod schema;
mod schema_graph;
pub mod schema_guard;
pub mod schema_problem;
pub mod secrets;
pub mod skill;
pub mod strict_json;
pub mod tokens;
pub mod tool;
pub mod upgrade;
pub mod validate;
pub mod write_only;

pub use output::{ParsedOutput, RawAction, parse_output};
pub use output_schema::step_output_schema;
pub use outside::Outside;
pub use patch::StatePatch;
pub use prompt::{ContextStrategy, Prompt, PromptInput, Turn, fit_observation, render};
pub use schema::StateSchema;
pub use schema_problem::{ReaderView, SchemaProblem, ShownProblem};
pub use skill::{Skill, SkillDefinition, SkillErrors, SkillProblem};
pub use tokens::count_tokens;
pub use tool::{SideEffect, ToolCatalog, ToolSpec};
pub use validate::{
    AcceptedPatch, AcceptedStep, Action, RejectedStep, Rejection, RejectionKind, StepRules,
    validate_patch, validate_step,
};
pub use write_only::{SecretValues, WriteOnly};
