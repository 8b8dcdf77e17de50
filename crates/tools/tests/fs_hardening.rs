//! The fs tools against a hostile work directory, on real files and real threads: symlinks
//! swapped in while a tool runs, named pipes, sockets and device nodes, and files far larger
//! than one answer.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use serde_json::{Value, json};
use skillstate_tools::builtin::{FsTool, ProtectedPaths, WorkDir, fs_tools};
use skillstate_tools::{CallContext, Tool, ToolOutput};

async fn call(tools: &[FsTool], name: &str, args: Value) -> ToolOutput {
    let tool = tools.iter().find(|t| t.spec().name == name).unwrap();
    tool.call(&args, &CallContext::new("t", 1)).await.unwrap()
}

/// Runs `work` on its own thread and runtime, and fails the test if it has not finished after
/// `secs` seconds. A regression that blocks forever (an open on a FIFO, a read of an endless
/// device) thus fails the test instead of hanging CI; the stuck thread dies with the process.
fn finishes_within<T: Send + 'static>(
    secs: u64,
    what: &str,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _ = sender.send(runtime.block_on(work));
    });
    receiver
        .recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not return within {secs} s: it hangs"))
}

// --- symlink races ---------------------------------------------------------------------------

const SECRET: &str = "flag{outside-secret}";
const OUTSIDE_NAME: &str = "only-outside-name.txt";

struct RaceFixture {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    outside: PathBuf,
    stash: PathBuf,
}

