//! Boards on every backend: creating and finding them, the version check of a board write,
//! a task's step and its board write committed together or not at all, attaching tasks,
//! deleting, time travel with every hash checked — and N writers racing on one board through
//! `commit_step_with_board`, rebasing with core's `board::rebase`: every disjoint write lands,
//! every overlapping one is refused and retried from the fresh value, no update is lost, and
//! the board equals a serial replay of its journal.

use skillstate_core::board::rebase;

use super::*;

fn new_board(name: &str, tenant: Option<&str>, initial: Value) -> NewBoard {
    NewBoard {
        name: name.into(),
        schema: json!({"type": "object"}),
        initial_state: initial,
        tenant: tenant.map(str::to_owned),
    }
}

/// The write that applies `patch` to `state`.
fn board_write(state: &Value, patch: Value, author: BoardAuthor) -> BoardWrite {
    let new_state = StatePatch::from_value(&patch)
        .unwrap()
        .apply(state)
        .unwrap();
    BoardWrite {
        state_hash: state_hash(&new_state),
        patch,
        new_state,
        author,
        rebased_from: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boards_are_found_by_id_and_by_name_per_tenant() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({"plan": {"goal": "ship"}, "api": {}});
        let first = store
            .create_board(new_board("release-42", None, initial.clone()))
            .await?;
        assert_eq!((first.version, &first.state), (0, &initial));
        assert_eq!(first.state_hash, state_hash(&initial));
        assert_eq!(first.tenant, None);
        assert_eq!(store.board(&first.id, None).await?, first);
        assert_eq!(store.board("release-42", None).await?, first);
        // By id whatever the tenant asked for (the caller checks ownership); by name only among
        // the tenant's boards.
        assert_eq!(store.board(&first.id, Some("acme")).await?, first);
        assert!(matches!(
            store.board("release-42", Some("acme")).await,
            Err(StoreError::NoSuchBoard(_))
        ));
        // One name per tenant, and untenanted boards share one namespace.
        match store
            .create_board(new_board("release-42", None, json!({})))
            .await
        {
            Err(StoreError::BoardExists { name }) => assert_eq!(name, "release-42"),
            other => bail!("a second untenanted release-42: {other:?}"),
        }
        let acme = store
            .create_board(new_board("release-42", Some("acme"), json!({"a": 1})))
            .await?;
        assert!(matches!(
            store
                .create_board(new_board("release-42", Some("acme"), json!({})))
                .await,
            Err(StoreError::BoardExists { .. })
        ));
        let other = store
            .create_board(new_board("release-42", Some("globex"), json!({})))
            .await?;
        assert_eq!(store.board("release-42", Some("acme")).await?, acme);
        assert_eq!(store.board("release-42", Some("globex")).await?, other);
        for bad in ["", "has space", "slash/inside", &"x".repeat(101), &first.id] {
            match store.create_board(new_board(bad, None, json!({}))).await {
                Err(StoreError::BadBoardName { .. }) => {}
                other => bail!("name {bad:?}: {other:?}"),
            }
        }
        for missing in [
            "nope",
            "0190a000-0000-7000-8000-000000000000",
            &first.id[..8],
        ] {
            assert!(matches!(
                store.board(missing, None).await,
                Err(StoreError::NoSuchBoard(_))
            ));
        }
        // Listings: newest first, per tenant or all.
        let all: Vec<String> = store
            .list_boards(None)
            .await?
            .into_iter()
            .map(|b| b.id)
            .collect();
        assert_eq!(all, [other.id.clone(), acme.id.clone(), first.id.clone()]);
        let listed = store.list_boards(Some("acme")).await?;
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (
                listed[0].id.as_str(),
                listed[0].name.as_str(),
                listed[0].version
            ),
            (acme.id.as_str(), "release-42", 0)
        );
        assert_eq!(listed[0].members, 0);
        assert_eq!(listed[0].tenant.as_deref(), Some("acme"));
        assert!(store.list_boards(Some("initech")).await?.is_empty());
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_write_names_the_version_it_replaces() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({"plan": {"steps": 0}});
        let board = store
            .create_board(new_board("b", None, initial.clone()))
            .await?;
        let one = board_write(&initial, json!({"plan": {"steps": 1}}), BoardAuthor::Cli);
        assert_eq!(store.commit_board_write(&board.id, 0, &one).await?, 1);
        let mut two = board_write(
            &one.new_state,
            json!([{"op": "add", "path": "/api", "value": {"v": 2}}]),
            BoardAuthor::Key { key: "key-1".into() },
        );
        two.rebased_from = Some(0);
        // A stale writer is refused with the version the board is at, and writes nothing.
        match store.commit_board_write(&board.id, 0, &two).await {
            Err(StoreError::BoardMoved {
                expected, actual, ..
            }) => assert_eq!((expected, actual), (0, 1)),
            other => bail!("stale write: {other:?}"),
        }
        assert_eq!(store.commit_board_write(&board.id, 1, &two).await?, 2);
        let now = store.board(&board.id, None).await?;
        assert_eq!((now.version, &now.state), (2, &two.new_state));
        assert_eq!(now.state_hash, two.state_hash);
        assert!(now.updated_at >= board.updated_at);
        assert!(matches!(
            store.commit_board_write("no-such-board", 0, &one).await,
            Err(StoreError::NoSuchBoard(_))
        ));
        // The journal: the patches as applied, hashes, authors, rebases.
        let writes = store.board_writes(&board.id, 0, 10).await?;
        assert_eq!(writes.len(), 2);
        assert_eq!(
            (writes[0].version, &writes[0].patch, &writes[0].author),
            (1, &one.patch, &BoardAuthor::Cli)
        );
        assert_eq!(writes[0].rebased_from, None);
        assert_eq!(
            (writes[1].version, &writes[1].patch, &writes[1].state_hash),
            (2, &two.patch, &two.state_hash)
        );
        assert_eq!(writes[1].author, BoardAuthor::Key { key: "key-1".into() });
        assert_eq!(writes[1].rebased_from, Some(0));
        assert_eq!(store.board_writes(&board.id, 2, 2).await?, writes[1..]);
        assert_eq!(store.board_initial_state(&board.id).await?, initial);
        // Time travel, each hash checked.
        for (version, expected) in [(0, &initial), (1, &one.new_state), (2, &two.new_state)] {
            assert_eq!(&board_state_at(store.as_ref(), &board.id, version).await?, expected);
        }
        match board_state_at(store.as_ref(), &board.id, 3).await {
            Err(StoreError::NoSuchBoardVersion {
                version, current, ..
            }) => assert_eq!((version, current), (3, 2)),
            other => bail!("version 3: {other:?}"),
        }
        // A journal row changed behind the store's back is found, naming its version.
        db.execute(&format!(
            "UPDATE board_writes SET patch = '{{\"plan\": {{\"steps\": 7}}}}' WHERE board_id = '{}' AND version = 1",
            board.id
        ))
        .await?;
        match board_state_at(store.as_ref(), &board.id, 2).await {
            Err(error @ StoreError::BoardCorrupt { version: 1, .. }) => {
                assert!(error.to_string().contains(&board.id), "{error}");
            }
            other => bail!("a tampered journal: {other:?}"),
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_and_its_board_write_commit_together_or_not_at_all() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let board = store
            .create_board(new_board("b", None, json!({"n": 0})))
            .await?;
        store.attach_task(&board.id, &task.id).await?;
        let author = |step| BoardAuthor::Task {
            task: task.id.clone(),
            step,
        };
        let mut step1 = step_commit(1, &json!({}), json!({"mine": 1}), true);
        step1.entry.board_version = Some(0);
        let write1 = board_write(&json!({"n": 0}), json!({"n": 1}), author(1));
        let version = store
            .commit_step_with_board(&task.id, 0, &step1, &board.id, 0, &write1)
            .await?;
        assert_eq!(version, 1);
        assert_eq!(store.task(&task.id).await?.version, 1);
        assert_eq!(store.board(&board.id, None).await?.state, json!({"n": 1}));
        // The board version the prompt showed is journaled with the step.
        let journal = store.journal(&task.id).await?;
        assert_eq!(journal[0].board_version, Some(0));
        store
            .record_action_result(&task.id, &action_result(1))
            .await?;

        // A task conflict leaves the board untouched.
        let mut stale = step_commit(1, &json!({}), json!({"mine": 9}), false);
        stale.entry.board_version = Some(1);
        let write2 = board_write(&json!({"n": 1}), json!({"n": 2}), author(1));
        match store
            .commit_step_with_board(&task.id, 0, &stale, &board.id, 1, &write2)
            .await
        {
            Err(StoreError::Conflict {
                expected, actual, ..
            }) => assert_eq!((expected, actual), (0, 1)),
            other => bail!("stale task: {other:?}"),
        }
        let now = store.board(&board.id, None).await?;
        assert_eq!((now.version, &now.state), (1, &json!({"n": 1})));
        assert_eq!(store.board_writes(&board.id, 0, 9).await?.len(), 1);

        // A moved board leaves the task untouched: state, version, journal, intent.
        let mut step2 = step_commit(2, &json!({"mine": 1}), json!({"mine": 2}), true);
        step2.entry.board_version = Some(0);
        let write_on_0 = board_write(&json!({"n": 0}), json!({"n": 5}), author(2));
        match store
            .commit_step_with_board(&task.id, 1, &step2, &board.id, 0, &write_on_0)
            .await
        {
            Err(StoreError::BoardMoved {
                expected, actual, ..
            }) => assert_eq!((expected, actual), (0, 1)),
            other => bail!("moved board: {other:?}"),
        }
        let record = store.task(&task.id).await?;
        assert_eq!((record.version, &record.state), (1, &json!({"mine": 1})));
        assert_eq!(store.journal(&task.id).await?.len(), 1);
        assert_eq!(store.intents(&task.id).await?.len(), 1);
        assert_eq!(store.board(&board.id, None).await?.version, 1);

        // Retried on the newest version, both land.
        step2.entry.board_version = Some(1);
        let mut write2 = board_write(&json!({"n": 1}), json!({"n": 2}), author(2));
        write2.rebased_from = Some(0);
        assert_eq!(
            store
                .commit_step_with_board(&task.id, 1, &step2, &board.id, 1, &write2)
                .await?,
            2
        );
        assert_eq!(store.task(&task.id).await?.version, 2);
        let journal = store.journal(&task.id).await?;
        assert_eq!(
            journal.iter().map(|e| e.board_version).collect::<Vec<_>>(),
            [Some(0), Some(1)]
        );
        let writes = store.board_writes(&board.id, 1, 2).await?;
        assert_eq!(writes[1].author, author(2));
        assert_eq!(writes[1].rebased_from, Some(0));
        // Only a member writes the board with a step: a task attached nowhere, or to another
        // board, is refused, and neither its step nor the board moves.
        let outsider = store.create_task(new_task(), &json!({})).await?;
        let mut theirs = step_commit(1, &json!({}), json!({"mine": 1}), false);
        theirs.entry.board_version = Some(2);
        let outside_write = board_write(&json!({"n": 2}), json!({"n": 7}), author(1));
        match store
            .commit_step_with_board(&outsider.id, 0, &theirs, &board.id, 2, &outside_write)
            .await
        {
            Err(StoreError::NotAttached { task, board: named }) => {
                assert_eq!((task, named), (outsider.id.clone(), board.id.clone()))
            }
            other => bail!("a task attached nowhere: {other:?}"),
        }
        let other_board = store
            .create_board(new_board("other", None, json!({"n": 0})))
            .await?;
        store.attach_task(&other_board.id, &outsider.id).await?;
        match store
            .commit_step_with_board(&outsider.id, 0, &theirs, &board.id, 2, &outside_write)
            .await
        {
            Err(StoreError::AttachedElsewhere { attached, .. }) => {
                assert_eq!(attached, other_board.id)
            }
            other => bail!("a task of another board: {other:?}"),
        }
        assert_eq!(store.task(&outsider.id).await?.version, 0);
        assert!(store.journal(&outsider.id).await?.is_empty());
        let now = store.board(&board.id, None).await?;
        assert_eq!((now.version, &now.state), (2, &json!({"n": 2})));

        // A step of a task without a board journals no board version.
        let plain = store.create_task(new_task(), &json!({})).await?;
        store
            .commit_step(
                &plain.id,
                0,
                &step_commit(1, &json!({}), json!({"a": 1}), false),
            )
            .await?;
        assert_eq!(store.journal(&plain.id).await?[0].board_version, None);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_belongs_to_one_board_and_deletes_cascade() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let one = store
            .create_board(new_board("one", None, json!({})))
            .await?;
        let two = store
            .create_board(new_board("two", None, json!({})))
            .await?;
        let mut tasks = Vec::new();
        for _ in 0..3 {
            tasks.push(store.create_task(new_task(), &json!({})).await?.id);
        }
        for task in tasks.iter().rev() {
            store.attach_task(&one.id, task).await?;
        }
        // Attaching again to the same board changes nothing; to another is refused.
        store.attach_task(&one.id, &tasks[0]).await?;
        match store.attach_task(&two.id, &tasks[0]).await {
            Err(StoreError::AttachedElsewhere { attached, .. }) => assert_eq!(attached, one.id),
            other => bail!("attached to a second board: {other:?}"),
        }
        assert!(matches!(
            store.attach_task("no-such-board", &tasks[0]).await,
            Err(StoreError::NoSuchBoard(_))
        ));
        assert!(matches!(
            store
                .attach_task(&two.id, "0190a000-0000-7000-8000-000000000000")
                .await,
            Err(StoreError::NotFound(_))
        ));
        // Members in the order they were attached.
        let reversed: Vec<String> = tasks.iter().rev().cloned().collect();
        assert_eq!(store.board_members(&one.id).await?, reversed);
        assert!(store.board_members(&two.id).await?.is_empty());
        assert_eq!(store.task_board(&tasks[1]).await?, Some(one.id.clone()));
        assert_eq!(store.list_boards(None).await?[1].members, 3);

        // Deleting a task detaches it.
        store.delete_task(&tasks[1]).await?;
        assert_eq!(store.task_board(&tasks[1]).await?, None);
        assert_eq!(
            store.board_members(&one.id).await?,
            [tasks[2].clone(), tasks[0].clone()]
        );

        // Deleting a board takes its journal and memberships along; the tasks stay.
        let write = board_write(&json!({}), json!({"x": 1}), BoardAuthor::Cli);
        store.commit_board_write(&one.id, 0, &write).await?;
        store.delete_board(&one.id).await?;
        for missing in [
            store.board(&one.id, None).await.err(),
            store.board_members(&one.id).await.err(),
            store.board_writes(&one.id, 0, 9).await.err(),
            store.board_initial_state(&one.id).await.err(),
            store.delete_board(&one.id).await.err(),
        ] {
            assert!(
                matches!(missing, Some(StoreError::NoSuchBoard(_))),
                "{missing:?}"
            );
        }
        let rows =
            |table: &str| format!("SELECT COUNT(*) FROM {table} WHERE board_id = '{}'", one.id);
        assert_eq!(db.count(&rows("board_writes")).await?, 0);
        assert_eq!(db.count(&rows("board_members")).await?, 0);
        assert_eq!(store.task_board(&tasks[0]).await?, None);
        store.task(&tasks[0]).await?;
        // A detached task can join another board.
        store.attach_task(&two.id, &tasks[0]).await?;
        assert_eq!(store.board_members(&two.id).await?, [tasks[0].clone()]);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_created_with_its_membership_and_a_fork_inherits_it() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let board = store
            .create_board(new_board("team", None, json!({})))
            .await?;
        // No such board: nothing stored at all.
        let tasks_before = db.count("SELECT COUNT(*) FROM tasks").await?;
        match store
            .create_board_task(
                "0190a000-0000-7000-8000-000000000000",
                new_task(),
                &json!({}),
            )
            .await
        {
            Err(StoreError::NoSuchBoard(_)) => {}
            other => bail!("a member of a missing board: {other:?}"),
        }
        assert_eq!(db.count("SELECT COUNT(*) FROM tasks").await?, tasks_before);
        assert_eq!(db.count("SELECT COUNT(*) FROM board_members").await?, 0);
        // Created a member, in one write.
        let member = store
            .create_board_task(&board.id, new_task(), &json!({"n": 1}))
            .await?;
        assert_eq!(member.state, json!({"n": 1}));
        assert_eq!(store.task_board(&member.id).await?, Some(board.id.clone()));
        // A fork of a member is a member of the same board; a fork of another task of none.
        let fork = store
            .fork_task(&member.id, 0, &json!({"n": 1}), None)
            .await?;
        assert_eq!(
            store.board_members(&board.id).await?,
            [member.id.clone(), fork.id.clone()]
        );
        let plain = store.create_task(new_task(), &json!({})).await?;
        let plain_fork = store.fork_task(&plain.id, 0, &json!({}), None).await?;
        assert_eq!(store.task_board(&plain_fork.id).await?, None);
        Ok(())
    })
    .await
}

