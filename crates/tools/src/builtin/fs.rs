//! `fs.read`, `fs.write`, `fs.list`, `fs.search`: file access confined to a work directory.
//!
//! Every operation goes through the work directory's handle (see `confine.rs`), reads and
//! writes regular files only, and runs on the blocking thread pool: a slow disk or a stuck
//! system call never blocks the async runtime, and when the caller stops waiting (a timeout
//! drops the call) the work notices and stops at its next chunk.

mod paging;
mod search;

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use serde_json::{Value, json};
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use skillstate_core::{SideEffect, ToolSpec};

use super::confine::{WorkDir, kind_name, not_regular, refusal};
use crate::{CallContext, Tool, ToolError, ToolOutput};

/// Entries `fs.list` reads from one directory, and how many it shows.
const MAX_LIST_SCAN: usize = 100_000;
const MAX_LIST_SHOWN: usize = 1_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
    List,
    Search,
}

pub struct FsTool {
    op: Op,
    spec: ToolSpec,
    root: WorkDir,
}

/// The four file tools over `root`.
pub fn fs_tools(root: &WorkDir) -> Vec<FsTool> {
    [Op::Read, Op::Write, Op::List, Op::Search]
        .into_iter()
        .map(|op| FsTool {
            op,
            spec: spec(op),
            root: root.clone(),
        })
        .collect()
}

