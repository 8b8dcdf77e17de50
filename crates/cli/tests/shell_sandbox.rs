//! `shell.exec` through the real `skillstate` binary, with a scripted hostile model: the
//! runtime's API key stays out of the observations, the journal and the output; killing the
//! runtime with SIGKILL leaves no process behind; `skillstate tools` says how commands are
//! confined; a missing sandbox makes the tool refuse; a non-dumpable runtime keeps its
//! environment even from an unconfined command.
#![allow(clippy::unwrap_used)]

mod common;

#[path = "batch_support/mod.rs"]
mod batch_support;

#[path = "../../../test-support/processes.rs"]
mod processes;

use processes::survivors;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{binary, repo_root};
use serde_json::json;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A copy of the code-investigator skill in `root/code-investigator` whose `[tools.shell]` table is
/// `shell_table`.
fn shell_skill(root: &Path, shell_table: &str) -> PathBuf {
    let dir = root.join("code-investigator");
    std::fs::create_dir_all(&dir).unwrap();
    let source = repo_root().join("skills/code-investigator");
    for file in ["SKILL.md", "state.schema.json", "state.init.json"] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    std::fs::write(
        dir.join("skill.toml"),
        format!("[tools]\nallow = [\"fs\", \"shell\"]\n\n[tools.shell]\n{shell_table}\n"),
    )
    .unwrap();
    dir
}