/// Writers and rounds of the race.
const WRITERS: usize = 4;
const ROUNDS: u64 = 5;

/// What one writer saw while racing.
#[derive(Debug, Default)]
struct RaceCounts {
    /// Writes refused with `BoardMoved` and committed after a rebase, unchanged.
    rebased: u64,
    /// Writes refused with `BoardMoved` whose rebase conflicted: recomputed from the fresh
    /// values.
    conflicts: u64,
    /// Conflicts on a disjoint write (must stay 0).
    disjoint_conflicts: u64,
}

/// One racing writer: task `task`, attached to `board`; each round it writes its own part
/// (`/agents/<me>`) and then increments the shared counter, every write computed on the board
/// version it read. All writers read each round's first version together (`barrier`), so every
/// round has N-1 `BoardMoved` for certain.
async fn race_writer(
    store: Arc<dyn Store>,
    board: String,
    task: String,
    me: usize,
    barrier: Arc<Barrier>,
) -> anyhow::Result<RaceCounts> {
    let mut counts = RaceCounts::default();
    let mut task_state = json!({});
    let mut task_version = 0;
    for round in 0..ROUNDS {
        for shared in [false, true] {
            barrier.wait().await;
            let read = store.board(&board, None).await?;
            barrier.wait().await;
            let (mut base_version, mut base) = (read.version, read.state);
            let compute = |state: &Value| {
                if shared {
                    let counter = state["shared"]["counter"].as_u64().unwrap_or(0);
                    json!({"shared": {"counter": counter + 1}})
                } else {
                    json!({"agents": {(me.to_string()): {"round": round, "by": me}}})
                }
            };
            let mut patch = compute(&base);
            let (mut on_version, mut on_state) = (base_version, base.clone());
            let mut rebased_from = None;
            loop {
                let step = task_version + 1;
                let mut commit = step_commit(step, &task_state, json!({ "writes": step }), false);
                commit.entry.board_version = Some(base_version);
                let mut write = board_write(
                    &on_state,
                    patch.clone(),
                    BoardAuthor::Task {
                        task: task.clone(),
                        step,
                    },
                );
                write.rebased_from = rebased_from;
                match store
                    .commit_step_with_board(
                        &task,
                        task_version,
                        &commit,
                        &board,
                        on_version,
                        &write,
                    )
                    .await
                {
                    Ok(version) => {
                        ensure!(
                            version == on_version + 1,
                            "committed as {version} on {on_version}"
                        );
                        task_state = commit.new_state;
                        task_version = step;
                        break;
                    }
                    Err(StoreError::BoardMoved { actual, .. }) => {
                        let newest = store.board(&board, None).await?;
                        ensure!(newest.version >= actual, "the board went back");
                        let parsed = StatePatch::from_value(&patch).unwrap();
                        match rebase(&parsed, &base, &newest.state) {
                            Ok(_) => {
                                counts.rebased += 1;
                                rebased_from = Some(base_version);
                            }
                            Err(conflict) => {
                                counts.conflicts += 1;
                                if !shared {
                                    counts.disjoint_conflicts += 1;
                                }
                                ensure!(
                                    conflict
                                        .pointers
                                        .iter()
                                        .all(|p| p.to_string() == "/shared/counter"),
                                    "conflict at {:?}",
                                    conflict.pointers
                                );
                                // Recomputed from the fresh value, on the newest version.
                                base_version = newest.version;
                                base = newest.state.clone();
                                patch = compute(&base);
                                rebased_from = None;
                            }
                        }
                        on_version = newest.version;
                        on_state = newest.state;
                    }
                    Err(other) => return Err(other.into()),
                }
            }
        }
    }
    Ok(counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_lose_no_update_and_the_board_replays() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({"agents": {}, "shared": {"counter": 0}});
        let board = store
            .create_board(new_board("race", None, initial.clone()))
            .await?;
        let mut tasks = Vec::new();
        for _ in 0..WRITERS {
            let task = store.create_task(new_task(), &json!({})).await?.id;
            store.attach_task(&board.id, &task).await?;
            tasks.push(task);
        }
        let barrier = Arc::new(Barrier::new(WRITERS));
        let writers: Vec<_> = tasks
            .iter()
            .enumerate()
            .map(|(me, task)| {
                tokio::spawn(race_writer(
                    store.clone(),
                    board.id.clone(),
                    task.clone(),
                    me,
                    barrier.clone(),
                ))
            })
            .collect();
        let mut totals = RaceCounts::default();
        for writer in writers {
            let counts = writer.await??;
            totals.rebased += counts.rebased;
            totals.conflicts += counts.conflicts;
            totals.disjoint_conflicts += counts.disjoint_conflicts;
        }
        let n = WRITERS as u64;
        // Every disjoint write landed without a conflict; in every round all but one of them
        // were refused once and rebased; every shared write was refused at least once in
        // each round except by its first committer.
        assert_eq!(totals.disjoint_conflicts, 0, "{totals:?}");
        assert!(totals.rebased >= (n - 1) * ROUNDS, "{totals:?}");
        assert!(totals.conflicts >= (n - 1) * ROUNDS, "{totals:?}");

        let end = store.board(&board.id, None).await?;
        assert_eq!(end.version, 2 * n * ROUNDS);
        // No lost update: one increment per shared write.
        assert_eq!(end.state["shared"]["counter"], json!(n * ROUNDS));
        for me in 0..WRITERS {
            assert_eq!(
                end.state["agents"][me.to_string()],
                json!({"round": ROUNDS - 1, "by": me})
            );
        }
        // The board equals a serial replay of its journal, each hash checked on the way.
        let writes = store.board_writes(&board.id, 1, end.version).await?;
        assert_eq!(writes.len() as u64, end.version);
        let mut replayed = initial.clone();
        for (at, write) in writes.iter().enumerate() {
            assert_eq!(write.version, at as u64 + 1);
            replayed = StatePatch::from_value(&write.patch)
                .unwrap()
                .apply(&replayed)
                .unwrap();
            assert_eq!(
                state_hash(&replayed),
                write.state_hash,
                "version {}",
                write.version
            );
        }
        assert_eq!(replayed, end.state);
        assert_eq!(
            board_state_at(store.as_ref(), &board.id, end.version).await?,
            end.state
        );
        // Each write's author is a member whose step committed with it, at a step that exists.
        for task in &tasks {
            let record = store.task(task).await?;
            assert_eq!(record.version, 2 * ROUNDS);
            let authored = writes
                .iter()
                .filter(|w| matches!(&w.author, BoardAuthor::Task { task: t, .. } if t == task))
                .count() as u64;
            assert_eq!(authored, 2 * ROUNDS);
            let journal = store.journal(task).await?;
            assert!(journal.iter().all(|e| e.board_version.is_some()));
        }
        Ok(())
    })
    .await
}

