//! The service's half of the conformance suite (`src/service.rs`): API keys, tasks owned by
//! tenants (idempotent creation, isolation, paged listings) and durable events, on both
//! backends.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::*;

/// How long a reader waits for events to become readable. On PostgreSQL an event is readable
/// once every transaction older than its own has ended, server-wide, so other tests running at
/// the same time can hold events back for a moment (never lose them).
const EVENT_WAIT: Duration = Duration::from_secs(30);

fn owner(tenant: &str, key: Option<&str>, labels: Value) -> TaskOwner {
    TaskOwner {
        tenant: tenant.into(),
        idempotency_key: key.map(str::to_owned),
        labels,
        batch: None,
        trace_context: None,
    }
}

fn new_key(tenant: &str, label: &str, hash: &str, scopes: Option<Value>) -> NewKey {
    NewKey {
        tenant: tenant.into(),
        label: label.into(),
        secret_hash: hash.into(),
        scopes,
    }
}

/// A SHA-256-looking hex hash, distinct per `n`.
fn hash(n: u32) -> String {
    format!("{n:064x}")
}

fn page(tenant: Option<&str>, after: Option<&str>, limit: u32) -> TaskQuery {
    TaskQuery {
        tenant: tenant.map(str::to_owned),
        after: after.map(str::to_owned),
        limit,
        ..TaskQuery::default()
    }
}

fn of_task(task: &str, after: Option<&str>) -> EventQuery {
    EventQuery {
        task: Some(task.to_owned()),
        after: after.map(str::to_owned),
        limit: 1000,
        ..EventQuery::default()
    }
}

/// A position's numbers (SQLite: the id; PostgreSQL: transaction and id), to compare order.
fn position_key(position: &str) -> Vec<u64> {
    position.split('.').map(|n| n.parse().unwrap()).collect()
}