/// work/flip        a regular file, or (swapped) a symlink to outside/secret.txt
/// work/flipdir     a directory with its own secret.txt, or (swapped) a symlink to outside/
/// work/flipw       a regular file, or (replaced) a symlink to outside/secret.txt (write target)
/// stash/           the other half of each pair, outside the work directory
fn race_fixture() -> RaceFixture {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let outside = tmp.path().join("outside");
    let stash = tmp.path().join("stash");
    for dir in [&work, &outside, &stash, &work.join("flipdir")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(outside.join("secret.txt"), format!("{SECRET}\n")).unwrap();
    std::fs::write(outside.join(OUTSIDE_NAME), format!("{SECRET}\n")).unwrap();
    std::fs::write(work.join("flip"), "inside flag{in}\n").unwrap();
    std::fs::write(work.join("flipw"), "inside flag{in}\n").unwrap();
    std::fs::write(work.join("flipdir/secret.txt"), "inside copy flag{in}\n").unwrap();
    symlink(outside.join("secret.txt"), stash.join("flip")).unwrap();
    symlink(&outside, stash.join("flipdir")).unwrap();
    RaceFixture {
        _tmp: tmp,
        work,
        outside,
        stash,
    }
}

/// Flips the three paths as fast as it can, counting full rounds, until dropped.
struct Swapper {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapper {
    fn start(f: &RaceFixture) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (work, stash, outside) = (f.work.clone(), f.stash.clone(), f.outside.clone());
        let exchange = {
            let (work, stash) = (work.clone(), stash.clone());
            move |name: &str| {
                renameat2(
                    AT_FDCWD,
                    &stash.join(name),
                    AT_FDCWD,
                    &work.join(name),
                    RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
            }
        };
        let thread = {
            let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    exchange("flip");
                    exchange("flipdir");
                    // flipw is replaced by rename: an fs.write may replace it too.
                    let link = stash.join("flipw.link");
                    let _ = std::fs::remove_file(&link);
                    symlink(outside.join("secret.txt"), &link).unwrap();
                    std::fs::rename(&link, work.join("flipw")).unwrap();
                    exchange("flip");
                    exchange("flipdir");
                    let file = stash.join("flipw.file");
                    std::fs::write(&file, "inside flag{in}\n").unwrap();
                    std::fs::rename(&file, work.join("flipw")).unwrap();
                    rounds.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        Self {
            stop,
            rounds,
            thread: Some(thread),
        }
    }

    fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::SeqCst)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swap_races_never_leak_or_write_outside() {
    let f = race_fixture();
    let tools = fs_tools(&WorkDir::new(&f.work, &ProtectedPaths::nothing()).unwrap());
    let swapper = Swapper::start(&f);
    let calls: [(&str, Value); 9] = [
        ("fs.read", json!({"path": "flip"})),
        ("fs.read", json!({"path": "flip", "offset": 1, "limit": 5})),
        ("fs.read", json!({"path": "flipdir/secret.txt"})),
        ("fs.list", json!({"path": "flipdir"})),
        ("fs.search", json!({"text": "flag{"})),
        ("fs.search", json!({"text": "flag{", "path": "flipdir"})),
        ("fs.search", json!({"text": "flag{", "path": "flip"})),
        (
            "fs.write",
            json!({"path": "flipdir/planted.txt", "content": "planted"}),
        ),
        (
            "fs.write",
            json!({"path": "flipw", "content": "overwritten"}),
        ),
    ];
    let (mut iterations, mut allowed) = (0u64, 0u64);
    // Enough iterations and enough swaps that a check-then-open window is hit many times over.
    while iterations < 1000 || swapper.rounds() < 5000 {
        for (name, args) in &calls {
            let out = call(&tools, name, args.clone()).await;
            assert!(
                !out.text.contains(SECRET) && !out.text.contains(OUTSIDE_NAME),
                "{name} {args} leaked the outside: {}",
                out.text
            );
            allowed += u64::from(out.ok);
        }
        iterations += 1;
        assert!(iterations < 200_000, "the swapper made no progress");
    }
    eprintln!(
        "{iterations} rounds of calls, {allowed} allowed, {} swap rounds",
        swapper.rounds()
    );
    drop(swapper);
    let mut names: Vec<String> = std::fs::read_dir(&f.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["only-outside-name.txt", "secret.txt"],
        "nothing planted outside"
    );
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        format!("{SECRET}\n"),
        "nothing written through a swapped-in symlink"
    );
    // The race was real: the inside versions were read and written too, not only refused.
    assert!(
        allowed > iterations,
        "{allowed} allowed calls in {iterations} rounds"
    );
}

// --- FIFOs, sockets, devices -----------------------------------------------------------------

/// work/pipe (a FIFO nobody writes to), work/sock (a listening Unix socket), work/zero (a
/// symlink to /dev/zero), and work/zero_dev (a character device like /dev/zero, when this
/// process may create one).
struct SpecialFixture {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    _socket: std::os::unix::net::UnixListener,
    device: bool,
}

fn special_fixture() -> SpecialFixture {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("plain.txt"), "findme in a plain file\n").unwrap();
    nix::unistd::mkfifo(&work.join("pipe"), Mode::from_bits_truncate(0o644)).unwrap();
    let socket = std::os::unix::net::UnixListener::bind(work.join("sock")).unwrap();
    symlink("/dev/zero", work.join("zero")).unwrap();
    let device = match mknod(
        &work.join("zero_dev"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(1, 5),
    ) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("no device node test: mknod is not allowed here ({e})");
            false
        }
    };
    SpecialFixture {
        _tmp: tmp,
        work,
        _socket: socket,
        device,
    }
}

