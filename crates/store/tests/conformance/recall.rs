//! The recall index (docs/recall.md, "Recall and provenance"): written in the transaction of what it
//! indexes, on every backend alike — committed steps are found, a refused write never is; a
//! fork sees its parent's history up to the fork point only; compaction and deletion take the
//! entries with them; a recall result is not indexed again; an older database is indexed by
//! the migration.

use skillstate_core::recall::{HitCursor, HitReader, RecallKind, RecallQuery};
use skillstate_core::{SecretValues, WriteOnly};

use super::*;

/// Every hit of `query` as `(step, kind, text)`, page by page (`page` raw hits per call).
async fn found(
    store: &dyn Store,
    task: &str,
    query: &RecallQuery,
    page: usize,
) -> anyhow::Result<Vec<(u64, RecallKind, String)>> {
    let none = WriteOnly::none();
    let secrets = SecretValues::default();
    let reader = HitReader {
        write_only: &none,
        secrets: &secrets,
        words: &query.word_tokens,
    };
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let hits = store.search_journal(task, query, after, page).await?;
        let full = hits.len() == page;
        for hit in hits {
            after = Some(HitCursor {
                step: hit.step,
                id: hit.id,
            });
            let shown = hit
                .reveal(&reader)
                .context("an entry without write-only values is shown")?;
            out.push((shown.step, shown.kind, shown.text));
        }
        if !full {
            return Ok(out);
        }
    }
}

fn words(text: &str) -> RecallQuery {
    RecallQuery::new(Some(text), None).unwrap()
}

fn answer(reasoning: &str, patch: &Value, action: &Value) -> String {
    json!({"reasoning": reasoning, "state_patch": patch, "action": action}).to_string()
}

/// Commits step `step` of `task` at `state` with `reasoning`, a merge `patch` and an action,
/// then its result; returns the new state.
async fn step(
    store: &dyn Store,
    task: &str,
    step: u64,
    state: &Value,
    (reasoning, patch, tool, args): (&str, Value, &str, Value),
    observation: &str,
) -> anyhow::Result<Value> {
    let action = json!({"tool": tool, "args": args});
    let mut commit = step_commit(step, state, patch.clone(), true);
    commit.entry.output = answer(reasoning, &patch, &action);
    commit.entry.action = Some(action);
    if let Some(intent) = commit.intent.as_mut() {
        intent.tool = tool.to_owned();
        intent.args = args;
    }
    store.commit_step(task, step - 1, &commit).await?;
    store
        .record_action_result(
            task,
            &ActionResult {
                next_observation: observation.to_owned(),
                ..action_result(step)
            },
        )
        .await?;
    Ok(commit.new_state)
}

