//! JSON helpers shared by every part: canonical form, state hashes, JSON pointers.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Serialises `value` with object keys sorted and no insignificant whitespace, so equal
/// documents always give equal bytes whatever the map ordering of the process that built them.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The hash recorded with every committed step: SHA-256 over the canonical form, lowercase hex.
pub fn state_hash(state: &Value) -> String {
    let digest = Sha256::digest(canonical(state).as_bytes());
    hex(&digest)
}

/// SHA-256 of arbitrary text, lowercase hex (used to prove a rebuilt prompt is byte-identical).
pub fn text_hash(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// Escapes one reference token for a JSON pointer (RFC 6901).
pub fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Builds a JSON pointer from reference tokens.
pub fn pointer<S: AsRef<str>>(tokens: &[S]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", escape_token(t.as_ref())))
        .collect()
}

/// Splits a JSON pointer into unescaped reference tokens; `None` when it is not a pointer.
pub fn pointer_tokens(pointer: &str) -> Option<Vec<String>> {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    let rest = pointer.strip_prefix('/')?;
    Some(
        rest.split('/')
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// `true` when `descendant` equals `ancestor` or lies below it.
pub fn pointer_is_within(descendant: &str, ancestor: &str) -> bool {
    descendant == ancestor
        || (descendant.starts_with(ancestor) && descendant[ancestor.len()..].starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":[1,2],"c":"x"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"c":"x","d":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
        assert_eq!(state_hash(&a), state_hash(&b));
        assert_ne!(state_hash(&a), state_hash(&json!({"b": 2})));
    }

    #[test]
    fn pointers_round_trip_escapes() {
        let p = pointer(&["a/b", "c~d"]);
        assert_eq!(p, "/a~1b/c~0d");
        assert_eq!(pointer_tokens(&p).unwrap(), vec!["a/b", "c~d"]);
        assert!(pointer_tokens("no-slash").is_none());
        assert!(pointer_is_within("/a/b", "/a"));
        assert!(!pointer_is_within("/ab", "/a"));
        assert!(pointer_is_within("/a", ""));
    }
}