#[test]
fn fifos_sockets_and_devices_are_refused_promptly() {
    let f = special_fixture();
    let work = f.work.clone();
    let device = f.device;
    let outputs = finishes_within(60, "fs tools on special files", async move {
        let tools = fs_tools(&WorkDir::new(&work, &ProtectedPaths::nothing()).unwrap());
        let mut names = vec!["pipe", "sock", "zero"];
        if device {
            names.push("zero_dev");
        }
        let mut outputs = Vec::new();
        for name in names {
            for (tool, args) in [
                ("fs.read", json!({"path": name})),
                ("fs.read", json!({"path": name, "offset": 2, "limit": 1})),
                ("fs.write", json!({"path": name, "content": "x"})),
                ("fs.search", json!({"text": "findme", "path": name})),
            ] {
                outputs.push((name, tool, call(&tools, tool, args).await));
            }
        }
        let whole = call(&tools, "fs.search", json!({"text": "findme"})).await;
        let listing = call(&tools, "fs.list", json!({})).await;
        let list_pipe = call(&tools, "fs.list", json!({"path": "pipe"})).await;
        (outputs, whole, listing, list_pipe)
    });
    let (outputs, whole, listing, list_pipe) = outputs;
    assert_eq!(
        list_pipe.text,
        "Error: `pipe` is not a directory; use fs.read for a file"
    );
    for (name, tool, out) in &outputs {
        assert!(!out.ok, "{tool} {name} must be refused: {}", out.text);
        let expected = match *name {
            "pipe" => "is a named pipe (FIFO), not a regular file",
            "sock" => "is a socket, not a regular file",
            "zero_dev" => "is a character device, not a regular file",
            _ => "leads outside the work directory",
        };
        assert!(
            out.text.starts_with(&format!("Error: `{name}`")) && out.text.contains(expected),
            "{tool} {name}: {}",
            out.text
        );
    }
    // The special files were left as they were: a write does not replace them.
    let kind = |name: &str| {
        std::fs::symlink_metadata(f.work.join(name))
            .unwrap()
            .file_type()
    };
    use std::os::unix::fs::FileTypeExt;
    assert!(kind("pipe").is_fifo() && kind("sock").is_socket() && kind("zero").is_symlink());
    // A search over the whole directory skips them and says so.
    assert!(
        whole.ok
            && whole
                .text
                .starts_with("plain.txt:1: findme in a plain file"),
        "{}",
        whole.text
    );
    let special = if f.device { 3 } else { 2 };
    assert!(
        whole.text.contains(&format!(
            "[not searched: 1 symlink (not followed), {special} special files (FIFO, socket or device)]"
        )),
        "{}",
        whole.text
    );
    assert!(
        listing.text.contains("pipe (a named pipe (FIFO))")
            && listing.text.contains("sock (a socket)")
            && listing.text.contains("zero (a symlink)"),
        "{}",
        listing.text
    );
}

// --- paging ----------------------------------------------------------------------------------

/// The text before fs.read's closing marker, and the offset the marker says to continue at.
fn split_marker(text: &str) -> (&str, Option<u64>) {
    let Some((body, marker)) = text.rsplit_once("\n[fs.read:") else {
        return (text, None);
    };
    let next = marker
        .split("offset=")
        .nth(1)
        .map(|rest| rest.trim_end_matches(']').parse().unwrap());
    (body, next)
}

fn big_file(path: &Path, lines: usize) -> String {
    let text: String = (1..=lines)
        .map(|n| format!("line {n:06} {}\n", "x".repeat(50)))
        .collect();
    std::fs::write(path, &text).unwrap();
    text
}

#[tokio::test]
async fn paging_reaches_every_line_of_a_file_far_larger_than_one_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let original = big_file(&tmp.path().join("big.log"), 40_000); // 2.5 MB
    assert!(original.len() > 2 * 1024 * 1024);
    let tools = fs_tools(&WorkDir::new(tmp.path(), &ProtectedPaths::nothing()).unwrap());

    // The whole-file read answers with the first part and says how to go on ...
    let first = call(&tools, "fs.read", json!({"path": "big.log"})).await;
    assert!(first.ok, "{}", first.text);
    let (body, mut next) = split_marker(&first.text);
    assert!(next.is_some(), "a capped answer names the next offset");
    assert!(original.starts_with(body));
    let mut lines: Vec<String> = body.lines().map(str::to_owned).collect();
    // ... and following that advice page after page yields the file, line for line.
    let mut pages = 1;
    while let Some(offset) = next {
        let page = call(
            &tools,
            "fs.read",
            json!({"path": "big.log", "offset": offset}),
        )
        .await;
        assert!(page.ok, "offset {offset}: {}", page.text);
        assert!(
            page.text.starts_with(&format!("line {offset:06} ")),
            "offset {offset} starts at that line"
        );
        let (body, after) = split_marker(&page.text);
        lines.extend(body.lines().map(str::to_owned));
        next = after;
        pages += 1;
        assert!(pages < 100, "paging does not advance");
    }
    assert_eq!(lines, original.lines().collect::<Vec<_>>());
    assert!(pages >= 10, "{pages} pages of at most 256 KiB for 2.5 MB");

    // An offset far past 256 KiB, with a limit: exactly those lines.
    let middle = call(
        &tools,
        "fs.read",
        json!({"path": "big.log", "offset": 30_000, "limit": 3}),
    )
    .await;
    let expected: Vec<&str> = original.lines().skip(29_999).take(3).collect();
    assert_eq!(middle.text, expected.join("\n"));

    // Past the end: a clear refusal with the real length.
    let past = call(
        &tools,
        "fs.read",
        json!({"path": "big.log", "offset": 40_002}),
    )
    .await;
    assert!(!past.ok);
    assert!(
        past.text
            .contains("has 40000 lines; offset 40002 is past its end"),
        "{}",
        past.text
    );
}

