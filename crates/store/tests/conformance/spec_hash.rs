//! A task's skill and tools are checked against the hash recorded at its creation on every read
//! that decodes them: a copy changed outside skillstate (the frozen trigger dropped, the schema's
//! `readOnly` flipped) is refused with `Tampered`, on both backends, and a fork copies the hash
//! with the skill.

use super::*;

fn guarded_task() -> NewTask {
    NewTask {
        skill: SkillDefinition {
            schema: json!({
                "type": "object",
                "properties": {"owner": {"type": "string", "readOnly": true}}
            }),
            ..definition()
        },
        ..new_task()
    }
}

/// Drops every trigger that guards the stored skill, then flips `readOnly` in it, as a command
/// with write access to the database file would.
async fn tamper(db: &Db, task: &str) -> anyhow::Result<u64> {
    match db.backend {
        Backend::Sqlite => {
            db.execute("DROP TRIGGER IF EXISTS task_specs_frozen")
                .await?;
            db.execute(&format!(
                "UPDATE task_specs SET skill = replace(skill, '\"readOnly\":true', '\"readOnly\":false') WHERE task_id = '{task}'"
            ))
            .await
        }
        Backend::Postgres => {
            db.execute("DROP TRIGGER IF EXISTS tasks_spec_frozen ON tasks")
                .await?;
            db.execute(&format!(
                "UPDATE tasks SET skill = replace(skill, '\"readOnly\":true', '\"readOnly\":false') WHERE id = '{task}'"
            ))
            .await
        }
    }
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
        // Untouched, they read as created.
        assert_eq!(store.task(&task.id).await?.skill, guarded_task().skill);
        assert_eq!(store.task(&fork.id).await?.skill, guarded_task().skill);
        drop(store);

        assert_eq!(tamper(&db, &task.id).await?, 1, "the copy was changed");
        // A fresh store (a new process, as `reply` would be) decodes the changed copy.
        let store = db.open().await?;
        let error = store.task(&task.id).await.unwrap_err();
        assert!(
            matches!(&error, StoreError::Tampered { task: t, .. } if *t == task.id),
            "{error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("do not match the hash recorded") && message.contains(&task.id),
            "{message}"
        );
        // Other tasks are untouched and still read.
        assert_eq!(store.task(&other.id).await?.skill, guarded_task().skill);
        assert_eq!(store.task(&fork.id).await?.skill, guarded_task().skill);

        // Removing the recorded hash is no way around it.
        drop(store);
        match db.backend {
            Backend::Sqlite => {
                db.execute(&format!(
                    "UPDATE task_specs SET spec_hash = NULL WHERE task_id = '{}'",
                    other.id
                ))
                .await?;
            }
            Backend::Postgres => {
                db.execute(&format!(
                    "UPDATE tasks SET spec_hash = NULL WHERE id = '{}'",
                    other.id
                ))
                .await?;
            }
        }
        let store = db.open().await?;
        let error = store.task(&other.id).await.unwrap_err();
        assert!(matches!(error, StoreError::Tampered { .. }), "{error}");
        Ok(())
    })
    .await
}