/// A small warehouse history: item_42 stored on shelf_7, moved to shelf_9, another item, an
/// order.
async fn warehouse_history(store: &dyn Store) -> anyhow::Result<(String, Value)> {
    let task = store
        .create_task(
            NewTask {
                opening_observation: "Shipment arrived containing item_42. Store it on shelf_7."
                    .into(),
                ..new_task()
            },
            &json!({}),
        )
        .await?
        .id;
    let s = json!({});
    let s = step(
        store,
        &task,
        1,
        &s,
        (
            "Store item_42 on shelf_7 as asked.",
            json!({"inventory": {"shelf_7": "item_42"}}),
            "store",
            json!({"item": "item_42", "shelf": "shelf_7"}),
        ),
        "Success: stored. Maintenance required on shelf_7. Move its item to shelf_9.",
    )
    .await?;
    let s = step(
        store,
        &task,
        2,
        &s,
        (
            "Move item_42 off shelf_7.",
            json!({"inventory": {"shelf_7": null, "shelf_9": "item_42"}}),
            "move",
            json!({"item": "item_42", "from": "shelf_7", "to": "shelf_9"}),
        ),
        "Success: moved. Shipment arrived containing item_77. Store it on shelf_7.",
    )
    .await?;
    let s = step(
        store,
        &task,
        3,
        &s,
        (
            "Store the new item.",
            json!({"inventory": {"shelf_7": "item_77"}, "Inventory": {"x": 1}}),
            "store",
            json!({"item": "item_77", "shelf": "shelf_7"}),
        ),
        "Success: stored. Customer ordered item_42.",
    )
    .await?;
    Ok((task, s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_steps_are_found_newest_first_by_words_and_by_pointer() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, _) = warehouse_history(store.as_ref()).await?;
        let (other, _) = warehouse_history(store.as_ref()).await?;

        let hits = found(store.as_ref(), &task, &words("item_42"), 50).await?;
        let shown: Vec<(u64, RecallKind)> = hits.iter().map(|(s, k, _)| (*s, *k)).collect();
        assert_eq!(
            shown,
            // Newest first: within a step, what it wrote before the observation it began from.
            vec![
                (4, RecallKind::Observation),
                (2, RecallKind::State),
                (2, RecallKind::Action),
                (2, RecallKind::Reasoning),
                (1, RecallKind::State),
                (1, RecallKind::Action),
                (1, RecallKind::Reasoning),
                (1, RecallKind::Observation),
            ],
            "{hits:#?}"
        );
        assert_eq!(hits[0].2, "Success: stored. Customer ordered item_42.");
        assert!(hits[2].2.starts_with("move {"), "{}", hits[2].2);
        assert_eq!(hits[1].2, "/inventory/shelf_9 = \"item_42\"");
        // Every word must match; an id never matches a longer number.
        assert_eq!(
            found(store.as_ref(), &task, &words("item_42 shelf_9"), 50)
                .await?
                .len(),
            2
        );
        assert!(
            found(store.as_ref(), &task, &words("item_4"), 50)
                .await?
                .is_empty()
        );
        assert_eq!(
            found(store.as_ref(), &task, &words("ITEM_77 Shipment"), 50)
                .await?
                .len(),
            1
        );

        // Pages of one continue where the last ended, and give the same hits.
        assert_eq!(
            found(store.as_ref(), &task, &words("item_42"), 1).await?,
            hits
        );

        // Oldest first, step range, kinds.
        let mut query = words("item_42");
        query.oldest_first = true;
        query.from_step = Some(2);
        query.kinds = vec![RecallKind::Action, RecallKind::Observation];
        let ranged = found(store.as_ref(), &task, &query, 50).await?;
        let shown: Vec<(u64, RecallKind)> = ranged.iter().map(|(s, k, _)| (*s, *k)).collect();
        assert_eq!(
            shown,
            vec![(2, RecallKind::Action), (4, RecallKind::Observation)]
        );

        // A pointer finds the writes at and below it, case and all.
        let query = RecallQuery::new(None, Some("/inventory/shelf_7")).unwrap();
        let writes = found(store.as_ref(), &task, &query, 50).await?;
        assert_eq!(
            writes
                .iter()
                .map(|(s, _, t)| (*s, t.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (3, "/inventory/shelf_7 = \"item_77\""),
                (2, "/inventory/shelf_7 removed"),
                (1, "/inventory/shelf_7 = \"item_42\""),
            ]
        );
        let query = RecallQuery::new(None, Some("/inventory")).unwrap();
        assert_eq!(found(store.as_ref(), &task, &query, 50).await?.len(), 4);
        let query = RecallQuery::new(Some("item_77"), Some("/inventory")).unwrap();
        assert_eq!(found(store.as_ref(), &task, &query, 50).await?.len(), 1);

        // Another task's history is never found, nor a task that does not exist.
        let hits_other = found(store.as_ref(), &other, &words("item_42"), 50).await?;
        assert_eq!(hits_other.len(), hits.len());
        assert!(
            found(store.as_ref(), "no-such-task", &words("item_42"), 50)
                .await?
                .is_empty()
        );
        store.delete_task(&other).await?;
        assert!(
            found(store.as_ref(), &other, &words("item_42"), 50)
                .await?
                .is_empty()
        );
        assert_eq!(
            found(store.as_ref(), &task, &words("item_42"), 50).await?,
            hits
        );
        anyhow::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_and_a_rejected_answer_are_never_found() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, state) = warehouse_history(store.as_ref()).await?;
        // A commit at a stale version is refused whole: nothing of it is indexed.
        let mut stale = step_commit(
            4,
            &state,
            json!({"inventory": {"shelf_1": "item_999"}}),
            true,
        );
        stale.entry.output = answer(
            "zebra reasoning",
            &json!({}),
            &json!({"tool": "wait", "args": {}}),
        );
        assert!(store.commit_step(&task, 1, &stale).await.is_err());
        let mut rejected_answer = rejected(4, 1);
        rejected_answer.output = answer(
            "zebra reasoning",
            &json!({}),
            &json!({"tool": "wait", "args": {}}),
        );
        store.record_rejection(&task, &rejected_answer).await?;
        assert!(
            found(store.as_ref(), &task, &words("zebra"), 50)
                .await?
                .is_empty()
        );
        assert!(
            found(store.as_ref(), &task, &words("item_999"), 50)
                .await?
                .is_empty()
        );
        anyhow::Ok(())
    })
    .await
}