#[tokio::test]
async fn a_single_line_longer_than_the_cap_is_cut_with_a_marker_and_paging_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    // One 600 KB line of multi-byte characters, then a short one.
    let long = "é".repeat(300_000);
    std::fs::write(tmp.path().join("wide.txt"), format!("{long}\nafter\n")).unwrap();
    let tools = fs_tools(&WorkDir::new(tmp.path(), &ProtectedPaths::nothing()).unwrap());
    let out = call(&tools, "fs.read", json!({"path": "wide.txt"})).await;
    assert!(out.ok, "{}", &out.text[out.text.len() - 200..]);
    let (body, next) = split_marker(&out.text);
    assert!(long.starts_with(body) && body.len() <= 256 * 1024);
    assert!(
        out.text.contains("line 1 is longer than"),
        "cut is announced"
    );
    assert_eq!(next, Some(2));
    let rest = call(&tools, "fs.read", json!({"path": "wide.txt", "offset": 2})).await;
    assert_eq!(rest.text, "after");
}

#[tokio::test]
async fn binary_files_are_refused_as_text() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("blob.bin"), b"ok\n\xff\xfe\x00\n").unwrap();
    let tools = fs_tools(&WorkDir::new(tmp.path(), &ProtectedPaths::nothing()).unwrap());
    let out = call(&tools, "fs.read", json!({"path": "blob.bin"})).await;
    assert!(!out.ok);
    assert!(
        out.text.contains("line 2 of `blob.bin` is not UTF-8 text"),
        "{}",
        out.text
    );
}

// --- writes ----------------------------------------------------------------------------------

#[tokio::test]
async fn writes_replace_atomically_keep_permissions_and_write_through_inside_links() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    std::fs::create_dir(work.join("sub")).unwrap();
    std::fs::write(work.join("sub/run.sh"), "old\n").unwrap();
    std::fs::set_permissions(
        work.join("sub/run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    // An absolute link and a relative link, both pointing inside.
    symlink(work.join("sub/run.sh"), work.join("abs_link")).unwrap();
    symlink("sub/run.sh", work.join("rel_link")).unwrap();
    let tools = fs_tools(&WorkDir::new(work, &ProtectedPaths::nothing()).unwrap());
    for (path, content) in [
        ("abs_link", "via absolute\n"),
        ("rel_link", "via relative\n"),
    ] {
        let out = call(
            &tools,
            "fs.write",
            json!({"path": path, "content": content}),
        )
        .await;
        assert!(out.ok, "{}", out.text);
        assert_eq!(
            out.text,
            format!("wrote {} bytes to sub/run.sh", content.len())
        );
        assert_eq!(
            std::fs::read_to_string(work.join("sub/run.sh")).unwrap(),
            content
        );
        assert!(
            std::fs::symlink_metadata(work.join(path))
                .unwrap()
                .is_symlink()
        );
    }
    let mode = std::fs::metadata(work.join("sub/run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750, "permission bits kept");
    let mut names: Vec<_> = std::fs::read_dir(work.join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["run.sh"], "no temporary file left behind");
    let dir = call(&tools, "fs.write", json!({"path": "sub", "content": "x"})).await;
    assert!(
        !dir.ok && dir.text.contains("`sub` is a directory"),
        "{}",
        dir.text
    );
    let root = call(&tools, "fs.write", json!({"path": ".", "content": "x"})).await;
    assert!(!root.ok, "{}", root.text);
    let missing = call(
        &tools,
        "fs.write",
        json!({"path": "nope/new.txt", "content": "x"}),
    )
    .await;
    assert!(
        !missing.ok && missing.text.contains("the directory `nope` does not exist"),
        "{}",
        missing.text
    );
}
