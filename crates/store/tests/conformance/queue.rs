//! The work queue's half of the conformance suite: batches, claims, settles, retries, stops,
//! the per-task report figures and shared rate windows, on every backend.

use std::collections::HashSet;
use std::time::Instant;

use super::*;

pub(super) fn new_batch(name: &str, on_error: OnError, max_retry: u32) -> NewBatch {
    NewBatch {
        name: name.into(),
        spec: json!({"skill": "skills/free", "concurrency": 4}),
        on_error,
        max_retry,
        rate_limit: RateLimit::default(),
    }
}

pub(super) fn queued(n: usize) -> QueuedTask {
    QueuedTask {
        task: NewTask {
            opening_observation: format!("input {n}"),
            ..new_task()
        },
        initial_state: json!({"n": n}),
        labels: json!({"file": format!("input-{n}.txt")}),
        tenant: None,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn claim_one(store: &dyn Store, token: &str, batch: Option<&str>) -> Result<Option<Claimed>> {
    store.claim_task(&claim(token), 600_000, batch).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_go_oldest_first_and_settles_end_or_retry_them() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store
            .create_batch(&new_batch("orders", OnError::SkipAndLog, 2))
            .await?;
        assert_eq!(batch.state, BatchState::Open);
        assert_eq!(batch.max_retry, 2);
        assert_eq!(store.batch(&batch.id[..13]).await?, batch);
        let ids = store
            .enqueue_tasks(&batch.id, (0..3).map(queued).collect())
            .await?;
        assert_eq!(ids.len(), 3);
        let task = store.task(&ids[1]).await?;
        assert_eq!((task.version, task.status), (0, TaskStatus::Running));
        assert_eq!(task.state, json!({"n": 1}));
        assert_eq!(
            store.observation(&ids[1], 1).await?.as_deref(),
            Some("input 1")
        );

        // Oldest first; the claim's lease is the task's lease.
        let mut claims = Vec::new();
        for token in ["a", "b", "c"] {
            let claimed = claim_one(store.as_ref(), token, None)
                .await?
                .context("a claim")?;
            assert_eq!(claimed.batch_id.as_deref(), Some(batch.id.as_str()));
            assert_eq!(claimed.tries, 0);
            assert_eq!(claimed.lease.token, token);
            assert_eq!(
                store.lease(&claimed.task_id).await?,
                Some(claimed.lease.clone())
            );
            claims.push(claimed);
        }
        let claimed: Vec<&str> = claims.iter().map(|c| c.task_id.as_str()).collect();
        assert_eq!(claimed, ids.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(claim_one(store.as_ref(), "d", None).await?.is_none());
        // A claim is an ordinary lease: renewed by its token, nobody else's.
        store.renew_lease(&ids[0], "a", 600_000).await?;
        assert!(matches!(
            store.acquire_lease(&ids[0], &claim("x"), 1_000, None).await,
            Err(StoreError::Leased { .. })
        ));

        // Done; retry later; retry at once.
        store
            .settle_claim(&ids[0], "a", &Settle::Done, None)
            .await?;
        let later = now() + 60_000;
        store
            .settle_claim(
                &ids[1],
                "b",
                &Settle::RetryAt { not_before: later },
                Some("model: timed out"),
            )
            .await?;
        store
            .settle_claim(
                &ids[2],
                "c",
                &Settle::RetryAt {
                    not_before: now() - 1,
                },
                Some("tool: refused"),
            )
            .await?;
        assert_eq!(store.lease(&ids[0]).await?, None);
        assert_eq!(store.lease(&ids[1]).await?, None);
        let again = claim_one(store.as_ref(), "e", None)
            .await?
            .context("the due retry")?;
        assert_eq!((again.task_id.as_str(), again.tries), (ids[2].as_str(), 1));
        assert!(
            claim_one(store.as_ref(), "f", None).await?.is_none(),
            "a backoff was ignored"
        );
        assert_eq!(store.next_wakeup(Some(&batch.id)).await?, Some(later));
        assert_eq!(store.next_wakeup(None).await?, Some(later));

        // The old token cannot settle; a settle without a reason keeps the last failure.
        assert!(matches!(
            store.settle_claim(&ids[2], "c", &Settle::Done, None).await,
            Err(StoreError::LeaseLost { .. })
        ));
        assert!(matches!(
            store.settle_claim("0000", "c", &Settle::Done, None).await,
            Err(StoreError::NotFound(_))
        ));
        store
            .settle_claim(&ids[2], "e", &Settle::Done, None)
            .await?;

        let rows = store.batch_tasks(&batch.id).await?;
        let summary: Vec<_> = rows
            .iter()
            .map(|t| {
                (
                    t.id.as_str(),
                    t.queue,
                    t.tries,
                    t.failure.as_deref(),
                    t.leased,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (ids[0].as_str(), Some(QueueState::Done), 0, None, false),
                (
                    ids[1].as_str(),
                    Some(QueueState::Queued),
                    1,
                    Some("model: timed out"),
                    false
                ),
                (
                    ids[2].as_str(),
                    Some(QueueState::Done),
                    1,
                    Some("tool: refused"),
                    false
                ),
            ]
        );
        assert_eq!(rows[1].labels, json!({"file": "input-1.txt"}));

        // A batch filter claims only that batch's tasks.
        let other = store
            .create_batch(&new_batch("other", OnError::Stop, 0))
            .await?;
        let other_ids = store.enqueue_tasks(&other.id, vec![queued(9)]).await?;
        assert!(
            claim_one(store.as_ref(), "g", Some(&batch.id))
                .await?
                .is_none()
        );
        let got = claim_one(store.as_ref(), "g", Some(&other.id))
            .await?
            .context("other")?;
        assert_eq!(got.task_id, other_ids[0]);
        let listed: Vec<String> = store
            .list_batches()
            .await?
            .into_iter()
            .map(|b| b.id)
            .collect();
        assert_eq!(listed, [other.id.clone(), batch.id.clone()]);
        // Tasks outside any batch are not the queue's.
        store.create_task(new_task(), &json!({})).await?;
        assert!(claim_one(store.as_ref(), "h", None).await?.is_none());
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claimers_never_get_the_same_task() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        // Two stores stand for two worker processes; each runs four claim loops.
        let stores = [db.open().await?, db.open().await?];
        let batch = stores[0]
            .create_batch(&new_batch("race", OnError::SkipAndLog, 0))
            .await?;
        let ids = stores[0]
            .enqueue_tasks(&batch.id, (0..60).map(queued).collect())
            .await?;
        let barrier = Arc::new(Barrier::new(8));
        let claimers: Vec<_> = (0..8)
            .map(|i| {
                let store = stores[i % 2].clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut got = Vec::new();
                    let token = format!("w{i}");
                    while let Some(claimed) = claim_one(store.as_ref(), &token, None).await? {
                        got.push(claimed.task_id);
                    }
                    Ok::<_, StoreError>(got)
                })
            })
            .collect();
        let mut all = Vec::new();
        for claimer in claimers {
            all.extend(claimer.await??);
        }
        let distinct: HashSet<&String> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "a task was claimed twice");
        assert_eq!(all.len(), ids.len(), "every task is claimed once");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claim_is_claimed_again_and_the_old_holder_has_lost_it() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store
            .create_batch(&new_batch("expiry", OnError::SkipAndLog, 0))
            .await?;
        let ids = store.enqueue_tasks(&batch.id, vec![queued(0)]).await?;
        let first = store
            .claim_task(&claim("dead"), 1, None)
            .await?
            .context("first claim")?;
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        // The expired lease makes the task claimable already: an idle worker that missed it
        // by a moment must look again at once, not conclude nothing is left.
        let wakeup = store
            .next_wakeup(None)
            .await?
            .context("an expired lease is claimable")?;
        assert!(wakeup <= now(), "{wakeup} is in the future");
        let second = claim_one(store.as_ref(), "alive", None)
            .await?
            .context("the expired claim is claimable")?;
        assert_eq!(second.task_id, first.task_id);
        assert_eq!(second.tries, 0);
        assert!(second.lease.acquired_at >= first.lease.acquired_at);
        // The first holder's heartbeat and settle both find the lease gone; nothing changes.
        assert!(matches!(
            store.renew_lease(&ids[0], "dead", 60_000).await,
            Err(StoreError::LeaseLost { .. })
        ));
        assert!(matches!(
            store
                .settle_claim(&ids[0], "dead", &Settle::Done, Some("late"))
                .await,
            Err(StoreError::LeaseLost { .. })
        ));
        let row = &store.batch_tasks(&batch.id).await?[0];
        assert_eq!(
            (row.queue, row.failure.as_deref(), row.leased),
            (Some(QueueState::Queued), None, true)
        );
        // A live lease on a queued task is when an idle worker should look again.
        assert_eq!(
            store.next_wakeup(None).await?,
            Some(second.lease.expires_at)
        );
        store
            .settle_claim(&ids[0], "alive", &Settle::Done, None)
            .await?;
        assert!(store.next_wakeup(None).await?.is_none());
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_batches_are_not_claimed_and_requeue_reopens_the_failed() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let stopped = store
            .create_batch(&new_batch("a", OnError::Stop, 0))
            .await?;
        let open = store
            .create_batch(&new_batch("b", OnError::SkipAndLog, 1))
            .await?;
        let a = store.enqueue_tasks(&stopped.id, vec![queued(0)]).await?;
        let b = store
            .enqueue_tasks(&open.id, vec![queued(1), queued(2)])
            .await?;

        store.stop_batch(&stopped.id, "task x failed: boom").await?;
        store.stop_batch(&stopped.id, "a later reason").await?;
        let record = store.batch(&stopped.id).await?;
        assert_eq!(record.state, BatchState::Stopped);
        assert_eq!(record.stop_reason.as_deref(), Some("task x failed: boom"));
        assert!(
            claim_one(store.as_ref(), "s", Some(&stopped.id))
                .await?
                .is_none()
        );

        // Both of b's tasks fail for good.
        for (token, id) in ["p", "q"].iter().zip(&b) {
            let claimed = claim_one(store.as_ref(), token, None)
                .await?
                .context("b's task")?;
            assert_eq!(&claimed.task_id, id);
            store
                .set_status(id, TaskStatus::Failed, Some(&json!({"reason": "model"})))
                .await?;
            store
                .settle_claim(id, token, &Settle::Done, Some("model: refused"))
                .await?;
        }
        // One of them is retried elsewhere right now: it is left to its runner.
        store
            .acquire_lease(&b[1], &claim("busy"), 600_000, None)
            .await?;
        assert!(claim_one(store.as_ref(), "r", None).await?.is_none());

        assert_eq!(store.requeue_failed(&open.id).await?, 1);
        let again = claim_one(store.as_ref(), "r", None)
            .await?
            .context("requeued")?;
        assert_eq!((again.task_id.as_str(), again.tries), (b[0].as_str(), 0));
        let row = &store.batch_tasks(&open.id).await?[0];
        assert_eq!(row.failure.as_deref(), Some("model: refused"));

        // Requeueing reopens a stopped batch, failed tasks or not.
        assert_eq!(store.requeue_failed(&stopped.id).await?, 0);
        assert_eq!(store.batch(&stopped.id).await?.state, BatchState::Open);
        assert_eq!(store.batch(&stopped.id).await?.stop_reason, None);
        let reopened = claim_one(store.as_ref(), "s", None)
            .await?
            .context("a's task")?;
        assert_eq!(reopened.task_id, a[0]);

        for missing in ["0000", "zz"] {
            assert!(matches!(
                store.batch(missing).await,
                Err(StoreError::NoSuchBatch(_))
            ));
        }
        assert!(matches!(
            store.stop_batch("0000", "x").await,
            Err(StoreError::NoSuchBatch(_))
        ));
        assert!(matches!(
            store.requeue_failed("0000").await,
            Err(StoreError::NoSuchBatch(_))
        ));
        let error = store.batch_tasks("0000").await.err().context("no batch")?;
        assert!(error.to_string().contains("skillstate batches"), "{error}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stopped_by_hand_is_claimed_no_more_until_reopened() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store
            .create_batch(&new_batch("mistake", OnError::SkipAndLog, 0))
            .await?;
        let ids = store
            .enqueue_tasks(&batch.id, (0..3).map(queued).collect())
            .await?;
        // One task is running when the batch stops: it keeps its lease.
        let running = claim_one(store.as_ref(), "r", Some(&batch.id))
            .await?
            .context("the first task")?;
        assert_eq!(running.task_id, ids[0]);

        store.stop_batch(&batch.id, "stopped by hand").await?;
        store.stop_batch(&batch.id, "stopped twice").await?;
        let record = store.batch(&batch.id).await?;
        assert_eq!(record.state, BatchState::Stopped);
        assert_eq!(record.stop_reason.as_deref(), Some("stopped by hand"));
        // Neither a worker of this batch nor one of every batch gets the queued tasks.
        assert!(
            claim_one(store.as_ref(), "s", Some(&batch.id))
                .await?
                .is_none()
        );
        assert!(claim_one(store.as_ref(), "t", None).await?.is_none());
        assert!(store.next_wakeup(Some(&batch.id)).await?.is_none());
        let depth = store.queue_depth().await?;
        assert_eq!((depth.running, depth.stopped, depth.ready), (1, 2, 0));
        let rows = store.batch_tasks(&batch.id).await?;
        assert!(rows.iter().all(|t| t.queue == Some(QueueState::Queued)));
        // The running task still settles.
        store
            .settle_claim(&ids[0], "r", &Settle::Done, None)
            .await?;

        // Reopening answers the open batch and requeues nothing: the queued tasks are
        // claimable again, oldest first.
        let reopened = store.reopen_batch(&batch.id).await?;
        assert_eq!(reopened.state, BatchState::Open);
        assert_eq!(reopened.stop_reason, None);
        assert_eq!(reopened, store.batch(&batch.id).await?);
        assert_eq!(
            BatchRecord {
                state: BatchState::Stopped,
                stop_reason: Some("stopped by hand".into()),
                ..reopened.clone()
            },
            record
        );
        // Reopening an open batch changes nothing.
        assert_eq!(store.reopen_batch(&batch.id).await?, reopened);
        let mut claimed = Vec::new();
        for token in ["u", "v"] {
            let next = claim_one(store.as_ref(), token, None)
                .await?
                .context("a reopened task")?;
            claimed.push(next.task_id);
        }
        assert_eq!(claimed, ids[1..].to_vec());
        assert!(claim_one(store.as_ref(), "w", None).await?.is_none());

        // A stop after a reopen records its own reason.
        store.stop_batch(&batch.id, "stopped again").await?;
        assert_eq!(
            store.batch(&batch.id).await?.stop_reason.as_deref(),
            Some("stopped again")
        );

        for missing in ["0000", "zz", ""] {
            assert!(matches!(
                store.reopen_batch(missing).await,
                Err(StoreError::NoSuchBatch(_))
            ));
            assert!(matches!(
                store.stop_batch(missing, "x").await,
                Err(StoreError::NoSuchBatch(_))
            ));
        }
        // A prefix is not an id here: callers resolve it with `batch` first.
        assert!(matches!(
            store.reopen_batch(&batch.id[..13]).await,
            Err(StoreError::NoSuchBatch(_))
        ));
        Ok(())
    })
    .await
}

