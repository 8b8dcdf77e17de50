//! `skillstate keys`: API keys of the service, per tenant. A new key's secret is printed once;
//! the database keeps only its SHA-256.

use std::process::ExitCode;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use skillstate_core::board::{BoardScope, BoardTable};
use skillstate_store::{KeyRecord, NewKey};

use crate::config::{load_config, open_store};
use crate::render::Table;

#[derive(clap::Subcommand)]
pub enum KeysCommand {
    /// Create a key for a tenant and print its secret (shown this once only).
    Create {
        /// The tenant the key acts for: it sees only this tenant's tasks.
        #[arg(long)]
        tenant: String,
        /// Who or what uses the key, for people.
        #[arg(long, default_value = "")]
        label: String,
        /// Limit the key to boards, reading only this JSON pointer of a board (repeat for
        /// more): its GETs show only these parts. A limited key works on /v1/boards only.
        #[arg(long = "reads", value_name = "POINTER")]
        reads: Vec<String>,
        /// Let the limited key write this JSON pointer of a board (repeat for more; each within
        /// a --reads): a write elsewhere is refused with its pointer.
        #[arg(long = "writes", value_name = "POINTER")]
        writes: Vec<String>,
    },
    /// List keys (never their secrets).
    List {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key (id or unique prefix); requests with it fail at once.
    Revoke { key: String },
}

/// Tenants are names people type: 1–64 of a-z, A-Z, 0-9, `-`, `_`, `.`.
pub(crate) fn check_tenant(tenant: &str) -> Result<()> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 64
        && tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!("--tenant `{tenant}`: use 1-64 of a-z, A-Z, 0-9, `-`, `_`, `.` (for example `acme`)");
    }
    Ok(())
}

/// The stored scopes of a key limited to `reads` and `writes` (`None`: no limits), checked by
/// the rules of a skill's `[board]` table.
fn board_scopes(reads: Vec<String>, writes: Vec<String>) -> Result<Option<Value>> {
    if reads.is_empty() && writes.is_empty() {
        return Ok(None);
    }
    let table = BoardTable { reads, writes };
    if let Err(problems) = BoardScope::parse(&table) {
        let lines: Vec<String> = problems
            .iter()
            .map(|p| {
                format!(
                    "--{} #{}: {}",
                    p.list.as_str(),
                    p.index + 1,
                    p.message.replace("board.reads", "--reads")
                )
            })
            .collect();
        bail!(
            "the key's board scope is not valid:\n  {}",
            lines.join("\n  ")
        );
    }
    Ok(Some(json!({"board": table})))
}

/// A key's limits for people: `-` for none, else `reads /a /b; writes /b`.
fn scope_text(scopes: Option<&Value>) -> String {
    let Some(scopes) = scopes.filter(|s| !s.is_null()) else {
        return "-".into();
    };
    let list = |name: &str| -> String {
        scopes["board"][name]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|p| match p.as_str() {
                        Some("") => "\"\"".to_owned(),
                        Some(text) => text.to_owned(),
                        None => p.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    if scopes.get("board").is_none() {
        return scopes.to_string();
    }
    let (reads, writes) = (list("reads"), list("writes"));
    match (reads.is_empty(), writes.is_empty()) {
        (_, true) => format!("reads {reads}"),
        _ => format!("reads {reads}; writes {writes}"),
    }
}

fn when(millis: Option<i64>) -> String {
    millis
        .map(skillstate_store::time::utc)
        .unwrap_or_else(|| "-".into())
}

fn table(keys: &[KeyRecord]) -> String {
    let mut table = Table::new(&["KEY", "TENANT", "LABEL", "SCOPE", "CREATED", "REVOKED"]);
    for key in keys {
        table.row(vec![
            key.id.clone(),
            key.tenant.clone(),
            key.label.clone(),
            scope_text(key.scopes.as_ref()),
            when(Some(key.created_at)),
            when(key.revoked_at),
        ]);
    }
    table.render()
}

pub async fn run(
    db: &str,
    config_path: Option<&std::path::Path>,
    command: KeysCommand,
) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    let store = open_store(db, &config).await?;
    match command {
        KeysCommand::Create {
            tenant,
            label,
            reads,
            writes,
        } => {
            check_tenant(&tenant)?;
            let scopes = board_scopes(reads, writes)?;
            let secret = skillstate_server::new_key_secret();
            let key = store
                .create_key(&NewKey {
                    tenant: tenant.clone(),
                    label,
                    secret_hash: skillstate_server::hash_secret(&secret),
                    scopes,
                })
                .await?;
            errln!(
                "key {} for tenant {tenant}{}; its secret is printed once, on stdout — keep it, the database holds only a hash",
                key.id,
                match &key.scopes {
                    Some(scopes) => format!(", limited to boards ({})", scope_text(Some(scopes))),
                    None => String::new(),
                }
            );
            // The one place a secret is printed on purpose: not through the cleaning printer's
            // secret list, which does not know it.
            outln!("{secret}");
        }
        KeysCommand::List { tenant } => {
            let keys = store.list_keys(tenant.as_deref()).await?;
            if keys.is_empty() {
                outln!("no keys; create one with `skillstate keys create --tenant NAME`");
            } else {
                out!("{}", table(&keys));
            }
        }
        KeysCommand::Revoke { key } => {
            let key = store.revoke_key(&key).await?;
            outln!(
                "revoked key {} of tenant {} (at {})",
                key.id,
                key.tenant,
                when(key.revoked_at)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
