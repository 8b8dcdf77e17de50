//! The OS sandbox `shell.exec` runs its commands in: bubblewrap (`bwrap`).
//!
//! An external launcher, because the runtime is multi-threaded (a user namespace cannot be
//! unshared by a threaded process) and `unsafe` is forbidden. Inside the sandbox a command sees
//! the work directory read-write; an allow-list of system paths needed to run programs
//! read-only; a private /tmp; a fresh, read-only /proc of its own PID namespace (no other
//! process, so no other process's environment); a minimal /dev; no network unless the skill
//! allows it; no capabilities and no nested user namespaces.
//!
//! The command's shell is PID 1 of the namespace (`--as-pid-1`): when it exits, the kernel
//! kills everything left in the namespace, however it detached (`&`, `setsid`, `nohup`), and
//! bwrap only returns once the shell is reaped — which the kernel allows only after every
//! other process of the namespace is gone. (With bwrap's own init as PID 1, bwrap returned
//! as soon as the shell exited, while the rest was still being killed.) `--die-with-parent`
//! kills the shell, and so the namespace, when the runtime kills bwrap (timeout) or dies; the
//! command starts only once both of bwrap's parent-death signals are armed (`launcher.rs`).
//! It runs under the operator's resource limits (`rlimits.rs`), in a process group of its own
//! (a Ctrl-C meant for the runtime does not reach it).
//!
//! bwrap is started with an empty environment plus the skill's `env_allow` variables, which
//! is all the sandbox can read at /proc/1/environ.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

use super::ProtectedPaths;
use super::launcher::Launcher;
use super::rlimits::SandboxLimits;

/// `[tools] sandbox` in skillstate.toml: how `shell.exec` is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Every command runs under bubblewrap; `shell.exec` refuses to run when it is unusable.
    #[default]
    Bubblewrap,
    /// Commands run unconfined, with the runtime's user and file access (only the environment
    /// is cleared). Only the operator can choose this, knowingly.
    Off,
}

/// The operator's sandbox settings (skillstate.toml, never skill.toml).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// The `bwrap` binary; `None` looks for `bwrap` in the absolute directories of PATH, then
    /// in /usr/bin.
    pub bwrap: Option<PathBuf>,
    /// Extra absolute paths commands may read (bound read-only at the same place).
    pub read_paths: Vec<PathBuf>,
    /// The resource limits of every sandbox.
    pub limits: SandboxLimits,
    /// The directory of util-linux's `prlimit`; `None` looks on PATH, then in /usr/bin.
    pub util_linux: Option<PathBuf>,
    /// The runtime's own files: no read path may reach them, and none may lie in the system
    /// directories every sandbox sees.
    pub protected: ProtectedPaths,
}

/// Top-level system directories bound read-only (or recreated as the same symlink when they
/// are symlinks on the host, as with a merged /usr).
const SYSTEM_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// What running programs needs from /etc: the dynamic loader's cache and configuration,
/// Debian's alternatives (`awk`, `editor`, ...) and the time zone. Not passwd, not the rest.
const ETC_TO_RUN: [&str; 5] = [
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
];
/// What name resolution and TLS need, bound only when the skill allows the network (the CA
/// certificates, not /etc/ssl/private).
const ETC_FOR_NETWORK: [&str; 11] = [
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
];
/// Size of the private /tmp (a tmpfs: it takes memory).
pub const TMP_BYTES: u64 = 512 * 1024 * 1024;
/// Longest the start-up check of bwrap may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How `shell.exec` commands are confined; the first use checks that bubblewrap works here
/// and remembers the answer (clones share it).
#[derive(Debug, Clone)]
pub struct Sandbox {
    config: SandboxConfig,
    ready: Arc<OnceCell<Result<Ready, String>>>,
}

/// What the probe found working.
#[derive(Debug, Clone)]
struct Ready {
    bwrap: PathBuf,
    launcher: Launcher,
}