fn rejected_with(step: u64, attempt: u32, kind: &str, usage: Value) -> JournalEntry {
    JournalEntry {
        errors: Some(
            json!([{"kind": kind, "message": "no"}, {"kind": "schema", "message": "also"}]),
        ),
        usage: Some(usage),
        created_at: 1_700_000_000_000 + i64::from(attempt),
        author: None,
        board_version: None,
        ..rejected(step, attempt)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_tasks_sum_each_tasks_journal() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store.create_batch(&new_batch("figures", OnError::SkipAndLog, 0)).await?;
        let ids = store.enqueue_tasks(&batch.id, (0..3).map(queued).collect()).await?;
        let busy = &ids[0];
        let state = json!({"n": 0});

        // Step 1: an unknown tool, invalid tool arguments, then accepted with an action whose
        // tool fails.
        store
            .record_rejection(busy, &rejected_with(1, 1, "unknown_tool", json!({"input_tokens": 100, "output_tokens": 10})))
            .await?;
        store
            .record_rejection(busy, &rejected_with(1, 2, "tool_args", json!({"input_tokens": 110, "output_tokens": 11})))
            .await?;
        let mut first = step_commit(1, &state, json!({"a": 1}), true);
        first.entry.attempt = 3;
        first.entry.prompt_tokens = 120;
        first.entry.usage = Some(json!({"input_tokens": 120, "output_tokens": 12, "cached_input_tokens": 7}));
        first.entry.created_at = 1_700_000_000_500;
        store.commit_step(busy, 0, &first).await?;
        store
            .record_action_result(busy, &ActionResult { ok: false, ..action_result(1) })
            .await?;
        // Step 2: a parse error (not a tool call error), then accepted with a tool that works.
        store.record_rejection(busy, &rejected(2, 1)).await?;
        let mut second = step_commit(2, &first.new_state, json!({"b": 2}), true);
        second.entry.attempt = 2;
        second.entry.usage = None;
        store.commit_step(busy, 1, &second).await?;
        store.record_action_result(busy, &ActionResult { ok: true, ..action_result(2) }).await?;

        // A task with one hand-broken usage row: that row counts as unreported.
        let broken = &ids[1];
        store
            .record_rejection(broken, &rejected_with(1, 1, "tool_args", json!({"input_tokens": 5, "output_tokens": 1})))
            .await?;
        store
            .record_rejection(broken, &rejected_with(1, 2, "tool_args", json!({"input_tokens": 7, "output_tokens": 2})))
            .await?;
        db.execute(&format!(
            "UPDATE journal SET usage = '{{not json', errors = '[{{\"kind\": ' WHERE task_id = '{broken}' AND attempt = 2"
        ))
        .await?;

        let rows = store.batch_tasks(&batch.id).await?;
        assert_eq!(rows.len(), 3);
        let busy_row = &rows[0];
        assert_eq!(busy_row.id, *busy);
        assert_eq!(busy_row.version, 2);
        assert_eq!((busy_row.accepted, busy_row.rejected), (2, 3));
        assert_eq!(busy_row.tool_call_rejections, 2);
        // Step 1's tool failed, step 2's worked.
        assert_eq!(busy_row.tool_errors, 1);
        assert_eq!(busy_row.prompt_tokens, 20 + 20 + 120 + 20 + 1);
        assert_eq!((busy_row.input_tokens, busy_row.output_tokens), (100 + 110 + 120 + 20, 10 + 11 + 12 + 5));
        assert_eq!(busy_row.started_at, Some(0));
        assert_eq!(busy_row.status, Some(TaskStatus::Running));

        let broken_row = &rows[1];
        assert_eq!((broken_row.rejected, broken_row.tool_call_rejections), (2, 1));
        assert_eq!((broken_row.input_tokens, broken_row.output_tokens), (5, 1));
        assert_eq!(broken_row.started_at, Some(1_700_000_000_001));

        let idle = &rows[2];
        assert_eq!((idle.accepted, idle.rejected, idle.tool_errors, idle.input_tokens), (0, 0, 0, 0));
        assert_eq!(idle.started_at, None);
        assert_eq!(idle.labels, json!({"file": "input-2.txt"}));
        Ok(())
    })
    .await
}

