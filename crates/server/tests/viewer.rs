//! The web viewer, end to end: a real server on 127.0.0.1 over a SQLite file, real warehouse
//! runs (the oracle), a real bench report, and a real headless Chromium driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`; scripts/test installs them). The page is used as
//! a person would: enter the key, open the list, open a task, move the state slider with the
//! keyboard, expand a step, approve a paused task and watch it continue, send a message, open
//! the bench page. What it shows is compared with what the API answers. Screenshots go to
//! target/viewer-screenshots/.
#![allow(clippy::unwrap_used)]

mod support;
mod viewer_webdriver;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::ContextStrategy;
use skillstate_server::{ApiError, CONTENT_SECURITY_POLICY, ResolvedRequest, TaskFactory};
use skillstate_store::{NewTask, TaskRecord, TaskStatus};
use skillstate_tools::Environment;
use support::*;
use viewer_webdriver::{Browser, Driver, WAIT, keys, screenshots};

/// The shipped warehouse; tasks labelled `gate: approve` need approval for every
/// environment action.
struct Selective(EnvFactory);

#[async_trait]
impl TaskFactory for Selective {
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
        let (mut task, state) = self.0.prepare(request).await?;
        if request.labels.get("gate").map(String::as_str) == Some("approve") {
            for spec in task.tools.iter_mut().filter(|s| s.source != "runtime") {
                spec.needs_approval = true;
            }
        }
        Ok((task, state))
    }

    async fn fork_world(
        &self,
        task: &TaskRecord,
    ) -> Result<Option<Box<dyn Environment>>, ApiError> {
        self.0.fork_world(task).await
    }
}

async fn create(api: &Socket, key: &str, body: Value) -> String {
    let created = api.send(Call::post("/v1/tasks", &body).key(key)).await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn get(api: &Socket, key: &str, path: &str) -> Value {
    api.send(Call::get(path).key(key)).await.expect(200).json()
}

/// A small bench of the warehouse (two horizons, two seeds, every strategy), as `skillstate
/// bench` runs it.
async fn small_bench() -> skillstate_bench::BenchReport {
    tokio::task::spawn_blocking(|| {
        let config = skillstate_bench::BenchConfig {
            environment: "warehouse".into(),
            horizons: vec![6, 12],
            seeds: vec![0, 1],
            strategies: ContextStrategy::ALL.to_vec(),
            budget: None,
            noise: vec![0],
            drifts: Vec::new(),
            model: "oracle".into(),
            price: None,
            jobs: 2,
        };
        skillstate_bench::run_bench(&skills_dir().join("warehouse"), &config, None, &|_, _| {})
            .unwrap()
    })
    .await
    .unwrap()
}

/// The cells of `skillstate bench`'s terminal table, row by row (header first).
fn table_cells(report: &skillstate_bench::BenchReport) -> Vec<Vec<String>> {
    report
        .table()
        .lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter(|line| !line.starts_with('-'))
        .map(|line| line.split(" | ").map(|c| c.trim().to_owned()).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_in_a_real_browser() {
    let started = Instant::now();
    // The browser first: without Chromium this fails at once, naming the install command.
    let driver = Driver::start().await.unwrap();

    let db = Db::sqlite().await;
    let harness = Harness::with_factory(
        db,
        Arc::new(Selective(EnvFactory {
            skills_dir: skills_dir(),
        })),
    );
    let store = harness.store();
    let (key, _) = harness.key("acme").await;
    let report = small_bench().await;
    let results = serde_json::to_vec_pretty(&report).unwrap();
    let state = harness.state.clone().with_bench_results(results);
    let api = Socket::start(state).await;

    // A 50-event warehouse run to its end (the README's picture of a task page).
    let run = create(
        &api,
        &key,
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 7, "events": 50},
               "labels": {"run": "demo", "site": "north"}}),
    )
    .await;
    run_to_end(store.clone(), &run).await;
    // A task labelled with markup that must stay text.
    let marked = create(
        &api,
        &key,
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 3, "events": 2},
               "labels": {"note": "<img src=x id=pwned>"}}),
    )
    .await;
    // A batch of three: two finished (run, then settled as a worker does), one waiting.
    let items: Vec<Value> = (1..=3)
        .map(|seed| {
            json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": seed, "events": 2},
                   "labels": {"batch": "nightly"}})
        })
        .collect();
    let batch = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"name": "nightly", "tasks": items}),
            )
            .key(&key),
        )
        .await;
    let batch = batch.expect(201).json();
    let batch_id = batch["batch"].as_str().unwrap().to_owned();
    for item in &batch["tasks"].as_array().unwrap()[..2] {
        let id = item["task"]["id"].as_str().unwrap();
        run_to_end(store.clone(), id).await;
        let claim = skillstate_store::LeaseClaim {
            token: format!("settle {id}"),
            holder: "test".into(),
            process: "test".into(),
        };
        let claimed = store
            .claim_task(&claim, 60_000, Some(&batch_id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claimed.task_id, id);
        store
            .settle_claim(id, &claim.token, &skillstate_store::Settle::Done, None)
            .await
            .unwrap();
    }
    let done = store.task(&run).await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    assert!(done.version >= 50, "{} steps", done.version);
    // A task paused for approval of its first action.
    let gated = create(
        &api,
        &key,
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": 4},
               "labels": {"gate": "approve"}}),
    )
    .await;
    run_to_end(store.clone(), &gated).await;
    let paused = store.task(&gated).await.unwrap();
    assert_eq!(
        (paused.status, paused.version),
        (TaskStatus::AwaitingApproval, 1)
    );

    // The assets need no key and carry the policy; the API's document does not list them.
    for (path, kind) in [
        ("/", "text/html"),
        ("/viewer/app.js", "text/javascript"),
        ("/viewer/style.css", "text/css"),
        ("/viewer/bench.json", "application/json"),
    ] {
        let asset = api.send(Call::get(path)).await;
        asset.expect(200);
        assert!(
            asset.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        assert_eq!(
            asset.header("content-security-policy"),
            Some(CONTENT_SECURITY_POLICY),
            "{path}"
        );
        assert_eq!(asset.header("x-content-type-options"), Some("nosniff"));
    }
    let index = String::from_utf8(api.send(Call::get("/")).await.body).unwrap();
    assert!(!index.contains("<script>") && !index.contains("style="));
    let document = api.send(Call::get("/openapi.json")).await.json();
    let paths = document["paths"].as_object().unwrap();
    assert!(
        paths.keys().all(|p| p != "/" && !p.starts_with("/viewer")),
        "{:?}",
        paths.keys()
    );
    api.send(Call::get("/v1/tasks")).await.problem(401);

    let browser = driver.session(1400, 1000).await.unwrap();
    let shots = screenshots();
    let tasks = Tasks {
        run: &run,
        gated: &gated,
        marked: &marked,
        batch: &batch_id,
    };
    let result = drive(&browser, &api, &key, &store, &tasks, &report, &shots).await;
    if result.is_err() {
        let _ = browser.screenshot(&shots.join("failure.png")).await;
    }
    let _ = browser.quit().await;
    api.stop().await;
    result.unwrap();
    eprintln!(
        "viewer: browser test took {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        shots.display()
    );
}