/// Writes of the snapshot scenario, and its snapshot interval.
const SNAPSHOT_WRITES: u64 = 300;
const SNAPSHOT_EVERY: u64 = 16;

/// The patch of write `n` of the snapshot scenario: merge patches and JSON Patches, some
/// growing an array, some replacing and removing members.
fn nth_patch(n: u64) -> Value {
    match n % 4 {
        0 => json!([{"op": "add", "path": "/log/-", "value": n}]),
        1 => json!({"counters": {format!("k{}", n % 7): n}}),
        2 => json!({"note": format!("write {n}"), "gone": null}),
        _ => json!([{"op": "add", "path": "/gone", "value": {"at": n}}]),
    }
}

/// Reads `board` at every version of `expected` and compares with it.
async fn check_every_version(
    store: &dyn Store,
    board: &str,
    expected: &[Value],
) -> anyhow::Result<()> {
    for (version, state) in expected.iter().enumerate() {
        let rebuilt = board_state_at(store, board, version as u64)
            .await
            .with_context(|| format!("version {version}"))?;
        ensure!(&rebuilt == state, "version {version}: {rebuilt} != {state}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_rebuilds_any_version_from_its_nearest_snapshot() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(SNAPSHOT_EVERY).await?;
        let initial = json!({"log": [], "counters": {}});
        let board = store
            .create_board(new_board("snapshots", None, initial.clone()))
            .await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        store.attach_task(&board.id, &task.id).await?;
        // The states replayed from zero, by the test itself.
        let mut expected = vec![initial];
        let (mut task_version, mut task_state) = (0, json!({}));
        for n in 1..=SNAPSHOT_WRITES {
            let write = board_write(&expected[n as usize - 1], nth_patch(n), BoardAuthor::Cli);
            // Every fifth write comes with a task's step (the other path to a board write).
            if n % 5 == 0 {
                let commit = step_commit(task_version + 1, &task_state, json!({"n": n}), false);
                store
                    .commit_step_with_board(&task.id, task_version, &commit, &board.id, n - 1, &write)
                    .await?;
                (task_version, task_state) = (task_version + 1, commit.new_state);
            } else {
                store.commit_board_write(&board.id, n - 1, &write).await?;
            }
            expected.push(write.new_state);
        }
        check_every_version(store.as_ref(), &board.id, &expected).await?;

        // Snapshots exactly at the multiples of the interval, each holding its version's state.
        let snapshots = |filter: &str| {
            format!(
                "SELECT COUNT(*) FROM board_snapshots WHERE board_id = '{}'{filter}",
                board.id
            )
        };
        let count = (SNAPSHOT_WRITES / SNAPSHOT_EVERY) as i64;
        assert_eq!(db.count(&snapshots("")).await?, count);
        let off = format!(" AND version % {SNAPSHOT_EVERY} <> 0");
        assert_eq!(db.count(&snapshots(&off)).await?, 0);
        for version in 0..=SNAPSHOT_WRITES {
            let nearest = version / SNAPSHOT_EVERY * SNAPSHOT_EVERY;
            let found = store.board_snapshot_at_or_before(&board.id, version).await?;
            let want = (nearest > 0).then(|| (nearest, expected[nearest as usize].clone()));
            assert_eq!(found, want, "snapshot at or before {version}");
        }
        assert!(matches!(
            store.board_snapshot_at_or_before("no-such-board", 9).await,
            Err(StoreError::NoSuchBoard(_))
        ));

        // Only the writes after the snapshot are replayed: with write 5's patch broken, version 5
        // is reported, and version 40 (snapshot 32 plus 8 writes) never reads it.
        let fifth = store.board_writes(&board.id, 5, 5).await?.remove(0);
        db.execute(&format!(
            "UPDATE board_writes SET patch = '{{\"note\": \"forged\"}}' WHERE board_id = '{}' AND version = 5",
            board.id
        ))
        .await?;
        match board_state_at(store.as_ref(), &board.id, 5).await {
            Err(StoreError::BoardCorrupt { version: 5, .. }) => {}
            other => bail!("version 5 with its patch forged: {other:?}"),
        }
        assert_eq!(board_state_at(store.as_ref(), &board.id, 40).await?, expected[40]);
        // The whole-journal replay ignores snapshots, so it meets the broken write.
        match board_state_replayed(store.as_ref(), &board.id, 40).await {
            Err(StoreError::BoardCorrupt { version: 5, .. }) => {}
            other => bail!("a replay from version 0 over a forged write 5: {other:?}"),
        }
        db.execute(&format!(
            "UPDATE board_writes SET patch = '{}' WHERE board_id = '{}' AND version = 5",
            fifth.patch.to_string().replace('\'', "''"),
            board.id
        ))
        .await?;

        // A snapshot changed behind the store's back is found, naming its version, by every read
        // that starts from it; the versions before it and from the next snapshot on are fine.
        db.execute(&format!(
            "UPDATE board_snapshots SET state = '{{\"log\": [], \"counters\": {{}}}}' WHERE board_id = '{}' AND version = 160",
            board.id
        ))
        .await?;
        for version in [160, 161, 175] {
            match board_state_at(store.as_ref(), &board.id, version).await {
                Err(error @ StoreError::BoardCorrupt { version: 160, .. }) => {
                    let text = error.to_string();
                    assert!(text.contains(&board.id) && text.contains("snapshot"), "{text}");
                }
                other => bail!("version {version} over a forged snapshot: {other:?}"),
            }
        }
        for version in [159, 176, SNAPSHOT_WRITES] {
            assert_eq!(
                board_state_at(store.as_ref(), &board.id, version).await?,
                expected[version as usize]
            );
        }
        // ... while the whole-journal replay never reads the snapshot.
        assert_eq!(
            board_state_replayed(store.as_ref(), &board.id, 175).await?,
            expected[175]
        );

        // A board without snapshot rows (written before they existed) rebuilds from its initial
        // state, and its next multiple of the interval is snapshotted again.
        let deleted = db
            .execute(&format!("DELETE FROM board_snapshots WHERE board_id = '{}'", board.id))
            .await?;
        assert_eq!(deleted, count as u64);
        assert_eq!(store.board_snapshot_at_or_before(&board.id, SNAPSHOT_WRITES).await?, None);
        check_every_version(store.as_ref(), &board.id, &expected).await?;
        let next = SNAPSHOT_WRITES.next_multiple_of(SNAPSHOT_EVERY);
        for n in SNAPSHOT_WRITES + 1..=next {
            let write = board_write(&expected[n as usize - 1], nth_patch(n), BoardAuthor::Cli);
            store.commit_board_write(&board.id, n - 1, &write).await?;
            expected.push(write.new_state);
        }
        assert_eq!(
            store.board_snapshot_at_or_before(&board.id, next).await?,
            Some((next, expected[next as usize].clone()))
        );
        assert_eq!(db.count(&snapshots("")).await?, 1);
        check_every_version(store.as_ref(), &board.id, &expected).await?;

        // Deleting the board deletes its snapshots.
        store.delete_board(&board.id).await?;
        assert_eq!(db.count(&snapshots("")).await?, 0);
        assert!(matches!(
            store.board_snapshot_at_or_before(&board.id, next).await,
            Err(StoreError::NoSuchBoard(_))
        ));
        Ok(())
    })
    .await
}