/// An action whose outcome is unknown after a crash is stored with `ok` NULL and counted as
/// its own figure, not as a tool error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_counted_apart_from_tool_errors() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store
            .create_batch(&new_batch("unknown", OnError::SkipAndLog, 0))
            .await?;
        let ids = store
            .enqueue_tasks(&batch.id, (0..1).map(queued).collect())
            .await?;
        let task = &ids[0];
        let first = step_commit(1, &json!({"n": 0}), json!({"a": 1}), true);
        store.commit_step(task, 0, &first).await?;
        let unknown = ActionResult {
            ok: false,
            outcome_unknown: true,
            ..action_result(1)
        };
        store.record_action_result(task, &unknown).await?;
        let second = step_commit(2, &first.new_state, json!({"b": 2}), true);
        store.commit_step(task, 1, &second).await?;
        store
            .record_action_result(
                task,
                &ActionResult {
                    ok: false,
                    ..action_result(2)
                },
            )
            .await?;

        let row = &store.batch_tasks(&batch.id).await?[0];
        assert_eq!((row.tool_errors, row.outcome_unknown), (1, 1));
        let intents = store.intents(task).await?;
        assert_eq!((intents[0].done, intents[0].ok), (true, None));
        assert_eq!((intents[1].done, intents[1].ok), (true, Some(false)));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_windows_never_grant_more_than_the_limit() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let stores = [db.open().await?, db.open().await?];
        let requests = RateLimit {
            requests_per_minute: Some(5),
            tokens_per_minute: None,
        };
        let barrier = Arc::new(Barrier::new(24));
        let callers: Vec<_> = (0..24)
            .map(|i| {
                let store = stores[i % 2].clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.rate_acquire("model m", &requests, 10).await
                })
            })
            .collect();
        let mut granted = 0;
        for caller in callers {
            match caller.await?? {
                RateDecision::Granted => granted += 1,
                RateDecision::Wait { ms } => {
                    assert!(ms > 0 && ms <= 60_000, "wait {ms} ms");
                }
            }
        }
        assert_eq!(granted, 5);

        // Tokens: 3 × 40 fit a 100-token window twice; what the answers add counts too.
        let tokens = RateLimit {
            requests_per_minute: None,
            tokens_per_minute: Some(100),
        };
        let mut decisions = Vec::new();
        for _ in 0..3 {
            decisions.push(stores[0].rate_acquire("model t", &tokens, 40).await?);
        }
        assert_eq!(
            decisions[..2],
            [RateDecision::Granted, RateDecision::Granted]
        );
        assert!(matches!(decisions[2], RateDecision::Wait { ms } if ms > 0 && ms <= 60_000));
        assert_eq!(
            stores[1].rate_acquire("model t", &tokens, 20).await?,
            RateDecision::Granted
        );
        stores[1].rate_add_tokens("model t", 1).await?;
        assert!(matches!(
            stores[0].rate_acquire("model t", &tokens, 1).await?,
            RateDecision::Wait { .. }
        ));
        // Scopes are separate; no limit grants everything.
        assert_eq!(
            stores[0].rate_acquire("model u", &tokens, 100).await?,
            RateDecision::Granted
        );
        assert_eq!(
            stores[0]
                .rate_acquire("model t", &RateLimit::default(), 1_000)
                .await?,
            RateDecision::Granted
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueueing_is_all_or_nothing_and_fast() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let batch = store.create_batch(&new_batch("bulk", OnError::SkipAndLog, 0)).await?;
        assert!(matches!(
            store.enqueue_tasks("0000", vec![queued(0)]).await,
            Err(StoreError::NoSuchBatch(_))
        ));
        // The 700th of 1,000 tasks cannot be written: none of them stays.
        let poison = match db.backend {
            Backend::Sqlite => "CREATE TRIGGER poison BEFORE INSERT ON tasks WHEN NEW.model = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned task'); END;".to_owned(),
            Backend::Postgres | Backend::PgBouncer => "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.model = 'poison' THEN RAISE EXCEPTION 'poisoned task'; END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER poison BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION poison();".to_owned(),
        };
        db.execute(&poison).await?;
        let mut tasks: Vec<QueuedTask> = (0..1_000).map(queued).collect();
        tasks[699].task.model = "poison".into();
        let error = store.enqueue_tasks(&batch.id, tasks).await.err().context("poisoned")?;
        assert!(error.to_string().contains("poisoned task"), "{error}");
        for table in ["tasks", "snapshots", "observations"] {
            assert_eq!(db.count(&format!("SELECT COUNT(*) FROM {table}")).await?, 0, "{table}");
        }

        let started = Instant::now();
        let ids = store.enqueue_tasks(&batch.id, (0..10_000).map(queued).collect()).await?;
        eprintln!("{:?}: enqueued 10,000 tasks in {:?}", db.backend, started.elapsed());
        let rows = store.batch_tasks(&batch.id).await?;
        let listed: Vec<&String> = rows.iter().map(|t| &t.id).collect();
        assert_eq!(listed, ids.iter().collect::<Vec<_>>());
        assert_eq!(rows[9_999].labels, json!({"file": "input-9999.txt"}));
        assert_eq!(db.count("SELECT COUNT(*) FROM snapshots").await?, 10_000);
        assert_eq!(store.task(&ids[4_321]).await?.state, json!({"n": 4321}));
        Ok(())
    })
    .await
}