/// A command ready to spawn; stdio, environment and the rest are the caller's.
pub(crate) struct Launch {
    pub command: tokio::process::Command,
    /// `false` with `sandbox = "off"`: the caller must kill the process group itself.
    pub confined: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new(SandboxConfig::default())
    }
}

impl Sandbox {
    pub fn new(config: SandboxConfig) -> Self {
        Self {
            config,
            ready: Arc::new(OnceCell::new()),
        }
    }

    /// Bubblewrap at an explicit path.
    pub fn bubblewrap_at(bwrap: &Path) -> Self {
        Self::new(SandboxConfig {
            bwrap: Some(bwrap.to_path_buf()),
            ..SandboxConfig::default()
        })
    }

    /// No confinement (`sandbox = "off"`).
    pub fn off() -> Self {
        Self::new(SandboxConfig {
            mode: SandboxMode::Off,
            ..SandboxConfig::default()
        })
    }

    pub fn mode(&self) -> SandboxMode {
        self.config.mode
    }

    /// The bwrap binary once it is known to work here, or why commands must not run.
    pub async fn check(&self) -> Result<PathBuf, String> {
        self.ready().await.map(|ready| ready.bwrap)
    }

    async fn ready(&self) -> Result<Ready, String> {
        self.ready
            .get_or_init(|| async { probe(&self.config).await })
            .await
            .clone()
    }

    /// One line for `skillstate tools`: what confines commands in `work_dir`, or why nothing
    /// will run.
    pub async fn describe(&self, work_dir: &Path, network: bool) -> String {
        if self.config.mode == SandboxMode::Off {
            return "OFF (sandbox = \"off\" in skillstate.toml): commands run unconfined, with the runtime's user and files; only the environment is cleared".to_owned();
        }
        match self.check().await {
            Ok(bwrap) => format!(
                "bubblewrap ({}): writes only in {}, reads only it and the system paths{}, private /tmp and /proc, {}, network {}",
                bwrap.display(),
                work_dir.display(),
                if self.config.read_paths.is_empty() {
                    String::new()
                } else {
                    format!(
                        " plus {}",
                        self.config
                            .read_paths
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
                self.config.limits.describe(),
                if network { "on (skill.toml)" } else { "off" }
            ),
            Err(reason) => format!("UNAVAILABLE: {}", refusal(&reason)),
        }
    }

    /// `sh -c script` in `work_dir`, confined, or why it must not run.
    pub(crate) async fn launch(
        &self,
        work_dir: &Path,
        network: bool,
        script: &str,
    ) -> Result<Launch, String> {
        if self.config.mode == SandboxMode::Off {
            let mut command = tokio::process::Command::new("sh");
            command.arg("-c").arg(script).current_dir(work_dir);
            return Ok(Launch {
                command,
                confined: false,
            });
        }
        let ready = self.ready().await.map_err(|reason| refusal(&reason))?;
        if work_dir.parent().is_none() {
            return Err(format!(
                "shell.exec refuses to run with the work directory `{}`: the sandbox would let commands write the whole file system. Set [tools] work_dir in skill.toml or --work-dir to a project directory",
                work_dir.display()
            ));
        }
        let mut command = tokio::process::Command::new(&ready.bwrap);
        command
            .args(bwrap_args(Some(work_dir), network, &self.config.read_paths))
            .arg("--")
            .args(ready.launcher.inside(&self.config.limits, script));
        Ok(Launch {
            command,
            confined: true,
        })
    }
}

/// The refusal shown as the tool's error when the sandbox is unusable.
fn refusal(reason: &str) -> String {
    format!(
        "shell.exec refuses to run without its sandbox: {reason}. Install bubblewrap and util-linux (Debian/Ubuntu: `apt-get install bubblewrap util-linux`) on a kernel that allows unprivileged user namespaces, or set `sandbox = \"off\"` under [tools] in skillstate.toml to run commands unconfined, knowingly"
    )
}

/// bwrap's options, up to (not including) `--` and the command. `work_dir = None` (the
/// start-up check) binds no work directory and starts in /.
fn bwrap_args(work_dir: Option<&Path>, network: bool, read_paths: &[PathBuf]) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&std::ffi::OsStr]| args.extend(items.iter().map(|s| s.into()));
    // Every namespace (user, ipc, pid, net, uts, cgroup); a strict user namespace so that
    // nested ones can be disabled; no capabilities even when the runtime is root.
    push(&[
        "--unshare-user".as_ref(),
        "--unshare-all".as_ref(),
        "--disable-userns".as_ref(),
        "--cap-drop".as_ref(),
        "ALL".as_ref(),
        "--die-with-parent".as_ref(),
        "--as-pid-1".as_ref(),
        "--new-session".as_ref(),
        "--hostname".as_ref(),
        "sandbox".as_ref(),
    ]);
    if network {
        push(&["--share-net".as_ref()]);
    }
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    push(&["--symlink".as_ref(), target.as_os_str(), path.as_os_str()]);
                }
            }
            Ok(_) => push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()]),
            Err(_) => {}
        }
    }
    let etc: &[&str] = &ETC_TO_RUN;
    let net: &[&str] = if network { &ETC_FOR_NETWORK } else { &[] };
    for name in etc.iter().chain(net) {
        let path = Path::new("/etc").join(name);
        push(&["--ro-bind-try".as_ref(), path.as_os_str(), path.as_os_str()]);
    }
    for path in read_paths {
        push(&["--ro-bind".as_ref(), path.as_os_str(), path.as_os_str()]);
    }
    let size = TMP_BYTES.to_string();
    // /proc read-only as a whole: a runtime started as root runs commands as the host's uid 0
    // (without capabilities), which the kernel still lets write sysctls and other root-owned
    // /proc files; read-only closes all of them at once.
    push(&[
        "--proc".as_ref(),
        "/proc".as_ref(),
        "--remount-ro".as_ref(),
        "/proc".as_ref(),
        "--dev".as_ref(),
        "/dev".as_ref(),
        "--size".as_ref(),
        size.as_ref(),
        "--tmpfs".as_ref(),
        "/tmp".as_ref(),
    ]);
    let dir = work_dir.unwrap_or(Path::new("/"));
    if work_dir.is_some() {
        push(&["--bind".as_ref(), dir.as_os_str(), dir.as_os_str()]);
    }
    // The sandbox's own root (a tmpfs holding the mount points) read-only too.
    push(&[
        "--remount-ro".as_ref(),
        "/".as_ref(),
        "--chdir".as_ref(),
        dir.as_os_str(),
    ]);
    args
}

