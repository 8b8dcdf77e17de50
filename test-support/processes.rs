//! Looking for processes that should be gone, for tests of the shell sandbox. Included with
//! `#[path]` like `skip.rs`.
#![allow(dead_code)]

/// Host processes whose command line contains `marker` (sleeps, their shells, bwrap), as
/// `pid: command line`.
pub fn survivors(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}
