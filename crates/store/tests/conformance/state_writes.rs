//! A task's state as the service reads it (`Tasks::task_state`) and steps written from outside
//! any runner without taking the lease (`Leases::commit_unleased_step`), on every backend:
//! refused while a live lease is held, stale versions refused, racing writers of one version
//! settled by the version.

use super::*;

/// A state write's commit: no action, the author recorded.
fn unleased_commit(step: u64, state: &Value, patch: Value) -> StepCommit {
    let mut commit = step_commit(step, state, patch, false);
    commit.entry.action = None;
    commit.entry.author = Some("key-1".into());
    commit.next_observation = Some(NextObservation::Text(format!(
        "observation {} (changed)",
        step + 1
    )));
    commit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_state_is_the_records_state_by_full_id_only() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let mut new = new_task();
        new.skill.schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        new.skill.settings.budgets.state_tokens = 321;
        let task = store.create_task(new, &json!({"a": 0})).await?;
        for round in 0..3 {
            // Read twice: the first read of a task and the later ones agree.
            for _ in 0..2 {
                let state = store.task_state(&task.id).await?;
                let record = store.task(&task.id).await?;
                assert_eq!(state, TaskState::of(&record), "round {round}");
                assert_eq!(state.state_tokens, 321);
                assert_eq!(state.schema["properties"]["a"]["type"], "integer");
            }
            let now = store.task(&task.id).await?;
            let commit = step_commit(
                now.version + 1,
                &now.state,
                json!({ "a": round + 1 }),
                false,
            );
            store.commit_step(&task.id, now.version, &commit).await?;
        }
        let state = store.task_state(&task.id).await?;
        assert_eq!((state.version, &state.state), (3, &json!({"a": 3})));
        assert_eq!(state.status, TaskStatus::Running);
        // A task's skill is frozen: the database refuses to change it behind the store's back
        // (and a copy changed anyway fails its recorded hash: conformance/spec_hash.rs).
        let change = format!(
            "UPDATE skill_versions SET skill = replace(skill, 'free-form state', 'changed') WHERE hash = (SELECT spec_hash FROM tasks WHERE id = '{}')",
            task.id
        );
        let changed = db.execute(&change).await;
        let refused = format!("{:#}", changed.err().context("the skill was changed")?);
        assert!(refused.contains("a skill version never changes"), "{refused}");
        assert_eq!(store.task(&task.id).await?.skill, task.skill);
        for wrong in [&task.id[..8], "no-such-task", &task.id.to_uppercase()] {
            match store.task_state(wrong).await {
                Err(StoreError::NotFound(_)) => {}
                other => bail!("task_state({wrong}): {other:?}"),
            }
        }
        // A deleted task is gone at once, read before or not.
        store.delete_task(&task.id).await?;
        assert!(matches!(
            store.task_state(&task.id).await,
            Err(StoreError::NotFound(_))
        ));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unleased_step_commits_only_while_nobody_holds_the_lease() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;

        // Free: committed like any step, with its author and the next observation.
        let first = unleased_commit(1, &task.state, json!({"a": 1}));
        store.commit_unleased_step(&task.id, 0, &first).await?;
        let after = store.task(&task.id).await?;
        assert_eq!((after.version, &after.state), (1, &json!({"a": 1})));
        let journal = store.journal(&task.id).await?;
        assert_eq!(journal.len(), 1);
        assert_eq!(journal[0].author.as_deref(), Some("key-1"));
        assert_eq!(
            store.observation(&task.id, 2).await?.as_deref(),
            Some("observation 2 (changed)")
        );
        // The write took no lease.
        assert_eq!(store.lease(&task.id).await?, None);

        // Held: refused, naming the holder; nothing written.
        store
            .acquire_lease(&task.id, &claim("a"), 60_000, None)
            .await?;
        let second = unleased_commit(2, &after.state, json!({"b": 2}));
        match store.commit_unleased_step(&task.id, 1, &second).await {
            Err(StoreError::Leased { lease, .. }) => assert_eq!(lease.holder, "runner a"),
            other => bail!("a write while a runner holds the lease: {other:?}"),
        }
        assert_eq!(store.task(&task.id).await?.version, 1);
        assert_eq!(store.journal(&task.id).await?.len(), 1);
        // While the lease is held, the lease answers first, whatever the version: the writer
        // learns that a runner drives the task.
        match store.commit_unleased_step(&task.id, 0, &second).await {
            Err(StoreError::Leased { .. }) => {}
            other => bail!("a stale write while a runner holds the lease: {other:?}"),
        }

        // Released: the write goes through; the runner's next lease reads its state.
        store.release_lease(&task.id, "a").await?;
        store.commit_unleased_step(&task.id, 1, &second).await?;
        assert_eq!(store.task(&task.id).await?.version, 2);

        // Expired: free for the writer too, and the expired lease is left as it was.
        store.acquire_lease(&task.id, &claim("b"), 1, None).await?;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let state = store.task(&task.id).await?.state;
        store
            .commit_unleased_step(&task.id, 2, &unleased_commit(3, &state, json!({"c": 3})))
            .await?;
        assert_eq!(
            store.lease(&task.id).await?.map(|l| l.token),
            Some("b".into())
        );

        // Stale: the version decides, and says which is current.
        let state = store.task(&task.id).await?.state;
        match store
            .commit_unleased_step(&task.id, 1, &unleased_commit(2, &state, json!({"d": 4})))
            .await
        {
            Err(StoreError::Conflict {
                expected: 1,
                actual: 3,
                ..
            }) => {}
            other => bail!("a stale write: {other:?}"),
        }
        assert!(matches!(
            store.commit_unleased_step("no-such-task", 0, &first).await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.journal(&task.id).await?.len(), 3);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_unleased_writers_of_one_version_commit_once() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let barrier = Arc::new(Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let (store, barrier, task) = (store.clone(), barrier.clone(), task.clone());
                tokio::spawn(async move {
                    let commit = unleased_commit(1, &task.state, json!({ "writer": i }));
                    barrier.wait().await;
                    store.commit_unleased_step(&task.id, 0, &commit).await
                })
            })
            .collect();
        let mut committed = 0;
        for racer in racers {
            match racer.await? {
                Ok(()) => committed += 1,
                Err(StoreError::Conflict { actual: 1, .. }) => {}
                Err(other) => bail!("unexpected: {other}"),
            }
        }
        assert_eq!(committed, 1);
        assert_eq!(store.journal(&task.id).await?.len(), 1);
        Ok(())
    })
    .await
}