/// What the browser is shown: a finished 50-step run, a task paused for approval, a task
/// labelled with markup, a batch.
struct Tasks<'a> {
    run: &'a str,
    gated: &'a str,
    marked: &'a str,
    batch: &'a str,
}

/// `1234567` as `1,234,567`, as the viewer writes token counts.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

async fn drive(
    browser: &Browser,
    api: &Socket,
    key: &str,
    store: &Arc<dyn skillstate_store::Store>,
    tasks: &Tasks<'_>,
    report: &skillstate_bench::BenchReport,
    shots: &std::path::Path,
) -> anyhow::Result<()> {
    let (run, gated, marked) = (tasks.run, tasks.gated, tasks.marked);
    // The list asks for the key once; it stays for the session.
    browser.goto(&format!("{}/", api.base)).await?;
    let input = browser.wait("#key-input", WAIT).await?;
    browser.type_into(&input, "sk_not_a_key").await?;
    browser.type_into(&input, keys::ENTER).await?;
    browser
        .wait_script(
            "the refused key",
            "const a = document.querySelector('.key-form [role=alert]'); return a && a.textContent.includes('refused')",
            WAIT,
        )
        .await?;
    // The console holds the refused request, and nothing else.
    for (_, message) in browser.console().await? {
        assert!(
            message.contains("/v1/tasks?limit=50") && message.contains("401"),
            "{message}"
        );
    }
    let input = browser.wait("#key-input", WAIT).await?;
    browser.type_into(&input, key).await?;
    browser.type_into(&input, keys::ENTER).await?;
    browser
        .wait(&format!("#task-table tr[data-task='{run}']"), WAIT)
        .await?;
    browser
        .wait(&format!("#task-table tr[data-task='{gated}']"), WAIT)
        .await?;
    // Labels are text: the markup in one is shown, not run.
    let row = browser
        .text_of(&format!("#task-table tr[data-task='{marked}']"))
        .await?;
    assert!(row.contains("note:<img src=x id=pwned>"), "{row}");
    assert_eq!(
        browser
            .script(
                "return document.getElementById('pwned') === null",
                json!([])
            )
            .await?,
        true
    );
    let steps_cell = browser
        .text_of(&format!("#task-table tr[data-task='{run}'] td.num"))
        .await?;
    let done = store.task(run).await?;
    assert_eq!(steps_cell, done.version.to_string());
    // One page: no pager buttons, and nothing else in their place.
    assert_eq!(browser.text_of(".pager").await?, "");
    // Its tokens (counted, prompts and answers) as the API totals them; no price, no cost.
    let totals = get(api, key, &format!("/v1/tasks/{run}")).await["totals"].clone();
    let tokens =
        totals["prompt_tokens"].as_u64().unwrap() + totals["output_tokens"].as_u64().unwrap();
    assert!(tokens > 0);
    assert_eq!(
        browser
            .text_of(&format!("#task-table tr[data-task='{run}'] td.tokens"))
            .await?,
        thousands(tokens)
    );
    assert_eq!(
        browser
            .text_of(&format!("#task-table tr[data-task='{run}'] td.cost"))
            .await?,
        "—"
    );
    browser.screenshot(&shots.join("task-list.png")).await?;
    // Live: a task created meanwhile shows up without a reload (the list follows /v1/events).
    let fresh = create(
        api,
        key,
        json!({"skill": "warehouse", "model": "oracle", "labels": {"live": "yes"}}),
    )
    .await;
    browser
        .wait(&format!("#task-table tr[data-task='{fresh}']"), WAIT)
        .await?;

    // Filter by status: only the paused task.
    browser
        .goto(&format!("{}/#/?status=awaiting_approval", api.base))
        .await?;
    browser
        .wait(&format!("#task-table tr[data-task='{gated}']"), WAIT)
        .await?;
    assert_eq!(
        browser.find_all("#task-table tr[data-task]").await?.len(),
        1
    );
    // Filter by label, through the form.
    browser.goto(&format!("{}/#/", api.base)).await?;
    let label = browser.wait("#filter-label", WAIT).await?;
    browser.type_into(&label, "run:demo").await?;
    browser.type_into(&label, keys::ENTER).await?;
    browser
        .wait_script(
            "the label filter",
            "return location.hash.includes('label=run') && document.querySelectorAll('#task-table tr[data-task]').length === 1 && document.querySelector('#task-table tr[data-task]').dataset.task",
            WAIT,
        )
        .await?;

    // Open the finished run from the list.
    let link = browser
        .wait(
            &format!("#task-table tr[data-task='{run}'] a.task-link"),
            WAIT,
        )
        .await?;
    browser.click(&link).await?;
    let steps = browser.wait("#task-steps", WAIT).await?;
    assert_eq!(browser.text(&steps).await?, done.version.to_string());
    let shown_tokens = browser.text_of("#task-tokens").await?;
    assert!(
        shown_tokens.starts_with(&format!(
            "{} prompt + {} output",
            thousands(totals["prompt_tokens"].as_u64().unwrap()),
            thousands(totals["output_tokens"].as_u64().unwrap())
        )),
        "{shown_tokens}"
    );
    browser
        .wait_script(
            "the state at the last step",
            &format!(
                "const s = document.querySelector('#state-raw'); return s !== null && s.closest('section').dataset.step === '{}'",
                done.version
            ),
            WAIT,
        )
        .await?;

    // Opening a task reads one page of step summaries and the last state, never step by
    // step: what a 10,000-step task needs to open is the same.
    browser
        .wait("#task-chart-svg polyline.series", WAIT)
        .await?;
    let fetched: Vec<String> = serde_json::from_value(
        browser
            .script(
                "return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname + new URL(e.name).search)",
                json!([]),
            )
            .await?,
    )?;
    let journal: Vec<&String> = fetched
        .iter()
        .filter(|u| u.starts_with(&format!("/v1/tasks/{run}/steps")))
        .collect();
    assert_eq!(
        journal.iter().map(|u| u.as_str()).collect::<Vec<_>>(),
        vec![
            format!("/v1/tasks/{run}/steps?limit=100").as_str(),
            format!("/v1/tasks/{run}/steps/{}/state", done.version).as_str(),
            format!("/v1/tasks/{run}/steps?limit=1000").as_str(),
        ],
        "{fetched:?}"
    );

    // The slider, by keyboard: Home, then seven steps right; the state shown is the API's.
    let slider = browser.wait("#state-slider", WAIT).await?;
    browser.click(&slider).await?;
    browser.type_into(&slider, keys::HOME).await?;
    for _ in 0..7 {
        browser.type_into(&slider, keys::RIGHT).await?;
    }
    browser
        .wait_script(
            "the state after step 7",
            "const s = document.querySelector('#state-raw').closest('section'); return s.dataset.step === '7' && document.querySelector('#state-raw').textContent",
            WAIT,
        )
        .await?;
    let shown: Value = serde_json::from_str(
        browser
            .script(
                "return document.querySelector('#state-raw').textContent",
                json!([]),
            )
            .await?
            .as_str()
            .unwrap_or_default(),
    )?;
    let at_seven = get(api, key, &format!("/v1/tasks/{run}/steps/7/state")).await;
    assert_eq!(shown, at_seven, "the state shown at step 7");
    assert_ne!(
        at_seven,
        get(api, key, &format!("/v1/tasks/{run}/state")).await,
        "step 7's state differs from the last one, so the slider moved the view"
    );

    // A step whose patch removes a shelf: its diff shows the key as removed.
    let mut removals = Vec::new();
    for step in 1..=done.version {
        let detail = get(api, key, &format!("/v1/tasks/{run}/steps/{step}")).await;
        let patch = &detail["accepted"]["patch"];
        let inventory = patch["inventory"].as_object();
        if let Some((shelf, _)) = inventory.and_then(|m| m.iter().find(|(_, v)| v.is_null())) {
            // A move removes one shelf and fills another.
            let moved = inventory.is_some_and(|m| m.values().any(|v| !v.is_null()));
            removals.push((step, shelf.clone(), moved));
        }
    }
    let (step, shelf, _) = removals
        .first()
        .cloned()
        .expect("the oracle ships an item out (a shelf set to null)");
    let before = get(
        api,
        key,
        &format!("/v1/tasks/{run}/steps/{}/state", step - 1),
    )
    .await;
    let after = get(api, key, &format!("/v1/tasks/{run}/steps/{step}/state")).await;
    assert!(before["inventory"].get(&shelf).is_some() && after["inventory"].get(&shelf).is_none());
    assert!(step <= 100, "on the first page of the timeline");
    let toggle = browser
        .wait(
            &format!("#timeline tr.step[data-step='{step}'] .step-toggle"),
            WAIT,
        )
        .await?;
    browser.click(&toggle).await?;
    let removed = browser
        .wait(
            &format!("#timeline tr.detail[data-step='{step}'] ul.diff li.removed[data-pointer='/inventory/{shelf}']"),
            WAIT,
        )
        .await?;
    let text = browser.text(&removed).await?;
    assert!(
        text.contains("removed") && text.contains(&format!("/inventory/{shelf}")),
        "{text}"
    );
    assert!(
        browser
            .find(&format!("#timeline tr.detail[data-step='{step}'] ul.diff li.added[data-pointer='/inventory/{shelf}']"))
            .await?
            .is_none()
    );
    browser.click(&toggle).await?;
    // A later removal, opened with "Go to step"; its button moves the state viewer there.
    // This is the page as the README shows it.
    // (A move in the second half of the run, when there is one: a diff with both colours.)
    let (late, late_shelf, _) = removals
        .iter()
        .rev()
        .find(|(s, _, moved)| *moved && *s > 25 && *s < done.version)
        .unwrap_or_else(|| removals.last().unwrap())
        .clone();
    let goto = browser.wait("#goto-step", WAIT).await?;
    browser.type_into(&goto, &late.to_string()).await?;
    browser.type_into(&goto, keys::ENTER).await?;
    browser
        .wait(
            &format!("#step-alone ul.diff li.removed[data-pointer='/inventory/{late_shelf}']"),
            WAIT,
        )
        .await?;
    let show_state = browser.wait("#step-alone button.show-state", WAIT).await?;
    browser.click(&show_state).await?;
    browser
        .wait_script(
            "the state after the opened step",
            &format!("return document.querySelector('#state-raw').closest('section').dataset.step === '{late}'"),
            WAIT,
        )
        .await?;
    browser
        .wait("#task-chart-svg polyline.series", WAIT)
        .await?;
    browser.set_window(1400, 1300).await?;
    browser.script("window.scrollTo(0, 0)", json!([])).await?;
    browser.screenshot(&shots.join("task-page.png")).await?;
    browser.set_window(1400, 1000).await?;

    // The exact prompt of the first removal's step.
    browser.click(&toggle).await?;
    let show = browser
        .wait(
            &format!("#timeline tr.detail[data-step='{step}'] button.show-prompt"),
            WAIT,
        )
        .await?;
    browser.click(&show).await?;
    browser
        .wait(
            &format!("#timeline tr.detail[data-step='{step}'] pre.prompt"),
            WAIT,
        )
        .await?;
    let prompt_shown = browser
        .script(
            &format!("return document.querySelector(\"#timeline tr.detail[data-step='{step}'] pre.prompt\").textContent"),
            json!([]),
        )
        .await?;
    let prompt = get(api, key, &format!("/v1/tasks/{run}/steps/{step}/prompt")).await;
    assert_eq!(prompt_shown, prompt["text"]);

    // The chart: one point per step of the journal.
    let polyline = browser
        .wait("#task-chart-svg polyline.series", WAIT)
        .await?;
    let listed = get(api, key, &format!("/v1/tasks/{run}/steps?limit=1000")).await;
    let step_count = listed["steps"].as_array().unwrap().len();
    assert_eq!(
        browser.attribute(&polyline, "data-points").await?,
        Some(step_count.to_string())
    );
    let points = browser
        .attribute(&polyline, "points")
        .await?
        .unwrap_or_default();
    assert_eq!(points.split_whitespace().count(), step_count);

    // Approve the paused task (found by its id); as a worker delivers the approval it runs
    // on, live.
    browser.goto(&format!("{}/#/", api.base)).await?;
    let search = browser.wait("#search-id", WAIT).await?;
    browser.type_into(&search, gated).await?;
    browser.type_into(&search, keys::ENTER).await?;
    let approve = browser.wait("#approve", WAIT).await?;
    assert!(
        browser
            .text_of("#task-status")
            .await?
            .contains("awaiting_approval")
    );
    browser
        .wait("#timeline tr.step[data-step='1']", WAIT)
        .await?;
    browser.click(&approve).await?;
    browser
        .wait("#messages li[data-kind='approve']", WAIT)
        .await?;
    let inbox = get(api, key, &format!("/v1/tasks/{gated}/messages")).await;
    assert_eq!(inbox["messages"][0]["kind"], "approve");
    run_to_end(store.clone(), gated).await;
    let continued = store.task(gated).await?;
    assert_eq!(
        continued.version, 2,
        "the approved action ran and the task went on"
    );
    browser
        .wait("#timeline tr.step[data-step='2']", WAIT)
        .await?;
    browser
        .wait_script(
            "the steps count after the approval",
            "return document.querySelector('#task-steps').textContent === '2'",
            WAIT,
        )
        .await?;
    browser
        .wait_script(
            "the approval shown as delivered",
            "const m = document.querySelector(\"#messages li[data-kind='approve']\"); return m && m.textContent.includes('delivered at step 2')",
            WAIT,
        )
        .await?;

    // Send a message; it waits in the inbox until a worker delivers it.
    let message = browser.wait("#message-text", WAIT).await?;
    browser
        .type_into(&message, "Shelf 7 is blocked today <b>really</b>")
        .await?;
    let send = browser.wait("#send-message", WAIT).await?;
    browser.click(&send).await?;
    let sent = browser
        .wait("#messages li[data-kind='message']", WAIT)
        .await?;
    assert!(
        browser
            .text(&sent)
            .await?
            .contains("Shelf 7 is blocked today <b>really</b>")
    );
    let inbox = get(api, key, &format!("/v1/tasks/{gated}/messages")).await;
    assert_eq!(inbox["messages"][1]["kind"], "message");
    assert_eq!(
        inbox["messages"][1]["text"],
        "Shelf 7 is blocked today <b>really</b>"
    );

    // The bench page: the CLI report's table, cell for cell, and its chart.
    browser.goto(&format!("{}/#/bench", api.base)).await?;
    browser.wait("#bench-table", WAIT).await?;
    let cells = browser
        .script(
            "return [...document.querySelectorAll('#bench-table tr')].map(r => [...r.children].map(c => c.textContent))",
            json!([]),
        )
        .await?;
    let cells: Vec<Vec<String>> = serde_json::from_value(cells)?;
    assert_eq!(cells, table_cells(report));
    let horizon = *report.config.horizons.iter().max().unwrap();
    for strategy in &report.config.strategies {
        let expected = report
            .runs
            .iter()
            .filter(|r| r.completed() && r.spec.horizon == horizon && r.spec.strategy == *strategy)
            .map(|r| r.prompt_tokens_per_step.len())
            .min()
            .unwrap_or(0);
        assert!(expected > 0, "{} completed", strategy.as_str());
        let line = browser
            .wait(
                &format!(
                    "#bench-chart polyline.series[data-name='{}']",
                    strategy.as_str()
                ),
                WAIT,
            )
            .await?;
        assert_eq!(
            browser.attribute(&line, "data-points").await?,
            Some(expected.to_string()),
            "{}",
            strategy.as_str()
        );
    }
    browser.set_window(1400, 1250).await?;
    browser.screenshot(&shots.join("bench-page.png")).await?;
    browser.set_window(1400, 1000).await?;
    // A results.json opened in the page (read by the browser) shows the same table.
    let local = tempfile::tempdir()?;
    let mut shrunk = report.clone();
    shrunk.config.horizons.retain(|&h| h == horizon);
    shrunk.groups.retain(|g| g.horizon == horizon);
    let path = local.path().join("results.json");
    std::fs::write(&path, serde_json::to_vec(&shrunk)?)?;
    let picker = browser.wait("#bench-file", WAIT).await?;
    browser.type_into(&picker, path.to_str().unwrap()).await?;
    browser
        .wait_script(
            "the opened results.json",
            "const p = document.querySelector('#bench p.muted'); return p && p.textContent === 'From results.json.'",
            WAIT,
        )
        .await?;
    let cells = browser
        .script(
            "return [...document.querySelectorAll('#bench-table tr')].map(r => [...r.children].map(c => c.textContent))",
            json!([]),
        )
        .await?;
    let cells: Vec<Vec<String>> = serde_json::from_value(cells)?;
    assert_eq!(cells, table_cells(&shrunk));
    assert_eq!(cells.len(), 2, "the header and the one horizon kept");

    // Batches: the list links to the batch page; its status counts are the API's; the
    // throughput chart counts the finished tasks; the batch's tasks are one click away.
    let batch = tasks.batch;
    browser.goto(&format!("{}/#/batches", api.base)).await?;
    let link = browser
        .wait(
            &format!("#batch-table tr[data-batch='{batch}'] a.batch-link"),
            WAIT,
        )
        .await?;
    browser.click(&link).await?;
    browser
        .wait("#batch-chart-svg polyline.series", WAIT)
        .await?;
    let view = get(api, key, &format!("/v1/batches/{batch}")).await;
    let shown = browser
        .script(
            "return Object.fromEntries([...document.querySelectorAll('#batch-counts tr[data-status]')].map(r => [r.dataset.status, Number(r.querySelector('.count').textContent)]))",
            json!([]),
        )
        .await?;
    let shown = shown.as_object().unwrap();
    let counts = view["counts"].as_object().unwrap();
    assert_eq!(shown.len(), counts.len(), "{shown:?} {counts:?}");
    for (name, tasks) in counts {
        assert_eq!(shown.get(name), Some(tasks), "{name}: {shown:?}");
    }
    assert_eq!(view["counts"]["completed"], 2);
    assert_eq!(view["counts"]["queued"], 1);
    let chart = browser.wait("#batch-chart > div", WAIT).await?;
    assert_eq!(
        browser.attribute(&chart, "data-finished").await?,
        Some("2".to_owned())
    );
    browser.screenshot(&shots.join("batch-page.png")).await?;
    let listed = browser.wait("#batch-tasks", WAIT).await?;
    browser.click(&listed).await?;
    browser
        .wait_script(
            "the batch's tasks",
            "return document.querySelector('#batch-filter') !== null && document.querySelectorAll('#task-table tr[data-task]').length === 3",
            WAIT,
        )
        .await?;

    // No script error, failed request or policy violation on any page.
    let console = browser.console().await?;
    let severe: Vec<&(String, String)> = console
        .iter()
        .filter(|(level, message)| level == "SEVERE" || message.contains("Content Security Policy"))
        .collect();
    assert!(severe.is_empty(), "{severe:#?}");
    Ok(())
}

