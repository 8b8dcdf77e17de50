//! `shell.exec` inside its bubblewrap sandbox, attacked with real commands: reading the
//! runtime's secrets, reading and writing outside the work directory, the network, processes
//! that detach to outlive the call or the runtime, and a machine without the mechanism.
//!
//! Some tests need a process whose environment holds a secret, or that is killed with SIGKILL
//! mid-command: they run this test binary again as a child (`child_process_entry`).
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/processes.rs"]
mod processes;

use processes::survivors;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use skillstate_core::secrets::Redactor;
use skillstate_tools::builtin::{
    ProtectedPaths, Sandbox, SandboxConfig, SandboxLimits, ShellSettings, ShellTool, WorkDir,
};
use skillstate_tools::{CallContext, Tool, ToolError, ToolOutput};

const CHILD_MODE: &str = "SKILLSTATE_SANDBOX_TEST_CHILD";
const CHILD_WORK: &str = "SKILLSTATE_SANDBOX_TEST_WORK";
const CHILD_MARKER: &str = "SKILLSTATE_SANDBOX_TEST_MARKER";
/// The process limit of the fork bomb's sandbox.
const BOMB_LIMIT: u64 = 32;
/// Longest a test waits for killed processes to disappear (a bound, not a measurement).
const GONE_WITHIN: Duration = Duration::from_secs(20);

struct Fixture {
    tmp: tempfile::TempDir,
    work: PathBuf,
    outside: PathBuf,
}

/// work/ (the work dir, with a symlink to outside/ and one to its secret) and outside/ beside it.
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(work.join("notes.txt"), "flag{inside}\n").unwrap();
    std::fs::write(outside.join("secret.txt"), "flag{outside}\n").unwrap();
    symlink(&outside, work.join("out_dir")).unwrap();
    symlink(outside.join("secret.txt"), work.join("out_file")).unwrap();
    Fixture { tmp, work, outside }
}

fn settings(timeout_secs: u64, network: bool) -> ShellSettings {
    ShellSettings {
        timeout_secs,
        network,
        ..ShellSettings::default()
    }
}

fn sandboxed(work: &Path, settings: ShellSettings) -> ShellTool {
    ShellTool::with_sandbox(
        &WorkDir::new(work, &ProtectedPaths::nothing()).unwrap(),
        settings,
        Sandbox::default(),
    )
}

async fn try_run(tool: &ShellTool, command: &str) -> Result<ToolOutput, ToolError> {
    tool.call(&json!({ "command": command }), &CallContext::new("t", 1))
        .await
}

async fn run(tool: &ShellTool, command: &str) -> ToolOutput {
    try_run(tool, command).await.unwrap()
}