/// Writers and runners on one task at once: a writer is refused (`Leased`) or commits between
/// two runners, never inside one; every runner reads, under its lease, the version its commit
/// then extends, so no commit is ever stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unleased_writers_never_land_inside_a_runners_lease() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let runners: Vec<_> = (0..2)
            .map(|r| {
                let (store, id) = (store.clone(), task.id.clone());
                tokio::spawn(async move {
                    let mut steps = 0;
                    for round in 0..30 {
                        let token = format!("runner-{r}-{round}");
                        match store.acquire_lease(&id, &claim(&token), 60_000, None).await {
                            Ok(_) => {}
                            Err(StoreError::Leased { .. }) => continue,
                            Err(other) => bail!("runner {r}: {other}"),
                        }
                        let now = store.task(&id).await?;
                        tokio::task::yield_now().await;
                        let commit = step_commit(
                            now.version + 1,
                            &now.state,
                            json!({ "runner": token }),
                            false,
                        );
                        // Under the lease nobody else writes: the version read is current.
                        store.commit_step(&id, now.version, &commit).await?;
                        store.release_lease(&id, &token).await?;
                        steps += 1;
                    }
                    anyhow::Ok(steps)
                })
            })
            .collect();
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (store, id) = (store.clone(), task.id.clone());
                tokio::spawn(async move {
                    let mut steps = 0;
                    for round in 0..30 {
                        let now = store.task(&id).await?;
                        let commit = unleased_commit(
                            now.version + 1,
                            &now.state,
                            json!({ "writer": format!("{w}-{round}") }),
                        );
                        match store.commit_unleased_step(&id, now.version, &commit).await {
                            Ok(()) => steps += 1,
                            Err(StoreError::Leased { .. } | StoreError::Conflict { .. }) => {}
                            Err(other) => bail!("writer {w}: {other}"),
                        }
                    }
                    anyhow::Ok(steps)
                })
            })
            .collect();
        let mut total = 0;
        for handle in runners.into_iter().chain(writers) {
            total += handle.await??;
        }
        let after = store.task(&task.id).await?;
        assert_eq!(after.version, total);
        assert_eq!(store.journal(&task.id).await?.len() as u64, total);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_observation_moves_on_with_its_note_added_once() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let note = "(changed from outside)";
        let carried = |step: u64, state: &Value| {
            let mut commit = unleased_commit(step, state, json!({ "a": step }));
            commit.next_observation = Some(NextObservation::Carried { note: note.into() });
            commit
        };
        // The task's opening observation (step 1) goes on to step 2 with the note, and a
        // second write does not add it again.
        let task = store.create_task(new_task(), &json!({})).await?;
        let first = carried(1, &task.state);
        store.commit_unleased_step(&task.id, 0, &first).await?;
        let second = carried(2, &first.new_state);
        store.commit_unleased_step(&task.id, 1, &second).await?;
        let with_note = format!("start\n\n{note}");
        assert_eq!(
            store.observations(&task.id).await?,
            [
                (1, "start".to_owned()),
                (2, with_note.clone()),
                (3, with_note.clone())
            ]
        );
        // A refused write carries nothing.
        let stale = carried(2, &first.new_state);
        assert!(matches!(
            store.commit_unleased_step(&task.id, 1, &stale).await,
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(store.observation(&task.id, 4).await?, None);

        // With no observation to carry, the note alone; with an empty one, too.
        let bare = store
            .create_task(
                NewTask {
                    opening_observation: String::new(),
                    ..new_task()
                },
                &json!({}),
            )
            .await?;
        store
            .commit_unleased_step(&bare.id, 0, &carried(1, &bare.state))
            .await?;
        assert_eq!(store.observation(&bare.id, 2).await?.as_deref(), Some(note));
        // Text that is not the note's own end gets the note; unicode is counted as characters.
        let other = store
            .create_task(
                NewTask {
                    opening_observation: "étagère 7 pleine — (changed".into(),
                    ..new_task()
                },
                &json!({}),
            )
            .await?;
        store
            .commit_unleased_step(&other.id, 0, &carried(1, &other.state))
            .await?;
        assert_eq!(
            store.observation(&other.id, 2).await?,
            Some(format!("étagère 7 pleine — (changed\n\n{note}"))
        );
        Ok(())
    })
    .await
}
