//! Events on PostgreSQL: appending them inside the transaction of the write they describe, and
//! reading them back with positions that never skip one.
//!
//! Why positions are `<tx>.<id>` and not the sequence number alone: `nextval` hands out ids
//! when rows are inserted, not when their transactions commit. Transaction A takes id 7,
//! transaction B takes id 8 and commits first; a reader that then returns 8 and later resumes
//! "after 8" would never see 7 once A commits — a gap. So each row also records the 64-bit id
//! of the transaction that wrote it (`tx`, `pg_current_xact_id()`), and a read returns only rows
//! whose `tx` is below `pg_snapshot_xmin(pg_current_snapshot())`, the oldest transaction still
//! running when the statement started. Every transaction below that horizon has ended: its rows
//! are committed (and visible to this statement) or rolled back, and no transaction that starts
//! later can get an id below it. The rows below the horizon, ordered by (tx, id), are therefore
//! final: nothing can later appear between them, and everything that appears later sorts after
//! them (its `tx` is at or above the horizon). Resuming after the last returned (tx, id) thus
//! yields every later event exactly once.
//!
//! The price: an event becomes readable only once every transaction that was already running
//! when it committed has ended, across the whole server (the horizon is the cluster's). Store
//! transactions are short; a long one elsewhere (an idle-in-transaction session, a long report)
//! holds new events back until it ends, but never loses them.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};

use super::PostgresStore;
use crate::Result;
use crate::service::{EventQuery, EventRecord, Events};
use crate::service_rows::{bad_position, event_from_row, page_limit, parse_counter};

/// The `created` event of the tasks in `$1` (an array of ids), written at `$2`, in id order.
pub(super) const CREATED_EVENTS: &str = "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
     SELECT id, tenant, 'created', version, json_build_object('skill', skill_name, 'model', model)::text, $2 \
     FROM tasks WHERE id = ANY($1) ORDER BY id";

/// One event about to be written: its kind, the step (`None`: the task's version as it is
/// now) and its data (JSON text).
pub(super) type NewEvent = (&'static str, Option<i64>, String);

/// Appends `events` of `task`, in order, with the task's tenant: one statement.
pub(super) async fn insert_events(
    conn: &mut sqlx::PgConnection,
    task: &str,
    events: Vec<NewEvent>,
    now: i64,
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut kinds = Vec::with_capacity(events.len());
    let mut steps = Vec::with_capacity(events.len());
    let mut data = Vec::with_capacity(events.len());
    for (kind, step, text) in events {
        kinds.push(kind);
        steps.push(step);
        data.push(text);
    }
    // Ids are drawn as the sorted rows are inserted, so they follow the given order.
    sqlx::query(
        "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
         SELECT t.id, t.tenant, e.kind, COALESCE(e.step, t.version), e.data, $5 \
         FROM tasks t, UNNEST($2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY AS e(kind, step, data, n) \
         WHERE t.id = $1 ORDER BY e.n",
    )
    .bind(task)
    .bind(kinds)
    .bind(steps)
    .bind(data)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// `<tx>.<id>` as its two numbers (the transaction id as its decimal text).
fn parse_position(position: &str) -> Result<(String, i64)> {
    let (tx, id) = position
        .split_once('.')
        .ok_or_else(|| bad_position(position))?;
    match (parse_counter(tx), parse_counter(id)) {
        (Some(_), Some(id)) => Ok((tx.to_owned(), id)),
        _ => Err(bad_position(position)),
    }
}

#[async_trait]
impl Events for PostgresStore {
    async fn latest_event_position(&self, query: &EventQuery) -> Result<Option<String>> {
        // The last row below the horizon (module doc): everything that becomes readable later
        // sorts after it.
        let mut sql = String::from(
            "SELECT tx::text AS tx, id FROM events WHERE tx < pg_snapshot_xmin(pg_current_snapshot())",
        );
        let mut texts: Vec<&str> = Vec::new();
        for (column, value) in [("tenant", &query.tenant), ("task_id", &query.task)] {
            if let Some(value) = value {
                texts.push(value);
                sql.push_str(&format!(" AND {column} = ${}", texts.len()));
            }
        }
        sql.push_str(" ORDER BY tx DESC, id DESC LIMIT 1");
        let mut statement = sqlx::query(AssertSqlSafe(sql));
        for text in texts {
            statement = statement.bind(text);
        }
        let Some(row) = statement.fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        let tx: String = row.try_get("tx")?;
        let id: i64 = row.try_get("id")?;
        Ok(Some(format!("{tx}.{id}")))
    }

    async fn events_after(&self, query: &EventQuery) -> Result<Vec<EventRecord>> {
        let after = query.after.as_deref().map(parse_position).transpose()?;
        // See the module doc: only rows below the oldest running transaction, in (tx, id)
        // order.
        let mut sql = String::from(
            "SELECT id, tx::text AS tx, task_id, tenant, kind, step, data, created_at FROM events \
             WHERE tx < pg_snapshot_xmin(pg_current_snapshot())",
        );
        // Placeholders in order: the position's two numbers, then the text filters.
        let mut texts: Vec<&str> = Vec::new();
        let mut next = 1;
        if after.is_some() {
            sql.push_str(" AND (tx, id) > ($1::text::xid8, $2::bigint)");
            next = 3;
        }
        for (column, value) in [("tenant", &query.tenant), ("task_id", &query.task)] {
            if let Some(value) = value {
                sql.push_str(&format!(" AND {column} = ${next}"));
                next += 1;
                texts.push(value);
            }
        }
        sql.push_str(&format!(" ORDER BY tx, id LIMIT ${next}"));
        let mut statement = sqlx::query(AssertSqlSafe(sql));
        if let Some((tx, id)) = &after {
            statement = statement.bind(tx.as_str()).bind(*id);
        }
        for text in texts {
            statement = statement.bind(text);
        }
        let rows = statement
            .bind(page_limit(query.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let tx: String = row.try_get("tx")?;
                let id: i64 = row.try_get("id")?;
                event_from_row(row, format!("{tx}.{id}"))
            })
            .collect()
    }
}
