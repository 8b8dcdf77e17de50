//! Decoding rows into records, shared by the SQLite and PostgreSQL backends (both store JSON as
//! text and integers as 64-bit).

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use skillstate_core::{ContextStrategy, SkillDefinition, ToolSpec};
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::model::*;
use crate::{Result, StoreError};

pub(crate) fn decode<T: DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Decode {
        what: what.to_owned(),
        message: e.to_string(),
    })
}

pub(crate) fn decode_opt<T: DeserializeOwned>(
    what: &str,
    text: Option<String>,
) -> Result<Option<T>> {
    text.map(|t| decode(what, &t)).transpose()
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A nullable text column added by a later migration: `None` also when the column is not
/// there, so read-only opens keep reading databases of older schema versions.
pub(crate) fn later_text_column<R: Row>(row: &R, column: &str) -> Result<Option<String>>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    match row.try_get::<Option<String>, _>(column) {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => Ok(other?),
    }
}

/// A nullable integer column added by a later migration: `None` also when the column is not
/// there (read-only opens of older schemas).
pub(crate) fn later_int_column<R: Row>(row: &R, column: &str) -> Result<Option<i64>>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    match row.try_get::<Option<i64>, _>(column) {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => Ok(other?),
    }
}

/// A task's `labels` column: `{}` when NULL (a task created without labels) or JSON `null`; an
/// error naming the column for text that is not a JSON object.
pub(crate) fn labels_of(text: Option<&str>) -> Result<Map<String, Value>> {
    let Some(text) = text else {
        return Ok(Map::new());
    };
    match decode::<Value>("labels of task", text)? {
        Value::Object(labels) => Ok(labels),
        Value::Null => Ok(Map::new()),
        _ => Err(StoreError::Decode {
            what: "labels of task".into(),
            message: "not a JSON object".into(),
        }),
    }
}

/// The hash a task's skill and tools are recorded with when it is created (schema 10): SHA-256
/// of the two texts exactly as stored, joined by a newline. PostgreSQL's migration 10 computes
/// the same in SQL for tasks created before it.
pub(crate) fn spec_hash(skill: &str, tools: &str) -> String {
    skillstate_core::json::text_hash(&format!("{skill}\n{tools}"))
}

/// Decodes a task's stored skill and tools, once their texts match the hash recorded at the
/// task's creation: the only way from stored texts to the skill a runner obeys. `recorded` is
/// `None` only for a database from before schema 10 opened read-only, which has no hash.
pub(crate) fn verified_spec(
    task: &str,
    skill: &str,
    tools: &str,
    recorded: Option<Option<&str>>,
) -> Result<(SkillDefinition, Vec<ToolSpec>)> {
    if let Some(recorded) = recorded {
        let found = spec_hash(skill, tools);
        match recorded {
            Some(hash) if hash == found => {}
            Some(hash) => {
                return Err(StoreError::Tampered {
                    task: task.to_owned(),
                    detail: format!("recorded {hash}, found {found}"),
                });
            }
            None => {
                return Err(StoreError::Tampered {
                    task: task.to_owned(),
                    detail: "the recorded hash was removed".to_owned(),
                });
            }
        }
    }
    Ok((
        decode("skill of task", skill)?,
        decode("tools of task", tools)?,
    ))
}

/// `TaskRecord::upgrade_to` from its two columns.
pub(crate) fn scheduled_upgrade(
    hash: Option<String>,
    author: Option<String>,
) -> Option<ScheduledUpgrade> {
    hash.map(|hash| ScheduledUpgrade {
        hash,
        author: author.unwrap_or_default(),
    })
}

