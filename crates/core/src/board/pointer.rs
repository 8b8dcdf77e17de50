//! A parsed RFC 6901 JSON pointer: its unescaped reference tokens.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::escape_token;

/// A JSON pointer, checked against RFC 6901 and kept as unescaped tokens. `""` is the whole
/// document. Orders by tokens, so sorted pointers list an ancestor before its descendants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pointer {
    tokens: Vec<String>,
}

impl Pointer {
    /// The whole document (`""`).
    pub fn root() -> Self {
        Self { tokens: Vec::new() }
    }

    /// Parses `text` as an RFC 6901 pointer: `""`, or `/` followed by tokens in which `~` is
    /// only ever `~0` (a `~`) or `~1` (a `/`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Ok(Self::root());
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "\"{text}\" is not a JSON pointer: a pointer is \"\" (the whole document) or starts with \"/\", as in \"/{text}\""
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => {
                        return Err(format!(
                            "\"{text}\" is not a JSON pointer: \"~\" must be written \"~0\" and \"/\" inside a key \"~1\""
                        ));
                    }
                }
            }
            tokens.push(token);
        }
        Ok(Self { tokens })
    }

    pub fn from_tokens<S: Into<String>>(tokens: impl IntoIterator<Item = S>) -> Self {
        Self {
            tokens: tokens.into_iter().map(Into::into).collect(),
        }
    }

    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    pub fn is_root(&self) -> bool {
        self.tokens.is_empty()
    }

    /// This pointer with one more token.
    pub fn child(&self, token: impl Into<String>) -> Self {
        let mut tokens = self.tokens.clone();
        tokens.push(token.into());
        Self { tokens }
    }

    /// The pointer one level up; `None` for the root.
    pub fn parent(&self) -> Option<Self> {
        let (_, rest) = self.tokens.split_last()?;
        Some(Self {
            tokens: rest.to_vec(),
        })
    }

    /// Every proper ancestor, from the root down.
    pub fn ancestors(&self) -> impl Iterator<Item = Pointer> + '_ {
        (0..self.tokens.len()).map(|n| Pointer {
            tokens: self.tokens[..n].to_vec(),
        })
    }

    /// `true` when this pointer equals `other` or lies below it.
    pub fn is_within(&self, other: &Pointer) -> bool {
        self.tokens.starts_with(&other.tokens)
    }

    /// `true` when one of the two is within the other (they share a location).
    pub fn overlaps(&self, other: &Pointer) -> bool {
        self.is_within(other) || other.is_within(self)
    }

    /// The value at this location in `document`, if there is one. An array is indexed by a
    /// decimal index without leading zeros; `-` resolves to nothing.
    pub fn get<'a>(&self, document: &'a Value) -> Option<&'a Value> {
        let mut at = document;
        for token in &self.tokens {
            at = step(at, token)?;
        }
        Some(at)
    }
}

/// The member or element `token` names in `value`.
pub(crate) fn step<'a>(value: &'a Value, token: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) => map.get(token),
        Value::Array(items) => items.get(array_index(token)?),
        _ => None,
    }
}

/// The array index `token` names (RFC 6901: `0` or digits without a leading zero).
pub(crate) fn array_index(token: &str) -> Option<usize> {
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if valid { token.parse().ok() } else { None }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for token in &self.tokens {
            write!(f, "/{}", escape_token(token))?;
        }
        Ok(())
    }
}

impl TryFrom<String> for Pointer {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Pointer::parse(&text)
    }
}

impl From<Pointer> for String {
    fn from(pointer: Pointer) -> Self {
        pointer.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_prints_rfc_6901() {
        let p = Pointer::parse("/a~1b/c~0d/0").unwrap();
        assert_eq!(p.tokens(), ["a/b", "c~d", "0"]);
        assert_eq!(p.to_string(), "/a~1b/c~0d/0");
        assert!(Pointer::parse("").unwrap().is_root());
        assert_eq!(Pointer::parse("/").unwrap().tokens(), [""]);
        assert!(
            Pointer::parse("a")
                .unwrap_err()
                .contains("starts with \"/\"")
        );
        assert!(Pointer::parse("/a~2").unwrap_err().contains("~0"));
        assert!(Pointer::parse("/a~").is_err());
    }

    #[test]
    fn relations_and_lookup() {
        let a = Pointer::parse("/a").unwrap();
        let ab = Pointer::parse("/a/b").unwrap();
        let abc = Pointer::parse("/abc").unwrap();
        assert!(ab.is_within(&a) && !a.is_within(&ab) && a.overlaps(&ab));
        assert!(!abc.overlaps(&a));
        assert!(a.is_within(&Pointer::root()));
        assert_eq!(
            ab.ancestors().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["", "/a"]
        );
        let doc = json!({"a": {"b": [10, 20]}});
        assert_eq!(
            Pointer::parse("/a/b/1").unwrap().get(&doc),
            Some(&json!(20))
        );
        assert_eq!(Pointer::parse("/a/b/01").unwrap().get(&doc), None);
        assert_eq!(Pointer::parse("/a/b/-").unwrap().get(&doc), None);
        assert_eq!(Pointer::parse("/a/x").unwrap().get(&doc), None);
    }

    #[test]
    fn serde_goes_through_the_string_form() {
        let p: Pointer = serde_json::from_value(json!("/x~1y")).unwrap();
        assert_eq!(p.tokens(), ["x/y"]);
        assert_eq!(serde_json::to_value(&p).unwrap(), json!("/x~1y"));
        assert!(serde_json::from_value::<Pointer>(json!("x")).is_err());
    }
}
