//! Board rows, shared by the SQLite and PostgreSQL backends: names checked, writes serialised
//! for binding, rows decoded into records.

use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::boards::{
    BoardAuthor, BoardRecord, BoardSchemaRecord, BoardSummary, BoardWrite, BoardWriteRecord,
};
use crate::rows::{decode, to_json};
use crate::{Result, StoreError};

/// The longest board name.
pub(crate) const MAX_NAME: usize = 100;

/// Refuses a name that is empty, too long, holds characters other than letters, digits, `-`,
/// `_` and `.`, or reads as a board id (ids are looked up first, so such a name could never be
/// found).
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(StoreError::BadBoardName {
            // Quoted whole or not at all, never cut: whatever redacts the message later
            // recognises a secret only whole.
            name: if name.chars().count() <= MAX_NAME {
                name.to_owned()
            } else {
                format!("({} characters)", name.chars().count())
            },
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.chars().count() > MAX_NAME {
        return bad("it is longer than 100 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return bad("use only letters, digits, `-`, `_` and `.`");
    }
    if uuid::Uuid::try_parse(name).is_ok() {
        return bad("it reads as a board id");
    }
    Ok(())
}

/// Whether `text` can be a board id as the store makes them (a lower-case hyphenated UUID).
pub(crate) fn is_board_id(text: &str) -> bool {
    uuid::Uuid::try_parse(text).is_ok_and(|uuid| uuid.hyphenated().to_string() == text)
}

/// A board write's journal columns, ready to bind.
pub(crate) struct WriteRow {
    pub(crate) patch: String,
    pub(crate) state_hash: String,
    pub(crate) author: String,
    pub(crate) rebased_from: Option<u64>,
}

impl WriteRow {
    pub(crate) fn new(write: &BoardWrite) -> Self {
        Self {
            patch: to_json(&write.patch),
            state_hash: write.state_hash.clone(),
            author: to_json(&write.author),
            rebased_from: write.rebased_from,
        }
    }
}

/// A stored author (`{"kind": "task", "task", "step"}`, `{"kind": "key", "key"}`,
/// `{"kind": "cli"}`).
fn author_of(what: &str, text: &str) -> Result<BoardAuthor> {
    let value: Value = decode(what, text)?;
    let bad = |message: &str| StoreError::Decode {
        what: what.to_owned(),
        message: message.to_owned(),
    };
    let text_field = |field: &str| {
        value
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| bad(&format!("no `{field}` string")))
    };
    match value.get("kind").and_then(Value::as_str) {
        Some("task") => Ok(BoardAuthor::Task {
            task: text_field("task")?,
            step: value
                .get("step")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad("no `step` number"))?,
        }),
        Some("key") => Ok(BoardAuthor::Key {
            key: text_field("key")?,
        }),
        Some("cli") => Ok(BoardAuthor::Cli),
        _ => Err(bad("unknown author kind")),
    }
}

fn count<R: Row>(row: &R, column: &str) -> Result<u64>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(row.try_get::<i64, _>(column)?.max(0) as u64)
}

pub(crate) fn board_from_row<R: Row>(row: &R) -> Result<BoardRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.try_get("id")?;
    Ok(BoardRecord {
        schema: decode(
            &format!("schema of board {id}"),
            &row.try_get::<String, _>("schema")?,
        )?,
        state: decode(
            &format!("state of board {id}"),
            &row.try_get::<String, _>("state")?,
        )?,
        name: row.try_get("name")?,
        version: count(row, "version")?,
        state_hash: row.try_get("state_hash")?,
        tenant: row.try_get("tenant")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

pub(crate) fn summary_from_row<R: Row>(row: &R) -> Result<BoardSummary>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(BoardSummary {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        version: count(row, "version")?,
        members: count(row, "members")?,
        tenant: row.try_get("tenant")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

pub(crate) fn write_from_row<R: Row>(board: &str, row: &R) -> Result<BoardWriteRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let version = count(row, "version")?;
    let what = |part: &str| format!("{part} of board {board} version {version}");
    Ok(BoardWriteRecord {
        version,
        patch: decode(&what("patch"), &row.try_get::<String, _>("patch")?)?,
        state_hash: row.try_get("state_hash")?,
        author: author_of(&what("author"), &row.try_get::<String, _>("author")?)?,
        rebased_from: row
            .try_get::<Option<i64>, _>("rebased_from")?
            .map(|v| v.max(0) as u64),
        created_at: row.try_get("created_at")?,
    })
}

/// A `board_snapshots` row (`version`, `state`) as the version and the state it holds.
pub(crate) fn snapshot_from_row<R: Row>(board: &str, row: &R) -> Result<(u64, Value)>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let version = count(row, "version")?;
    let state = decode(
        &format!("snapshot of board {board} at version {version}"),
        &row.try_get::<String, _>("state")?,
    )?;
    Ok((version, state))
}

/// A `board_schemas` row (`from_version`, `schema`).
pub(crate) fn schema_from_row<R: Row>(board: &str, row: &R) -> Result<BoardSchemaRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let from_version = count(row, "from_version")?;
    let schema = decode(
        &format!("schema of board {board} from version {from_version}"),
        &row.try_get::<String, _>("schema")?,
    )?;
    Ok(BoardSchemaRecord {
        from_version,
        schema,
    })
}

/// The columns a listing line reads (`summary_from_row`), members counted.
pub(crate) const SUMMARY_COLUMNS: &str = "b.id, b.name, b.version, b.tenant, b.created_at, b.updated_at, \
     (SELECT COUNT(*) FROM board_members m WHERE m.board_id = b.id) AS members";
