//! Random boards for the projection property tests (core, runtime, server), included with
//! `#[path]`: a board schema with root-level and cross-member keywords (maxProperties,
//! minProperties, required, dependentRequired, dependentSchemas, if/then/else, propertyNames,
//! additionalProperties: false, patternProperties, anyOf), an initial state it accepts, a
//! scope (reads and writes), the writes a writer of that scope attempts (valid and not), and
//! the changes another writer makes to what the scope does not read.
//!
//! Every name and string a limited reader must never see is a distinctive token (`zq` and
//! random letters), so "nothing hidden appears" is an exact substring check:
//! [`BoardCase::hidden_in`] lists the tokens at locations outside the reads of a state.
#![allow(dead_code)]

use serde_json::{Map, Value, json};

/// A small deterministic generator (SplitMix64), seeded by the property test.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A token no message or schema word contains by accident: `zq` and ten letters.
    pub fn token(&mut self, kind: &str) -> String {
        let letters: String = (0..10)
            .map(|_| (b'a' + self.below(26) as u8) as char)
            .collect();
        format!("zq{kind}{letters}")
    }
}

/// One generated board and what a limited writer does with it.
#[derive(Debug, Clone)]
pub struct BoardCase {
    pub schema: Value,
    pub initial: Value,
    pub reads: Vec<String>,
    pub writes: Vec<String>,
    /// Merge patches of the board the limited writer attempts, in order.
    pub attempts: Vec<Value>,
    /// Merge patches another writer applies to parts the limited writer does not read (not
    /// always valid: a test may commit them without validation).
    pub others: Vec<Value>,
}