/// Steps committed together (SQLite's writer commits concurrent writes in one transaction,
/// each under a savepoint, and indexes their entries once at the end): each accepted one is
/// found by its own words, each refused one (a stale version, rolled back to its savepoint
/// inside the same transaction) never is, and the index holds nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_committed_together_are_found_and_refused_ones_among_them_never() -> anyhow::Result<()>
{
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let mut tasks = Vec::new();
        for _ in 0..24 {
            tasks.push(store.create_task(new_task(), &json!({})).await?.id);
        }
        let commits = tasks.iter().enumerate().map(|(n, task)| {
            let store = store.clone();
            let task = task.clone();
            async move {
                // Every third one names a version the task is not at: refused whole.
                let stale = n % 3 == 0;
                let word = format!("crate_{n}");
                let mut commit =
                    step_commit(1, &json!({}), json!({"inventory": {"shelf_1": word}}), true);
                commit.entry.output = answer(
                    &format!("store {word} as told"),
                    &json!({"inventory": {"shelf_1": word}}),
                    &json!({"tool": "wait", "args": {}}),
                );
                let at = if stale { 5 } else { 0 };
                let result = store.commit_step(&task, at, &commit).await;
                (task, word, stale, result)
            }
        });
        let outcomes = futures_util::future::join_all(commits).await;
        for (task, word, stale, result) in outcomes {
            assert_eq!(result.is_err(), stale, "{word}: {result:?}");
            let hits = found(store.as_ref(), &task, &words(&word), 50).await?;
            if stale {
                assert!(hits.is_empty(), "{word} was refused, yet found: {hits:?}");
            } else {
                let kinds: Vec<RecallKind> = hits.iter().map(|(_, kind, _)| *kind).collect();
                assert!(
                    kinds.contains(&RecallKind::Reasoning) && kinds.contains(&RecallKind::State),
                    "{word}: {hits:?}"
                );
                assert!(hits.iter().all(|(step, _, _)| *step == 1), "{hits:?}");
            }
            // The other tasks' words are never this task's hits.
            let other = format!("crate_{}", (word[6..].parse::<usize>()? + 1) % 24);
            assert!(
                found(store.as_ref(), &task, &words(&other), 50)
                    .await?
                    .is_empty()
            );
        }
        anyhow::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_recalls_its_parents_history_up_to_the_fork_only() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, _) = warehouse_history(store.as_ref()).await?;
        let parent_state = store.task(&task).await?;
        let at_one = json!({"inventory": {"shelf_7": "item_42"}});
        let fork = store.fork_task(&task, 1, &at_one, None).await?.id;
        let hits = found(store.as_ref(), &fork, &words("item_42"), 50).await?;
        assert!(hits.iter().all(|(s, _, _)| *s <= 2), "{hits:#?}");
        let steps: Vec<u64> = hits.iter().map(|(s, _, _)| *s).collect();
        assert_eq!(steps, vec![1, 1, 1, 1], "{hits:#?}");
        // The observation step 2 starts from belongs to the fork's history; step 2 does not.
        let next = found(store.as_ref(), &fork, &words("maintenance"), 50).await?;
        assert_eq!(next.iter().map(|(s, _, _)| *s).collect::<Vec<_>>(), vec![2]);
        assert!(
            found(store.as_ref(), &fork, &words("item_77"), 50)
                .await?
                .is_empty()
        );
        // The fork's own next step is its own; the parent never sees it.
        step(
            store.as_ref(),
            &fork,
            2,
            &at_one,
            ("Keep it.", json!({"note": "kangaroo"}), "wait", json!({})),
            "Waited.",
        )
        .await?;
        assert_eq!(
            found(store.as_ref(), &fork, &words("kangaroo"), 50)
                .await?
                .len(),
            1
        );
        assert!(
            found(store.as_ref(), &task, &words("kangaroo"), 50)
                .await?
                .is_empty()
        );
        assert_eq!(store.task(&task).await?.version, parent_state.version);
        anyhow::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_and_deletion_take_the_entries_with_them() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, _) = warehouse_history(store.as_ref()).await?;
        store
            .compact_task(&task, 3, &json!({"inventory": {"shelf_9": "item_42"}}))
            .await?;
        let hits = found(store.as_ref(), &task, &words("item_42"), 50).await?;
        assert!(hits.iter().all(|(s, _, _)| *s >= 3), "{hits:#?}");
        assert!(!hits.is_empty());
        store.delete_task(&task).await?;
        assert_eq!(db.count("SELECT COUNT(*) FROM recall_entries").await?, 0);
        if db.backend == Backend::Sqlite {
            // The full-text index holds nothing of a deleted task either.
            assert_eq!(
                db.count("SELECT COUNT(*) FROM recall_fts WHERE recall_fts MATCH 'item'")
                    .await?,
                0
            );
        }
        anyhow::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_result_is_not_indexed_again() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, state) = warehouse_history(store.as_ref()).await?;
        step(
            store.as_ref(),
            &task,
            4,
            &state,
            ("Where is it?", json!({}), "recall", json!({"query": "item_42"})),
            "Recall: 1 matches for \"item_42\", newest first.\n[step 2 state] /inventory/shelf_9 = \"item_42\" platypus",
        )
        .await?;
        assert!(found(store.as_ref(), &task, &words("platypus"), 50).await?.is_empty());
        // The step that asked is indexed as any other.
        assert_eq!(found(store.as_ref(), &task, &words("where"), 50).await?.len(), 1);
        anyhow::Ok(())
    })
    .await
}

