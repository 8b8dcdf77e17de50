//! A task that moved to another version of its skill, in the web viewer in a real headless
//! Chromium: the task page names the version it runs, the timeline marks the boundary between
//! versions, and the upgrade's step shows the versions, the migrations and the migrated
//! state's diff.
#![allow(clippy::unwrap_used)]

mod support;
mod viewer_webdriver;

use std::sync::Arc;

use serde_json::json;
use skillstate_store::TaskStatus;
use support::*;
use viewer_webdriver::{Browser, Driver, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_boundary_in_a_real_browser() {
    let driver = Driver::start().await.unwrap();
    let skills = tempfile::tempdir().unwrap();
    deploy_warehouse(skills.path(), "1.0.0", "inventory", None);
    let harness = Harness::with_factory(
        Db::sqlite().await,
        Arc::new(EnvFactory {
            skills_dir: skills.path().to_owned(),
        }),
    );
    let store = harness.store();
    let (key, key_id) = harness.key("acme").await;
    let api = Socket::start(harness.state.clone()).await;
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 4, "events": 3}}),
            )
            .key(&key),
        )
        .await;
    let id = created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    run_to_end(store.clone(), &id).await;
    let done = store.task(&id).await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    let boundary = done.version + 1;
    deploy_warehouse(
        skills.path(),
        "2.0.0",
        "shelves",
        Some((
            "1.0.0",
            json!([{"op": "move", "from": "/inventory", "path": "/shelves"}]),
        )),
    );
    let moved = api
        .send(Call::post(format!("/v1/tasks/{id}:upgrade"), &json!({"apply": true})).key(&key))
        .await;
    assert_eq!(moved.expect(200).json()["step"], boundary);

    let browser = driver.session(1400, 1000).await.unwrap();
    let result = drive(&browser, &api.base, &key, &key_id, &id, boundary).await;
    let _ = browser.quit().await;
    api.stop().await;
    result.unwrap();
}

async fn drive(
    browser: &Browser,
    base: &str,
    key: &str,
    key_id: &str,
    id: &str,
    boundary: u64,
) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#key={key}")).await?;
    browser.wait("#filter-status", WAIT).await?;
    browser.goto(&format!("{base}/#/tasks/{id}")).await?;
    browser.wait("#task-skill", WAIT).await?;
    let skill = browser.text_of("#task-skill").await?;
    assert!(skill.contains("warehouse 2.0.0 ("), "{skill}");
    // The boundary sits right above the upgrade's step, naming both versions.
    let marker = browser
        .wait_script(
            "the version boundary",
            "const b = document.querySelector('#timeline tr.version-boundary'); \
             if (!b) return null; const next = b.nextElementSibling; \
             return [b.dataset.step, b.textContent, next && next.dataset.step, next && next.classList.contains('upgrade')]",
            WAIT,
        )
        .await?;
    assert_eq!(marker[0], boundary.to_string(), "{marker}");
    let text = marker[1].as_str().unwrap_or_default();
    assert!(
        text.contains("1.0.0 (") && text.contains("→ 2.0.0 ("),
        "{text}"
    );
    assert_eq!(marker[2], boundary.to_string());
    assert_eq!(marker[3], true);
    // Opened, the step shows the upgrade (not a model's answer) and the migration's diff.
    browser
        .script(
            "document.querySelector('#timeline tr.step.upgrade .step-toggle').click()",
            json!([]),
        )
        .await?;
    let detail = browser
        .wait_script(
            "the upgrade's step",
            "const d = document.querySelector('#timeline tr.detail .step-detail'); \
             const line = d && d.querySelector('.upgrade-line'); \
             return line && d.querySelector('.diff') ? [line.textContent, d.textContent, !!d.querySelector('.answer')] : null",
            WAIT,
        )
        .await?;
    let line = detail[0].as_str().unwrap_or_default();
    assert!(
        line.contains("1.0.0") && line.contains("2.0.0") && line.contains("migrations from 1.0.0"),
        "{line}"
    );
    assert!(line.contains(key_id), "{line}");
    let whole = detail[1].as_str().unwrap_or_default();
    assert!(
        whole.contains("/shelves") && whole.contains("/inventory"),
        "{whole}"
    );
    assert_eq!(detail[2], false, "an upgrade is not shown as an answer");
    Ok(())
}