impl BoardCase {
    pub fn generate(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut properties = Map::new();
        let mut state = Map::new();
        let mut reads = Vec::new();
        // Members a limited reader reads: strings, and objects read whole or in part.
        let public = 1 + rng.below(3);
        for i in 0..public {
            let name = format!("p{i}");
            if rng.chance(50) {
                let limit = 3 + rng.below(8);
                properties.insert(name.clone(), json!({"type": "string", "maxLength": limit}));
                state.insert(name.clone(), json!("ok"));
                reads.push(format!("/{name}"));
            } else {
                // `a` is read; `b` is read and absent; a hidden sibling is not read unless the
                // whole object is; `w` is write-only.
                let hidden_key = rng.token("k");
                let hidden_value = rng.token("v");
                let secret = rng.token("w");
                let mut object = json!({
                    "type": "object",
                    "properties": {
                        "a": {"type": "string", "maxLength": 6},
                        "b": {"type": "integer"},
                        "w": {"type": "string", "writeOnly": true}
                    }
                });
                if rng.chance(50) {
                    object["maxProperties"] = json!(3);
                }
                if rng.chance(30) {
                    object["dependentRequired"] = json!({"b": [hidden_key]});
                }
                properties.insert(name.clone(), object);
                state.insert(
                    name.clone(),
                    json!({"a": "x", "w": secret, hidden_key: hidden_value}),
                );
                if rng.chance(30) {
                    reads.push(format!("/{name}"));
                } else {
                    reads.push(format!("/{name}/a"));
                    reads.push(format!("/{name}/b"));
                    reads.push(format!("/{name}/w"));
                }
            }
        }
        // A member the reader reads and writes that does not exist yet.
        if rng.chance(50) {
            properties.insert("p9".into(), json!({"type": "string"}));
            reads.push("/p9".into());
        }
        // Members it does not read.
        let hidden = 1 + rng.below(3);
        let mut hidden_names = Vec::new();
        for _ in 0..hidden {
            let name = rng.token("h");
            let value = if rng.chance(50) {
                Value::String(rng.token("v"))
            } else {
                json!({ rng.token("k"): rng.token("v") })
            };
            properties.insert(name.clone(), json!({"type": ["string", "object"]}));
            state.insert(name.clone(), value);
            hidden_names.push(name);
        }
        let count = state.len();
        let mut schema = json!({"type": "object", "properties": properties});
        let h0 = hidden_names[0].clone();
        let optional: Vec<(&str, Value)> = vec![
            ("maxProperties", json!(count)),
            ("minProperties", json!(count)),
            ("required", json!(state.keys().collect::<Vec<_>>())),
            ("dependentRequired", json!({"p0": [h0], h0.clone(): ["p0"]})),
            (
                "dependentSchemas",
                json!({h0.clone(): {"not": {"required": ["p9"]}}}),
            ),
            (
                "if",
                json!({"properties": {h0.clone(): {"const": state[&h0]}}, "required": [h0]}),
            ),
            ("propertyNames", json!({"pattern": "^(p[0-9]|zqh[a-z]+)$"})),
            ("additionalProperties", json!(false)),
            (
                "patternProperties",
                json!({"^zqh": {"type": ["string", "object"]}}),
            ),
            ("anyOf", json!([{"required": [h0]}, {"maxProperties": 1}])),
        ];
        for (keyword, value) in optional {
            if rng.chance(40) {
                schema[keyword] = value;
                if keyword == "if" {
                    schema["then"] = json!({"maxProperties": count});
                    schema["else"] = json!({"properties": {"p0": {"maxLength": 1}}});
                }
            }
        }
        let writes: Vec<String> = reads.iter().filter(|_| rng.chance(70)).cloned().collect();
        let mut attempts = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let mut patch = json!({});
            let targets: Vec<&String> = if writes.is_empty() || rng.chance(15) {
                reads.iter().take(1).collect()
            } else {
                writes.iter().filter(|_| rng.chance(70)).collect()
            };
            for target in targets {
                let value = match rng.below(6) {
                    0 => json!("ok"),
                    1 => json!("far-too-long-for-any-limit"),
                    2 => json!(5),
                    3 => Value::Null,
                    4 => json!({"n": 1}),
                    _ => json!("y"),
                };
                set(&mut patch, target, value);
            }
            attempts.push(patch);
        }
        let mut others = Vec::new();
        for _ in 0..1 + rng.below(2) {
            let name = &hidden_names[rng.below(hidden_names.len() as u64) as usize];
            let patch = match rng.below(4) {
                0 => json!({ name.clone(): rng.token("v") }),
                1 => json!({ rng.token("h"): rng.token("v") }),
                2 => json!({ name.clone(): 7 }),
                _ => json!({ rng.token("x"): {"deep": rng.token("v")} }),
            };
            others.push(patch);
        }
        let mut case = Self {
            schema,
            initial: Value::Object(state),
            reads,
            writes,
            attempts,
            others,
        };
        case.make_initial_valid();
        case
    }

    /// Drops root keywords until the initial state satisfies the schema.
    fn make_initial_valid(&mut self) {
        let droppable = [
            "anyOf",
            "if",
            "propertyNames",
            "dependentSchemas",
            "dependentRequired",
            "minProperties",
            "maxProperties",
            "required",
            "additionalProperties",
            "patternProperties",
        ];
        for keyword in droppable {
            if skillstate_core::StateSchema::compile(self.schema.clone())
                .is_ok_and(|s| s.is_valid(&self.initial))
            {
                return;
            }
            if let Value::Object(map) = &mut self.schema {
                map.remove(keyword);
                if keyword == "if" {
                    map.remove("then");
                    map.remove("else");
                }
            }
        }
    }

    /// The generated tokens of `state` a reader of `reads` must never see: names of members
    /// it may not name, strings outside its reads, and (when `write_only` is true) the values
    /// of write-only members (`w`) it reads.
    pub fn hidden_in(&self, state: &Value, write_only: bool) -> Vec<String> {
        let mut out = Vec::new();
        walk(state, "", &self.reads, write_only, &mut out);
        out
    }

    /// Every token hidden from the reader in the initial state and in what the other writer
    /// writes.
    pub fn hidden(&self, write_only: bool) -> Vec<String> {
        let mut out = self.hidden_in(&self.initial, write_only);
        for patch in &self.others {
            out.extend(self.hidden_in(patch, write_only));
        }
        out.sort();
        out.dedup();
        out
    }

    /// Each token of `hidden` that occurs in `text`.
    pub fn leaks(hidden: &[String], text: &str) -> Vec<String> {
        hidden
            .iter()
            .filter(|token| text.contains(token.as_str()))
            .cloned()
            .collect()
    }
}

fn within(location: &str, reads: &[String]) -> bool {
    reads
        .iter()
        .any(|r| location == r || location.starts_with(&format!("{r}/")))
}

fn on_the_way(location: &str, reads: &[String]) -> bool {
    within(location, reads) || reads.iter().any(|r| r.starts_with(&format!("{location}/")))
}

fn walk(value: &Value, at: &str, reads: &[String], write_only: bool, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let location = format!("{at}/{key}");
                if key.starts_with("zq") && !on_the_way(&location, reads) {
                    out.push(key.clone());
                }
                walk(child, &location, reads, write_only, out);
            }
        }
        Value::String(text) if text.starts_with("zq") => {
            let secret = write_only && at.ends_with("/w");
            if secret || !within(at, reads) {
                out.push(text.clone());
            }
        }
        _ => {}
    }
}

/// Puts `value` at `pointer` (of plain member names) of a merge patch.
pub fn set(patch: &mut Value, pointer: &str, value: Value) {
    let tokens: Vec<&str> = pointer.split('/').skip(1).collect();
    let mut at = patch;
    for (i, token) in tokens.iter().enumerate() {
        if !at.is_object() {
            *at = json!({});
        }
        let Value::Object(map) = at else { return };
        if i + 1 == tokens.len() {
            map.insert((*token).to_owned(), value);
            return;
        }
        at = map.entry((*token).to_owned()).or_insert_with(|| json!({}));
    }
}
