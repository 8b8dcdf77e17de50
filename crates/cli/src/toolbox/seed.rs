//! A task's own work directory, made fresh: empty, or a copy of a skill's seed directory.
//!
//! The copy is bounded (entries and bytes), holds only directories and regular files (a
//! symlink in a seed could lead a command out of its work directory; a device or FIFO has no
//! business there) and appears whole or not at all: it is written beside its final place and
//! renamed into it.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::config::create_private_dir;

/// Most files and directories a seed may hold.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes a seed's files may hold together.
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// `Ok` when `seed` can be copied: only directories and regular files, within the bounds.
pub fn check(seed: &Path) -> Result<(), String> {
    walk(seed, &mut |_, _| Ok(())).map(|_| ())
}

/// Makes `dir` (which must not exist): empty, or a copy of `seed`.
pub fn make_fresh(dir: &Path, seed: Option<&Path>) -> Result<()> {
    let Some(seed) = seed else {
        return create_private_dir(dir)
            .with_context(|| format!("cannot create the work directory {}", dir.display()));
    };
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("the work directory has no name")?;
    let partial = dir.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove the unfinished copy {}", partial.display()))?;
    }
    create_private_dir(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let copied = walk(seed, &mut |relative, is_dir| {
        let target = partial.join(relative);
        if is_dir {
            std::fs::create_dir(&target).map_err(|e| format!("{}: {e}", target.display()))
        } else {
            std::fs::copy(seed.join(relative), &target)
                .map(|_| ())
                .map_err(|e| format!("{}: {e}", target.display()))
        }
    });
    if let Err(error) = copied {
        let _ = std::fs::remove_dir_all(&partial);
        bail!(
            "cannot seed the work directory {} from {}: {error}",
            dir.display(),
            seed.display()
        );
    }
    if let Err(error) = std::fs::rename(&partial, dir) {
        let _ = std::fs::remove_dir_all(&partial);
        // Another process seeded it first: theirs is as good as ours.
        if dir.is_dir() {
            return Ok(());
        }
        bail!(
            "cannot create the work directory {}: {error}",
            dir.display()
        );
    }
    Ok(())
}

/// Visits every entry under `root` (parents before children) with its path relative to
/// `root`; refuses symlinks, special files and seeds beyond the bounds. Returns the bytes seen.
fn walk(
    root: &Path,
    visit: &mut dyn FnMut(&Path, bool) -> Result<(), String>,
) -> Result<u64, String> {
    let mut pending = vec![std::path::PathBuf::new()];
    let mut entries = 0usize;
    let mut bytes = 0u64;
    while let Some(relative) = pending.pop() {
        let listing = std::fs::read_dir(root.join(&relative))
            .map_err(|e| format!("{}: {e}", root.join(&relative).display()))?;
        for entry in listing {
            let entry = entry.map_err(|e| format!("{}: {e}", root.join(&relative).display()))?;
            let path = relative.join(entry.file_name());
            let kind = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", root.join(&path).display()))?;
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(format!(
                    "it holds more than {MAX_ENTRIES} files and directories; a seed is a small starting point, not a data set"
                ));
            }
            if kind.is_dir() {
                visit(&path, true)?;
                pending.push(path);
            } else if kind.is_file() {
                let size = entry
                    .metadata()
                    .map_err(|e| format!("{}: {e}", root.join(&path).display()))?
                    .len();
                bytes = bytes.saturating_add(size);
                if bytes > MAX_BYTES {
                    return Err(format!(
                        "its files hold more than {MAX_BYTES} bytes; a seed is a small starting point, not a data set"
                    ));
                }
                visit(&path, false)?;
            } else {
                return Err(format!(
                    "{} is a symlink or a special file; a seed holds only directories and regular files",
                    root.join(&path).display()
                ));
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_copied_whole_and_a_symlink_in_it_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let seed = tmp.path().join("seed");
        std::fs::create_dir_all(seed.join("src")).unwrap();
        std::fs::write(seed.join("src/main.py"), "print(1)\n").unwrap();
        let dir = tmp.path().join("work/t1");
        std::fs::create_dir_all(tmp.path().join("work")).unwrap();
        make_fresh(&dir, Some(&seed)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("src/main.py")).unwrap(),
            "print(1)\n"
        );
        std::os::unix::fs::symlink("/etc", seed.join("escape")).unwrap();
        let error = check(&seed).unwrap_err();
        assert!(
            error.contains("escape") && error.contains("symlink"),
            "{error}"
        );
        let other = tmp.path().join("work/t2");
        assert!(make_fresh(&other, Some(&seed)).is_err());
        assert!(!other.exists(), "a refused seed leaves nothing behind");
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path().join("work"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    }
}
