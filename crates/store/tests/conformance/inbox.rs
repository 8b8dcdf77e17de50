//! The inbox's half of the conformance suite: messages and decisions posted from outside a
//! runner wait, queue their task, are delivered exactly once with what they became, and keep a
//! settled claim queued while any waits — on every backend.

use super::*;

fn message(kind: MessageKind, text: &str) -> NewMessage {
    NewMessage {
        kind,
        text: text.into(),
        author: "key-1".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_message_waits_queues_its_task_and_is_delivered_once() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        assert!(store.claim_task(&claim("w"), 60_000, None).await?.is_none());

        let first = store
            .post_message(
                &task.id,
                &message(MessageKind::Message, "move it to the 20th"),
            )
            .await?;
        let second = store
            .post_message(
                &task.id,
                &message(MessageKind::Message, "and call it Launch"),
            )
            .await?;
        assert!(second.id > first.id);
        assert_eq!(first.delivered_step, None);
        assert_eq!(
            store.pending_messages(&task.id).await?,
            vec![first.clone(), second.clone()]
        );
        // Posting queued the task for workers, with a `message` event per entry.
        let claimed = store
            .claim_task(&claim("w"), 60_000, None)
            .await?
            .context("the messaged task is claimable")?;
        assert_eq!(claimed.task_id, task.id);
        // On PostgreSQL an event is readable once every older transaction has ended (the
        // event log's rule), and other tests' transactions run meanwhile: wait for both.
        let query = EventQuery {
            tenant: None,
            task: Some(task.id.clone()),
            after: None,
            limit: 100,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let kinds: Vec<_> = loop {
            let kinds: Vec<_> = store
                .events_after(&query)
                .await?
                .iter()
                .map(|e| e.kind)
                .collect();
            let messages = kinds.iter().filter(|k| **k == EventKind::Message).count();
            if messages >= 2 || std::time::Instant::now() > deadline {
                break kinds;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(
            kinds.iter().filter(|k| **k == EventKind::Message).count(),
            2,
            "{kinds:?}"
        );

        // Delivered with the observation it became, once.
        store
            .deliver_messages(
                &task.id,
                1,
                Some("opening\n\nmove it"),
                &[first.id, second.id],
            )
            .await?;
        assert_eq!(
            store.observation(&task.id, 1).await?.as_deref(),
            Some("opening\n\nmove it")
        );
        assert!(store.pending_messages(&task.id).await?.is_empty());
        let all = store.messages(&task.id).await?;
        assert_eq!(
            all.iter().map(|m| m.delivered_step).collect::<Vec<_>>(),
            vec![Some(1), Some(1)]
        );
        let again = store
            .deliver_messages(&task.id, 1, Some("twice"), &[first.id])
            .await;
        assert!(
            matches!(again, Err(StoreError::Corrupt { .. })),
            "{again:?}"
        );
        assert_eq!(
            store.observation(&task.id, 1).await?.as_deref(),
            Some("opening\n\nmove it"),
            "a refused delivery changed the observation"
        );
        // Another task's entry is not this task's to deliver.
        let other = store.create_task(new_task(), &json!({})).await?;
        let foreign = store
            .post_message(&other.id, &message(MessageKind::Message, "hi"))
            .await?;
        assert!(
            store
                .deliver_messages(&task.id, 1, None, &[foreign.id])
                .await
                .is_err()
        );
        assert_eq!(store.pending_messages(&other.id).await?, vec![foreign]);
        assert!(matches!(
            store
                .post_message(
                    "00000000-0000-0000-0000-000000000000",
                    &message(MessageKind::Message, "x")
                )
                .await,
            Err(StoreError::NotFound(_))
        ));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_settled_while_a_message_waits_stays_queued() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        store.queue_task(&task.id).await?;
        let claimed = store
            .claim_task(&claim("w1"), 60_000, None)
            .await?
            .context("a claim")?;
        // Posted while the worker runs the task; the worker settles without seeing it.
        let waiting = store
            .post_message(&task.id, &message(MessageKind::Message, "one more thing"))
            .await?;
        store
            .settle_claim(&claimed.task_id, "w1", &Settle::Done, None)
            .await?;
        let again = store
            .claim_task(&claim("w2"), 60_000, None)
            .await?
            .context("the task stayed queued for its message")?;
        assert_eq!(again.task_id, task.id);
        store
            .deliver_messages(&task.id, 1, None, &[waiting.id])
            .await?;
        store
            .settle_claim(&task.id, "w2", &Settle::Done, None)
            .await?;
        assert!(
            store
                .claim_task(&claim("w3"), 60_000, None)
                .await?
                .is_none(),
            "nothing waits any more, yet the task was queued again"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_reopens_a_finished_task_and_a_result_delivers_its_decision()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        // A finished task is reopened by the message that continues it.
        let done = store.create_task(new_task(), &json!({})).await?;
        store
            .set_status(
                &done.id,
                TaskStatus::Completed,
                Some(&json!({"reason": "finish"})),
            )
            .await?;
        let more = store
            .post_message(&done.id, &message(MessageKind::Message, "one more"))
            .await?;
        store
            .deliver_messages(&done.id, 1, Some("A user wrote: one more"), &[more.id])
            .await?;
        let reopened = store.task(&done.id).await?;
        assert_eq!(
            (reopened.status, reopened.outcome),
            (TaskStatus::Running, None)
        );

        // A decision lands with the result of the action it decides, in one transaction.
        let paused = store.create_task(new_task(), &json!({})).await?;
        store
            .commit_step(
                &paused.id,
                0,
                &step_commit(1, &json!({}), json!({"a": 1}), true),
            )
            .await?;
        let approve = store
            .post_message(&paused.id, &message(MessageKind::Approve, ""))
            .await?;
        assert_eq!(approve.kind, MessageKind::Approve);
        let stray = store
            .post_message(&done.id, &message(MessageKind::Message, "not yours"))
            .await?;
        let wrong = ActionResult {
            delivered: vec![approve.id, stray.id],
            ..action_result(1)
        };
        assert!(
            store
                .record_action_result(&paused.id, &wrong)
                .await
                .is_err()
        );
        assert_eq!(
            store.observation(&paused.id, 2).await?,
            None,
            "a result with a foreign delivery was half written"
        );
        let right = ActionResult {
            delivered: vec![approve.id],
            ..action_result(1)
        };
        store.record_action_result(&paused.id, &right).await?;
        assert!(store.pending_messages(&paused.id).await?.is_empty());
        assert_eq!(store.messages(&paused.id).await?[0].delivered_step, Some(2));
        Ok(())
    })
    .await
}