/// A state write (a step with an author) at `version`, carrying the pending observation over
/// to the step after it with a note, as the runtime's `authored_step` does.
async fn authored(
    store: &dyn Store,
    task: &str,
    version: u64,
    state: &Value,
    patch: Value,
) -> anyhow::Result<Value> {
    let mut commit = step_commit(version + 1, state, patch, false);
    commit.entry.author = Some("key-1".into());
    commit.next_observation = Some(NextObservation::Carried {
        note: "(The state was changed outside this task since the last step.)".into(),
    });
    store.commit_unleased_step(task, version, &commit).await?;
    Ok(commit.new_state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_carried_over_a_state_write_is_not_indexed_again() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, state) = warehouse_history(store.as_ref()).await?;
        let observed = "Success: stored. Customer ordered item_42.";
        // Three writes in a row: the observation of step 4 moves to step 5, 6, then 7.
        let mut state = state;
        for (version, shelf) in [(3, "shelf_1"), (4, "shelf_2"), (5, "shelf_3")] {
            let carried = store
                .observation(&task, version + 1)
                .await?
                .context("the observation to carry")?;
            assert!(carried.starts_with(observed), "{carried}");
            state = authored(
                store.as_ref(),
                &task,
                version,
                &state,
                json!({"inventory": {shelf: "item_88"}}),
            )
            .await?;
        }
        assert!(
            store
                .observation(&task, 7)
                .await?
                .is_some_and(|o| o.contains("changed outside"))
        );
        // Found once, at the step it was observed; the note is no fact of the task's.
        let hits = found(store.as_ref(), &task, &words("ordered"), 50).await?;
        assert_eq!(
            hits.iter().map(|(s, k, _)| (*s, *k)).collect::<Vec<_>>(),
            vec![(4, RecallKind::Observation)],
            "{hits:#?}"
        );
        assert!(
            found(store.as_ref(), &task, &words("outside"), 50)
                .await?
                .is_empty()
        );
        // What the writes wrote is indexed as any step's state.
        assert_eq!(
            found(store.as_ref(), &task, &words("item_88"), 50)
                .await?
                .iter()
                .map(|(s, k, _)| (*s, *k))
                .collect::<Vec<_>>(),
            vec![
                (6, RecallKind::State),
                (5, RecallKind::State),
                (4, RecallKind::State)
            ]
        );
        // The model's next step and what it observes are indexed as before, the carried
        // observation's text included when a model step produced it.
        step(
            store.as_ref(),
            &task,
            7,
            &state,
            (
                "Pick item_42 for the order.",
                json!({}),
                "pick",
                json!({"item": "item_42"}),
            ),
            observed,
        )
        .await?;
        assert_eq!(
            found(store.as_ref(), &task, &words("ordered"), 50)
                .await?
                .iter()
                .map(|(s, k, _)| (*s, *k))
                .collect::<Vec<_>>(),
            vec![(8, RecallKind::Observation), (4, RecallKind::Observation)]
        );
        // A fork copies the index as it stands: the carried copies stay out there too.
        let fork = store.fork_task(&task, 6, &state, None).await?;
        assert_eq!(
            found(store.as_ref(), &fork.id, &words("ordered"), 50)
                .await?
                .iter()
                .map(|(s, k, _)| (*s, *k))
                .collect::<Vec<_>>(),
            vec![(4, RecallKind::Observation)]
        );
        anyhow::Ok(())
    })
    .await
}

