//! How bwrap is started so that the sandbox can never outlive the runtime.
//!
//! bwrap's `--die-with-parent` arms itself only once bwrap runs: a runtime killed between the
//! fork and that moment would leave a sandbox with no parent and no timeout. So the chain is
//!
//! ```text
//! setpriv --pdeathsig KILL -- /bin/sh -c '[ "$PPID" = "$1" ] || exit 125; shift; exec "$@"' \
//!     skillstate-sandbox <runtime pid> bwrap … -- prlimit <limits> -- /bin/sh -c <command>
//! ```
//!
//! util-linux `setpriv` sets the parent-death signal of the new process before anything else
//! and keeps it across `exec` (bwrap is not setuid: the probe refuses one, whose `exec` would
//! clear it). The host's `/bin/sh` then checks that its parent is still the runtime: if the
//! runtime died before the signal was armed, the process has been handed to another parent
//! and exits at once; if it dies after, the signal kills it. Either way nothing runs without
//! the runtime. The signal is sent when the *thread* that forked the process ends, which is
//! why every command is spawned from the thread of `spawner.rs`, which never ends.
//!
//! `prlimit` runs inside the sandbox, as the command of bwrap's PID 1, so that the process
//! limit counts the sandbox's own user namespace (`rlimits.rs`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The parent check, run by the host's `/bin/sh` between setpriv and bwrap.
const PARENT_CHECK: &str = r#"[ "$PPID" = "$1" ] || exit 125; shift; exec "$@""#;

/// util-linux's `setpriv` and `prlimit`, found once by the sandbox's probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launcher {
    setpriv: PathBuf,
    prlimit: PathBuf,
}

impl Launcher {
    /// Finds the tools in `dir` when given, else in the absolute directories of PATH, then in
    /// /usr/bin.
    pub(crate) fn locate(dir: Option<&Path>) -> Result<Self, String> {
        Ok(Self {
            setpriv: locate_tool("setpriv", dir)?,
            prlimit: locate_tool("prlimit", dir)?,
        })
    }

    /// prlimit runs inside the sandbox: it must lie in a path the sandbox sees.
    pub(crate) fn prlimit(&self) -> &Path {
        &self.prlimit
    }

    /// The chain's program and its arguments up to (not including) bwrap.
    pub(crate) fn command(&self, bwrap: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.setpriv);
        command
            .args(["--pdeathsig", "KILL", "--", "/bin/sh", "-c", PARENT_CHECK])
            .arg("skillstate-sandbox")
            .arg(std::process::id().to_string())
            .arg(bwrap);
        command
    }

    /// What follows bwrap's `--`: prlimit with `limits`, then `sh -c script`.
    pub(crate) fn inside(
        &self,
        limits: &super::rlimits::SandboxLimits,
        script: &str,
    ) -> Vec<OsString> {
        let mut args = vec![self.prlimit.clone().into_os_string()];
        args.extend(limits.prlimit_args());
        args.extend(["/bin/sh", "-c", script].map(OsString::from));
        args
    }
}

fn locate_tool(name: &str, dir: Option<&Path>) -> Result<PathBuf, String> {
    let install = "Debian/Ubuntu: `apt-get install util-linux`";
    let why = match name {
        "setpriv" => "it makes every sandbox die with the runtime",
        _ => "it sets the sandbox's resource limits",
    };
    if let Some(dir) = dir {
        let path = dir.join(name);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "util-linux `{name}` is not at {} ({why}; {install})",
                path.display()
            ))
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .filter(|dir| dir.is_absolute())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!(
                "util-linux `{name}` is not installed: not found on PATH nor in /usr/bin ({why}; {install})"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_is_named_with_its_purpose_and_package() {
        let empty = tempfile::tempdir().unwrap();
        let error = Launcher::locate(Some(empty.path())).unwrap_err();
        assert!(
            error.contains("`setpriv` is not at")
                && error.contains("die with the runtime")
                && error.contains("apt-get install util-linux"),
            "{error}"
        );
        std::fs::write(empty.path().join("setpriv"), "").unwrap();
        let error = Launcher::locate(Some(empty.path())).unwrap_err();
        assert!(
            error.contains("`prlimit` is not at") && error.contains("resource limits"),
            "{error}"
        );
    }

    #[test]
    fn the_chain_arms_the_signal_then_checks_the_parent_then_runs_bwrap() {
        let launcher = Launcher {
            setpriv: "/usr/bin/setpriv".into(),
            prlimit: "/usr/bin/prlimit".into(),
        };
        let command = launcher.command(Path::new("/usr/bin/bwrap"));
        let std = command.as_std();
        assert_eq!(std.get_program(), "/usr/bin/setpriv");
        let args: Vec<String> = std
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pid = std::process::id().to_string();
        assert_eq!(
            args,
            [
                "--pdeathsig",
                "KILL",
                "--",
                "/bin/sh",
                "-c",
                PARENT_CHECK,
                "skillstate-sandbox",
                &pid,
                "/usr/bin/bwrap"
            ]
        );
    }
}
