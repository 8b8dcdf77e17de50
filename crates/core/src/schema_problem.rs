//! Schema problems, and the only way to turn one into text: for one reader.
//!
//! The jsonschema crate's error text quotes the instance it judged — `{"pub": …, "vault": …}
//! has more than 2 properties` — and that instance may be a whole board, part of which the
//! reader may not see, or a state holding write-only values. So no error leaves
//! [`crate::StateSchema`] as the crate's text: each becomes a [`SchemaProblem`] — its instance
//! location, its keyword, and a description written without the instance (the crate's masked
//! form: "the value", never the value) — whose only renderer, [`SchemaProblem::render`], takes
//! the reader's [`ReaderView`]:
//!
//! - at a location the reader sees whole (within one of its reads, and neither write-only nor
//!   inside a write-only value), the problem is shown with its description: whatever that names
//!   (a missing required member, an unexpected key, a bad property name) is a member of the
//!   location, which the reader sees too;
//! - at or inside a write-only value, it is shown at the write-only location, with its keyword,
//!   and its description only when that names nothing of the instance (what the schema asks,
//!   never a key or a count of the value);
//! - anywhere else — outside the reads, or at an ancestor of a read whose value holds parts the
//!   reader cannot see (the root's `maxProperties`, `required`, `dependentRequired`,
//!   `propertyNames`, an `if`/`then` that looks at other members) — it is shown at the deepest
//!   part of its location the reader may name, as a rule that involves a part it cannot read:
//!   no keyword, no names, no values.
//!
//! What a renderer cannot hide is that a write was refused: a schema can make that depend on
//! parts a reader does not see (a root `maxProperties`, an `if` on a hidden member), and the
//! refusal itself is the answer the writer needs.

use serde_json::Value;

use crate::board::Pointer;
use crate::write_only::WriteOnly;

/// One way an instance fails a schema, kept without the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaProblem {
    location: Pointer,
    keyword: String,
    /// What the schema asks, written without the instance's values. It may name members of
    /// `location` (a required one, an unexpected key).
    described: String,
    /// Whether `described` says something taken from the instance (its keys, how many items it
    /// has), not from the schema alone.
    from_instance: bool,
}

/// A [`SchemaProblem`] as one reader may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownProblem {
    /// Where, as far as the reader may name it (JSON pointer into the instance).
    pub pointer: String,
    pub message: String,
}

/// What a reader may see of a document: the locations it reads (all of them when `None`) and
/// the schema's write-only locations, whose values it never reads.
#[derive(Clone, Copy)]
pub struct ReaderView<'a> {
    reads: Option<&'a [Pointer]>,
    write_only: &'a WriteOnly,
}

/// How much of a location a reader sees.
enum Seen {
    /// Every member and value (write-only values excepted, which no description quotes).
    Whole,
    /// The write-only location at or above it.
    WriteOnly(Pointer),
    /// Only this part of its location, which leads to something it reads.
    Partly(Pointer),
}

impl<'a> ReaderView<'a> {
    /// A reader of the whole document, but for its write-only values.
    pub fn whole(write_only: &'a WriteOnly) -> Self {
        Self {
            reads: None,
            write_only,
        }
    }

    /// A reader of `reads` only (a board's scope), write-only values excepted.
    pub fn reads(reads: &'a [Pointer], write_only: &'a WriteOnly) -> Self {
        Self {
            reads: Some(reads),
            write_only,
        }
    }

    /// Whether the reader reads everything at `location` (write-only values excepted).
    pub fn reads_within(&self, location: &Pointer) -> bool {
        match self.reads {
            None => true,
            Some(reads) => reads.iter().any(|read| location.is_within(read)),
        }
    }

    /// Whether the reader may learn that `location` exists: it lies within a read or on the
    /// way to one, and not inside a write-only value.
    pub fn may_name(&self, location: &Pointer) -> bool {
        let on_the_way = match self.reads {
            None => true,
            Some(reads) => reads.iter().any(|read| location.overlaps(read)),
        };
        on_the_way
            && !location
                .ancestors()
                .any(|above| self.write_only.covers(&above.to_string()))
    }

