//! A skill's board scope: the `[board]` table of skill.toml, parsed and checked.
//!
//! ```toml
//! [board]
//! reads = ["/plan", "/api", "/frontend"]
//! writes = ["/frontend"]
//! ```
//!
//! Rules (each broken one is reported with its field, `board.reads[2]`):
//! - every entry is an RFC 6901 pointer; `-` (the position after an array's end) names no
//!   location and is refused;
//! - `reads` may hold `""` (the whole board); `writes` may not: a writer of the whole board
//!   would conflict with every other writer, so a skill names the parts it owns;
//! - every write lies within a read: an agent never overwrites what its prompt does not show
//!   it, and a conflict can always show it the fresh values;
//! - no pointer is listed twice in one list.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::pointer::Pointer;

/// Which parts of a board a skill reads (its prompt shows them) and which it may write.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "BoardTable", into = "BoardTable")]
pub struct BoardScope {
    pub reads: Vec<Pointer>,
    pub writes: Vec<Pointer>,
}

/// The `[board]` table as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BoardTable {
    pub reads: Vec<String>,
    pub writes: Vec<String>,
}

/// Which list of the `[board]` table an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeList {
    Reads,
    Writes,
}

impl ScopeList {
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeList::Reads => "reads",
            ScopeList::Writes => "writes",
        }
    }
}

/// One bad entry of the `[board]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeProblem {
    pub list: ScopeList,
    pub index: usize,
    pub message: String,
}

impl ScopeProblem {
    /// The field's name as a user finds it: `board.reads[2]`.
    pub fn field(&self) -> String {
        format!("board.{}[{}]", self.list.as_str(), self.index)
    }
}

impl fmt::Display for ScopeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field(), self.message)
    }
}

impl BoardScope {
    /// Checks every entry of both lists; all problems are reported at once.
    pub fn parse(table: &BoardTable) -> Result<Self, Vec<ScopeProblem>> {
        let mut problems = Vec::new();
        let reads = parse_list(ScopeList::Reads, &table.reads, &mut problems);
        let writes = parse_list(ScopeList::Writes, &table.writes, &mut problems);
        for (index, write) in writes.iter().enumerate() {
            let Some(write) = write else { continue };
            if write.is_root() {
                problems.push(ScopeProblem {
                    list: ScopeList::Writes,
                    index,
                    message: "\"\" (the whole board) cannot be written by one skill, or it would conflict with every other writer; list the top-level parts this skill owns, such as \"/frontend\"".into(),
                });
            } else if !reads.iter().flatten().any(|read| write.is_within(read)) {
                problems.push(ScopeProblem {
                    list: ScopeList::Writes,
                    index,
                    message: format!(
                        "\"{write}\" is not within any pointer of board.reads; a skill writes only what it reads, so add \"{write}\" (or one of its ancestors) to reads"
                    ),
                });
            }
        }
        if problems.is_empty() {
            Ok(Self {
                reads: reads.into_iter().flatten().collect(),
                writes: writes.into_iter().flatten().collect(),
            })
        } else {
            problems.sort_by_key(|p| (p.list == ScopeList::Writes, p.index));
            Err(problems)
        }
    }

    /// Writes that lie within another write of the same skill (`"/api"` and `"/api/login"`):
    /// one of the two is redundant or a mistake, and a skill's parts are easier to read when
    /// each location is listed once. Reported where a skill is written (skill.toml), so a
    /// stored skill that has such writes still loads.
    pub fn overlapping_writes(&self) -> Vec<ScopeProblem> {
        let mut problems = Vec::new();
        for (index, write) in self.writes.iter().enumerate() {
            if let Some((other, wider)) = self
                .writes
                .iter()
                .enumerate()
                .find(|(other, w)| *other != index && write.is_within(w))
            {
                problems.push(ScopeProblem {
                    list: ScopeList::Writes,
                    index,
                    message: format!(
                        "\"{write}\" lies within \"{wider}\" (board.writes[{other}]), which this skill writes already; writes must not overlap: remove \"{write}\", or narrow \"{wider}\" to the parts meant"
                    ),
                });
            }
        }
        problems
    }