/// A `sleep` argument no other test or process uses: the marker of the processes a test starts.
fn marker() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "9{}{:03}.25",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Survivors once they had `GONE_WITHIN` to die (killed processes die asynchronously).
fn survivors_after_a_while(marker: &str) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left = survivors(marker);
        if left.is_empty() || start.elapsed() > GONE_WITHIN {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills what a failed test left running (its sleepers would otherwise run for centuries).
fn kill_survivors(marker: &str) {
    for survivor in survivors(marker) {
        if let Some(pid) = survivor.split(':').next() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
}

fn limited(work: &Path, settings: ShellSettings, limits: SandboxLimits) -> ShellTool {
    ShellTool::with_sandbox(
        &WorkDir::new(work, &ProtectedPaths::nothing()).unwrap(),
        settings,
        Sandbox::new(SandboxConfig {
            limits,
            ..SandboxConfig::default()
        }),
    )
}

/// Runs this test binary again as a child in `mode`; returns the child process.
fn spawn_child(mode: &str, work: &Path, marker: &str, secret: Option<&str>) -> std::process::Child {
    child_command(
        Command::new(std::env::current_exe().unwrap()),
        mode,
        work,
        marker,
        secret,
    )
    .spawn()
    .unwrap()
}

/// `command` (this test binary, or a launcher of it) set up to run the child in `mode`.
fn child_command(
    mut command: Command,
    mode: &str,
    work: &Path,
    marker: &str,
    secret: Option<&str>,
) -> Command {
    command
        .args(["child_process_entry", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_MODE, mode)
        .env(CHILD_WORK, work)
        .env(CHILD_MARKER, marker)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(secret) = secret {
        command
            .env("OPENAI_API_KEY", secret)
            .env("SKILLSTATE_TEST_SECRET", secret)
            .env("SKILLSTATE_TEST_PLAIN", "plain-value-4711");
    }
    command
}

/// The child side: `secrets` prints what hostile commands can see; `sigkill` starts detached
/// sleepers and blocks until the parent kills this process.
#[tokio::test]
#[ignore = "runs only as the child of another test of this file"]
async fn child_process_entry() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let work = PathBuf::from(std::env::var(CHILD_WORK).unwrap());
    let marker = std::env::var(CHILD_MARKER).unwrap();
    match mode.as_str() {
        "secrets" => {
            let shell = sandboxed(&work, settings(20, false));
            let me = std::process::id();
            for command in [
                "cat /proc/$PPID/environ".to_owned(),
                "cat /proc/1/environ; echo; cat /proc/*/environ".to_owned(),
                "env; cat /proc/self/environ".to_owned(),
                format!("cat /proc/{me}/environ; ls /proc/{me}"),
                "for p in /proc/[0-9]*; do echo \"$p\"; tr '\\0' '\\n' < \"$p/environ\"; tr '\\0' ' ' < \"$p/cmdline\"; done".to_owned(),
                "ls /proc; cat /proc/$PPID/cmdline".to_owned(),
            ] {
                let out = run(&shell, &command).await;
                println!("=== {command}\n{}", out.text);
            }
            // A hostile skill lists the key variables in env_allow: their values are withheld.
            let secret = std::env::var("OPENAI_API_KEY").unwrap();
            let hostile = ShellTool::with_sandbox(
                &WorkDir::new(&work, &ProtectedPaths::nothing()).unwrap(),
                ShellSettings {
                    env_allow: vec![
                        "PATH".into(),
                        "OPENAI_API_KEY".into(),
                        "SKILLSTATE_TEST_SECRET".into(),
                        "SKILLSTATE_TEST_PLAIN".into(),
                    ],
                    ..settings(20, false)
                },
                Sandbox::default(),
            )
            .withholding(Redactor::new([secret]));
            println!("=== withheld {:?}", hostile.withheld_variables());
            let out = run(&hostile, "env; cat /proc/1/environ").await;
            println!("=== env_allow\n{}", out.text);
        }
        "start" => {
            // The sandbox is probed first, so that the kill lands around the start of bwrap.
            let shell = sandboxed(&work, settings(600, false));
            let warm = run(&shell, "true").await;
            assert!(warm.ok, "{}", warm.text);
            println!("ready");
            let out = run(&shell, &format!("sleep {marker}")).await;
            panic!("the parent should have killed this process: {}", out.text);
        }
        "forkbomb" => {
            let limits = SandboxLimits {
                max_processes: BOMB_LIMIT,
                ..SandboxLimits::default()
            };
            let shell = limited(&work, settings(4, false), limits);
            // The shell, PID 1, stays: its exit would end the namespace, bomb and all.
            let bomb = format!("bash -c ':(){{ :|:& }};:' {marker}; sleep 60");
            let out = run(&shell, &bomb).await;
            println!("=== bomb\n{}", out.text);
            let after = run(&shell, "echo still-usable").await;
            println!("=== after\n{}", after.text);
        }
        "sigkill" => {
            let shell = sandboxed(&work, settings(600, false));
            let command = format!(
                "sleep {marker} & setsid sleep {marker} & nohup sleep {marker} & (sleep {marker} &); touch started; sleep {marker}"
            );
            let out = run(&shell, &command).await;
            panic!("the parent should have killed this process: {}", out.text);
        }
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn secrets_in_the_runtime_environment_are_unreachable_from_commands() {
    let f = fixture();
    let secret = format!("sk-sandbox-test-{}-c0ffee", std::process::id());
    let child = spawn_child("secrets", &f.work, &marker(), Some(&secret));
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // The commands did run and saw the allowed environment.
    assert_eq!(stdout.matches("=== ").count(), 8, "{stdout}");
    assert!(stdout.contains("PATH="), "{stdout}");
    assert!(
        stdout.contains(r#"=== withheld ["OPENAI_API_KEY", "SKILLSTATE_TEST_SECRET"]"#),
        "{stdout}"
    );
    assert!(
        stdout.contains("SKILLSTATE_TEST_PLAIN=plain-value-4711"),
        "variables that hold no secret still pass: {stdout}"
    );
    assert!(
        !stdout.contains(&secret) && !stderr.contains(&secret),
        "the secret leaked:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("SKILLSTATE_TEST_SECRET="), "{stdout}");
}

#[tokio::test]
async fn reads_outside_the_work_dir_and_system_paths_fail() {
    let f = fixture();
    let shell = sandboxed(&f.work, settings(20, false));
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let outside = f.outside.display();
    for (command, must_not_show) in [
        ("cat /etc/passwd".to_owned(), "root:"),
        (
            "cat /etc/shadow /etc/hostname /etc/os-release".to_owned(),
            "ID=",
        ),
        ("cat ../outside/secret.txt".to_owned(), "flag{outside}"),
        (format!("cat {outside}/secret.txt"), "flag{outside}"),
        ("cat out_file".to_owned(), "flag{outside}"),
        ("cat out_dir/secret.txt".to_owned(), "flag{outside}"),
        (format!("ls -a {home}"), ".."),
        ("ls -a /root /home /var /srv /opt".to_owned(), ".."),
    ] {
        let out = run(&shell, &command).await;
        assert!(!out.ok, "{command}: {}", out.text);
        assert!(!out.text.contains(must_not_show), "{command}: {}", out.text);
    }
    // What programs need is there.
    let tools = run(
        &shell,
        "ls /usr/bin/sh && awk 'BEGIN { print 6 * 7 }' && cat notes.txt",
    )
    .await;
    assert!(
        tools.ok && tools.text.contains("42\n") && tools.text.contains("flag{inside}"),
        "{}",
        tools.text
    );
}

#[tokio::test]
async fn writes_outside_the_work_dir_never_reach_the_host() {
    let f = fixture();
    let shell = sandboxed(&f.work, settings(20, false));
    let unique = marker();
    let host_tmp = PathBuf::from(format!("/tmp/skillstate-escape-{unique}"));
    let usr = PathBuf::from(format!("/usr/skillstate-escape-{unique}"));
    let sibling = f.tmp.path().join("sibling");
    let outside = f.outside.display();
    for command in [
        format!("echo x > {}", host_tmp.display()),
        format!("echo x > {}", usr.display()),
        "mkdir -p ../sibling && echo x > ../sibling/planted".to_owned(),
        format!("echo x > {outside}/planted"),
        "echo x > out_dir/planted".to_owned(),
        "echo x > /planted".to_owned(),
    ] {
        let out = run(&shell, &command).await;
        eprintln!("{command}: {}", out.text);
    }
    assert!(!host_tmp.exists(), "{}", host_tmp.display());
    assert!(!usr.exists(), "{}", usr.display());
    assert!(!sibling.exists());
    assert!(!f.outside.join("planted").exists());
    assert!(!Path::new("/planted").exists());
    // Read-only, also for a runtime started as root (whose commands are the host's uid 0):
    // system files, a sysctl (rewritten with its own value: harmless should it ever pass), and
    // the rest of /proc.
    for command in [
        format!("echo x > {}", usr.display()),
        "cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness".to_owned(),
        "cat /proc/sys/kernel/printk_ratelimit > /proc/sys/kernel/printk_ratelimit".to_owned(),
        "echo renamed > /proc/self/comm".to_owned(),
    ] {
        let out = run(&shell, &command).await;
        assert!(
            !out.ok && out.text.contains("Read-only file system"),
            "{command}: {}",
            out.text
        );
    }
}

#[tokio::test]
async fn writes_inside_the_work_dir_work() {
    let f = fixture();
    let shell = sandboxed(&f.work, settings(20, false));
    let out = run(
        &shell,
        "echo made > made.txt && mkdir -p sub/deeper && echo deep > sub/deeper/f.txt && cat made.txt",
    )
    .await;
    assert!(out.ok, "{}", out.text);
    assert_eq!(
        std::fs::read_to_string(f.work.join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.work.join("sub/deeper/f.txt")).unwrap(),
        "deep\n"
    );
}

#[tokio::test]
async fn the_network_is_off_unless_the_skill_allows_it() {
    let f = fixture();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' && echo connected");

    let off = run(&sandboxed(&f.work, settings(20, false)), &connect).await;
    assert!(!off.ok && !off.text.contains("connected\n"), "{}", off.text);
    assert!(
        listener.accept().is_err(),
        "a sandboxed command reached the host's listener"
    );

    let on = run(&sandboxed(&f.work, settings(20, true)), &connect).await;
    assert!(on.ok && on.text.contains("connected\n"), "{}", on.text);
    assert!(
        listener.accept().is_ok(),
        "with network = true the command reaches the listener"
    );
}

#[tokio::test]
async fn detached_processes_neither_hold_the_call_nor_survive_it() {
    let f = fixture();
    let shell = sandboxed(&f.work, settings(60, false));
    for detach in [
        "sleep {m} &",
        "setsid sleep {m} &",
        "nohup sleep {m} &",
        "(sleep {m} &)",
        "sleep {m} </dev/null >/dev/null 2>&1 &",
        "setsid sh -c 'sleep {m}' >/dev/null 2>&1 &",
    ]
    .iter()
    .cycle()
    .take(6 * 8)
    {
        // Each form several times: a teardown that lags behind the call's return shows up.
        let m = marker();
        let command = format!("{}\necho started", detach.replace("{m}", &m));
        let out = run(&shell, &command).await;
        assert!(
            out.ok && out.text.starts_with("exit code 0\n--- stdout ---\nstarted"),
            "{command}: {}",
            out.text
        );
        // Everything in the PID namespace is gone by the time the call returns.
        assert_eq!(survivors(&m), Vec::<String>::new(), "{command}");
    }
}

#[tokio::test]
async fn a_command_past_its_timeout_is_killed_with_all_its_descendants() {
    let f = fixture();
    let shell = sandboxed(&f.work, settings(1, false));
    let m = marker();
    let out = run(
        &shell,
        &format!("sleep {m} & setsid sleep {m} & nohup sleep {m} & echo before; sleep {m}"),
    )
    .await;
    assert!(
        !out.ok
            && out
                .text
                .starts_with("timed out after 1 s and was killed, with every process it started"),
        "{}",
        out.text
    );
    assert!(
        out.text.contains("before"),
        "output read before the kill is kept: {}",
        out.text
    );
    assert_eq!(survivors_after_a_while(&m), Vec::<String>::new());
}

#[test]
fn a_sigkilled_runtime_leaves_no_process_behind() {
    let f = fixture();
    let m = marker();
    let mut child = spawn_child("sigkill", &f.work, &m, None);
    let started = f.work.join("started");
    let start = Instant::now();
    while !started.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child ended early: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        survivors(&m).len() >= 4,
        "the sleepers run before the kill: {:?}",
        survivors(&m)
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(survivors_after_a_while(&m), Vec::<String>::new());
}

#[tokio::test]
async fn without_bubblewrap_the_tool_refuses_with_a_clear_message() {
    let f = fixture();
    let missing = ShellTool::with_sandbox(
        &WorkDir::new(&f.work, &ProtectedPaths::nothing()).unwrap(),
        settings(20, false),
        Sandbox::bubblewrap_at(Path::new("/nonexistent/bwrap")),
    );
    let Err(ToolError::Failed { message, .. }) = try_run(&missing, "touch ran.txt").await else {
        panic!("the tool ran without its sandbox");
    };
    for needed in [
        "refuses to run without its sandbox",
        "/nonexistent/bwrap",
        "apt-get install bubblewrap",
        "sandbox = \"off\"",
        "skillstate.toml",
    ] {
        assert!(message.contains(needed), "{needed}: {message}");
    }
    assert!(!f.work.join("ran.txt").exists());

    // A bwrap that cannot create namespaces (as on a kernel without user namespaces).
    let broken = f.tmp.path().join("bwrap");
    symlink("/usr/bin/false", &broken).unwrap();
    let unusable = ShellTool::with_sandbox(
        &WorkDir::new(&f.work, &ProtectedPaths::nothing()).unwrap(),
        settings(20, false),
        Sandbox::bubblewrap_at(&broken),
    );
    let Err(ToolError::Failed { message, .. }) = try_run(&unusable, "touch ran.txt").await else {
        panic!("the tool ran with a broken sandbox");
    };
    assert!(
        message.contains("cannot create a sandbox") && message.contains("user namespaces"),
        "{message}"
    );
    assert!(!f.work.join("ran.txt").exists());
}

#[tokio::test]
async fn sandbox_off_runs_unconfined_with_a_cleared_environment() {
    let f = fixture();
    let shell = ShellTool::with_sandbox(
        &WorkDir::new(&f.work, &ProtectedPaths::nothing()).unwrap(),
        settings(20, false),
        Sandbox::off(),
    );
    let passwd = run(&shell, "cat /etc/passwd").await;
    assert!(
        passwd.ok && passwd.text.contains("root:"),
        "{}",
        passwd.text
    );
    let outside = run(&shell, "cat ../outside/secret.txt").await;
    assert!(outside.text.contains("flag{outside}"), "{}", outside.text);
    let env = run(&shell, "env").await;
    assert!(
        env.text.contains("PATH=") && !env.text.contains("HOME="),
        "{}",
        env.text
    );
    // Background jobs in its process group are killed when the shell exits.
    let m = marker();
    let out = run(&shell, &format!("sleep {m} & echo started")).await;
    assert!(out.ok && out.text.contains("started"), "{}", out.text);
    assert_eq!(survivors_after_a_while(&m), Vec::<String>::new());
}

/// SIGKILL at many moments around the start of bwrap — before its `--die-with-parent` is
/// armed, while it sets up the namespaces, once the command runs: nothing of the sandbox
/// survives any of them (the launch chain's parent-death signal and parent check).
#[test]
fn a_runtime_killed_while_its_sandbox_starts_leaves_no_process_behind() {
    use std::io::BufRead;
    let f = fixture();
    let mut running_at_kill = 0;
    for attempt in 0..20u64 {
        let m = marker();
        let mut child = spawn_child("start", &f.work, &m, None);
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.any(|line| line.is_ok_and(|l| l == "ready"));
        assert!(ready, "the child never got ready: {:?}", child.wait());
        std::thread::sleep(Duration::from_micros(attempt * 750));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        running_at_kill += usize::from(!survivors(&m).is_empty());
        let left = survivors_after_a_while(&m);
        kill_survivors(&m);
        assert_eq!(
            left,
            Vec::<String>::new(),
            "kill {attempt} (after {} µs)",
            attempt * 750
        );
    }
    eprintln!("{running_at_kill} of 20 kills found part of the sandbox started");
}

/// Unconfined (`sandbox = "off"`), a timeout still kills the command's whole process group,
/// background jobs included.
#[tokio::test]
async fn sandbox_off_a_timeout_kills_the_whole_process_group() {
    let f = fixture();
    let shell = ShellTool::with_sandbox(
        &WorkDir::new(&f.work, &ProtectedPaths::nothing()).unwrap(),
        settings(1, false),
        Sandbox::off(),
    );
    let m = marker();
    let _cleanup = kill_survivors_later(&m);
    let out = run(
        &shell,
        &format!("sleep {m} & sleep {m} & echo before; sleep {m}"),
    )
    .await;
    assert!(
        !out.ok && out.text.starts_with("timed out after 1 s and was killed"),
        "{}",
        out.text
    );
    assert!(out.text.contains("before"), "{}", out.text);
    assert_eq!(survivors_after_a_while(&m), Vec::<String>::new());
}

/// Kills leftovers of its marker when the test ends, whether it passed or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_survivors(&self.0);
    }
}

fn kill_survivors_later(marker: &str) -> Cleanup {
    Cleanup(marker.to_owned())
}

/// A fork bomb in a sandbox of 32 processes: its forks fail, the number of its processes never
/// passes the limit while the host goes on starting processes, the timeout ends it, and the
/// next command runs. The kernel does not enforce the process limit for uid 0, so a test run
/// as root runs the runtime (a child of this test) as `nobody`.
#[test]
fn a_fork_bomb_stays_under_the_process_limit() {
    let f = fixture();
    for dir in [f.tmp.path(), f.work.as_path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let m = marker();
    let _cleanup = kill_survivors_later(&m);
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let launcher = if root {
        let mut setpriv = Command::new("setpriv");
        setpriv
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(std::env::current_exe().unwrap());
        setpriv
    } else {
        Command::new(std::env::current_exe().unwrap())
    };
    let mut child = child_command(launcher, "forkbomb", &f.work, &m, None)
        .spawn()
        .unwrap();
    let mut most = 0;
    let mut host_spawns = 0;
    while child.try_wait().unwrap().is_none() {
        most = most.max(survivors(&m).len());
        // The host still starts processes while the bomb runs.
        if Command::new("true").status().unwrap().success() {
            host_spawns += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("timed out after 4 s and was killed, with every process it started"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Resource temporarily unavailable"),
        "the bomb's forks failed: {stdout}"
    );
    assert!(
        stdout.contains("=== after\nexit code 0\n--- stdout ---\nstill-usable"),
        "{stdout}"
    );
    // The limit counts the sandbox's processes; bwrap's outer process is the host's.
    let limit = BOMB_LIMIT as usize + 1;
    assert!(
        most <= limit,
        "{most} processes of the bomb at once, over the limit {limit}"
    );
    assert!(
        most >= limit / 2,
        "the bomb ran: at most {most} processes seen"
    );
    assert!(host_spawns > 0);
    assert_eq!(survivors_after_a_while(&m), Vec::<String>::new());
    eprintln!(
        "fork bomb: at most {most} processes (limit {BOMB_LIMIT}), {host_spawns} host processes started meanwhile"
    );
}

/// The per-process limits: a memory hog fails at its address-space limit (and succeeds under a
/// larger one), a file stops growing at the file-size limit, a busy loop is killed at its CPU
/// limit; no core file is written.
#[tokio::test]
async fn memory_file_size_and_cpu_are_bounded() {
    let f = fixture();
    let hog = "awk 'BEGIN { s = sprintf(\"%200000000s\", \"\"); print \"built\", length(s) }'; echo \"hog: $?\"";
    let small = SandboxLimits {
        memory_bytes: 128 << 20,
        max_file_bytes: 1 << 20,
        cpu_secs: 1,
        ..SandboxLimits::default()
    };
    let shell = limited(&f.work, settings(60, false), small);
    let out = run(&shell, hog).await;
    assert!(
        !out.text.contains("built 200000000") && !out.text.contains("hog: 0"),
        "{}",
        out.text
    );
    let roomy = SandboxLimits {
        memory_bytes: 1 << 30,
        ..SandboxLimits::default()
    };
    let out = run(&limited(&f.work, settings(60, false), roomy), hog).await;
    assert!(out.text.contains("built 200000000"), "{}", out.text);

    let out = run(
        &shell,
        "head -c 3000000 /dev/zero > big; echo \"head: $?\"; wc -c < big",
    )
    .await;
    assert!(out.text.contains("head: 153"), "SIGXFSZ: {}", out.text);
    assert_eq!(
        std::fs::metadata(f.work.join("big")).unwrap().len(),
        1 << 20
    );

    let out = run(&shell, "sh -c 'while :; do :; done'; echo \"loop: $?\"").await;
    assert!(
        out.ok && (out.text.contains("loop: 137") || out.text.contains("loop: 152")),
        "SIGKILL or SIGXCPU: {}",
        out.text
    );
    assert!(!f.work.join("core").exists());
}