/// Refuses a sandbox that would show a command the runtime's own files: a read path that is,
/// contains or sits inside one, or one of them inside the system directories bound into every
/// sandbox.
fn reaches_no_protected_path(config: &SandboxConfig) -> Result<(), String> {
    for path in &config.read_paths {
        config
            .protected
            .check(path, "skillstate.toml [tools] sandbox_read_paths entry")?;
    }
    let system = SYSTEM_DIRS.iter().map(PathBuf::from).chain(
        ETC_TO_RUN
            .iter()
            .chain(&ETC_FOR_NETWORK)
            .map(|name| Path::new("/etc").join(name)),
    );
    for dir in system {
        config
            .protected
            .check(&dir, "the system path bound into every sandbox")?;
    }
    Ok(())
}

/// Finds bwrap and util-linux's tools and runs `exit 0` in a sandbox launched like the real
/// ones.
async fn probe(config: &SandboxConfig) -> Result<Ready, String> {
    reaches_no_protected_path(config)?;
    for path in &config.read_paths {
        if !path.is_absolute() {
            return Err(format!(
                "skillstate.toml [tools] sandbox_read_paths: `{}` is not an absolute path",
                path.display()
            ));
        }
        if !path.exists() {
            return Err(format!(
                "skillstate.toml [tools] sandbox_read_paths: `{}` does not exist",
                path.display()
            ));
        }
    }
    let bwrap = locate(config.bwrap.as_deref())?;
    let launcher = Launcher::locate(config.util_linux.as_deref())?;
    let seen_inside = SYSTEM_DIRS
        .iter()
        .map(Path::new)
        .chain(config.read_paths.iter().map(PathBuf::as_path))
        .any(|dir| launcher.prlimit().starts_with(dir));
    if !seen_inside {
        return Err(format!(
            "{} is outside the system paths a sandbox sees ({}); it runs inside the sandbox to set its limits: add its directory to sandbox_read_paths",
            launcher.prlimit().display(),
            SYSTEM_DIRS.join(", ")
        ));
    }
    let mut command = tokio::process::Command::new(&bwrap);
    command
        .args(bwrap_args(None, false, &config.read_paths))
        .arg("--")
        .args(launcher.inside(&config.limits, "exit 0"))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let run = async {
        let mut child = super::spawner::spawn(command).await?;
        if let Some(mut stdout) = child.stdout.take() {
            // Refused: the sandbox exits; its status and stderr say why.
            let _ = super::launcher::release(&mut child, &mut stdout).await;
        }
        child.wait_with_output().await
    };
    let output = match tokio::time::timeout(PROBE_TIMEOUT, run).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => return Err(format!("cannot start {}: {error}", bwrap.display())),
        Err(_) => {
            return Err(format!(
                "{} did not finish a test sandbox within {} s",
                bwrap.display(),
                PROBE_TIMEOUT.as_secs()
            ));
        }
    };
    if output.status.success() {
        return Ok(Ready { bwrap, launcher });
    }
    // bwrap's own words about a probe that runs `exit 0` with an empty environment: nothing of
    // a task, a command or a secret is in them, so they are cut as they are.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said: String = stderr.trim().chars().take(400).collect();
    Err(format!(
        "{} cannot create a sandbox here ({}: {said}); unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone or user.max_user_namespaces, or an AppArmor/SELinux policy), or bubblewrap is older than 0.8",
        bwrap.display(),
        output.status
    ))
}