/// Idle workers wait on the store's work signal where it has one (docs/storage.md, "Workers that
/// wake on events"): PostgreSQL reached directly notifies a listening connection when work is
/// queued. SQLite has no signal, and neither has PostgreSQL through a transaction pooler, which
/// cannot hold a `LISTEN`: there the store says so (`None`) and workers find the same work by
/// polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_work_is_signalled_where_the_store_can_and_found_by_polling_everywhere()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let signal = store.work_signal().await?;
        assert_eq!(
            signal.is_some(),
            db.backend == Backend::Postgres,
            "{:?}: a work signal only where a LISTEN can be held",
            db.backend
        );
        // Creating a batch queues nothing, so the signal has nothing to say yet.
        let batch = store
            .create_batch(&new_batch("wake", OnError::SkipAndLog, 0))
            .await?;
        let mut signal = signal;
        if let Some(signal) = &mut signal {
            signal.borrow_and_update();
        }
        let ids = store.enqueue_tasks(&batch.id, vec![queued(0)]).await?;
        if let Some(signal) = &mut signal {
            tokio::time::timeout(std::time::Duration::from_secs(10), signal.changed())
                .await
                .context("no work signal within 10 s of queueing a task")??;
        }
        let claimed = claim_one(store.as_ref(), "w1", Some(&batch.id)).await?;
        assert_eq!(claimed.map(|c| c.task_id), Some(ids[0].clone()));
        Ok(())
    })
    .await
}

