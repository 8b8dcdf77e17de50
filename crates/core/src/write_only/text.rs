//! Cleaning free text of write-only values.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde_json::Value;

use crate::secrets::{MIN_SECRET_LEN, REDACTED, Redactor};

/// The write-only values of a task, for cleaning free text: a rendered prompt, an observation,
/// a model's raw answer, an error message that quotes a value.
///
/// Every string and number is a secret, whatever its length. Those of at least
/// [`MIN_SECRET_LEN`] characters are replaced wherever they occur (with their JSON-escaped
/// form: [`Redactor`]); shorter ones only where they stand as a whole token (not inside a
/// longer word or number), so that a four-digit PIN does not garble every year in a text.
#[derive(Debug, Clone, Default)]
pub struct SecretValues {
    long: Redactor,
    /// Short values and their JSON-escaped forms, longest first.
    short: Vec<String>,
    /// Every value as written, for whole JSON numbers and strings.
    whole: BTreeSet<String>,
}

impl SecretValues {
    /// Adds every string and number inside `value` (object keys are not values).
    pub fn add_value(&mut self, value: &Value) {
        match value {
            Value::String(text) => self.add_text(text),
            Value::Number(number) => self.add_text(&number.to_string()),
            Value::Array(items) => items.iter().for_each(|item| self.add_value(item)),
            Value::Object(map) => map.values().for_each(|item| self.add_value(item)),
            Value::Null | Value::Bool(_) => {}
        }
    }

    pub fn add_text(&mut self, text: &str) {
        let text = text.trim();
        if text.is_empty() || text == REDACTED {
            return;
        }
        self.whole.insert(text.to_owned());
        if text.chars().count() >= MIN_SECRET_LEN {
            self.long.add(text);
            return;
        }
        let escaped = serde_json::to_string(text).unwrap_or_default();
        for form in [text, escaped.trim_matches('"')] {
            if !form.is_empty() && !self.short.iter().any(|s| s == form) {
                self.short.push(form.to_owned());
            }
        }
        self.short.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    pub fn extend(&mut self, other: &SecretValues) {
        for text in &other.whole {
            self.add_text(text);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.whole.is_empty()
    }

    /// `text` without any secret; borrowed when there was none.
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = self.long.redact(text);
        for secret in &self.short {
            if out.contains(secret.as_str())
                && let Some(replaced) = replace_tokens(&out, secret)
            {
                out = Cow::Owned(replaced);
            }
        }
        out
    }

    /// Cleans every string (and object key) inside `value`; a number that is a secret becomes
    /// `"[redacted]"`.
    pub fn scrub_json(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(text) => {
                if let Cow::Owned(clean) = self.scrub(text) {
                    *text = clean;
                }
            }
            Value::Number(number) => {
                if self.whole.contains(&number.to_string()) {
                    *value = Value::String(REDACTED.to_owned());
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.scrub_json(item)),
            Value::Object(map) => {
                let dirty: Vec<String> = map
                    .keys()
                    .filter(|k| matches!(self.scrub(k), Cow::Owned(_)))
                    .cloned()
                    .collect();
                for key in dirty {
                    if let Some(inner) = map.remove(&key) {
                        map.insert(self.scrub(&key).into_owned(), inner);
                    }
                }
                map.values_mut().for_each(|v| self.scrub_json(v));
            }
            Value::Null | Value::Bool(_) => {}
        }
    }
}

/// `text` with each occurrence of `secret` that is a whole token replaced; `None` when there
/// was none.
fn replace_tokens(text: &str, secret: &str) -> Option<String> {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut found = false;
    for (start, _) in text.match_indices(secret) {
        if start < copied {
            continue;
        }
        let end = start + secret.len();
        let before = text[..start].chars().next_back();
        let after = text[end..].chars().next();
        if before.is_some_and(word) || after.is_some_and(word) {
            continue;
        }
        out.push_str(&text[copied..start]);
        out.push_str(REDACTED);
        copied = end;
        found = true;
    }
    if !found {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}