fn locate(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = configured {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!(
                "bubblewrap is not at {} (skillstate.toml [tools] sandbox_bwrap)",
                path.display()
            ))
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .filter(|dir| dir.is_absolute())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("bwrap"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            "bubblewrap (`bwrap`) is not installed: not found on PATH nor in /usr/bin".to_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_work_dir_is_the_only_writable_bind_and_comes_after_the_read_only_ones() {
        let args = strings(&bwrap_args(
            Some(Path::new("/srv/project")),
            false,
            &[PathBuf::from("/opt/tools")],
        ));
        let binds: Vec<_> = args
            .windows(2)
            .filter(|w| w[0] == "--bind")
            .map(|w| w[1].clone())
            .collect();
        assert_eq!(binds, ["/srv/project"]);
        let position = |flag: &str, value: &str| {
            args.windows(2)
                .position(|w| w[0] == flag && w[1] == value)
                .unwrap_or_else(|| panic!("{flag} {value} missing in {args:?}"))
        };
        assert!(position("--ro-bind", "/opt/tools") < position("--bind", "/srv/project"));
        assert!(position("--tmpfs", "/tmp") < position("--bind", "/srv/project"));
        assert_eq!(position("--chdir", "/srv/project"), args.len() - 2);
        assert!(!args.iter().any(|a| a == "--share-net"));
        assert!(!args.iter().any(|a| a.contains("passwd") || a == "/etc"));
        assert!(!args.iter().any(|a| a.contains("resolv.conf")));
        assert!(position("--proc", "/proc") < position("--remount-ro", "/proc"));
    }

    #[test]
    fn network_adds_the_shared_network_and_name_resolution_files() {
        let args = strings(&bwrap_args(Some(Path::new("/srv/p")), true, &[]));
        assert!(args.iter().any(|a| a == "--share-net"));
        assert!(args.iter().any(|a| a == "/etc/resolv.conf"));
        assert!(args.iter().any(|a| a == "/etc/ssl/certs"));
        assert!(
            !args
                .iter()
                .any(|a| a == "/etc/ssl" || a.contains("private"))
        );
    }
}
