//! Skill versions (schema 13): each stored once, whatever number of tasks, batches and forks
//! run it; collected with the last task that names it; a database of schema 12 migrated with
//! every task reading as before.

use super::queue::{new_batch, queued};
use super::*;

fn other_task() -> NewTask {
    NewTask {
        skill: SkillDefinition {
            procedure: "Another procedure.".into(),
            ..free_skill()
        },
        ..new_task()
    }
}

async fn versions_stored(db: &Db) -> anyhow::Result<i64> {
    db.count("SELECT COUNT(*) FROM skill_versions").await
}

/// Takes `db` back to schema 12, as a release before skill versions wrote it: each task's own
/// copy of its skill and tools (SQLite `task_specs`, PostgreSQL columns of `tasks`).
pub(super) async fn back_to_schema_12(db: &Db) -> anyhow::Result<()> {
    super::boards::back_to_schema_13(db).await?;
    let sql = match db.backend {
        Backend::Sqlite => {
            "CREATE TABLE task_specs (task_id TEXT PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE, \
                 skill TEXT NOT NULL, tools TEXT NOT NULL, spec_hash TEXT); \
             INSERT INTO task_specs SELECT t.id, v.skill, v.tools, v.hash FROM tasks t JOIN skill_versions v ON v.hash = t.spec_hash; \
             DROP TRIGGER skill_versions_collected; DROP TRIGGER skill_versions_frozen; \
             DROP TRIGGER skill_versions_unscheduled; DROP TRIGGER skill_versions_unscheduled_with_task; \
             DROP TABLE task_versions; DROP TABLE skill_versions; \
             ALTER TABLE tasks DROP COLUMN spec_hash; \
             ALTER TABLE tasks DROP COLUMN upgrade_to; ALTER TABLE tasks DROP COLUMN upgrade_author; \
             DELETE FROM schema_migrations WHERE version >= 13"
        }
        Backend::Postgres | Backend::PgBouncer => {
            "ALTER TABLE tasks ADD COLUMN skill TEXT, ADD COLUMN tools TEXT; \
             UPDATE tasks t SET skill = v.skill, tools = v.tools FROM skill_versions v WHERE v.hash = t.spec_hash; \
             DROP TABLE task_versions; DROP TABLE skill_versions; \
             DROP FUNCTION skillstate_refuse_version_change(); \
             ALTER TABLE tasks DROP COLUMN upgrade_to, DROP COLUMN upgrade_author; \
             DELETE FROM schema_migrations WHERE version >= 13"
        }
    };
    db.execute(sql).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_skill_store_it_once_and_the_last_one_takes_it_along() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(store.create_task(new_task(), &json!({})).await?.id);
        }
        let batch = store
            .create_batch(&new_batch("versions", OnError::SkipAndLog, 0))
            .await?;
        ids.extend(
            store
                .enqueue_tasks(&batch.id, (0..40).map(queued).collect())
                .await?,
        );
        ids.push(store.fork_task(&ids[0], 0, &json!({}), None).await?.id);
        assert_eq!(versions_stored(&db).await?, 1, "one skill, one version");
        let other = store.create_task(other_task(), &json!({})).await?;
        assert_eq!(versions_stored(&db).await?, 2);
        for id in &ids {
            assert_eq!(store.task(id).await?.skill, free_skill());
        }
        assert_eq!(
            store.task(&other.id).await?.skill.procedure,
            "Another procedure."
        );

        // A version stays while any task names it, and goes with the last one.
        for id in &ids[1..] {
            store.delete_task(id).await?;
        }
        assert_eq!(versions_stored(&db).await?, 2);
        store.delete_task(&ids[0]).await?;
        assert_eq!(versions_stored(&db).await?, 1);
        store.delete_task(&other.id).await?;
        assert_eq!(versions_stored(&db).await?, 0);
        // A new task of the collected skill stores it again.
        let again = store.create_task(new_task(), &json!({})).await?;
        assert_eq!(store.task(&again.id).await?.skill, free_skill());
        assert_eq!(versions_stored(&db).await?, 1);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_schema_12_stores_each_skill_once_and_reads_as_before() -> anyhow::Result<()>
{
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let mut before = Vec::new();
        for task in [new_task(), new_task(), other_task(), new_task()] {
            let id = store.create_task(task, &json!({})).await?.id;
            before.push(store.task(&id).await?);
        }
        let fork = store.fork_task(&before[0].id, 0, &json!({}), None).await?;
        before.push(store.task(&fork.id).await?);
        store.release().await;
        drop(store);
        back_to_schema_12(&db).await?;

        let store = db.open().await?;
        for task in &before {
            assert_eq!(&store.task(&task.id).await?, task);
        }
        assert_eq!(versions_stored(&db).await?, 2);
        assert_eq!(
            db.count("SELECT COUNT(*) FROM task_versions WHERE from_step = 0")
                .await?,
            before.len() as i64
        );
        Ok(())
    })
    .await
}
