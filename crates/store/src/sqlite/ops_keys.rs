//! API key writes of the group-commit writer: creating and revoking keys.

use rusqlite::{Connection, OptionalExtension, params};

use super::ops::OpResult;
use crate::StoreError;

/// A new key; refused when a key with the same secret hash exists.
pub(super) struct NewKey {
    pub(super) id: String,
    pub(super) tenant: String,
    pub(super) label: String,
    pub(super) secret_hash: String,
    pub(super) scopes: Option<String>,
    pub(super) now: i64,
}

impl NewKey {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        // Under the writer's write lock nobody else stores a key between the look-up and the
        // insert; the UNIQUE constraint stays the last word.
        let holder: Option<String> = conn
            .prepare_cached("SELECT tenant FROM api_keys WHERE secret_hash = ?")?
            .query_row([&self.secret_hash], |row| row.get(0))
            .optional()?;
        if let Some(tenant) = holder {
            return Err(StoreError::DuplicateKey {
                hash_prefix: self.secret_hash.chars().take(12).collect(),
                tenant,
            }
            .into());
        }
        conn.prepare_cached(
            "INSERT INTO api_keys (id, tenant, label, secret_hash, scopes, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![
            self.id,
            self.tenant,
            self.label,
            self.secret_hash,
            self.scopes,
            self.now
        ])?;
        Ok(())
    }
}

/// Revokes the key `id` at `now`, unless it was revoked before (the first time stays).
pub(super) struct RevokeKey {
    pub(super) id: String,
    pub(super) now: i64,
}

impl RevokeKey {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let updated = conn
            .prepare_cached(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
            )?
            .execute(params![self.now, self.id])?;
        if updated != 1 {
            return Err(StoreError::NoSuchKey(self.id.clone()).into());
        }
        Ok(())
    }
}