pub(crate) fn task_from_row<R: Row>(row: &R) -> Result<TaskRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.try_get("id")?;
    let context: String = row.try_get("context")?;
    let status: String = row.try_get("status")?;
    let parent_task: Option<String> = row.try_get("parent_task")?;
    let parent_step: Option<i64> = row.try_get("parent_step")?;
    let recorded = match row.try_get::<Option<String>, _>("spec_hash") {
        Err(sqlx::Error::ColumnNotFound(_)) => None,
        other => Some(other?),
    };
    // NULL when the version the task names is not stored (a LEFT JOIN found none).
    let texts = (
        row.try_get::<Option<String>, _>("skill")?,
        row.try_get::<Option<String>, _>("tools")?,
    );
    let (Some(skill), Some(tools)) = texts else {
        return Err(StoreError::Tampered {
            task: id,
            detail: "the skill version it names is not stored".to_owned(),
        });
    };
    let (skill, tools) = verified_spec(
        &id,
        &skill,
        &tools,
        recorded.as_ref().map(|hash| hash.as_deref()),
    )?;
    Ok(TaskRecord {
        skill,
        tools,
        context: ContextStrategy::parse(&context).ok_or_else(|| StoreError::Decode {
            what: "context strategy".into(),
            message: format!("unknown strategy `{context}`"),
        })?,
        context_budget: row
            .try_get::<Option<i64>, _>("context_budget")?
            .map(|b| b as usize),
        model: row.try_get("model")?,
        environment: decode_opt("environment", row.try_get("environment")?)?,
        env_checkpoint: decode_opt("environment checkpoint", row.try_get("env_checkpoint")?)?,
        // Came with schema 12.
        env_checkpoint_step: later_int_column(row, "env_checkpoint_step")?.map(|s| s.max(0) as u64),
        // Came with schema 13.
        upgrade_to: scheduled_upgrade(
            later_text_column(row, "upgrade_to")?,
            later_text_column(row, "upgrade_author")?,
        ),
        status: parse_status(&status)?,
        state: decode("state", &row.try_get::<String, _>("state")?)?,
        version: row.try_get::<i64, _>("version")? as u64,
        outcome: decode_opt("outcome", row.try_get("outcome")?)?,
        parent: parent_task.zip(parent_step.map(|s| s as u64)),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        tenant: later_text_column(row, "tenant")?,
        // Came with schema 3; older databases opened read-only have none.
        labels: labels_of(later_text_column(row, "labels")?.as_deref())?,
        id,
    })
}

pub(crate) fn entry_from_row<R: Row>(row: &R) -> Result<JournalEntry>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let step = row.try_get::<i64, _>("step")? as u64;
    let attempt = row.try_get::<i64, _>("attempt")? as u32;
    // Every part of a row that can be unreadable is named with its step and attempt.
    let what = |part: &str| format!("{part} of journal step {step} (attempt {attempt})");
    let verdict: String = row.try_get("verdict")?;
    Ok(JournalEntry {
        step,
        attempt,
        verdict: match verdict.as_str() {
            "accepted" => Verdict::Accepted,
            "rejected" => Verdict::Rejected,
            other => {
                return Err(StoreError::Decode {
                    what: what("verdict"),
                    message: format!("unknown verdict `{other}`"),
                });
            }
        },
        output: row.try_get("output")?,
        patch: decode_opt(&what("patch"), row.try_get("patch")?)?,
        action: decode_opt(&what("action"), row.try_get("action")?)?,
        errors: decode_opt(&what("errors"), row.try_get("errors")?)?,
        state_hash: row.try_get("state_hash")?,
        prompt_tokens: row.try_get::<i64, _>("prompt_tokens")? as u64,
        output_tokens: row
            .try_get::<Option<i64>, _>("output_tokens")?
            .and_then(|n| u64::try_from(n).ok()),
        prompt_hash: row.try_get("prompt_hash")?,
        usage: decode_opt(&what("usage"), row.try_get("usage")?)?,
        latency_ms: row.try_get::<i64, _>("latency_ms")? as u64,
        created_at: row.try_get("created_at")?,
        author: later_text_column(row, "author")?,
        // Came with schema 8.
        board_version: later_int_column(row, "board_version")?.map(|v| v.max(0) as u64),
    })
}

