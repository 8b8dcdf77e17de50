//! Keeping file access inside a work directory: relative paths only, no `..` above the root,
//! and no symlink that leads outside it.

use std::path::{Component, Path, PathBuf};

/// A directory that built-in tools may not leave.
#[derive(Debug, Clone)]
pub struct WorkDir {
    root: PathBuf,
}

impl WorkDir {
    pub fn new(root: &Path) -> Result<Self, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("work directory {}: {e}", root.display()))?;
        if !root.is_dir() {
            return Err(format!(
                "work directory {} is not a directory",
                root.display()
            ));
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The absolute path for `relative`, or why it is refused. `must_exist = false` allows a
    /// new file whose parent directory is inside the root.
    pub fn resolve(&self, relative: &str, must_exist: bool) -> Result<PathBuf, String> {
        let requested = Path::new(relative.trim());
        if requested.is_absolute() || relative.trim_start().starts_with('~') {
            return Err(format!(
                "`{relative}` is absolute; paths are relative to the work directory"
            ));
        }
        let mut lexical = PathBuf::new();
        for component in requested.components() {
            match component {
                Component::Normal(part) => lexical.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !lexical.pop() {
                        return Err(format!("`{relative}` leaves the work directory"));
                    }
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(format!(
                        "`{relative}` is absolute; paths are relative to the work directory"
                    ));
                }
            }
        }
        let joined = self.root.join(&lexical);
        // Follow symlinks as the OS would, then check where they really lead.
        let real = match joined.canonicalize() {
            Ok(real) => real,
            Err(_) if !must_exist => {
                if joined.symlink_metadata().is_ok() {
                    return Err(format!(
                        "`{relative}` is a symlink to a missing target; refusing to write through it"
                    ));
                }

                let parent = joined.parent().unwrap_or(&self.root);
                let name = joined
                    .file_name()
                    .ok_or_else(|| format!("`{relative}` names no file"))?;
                parent
                    .canonicalize()
                    .map_err(|_| format!("`{relative}`: its directory does not exist"))?
                    .join(name)
            }
            Err(e) => return Err(format!("`{relative}`: {e}")),
        };
        if !real.starts_with(&self.root) {
            return Err(format!(
                "`{relative}` resolves outside the work directory (through a symlink)"
            ));
        }
        Ok(real)
    }

    /// `path` relative to the root, for messages.
    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}