    /// The deepest part of `location` (a JSON pointer) the reader may name: `location` itself,
    /// the write-only location it lies in, or the ancestor on the way to a read where it leaves
    /// the reads. A text that is not a pointer is named as the root.
    pub fn nameable(&self, location: &str) -> String {
        let Ok(location) = Pointer::parse(location) else {
            return String::new();
        };
        match self.seen(&location) {
            Seen::Whole => location.to_string(),
            Seen::WriteOnly(at) | Seen::Partly(at) => at.to_string(),
        }
    }

    fn seen(&self, location: &Pointer) -> Seen {
        let mut named = Pointer::root();
        for token in location.tokens() {
            if !self.write_only.is_empty() && self.write_only.covers(&named.to_string()) {
                return Seen::WriteOnly(named);
            }
            let next = named.child(token.clone());
            if !self.may_name(&next) {
                return Seen::Partly(named);
            }
            named = next;
        }
        if !self.write_only.is_empty() && self.write_only.covers(&named.to_string()) {
            Seen::WriteOnly(named)
        } else if self.reads_within(&named) {
            Seen::Whole
        } else {
            Seen::Partly(named)
        }
    }
}

impl SchemaProblem {
    /// The problem `error` describes, without its instance.
    pub(crate) fn of_error(error: &jsonschema::ValidationError<'_>) -> Self {
        use jsonschema::error::ValidationErrorKind as Kind;
        let location = Pointer::parse(error.instance_path().as_str()).unwrap_or_else(|_| {
            // The validator's locations are pointers; should one not parse, the problem is
            // placed at the root, which no reader of a part sees whole.
            Pointer::root()
        });
        let masked = || error.masked_with("the value").to_string();
        let (described, from_instance) = match error.kind() {
            // The crate writes the `not` subschema, which may reference anything of the schema.
            Kind::Not { .. } => (
                "the value is valid against the schema under `not`, which it must not be"
                    .to_owned(),
                false,
            ),
            // The crate quotes the key the inner error judged, unmasked.
            Kind::PropertyNames { error: inner } => {
                let key = match inner.instance().as_ref() {
                    Value::String(key) => serde_json::to_string(key).unwrap_or_default(),
                    _ => "a key".to_owned(),
                };
                (
                    format!(
                        "the property name {key} is not allowed: {}",
                        inner.masked_with("it")
                    ),
                    true,
                )
            }
            Kind::AdditionalProperties { .. }
            | Kind::UnevaluatedProperties { .. }
            | Kind::AdditionalItems { .. }
            | Kind::UnevaluatedItems { .. } => (masked(), true),
            _ => (masked(), false),
        };
        Self {
            location,
            keyword: error.kind().keyword().to_owned(),
            described,
            from_instance,
        }
    }

    /// Where the problem is, in the instance (for the code that decides; never shown as is).
    pub fn location(&self) -> &Pointer {
        &self.location
    }

    /// The schema keyword that failed.
    pub fn keyword(&self) -> &str {
        &self.keyword
    }

