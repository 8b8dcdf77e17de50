//! The built-in file and shell tools on a real directory tree with symlinks pointing out.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::symlink;

use serde_json::json;
use skillstate_tools::builtin::{ProtectedPaths, ShellSettings, ShellTool, WorkDir, fs_tools};
use skillstate_tools::{CallContext, Tool, ToolOutput};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
}

/// work/ (the root) with notes.txt, sub/data.txt, links in and out; outside/secret.txt beside it.
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("work");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(root.join("notes.txt"), "flag{inside}\nsecond line\n").unwrap();
    std::fs::write(root.join("sub/data.txt"), "alpha\nbeta flag{deep}\n").unwrap();
    std::fs::write(outside.join("secret.txt"), "flag{outside}\n").unwrap();
    symlink(&outside, root.join("out_dir")).unwrap();
    symlink(outside.join("secret.txt"), root.join("out_file")).unwrap();
    symlink(root.join("sub/data.txt"), root.join("in_link")).unwrap();
    symlink(outside.join("missing.txt"), root.join("dangling")).unwrap();
    Fixture { _tmp: tmp, root }
}

async fn call(tool: &dyn Tool, args: serde_json::Value) -> ToolOutput {
    tool.call(&args, &CallContext::new("t", 1)).await.unwrap()
}

fn tool<'a>(tools: &'a [skillstate_tools::builtin::FsTool], name: &str) -> &'a dyn Tool {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .map(|t| t as &dyn Tool)
        .unwrap()
}

#[tokio::test]
async fn path_escapes_are_refused() {
    let f = fixture();
    let tools = fs_tools(&WorkDir::new(&f.root, &ProtectedPaths::nothing()).unwrap());
    let read = tool(&tools, "fs.read");
    let write = tool(&tools, "fs.write");
    const ABSOLUTE: &str = "is absolute; paths are relative to the work directory";
    const ABOVE: &str = "leaves the work directory (`..` above its root)";
    // (tool, path, None if allowed, else what the refusal says after the quoted path)
    let cases: [(&dyn Tool, &str, Option<&str>); 14] = [
        (read, "notes.txt", None),
        (read, "./sub/../notes.txt", None),
        (read, "in_link", None),
        (read, "../outside/secret.txt", Some(ABOVE)),
        (read, "sub/../../outside/secret.txt", Some(ABOVE)),
        (read, "/etc/passwd", Some(ABSOLUTE)),
        (read, "~/.bashrc", Some(ABSOLUTE)),
        (
            read,
            "out_file",
            Some("leads outside the work directory through the symlink `out_file`"),
        ),
        (
            read,
            "out_dir/secret.txt",
            Some("leads outside the work directory through the symlink `out_dir`"),
        ),
        (write, "new.txt", None),
        (write, "../escape.txt", Some(ABOVE)),
        (
            write,
            "out_dir/planted.txt",
            Some("leads outside the work directory through the symlink `out_dir`"),
        ),
        (
            write,
            "dangling",
            Some("leads outside the work directory through the symlink `dangling`"),
        ),
        (write, "/tmp/skillstate-escape.txt", Some(ABSOLUTE)),
    ];
    for (tool, path, refusal) in cases {
        let args = if tool.spec().name == "fs.write" {
            json!({"path": path, "content": "x"})
        } else {
            json!({"path": path})
        };
        let out = call(tool, args).await;
        assert_eq!(
            out.ok,
            refusal.is_none(),
            "{} {path}: {}",
            tool.spec().name,
            out.text
        );
        if let Some(refusal) = refusal {
            assert_eq!(out.text, format!("Error: `{path}` {refusal}"));
            assert!(!out.text.contains("flag{outside}"));
        }
    }
    assert!(!f.root.parent().unwrap().join("escape.txt").exists());
    assert!(
        !f.root
            .parent()
            .unwrap()
            .join("outside/planted.txt")
            .exists()
    );
    assert!(!std::path::Path::new("/tmp/skillstate-escape.txt").exists());
    assert!(
        !f.root
            .parent()
            .unwrap()
            .join("outside/missing.txt")
            .exists()
    );
}

#[tokio::test]
async fn read_list_search_and_write() {
    let f = fixture();
    let tools = fs_tools(&WorkDir::new(&f.root, &ProtectedPaths::nothing()).unwrap());
    assert_eq!(
        call(
            tool(&tools, "fs.read"),
            json!({"path": "notes.txt", "offset": 2, "limit": 1})
        )
        .await
        .text,
        "second line"
    );
    let listing = call(tool(&tools, "fs.list"), json!({})).await.text;
    assert!(
        listing.contains("notes.txt (") && listing.contains("sub/"),
        "{listing}"
    );
    let hits = call(tool(&tools, "fs.search"), json!({"text": "flag{"}))
        .await
        .text;
    assert!(
        hits.contains("notes.txt:1: flag{inside}")
            && hits.contains("sub/data.txt:2: beta flag{deep}"),
        "{hits}"
    );
    assert!(
        !hits.contains("outside"),
        "search must not follow symlinks out: {hits}"
    );
    let wrote = call(
        tool(&tools, "fs.write"),
        json!({"path": "sub/out.txt", "content": "hello"}),
    )
    .await;
    assert!(wrote.ok, "{}", wrote.text);
    assert_eq!(
        std::fs::read_to_string(f.root.join("sub/out.txt")).unwrap(),
        "hello"
    );
    assert!(
        !call(tool(&tools, "fs.read"), json!({"path": "sub"}))
            .await
            .ok
    );
    assert!(
        !call(tool(&tools, "fs.read"), json!({"path": "nope.txt"}))
            .await
            .ok
    );
}

#[tokio::test]
async fn shell_reports_exit_codes_caps_output_times_out_and_filters_the_environment() {
    let f = fixture();
    let root = WorkDir::new(&f.root, &ProtectedPaths::nothing()).unwrap();
    let settings = ShellSettings {
        timeout_secs: 1,
        max_output_bytes: 64,
        env_allow: vec!["PATH".into()],
        ..ShellSettings::default()
    };
    let shell = ShellTool::new(&root, settings);
    let ok = call(&shell, json!({"command": "cat notes.txt; echo oops >&2"})).await;
    assert!(ok.ok);
    assert!(
        ok.text
            .starts_with("exit code 0\n--- stdout ---\nflag{inside}"),
        "{}",
        ok.text
    );
    assert!(ok.text.contains("--- stderr ---\noops"), "{}", ok.text);
    let failed = call(&shell, json!({"command": "exit 3"})).await;
    assert!(
        !failed.ok && failed.text.starts_with("exit code 3"),
        "{}",
        failed.text
    );
    let long = call(&shell, json!({"command": "yes x | head -c 1000"})).await;
    assert!(
        long.text
            .contains("[stdout truncated: 936 more bytes not shown]"),
        "{}",
        long.text
    );
    let slow = call(&shell, json!({"command": "sleep 30"})).await;
    assert!(
        !slow.ok && slow.text.starts_with("timed out after 1 s"),
        "{}",
        slow.text
    );
    let env = call(&shell, json!({"command": "env"})).await;
    assert!(
        env.text.contains("PATH=") && !env.text.contains("HOME="),
        "{}",
        env.text
    );
}