/// The events of `query`, once at least `count` are readable.
async fn wait_events(
    store: &dyn Store,
    query: &EventQuery,
    count: usize,
) -> anyhow::Result<Vec<EventRecord>> {
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let events = store.events_after(query).await?;
        if events.len() >= count {
            return Ok(events);
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {count} events readable after {EVENT_WAIT:?}: {events:?}",
                events.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kinds(events: &[EventRecord]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

// ---------------------------------------------------------------------------------------------
// Keys

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_found_by_hash_listed_per_tenant_and_revoked_once() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let scopes = json!({"read": ["/inventory"], "write": []});
        let ci = store
            .create_key(&new_key("acme", "ci", &hash(1), Some(scopes.clone())))
            .await?;
        let laptop = store
            .create_key(&new_key("acme", "laptop", &hash(2), None))
            .await?;
        let other = store
            .create_key(&new_key("globex", "bot", &hash(3), None))
            .await?;
        assert_eq!(
            (
                ci.tenant.as_str(),
                ci.label.as_str(),
                &ci.scopes,
                ci.revoked_at
            ),
            ("acme", "ci", &Some(scopes), None)
        );
        assert_eq!(uuid::Uuid::parse_str(&ci.id)?.get_version_num(), 7);

        assert_eq!(store.key_by_hash(&hash(1)).await?, Some(ci.clone()));
        assert_eq!(store.key_by_hash(&hash(3)).await?, Some(other.clone()));
        assert_eq!(store.key_by_hash(&hash(9)).await?, None);
        assert_eq!(
            store.list_keys(Some("acme")).await?,
            vec![ci.clone(), laptop.clone()]
        );
        assert_eq!(
            store.list_keys(None).await?,
            vec![ci.clone(), laptop.clone(), other.clone()]
        );
        assert!(store.list_keys(Some("nobody")).await?.is_empty());

        // The same secret twice is refused, naming the tenant and not the whole hash.
        match store
            .create_key(&new_key("globex", "copy", &hash(1), None))
            .await
        {
            Err(error @ StoreError::DuplicateKey { .. }) => {
                let message = error.to_string();
                assert!(message.contains("acme"), "{message}");
                assert!(message.contains(&hash(1)[..12]), "{message}");
                assert!(!message.contains(&hash(1)), "{message}");
            }
            other => bail!("a duplicate hash should be refused, got {other:?}"),
        }
        assert_eq!(store.list_keys(None).await?.len(), 3);

        // Revoked by a unique prefix; a second revocation keeps the first time.
        let unique =
            common_prefix_len(&laptop.id, &ci.id).max(common_prefix_len(&laptop.id, &other.id)) + 1;
        let revoked = store.revoke_key(&laptop.id[..unique]).await?;
        let at = revoked.revoked_at.context("a revocation time")?;
        assert_eq!(
            revoked,
            KeyRecord {
                revoked_at: Some(at),
                ..laptop.clone()
            }
        );
        assert_eq!(store.key_by_hash(&hash(2)).await?, Some(revoked.clone()));
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(store.revoke_key(&laptop.id).await?.revoked_at, Some(at));
        assert_eq!(store.key_by_hash(&hash(1)).await?, Some(ci.clone()));

        let shared = common_prefix_len(&ci.id, &other.id);
        assert!(shared > 0, "{} {}", ci.id, other.id);
        match store.revoke_key(&ci.id[..shared]).await {
            Err(StoreError::AmbiguousKey { count, .. }) => assert_eq!(count, 3),
            other => bail!("expected an ambiguous prefix, got {other:?}"),
        }
        for missing in ["ffff", "", "not-hex", "%"] {
            match store.revoke_key(missing).await {
                Err(error @ StoreError::NoSuchKey(_)) => {
                    assert!(error.to_string().contains(&format!("`{missing}`")))
                }
                other => bail!("`{missing}` should match no key, got {other:?}"),
            }
        }
        assert_eq!(store.key_by_hash(&hash(1)).await?.unwrap().revoked_at, None);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_and_a_task_state_read_together_are_what_each_read_alone_gives() -> anyhow::Result<()>
{
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let key = store
            .create_key(&new_key("acme", "ci", &hash(1), None))
            .await?;
        let task = store.create_task(new_task(), &json!({"a": 1})).await?;
        let alone = store.task_state(&task.id).await?;

        let (found, state) = store.key_and_task_state(&hash(1), &task.id).await;
        assert_eq!(found?, Some(key.clone()));
        assert_eq!(state?, alone);

        // Either part missing is reported for that part alone.
        let (found, state) = store.key_and_task_state(&hash(9), &task.id).await;
        assert_eq!(found?, None);
        assert_eq!(state?, alone);
        let missing = "01a23034-893e-71f5-b245-1589c83ce626";
        let (found, state) = store.key_and_task_state(&hash(1), missing).await;
        assert_eq!(found?, Some(key.clone()));
        assert!(matches!(state, Err(StoreError::NotFound(_))), "{state:?}");

        // A revocation and a state write are seen by the very next read together: nothing of
        // an earlier read transaction is kept.
        let revoked = store.revoke_key(&key.id).await?;
        store
            .commit_step(
                &task.id,
                alone.version,
                &step_commit(alone.version + 1, &json!({"a": 2}), json!({"a": 2}), false),
            )
            .await?;
        let (found, state) = store.key_and_task_state(&hash(1), &task.id).await;
        assert_eq!(found?, Some(revoked));
        let state = state?;
        assert_eq!(
            (state.version, &state.state),
            (alone.version + 1, &json!({"a": 2}))
        );
        assert_eq!(state, store.task_state(&task.id).await?);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Tenancy

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_retried_with_its_key_returns_the_first_task_even_when_racing()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let stores = [db.open().await?, db.open().await?];
        let labels = json!({"team": "ops"});
        let (first, created) = stores[0]
            .create_owned_task(
                new_task(),
                &json!({"n": 1}),
                &owner("acme", Some("order-1"), labels.clone()),
            )
            .await?;
        assert!(created);
        assert_eq!(first.tenant.as_deref(), Some("acme"));
        assert_eq!((first.version, &first.state), (0, &json!({"n": 1})));
        assert_eq!(
            store_observation(stores[1].as_ref(), &first.id).await?,
            "start"
        );

        // A retry (even with another body) returns the first task untouched.
        let (again, created) = stores[1]
            .create_owned_task(
                new_task(),
                &json!({"n": 2}),
                &owner("acme", Some("order-1"), json!({})),
            )
            .await?;
        assert!(!created);
        assert_eq!(again, first);
        // The key is per tenant; no key never deduplicates.
        let (theirs, created) = stores[0]
            .create_owned_task(
                new_task(),
                &json!({}),
                &owner("globex", Some("order-1"), json!({})),
            )
            .await?;
        assert!(created);
        assert_ne!(theirs.id, first.id);
        for _ in 0..2 {
            let (_, created) = stores[0]
                .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
                .await?;
            assert!(created);
        }

        // Eight creates with one new key at once, through two stores: one task.
        const RACERS: usize = 8;
        let barrier = Arc::new(Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let store = stores[i % 2].clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .create_owned_task(
                            new_task(),
                            &json!({"racer": i}),
                            &owner("acme", Some("order-2"), json!({})),
                        )
                        .await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for racer in racers {
            outcomes.push(racer.await??);
        }
        assert_eq!(outcomes.iter().filter(|(_, created)| *created).count(), 1);
        let ids: HashSet<&str> = outcomes.iter().map(|(t, _)| t.id.as_str()).collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        assert_eq!(
            db.count("SELECT COUNT(*) FROM tasks WHERE idempotency_key = 'order-2'")
                .await?,
            1
        );
        let winner = &outcomes[0].0.id;
        let created = wait_events(stores[0].as_ref(), &of_task(winner, None), 1).await?;
        assert_eq!(kinds(&created), [EventKind::Created]);
        Ok(())
    })
    .await
}

async fn store_observation(store: &dyn Store, task: &str) -> anyhow::Result<String> {
    store
        .observation(task, 1)
        .await?
        .context("the opening observation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_page_through_their_own_tasks_newest_first() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let mut mine = Vec::new();
        for n in 0..25 {
            let (task, _) = store
                .create_owned_task(
                    new_task(),
                    &json!({"n": n}),
                    &owner("acme", None, json!({})),
                )
                .await?;
            mine.push(task.id);
            if n % 10 == 0 {
                store
                    .create_owned_task(new_task(), &json!({}), &owner("globex", None, json!({})))
                    .await?;
                store.create_task(new_task(), &json!({})).await?;
            }
        }
        let newest_first: Vec<String> = mine.iter().rev().cloned().collect();

        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = Vec::new();
        loop {
            let listed = store
                .list_tasks_page(&page(Some("acme"), after.as_deref(), 10))
                .await?;
            pages.push(listed.len());
            let Some(last) = listed.last() else { break };
            after = Some(last.id.clone());
            seen.extend(listed.into_iter().map(|t| t.id));
        }
        assert_eq!(pages, [10, 10, 5, 0]);
        assert_eq!(seen, newest_first);

        let theirs = store
            .list_tasks_page(&page(Some("globex"), None, 100))
            .await?;
        assert_eq!(theirs.len(), 3);
        assert!(theirs.iter().all(|t| !mine.contains(&t.id)));
        assert!(
            store
                .list_tasks_page(&page(Some("nobody"), None, 100))
                .await?
                .is_empty()
        );
        // No tenant: every task (local tools only).
        assert_eq!(
            store.list_tasks_page(&page(None, None, 100)).await?.len(),
            31
        );
        // Limits are clamped to 1..=1000.
        assert_eq!(
            store
                .list_tasks_page(&page(Some("acme"), None, 0))
                .await?
                .len(),
            1
        );
        assert_eq!(
            store
                .list_tasks_page(&page(Some("acme"), None, u32::MAX))
                .await?
                .len(),
            25
        );

        assert_eq!(store.task_tenant(&mine[3]).await?.as_deref(), Some("acme"));
        assert_eq!(store.task(&mine[3]).await?.tenant.as_deref(), Some("acme"));
        let local = store.create_task(new_task(), &json!({})).await?;
        assert_eq!(local.tenant, None);
        assert_eq!(store.task_tenant(&local.id).await?, None);
        match store
            .task_tenant("0190aaaa-0000-7000-8000-000000000000")
            .await
        {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("an unknown task should be NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_filter_by_status_skill_and_string_label() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let create = |task: NewTask, labels: Value| {
            let store = store.clone();
            async move {
                let (task, _) = store
                    .create_owned_task(task, &json!({}), &owner("acme", None, labels))
                    .await?;
                anyhow::Ok(task.id)
            }
        };
        let other_skill = NewTask {
            skill: SkillDefinition {
                name: "other".into(),
                ..free_skill()
            },
            ..new_task()
        };
        let ops = create(new_task(), json!({"team": "ops", "n": "1"})).await?;
        let dev = create(other_skill, json!({"team": "dev"})).await?;
        let done = create(new_task(), json!({"team": "ops"})).await?;
        let number = create(new_task(), json!({"team": 5})).await?;
        let odd = create(new_task(), json!({"a \"b\".c": "v", "$.team": "ops"})).await?;
        store
            .set_status(&done, TaskStatus::Completed, Some(&json!({"ok": true})))
            .await?;
        // Another tenant's task with the same labels never shows.
        store
            .create_owned_task(
                new_task(),
                &json!({}),
                &owner("globex", None, json!({"team": "ops"})),
            )
            .await?;

        let ids = |query: TaskQuery| {
            let store = store.clone();
            async move {
                let listed = store.list_tasks_page(&query).await?;
                anyhow::Ok(listed.into_iter().map(|t| t.id).collect::<Vec<_>>())
            }
        };
        let base = TaskQuery {
            tenant: Some("acme".into()),
            limit: 100,
            ..TaskQuery::default()
        };
        let label = |key: &str, value: &str| Some((key.to_owned(), value.to_owned()));
        assert_eq!(
            ids(base.clone()).await?,
            [
                odd.as_str(),
                number.as_str(),
                done.as_str(),
                dev.as_str(),
                ops.as_str()
            ]
        );
        assert_eq!(
            ids(TaskQuery {
                status: Some(TaskStatus::Completed),
                ..base.clone()
            })
            .await?,
            [done.as_str()]
        );
        assert_eq!(
            ids(TaskQuery {
                skill: Some("other".into()),
                ..base.clone()
            })
            .await?,
            [dev.as_str()]
        );
        assert_eq!(
            ids(TaskQuery {
                label: label("team", "ops"),
                ..base.clone()
            })
            .await?,
            [done.as_str(), ops.as_str()]
        );
        assert_eq!(
            ids(TaskQuery {
                label: label("team", "ops"),
                status: Some(TaskStatus::Running),
                skill: Some("free".into()),
                ..base.clone()
            })
            .await?,
            [ops.as_str()]
        );
        // Only string values match; label names are taken literally.
        assert!(
            ids(TaskQuery {
                label: label("team", "5"),
                ..base.clone()
            })
            .await?
            .is_empty()
        );
        assert_eq!(
            ids(TaskQuery {
                label: label("a \"b\".c", "v"),
                ..base.clone()
            })
            .await?,
            [odd.as_str()]
        );
        assert_eq!(
            ids(TaskQuery {
                label: label("$.team", "ops"),
                ..base.clone()
            })
            .await?,
            [odd.as_str()]
        );
        // Filters and the cursor together.
        assert_eq!(
            ids(TaskQuery {
                label: label("team", "ops"),
                after: Some(done.clone()),
                ..base.clone()
            })
            .await?,
            [ops.as_str()]
        );
        Ok(())
    })
    .await
}

/// A task's labels come back from every read of the task: by full id (on SQLite the point read
/// on the caller's thread), by id prefix (the pool), through a second handle, a read-only open,
/// and the service's listing; `{}` for a task made without any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_labels_come_back_from_every_read() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let labels = json!({"team": "ops", "ticket": "T-7", "a \"b\".c": "", "n": 5});
        let (task, _) = store
            .create_owned_task(
                new_task(),
                &json!({}),
                &owner("acme", Some("labelled"), labels.clone()),
            )
            .await?;
        let expected = labels.as_object().context("labels are an object")?.clone();
        assert_eq!(task.labels, expected);
        // A replayed create returns the first task's labels, not the retry's.
        let (again, created) = store
            .create_owned_task(
                new_task(),
                &json!({}),
                &owner("acme", Some("labelled"), json!({"team": "dev"})),
            )
            .await?;
        assert!(!created);
        assert_eq!(again.labels, expected);
        let (plain, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        assert!(plain.labels.is_empty());
        // A task made outside the service has none (the column is NULL).
        let local = store.create_task(new_task(), &json!({})).await?;
        assert!(local.labels.is_empty());
        // Queued tasks keep theirs.
        let batch = store
            .create_batch(&NewBatch {
                name: "labels".into(),
                spec: json!({}),
                on_error: OnError::SkipAndLog,
                max_retry: 0,
                rate_limit: RateLimit::default(),
            })
            .await?;
        let queued = store
            .enqueue_tasks(
                &batch.id,
                vec![QueuedTask {
                    task: new_task(),
                    initial_state: json!({}),
                    labels: json!({"file": "order-7.txt", "line": 3}),
                    tenant: None,
                }],
            )
            .await?;
        assert_eq!(
            Value::Object(store.task(&queued[0]).await?.labels),
            json!({"file": "order-7.txt", "line": 3})
        );

        let second = db.open().await?;
        let reader = open_existing(&db.location(), &StoreOptions::default()).await?;
        for handle in [&store, &second, &reader] {
            assert_eq!(handle.task(&task.id).await?, task);
            assert_eq!(handle.task(&task.id[..30]).await?.labels, expected);
            assert!(handle.task(&local.id).await?.labels.is_empty());
        }
        let listed = store
            .list_tasks_page(&page(Some("acme"), None, 100))
            .await?;
        let listed_labels = |id: &str| listed.iter().find(|t| t.id == id).map(|t| t.labels.clone());
        assert_eq!(listed_labels(&task.id), Some(Some(expected.clone())));
        assert_eq!(listed_labels(&plain.id), Some(Some(serde_json::Map::new())));
        let labelled = store
            .list_tasks_page(&TaskQuery {
                label: Some(("ticket".into(), "T-7".into())),
                ..page(Some("acme"), None, 100)
            })
            .await?;
        assert_eq!(labelled.len(), 1);
        assert_eq!(labelled[0].labels, Some(expected.clone()));
        // The local listing does not read them.
        assert!(store.list_tasks().await?.iter().all(|t| t.labels.is_none()));

        // Stored labels that are not a JSON object: the task's read names the column, the
        // listing still shows the row (with its problem) and every other one.
        db.execute(&format!(
            "UPDATE tasks SET labels = '[\"ops\"]' WHERE id = '{}'",
            plain.id
        ))
        .await?;
        let error = store
            .task(&plain.id)
            .await
            .err()
            .context("bad labels load")?;
        assert!(error.to_string().contains("labels"), "{error}");
        let listed = store
            .list_tasks_page(&page(Some("acme"), None, 100))
            .await?;
        assert_eq!(listed.len(), 2);
        let bad = listed
            .iter()
            .find(|t| t.id == plain.id)
            .context("bad row listed")?;
        assert!(
            bad.problem.as_deref().is_some_and(|p| p.contains("labels")),
            "{bad:?}"
        );
        assert_eq!(bad.status, Some(TaskStatus::Running));
        // JSON `null` is no labels.
        db.execute(&format!(
            "UPDATE tasks SET labels = 'null' WHERE id = '{}'",
            plain.id
        ))
        .await?;
        assert!(store.task(&plain.id).await?.labels.is_empty());

        // A database from before labels (schema 2) still reads, read-only: no labels.
        drop((store, second, reader));
        db.execute("ALTER TABLE tasks DROP COLUMN labels").await?;
        let old = open_existing(&db.location(), &StoreOptions::default()).await?;
        let read = old.task(&task.id).await?;
        assert!(read.labels.is_empty());
        assert_eq!(read.tenant.as_deref(), Some("acme"));
        assert_eq!(old.list_tasks().await?.len(), 4);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Events

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_appends_its_event_and_any_position_resumes_exactly_after_it()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (task, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        let id = task.id.as_str();
        store.record_rejection(id, &rejected(1, 1)).await?;
        let mut one = step_commit(1, &json!({}), json!({"a": 1}), true);
        one.entry.attempt = 2;
        store.commit_step(id, 0, &one).await?;
        store.record_action_result(id, &action_result(1)).await?;
        let mut two = step_commit(2, &one.new_state, json!({"b": 2}), true);
        two.entry.author = Some("key-1".into());
        store.commit_step(id, 1, &two).await?;
        // A refused write leaves no event: its events share its transaction.
        match store.commit_step(id, 1, &two).await {
            Err(StoreError::Conflict { .. }) => {}
            other => bail!("expected a conflict, got {other:?}"),
        }
        let mut three = step_commit(3, &two.new_state, json!({"c": 3}), false);
        three.previous_result = Some(action_result(2));
        three.status = Some((TaskStatus::Completed, Some(json!({"answer": 42}))));
        store.commit_step(id, 2, &three).await?;
        // Nothing changes: no event.
        store.set_status(id, TaskStatus::Completed, None).await?;
        store
            .set_status(id, TaskStatus::Completed, Some(&json!({"answer": 42})))
            .await?;
        store.set_status(id, TaskStatus::Running, None).await?;

        let expected: Vec<(EventKind, u64, Value)> = vec![
            (EventKind::Created, 0, json!({"skill": "free", "model": "scripted:test"})),
            (
                EventKind::Rejected,
                0,
                json!({"step": 1, "attempt": 1, "errors": rejected(1, 1).errors}),
            ),
            (
                EventKind::Step,
                1,
                json!({"step": 1, "patch": {"a": 1}, "action": {"tool": "wait", "args": {}}, "author": null}),
            ),
            (EventKind::Action, 1, json!({"step": 1, "ok": true})),
            (
                EventKind::Step,
                2,
                json!({"step": 2, "patch": {"b": 2}, "action": {"tool": "wait", "args": {}}, "author": "key-1"}),
            ),
            (EventKind::Action, 2, json!({"step": 2, "ok": false})),
            (
                EventKind::Step,
                3,
                json!({"step": 3, "patch": {"c": 3}, "action": {"tool": "wait", "args": {}}, "author": null}),
            ),
            (
                EventKind::Status,
                3,
                json!({"status": "completed", "outcome": {"answer": 42}}),
            ),
            (
                EventKind::Status,
                3,
                json!({"status": "running", "outcome": {"answer": 42}}),
            ),
        ];
        let events = wait_events(store.as_ref(), &of_task(id, None), expected.len()).await?;
        let got: Vec<(EventKind, u64, Value)> = events
            .iter()
            .map(|e| (e.kind, e.step, e.data.clone()))
            .collect();
        assert_eq!(got, expected);
        assert!(events.iter().all(|e| e.task == id
            && e.tenant.as_deref() == Some("acme")
            && e.created_at > 0));
        for pair in events.windows(2) {
            assert!(
                position_key(&pair[0].position) < position_key(&pair[1].position),
                "{} then {}",
                pair[0].position,
                pair[1].position
            );
        }

        // Resuming after any position yields exactly the rest.
        for (i, event) in events.iter().enumerate() {
            let rest = store
                .events_after(&of_task(id, Some(&event.position)))
                .await?;
            assert_eq!(rest, events[i + 1..], "after {}", event.position);
        }
        // Page by page, through the positions.
        let mut paged = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store
                .events_after(&EventQuery {
                    limit: 2,
                    ..of_task(id, after.as_deref())
                })
                .await?;
            let Some(last) = page.last() else { break };
            after = Some(last.position.clone());
            paged.extend(page);
        }
        assert_eq!(paged, events);

        // The stored events survive a reopen, positions and all.
        let reopened = db.open().await?;
        assert_eq!(reopened.events_after(&of_task(id, None)).await?, events);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_read_per_tenant_and_per_task_and_go_with_their_task() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (a, _) = store
            .create_owned_task(
                new_task(),
                &json!({}),
                &owner("acme", None, json!({"team": "ops"})),
            )
            .await?;
        let (b, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("globex", None, json!({})))
            .await?;
        let local = store.create_task(new_task(), &json!({})).await?;
        for task in [&a.id, &b.id, &local.id] {
            run_steps(store.as_ref(), task, 2, &[]).await?;
        }
        // A fork belongs to its parent's tenant; queued tasks to none.
        let fork = store.fork_task(&a.id, 1, &json!({"k1": 1}), None).await?;
        assert_eq!(fork.tenant.as_deref(), Some("acme"));
        // ... and carries its labels, so a filter that found the parent finds the fork.
        assert_eq!(Value::Object(fork.labels.clone()), json!({"team": "ops"}));
        let reread = store.task(&fork.id).await?.labels;
        assert_eq!(Value::Object(reread), json!({"team": "ops"}));
        let batch = store
            .create_batch(&NewBatch {
                name: "b".into(),
                spec: json!({}),
                on_error: OnError::SkipAndLog,
                max_retry: 0,
                rate_limit: RateLimit::default(),
            })
            .await?;
        let queued = store
            .enqueue_tasks(
                &batch.id,
                (0..2)
                    .map(|n| QueuedTask {
                        task: new_task(),
                        initial_state: json!({"n": n}),
                        labels: json!({}),
                        tenant: None,
                    })
                    .collect(),
            )
            .await?;

        // Per task: created, then (step, action) per step.
        let per_task = 1 + 2 * 2;
        let all = wait_events(
            store.as_ref(),
            &EventQuery {
                limit: 1000,
                ..EventQuery::default()
            },
            3 * per_task + 1 + 2,
        )
        .await?;
        assert_eq!(all.len(), 3 * per_task + 1 + 2);
        let tenant = |name: &str| EventQuery {
            tenant: Some(name.into()),
            limit: 1000,
            ..EventQuery::default()
        };
        let acme = store.events_after(&tenant("acme")).await?;
        assert_eq!(acme.len(), per_task + 1);
        assert!(acme.iter().all(|e| e.tenant.as_deref() == Some("acme")));
        assert_eq!(
            acme.iter()
                .filter(|e| e.task == fork.id)
                .map(|e| (e.kind, e.step))
                .collect::<Vec<_>>(),
            [(EventKind::Created, 1)]
        );
        let globex = store.events_after(&tenant("globex")).await?;
        assert_eq!(globex.len(), per_task);
        assert!(globex.iter().all(|e| e.task == b.id));
        assert!(store.events_after(&tenant("nobody")).await?.is_empty());
        // Tenant and task together: another tenant's task shows nothing.
        let crossed = EventQuery {
            task: Some(b.id.clone()),
            ..tenant("acme")
        };
        assert!(store.events_after(&crossed).await?.is_empty());
        let mine = store.events_after(&of_task(&local.id, None)).await?;
        assert_eq!(
            kinds(&mine),
            [
                EventKind::Created,
                EventKind::Step,
                EventKind::Action,
                EventKind::Step,
                EventKind::Action
            ]
        );
        assert!(mine.iter().all(|e| e.tenant.is_none()));
        for id in &queued {
            let created = store.events_after(&of_task(id, None)).await?;
            assert_eq!(kinds(&created), [EventKind::Created]);
        }
        // The unfiltered read is the per-task reads merged in position order.
        let mut merged: Vec<EventRecord> = Vec::new();
        for task in [&a.id, &b.id, &local.id, &fork.id, &queued[0], &queued[1]] {
            merged.extend(store.events_after(&of_task(task, None)).await?);
        }
        merged.sort_by_key(|e| position_key(&e.position));
        assert_eq!(merged, all);

        store.delete_task(&a.id).await?;
        assert!(store.events_after(&of_task(&a.id, None)).await?.is_empty());
        assert_eq!(
            db.count(&format!(
                "SELECT COUNT(*) FROM events WHERE task_id = '{}'",
                a.id
            ))
            .await?,
            0
        );
        // Later events still come after every earlier position (ids are never reused).
        let last = all.last().unwrap().position.clone();
        store.set_status(&b.id, TaskStatus::Failed, None).await?;
        let later = wait_events(
            store.as_ref(),
            &EventQuery {
                after: Some(last),
                limit: 1000,
                ..EventQuery::default()
            },
            1,
        )
        .await?;
        assert_eq!(kinds(&later), [EventKind::Status]);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_event_position_is_refused_by_name() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        // Each backend's positions are malformed for the other.
        let foreign = match db.backend {
            Backend::Sqlite => "12.34",
            Backend::Postgres | Backend::PgBouncer => "1234",
        };
        for bad in [
            "",
            "abc",
            "-1",
            "1.x",
            "1.2.3",
            " 1",
            "99999999999999999999",
            foreign,
        ] {
            match store
                .events_after(&EventQuery {
                    after: Some(bad.into()),
                    limit: 10,
                    ..EventQuery::default()
                })
                .await
            {
                Err(error @ StoreError::BadEventPosition(_)) => {
                    assert!(error.to_string().contains(&format!("`{bad}`")), "{error}")
                }
                other => bail!("`{bad}` should be refused, got {other:?}"),
            }
        }
        Ok(())
    })
    .await
}

