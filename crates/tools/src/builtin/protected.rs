//! What no confined root may reach: the runtime's own files.
//!
//! A work directory, an fs-tool root or a path bound into the sandbox gives whatever runs there
//! (a model's file operation, a shell command) read or write access to everything beneath it.
//! The runtime's own files must never be beneath one: the database (its directory, which also
//! holds the `-wal`, `-shm` and `-journal` files), the configuration file and any file that
//! holds a secret. [`ProtectedPaths`] lists them, and the only constructors of confined roots
//! ([`WorkDir::new`](super::WorkDir::new), the sandbox's read-only binds) take it: a root that
//! is, contains or sits inside a protected path is refused with both paths and the reason.

use std::path::{Component, Path, PathBuf};

/// The runtime's own paths, which no confined root may be, contain or sit inside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProtectedPaths {
    entries: Vec<Protected>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Protected {
    /// Absolute, with symlinks of its existing part resolved.
    path: PathBuf,
    /// What it is, for messages ("the database directory").
    what: String,
}

impl ProtectedPaths {
    /// Nothing protected: for embedders whose runtime keeps no file of its own (an in-memory
    /// store, no configuration file). Every binary that has a database file must list it.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// Protects `path` (a directory or a file, existing or not yet) as `what`.
    pub fn with(mut self, path: &Path, what: impl Into<String>) -> Self {
        self.add(path, what);
        self
    }

    /// Protects `path` (a directory or a file, existing or not yet) as `what`.
    pub fn add(&mut self, path: &Path, what: impl Into<String>) {
        let path = resolved(path);
        if !self.entries.iter().any(|e| e.path == path) {
            self.entries.push(Protected {
                path,
                what: what.into(),
            });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every protected path with what it is.
    pub fn iter(&self) -> impl Iterator<Item = (&Path, &str)> {
        self.entries
            .iter()
            .map(|e| (e.path.as_path(), e.what.as_str()))
    }

    /// `Ok` when `root` (what `role` names: "the work directory", "sandbox_read_paths entry")
    /// is none of the protected paths, contains none and sits inside none; else why not.
    pub fn check(&self, root: &Path, role: &str) -> Result<(), String> {
        let resolved_root = resolved(root);
        for entry in &self.entries {
            let relation = if resolved_root == entry.path {
                "is"
            } else if entry.path.starts_with(&resolved_root) {
                "contains"
            } else if resolved_root.starts_with(&entry.path) {
                "sits inside"
            } else {
                continue;
            };
            return Err(format!(
                "{role} {} {relation} {} {}: whatever runs there could read or change the runtime's own files. Choose a directory apart from it (the data directory's work/ subdirectory is the default)",
                resolved_root.display(),
                entry.what,
                entry.path.display()
            ));
        }
        Ok(())
    }
}

/// `path` made absolute, its longest existing prefix canonicalized (symlinks resolved) and the
/// rest appended lexically (`.` dropped, `..` applied), so that a path and a symlink to it, or
/// a file not created yet, compare as the same place.
pub fn resolved(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    let mut existing = absolute.clone();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            let mut out = canonical;
            for part in rest.iter().rev() {
                push_lexical(&mut out, Path::new(part));
            }
            return out;
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = PathBuf::new();
    push_lexical(&mut out, &absolute);
    out
}

fn push_lexical(out: &mut PathBuf, part: &Path) {
    for component in part.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_that_is_contains_or_sits_inside_a_protected_path_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let db_dir = tmp.path().join("data/db");
        std::fs::create_dir_all(&db_dir).unwrap();
        let work = tmp.path().join("data/work/t1");
        std::fs::create_dir_all(&work).unwrap();
        let protected = ProtectedPaths::nothing().with(&db_dir, "the database directory");
        assert!(protected.check(&work, "the work directory").is_ok());
        for (root, relation) in [
            (db_dir.clone(), " is "),
            (tmp.path().join("data"), " contains "),
            (tmp.path().to_path_buf(), " contains "),
            (db_dir.join("sub"), " sits inside "),
            (tmp.path().join("data/work/../db/x"), " sits inside "),
        ] {
            let error = protected.check(&root, "the work directory").unwrap_err();
            assert!(
                error.contains(relation) && error.contains("the database directory"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_symlink_to_a_protected_directory_is_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let db_dir = tmp.path().join("db");
        std::fs::create_dir_all(&db_dir).unwrap();
        let link = tmp.path().join("innocent");
        std::os::unix::fs::symlink(&db_dir, &link).unwrap();
        let protected = ProtectedPaths::nothing().with(&db_dir, "the database directory");
        assert!(protected.check(&link, "the work directory").is_err());
        // And the other way round: protecting through a symlink protects the target.
        let protected = ProtectedPaths::nothing().with(&link.join("x.db"), "the database");
        assert!(protected.check(&db_dir, "the work directory").is_err());
    }

    #[test]
    fn a_protected_file_not_created_yet_is_protected() {
        let tmp = tempfile::tempdir().unwrap();
        let protected =
            ProtectedPaths::nothing().with(&tmp.path().join("later/skillstate.toml"), "the config");
        assert!(protected.check(tmp.path(), "the work directory").is_err());
        assert!(
            protected
                .check(&tmp.path().join("elsewhere"), "the work directory")
                .is_ok()
        );
    }
}