fn spec(op: Op) -> ToolSpec {
    let path = json!({"type": "string", "description": "Path relative to the work directory"});
    let (name, description, schema, side_effect) = match op {
        Op::Read => (
            "fs.read",
            "Read a text file. Optional `offset` (first line, 1-based) and `limit` (number of lines). One answer holds at most 256 KiB; a longer file or range ends with a marker giving the `offset` to continue from.",
            json!({"type": "object", "properties": {"path": path, "offset": {"type": "integer", "minimum": 1}, "limit": {"type": "integer", "minimum": 1}}, "required": ["path"], "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
        Op::Write => (
            "fs.write",
            "Write a text file (created or replaced).",
            json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
            SideEffect::Idempotent,
        ),
        Op::List => (
            "fs.list",
            "List a directory (default: the work directory).",
            json!({"type": "object", "properties": {"path": path}, "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
        Op::Search => (
            "fs.search",
            "Find lines containing `text` in the files under `path` (default: everything).",
            json!({"type": "object", "properties": {"text": {"type": "string", "minLength": 1}, "path": path}, "required": ["text"], "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
    };
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        side_effect,
        source: "fs".into(),
        needs_approval: false,
    }
}

fn text_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// Set when the caller stopped waiting; long loops check it between chunks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub(crate) fn check(&self) -> io::Result<()> {
        if self.0.load(Ordering::Relaxed) {
            return Err(io::Error::other("the caller stopped waiting"));
        }
        Ok(())
    }
}

/// Cancels when dropped, i.e. when the call's future is dropped (finished or timed out).
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.0.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl Tool for FsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let guard = CancelOnDrop(Cancel::default());
        let cancel = guard.0.clone();
        let (op, root, args) = (self.op, self.root.clone(), args.clone());
        let secrets = Arc::clone(&ctx.secrets);
        let result = tokio::task::spawn_blocking(move || match op {
            Op::Read => read(&root, &args, &cancel, &secrets),
            Op::Write => write(&root, &args),
            Op::List => list(&root, &args, &cancel),
            Op::Search => search::search(&root, &args, &cancel, &secrets),
        })
        .await
        .map_err(|e| ToolError::Failed {
            tool: self.spec.name.clone(),
            message: format!("the file operation stopped unexpectedly: {e}"),
        })?;
        drop(guard);
        // Names and lines of the work directory are outside text: whatever an operation cut
        // was redacted before (paging.rs, search.rs); the whole answer is redacted here too.
        let clean = |text: String| Outside::new(text).redacted(&ctx.secrets);
        Ok(match result {
            Ok(text) => ToolOutput::success(clean(text)),
            Err(text) => ToolOutput::failure(format!("Error: {}", clean(text))),
        })
    }
}

fn read(
    root: &WorkDir,
    args: &Value,
    cancel: &Cancel,
    secrets: &Redactor,
) -> Result<String, String> {
    let given = text_arg(args, "path").unwrap_or_default();
    let located = root.locate(given, false)?;
    let (file, _) = root.open_regular(&located, given)?;
    let page = paging::Page {
        offset: args.get("offset").and_then(Value::as_u64),
        limit: args.get("limit").and_then(Value::as_u64),
    };
    paging::read(file, given, page, paging::MAX_READ_BYTES, cancel, secrets)
}

/// Writes through the handle of the target's directory: a temporary file created there
/// (`O_EXCL`, so never through a symlink), then renamed over the target — readers see the old
/// or the new content, never a half-written file, and a symlink swapped in for the target is
/// replaced, not followed. The target's permission bits are kept.
fn write(root: &WorkDir, args: &Value) -> Result<String, String> {
    let given = text_arg(args, "path").unwrap_or_default();
    let content = text_arg(args, "content").unwrap_or_default();
    let located = root.locate(given, true)?;
    let Some(name) = located.file_name().filter(|_| located != Path::new(".")) else {
        return Err(format!(
            "`{given}` names the work directory itself, not a file"
        ));
    };
    let parent = match located.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let dir = root
        .dir()
        .open_dir(parent)
        .map_err(|e| refusal(given, &e))?;
    let permissions = match dir.symlink_metadata(name) {
        Ok(meta) => {
            not_regular(given, &meta.file_type())?;
            Some(meta.permissions())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(refusal(given, &e)),
    };
    replace_atomically(&dir, Path::new(name), content.as_bytes(), permissions)
        .map_err(|e| refusal(given, &e))?;
    Ok(format!(
        "wrote {} bytes to {}",
        content.len(),
        located.display()
    ))
}

fn replace_atomically(
    dir: &Dir,
    name: &Path,
    content: &[u8],
    permissions: Option<cap_std::fs::Permissions>,
) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let temp = format!(
        ".{}.skillstate-{}-{}.tmp",
        name.display(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .follow(FollowSymlinks::No);
    let mut file = dir.open_with(&temp, &options)?;
    let written = (|| {
        file.write_all(content)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        file.sync_all()?;
        dir.rename(&temp, dir, name)
    })();
    if written.is_err() {
        let _ = dir.remove_file_or_symlink(&temp);
    }
    written
}

fn list(root: &WorkDir, args: &Value, cancel: &Cancel) -> Result<String, String> {
    let given = text_arg(args, "path").unwrap_or(".");
    let located = root.locate(given, false)?;
    let dir = root.dir().open_dir(&located).map_err(|e| {
        if e.kind() == io::ErrorKind::NotADirectory {
            format!("`{given}` is not a directory; use fs.read for a file")
        } else {
            refusal(given, &e)
        }
    })?;
    let mut entries = Vec::new();
    let mut more_unread = false;
    for entry in dir.entries().map_err(|e| refusal(given, &e))? {
        cancel.check().map_err(|e| refusal(given, &e))?;
        if entries.len() == MAX_LIST_SCAN {
            more_unread = true;
            break;
        }
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        entries.push(match entry.file_type() {
            Ok(kind) if kind.is_dir() => format!("{name}/"),
            Ok(kind) if kind.is_file() => match entry.metadata() {
                Ok(meta) => format!("{name} ({} bytes)", meta.len()),
                Err(_) => name,
            },
            Ok(kind) => format!("{name} ({})", kind_name(&kind)),
            Err(_) => name,
        });
    }
    if entries.is_empty() {
        return Ok(format!("{} is empty", located.display()));
    }
    entries.sort();
    let total = entries.len();
    // Whole names are dropped, none is cut; the listing is redacted with the call's secrets.
    entries.truncate(MAX_LIST_SHOWN);
    let mut text = entries.join("\n");
    if total > MAX_LIST_SHOWN || more_unread {
        let counted = if more_unread { "at least " } else { "" };
        text.push_str(&format!(
            "\n[fs.list: showing the first {MAX_LIST_SHOWN} of {counted}{total} entries; use fs.search or a subdirectory to narrow down]"
        ));
    }
    Ok(text)
}
