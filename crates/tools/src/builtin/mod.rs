//! Built-in tools, confined to a work directory and off unless a skill allows them.

mod confine;
mod fs;
mod sandbox;
mod shell;

pub use confine::WorkDir;
pub use fs::{FsTool, fs_tools};
pub use sandbox::{Sandbox, SandboxConfig, SandboxMode};
pub use shell::{ShellSettings, ShellTool};
