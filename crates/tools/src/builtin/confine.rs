//! Keeping file access inside a work directory.
//!
//! The work directory is opened once, as a directory handle (`cap_std::fs::Dir`); that is the
//! only place with ambient authority. Every later open, listing, stat and rename goes through
//! the handle, and cap-std resolves each path beneath it (`openat2` with `RESOLVE_BENEATH` on
//! Linux ≥ 5.6, an equivalent component-by-component walk elsewhere): the kernel refuses an
//! escape at the moment of access, so a symlink swapped in between a check and an open cannot
//! lead outside. No path is resolved first and then opened again by name.
//!
//! Before that, [`WorkDir::locate`] reads the path the model gave, through the same handle, to
//! refuse clearly (absolute, `..` above the root, a symlink leading outside) and to follow an
//! absolute symlink that points back inside (which `RESOLVE_BENEATH` alone refuses). Its answer
//! is only a path to open through the handle again: it is never trusted to be safe.
//!
//! Opening a file for reading refuses anything that is not a regular file (FIFO, socket,
//! device): the open itself never blocks (`O_NONBLOCK`, `O_NOCTTY`, no final symlink) and the
//! type is checked on the opened handle (`fstat`).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, FileType, FileTypeExt, Metadata, OpenOptions, OpenOptionsExt};

use super::ProtectedPaths;

/// Symlinks followed for one path before giving up (Linux's own limit).
const MAX_SYMLINKS: usize = 40;

/// A directory that built-in tools may not leave.
#[derive(Debug, Clone)]
pub struct WorkDir {
    /// The canonical path, for messages, for child processes' working directory and to
    /// recognise absolute symlinks that point back inside.
    root: PathBuf,
    /// The directory itself: every file access goes through this handle.
    dir: Arc<Dir>,
}

impl WorkDir {
    /// The only way to a confined root: `root` must exist, be a directory and stay apart from
    /// every `protected` path (it may not be, contain or sit inside one).
    pub fn new(root: &Path, protected: &ProtectedPaths) -> Result<Self, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("work directory {}: {e}", root.display()))?;
        protected.check(&root, "the work directory")?;
        if !root.is_dir() {
            return Err(format!(
                "work directory {} is not a directory",
                root.display()
            ));
        }
        // The one use of ambient authority: opening the root.
        let dir = Dir::open_ambient_dir(&root, ambient_authority())
            .map_err(|e| format!("work directory {}: {e}", root.display()))?;
        Ok(Self {
            root,
            dir: Arc::new(dir),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The handle every file operation goes through.
    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Where `given` leads, as a path relative to the root with every symlink expanded (`.`
    /// for the root itself), or why it is refused. With `may_be_missing`, the last component
    /// may not exist yet (a file about to be created); its directory must.
    ///
    /// The answer is read through the handle but is only advice: open it through the handle
    /// (`dir()`, [`open_regular`](Self::open_regular)), never by path from outside.
    pub fn locate(&self, given: &str, may_be_missing: bool) -> Result<PathBuf, String> {
        let mut pending: VecDeque<Part> = lexical(given)?.into_iter().map(Part::Name).collect();
        let mut resolved = PathBuf::new();
        let mut links = 0;
        let mut last_link: Option<PathBuf> = None;
        let escape = |through: &Option<PathBuf>| match through {
            Some(link) => format!(
                "`{given}` leads outside the work directory through the symlink `{}`",
                link.display()
            ),
            None => format!("`{given}` leads outside the work directory"),
        };
        while let Some(part) = pending.pop_front() {
            let name = match part {
                Part::Parent => {
                    // Only a symlink's target brings `..` here (the path given was normalised).
                    if !resolved.pop() {
                        return Err(escape(&last_link));
                    }
                    continue;
                }
                Part::Name(name) => name,
            };
            let candidate = resolved.join(&name);
            let meta = match self.dir.symlink_metadata(&candidate) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if pending.is_empty() && may_be_missing {
                        resolved = candidate;
                        continue;
                    }
                    return Err(if pending.is_empty() {
                        format!("`{given}` does not exist")
                    } else {
                        format!(
                            "`{given}`: the directory `{}` does not exist",
                            candidate.display()
                        )
                    });
                }
                Err(e) => return Err(refusal(given, &e)),
            };
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(format!(
                        "`{given}`: more than {MAX_SYMLINKS} symlinks to follow (a loop?)"
                    ));
                }
                let target = self
                    .dir
                    .read_link_contents(&candidate)
                    .map_err(|e| refusal(given, &e))?;
                last_link = Some(candidate);
                let target = if target.is_absolute() {
                    let Ok(inside) = target.strip_prefix(&self.root) else {
                        return Err(escape(&last_link));
                    };
                    resolved.clear();
                    inside.to_path_buf()
                } else {
                    target
                };
                for component in target.components().rev() {
                    match component {
                        Component::Normal(part) => pending.push_front(Part::Name(part.into())),
                        Component::ParentDir => pending.push_front(Part::Parent),
                        Component::CurDir => {}
                        Component::RootDir | Component::Prefix(_) => {
                            return Err(escape(&last_link));
                        }
                    }
                }
                continue;
            }
            if !pending.is_empty() && !meta.is_dir() {
                return Err(format!(
                    "`{given}`: `{}` is not a directory",
                    candidate.display()
                ));
            }
            resolved = candidate;
        }
        Ok(if resolved.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            resolved
        })
    }

    /// Opens `located` (from [`locate`](Self::locate)) for reading, only if it is a regular
    /// file. `given` is the path as the model wrote it, for messages.
    pub(crate) fn open_regular(
        &self,
        located: &Path,
        given: &str,
    ) -> Result<(File, Metadata), String> {
        open_regular_in(&self.dir, located, given)
    }
}

