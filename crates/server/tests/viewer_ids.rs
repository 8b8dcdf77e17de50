//! Task ids and actions in the web viewer, in a real headless Chromium driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`; scripts/test installs them), against a real
//! server on 127.0.0.1 over a SQLite file:
//!
//! - the task list's "Open" box takes the start of an id, as every CLI command does: a prefix
//!   one task of the caller's tenant begins with opens it (another tenant's tasks that begin
//!   with it too make no difference), a prefix several begin with lists them, one none begins
//!   with says so;
//! - the timeline's Action column reads as `skillstate show` prints an action
//!   (`Action::summary`), and a narrow window wraps it between words, never inside an id.
//!
//! Screenshots go to target/viewer-screenshots/.
#![allow(clippy::unwrap_used)]

mod support;
mod viewer_webdriver;

use serde_json::{Value, json};
use skillstate_core::Action;
use support::*;
use viewer_webdriver::{Browser, Driver, WAIT, keys, screenshots};

async fn create(api: &Socket, key: &str, seed: u64) -> String {
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": seed, "events": 12}}),
            )
            .key(key),
        )
        .await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn common(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

fn beginning<'a>(ids: &'a [String], prefix: &str) -> Vec<&'a String> {
    ids.iter().filter(|id| id.starts_with(prefix)).collect()
}

/// The shortest start of one of `ours` that no other of `ours` begins with but one of
/// `theirs` does, and that id.
fn ours_alone_though_shared(ours: &[String], theirs: &[String]) -> Option<(String, String)> {
    (1..=36).find_map(|length| {
        ours.iter().find_map(|id| {
            let prefix = &id[..length];
            (beginning(ours, prefix).len() == 1 && !beginning(theirs, prefix).is_empty())
                .then(|| (prefix.to_owned(), id.clone()))
        })
    })
}