    /// The board scope of an API key from its stored `scopes` (`{"board": {"reads": [...],
    /// "writes": [...]}}`); `None` for a key without limits. Anything else is refused with why,
    /// so a limit this build does not understand never grants more.
    pub fn of_key(scopes: Option<&serde_json::Value>) -> Result<Option<Self>, String> {
        let Some(scopes) = scopes.filter(|s| !s.is_null()) else {
            return Ok(None);
        };
        let Some(object) = scopes.as_object() else {
            return Err("its scopes are not a JSON object".into());
        };
        if let Some(unknown) = object.keys().find(|k| *k != "board") {
            return Err(format!(
                "its scopes hold `{unknown}`, which this build does not know"
            ));
        }
        let Some(board) = object.get("board") else {
            return Ok(None);
        };
        let table = serde_json::from_value(board.clone())
            .map_err(|e| format!("its board scope is unreadable: {e}"))?;
        Self::parse(&table).map(Some).map_err(|problems| {
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// `true` when `location` lies within one of the reads.
    pub fn can_read(&self, location: &Pointer) -> bool {
        self.reads.iter().any(|read| location.is_within(read))
    }

    /// `true` when `location` lies within one of the writes.
    pub fn can_write(&self, location: &Pointer) -> bool {
        self.writes.iter().any(|write| location.is_within(write))
    }
}

fn parse_list(
    list: ScopeList,
    entries: &[String],
    problems: &mut Vec<ScopeProblem>,
) -> Vec<Option<Pointer>> {
    let mut parsed: Vec<Option<Pointer>> = Vec::with_capacity(entries.len());
    for (index, text) in entries.iter().enumerate() {
        let mut problem = |message: String| {
            problems.push(ScopeProblem {
                list,
                index,
                message,
            })
        };
        match Pointer::parse(text) {
            Err(message) => {
                problem(message);
                parsed.push(None);
            }
            Ok(pointer) if pointer.tokens().iter().any(|t| t == "-") => {
                problem(format!(
                    "\"{text}\" contains \"-\", which names the position after an array's end, not a location; point at the array itself"
                ));
                parsed.push(None);
            }
            Ok(pointer) if parsed.iter().flatten().any(|p| *p == pointer) => {
                problem(format!(
                    "\"{text}\" is listed twice in board.{}; remove one",
                    list.as_str()
                ));
                parsed.push(None);
            }
            Ok(pointer) => parsed.push(Some(pointer)),
        }
    }
    parsed
}

impl TryFrom<BoardTable> for BoardScope {
    type Error = String;

    fn try_from(table: BoardTable) -> Result<Self, Self::Error> {
        BoardScope::parse(&table).map_err(|problems| {
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

impl From<BoardScope> for BoardTable {
    fn from(scope: BoardScope) -> Self {
        Self {
            reads: scope.reads.iter().map(ToString::to_string).collect(),
            writes: scope.writes.iter().map(ToString::to_string).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(reads: &[&str], writes: &[&str]) -> BoardTable {
        BoardTable {
            reads: reads.iter().map(|s| s.to_string()).collect(),
            writes: writes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_valid_scope_parses() {
        let scope = BoardScope::parse(&table(&["/plan", "/api", ""], &["/plan/frontend"])).unwrap();
        assert_eq!(scope.reads.len(), 3);
        assert!(scope.can_write(&Pointer::parse("/plan/frontend/x").unwrap()));
        assert!(!scope.can_write(&Pointer::parse("/plan").unwrap()));
        assert!(scope.can_read(&Pointer::parse("/anything").unwrap()));
    }

    #[test]
    fn every_problem_names_its_field() {
        let problems = BoardScope::parse(&table(
            &["/plan", "api", "/plan", "/list/-"],
            &["", "/frontend", "/plan/a~"],
        ))
        .unwrap_err();
        let fields: Vec<String> = problems.iter().map(ScopeProblem::field).collect();
        assert_eq!(
            fields,
            [
                "board.reads[1]",
                "board.reads[2]",
                "board.reads[3]",
                "board.writes[0]",
                "board.writes[1]",
                "board.writes[2]"
            ]
        );
        assert!(problems[0].message.contains("\"/api\""), "{}", problems[0]);
        assert!(problems[1].message.contains("listed twice"));
        assert!(problems[3].message.contains("whole board"));
        assert!(problems[4].message.contains("add \"/frontend\""));
    }

    #[test]
    fn serde_round_trips_and_validates() {
        let scope: BoardScope =
            serde_json::from_str(r#"{"reads": ["/a"], "writes": ["/a/b"]}"#).unwrap();
        let text = serde_json::to_string(&scope).unwrap();
        assert_eq!(text, r#"{"reads":["/a"],"writes":["/a/b"]}"#);
        let error = serde_json::from_str::<BoardScope>(r#"{"writes": ["/a"]}"#).unwrap_err();
        assert!(error.to_string().contains("board.writes[0]"), "{error}");
    }
}