/// A held-back result's observation, written by the next step's commit (the path a worker
/// takes), is indexed by the same rules as one recorded on its own: found at its step, never
/// when it is a recall result or follows a step someone other than the model wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_observation_is_indexed_by_the_same_rules() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?.id;
        // Each step acts; its result lands with the next step's commit. Step 2 recalls, step 3
        // is written by someone other than the model (with an action all the same).
        let mut state = json!({});
        let mut previous: Option<ActionResult> = None;
        for (step, tool, author, observed) in [
            (1, "store", None, "Stored item_501 on shelf_3."),
            (2, "recall", None, "Found item_502 at step 1."),
            (3, "store", Some("key-1"), "Stored item_503 as asked."),
            (4, "store", None, "Stored item_504."),
        ] {
            let mut commit = step_commit(step, &state, json!({"n": step}), true);
            commit.entry.author = author.map(str::to_owned);
            if let Some(intent) = commit.intent.as_mut() {
                intent.tool = tool.to_owned();
            }
            commit.previous_result = previous.take();
            store.commit_step(&task, step - 1, &commit).await?;
            state = commit.new_state;
            previous = Some(ActionResult {
                next_observation: observed.to_owned(),
                ..action_result(step)
            });
        }
        // The last result lands with the step that finishes the task.
        let mut stop = step_commit(5, &state, json!({"n": 5}), false);
        stop.previous_result = previous.take();
        stop.status = Some((TaskStatus::Completed, None));
        store.commit_step(&task, 4, &stop).await?;

        let mut observed_at = Vec::new();
        for item in ["item_501", "item_502", "item_503", "item_504"] {
            let hits = found(store.as_ref(), &task, &words(item), 50).await?;
            observed_at.push(
                hits.iter()
                    .filter(|(_, kind, _)| *kind == RecallKind::Observation)
                    .map(|(step, _, _)| *step)
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(observed_at, vec![vec![2], vec![], vec![], vec![5]]);
        // Indexed or not, every observation is stored.
        assert_eq!(
            store.observation(&task, 3).await?.as_deref(),
            Some("Found item_502 at step 1.")
        );
        assert_eq!(
            store.observation(&task, 4).await?.as_deref(),
            Some("Stored item_503 as asked.")
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_recall_is_indexed_by_its_migration() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, _) = warehouse_history(store.as_ref()).await?;
        let before = found(store.as_ref(), &task, &words("item_42"), 50).await?;
        store.release().await;
        drop(store);
        // Back to schema 10, as a database written by an earlier release.
        versions::back_to_schema_12(&db).await?;
        match db.backend {
            Backend::Sqlite => {
                db.execute(
                    "DROP TRIGGER observations_recalled; DROP TRIGGER observations_rerecalled; \
                     DROP TRIGGER observations_forgotten; DROP TRIGGER journal_forgotten; \
                     DROP TABLE recall_fts; DROP TABLE recall_entries; \
                     ALTER TABLE tasks DROP COLUMN env_checkpoint_step; \
                     DELETE FROM schema_migrations WHERE version >= 11",
                )
                .await?;
            }
            Backend::Postgres | Backend::PgBouncer => {
                db.execute(
                    "DROP TABLE recall_entries; \
                     DROP FUNCTION skillstate_recall_observation() CASCADE; \
                     DROP FUNCTION skillstate_forget_step() CASCADE; \
                     ALTER TABLE tasks DROP COLUMN env_checkpoint_step; \
                     DELETE FROM schema_migrations WHERE version >= 11",
                )
                .await?;
            }
        }
        let store = db.open().await?;
        assert_eq!(
            found(store.as_ref(), &task, &words("item_42"), 50).await?,
            before
        );
        anyhow::Ok(())
    })
    .await
}