/// Opens `name` beneath `dir` for reading, only if it is a regular file: the open never blocks
/// (`O_NONBLOCK`: a FIFO without a writer, `O_NOCTTY`: a terminal), never follows a final
/// symlink, and the type is checked on the opened handle. A cheap `lstat` first spares
/// devices even the open (some act on open); it is not what keeps the tool safe — `fstat` is.
pub(crate) fn open_regular_in(
    dir: &Dir,
    name: &Path,
    given: &str,
) -> Result<(File, Metadata), String> {
    if let Ok(meta) = dir.symlink_metadata(name) {
        not_regular(given, &meta.file_type())?;
    }
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .nonblock(true)
        .custom_flags(libc::O_NOCTTY);
    let file = dir
        .open_with(name, &options)
        .map_err(|e| refusal(given, &e))?;
    let meta = file.metadata().map_err(|e| refusal(given, &e))?;
    not_regular(given, &meta.file_type())?;
    Ok((file, meta))
}

/// `Err` naming what `kind` is, unless it is a regular file.
pub(crate) fn not_regular(given: &str, kind: &FileType) -> Result<(), String> {
    if kind.is_file() {
        return Ok(());
    }
    if kind.is_dir() {
        return Err(format!("`{given}` is a directory; use fs.list"));
    }
    Err(format!(
        "`{given}` is {}, not a regular file; the fs tools only read and write regular files",
        kind_name(kind)
    ))
}

/// "a named pipe (FIFO)", "a socket", ... for messages.
pub(crate) fn kind_name(kind: &FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else if kind.is_symlink() {
        "a symlink"
    } else if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "a special file"
    }
}

/// The message for an I/O error on `given`, recognising a refused escape.
pub(crate) fn refusal(given: &str, error: &io::Error) -> String {
    if is_escape(error) {
        return format!("`{given}` leads outside the work directory (through a symlink)");
    }
    match (error.kind(), error.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => format!("`{given}` does not exist"),
        (_, Some(libc::ELOOP)) => format!(
            "`{given}` turned into a symlink while being opened (it is being changed); try again"
        ),
        (io::ErrorKind::NotADirectory, _) => {
            format!("`{given}`: a part of the path is not a directory")
        }
        (io::ErrorKind::PermissionDenied, _) => format!("`{given}`: permission denied"),
        _ => format!("`{given}`: {error}"),
    }
}

/// cap-std's refusal of a path that would leave the directory handle.
fn is_escape(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied
        && error.to_string().contains("outside of the filesystem")
}

enum Part {
    Name(OsString),
    Parent,
}

/// `given` without `.` and with `..` applied, refusing absolute paths and `..` above the root.
fn lexical(given: &str) -> Result<Vec<OsString>, String> {
    let trimmed = given.trim();
    let absolute = || format!("`{given}` is absolute; paths are relative to the work directory");
    if trimmed.starts_with('~') {
        return Err(absolute());
    }
    let mut parts: Vec<OsString> = Vec::new();
    for component in Path::new(trimmed).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(format!(
                        "`{given}` leaves the work directory (`..` above its root)"
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(absolute()),
        }
    }
    Ok(parts)
}
