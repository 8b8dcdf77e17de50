//! The resource limits of a sandbox: kernel rlimits set by util-linux `prlimit` as the first
//! program inside the sandbox, soft and hard alike (without capabilities the command cannot
//! raise them), inherited by every process the command starts.
//!
//! Set inside the sandbox's own user namespace, `RLIMIT_NPROC` counts the processes of that
//! namespace only — one sandbox, not every process of the runtime's user — but the kernel
//! never enforces it for uid 0: a runtime started as root gets no process limit (a cgroup
//! would be needed; see docs/security.md).

use std::ffi::OsString;

use serde::{Deserialize, Serialize};

/// The operator's limits (skillstate.toml `[tools] sandbox_*`), on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLimits {
    /// Processes and threads at once in one sandbox (`RLIMIT_NPROC`).
    pub max_processes: u64,
    /// Address space of each process, in bytes (`RLIMIT_AS`).
    pub memory_bytes: u64,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`).
    pub max_file_bytes: u64,
    /// CPU time of each process, in seconds (`RLIMIT_CPU`).
    pub cpu_secs: u64,
}

impl SandboxLimits {
    pub const DEFAULT_MAX_PROCESSES: u64 = 256;
    pub const DEFAULT_MEMORY_BYTES: u64 = 4 << 30;
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;
    pub const DEFAULT_CPU_SECS: u64 = 600;

    /// prlimit's options, up to and including `--`. No core files either: a crashing command
    /// writes none into the work directory, nor hands one to the host's core-dump handler.
    pub(crate) fn prlimit_args(&self) -> Vec<OsString> {
        [
            format!("--nproc={}", self.max_processes),
            format!("--as={}", self.memory_bytes),
            format!("--fsize={}", self.max_file_bytes),
            format!("--cpu={}", self.cpu_secs),
            "--core=0".to_owned(),
            "--".to_owned(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect()
    }

    /// For `skillstate tools`: the limits in a few words.
    pub fn describe(&self) -> String {
        format!(
            "at most {} processes, {} of address space and {} CPU s per process, files up to {}",
            self.max_processes,
            bytes(self.memory_bytes),
            self.cpu_secs,
            bytes(self.max_file_bytes)
        )
    }
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            max_processes: Self::DEFAULT_MAX_PROCESSES,
            memory_bytes: Self::DEFAULT_MEMORY_BYTES,
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            cpu_secs: Self::DEFAULT_CPU_SECS,
        }
    }
}

/// `4 GiB`, `512 MiB`, `1000 bytes`: exact, in the largest binary unit that divides it.
fn bytes(n: u64) -> String {
    for (unit, size) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_passed_to_prlimit_soft_and_hard() {
        let limits = SandboxLimits {
            max_processes: 64,
            memory_bytes: 256 << 20,
            max_file_bytes: 1000,
            cpu_secs: 30,
        };
        let args: Vec<String> = limits
            .prlimit_args()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        // `--name=N` sets the soft and the hard limit to N.
        assert_eq!(
            args,
            [
                "--nproc=64",
                "--as=268435456",
                "--fsize=1000",
                "--cpu=30",
                "--core=0",
                "--"
            ]
        );
        assert_eq!(
            limits.describe(),
            "at most 64 processes, 256 MiB of address space and 30 CPU s per process, files up to 1000 bytes"
        );
    }
}
