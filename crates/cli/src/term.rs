//! Everything the binary prints goes through here: secret values are replaced and control
//! characters are escaped, so that a model's answer, a tool's output or a hostile skill can
//! neither leak a key to the terminal nor drive the terminal with escape sequences (moving the
//! cursor, rewriting earlier lines, setting the window title, hiding text).
//!
//! Use `outln!`/`out!` for stdout and `errln!`/`err!` for stderr instead of `println!` and
//! friends. Only `show --prompt` and `show --observation` write exact bytes, and only when
//! stdout is not a terminal (a file or a pipe gets the bytes whose hash was recorded).

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use skillstate_core::secrets::Redactor;

static SECRETS: OnceLock<Redactor> = OnceLock::new();

/// Sets the secret values every printed text is cleaned of (once, at start-up).
pub fn install_secrets(secrets: Redactor) {
    let _ = SECRETS.set(secrets);
}

/// `text` with secrets replaced and control characters escaped; newlines and tabs stay.
pub fn clean(text: &str) -> Cow<'_, str> {
    let redacted = match SECRETS.get() {
        Some(secrets) => secrets.redact(text),
        None => Cow::Borrowed(text),
    };
    if !redacted.chars().any(needs_escape) {
        return redacted;
    }
    let mut out = String::with_capacity(redacted.len() + 16);
    for c in redacted.chars() {
        if needs_escape(c) {
            if (c as u32) < 0x100 {
                out.push_str(&format!("\\x{:02x}", c as u32));
            } else {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// C0 controls but newline and tab, DEL, C1 controls (8-bit CSI and friends), and the
/// Unicode controls that reorder or hide text (bidirectional overrides and isolates).
fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes `text` cleaned to stdout (errors such as a closed pipe are ignored, as `print!`
/// would panic on them).
pub fn write_out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(clean(text).as_bytes());
}

pub fn write_err(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(clean(text).as_bytes());
}

/// Writes `text` to stdout as exact bytes when stdout is a file or a pipe (so it can be hashed
/// and diffed), and cleaned when it is a terminal.
pub fn write_exact(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if stdout.is_terminal() {
        stdout.write_all(clean(text).as_bytes())?;
    } else {
        let redacted = match SECRETS.get() {
            Some(secrets) => secrets.redact(text),
            None => Cow::Borrowed(text),
        };
        stdout.write_all(redacted.as_bytes())?;
    }
    stdout.flush()
}

/// A writer for log lines (tracing): each write is cleaned before it reaches stderr.
pub struct CleanStderr;

impl Write for CleanStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_err(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[macro_export]
macro_rules! outln {
    () => { $crate::term::write_out("\n") };
    ($($arg:tt)*) => { $crate::term::write_out(&format!("{}\n", format_args!($($arg)*))) };
}

#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::term::write_out(&format!($($arg)*)) };
}

#[macro_export]
macro_rules! errln {
    () => { $crate::term::write_err("\n") };
    ($($arg:tt)*) => { $crate::term::write_err(&format!("{}\n", format_args!($($arg)*))) };
}

#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => { $crate::term::write_err(&format!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls_and_keeps_text() {
        assert_eq!(clean("plain\ttext\nline"), "plain\ttext\nline");
        assert_eq!(
            clean("ship\u{1b}[2J\u{1b}]0;owned\u{7}(x)"),
            "ship\\x1b[2J\\x1b]0;owned\\x07(x)"
        );
        assert_eq!(clean("a\rb\u{9b}c"), "a\\x0db\\x9bc");
        assert_eq!(clean("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(clean("naïve café ✓"), "naïve café ✓");
    }
}