/// Readers tail the events while many tasks commit at once: every event is read exactly once,
/// in the order of a final full read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_tailing_concurrent_commits_misses_and_repeats_nothing() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        const TASKS: usize = 6;
        const STEPS: u64 = 8;
        let store = db.open().await?;
        let writers: Vec<_> = (0..TASKS)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let (task, _) = store
                        .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
                        .await?;
                    let mut state = json!({});
                    for step in 1..=STEPS {
                        let commit =
                            step_commit(step, &state, json!({ format!("k{step}"): step }), false);
                        store.commit_step(&task.id, step - 1, &commit).await?;
                        state = commit.new_state;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        let total = TASKS * (1 + STEPS as usize);
        let mut read: Vec<EventRecord> = Vec::new();
        let deadline = Instant::now() + EVENT_WAIT;
        while read.len() < total {
            ensure!(
                Instant::now() < deadline,
                "read {} of {total} events",
                read.len()
            );
            let page = store
                .events_after(&EventQuery {
                    tenant: Some("acme".into()),
                    after: read.last().map(|e| e.position.clone()),
                    limit: 7,
                    ..EventQuery::default()
                })
                .await?;
            if page.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            read.extend(page);
        }
        for writer in writers {
            writer.await??;
        }
        let full = store
            .events_after(&EventQuery {
                tenant: Some("acme".into()),
                limit: 1000,
                ..EventQuery::default()
            })
            .await?;
        assert_eq!(full.len(), total);
        assert_eq!(read, full);
        Ok(())
    })
    .await
}

