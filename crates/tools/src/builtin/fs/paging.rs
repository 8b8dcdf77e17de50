//! `fs.read`: lines are streamed, so any offset in a file of any size works, and what one call
//! returns is capped in bytes, with a last line saying which `offset` continues. Memory stays
//! within the cap whatever the file holds (a skipped line is never buffered, a kept one only up
//! to the cap). What it read is an `Outside` until redacted: a line cut at the cap is redacted
//! before it is cut (a secret across the cut leaves no piece), and the lines shown are redacted
//! whole.

use std::io::{self, BufRead, BufReader, Read};

use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;

use super::Cancel;
use crate::builtin::confine::refusal;

/// Largest answer of one `fs.read`, in bytes (the marker line comes on top).
pub(super) const MAX_READ_BYTES: usize = 256 * 1024;

/// What the model asked for: `offset` is the first line (1-based), `limit` a number of lines.
/// Neither: the whole file, byte for byte (up to the cap).
#[derive(Debug, Clone, Copy)]
pub(super) struct Page {
    pub offset: Option<u64>,
    pub limit: Option<u64>,
}

pub(super) fn read(
    file: impl Read,
    given: &str,
    page: Page,
    cap: usize,
    cancel: &Cancel,
    secrets: &Redactor,
) -> Result<String, String> {
    let io_error = |e: io::Error| refusal(given, &e);
    let whole = page.offset.is_none() && page.limit.is_none();
    let offset = page.offset.unwrap_or(1).max(1);
    let limit = page.limit.unwrap_or(u64::MAX);
    let mut reader = BufReader::with_capacity(64 * 1024, file);

    let mut number = 1; // the line about to be read
    while number < offset {
        if !next_line(&mut reader, None, cancel).map_err(io_error)? {
            return Err(format!(
                "`{given}` has {} lines; offset {offset} is past its end",
                number - 1
            ));
        }
        number += 1;
    }

    let mut out: Vec<u8> = Vec::new();
    let mut line = Vec::new();
    let mut shown = 0;
    let mut marker = None;
    // The start of a single line longer than the cap, redacted and cut.
    let mut long_line = None;
    while shown < limit {
        line.clear();
        let room = cap - out.len();
        // One byte more than the room tells "does not fit" from "fits exactly".
        if !next_line(&mut reader, Some((&mut line, room + 1)), cancel).map_err(io_error)? {
            break;
        }
        if line.len() <= room {
            check_utf8(&line, number, given)?;
            out.extend_from_slice(&line);
            shown += 1;
            number += 1;
            continue;
        }
        if shown > 0 {
            marker = Some(format!(
                "[fs.read: stopped at the {cap}-byte cap after line {}; continue with offset={number}]",
                number - 1
            ));
            break;
        }
        // A single line longer than the whole cap: show its start, read as far as the cap
        // allows (its rest is never read), redacted, then cut to the cap.
        let valid = utf8_prefix(&line[..room], number, given)?;
        let start = Outside::cut_short(&line[..valid])
            .clipped(secrets, cap)
            .text;
        let cut = start.len();
        long_line = Some(start);
        // The rest of that line is not scanned here (it may be huge, even endless in effect):
        // the next line, if there is one, is simply the next offset.
        marker = Some(format!(
            "[fs.read: line {number} is longer than {cap} bytes; only its first {cut} bytes are shown; the next line, if any, is offset={}]",
            number + 1
        ));
        break;
    }
    if shown == 0 && marker.is_none() && offset > 1 {
        return Err(format!(
            "`{given}` has {} lines; offset {offset} is past its end",
            number - 1
        ));
    }
    if !whole && out.ends_with(b"\n") {
        out.pop();
        if out.ends_with(b"\r") {
            out.pop();
        }
    }
    // Every kept line was checked; a cut one is already redacted.
    let mut text = match long_line {
        Some(start) => start,
        None => {
            let lines = String::from_utf8(out).map_err(|_| not_text(number, given))?;
            // Whole lines, redacted whole; when the cap stopped the page, a secret that went on
            // past the last line shown (over a line break) leaves no piece either.
            Outside::new(lines)
                .followed_by_more(marker.is_some())
                .redacted(secrets)
        }
    };
    if let Some(marker) = marker {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&marker);
    }
    Ok(text)
}

/// Reads one line (with its `\n`), or `false` at the end of the file. With `keep`, appends at
/// most its limit of bytes to its buffer and leaves the rest of a longer line unread; without,
/// consumes the whole line and keeps nothing.
fn next_line(
    reader: &mut impl BufRead,
    mut keep: Option<(&mut Vec<u8>, usize)>,
    cancel: &Cancel,
) -> io::Result<bool> {
    let mut any = false;
    loop {
        cancel.check()?;
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok(any);
        }
        any = true;
        let (end, complete) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        let mut taken = end;
        if let Some((buffer, max)) = keep.as_mut() {
            taken = end.min(*max - buffer.len());
            buffer.extend_from_slice(&available[..taken]);
            if buffer.len() == *max {
                reader.consume(taken);
                return Ok(true);
            }
        }
        reader.consume(taken);
        if complete {
            return Ok(true);
        }
    }
}

fn not_text(number: u64, given: &str) -> String {
    format!("line {number} of `{given}` is not UTF-8 text; fs.read reads text files only")
}

fn check_utf8(line: &[u8], number: u64, given: &str) -> Result<(), String> {
    std::str::from_utf8(line)
        .map(|_| ())
        .map_err(|_| not_text(number, given))
}

/// The length of the longest valid UTF-8 prefix of a line cut at an arbitrary byte.
fn utf8_prefix(cut: &[u8], number: u64, given: &str) -> Result<usize, String> {
    match std::str::from_utf8(cut) {
        Ok(_) => Ok(cut.len()),
        Err(e) if e.error_len().is_none() => Ok(e.valid_up_to()),
        Err(_) => Err(not_text(number, given)),
    }
}