/// Boards in the browser, with the local key of `skillstate view`: a board of no tenant written
/// by two agents (tasks of no tenant, run by the runtime as the CLI runs them), opened from a
/// link that carries the key in its fragment — no key typed. The boards list, the board's
/// writes as a timeline with diffs and authors, its members, the version slider against the
/// API's state at that version, and a new write showing up live (rebased, as the API made it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boards_in_a_real_browser_with_the_local_key() {
    let driver = Driver::start().await.unwrap();
    let harness = Harness::new(Db::sqlite().await).await;
    let store = harness.store();
    // Two agents of three writes each on one board (the board benchmark's team, small).
    let team = skillstate_bench::board::run_board_bench(store.clone(), "sqlite", 2, 3)
        .await
        .unwrap();
    assert_eq!((team.completed, team.board_writes), (2, 6));
    let boards = store.list_boards(None).await.unwrap();
    let board = boards[0].clone();
    let members = store.board_members(&board.id).await.unwrap();
    assert_eq!(members.len(), 2);
    let local = skillstate_server::new_key_secret();
    let api = Socket::start(harness.state.clone().with_local_key(&local)).await;

    let browser = driver.session(1400, 1000).await.unwrap();
    let shots = screenshots();
    let result = drive_boards(&browser, &api, &local, &board.id, &members, &shots).await;
    if result.is_err() {
        let _ = browser.screenshot(&shots.join("boards-failure.png")).await;
    }
    let _ = browser.quit().await;
    api.stop().await;
    result.unwrap();
}

