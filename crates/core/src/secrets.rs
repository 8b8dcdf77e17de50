//! Keeping secret values out of everything skillstate stores or prints.
//!
//! A `Redactor` holds the secret values the runtime knows (model API keys, variables the
//! operator names as secret) and replaces each of them, wherever it occurs, with `[redacted]`.
//! It is applied where untrusted text enters the runtime — a model's answer, a tool's result,
//! an error message — before the text is validated, cut to a budget, stored or shown, so that a
//! secret split by a later cut can never survive in pieces.

use std::borrow::Cow;

use serde_json::Value;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Values shorter than this are not treated as secrets: redacting `none` or `x` (placeholder
/// keys of local model servers) would garble ordinary text and protect nothing.
pub const MIN_SECRET_LEN: usize = 8;

#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so that a secret containing another is replaced whole.
    values: Vec<String>,
}

impl Redactor {
    pub fn new<I, S>(values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut redactor = Self::default();
        for value in values {
            redactor.add(value);
        }
        redactor
    }

    /// Adds a secret value (ignored when shorter than [`MIN_SECRET_LEN`]). Its JSON-escaped
    /// form is added too, so a secret with quotes or backslashes is found inside JSON text.
    pub fn add(&mut self, value: impl Into<String>) {
        let value = value.into();
        let value = value.trim();
        if value.chars().count() < MIN_SECRET_LEN {
            return;
        }
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped.trim_matches('"');
        for form in [value, escaped] {
            if !self.values.iter().any(|v| v == form) {
                self.values.push(form.to_owned());
            }
        }
        self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    /// Adds every secret of `other`.
    pub fn extend(&mut self, other: &Redactor) {
        for value in &other.values {
            self.add(value.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret replaced; borrowed when there was nothing to replace.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
            }
        }
        out
    }

    /// `text` without a trailing piece that begins a secret (a proper prefix of one, of any
    /// length): what is left when a source stopped reading inside a secret. Applied after
    /// [`Redactor::redact`], by [`crate::outside::Outside`] for texts cut short.
    pub fn without_partial_tail<'t>(&self, text: &'t str) -> &'t str {
        let mut keep = text.len();
        for secret in &self.values {
            for (end, _) in secret.char_indices().skip(1) {
                let start = text.len().saturating_sub(end);
                if start < keep && text.is_char_boundary(start) && text[start..] == secret[..end] {
                    keep = start;
                }
            }
        }
        &text[..keep]
    }

    /// Redacts every string (and object key) inside `value`.
    pub fn redact_json(&self, value: &mut Value) {
        if self.values.is_empty() {
            return;
        }
        match value {
            Value::String(text) => {
                if let Cow::Owned(clean) = self.redact(text) {
                    *text = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(item)),
            Value::Object(map) => {
                let dirty: Vec<String> = map
                    .keys()
                    .filter(|k| matches!(self.redact(k), Cow::Owned(_)))
                    .cloned()
                    .collect();
                for key in dirty {
                    if let Some(inner) = map.remove(&key) {
                        map.insert(self.redact(&key).into_owned(), inner);
                    }
                }
                map.values_mut().for_each(|v| self.redact_json(v));
            }
            _ => {}
        }
    }
}

/// Shows how many values it holds, never the values.
impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_occurrence_and_json_form_is_replaced() {
        let r = Redactor::new(["sk-secret-12345", "short", "pa\"ss\\word-99"]);
        assert_eq!(
            r.redact("a sk-secret-12345 b sk-secret-12345"),
            "a [redacted] b [redacted]"
        );
        assert_eq!(r.redact("short stays"), "short stays");
        assert_eq!(
            r.redact(r#"{"k":"pa\"ss\\word-99"}"#),
            r#"{"k":"[redacted]"}"#
        );
        let mut v = json!({"sk-secret-12345": ["x sk-secret-12345", 1]});
        r.redact_json(&mut v);
        assert_eq!(v, json!({"[redacted]": ["x [redacted]", 1]}));
    }

    #[test]
    fn a_secret_inside_a_longer_one_does_not_leave_pieces() {
        let r = Redactor::new(["abcdefgh", "abcdefgh-ijklmnop"]);
        assert_eq!(r.redact("abcdefgh-ijklmnop"), "[redacted]");
    }
}