/// A single task (one the service created, not part of a batch) is queued on demand and then
/// claimed like any other; an unknown task is `NotFound`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_task_is_queued_on_demand_and_claimed() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        assert!(claim_one(store.as_ref(), "w1", None).await?.is_none());
        store.queue_task(&task.id).await?;
        store.queue_task(&task.id).await?;
        let claimed = claim_one(store.as_ref(), "w1", None).await?;
        assert_eq!(claimed.map(|c| c.task_id), Some(task.id.clone()));
        assert!(claim_one(store.as_ref(), "w2", None).await?.is_none());
        match store.queue_task("0000").await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

/// Queue depth counts each queued task once, by where it stands now: running under a live
/// lease, in a stopped batch, waiting on a backoff, or ready. Finished tasks and tasks never
/// queued are not counted; an expired lease is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_counts_queued_tasks_by_state() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        assert_eq!(store.queue_depth().await?, QueueDepth::default());
        let open = store
            .create_batch(&new_batch("open", OnError::SkipAndLog, 3))
            .await?;
        let stopped = store
            .create_batch(&new_batch("stopped", OnError::Stop, 0))
            .await?;
        let ids = store
            .enqueue_tasks(&open.id, (0..5).map(queued).collect())
            .await?;
        store.enqueue_tasks(&stopped.id, vec![queued(9)]).await?;
        store.stop_batch(&stopped.id, "stopped by the test").await?;
        store.create_task(new_task(), &json!({})).await?;
        assert_eq!(
            store.queue_depth().await?,
            QueueDepth {
                ready: 5,
                stopped: 1,
                ..QueueDepth::default()
            }
        );

        let running = claim_one(store.as_ref(), "w1", Some(&open.id))
            .await?
            .context("first claim")?;
        let retrying = claim_one(store.as_ref(), "w2", Some(&open.id))
            .await?
            .context("second claim")?;
        store
            .settle_claim(
                &retrying.task_id,
                "w2",
                &Settle::RetryAt {
                    not_before: now() + 600_000,
                },
                Some("provider: down"),
            )
            .await?;
        let done = claim_one(store.as_ref(), "w3", Some(&open.id))
            .await?
            .context("third claim")?;
        store
            .settle_claim(&done.task_id, "w3", &Settle::Done, None)
            .await?;
        let expired = store
            .claim_task(&claim("w4"), 1, Some(&open.id))
            .await?
            .context("fourth claim")?;
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        assert_eq!(
            [&running, &retrying, &done, &expired].map(|c| c.task_id.as_str()),
            [&ids[0], &ids[1], &ids[2], &ids[3]].map(String::as_str)
        );
        let depth = store.queue_depth().await?;
        assert_eq!(
            depth,
            QueueDepth {
                running: 1,
                stopped: 1,
                backoff: 1,
                ready: 2,
            }
        );
        assert_eq!(
            depth.by_state(),
            [("ready", 2), ("running", 1), ("backoff", 1), ("stopped", 1)]
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_an_expired_lease_says_it_took_the_task_over() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        store.queue_task(&task.id).await?;
        // A first claim with a lease that runs out at once; its holder never comes back.
        let first = store
            .claim_task(&claim("gone"), 1, None)
            .await?
            .context("the first claim")?;
        assert!(!first.took_over, "nobody held the task before");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let second = store
            .claim_task(&claim("next"), 60_000, None)
            .await?
            .context("the expired lease makes the task claimable")?;
        assert_eq!(second.task_id, task.id);
        assert!(second.took_over, "the expired lease was taken over");
        // Released properly, the next claim takes over nothing.
        store
            .settle_claim(&task.id, "next", &Settle::RetryAt { not_before: 0 }, None)
            .await?;
        let third = store
            .claim_task(&claim("third"), 60_000, None)
            .await?
            .context("queued again")?;
        assert!(!third.took_over);
        Ok(())
    })
    .await
}
