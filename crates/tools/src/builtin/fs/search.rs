//! `fs.search`: a walk through directory handles, one level at a time (each directory is
//! opened beneath its parent's handle without following a symlink), reading regular files only
//! and bounded in depth, entries, bytes and matches; what it skipped or where it stopped is
//! said at the end.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, File};
use serde_json::Value;
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;

use super::{Cancel, text_arg};
use crate::builtin::confine::{WorkDir, open_regular_in, refusal};

const MAX_HITS: usize = 200;
const MAX_DEPTH: usize = 16;
/// Directory entries looked at in one search.
const MAX_ENTRIES: usize = 50_000;
/// Bytes read from one file, and from all files of one search.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
const MAX_TOTAL_BYTES: u64 = 64 * 1024 * 1024;
/// A matching line longer than this is shown cut, with `…`.
const MAX_HIT_CHARS: usize = 300;

pub(super) fn search(
    root: &WorkDir,
    args: &Value,
    cancel: &Cancel,
    secrets: &Redactor,
) -> Result<String, String> {
    let needle = text_arg(args, "text").unwrap_or_default();
    let given = text_arg(args, "path").unwrap_or(".");
    if needle.is_empty() {
        return Err("`text` is empty; give the text to look for".into());
    }
    let located = root.locate(given, false)?;
    let meta = root
        .dir()
        .symlink_metadata(&located)
        .map_err(|e| refusal(given, &e))?;
    let mut walk = Walk {
        needle,
        cancel,
        secrets,
        hits: Vec::new(),
        entries: 0,
        bytes: 0,
        links: 0,
        special: 0,
        binary: 0,
        unreadable: 0,
        deep: 0,
        partial: 0,
        stopped: None,
    };
    let shown = if located == Path::new(".") {
        PathBuf::new()
    } else {
        located.clone()
    };
    if meta.is_dir() {
        let dir = root
            .dir()
            .open_dir(&located)
            .map_err(|e| refusal(given, &e))?;
        walk.dir(&dir, &shown, 0);
    } else {
        let (file, meta) = root.open_regular(&located, given)?;
        walk.file(file, meta.len(), &shown);
    }
    Ok(walk.report())
}

struct Walk<'a> {
    needle: &'a str,
    cancel: &'a Cancel,
    secrets: &'a Redactor,
    hits: Vec<String>,
    entries: usize,
    bytes: u64,
    links: usize,
    special: usize,
    binary: usize,
    unreadable: usize,
    deep: usize,
    partial: usize,
    stopped: Option<String>,
}

impl Walk<'_> {
    fn stop(&mut self, why: String) {
        self.stopped.get_or_insert(why);
    }

    fn dir(&mut self, dir: &Dir, path: &Path, depth: usize) {
        if depth > MAX_DEPTH {
            self.deep += 1;
            return;
        }
        let Ok(entries) = dir.entries() else { return };
        let mut children = Vec::new();
        for entry in entries {
            if self.stopped.is_some() {
                return;
            }
            if self.cancel.check().is_err() {
                self.stop("because the caller stopped waiting".into());
                return;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                self.stop(format!("after {MAX_ENTRIES} directory entries"));
                return;
            }
            let Ok(entry) = entry else { continue };
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            children.push((entry.file_name(), kind));
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in children {
            if self.stopped.is_some() {
                return;
            }
            let child = path.join(&name);
            if kind.is_dir() {
                // Beneath this handle, and not through a symlink swapped in since the listing.
                if let Ok(sub) = dir.open_dir_nofollow(&name) {
                    self.dir(&sub, &child, depth + 1);
                }
            } else if kind.is_file() {
                match open_regular_in(dir, Path::new(&name), &child.display().to_string()) {
                    Ok((file, meta)) => self.file(file, meta.len(), &child),
                    Err(_) => self.unreadable += 1,
                }
            } else if kind.is_symlink() {
                self.links += 1;
            } else {
                self.special += 1;
            }
        }
    }

    fn file(&mut self, file: File, len: u64, path: &Path) {
        if len > MAX_FILE_BYTES {
            self.partial += 1;
        }
        let mut reader = BufReader::new(file.take(MAX_FILE_BYTES));
        if reader.fill_buf().is_ok_and(|start| start.contains(&0)) {
            self.binary += 1;
            return;
        }
        let mut line = Vec::new();
        let mut number = 0;
        let mut in_file = 0u64;
        loop {
            if self.cancel.check().is_err() {
                self.stop("because the caller stopped waiting".into());
                return;
            }
            line.clear();
            let read = match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(read) => read as u64,
            };
            number += 1;
            self.bytes += read;
            in_file += read;
            let text = String::from_utf8_lossy(&line);
            if text.contains(self.needle) {
                // The last line of a file read up to MAX_FILE_BYTES may stop inside a secret.
                let cut = in_file >= MAX_FILE_BYTES && !line.ends_with(b"\n");
                let hit = Outside::new(text.trim()).followed_by_more(cut);
                self.hits.push(format!(
                    "{}:{number}: {}",
                    path.display(),
                    clip(&hit, self.secrets)
                ));
                if self.hits.len() >= MAX_HITS {
                    self.stop(format!("after {MAX_HITS} matches"));
                    return;
                }
            }
            if self.bytes >= MAX_TOTAL_BYTES {
                self.stop(format!(
                    "after reading {} MiB",
                    MAX_TOTAL_BYTES / (1024 * 1024)
                ));
                return;
            }
        }
    }

    fn report(self) -> String {
        let mut lines = if self.hits.is_empty() {
            vec![format!("no line contains `{}`", self.needle)]
        } else {
            self.hits
        };
        if let Some(why) = self.stopped {
            lines.push(format!(
                "[search stopped {why}; narrow it down with `path`]"
            ));
        }
        let mut skipped = Vec::new();
        let count =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        if self.links > 0 {
            skipped.push(count(self.links, "symlink", "symlinks") + " (not followed)");
        }
        if self.special > 0 {
            skipped.push(
                count(self.special, "special file", "special files") + " (FIFO, socket or device)",
            );
        }
        if self.binary > 0 {
            skipped.push(count(self.binary, "binary file", "binary files"));
        }
        if self.unreadable > 0 {
            skipped.push(count(
                self.unreadable,
                "unreadable file",
                "unreadable files",
            ));
        }
        if self.deep > 0 {
            skipped.push(
                count(self.deep, "directory", "directories")
                    + &format!(" deeper than {MAX_DEPTH} levels"),
            );
        }
        if !skipped.is_empty() {
            lines.push(format!("[not searched: {}]", skipped.join(", ")));
        }
        if self.partial > 0 {
            lines.push(format!(
                "[{} larger than {} MiB: only the start searched; page through with fs.read]",
                count(self.partial, "file", "files"),
                MAX_FILE_BYTES / (1024 * 1024)
            ));
        }
        lines.join("\n")
    }
}

/// A matching line, redacted, then cut to [`MAX_HIT_CHARS`].
fn clip(line: &Outside, secrets: &Redactor) -> String {
    let clipped = line.clipped_chars(secrets, MAX_HIT_CHARS);
    if clipped.cut {
        format!("{}…", clipped.text)
    } else {
        clipped.text
    }
}
