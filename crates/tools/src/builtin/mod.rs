//! Built-in tools, confined to a work directory and off unless a skill allows them.

mod confine;
mod fs;
mod launcher;
mod protected;
mod rlimits;
mod sandbox;
mod shell;
mod spawner;

pub use confine::WorkDir;
pub use fs::{FsTool, fs_tools};
pub use protected::{ProtectedPaths, resolved as resolved_path};
pub use rlimits::SandboxLimits;
pub use sandbox::{Sandbox, SandboxConfig, SandboxMode};
pub use shell::{ShellSettings, ShellTool};
