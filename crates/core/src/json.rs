//! JSON helpers shared by every part: canonical form, state hashes, JSON pointers.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Serialises `value` with object keys sorted and no insignificant whitespace, so equal
/// documents always give equal bytes whatever the map ordering of the process that built them.
pub fn canonical(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // Only serde_json's own output went in, which is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Strings and numbers are written by serde_json itself (its escaping, its number format),
/// straight into `out`: no allocation per key or scalar.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &(impl serde::Serialize + ?Sized), out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail, and strings, numbers, booleans and null always serialize.
    let _ = serde_json::to_writer(&mut *out, value);
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

/// A JSON pointer as a message shows it to a person: the pointer itself, and for the empty
/// pointer (the whole document) `the whole <document> (pointer "")`, so that no message
/// reads as if a name were missing ("state (root):  is read-only"). Every message that puts
/// a pointer into a sentence goes through this one function.
pub fn pointer_for_humans(pointer: &str, document: &str) -> String {
    if pointer.is_empty() {
        format!("the whole {document} (pointer \"\")")
    } else {
        pointer.to_owned()
    }
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
    fn the_empty_pointer_is_named_as_the_whole_document() {
        assert_eq!(
            pointer_for_humans("", "state"),
            "the whole state (pointer \"\")"
        );
        assert_eq!(pointer_for_humans("/a~1b", "state"), "/a~1b");
    }

    #[test]
    fn canonical_form_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":[1,2],"c":"x"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"c":"x","d":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
        assert_eq!(state_hash(&a), state_hash(&b));
        assert_ne!(state_hash(&a), state_hash(&json!({"b": 2})));
    }

    /// The canonical form is serde_json's compact output of the document with every object's
    /// keys inserted in sorted order: the bytes every stored state hash was computed over.
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            scalar => scalar.clone(),
        }
    }

    #[test]
    fn canonical_form_is_serde_jsons_output_with_sorted_keys() {
        let tricky = json!({
            "z\"q": "line\nbreak \u{1} tab\t \u{e9}\u{1F600} </script>",
            "": [1.5, -0.0, 1e300, 18446744073709551615u64, -9223372036854775808i64, null, true],
            "a": {"\u{7f}": false, "B": {}, "b": [], "aa": "\\"},
            "\u{e9}": 0
        });
        assert_eq!(
            canonical(&tricky),
            serde_json::to_string(&sorted(&tricky)).unwrap()
        );
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
