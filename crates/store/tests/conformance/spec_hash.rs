//! A task's skill and tools are a skill version, stored once under the hash of its content and
//! checked against that hash on every read that decodes them: a version changed outside
//! skillstate (the frozen trigger dropped, the schema's `readOnly` flipped) is refused with
//! `Tampered` for every task that runs it, on every backend, and a fork names its parent's
//! version.

use super::*;

fn guarded_task() -> NewTask {
    NewTask {
        skill: SkillDefinition {
            schema: json!({
                "type": "object",
                "properties": {"owner": {"type": "string", "readOnly": true}}
            }),
            ..free_skill()
        },
        ..new_task()
    }
}

/// Drops every trigger that guards the stored skill versions, then flips `readOnly` in the one
/// `task` runs, as a command with write access to the database would.
async fn tamper(db: &Db, task: &str) -> anyhow::Result<u64> {
    let drop = match db.backend {
        Backend::Sqlite => "DROP TRIGGER IF EXISTS skill_versions_frozen",
        Backend::Postgres | Backend::PgBouncer => {
            "DROP TRIGGER IF EXISTS skill_versions_frozen ON skill_versions"
        }
    };
    db.execute(drop).await?;
    db.execute(&format!(
        "UPDATE skill_versions SET skill = replace(skill, '\"readOnly\":true', '\"readOnly\":false') \
         WHERE hash = (SELECT spec_hash FROM tasks WHERE id = '{task}')"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_skill_changed_outside_skillstate_is_refused() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(guarded_task(), &json!({})).await?;
        let other = store.create_task(guarded_task(), &json!({})).await?;
        let fork = store
            .fork_task(&task.id, 0, &json!({"owner": "x"}), None)
            .await?;
        let different = store.create_task(new_task(), &json!({})).await?;
        // Untouched, they read as created.
        assert_eq!(store.task(&task.id).await?.skill, guarded_task().skill);
        assert_eq!(store.task(&fork.id).await?.skill, guarded_task().skill);
        drop(store);

        assert_eq!(tamper(&db, &task.id).await?, 1, "the version was changed");
        // A fresh store (a new process, as `reply` would be) decodes the changed version, for
        // every task that runs it.
        let store = db.open().await?;
        for id in [&task.id, &other.id, &fork.id] {
            let error = store.task(id).await.unwrap_err();
            assert!(
                matches!(&error, StoreError::Tampered { task: t, .. } if t == id),
                "{error}"
            );
            let message = error.to_string();
            assert!(
                message.contains("do not match the hash recorded") && message.contains(id.as_str()),
                "{message}"
            );
        }
        // A task of another version is untouched and still reads.
        assert_eq!(store.task(&different.id).await?.skill, new_task().skill);

        // Naming no version is no way around it.
        drop(store);
        db.execute(&format!(
            "UPDATE tasks SET spec_hash = NULL WHERE id = '{}'",
            different.id
        ))
        .await?;
        let store = db.open().await?;
        let error = store.task(&different.id).await.unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Tampered { .. } | StoreError::Decode { .. }
            ),
            "{error}"
        );
        Ok(())
    })
    .await
}
