//! How a sandbox is started so that it can never outlive the runtime.
//!
//! bwrap's `--die-with-parent` arms a parent-death signal twice: in bwrap itself, after it
//! has forked the sandbox's first process, and in that process just before it runs the
//! command. A runtime killed before the first leaves an orphaned bwrap; a bwrap killed before
//! the second leaves an orphaned sandbox; either would run the command with no timeout.
//! (A parent-death signal armed before bwrap starts, with util-linux `setpriv`, reaches bwrap
//! but not the process it forks, and makes the second window wider: measured.) So the command
//! does not start until the runtime has seen both armed:
//!
//! ```text
//! bwrap … -- /bin/sh -c 'echo <ARMED>; read -r go && [ "$go" = go ] || exit 125; exec "$@"' \
//!     skillstate-sandbox prlimit <limits> -- /bin/sh -c <command>
//! ```
//!
//! The sandbox's first process, its signal armed, prints a token on standard output; the
//! runtime reads it, checks that bwrap — its own child, not yet reaped — is still alive (so
//! it was alive when the sandbox armed its signal, which therefore follows bwrap), and only
//! then writes `go` and closes the command's standard input. A runtime that dies before that
//! closes the pipe: the sandbox reads end of file and exits, taking its namespace with it.
//! bwrap arms its own signal relative to the thread that forked it, which is why every command
//! is spawned from the thread of `spawner.rs`, which never ends.
//!
//! `prlimit` runs inside the sandbox, as the command of its PID 1, so that the process limit
//! counts the sandbox's own user namespace (`rlimits.rs`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout};

use super::rlimits::SandboxLimits;

/// What the sandbox's first process prints once its parent-death signal is armed.
const ARMED: &str = "skillstate-sandbox-armed\n";

/// The sandbox's first process: tells the runtime it is armed, runs the command only on `go`.
const GUARD: &str =
    r#"echo skillstate-sandbox-armed; read -r go && [ "$go" = go ] || exit 125; exec "$@""#;

/// util-linux's `prlimit`, found once by the sandbox's probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launcher {
    prlimit: PathBuf,
}

impl Launcher {
    /// Finds `prlimit` in `dir` when given, else in the absolute directories of PATH, then in
    /// /usr/bin.
    pub(crate) fn locate(dir: Option<&Path>) -> Result<Self, String> {
        Ok(Self {
            prlimit: locate_tool("prlimit", dir)?,
        })
    }

    /// prlimit runs inside the sandbox: it must lie in a path the sandbox sees.
    pub(crate) fn prlimit(&self) -> &Path {
        &self.prlimit
    }

    /// What follows bwrap's `--`: the guard, prlimit with `limits`, then `sh -c script`.
    pub(crate) fn inside(&self, limits: &SandboxLimits, script: &str) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["/bin/sh", "-c", GUARD, "skillstate-sandbox"]
            .map(OsString::from)
            .into();
        args.push(self.prlimit.clone().into_os_string());
        args.extend(limits.prlimit_args());
        args.extend(["/bin/sh", "-c", script].map(OsString::from));
        args
    }
}

/// Lets a launched sandbox run its command once its first process is armed and bwrap is still
/// alive; otherwise closes its standard input, so that it exits without running anything.
/// Returns why the command was not let run (bwrap's own errors are on its stderr).
pub(crate) async fn release(child: &mut Child, stdout: &mut ChildStdout) -> Result<(), String> {
    let stdin = child.stdin.take();
    let mut token = [0u8; ARMED.len()];
    if stdout.read_exact(&mut token).await.is_err() || token != ARMED.as_bytes() {
        return Err("the sandbox did not start".into());
    }
    match child.try_wait() {
        Ok(None) => {}
        _ => return Err("bubblewrap ended while the sandbox started".into()),
    }
    let mut stdin = stdin.ok_or("the sandbox has no standard input")?;
    stdin
        .write_all(b"go\n")
        .await
        .map_err(|e| format!("cannot start the sandboxed command: {e}"))?;
    // Dropped: the command reads end of file on its standard input, as from /dev/null.
    Ok(())
}

fn locate_tool(name: &str, dir: Option<&Path>) -> Result<PathBuf, String> {
    let why = "it sets the sandbox's resource limits; Debian/Ubuntu: `apt-get install util-linux`";
    if let Some(dir) = dir {
        let path = dir.join(name);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "util-linux `{name}` is not at {} ({why})",
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
                "util-linux `{name}` is not installed: not found on PATH nor in /usr/bin ({why})"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_prlimit_is_named_with_its_purpose_and_package() {
        let empty = tempfile::tempdir().unwrap();
        let error = Launcher::locate(Some(empty.path())).unwrap_err();
        assert!(
            error.contains("`prlimit` is not at")
                && error.contains("resource limits")
                && error.contains("apt-get install util-linux"),
            "{error}"
        );
    }

    #[test]
    fn the_guard_announces_itself_then_waits_for_go_then_runs_prlimit_and_the_command() {
        let launcher = Launcher {
            prlimit: "/usr/bin/prlimit".into(),
        };
        let args: Vec<String> = launcher
            .inside(&SandboxLimits::default(), "echo hi")
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            &args[..5],
            [
                "/bin/sh",
                "-c",
                GUARD,
                "skillstate-sandbox",
                "/usr/bin/prlimit"
            ]
        );
        assert_eq!(&args[args.len() - 4..], ["--", "/bin/sh", "-c", "echo hi"]);
        assert!(GUARD.starts_with(&format!("echo {}", ARMED.trim_end())));
    }
}