/// An action intent's row (`SELECT * FROM intents`), on either backend.
pub(crate) fn intent_from_row<R: Row>(row: &R) -> Result<IntentRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<bool>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
{
    let status: String = row.try_get("status")?;
    Ok(IntentRecord {
        step: row.try_get::<i64, _>("step")? as u64,
        tool: row.try_get("tool")?,
        args: decode("intent args", &row.try_get::<String, _>("args")?)?,
        idempotency_key: row.try_get("idempotency_key")?,
        side_effect: row.try_get("side_effect")?,
        done: status == "done",
        ok: row.try_get("ok")?,
        result: row.try_get("result")?,
    })
}

/// One line of the task list; an unreadable status or column degrades this row only.
pub(crate) fn summary_from_row<R: Row>(row: &R) -> TaskSummary
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let mut problems = Vec::new();
    let mut text = |column: &str| match row.try_get::<String, _>(column) {
        Ok(value) => value,
        Err(e) => {
            problems.push(format!("{column}: {e}"));
            String::from("?")
        }
    };
    let id = text("id");
    let skill_name = text("skill_name");
    let status_text = text("status");
    let model = text("model");
    let mut number = |column: &str| match row.try_get::<i64, _>(column) {
        Ok(value) => value,
        Err(e) => {
            problems.push(format!("{column}: {e}"));
            0
        }
    };
    let version = number("version").max(0) as u64;
    let created_at = number("created_at");
    let updated_at = number("updated_at");
    let status = TaskStatus::parse(&status_text);
    if status.is_none() && status_text != "?" {
        problems.push(format!("unknown status `{status_text}`"));
    }
    // Only listings that select the column have labels.
    let labels = match row.try_get::<Option<String>, _>("labels") {
        Err(sqlx::Error::ColumnNotFound(_)) => None,
        Err(e) => {
            problems.push(format!("labels: {e}"));
            Some(Map::new())
        }
        Ok(text) => Some(labels_of(text.as_deref()).unwrap_or_else(|e| {
            problems.push(e.to_string());
            Map::new()
        })),
    };
    TaskSummary {
        id,
        skill_name,
        status,
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
        version,
        model,
        created_at,
        updated_at,
        labels,
    }
}

pub(crate) fn lease_from_row<R: Row>(row: &R) -> Result<Option<LeaseInfo>>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let Some(token) = row.try_get::<Option<String>, _>("lease_token")? else {
        return Ok(None);
    };
    Ok(Some(LeaseInfo {
        token,
        holder: row
            .try_get::<Option<String>, _>("lease_holder")?
            .unwrap_or_default(),
        process: row
            .try_get::<Option<String>, _>("lease_process")?
            .unwrap_or_default(),
        acquired_at: row
            .try_get::<Option<i64>, _>("lease_acquired_at")?
            .unwrap_or(0),
        expires_at: row
            .try_get::<Option<i64>, _>("lease_expires_at")?
            .unwrap_or(0),
    }))
}

pub(crate) fn extent_from_row<R: Row>(row: &R) -> Result<JournalExtent>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let step = |column: &str| -> Result<Option<u64>> {
        Ok(row
            .try_get::<Option<i64>, _>(column)?
            .map(|s| s.max(0) as u64))
    };
    Ok(JournalExtent {
        accepted: row.try_get::<i64, _>("accepted")?.max(0) as u64,
        first: step("first")?,
        last: step("last")?,
        last_hash: row.try_get("last_hash")?,
        base: step("base")?,
    })
}

pub(crate) fn verdict_str(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Accepted => "accepted",
        Verdict::Rejected => "rejected",
    }
}

pub(crate) fn parse_status(status: &str) -> Result<TaskStatus> {
    TaskStatus::parse(status).ok_or_else(|| StoreError::Decode {
        what: "task status".into(),
        message: format!("unknown status `{status}`"),
    })
}