/// Types `text` into the task list's box and submits it.
async fn open_by(browser: &Browser, base: &str, text: &str) -> anyhow::Result<()> {
    browser.goto(&format!("{base}/#/")).await?;
    let input = browser.wait("#search-id", WAIT).await?;
    browser.wait("#task-table tbody tr", WAIT).await?;
    // The same address again leaves the page as it was: what was typed before goes.
    browser
        .script("document.getElementById('search-id').value = ''", json!([]))
        .await?;
    browser.type_into(&input, text).await?;
    browser.type_into(&input, keys::ENTER).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_of_an_id_opens_lists_or_finds_none_of_the_callers_tasks() {
    // The browser first: without Chromium this fails at once, naming the install command.
    let driver = Driver::start().await.unwrap();
    let harness = Harness::new(Db::sqlite().await).await;
    let (acme, _) = harness.key("acme").await;
    let (other, _) = harness.key("other").await;
    let api = Socket::start(harness.state.clone()).await;

    // One task of each tenant in turn: ids grow with time, so starts of ours begin theirs too.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut alone = None;
    for round in 0..12 {
        ours.push(create(&api, &acme, round).await);
        theirs.push(create(&api, &other, round).await);
        if ours.len() >= 3 {
            alone = ours_alone_though_shared(&ours, &theirs);
            if alone.is_some() {
                break;
            }
        }
    }
    let (unique, unique_id) = alone.unwrap_or_else(|| {
        panic!("no start of one of {ours:?} is shared with one of {theirs:?} alone")
    });
    // What every task begins with, of both tenants.
    let every: Vec<String> = ours.iter().chain(&theirs).cloned().collect();
    let shared_length = every.iter().map(|id| common(id, &every[0])).min().unwrap();
    assert!(shared_length >= 1, "{every:?}");
    let shared = every[0][..shared_length].to_owned();
    assert_eq!(beginning(&theirs, &shared).len(), theirs.len());
    // A start of one of theirs that none of ours begins with.
    let last = theirs.last().unwrap();
    let length = ours.iter().map(|id| common(id, last)).max().unwrap() + 1;
    let theirs_alone = last[..length].to_owned();
    assert!(beginning(&ours, &theirs_alone).is_empty());

    let browser = driver.session(1400, 1000).await.unwrap();
    let result = async {
        let base = &api.base;
        browser.goto(&format!("{base}/#key={acme}")).await?;
        browser.wait("#task-table", WAIT).await?;

        // A start only one of ours has opens it, typed in capitals with spaces around.
        open_by(&browser, base, &format!("  {}  ", unique.to_uppercase())).await?;
        browser
            .wait_script(
                "the task the prefix names",
                &format!(
                    "return document.getElementById('task-id')?.textContent === '{unique_id}'"
                ),
                WAIT,
            )
            .await?;
        let hash = browser.script("return location.hash", json!([])).await?;
        assert_eq!(hash, json!(format!("#/tasks/{unique_id}")));

        // A start every task has: ours listed, newest first, theirs not.
        open_by(&browser, base, &shared).await?;
        browser.wait("#search-matches li", WAIT).await?;
        let listed = browser
            .script(
                "return [...document.querySelectorAll('#search-matches li')].map((li) => li.dataset.task)",
                json!([]),
            )
            .await?;
        let mut expected = ours.clone();
        expected.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(listed, json!(expected));
        let said = browser.text_of("#search-found").await?;
        assert!(
            said.starts_with(&format!("{} tasks begin with {shared};", ours.len())),
            "{said}"
        );
        browser
            .screenshot(&screenshots().join("id-prefix-matches.png"))
            .await?;
        // One of them opens from the list.
        let link = browser
            .wait(
                &format!("#search-matches li[data-task='{}'] a", ours[0]),
                WAIT,
            )
            .await?;
        browser.click(&link).await?;
        browser
            .wait_script(
                "the task picked from the list",
                &format!("return document.getElementById('task-id')?.textContent === '{}'", ours[0]),
                WAIT,
            )
            .await?;

        // A start only theirs have, and one of their ids whole: nothing of ours.
        for typed in [theirs_alone.as_str(), last.as_str()] {
            open_by(&browser, base, typed).await?;
            browser
                .wait_script(
                    "no task",
                    &format!(
                        "return document.getElementById('search-found').textContent === 'No task begins with {typed}.'"
                    ),
                    WAIT,
                )
                .await?;
            assert!(browser.find_all("#search-matches li").await?.is_empty());
        }

        // What cannot begin an id is said so, without asking the server.
        open_by(&browser, base, "shelf_12").await?;
        browser
            .wait_script(
                "not an id",
                "return document.getElementById('search-found').textContent.includes('is not a task id or the start of one')",
                WAIT,
            )
            .await?;

        // The page logged no error on the way (a refused request is one).
        for (level, message) in browser.console().await? {
            assert_ne!(level, "SEVERE", "{message}");
        }
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = browser
            .screenshot(&screenshots().join("id-prefix-failure.png"))
            .await;
    }
    let _ = browser.quit().await;
    api.stop().await;
    harness.db.destroy().await;
    result.unwrap();
}

/// For each id-like word (`item_4298`, `shelf_12`) of every Action cell: the number of lines
/// it is shown on; and the most lines any cell takes.
const MEASURE: &str = r#"
const words = [];
let lines = 0;
const tops = (range) => new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
for (const cell of document.querySelectorAll('#timeline tr.step td.action')) {
  const whole = document.createRange();
  whole.selectNodeContents(cell);
  lines = Math.max(lines, tops(whole).size);
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const match of node.data.matchAll(/[a-z]+_[0-9]+/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      words.push([match[0], tops(range).size]);
    }
  }
}
return { words, lines };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_column_reads_as_the_cli_and_never_breaks_an_id() {
    let driver = Driver::start().await.unwrap();
    let harness = Harness::new(Db::sqlite().await).await;
    let (key, _) = harness.key("acme").await;
    let api = Socket::start(harness.state.clone()).await;
    let id = create(&api, &key, 7).await;
    run_to_end(harness.store(), &id).await;
    let steps = api
        .send(Call::get(format!("/v1/tasks/{id}/steps?limit=100")).key(&key))
        .await
        .expect(200)
        .json();
    // `skillstate show`'s ACTION column: core's summary of the journal's `{tool, args}`.
    let expected: Vec<Value> = steps["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| {
            let text = match &step["action"] {
                Value::Null => String::new(),
                action => Action::from_call_json(action)
                    .map(|a| a.summary())
                    .unwrap_or_else(|| "-".into()),
            };
            json!([step["step"], text])
        })
        .collect();
    assert!(expected.len() >= 3, "{steps}");
    assert!(
        expected
            .iter()
            .any(|e| e[1].as_str().unwrap().contains(", ")),
        "no action with two arguments: {expected:?}"
    );

    // A window as narrow as a phone's: the column is squeezed.
    let browser = driver.session(480, 1000).await.unwrap();
    let result = async {
        browser.goto(&format!("{}/#key={key}", api.base)).await?;
        browser.wait("#task-table", WAIT).await?;
        browser.goto(&format!("{}/#/tasks/{id}", api.base)).await?;
        browser
            .wait("#timeline tr.step td.action .word", WAIT)
            .await?;
        let shown = browser
            .script(
                "return [...document.querySelectorAll('#timeline tr.step')].map((tr) => [Number(tr.dataset.step), tr.querySelector('td.action').textContent])",
                json!([]),
            )
            .await?;
        assert_eq!(shown, Value::Array(expected.clone()));
        // What a person sees (WebDriver's rendered text) is the same text.
        let first = expected.iter().find(|e| e[1] != "").unwrap();
        let cell = browser
            .wait(
                &format!("#timeline tr.step[data-step='{}'] td.action", first[0]),
                WAIT,
            )
            .await?;
        assert_eq!(browser.text(&cell).await?, first[1].as_str().unwrap());

        let measured = browser.script(MEASURE, json!([])).await?;
        let words = measured["words"].as_array().unwrap();
        assert!(words.len() >= expected.len(), "{measured}");
        let split: Vec<&Value> = words.iter().filter(|w| w[1] != 1).collect();
        assert!(split.is_empty(), "ids shown on more than one line: {split:?}");
        // The column is narrower than its text: cells do wrap, between words.
        assert!(measured["lines"].as_u64().unwrap() >= 2, "{measured}");
        browser
            .screenshot(&screenshots().join("action-column.png"))
            .await?;

        // The measure sees a split id: with breaks allowed anywhere (the old style), some are.
        browser
            .script(
                "for (const node of document.querySelectorAll('#timeline td.action, #timeline td.action .word')) { node.style.wordBreak = 'break-all'; node.style.whiteSpace = 'normal'; }",
                json!([]),
            )
            .await?;
        let broken = browser.script(MEASURE, json!([])).await?;
        assert!(
            broken["words"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w[1].as_u64().unwrap() > 1),
            "{broken}"
        );

        for (level, message) in browser.console().await? {
            assert_ne!(level, "SEVERE", "{message}");
        }
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = browser
            .screenshot(&screenshots().join("action-column-failure.png"))
            .await;
    }
    let _ = browser.quit().await;
    api.stop().await;
    harness.db.destroy().await;
    result.unwrap();
}