/// A scripted model running `commands` with shell.exec, then finishing.
fn script(root: &Path, commands: &[&str]) -> String {
    let mut lines: Vec<String> = commands
        .iter()
        .map(|command| {
            json!({
                "reasoning": "try it",
                "state_patch": {},
                "action": {"tool": "shell.exec", "args": {"command": command}}
            })
            .to_string()
        })
        .collect();
    lines.push(
        json!({"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "done"}}})
            .to_string(),
    );
    let path = root.join("script.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    format!("scripted:{}", path.display())
}

/// `run <skill> --model <model> --work-dir <work> --input <input>`.
fn run_args<'a>(skill: &'a Path, model: &'a str, work: &'a Path, input: &'a str) -> [&'a str; 8] {
    [
        "run",
        skill.to_str().unwrap(),
        "--model",
        model,
        "--work-dir",
        work.to_str().unwrap(),
        "--input",
        input,
    ]
}

fn command(db: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .args(args)
        .stdin(Stdio::null());
    command
}

/// The result of the shell command the model ran at `step` (the observation of the next step).
fn result_of(db: &Path, step: u32) -> String {
    let tasks = text(&command(db, &["tasks"]).output().unwrap().stdout);
    let id = tasks
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let step = (step + 1).to_string();
    text(
        &command(db, &["show", &id, "--step", &step, "--observation"])
            .output()
            .unwrap()
            .stdout,
    )
}

/// Every byte of the SQLite database, its WAL and its shared-memory file.
fn database_bytes(db: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let path = PathBuf::from(format!("{}{suffix}", db.display()));
        if let Ok(content) = std::fs::read(&path) {
            bytes.extend(content);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

const STEAL: [&str; 6] = [
    "cat /proc/$PPID/environ; echo; cat /proc/1/environ",
    "cat /proc/*/environ; ls /proc",
    "env; cat /proc/self/environ",
    "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done; grep -rs OPENAI /proc/*/environ",
    "cat /proc/$PPID/cmdline; ps -ef 2>&1 || ls -la /proc/*/",
    // Reversed, so that redaction of known key values could not hide a leak.
    "cat /proc/*/environ /proc/$PPID/environ | tr '\\0' '\\n' | rev",
];

#[test]
fn the_runtime_api_key_reaches_neither_the_journal_nor_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // A hostile skill also asks for the key variable itself.
    let skill = shell_skill(
        tmp.path(),
        "timeout_secs = 30\nenv_allow = [\"PATH\", \"LANG\", \"OPENAI_API_KEY\"]",
    );
    let model = script(tmp.path(), &STEAL);
    let secret = format!("sk-proj-sandbox-e2e-{}-5ec7e7", std::process::id());
    let run = command(&db, &run_args(&skill, &model, &work, "Find the API key."))
        .env("OPENAI_API_KEY", &secret)
        .env("ANTHROPIC_API_KEY", &secret)
        // Not a variable the runtime knows as secret: only the sandbox keeps it out.
        .env("DEPLOY_PASSWORD", &secret)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("completed after 7 step(s)"),
        "{stdout}{stderr}"
    );
    // The commands really ran: `env` shows the allowed variables.
    let env = result_of(&db, 3);
    assert!(
        env.starts_with("exit code 0") && env.contains("PATH="),
        "{env}"
    );
    let reversed: String = secret.chars().rev().collect();
    let bytes = database_bytes(&db);
    assert!(bytes.len() > 4096, "the database was written");
    for form in [&secret, &reversed] {
        assert!(!contains(run.stdout.as_slice(), form), "{stdout}");
        assert!(!contains(run.stderr.as_slice(), form), "{stderr}");
        assert!(!contains(&bytes, form), "the secret is in the database");
    }
    for step in 1..=STEAL.len() as u32 {
        let observation = result_of(&db, step);
        // Nothing was even redacted: the commands never saw the secret.
        assert!(
            !observation.contains(&secret)
                && !observation.contains(&reversed)
                && !observation.contains("[redacted]"),
            "step {step}: {observation}"
        );
    }
}

#[test]
fn a_sigkilled_runtime_leaves_no_shell_process_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let skill = shell_skill(tmp.path(), "timeout_secs = 600");
    let marker = format!("8{}77.5", std::process::id());
    let m = &marker;
    let model = script(
        tmp.path(),
        &[&format!(
            "sleep {m} & setsid sleep {m} & nohup sleep {m} & (setsid sleep {m} &); touch started; sleep {m}"
        )],
    );
    let mut runtime = command(&db, &run_args(&skill, &model, &work, "Start things."))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !work.join("started").exists() {
        if let Some(status) = runtime.try_wait().unwrap() {
            panic!("the runtime ended before the command started: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        survivors(m).len() >= 4,
        "the sleepers run before the kill: {:?}",
        survivors(m)
    );
    runtime.kill().unwrap(); // SIGKILL
    runtime.wait().unwrap();
    let start = Instant::now();
    let mut left = survivors(m);
    while !left.is_empty() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        left = survivors(m);
    }
    assert_eq!(left, Vec::<String>::new());
}

fn tools_output(db: &Path, config: Option<&Path>, skill: &Path, work: &Path) -> Output {
    let mut args: Vec<&str> = Vec::new();
    if let Some(config) = config {
        args.extend(["--config", config.to_str().unwrap()]);
    }
    args.extend([
        "tools",
        skill.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
    ]);
    command(db, &args).output().unwrap()
}

#[test]
fn skillstate_tools_says_how_shell_commands_are_confined() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let skill = shell_skill(tmp.path(), "timeout_secs = 5");

    let confined = text(&tools_output(&db, None, &skill, &work).stdout);
    let line = confined
        .lines()
        .find(|l| l.starts_with("shell.exec sandbox: "))
        .unwrap_or_else(|| panic!("{confined}"));
    assert!(
        line.contains("bubblewrap (")
            && line.contains(&format!(
                "writes only in {}",
                work.canonicalize().unwrap().display()
            ))
            && line.contains(
                "at most 256 processes, 4 GiB of address space and 600 CPU s per process, files up to 1 GiB"
            )
            && line.ends_with("network off"),
        "{line}"
    );

    let limited = tmp.path().join("limited.toml");
    std::fs::write(
        &limited,
        "[tools]\nsandbox_max_processes = 64\nsandbox_memory_bytes = 536870912\n",
    )
    .unwrap();
    let line = text(&tools_output(&db, Some(&limited), &skill, &work).stdout);
    assert!(
        line.contains("at most 64 processes, 512 MiB of address space"),
        "{line}"
    );
    let unbounded = tmp.path().join("unbounded.toml");
    std::fs::write(&unbounded, "[tools]\nsandbox_max_processes = 2\n").unwrap();
    let refused = tools_output(&db, Some(&unbounded), &skill, &work);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("unbounded.toml:2:")
            && text(&refused.stderr).contains("sandbox_max_processes = 2 is out of range"),
        "{}",
        text(&refused.stderr)
    );

    let networked = shell_skill(&tmp.path().join("net"), "network = true");
    let line = text(&tools_output(&db, None, &networked, &work).stdout);
    assert!(line.contains("network on (skill.toml)"), "{line}");

    let off = tmp.path().join("off.toml");
    std::fs::write(&off, "[tools]\nsandbox = \"off\"\n").unwrap();
    let line = text(&tools_output(&db, Some(&off), &skill, &work).stdout);
    assert!(
        line.contains("shell.exec sandbox: OFF (sandbox = \"off\" in skillstate.toml)"),
        "{line}"
    );

    let hostile = shell_skill(
        &tmp.path().join("hostile"),
        "env_allow = [\"PATH\", \"OPENAI_API_KEY\"]",
    );
    let listed = text(
        &command(
            &db,
            &[
                "tools",
                hostile.to_str().unwrap(),
                "--work-dir",
                work.to_str().unwrap(),
            ],
        )
        .env("OPENAI_API_KEY", "sk-listed-but-withheld-123")
        .output()
        .unwrap()
        .stdout,
    );
    assert!(
        listed.contains("shell.exec withholds OPENAI_API_KEY from commands"),
        "{listed}"
    );

    let missing = tmp.path().join("missing.toml");
    std::fs::write(
        &missing,
        "[tools]\nsandbox_bwrap = \"/nonexistent/bwrap\"\n",
    )
    .unwrap();
    let line = text(&tools_output(&db, Some(&missing), &skill, &work).stdout);
    assert!(
        line.contains(
            "shell.exec sandbox: UNAVAILABLE: shell.exec refuses to run without its sandbox"
        ) && line.contains("/nonexistent/bwrap")
            && line.contains("apt-get install bubblewrap"),
        "{line}"
    );

    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[tools]\nsandbox = \"maybe\"\n").unwrap();
    let refused = tools_output(&db, Some(&bad), &skill, &work);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("bad.toml:2"),
        "{}",
        text(&refused.stderr)
    );
}