/// An identifier is looked up by its number and checked whole: entries that hold the number
/// elsewhere (another shelf, a longer number, the tokens apart or reversed) are never hits,
/// however the pages fall and however many of them come between the hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identifier_finds_exactly_its_own_entries_between_decoys() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let task = store.create_task(new_task(), &initial).await?.id;
        let decoys = [
            "shelf_4298 is empty",
            "item_42985 arrived",
            "4298 units of item_1",
            "4298_item is not a name",
            "item 17 and 4298 apart",
        ];
        let mut state = initial.clone();
        let mut expected = Vec::new();
        for n in 1..=36u64 {
            let observation = if n % 6 == 0 {
                let text = format!("step {n}: item_4298 stored on shelf_{}", n % 4);
                expected.push((n + 1, text.clone()));
                text
            } else {
                format!("step {n}: {}", decoys[n as usize % decoys.len()])
            };
            state = step(
                store.as_ref(),
                &task,
                n,
                &state,
                ("noted", json!({"n": n}), "wait", json!({})),
                &observation,
            )
            .await?;
        }
        expected.reverse();
        let query = RecallQuery {
            kinds: vec![RecallKind::Observation],
            ..words("ITEM-4298")
        };
        assert!(
            query.needs_check(),
            "the identifier is looked up by its anchor"
        );
        for page in [1, 2, 5, 50] {
            let hits = found(store.as_ref(), &task, &query, page).await?;
            assert_eq!(
                hits.iter()
                    .map(|(step, _, text)| (*step, text.clone()))
                    .collect::<Vec<_>>(),
                expected,
                "pages of {page}"
            );
        }
        // Two words, both identifiers: only entries with both.
        let both = RecallQuery {
            kinds: vec![RecallKind::Observation],
            ..words("item_4298 shelf_2")
        };
        let hits = found(store.as_ref(), &task, &both, 3).await?;
        assert_eq!(
            hits.iter().map(|(step, _, _)| *step).collect::<Vec<_>>(),
            [31, 19, 7]
        );
        // The number alone is a word of its own and finds the decoys too: the six hits and the
        // 24 decoys that have the token (not those with `item_42985`, n % 5 == 1).
        let number = RecallQuery {
            kinds: vec![RecallKind::Observation],
            ..words("4298")
        };
        assert!(!number.needs_check());
        assert_eq!(found(store.as_ref(), &task, &number, 50).await?.len(), 30);
        anyhow::Ok(())
    })
    .await
}

/// Two tasks whose steps interleave, one short and one long: each finds its own entries only,
/// newest first, whether its search reads the index from its first entry on alone (the long
/// task: most of that part is its own) or also intersects with its key (the short one, whose
/// range is mostly the other's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_tasks_find_their_own_entries_only() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let short = store.create_task(new_task(), &initial).await?.id;
        let long = store.create_task(new_task(), &initial).await?.id;
        let mut short_state = step(
            store.as_ref(),
            &short,
            1,
            &initial,
            (
                "short one",
                json!({"s": 1}),
                "ship",
                json!({"item": "item_7"}),
            ),
            "short: item_7 shipped",
        )
        .await?;
        let mut long_state = initial.clone();
        for n in 1..=40 {
            long_state = step(
                store.as_ref(),
                &long,
                n,
                &long_state,
                ("long", json!({"l": n}), "ship", json!({"item": "item_7"})),
                &format!("long {n}: item_7 shipped"),
            )
            .await?;
        }
        short_state = step(
            store.as_ref(),
            &short,
            2,
            &short_state,
            (
                "short two",
                json!({"s": 2}),
                "ship",
                json!({"item": "item_7"}),
            ),
            "short: item_7 shipped again",
        )
        .await?;
        let _ = short_state;
        let query = RecallQuery {
            kinds: vec![RecallKind::Observation],
            ..words("item_7")
        };
        let short_hits = found(store.as_ref(), &short, &query, 50).await?;
        assert_eq!(
            short_hits
                .iter()
                .map(|(step, _, text)| (*step, text.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (3, "short: item_7 shipped again"),
                (2, "short: item_7 shipped")
            ]
        );
        let long_hits = found(store.as_ref(), &long, &query, 7).await?;
        assert_eq!(long_hits.len(), 40);
        assert!(
            long_hits
                .iter()
                .all(|(_, _, text)| text.starts_with("long "))
        );
        let steps: Vec<u64> = long_hits.iter().map(|(step, _, _)| *step).collect();
        assert_eq!(steps, (2..=41).rev().collect::<Vec<u64>>());
        Ok(())
    })
    .await
}