async fn drive_boards(
    browser: &Browser,
    api: &Socket,
    key: &str,
    board: &str,
    members: &[String],
    shots: &std::path::Path,
) -> anyhow::Result<()> {
    // The link `skillstate view` prints: the key goes to the tab's sessionStorage and out of
    // the address bar; the list shows the tasks of no tenant.
    browser.goto(&format!("{}/#key={key}", api.base)).await?;
    for task in members {
        browser
            .wait(&format!("#task-table tr[data-task='{task}']"), WAIT)
            .await?;
    }
    let address = browser.script("return location.href", json!([])).await?;
    let address = address.as_str().unwrap_or_default();
    assert!(
        !address.contains(key) && address.ends_with("/#/"),
        "{address}"
    );
    assert_eq!(
        browser
            .script("return sessionStorage.getItem('skillstate.key')", json!([]))
            .await?,
        json!(key)
    );
    assert!(browser.find("#key-input").await?.is_none());

    // The boards list: name, version, members.
    let nav = browser.wait("#nav-boards", WAIT).await?;
    browser.click(&nav).await?;
    let row = format!("#board-table tr[data-board='{board}']");
    browser.wait(&row, WAIT).await?;
    assert_eq!(browser.text_of(&format!("{row} td.version")).await?, "6");
    assert_eq!(browser.text_of(&format!("{row} td.members")).await?, "2");
    browser.screenshot(&shots.join("board-list.png")).await?;
    let link = browser.wait(&format!("{row} a.board-link"), WAIT).await?;
    browser.click(&link).await?;

    // The writes: one row per version, each with its author's task and a diff.
    browser
        .wait("#board-writes tr.write[data-version='6']", WAIT)
        .await?;
    assert_eq!(browser.find_all("#board-writes tr.write").await?.len(), 6);
    let journal = get(api, key, &format!("/v1/boards/{board}/writes")).await;
    for write in journal["writes"].as_array().unwrap() {
        let version = write["version"].as_u64().unwrap();
        let task = write["author"]["task"].as_str().unwrap();
        assert!(members.iter().any(|m| m == task));
        let author = browser
            .wait(
                &format!("#board-writes tr.write[data-version='{version}'] a.author-task"),
                WAIT,
            )
            .await?;
        let href = browser
            .attribute(&author, "href")
            .await?
            .unwrap_or_default();
        assert!(href.contains(&format!("#/tasks/{task}")), "{href}");
        // The agent's count goes up by one: a changed value at its pointer.
        let (agent, count) = write["patch"]["agents"]
            .as_object()
            .and_then(|m| m.iter().next())
            .map(|(k, v)| (k.clone(), v["count"].clone()))
            .unwrap();
        let change = browser
            .text_of(&format!(
                "#board-writes tr.write[data-version='{version}'] li.changed[data-pointer='/agents/{agent}/count']"
            ))
            .await?;
        assert!(change.ends_with(&format!("→ {count}")), "{change}");
    }
    for task in members {
        browser
            .wait(
                &format!("#board-members li[data-task='{task}'] a.member-link"),
                WAIT,
            )
            .await?;
    }

    // The slider, by keyboard: Home, then three versions right; the state shown is the API's.
    let slider = browser.wait("#board-slider", WAIT).await?;
    browser.click(&slider).await?;
    browser.type_into(&slider, keys::HOME).await?;
    for _ in 0..3 {
        browser.type_into(&slider, keys::RIGHT).await?;
    }
    browser
        .wait_script(
            "the board at version 3",
            "return document.querySelector('#board-state').dataset.version === '3' && document.querySelector('#board-state-raw').textContent",
            WAIT,
        )
        .await?;
    let shown: Value = serde_json::from_str(
        browser
            .script(
                "return document.querySelector('#board-state-raw').textContent",
                json!([]),
            )
            .await?
            .as_str()
            .unwrap_or_default(),
    )?;
    let at_three = get(api, key, &format!("/v1/boards/{board}/writes/3/state")).await;
    assert_eq!(shown, at_three, "the state shown at version 3");
    assert_ne!(
        at_three,
        get(api, key, &format!("/v1/boards/{board}/state")).await
    );
    browser.set_window(1400, 1100).await?;
    browser.script("window.scrollTo(0, 0)", json!([])).await?;
    browser.screenshot(&shots.join("board-page.png")).await?;

    // Live: a write computed on version 2 arrives (rebased onto 6 by the API) and shows up
    // without a reload, with its diff; the slider's range grows.
    let written = api
        .send(
            Call::new(
                axum::http::Method::PATCH,
                format!("/v1/boards/{board}/state"),
            )
            .key(key)
            .header("if-match", "\"2\"")
            .raw(
                "application/merge-patch+json",
                br#"{"agents": {"a9": {"count": 1}}}"#.to_vec(),
            ),
        )
        .await;
    written.expect(200);
    assert_eq!(written.header("etag"), Some("\"7\""));
    let fresh = "#board-writes tr.write[data-version='7']";
    browser.wait(fresh, WAIT).await?;
    assert_eq!(
        browser.text_of(&format!("{fresh} td.rebased")).await?,
        "rebased from 2"
    );
    browser
        .wait(
            &format!("{fresh} li.added[data-pointer='/agents/a9']"),
            WAIT,
        )
        .await?;
    assert_eq!(
        browser.text_of(&format!("{fresh} td.author")).await?,
        format!("API key {}", skillstate_server::LOCAL_KEY_ID)
    );
    browser
        .wait_script(
            "the slider up to version 7",
            "return document.querySelector('#board-slider').max === '7' && document.querySelector('#board-version-now').textContent === '7'",
            WAIT,
        )
        .await?;

    // A JSON Patch write (RFC 6902): its diff replays the operations on the state before it.
    let written = api
        .send(
            Call::new(
                axum::http::Method::PATCH,
                format!("/v1/boards/{board}/state"),
            )
            .key(key)
            .header("if-match", "\"7\"")
            .raw(
                "application/json-patch+json",
                br#"[{"op": "replace", "path": "/agents/a0/count", "value": 10}, {"op": "remove", "path": "/agents/a9"}]"#.to_vec(),
            ),
        )
        .await;
    written.expect(200);
    let patched = "#board-writes tr.write[data-version='8']";
    let changed = browser
        .wait(
            &format!("{patched} li.changed[data-pointer='/agents/a0/count']"),
            WAIT,
        )
        .await?;
    assert!(browser.text(&changed).await?.ends_with("3 → 10"));
    browser
        .wait(
            &format!("{patched} li.removed[data-pointer='/agents/a9']"),
            WAIT,
        )
        .await?;
    assert_eq!(
        browser
            .find_all(&format!("{patched} ul.diff li"))
            .await?
            .len(),
        2
    );

    // An author opens its task's page.
    let author = browser
        .wait(
            "#board-writes tr.write[data-version='1'] a.author-task",
            WAIT,
        )
        .await?;
    browser.click(&author).await?;
    let id = browser.wait("#task-id", WAIT).await?;
    let first = journal["writes"][0]["author"]["task"].as_str().unwrap();
    assert_eq!(browser.text(&id).await?, first);

    let console = browser.console().await?;
    let severe: Vec<&(String, String)> = console
        .iter()
        .filter(|(level, message)| level == "SEVERE" || message.contains("Content Security Policy"))
        .collect();
    assert!(severe.is_empty(), "{severe:#?}");
    Ok(())
}