    /// The problem as `reader` may read it (the rules of the module documentation).
    pub fn render(&self, reader: &ReaderView<'_>) -> ShownProblem {
        match reader.seen(&self.location) {
            Seen::Whole => ShownProblem {
                pointer: self.location.to_string(),
                message: self.described.clone(),
            },
            Seen::WriteOnly(at) => {
                let inside = if at == self.location {
                    "the write-only value here (not shown)"
                } else {
                    "a part of the write-only value here (not shown)"
                };
                let message = if self.from_instance {
                    format!("{inside} breaks the schema's `{}`", self.keyword)
                } else {
                    format!(
                        "{inside} breaks the schema's `{}`: {}",
                        self.keyword, self.described
                    )
                };
                ShownProblem {
                    pointer: at.to_string(),
                    message,
                }
            }
            Seen::Partly(at) => ShownProblem {
                pointer: at.to_string(),
                message: "a rule that involves a part you cannot read is broken (it is not shown)"
                    .to_owned(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StateSchema;
    use serde_json::json;

    fn pointers(list: &[&str]) -> Vec<Pointer> {
        list.iter().map(|p| Pointer::parse(p).unwrap()).collect()
    }

    fn shown(schema: &StateSchema, instance: &Value, reads: Option<&[&str]>) -> Vec<ShownProblem> {
        let reads = reads.map(pointers);
        let view = match &reads {
            Some(reads) => ReaderView::reads(reads, schema.write_only()),
            None => ReaderView::whole(schema.write_only()),
        };
        schema
            .violations(instance)
            .iter()
            .map(|p| p.render(&view))
            .collect()
    }

    #[test]
    fn nothing_of_the_instance_is_quoted() {
        let schema = StateSchema::compile(json!({
            "type": "object",
            "maxProperties": 2,
            "properties": {"pub": {"type": "string", "maxLength": 3}}
        }))
        .unwrap();
        let board = json!({"pub": "SECRETish", "vault": {"k": "HIDDEN-VALUE"}, "x": 1});
        let whole = shown(&schema, &board, None);
        assert_eq!(whole.len(), 2, "{whole:?}");
        for problem in &whole {
            assert!(!problem.message.contains("HIDDEN-VALUE"), "{problem:?}");
            assert!(!problem.message.contains("SECRETish"), "{problem:?}");
        }
        assert_eq!(whole[0].pointer, "");
        assert_eq!(whole[0].message, "the value has more than 2 properties");
        assert_eq!(whole[1].pointer, "/pub");
        assert_eq!(whole[1].message, "the value is longer than 3 characters");
    }

    #[test]
    fn a_reader_of_a_part_sees_only_what_lies_within_its_reads() {
        let schema = StateSchema::compile(json!({
            "type": "object",
            "maxProperties": 2,
            "required": ["vault"],
            "dependentRequired": {"pub": ["vault"]},
            "propertyNames": {"pattern": "^[a-z]+$"},
            "properties": {
                "pub": {"type": "object", "required": ["must"], "additionalProperties": false, "properties": {"must": {}}},
                "deep": {"type": "object", "properties": {"mine": {}, "theirs": {"type": "integer"}}}
            }
        }))
        .unwrap();
        let board = json!({"pub": {"extra": 1}, "deep": {"mine": 1, "theirs": "x"}, "VAULT_1": 2});
        let got = shown(&schema, &board, Some(&["/pub", "/deep/mine"]));
        let rendered = format!("{got:?}");
        for hidden in [
            "vault",
            "VAULT_1",
            "theirs",
            "maxProperties",
            "dependentRequired",
        ] {
            assert!(!rendered.contains(hidden), "{hidden} in {rendered}");
        }
        // The root's rules, and /deep/theirs, are named only as far as the reader may name them.
        assert!(got.iter().any(|p| p.pointer.is_empty()));
        assert!(got.iter().any(|p| p.pointer == "/deep"));
        // Its own part is explained in full.
        assert!(
            got.iter()
                .any(|p| p.pointer == "/pub" && p.message.contains("\"must\" is a required"))
        );
        assert!(
            got.iter()
                .any(|p| p.pointer == "/pub" && p.message.contains("'extra'")),
            "{got:?}"
        );
    }

    #[test]
    fn write_only_values_keep_their_keys_and_values() {
        let schema = StateSchema::compile(json!({
            "type": "object",
            "properties": {
                "token": {"writeOnly": true, "type": "object", "additionalProperties": false,
                          "properties": {"v": {"type": "string", "pattern": "^sk-"}}}
            }
        }))
        .unwrap();
        let state = json!({"token": {"v": "pw-LEAKED", "KEYNAME": 1}});
        let got = shown(&schema, &state, None);
        let rendered = format!("{got:?}");
        assert!(!rendered.contains("KEYNAME"), "{rendered}");
        assert!(!rendered.contains("LEAKED"), "{rendered}");
        assert!(got.iter().all(|p| p.pointer == "/token"), "{got:?}");
        assert!(
            rendered.contains("does not match \\\"^sk-\\\""),
            "{rendered}"
        );
    }
}