#[test]
fn without_its_sandbox_shell_exec_refuses_and_the_model_is_told_why() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let skill = shell_skill(tmp.path(), "timeout_secs = 5");
    let config = tmp.path().join("skillstate.toml");
    std::fs::write(&config, "[tools]\nsandbox_bwrap = \"/nonexistent/bwrap\"\n").unwrap();
    let model = script(tmp.path(), &["touch ran.txt"]);
    let run = command(
        &db,
        &[
            ["--config", config.to_str().unwrap()].as_slice(),
            &run_args(&skill, &model, &work, "Touch a file."),
        ]
        .concat(),
    )
    .output()
    .unwrap();
    assert!(run.status.success(), "{}", text(&run.stderr));
    let observation = result_of(&db, 1);
    assert!(
        observation.contains("shell.exec refuses to run without its sandbox")
            && observation.contains("sandbox = \"off\""),
        "{observation}"
    );
    assert!(!work.join("ran.txt").exists());
}

/// Makes `path` usable by another user (a test tempdir is private to its owner).
fn open_up(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_non_dumpable_runtime_hides_its_environment_even_from_unconfined_commands() {
    // As root, every /proc entry is readable (CAP_SYS_PTRACE): run the runtime as `nobody`.
    let as_root = text(&Command::new("id").arg("-u").output().unwrap().stdout).trim() == "0";
    let tmp = tempfile::tempdir().unwrap();
    open_up(tmp.path(), 0o755);
    let bin = tmp.path().join("skillstate");
    std::fs::copy(binary(), &bin).unwrap();
    open_up(&bin, 0o755);
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    for dir in [&state, &work] {
        std::fs::create_dir_all(dir).unwrap();
        open_up(dir, 0o777);
    }
    let skill = shell_skill(tmp.path(), "timeout_secs = 30");
    let config = tmp.path().join("skillstate.toml");
    std::fs::write(&config, "[tools]\nsandbox = \"off\"\n").unwrap();
    let model = script(tmp.path(), &["cat /proc/$PPID/environ; echo; env; id -u"]);
    let db = state.join("db").join("skillstate.db");
    let secret = format!("sk-dumpable-test-{}-0ff", std::process::id());
    let mut run = if as_root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c.arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let run = run
        .current_dir(tmp.path())
        .env("SKILLSTATE_DB", &db)
        .env("OPENAI_API_KEY", &secret)
        .args(
            [
                ["--config", config.to_str().unwrap()].as_slice(),
                &run_args(&skill, &model, &work, "Read the parent's environment."),
            ]
            .concat(),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    let observation = result_of(&db, 1);
    // The command ran unconfined as a non-root user, and the parent's environ was refused.
    assert!(observation.contains("PATH="), "{observation}");
    assert!(!observation.contains("\n0\n"), "ran as root: {observation}");
    assert!(observation.contains("Permission denied"), "{observation}");
    assert!(!observation.contains(&secret), "{observation}");
    assert!(!contains(&database_bytes(&db), &secret));
}

/// Ctrl-C at a worker's terminal — SIGINT to the worker's whole process group — drains it: the
/// sandboxed command it is running is in a process group of its own, so it is not interrupted;
/// it finishes, its result is recorded, and the worker exits 0 after the drain.
#[test]
fn ctrl_c_drains_a_worker_and_its_running_command_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let skill = shell_skill(dir, "timeout_secs = 120");
    // A sleep of about 3 s whose argument marks its processes.
    let marker = format!("3.{}42", std::process::id());
    let model = script(
        dir,
        &[&format!("sleep {marker}; echo finished-after-ctrl-c")],
    );
    std::fs::write(dir.join("inputs.jsonl"), "{\"input\": \"Run it.\"}\n").unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: {model}\ninputs: inputs.jsonl\n",
            skill.display()
        ),
    )
    .unwrap();
    let config = dir.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    let db = dir.join("db").join("queue.db");
    let submit = batch_support::cli(
        dir,
        &config,
        &[
            "--db",
            db.to_str().unwrap(),
            "batch",
            "submit",
            "batch.yaml",
        ],
    );
    batch_support::expect_exit(&submit, 0, "batch submit");

    let log = dir.join("worker.log");
    let mut worker = Command::new(binary());
    worker
        .current_dir(dir)
        .env_remove("SKILLSTATE_DB")
        .env("SKILLSTATE_CONFIG", &config)
        .args(["--db", db.to_str().unwrap(), "worker", "--until-idle"])
        // Its own process group, as a shell gives a foreground job.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut worker = batch_support::Reaper(vec![worker.spawn().unwrap()]);
    let start = Instant::now();
    while survivors(&marker).is_empty() {
        assert!(
            worker.0[0].try_wait().unwrap().is_none(),
            "the worker ended before the command ran: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // What a terminal's Ctrl-C does: SIGINT to every process of the foreground group.
    let group = format!("-{}", worker.0[0].id());
    let sent = Command::new("kill")
        .args(["-INT", "--", &group])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = batch_support::wait_exit(
        &mut worker.0[0],
        Duration::from_secs(120),
        "the drained worker",
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("worker: draining"), "{log}");
    let result = result_of(&db, 1);
    assert!(
        result.contains("exit code 0") && result.contains("finished-after-ctrl-c"),
        "the command ran to its end: {result}\n{log}"
    );
    assert!(!result.contains("killed by a signal"), "{result}");
}