/// Takes `db` back to schema 14, as a release before tasks kept a trace context.
pub(super) async fn back_to_schema_14(db: &Db) -> anyhow::Result<()> {
    if db.backend.is_postgres() {
        // PostgreSQL's 16 and 17: the one-statement step and settle, the work triggers.
        db.execute(
            "DROP TRIGGER tasks_work_queued ON tasks; DROP TRIGGER tasks_work_requeued ON tasks; \
             DROP TRIGGER batches_work_reopened ON batches; DROP FUNCTION skillstate_work_notify(); \
             DROP FUNCTION skillstate_commit_step; DROP FUNCTION skillstate_settle_claim",
        )
        .await?;
    }
    db.execute(
        "ALTER TABLE tasks DROP COLUMN trace_context; \
         DELETE FROM schema_migrations WHERE version >= 15",
    )
    .await?;
    Ok(())
}

/// Takes `db` back to schema 13, as a release before board schema histories wrote it: one
/// schema per board, in `boards`.
pub(super) async fn back_to_schema_13(db: &Db) -> anyhow::Result<()> {
    back_to_schema_14(db).await?;
    let sql = match db.backend {
        Backend::Sqlite => {
            "DROP TABLE board_schemas; DELETE FROM schema_migrations WHERE version >= 14"
        }
        Backend::Postgres | Backend::PgBouncer => {
            "DROP TABLE board_schemas; DROP FUNCTION skillstate_board_schema_frozen(); \
             DELETE FROM schema_migrations WHERE version >= 14"
        }
    };
    db.execute(sql).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_change_is_a_write_and_each_version_reads_with_its_schema() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let first_schema = json!({"type": "object", "properties": {"goal": {"type": "string"}}});
        let initial = json!({"goal": "ship"});
        let board = store
            .create_board(NewBoard {
                name: "schemas".into(),
                schema: first_schema.clone(),
                initial_state: initial.clone(),
                tenant: None,
            })
            .await?;
        let schemas = store.board_schemas(&board.id).await?;
        assert_eq!(
            schemas,
            [BoardSchemaRecord {
                from_version: 0,
                schema: first_schema.clone()
            }]
        );
        let one = board_write(&initial, json!({"goal": "ship v2"}), BoardAuthor::Cli);
        store.commit_board_write(&board.id, 0, &one).await?;

        // The schema change: a write of its own (the migration renames `goal`), with the new
        // schema from its version on.
        let second_schema =
            json!({"type": "object", "properties": {"objective": {"type": "string"}}});
        let upgrade = board_write(
            &one.new_state,
            json!([{"op": "move", "from": "/goal", "path": "/objective"}]),
            BoardAuthor::Cli,
        );
        // Planned against version 0: stale, and nothing is written.
        match store
            .commit_board_schema(&board.id, 0, &upgrade, &second_schema)
            .await
        {
            Err(StoreError::BoardMoved {
                expected, actual, ..
            }) => assert_eq!((expected, actual), (0, 1)),
            other => bail!("a stale schema change: {other:?}"),
        }
        assert_eq!(store.board(&board.id, None).await?.schema, first_schema);
        assert_eq!(store.board_schemas(&board.id).await?.len(), 1);
        assert_eq!(
            store
                .commit_board_schema(&board.id, 1, &upgrade, &second_schema)
                .await?,
            2
        );
        let now = store.board(&board.id, None).await?;
        assert_eq!(
            (now.version, &now.state, &now.schema),
            (2, &upgrade.new_state, &second_schema)
        );
        let writes = store.board_writes(&board.id, 2, 2).await?;
        assert_eq!(
            (&writes[0].patch, &writes[0].author),
            (&upgrade.patch, &BoardAuthor::Cli)
        );
        // A later write keeps the schema.
        let three = board_write(
            &upgrade.new_state,
            json!({"objective": "v3"}),
            BoardAuthor::Cli,
        );
        store.commit_board_write(&board.id, 2, &three).await?;
        assert_eq!(store.board(&board.id, None).await?.schema, second_schema);
        assert_eq!(
            store.board_schemas(&board.id).await?,
            [
                BoardSchemaRecord {
                    from_version: 0,
                    schema: first_schema.clone()
                },
                BoardSchemaRecord {
                    from_version: 2,
                    schema: second_schema.clone()
                }
            ]
        );
        // Each version with the schema in effect at it, and its state, every hash checked.
        for (version, schema, state) in [
            (0, &first_schema, &initial),
            (1, &first_schema, &one.new_state),
            (2, &second_schema, &upgrade.new_state),
            (3, &second_schema, &three.new_state),
        ] {
            assert_eq!(
                &board_schema_at(store.as_ref(), &board.id, version).await?,
                schema,
                "version {version}"
            );
            assert_eq!(
                &board_state_at(store.as_ref(), &board.id, version).await?,
                state
            );
        }
        assert!(matches!(
            board_schema_at(store.as_ref(), &board.id, 4).await,
            Err(StoreError::NoSuchBoardVersion { version: 4, .. })
        ));
        // The history never changes, and goes with its board.
        let changed = db
            .execute(&format!(
                "UPDATE board_schemas SET schema = '{{}}' WHERE board_id = '{}'",
                board.id
            ))
            .await;
        assert!(changed.is_err(), "a stored schema was changed");
        store.delete_board(&board.id).await?;
        assert!(matches!(
            store.board_schemas(&board.id).await,
            Err(StoreError::NoSuchBoard(_))
        ));
        assert_eq!(
            db.count(&format!(
                "SELECT COUNT(*) FROM board_schemas WHERE board_id = '{}'",
                board.id
            ))
            .await?,
            0
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boards_of_schema_13_get_their_schema_from_version_0() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let schema = json!({"type": "object", "title": "old"});
        let board = store
            .create_board(NewBoard {
                name: "older".into(),
                schema: schema.clone(),
                initial_state: json!({}),
                tenant: None,
            })
            .await?;
        let one = board_write(&json!({}), json!({"x": 1}), BoardAuthor::Cli);
        store.commit_board_write(&board.id, 0, &one).await?;
        store.release().await;
        drop(store);
        back_to_schema_13(&db).await?;

        // Read-only, as at schema 13: the one schema, from 0.
        let reader = open_existing(&db.location(), &StoreOptions::default()).await?;
        assert_eq!(
            board_schema_at(reader.as_ref(), &board.id, 1).await?,
            schema
        );
        reader.release().await;
        drop(reader);

        let store = db.open().await?;
        assert_eq!(
            store.board_schemas(&board.id).await?,
            [BoardSchemaRecord {
                from_version: 0,
                schema: schema.clone()
            }]
        );
        assert_eq!(board_schema_at(store.as_ref(), &board.id, 1).await?, schema);
        Ok(())
    })
    .await
}