/// PostgreSQL hands out event ids before commit, so a transaction holding an earlier id can
/// commit after one holding a later id. The later event must stay unread until the earlier
/// transaction ends; then both come, in order — or the later alone if the earlier rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holds_a_later_event_back_until_an_earlier_transaction_ends() -> anyhow::Result<()>
{
    on_each_backend(|db| async move {
        let Target::Postgres { url, schema, .. } = &db.target else {
            // SQLite has one writer at a time: ids are handed out in commit order.
            return Ok(());
        };
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let start = wait_events(store.as_ref(), &of_task(&task.id, None), 1).await?;
        let mut after = start[0].position.clone();
        let mut state = json!({});
        for (round, commit_earlier) in [(1u64, true), (2, false)] {
            let mut conn = db.pg_connection(url, schema).await?;
            let mut earlier = conn.begin().await?;
            sqlx::query(
                "INSERT INTO events (task_id, tenant, kind, step, data, created_at) VALUES ($1, NULL, 'message', 0, '{\"author\": \"operator\"}', 0)",
            )
            .bind(&task.id)
            .execute(&mut *earlier)
            .await?;
            // The store's step takes a later id in a later transaction, and commits first.
            let commit = step_commit(round, &state, json!({ format!("k{round}"): round }), false);
            store.commit_step(&task.id, round - 1, &commit).await?;
            state = commit.new_state;
            assert_eq!(
                db.count(&format!(
                    "SELECT COUNT(*) FROM events WHERE task_id = '{}' AND kind = 'step' AND step = {round}",
                    task.id
                ))
                .await?,
                1,
                "the step's event is committed"
            );
            for _ in 0..5 {
                let early = store
                    .events_after(&of_task(&task.id, Some(&after)))
                    .await?;
                assert!(early.is_empty(), "round {round}: read too early: {early:?}");
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            if commit_earlier {
                earlier.commit().await?;
            } else {
                earlier.rollback().await?;
            }
            conn.close().await?;
            let expected = if commit_earlier { 2 } else { 1 };
            let rest = wait_events(
                store.as_ref(),
                &of_task(&task.id, Some(&after)),
                expected,
            )
            .await?;
            if commit_earlier {
                assert_eq!(kinds(&rest), [EventKind::Message, EventKind::Step]);
                assert_eq!(rest[0].data, json!({"author": "operator"}));
                // The message holds the earlier id, yet it was committed last.
                let (message, step) = (position_key(&rest[0].position), position_key(&rest[1].position));
                assert!(message[1] < step[1], "{message:?} {step:?}");
            } else {
                assert_eq!(kinds(&rest), [EventKind::Step]);
            }
            assert_eq!(rest.last().unwrap().step, round);
            after = rest.last().unwrap().position.clone();
        }
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Journal authors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_rows_keep_their_author_also_in_forks() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let mut rejection = rejected(1, 1);
        rejection.author = Some("key-7".into());
        store.record_rejection(&task.id, &rejection).await?;
        let mut one = step_commit(1, &json!({}), json!({"a": 1}), false);
        one.entry.attempt = 2;
        one.entry.author = Some("key-7".into());
        store.commit_step(&task.id, 0, &one).await?;
        let two = step_commit(2, &one.new_state, json!({"b": 2}), false);
        store.commit_step(&task.id, 1, &two).await?;

        let journal = store.journal(&task.id).await?;
        assert_eq!(journal, [rejection, one.entry.clone(), two.entry.clone()]);
        assert_eq!(journal[1].author.as_deref(), Some("key-7"));
        assert_eq!(journal[2].author, None);

        let fork = store.fork_task(&task.id, 2, &two.new_state, None).await?;
        assert_eq!(store.journal(&fork.id).await?, journal);
        Ok(())
    })
    .await
}

/// Read-only opens still read a database from before the service columns (schema 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_open_reads_tasks_and_journals_of_schema_four() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let writer = db.open().await?;
        let task = writer.create_task(new_task(), &json!({})).await?;
        run_steps(writer.as_ref(), &task.id, 1, &[]).await?;
        let journal = writer.journal(&task.id).await?;
        drop(writer);
        // Back to schema 4: without the columns migration 5 added (and, on SQLite, without the
        // trigger of schema 17 that reads one of them: SQLite refuses to drop a column a
        // trigger names).
        if db.backend == Backend::Sqlite {
            db.execute("DROP TRIGGER observations_recalled").await?;
        }
        db.execute(
            "DROP TABLE events; DROP TABLE api_keys; \
             DROP INDEX tasks_by_idempotency_key; DROP INDEX tasks_by_tenant; \
             ALTER TABLE tasks DROP COLUMN tenant; ALTER TABLE tasks DROP COLUMN idempotency_key; \
             ALTER TABLE journal DROP COLUMN author; \
             DELETE FROM schema_migrations WHERE version = 5",
        )
        .await?;
        let reader = open_existing(&db.location(), &StoreOptions::default()).await?;
        let read = reader.task(&task.id).await?;
        assert_eq!((read.version, read.tenant), (1, None));
        assert_eq!(reader.journal(&task.id).await?, journal);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Totals, tenants' batches, the latest event position

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_totals_sum_every_answer_of_each_task_in_one_read() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let (busy, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        let (idle, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        // Three accepted answers (1 prompt token, 7 answer tokens, no usage) and one rejected
        // (20 prompt tokens, no count of its answer, the provider reported 20 in / 5 out).
        run_steps(store.as_ref(), &busy.id, 3, &[2]).await?;
        let unknown = "0190aaaa-0000-7000-8000-000000000000".to_owned();
        let totals = store
            .task_totals(&[busy.id.clone(), idle.id.clone(), unknown.clone()])
            .await?;
        assert_eq!(
            totals.get(&busy.id),
            Some(&TaskTotals {
                answers: 4,
                prompt_tokens: 23,
                output_tokens: 21,
                reported_answers: 1,
                input_tokens_reported: 20,
                output_tokens_reported: 5,
            })
        );
        assert!(!totals.contains_key(&idle.id), "{totals:?}");
        assert!(!totals.contains_key(&unknown), "{totals:?}");
        assert_eq!(totals.len(), 1);
        assert!(store.task_totals(&[]).await?.is_empty());
        Ok(())
    })
    .await
}

