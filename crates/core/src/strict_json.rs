//! Strict parsing of JSON text that a model (or any other untrusted party) wrote.
//!
//! `serde_json` on its own keeps the last of duplicate object keys and silently rounds integers
//! beyond 2^53 to the nearest double. Both let a reader and a writer disagree about what a
//! document says, so this parser refuses them, with the JSON pointer of the offending value:
//!
//! - an object key that appears twice in one object;
//! - a number whose magnitude exceeds 2^53 (I-JSON, RFC 7493 §2.2): JavaScript clients and every
//!   double-precision reader lose its exact value. Without `arbitrary_precision` serde_json cannot
//!   tell `1e20` from `100000000000000000000`, so every number beyond ±2^53 is refused and the
//!   writer is told to use a string for exact big values.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::json::escape_token;

/// 2^53: the largest magnitude up to which every integer has an exact IEEE double.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Why a text is not acceptable JSON. `pointer` locates the offending value for duplicate keys
/// and big numbers; for syntax errors it is empty and `line`/`column` say where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrictJsonError {
    pub pointer: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// `true` for a syntax error (the text is not JSON at all), `false` for a refused value.
    pub syntax: bool,
}

impl fmt::Display for StrictJsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StrictJsonError {}

/// Parses `text` as one JSON value, refusing duplicate keys and numbers beyond ±2^53.
pub fn parse_strict(text: &str) -> Result<Value, StrictJsonError> {
    let refused = RefCell::new(None);
    let mut path = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let result = StrictValue {
        path: &mut path,
        refused: &refused,
    }
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value));
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(match refused.into_inner() {
            Some((pointer, message)) => StrictJsonError {
                pointer,
                line: error.line(),
                column: error.column(),
                message,
                syntax: false,
            },
            None => StrictJsonError {
                pointer: String::new(),
                line: error.line(),
                column: error.column(),
                message: error.to_string(),
                syntax: true,
            },
        }),
    }
}

/// A value at `path`; records the first refusal in `refused` (serde errors carry only text).
struct StrictValue<'p> {
    path: &'p mut Vec<String>,
    refused: &'p RefCell<Option<(String, String)>>,
}

impl StrictValue<'_> {
    fn refuse<E: serde::de::Error>(&self, message: String) -> E {
        let pointer: String = self
            .path
            .iter()
            .map(|t| format!("/{}", escape_token(t)))
            .collect();
        let text = format!("{pointer}: {message}");
        self.refused.borrow_mut().get_or_insert((pointer, message));
        E::custom(text)
    }

    fn big_number<E: serde::de::Error>(&self, shown: String) -> E {
        self.refuse(format!(
            "the number {shown} is beyond ±2^53 ({MAX_EXACT_INTEGER}), where JSON readers lose precision; write exact big numbers as a string, e.g. \"{shown}\""
        ))
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        if v.unsigned_abs() > MAX_EXACT_INTEGER {
            return Err(self.big_number(v.to_string()));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        if v > MAX_EXACT_INTEGER {
            return Err(self.big_number(v.to_string()));
        }
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        // Every double beyond 2^53 is integral, and most integers there have no exact double.
        if v.abs() > MAX_EXACT_INTEGER as f64 {
            return Err(self.big_number(format!("{v:e}")));
        }
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| self.refuse(format!("{v} is not a JSON number")))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            self.path.push(items.len().to_string());
            let next = seq.next_element_seed(StrictValue {
                path: &mut *self.path,
                refused: self.refused,
            });
            self.path.pop();
            match next? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let duplicate = map.contains_key(&key);
            self.path.push(key);
            if duplicate {
                let key = self.path.last().cloned().unwrap_or_default();
                return Err(self.refuse(format!(
                    "the key \"{key}\" appears twice in one object; JSON readers disagree on which one counts, so write each key once"
                )));
            }
            let value = access.next_value_seed(StrictValue {
                path: &mut *self.path,
                refused: self.refused,
            });
            let key = self.path.pop().unwrap_or_default();
            map.insert(key, value?);
        }
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_ordinary_json_like_serde_json() {
        let text = r#"{"a": [1, -2, 3.5, true, null, "x"], "b": {"c": {}}, "d": 9007199254740992}"#;
        assert_eq!(
            parse_strict(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(
            parse_strict("-9007199254740992").unwrap(),
            json!(-9007199254740992i64)
        );
    }

    #[test]
    fn syntax_errors_keep_their_position() {
        let err = parse_strict("{\"a\": 1,\n}").unwrap_err();
        assert!(err.syntax);
        assert_eq!(err.line, 2);
        assert!(parse_strict("{} trailing").unwrap_err().syntax);
    }
}
