//! Text that came from outside the process, held until it is redacted.
//!
//! Provider bodies of every status, a command's output, a file read by a tool, an MCP server's
//! result or stderr, an environment's event: each enters as an [`Outside`] where its bytes
//! arrive. The only ways back to a `String` take the [`Redactor`] and redact before they cut
//! ([`Outside::redacted`], [`Outside::clipped`], [`Outside::clipped_chars`],
//! [`Outside::json`]), so a secret can never be cut in two by a cap and survive in pieces.
//! There is no `Display`, `Deref`, `AsRef<str>` or accessor to the raw text, and `Debug` shows
//! only its length.
//!
//! A source that stops reading at a cap (an output limit, a line longer than a page) keeps what
//! it read and says so with [`Outside::cut_short`]: what it kept may end inside a secret whose
//! rest was never read, so redaction also drops a trailing piece of the text that begins a
//! secret (at most the longest secret's length less one byte). No source needs a look-ahead
//! buffer for that, whatever the secrets are.

use std::fmt;

use serde_json::Value;

use crate::secrets::Redactor;

/// Text from outside, not yet redacted.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Outside {
    text: String,
    /// The source stopped reading here: more followed that was never read.
    cut: bool,
}

/// What a clip kept, and whether it cut anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clipped {
    pub text: String,
    /// Something was left out: by the clip, or by the source before it.
    pub cut: bool,
}

impl Outside {
    /// A whole text.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            cut: false,
        }
    }

    /// Whole bytes, read as UTF-8 (invalid sequences become U+FFFD).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self::new(String::from_utf8_lossy(bytes).into_owned())
    }

    /// The first bytes of a longer text whose rest was not read. A character cut at the end is
    /// dropped (not turned into U+FFFD, which would hide the secret piece before it).
    pub fn cut_short(bytes: &[u8]) -> Self {
        let end = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        Self {
            text: String::from_utf8_lossy(&bytes[..end]).into_owned(),
            cut: true,
        }
    }

    /// Marks the text as the start of a longer one (see [`Outside::cut_short`]).
    pub fn followed_by_more(mut self, more: bool) -> Self {
        self.cut |= more;
        self
    }

    /// Length of the raw text in bytes (what the source read, before redaction).
    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Whether the source stopped before the end.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// The text with every secret replaced; a text cut short also loses a trailing piece that
    /// begins a secret.
    pub fn redacted(&self, secrets: &Redactor) -> String {
        let clean = secrets.redact(&self.text);
        if self.cut {
            secrets.without_partial_tail(&clean).to_owned()
        } else {
            clean.into_owned()
        }
    }

    /// Redacted, then at most `max_bytes` bytes, cut on a character boundary.
    pub fn clipped(&self, secrets: &Redactor, max_bytes: usize) -> Clipped {
        let mut text = self.redacted(secrets);
        let cut = self.cut || text.len() > max_bytes;
        if text.len() > max_bytes {
            let mut end = max_bytes;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        Clipped { text, cut }
    }

    /// Redacted, then at most `max_chars` characters.
    pub fn clipped_chars(&self, secrets: &Redactor, max_chars: usize) -> Clipped {
        let mut text = self.redacted(secrets);
        let mut cut = self.cut;
        if let Some((end, _)) = text.char_indices().nth(max_chars) {
            text.truncate(end);
            cut = true;
        }
        Clipped { text, cut }
    }

    /// The redacted text parsed as JSON, its strings redacted once more: a secret written
    /// with `\u` escapes only appears once they are decoded.
    pub fn json(&self, secrets: &Redactor) -> Result<Value, serde_json::Error> {
        let mut value = serde_json::from_str(&self.redacted(secrets))?;
        secrets.redact_json(&mut value);
        Ok(value)
    }
}

impl From<&Value> for Outside {
    /// A JSON value received from outside, as its compact text.
    fn from(value: &Value) -> Self {
        Self::new(value.to_string())
    }
}

impl fmt::Debug for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Outside({} bytes{})",
            self.text.len(),
            if self.cut { ", cut" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "sk-0123456789abcdef";

    #[test]
    fn a_secret_across_a_clip_leaves_nothing() {
        let secrets = Redactor::new([SECRET]);
        let text = format!("{}{SECRET}{}", "a".repeat(10), "b".repeat(10));
        for max in 0..text.len() + 2 {
            let clipped = Outside::new(text.clone()).clipped(&secrets, max);
            assert!(!clipped.text.contains("sk-0"), "{max}: {}", clipped.text);
            let chars = Outside::new(text.clone()).clipped_chars(&secrets, max);
            assert!(!chars.text.contains("sk-0"), "{max}: {}", chars.text);
        }
    }

    #[test]
    fn a_source_cut_inside_a_secret_drops_its_start() {
        let secrets = Redactor::new([SECRET]);
        let text = format!("abc {SECRET} def");
        for end in 0..text.len() {
            let kept = Outside::cut_short(&text.as_bytes()[..end]).redacted(&secrets);
            assert!(
                !kept.contains("sk-0") && !kept.ends_with("sk") && !kept.ends_with("sk-"),
                "{end}: {kept}"
            );
            assert!(kept.starts_with(&text[..end.min(4)]), "{end}: {kept}");
        }
    }

    #[test]
    fn a_cut_character_is_dropped_not_replaced() {
        let secrets = Redactor::new(["é-secret-value"]);
        let kept = Outside::cut_short(&"x é-secret-value".as_bytes()[..3]).redacted(&secrets);
        assert_eq!(kept, "x ");
    }

    #[test]
    fn a_secret_hidden_in_json_escapes_is_redacted_once_decoded() {
        let secrets = Redactor::new([SECRET]);
        let body = r#"{"m": "key \u0073k-0123456789abcdef"}"#;
        let value = Outside::new(body).json(&secrets).unwrap_or_default();
        assert_eq!(value["m"], "key [redacted]");
    }

    #[test]
    fn debug_shows_no_text() {
        let shown = format!("{:?}", Outside::new(SECRET));
        assert!(!shown.contains("sk-"), "{shown}");
    }
}