fn batch_named(name: &str) -> NewBatch {
    NewBatch {
        name: name.into(),
        spec: json!({"skill": "free"}),
        on_error: OnError::SkipAndLog,
        max_retry: 0,
        rate_limit: RateLimit::default(),
    }
}

fn in_batch(tenant: &str, batch: &str) -> TaskOwner {
    TaskOwner {
        batch: Some(batch.to_owned()),
        ..owner(tenant, None, json!({}))
    }
}

/// The `traceparent` of the request that created a task is stored with it, for the worker that
/// runs it; a task created untraced, or outside the service, has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_the_trace_context_it_was_created_with() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = TaskOwner {
            trace_context: Some(traceparent.to_owned()),
            ..owner("acme", None, json!({}))
        };
        let (task, created) = store
            .create_owned_task(new_task(), &json!({"n": 1}), &traced)
            .await?;
        assert!(created);
        assert_eq!(
            store.trace_context(&task.id).await?.as_deref(),
            Some(traceparent)
        );
        let (untraced, _) = store
            .create_owned_task(
                new_task(),
                &json!({"n": 1}),
                &owner("acme", None, json!({})),
            )
            .await?;
        assert_eq!(store.trace_context(&untraced.id).await?, None);
        let local = store.create_task(new_task(), &json!({"n": 1})).await?;
        assert_eq!(store.trace_context(&local.id).await?, None);
        match store.trace_context("no-such-task").await {
            Err(StoreError::NotFound(_)) => {}
            other => anyhow::bail!("expected NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_the_batches_whose_every_task_is_its_own() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let own = store.create_batch(&batch_named("own")).await?;
        let mut own_tasks = Vec::new();
        for _ in 0..2 {
            let (task, _) = store
                .create_owned_task(new_task(), &json!({}), &in_batch("acme", &own.id))
                .await?;
            own_tasks.push(task.id);
        }
        let mixed = store.create_batch(&batch_named("mixed")).await?;
        store
            .create_owned_task(new_task(), &json!({}), &in_batch("acme", &mixed.id))
            .await?;
        store
            .create_owned_task(new_task(), &json!({}), &in_batch("globex", &mixed.id))
            .await?;
        let local = store.create_batch(&batch_named("local")).await?;
        store
            .enqueue_tasks(
                &local.id,
                vec![QueuedTask {
                    task: new_task(),
                    initial_state: json!({}),
                    labels: json!({}),
                    tenant: None,
                }],
            )
            .await?;
        // Tasks queued for a tenant (`batch submit --tenant`) make that tenant's batch.
        let submitted = store.create_batch(&batch_named("submitted")).await?;
        let submitted_tasks = store
            .enqueue_tasks(
                &submitted.id,
                (0..2)
                    .map(|n| QueuedTask {
                        task: new_task(),
                        initial_state: json!({"n": n}),
                        labels: json!({}),
                        tenant: Some("globex".into()),
                    })
                    .collect(),
            )
            .await?;
        let empty = store.create_batch(&batch_named("empty")).await?;
        let newer = store.create_batch(&batch_named("newer")).await?;
        store
            .create_owned_task(new_task(), &json!({}), &in_batch("acme", &newer.id))
            .await?;
        // A task of acme outside any batch.
        store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;

        let listed = |tenant: &str, after: Option<&str>, limit: u32| {
            let query = BatchQuery {
                tenant: tenant.to_owned(),
                after: after.map(str::to_owned),
                limit,
            };
            let store = store.clone();
            async move {
                let batches = store.list_batches_page(&query).await?;
                anyhow::Ok(batches.into_iter().map(|b| b.id).collect::<Vec<_>>())
            }
        };
        assert_eq!(
            listed("acme", None, 100).await?,
            [newer.id.clone(), own.id.clone()]
        );
        assert_eq!(listed("acme", None, 1).await?, [newer.id.as_str()]);
        assert_eq!(listed("acme", Some(&newer.id), 1).await?, [own.id.as_str()]);
        assert!(listed("acme", Some(&own.id), 10).await?.is_empty());
        assert_eq!(
            listed("globex", None, 100).await?,
            std::slice::from_ref(&submitted.id)
        );
        for task in &submitted_tasks {
            assert_eq!(store.task_tenant(task).await?.as_deref(), Some("globex"));
            assert_eq!(store.task(task).await?.tenant.as_deref(), Some("globex"));
        }
        assert_eq!(
            store.batch_tenant(&submitted.id).await?.as_deref(),
            Some("globex")
        );

        assert_eq!(store.batch_tenant(&own.id).await?.as_deref(), Some("acme"));
        assert_eq!(store.batch_tenant(&mixed.id).await?, None);
        assert_eq!(store.batch_tenant(&local.id).await?, None);
        assert_eq!(store.batch_tenant(&empty.id).await?, None);
        match store
            .batch_tenant("0190aaaa-0000-7000-8000-000000000000")
            .await
        {
            Err(StoreError::NoSuchBatch(_)) => {}
            other => bail!("an unknown batch should be NoSuchBatch, got {other:?}"),
        }

        // The batch filter of the task listing, and the batch's report rows.
        let of_batch = store
            .list_tasks_page(&TaskQuery {
                batch: Some(own.id.clone()),
                ..page(Some("acme"), None, 100)
            })
            .await?;
        let mut ids: Vec<String> = of_batch.into_iter().map(|t| t.id).collect();
        ids.reverse();
        assert_eq!(ids, own_tasks);
        let report: Vec<String> = store
            .batch_tasks(&own.id)
            .await?
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(report, own_tasks);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_after_the_latest_position_yields_only_later_events() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let of_tenant = |tenant: &str, after: Option<String>| EventQuery {
            tenant: Some(tenant.to_owned()),
            after,
            limit: 1000,
            ..EventQuery::default()
        };
        assert_eq!(
            store
                .latest_event_position(&of_tenant("acme", None))
                .await?,
            None
        );
        let (first, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        run_steps(store.as_ref(), &first.id, 2, &[]).await?;
        // Once they are readable, the latest position is the last one read.
        let earlier = wait_events(store.as_ref(), &of_tenant("acme", None), 5).await?;
        let latest = store
            .latest_event_position(&of_tenant("acme", None))
            .await?
            .context("a latest position once events exist")?;
        assert_eq!(Some(&latest), earlier.last().map(|e| &e.position));
        let of_first = store
            .latest_event_position(&of_task(&first.id, None))
            .await?;
        assert_eq!(of_first.as_ref(), Some(&latest));
        assert!(
            store
                .events_after(&of_tenant("acme", Some(latest.clone())))
                .await?
                .is_empty()
        );
        // Another tenant's events do not move acme's position.
        store
            .create_owned_task(new_task(), &json!({}), &owner("globex", None, json!({})))
            .await?;
        let (second, _) = store
            .create_owned_task(new_task(), &json!({}), &owner("acme", None, json!({})))
            .await?;
        let later = wait_events(store.as_ref(), &of_tenant("acme", Some(latest)), 1).await?;
        assert_eq!(later.len(), 1, "{later:?}");
        assert_eq!(
            (later[0].task.as_str(), later[0].kind),
            (second.id.as_str(), EventKind::Created)
        );
        Ok(())
    })
    .await
}
