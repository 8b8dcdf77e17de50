//! The web viewer's journal search and provenance panel, in a real headless Chromium driven
//! over WebDriver (Debian's `chromium` and `chromium-driver`; scripts/test installs them): a
//! real server on 127.0.0.1 over a SQLite file, a warehouse run (the oracle) and a state write
//! through the API. A person types words into the task page's search box, opens a hit's step,
//! and clicks values of the state tree to see who wrote them; what the page shows is compared
//! with what the API answers. Screenshots go to target/viewer-screenshots/.
#![allow(clippy::unwrap_used)]

mod support;
mod viewer_webdriver;

use axum::http::Method;
use serde_json::{Value, json};
use support::*;
use viewer_webdriver::{Browser, Driver, WAIT, keys, screenshots};

async fn get(api: &Socket, key: &str, path: &str) -> Value {
    api.send(Call::get(path).key(key)).await.expect(200).json()
}

/// A word of `text` with a digit in it (an order, an item, a shelf), as written.
fn numbered_word(text: &str) -> String {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .find(|w| w.len() >= 3 && w.chars().any(|c| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no numbered word in {text}"))
        .to_owned()
}

/// What the task page was shown: its id, the key's id, a word of one step's observation,
/// the location and step of a value the model wrote, and the step the API wrote.
struct Seen {
    id: String,
    key_id: String,
    word: String,
    word_step: u64,
    model_pointer: String,
    model_step: u64,
    api_step: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_and_provenance_in_a_real_browser() {
    // The browser first: without Chromium this fails at once, naming the install command.
    let driver = Driver::start().await.unwrap();
    let harness = Harness::new(Db::sqlite().await).await;
    let (key, key_id) = harness.key("acme").await;
    let api = Socket::start(harness.state.clone()).await;

    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 7, "events": 12}}),
            )
            .key(&key),
        )
        .await;
    let id = created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    run_to_end(harness.store(), &id).await;
    let version = get(&api, &key, &format!("/v1/tasks/{id}")).await["version"]
        .as_u64()
        .unwrap();
    let word_step = version / 2;
    let detail = get(&api, &key, &format!("/v1/tasks/{id}/steps/{word_step}")).await;
    let word = numbered_word(detail["observation"].as_str().unwrap());
    // A value the model wrote that is still there, and the newest write at it the search finds.
    let state = get(&api, &key, &format!("/v1/tasks/{id}/state")).await;
    let shelf = state["inventory"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap_or_else(|| panic!("the run left no shelf filled: {state}"))
        .clone();
    let writes = get(
        &api,
        &key,
        &format!("/v1/tasks/{id}/journal?pointer=/inventory/{shelf}&limit=1"),
    )
    .await;
    let newest = writes["hits"][0].clone();
    assert_eq!(newest["pointer"], format!("/inventory/{shelf}"), "{writes}");
    let written = api
        .send(
            Call::new(Method::PATCH, format!("/v1/tasks/{id}/state"))
                .key(&key)
                .header("if-match", &format!("\"{version}\""))
                .raw(
                    "application/merge-patch+json",
                    serde_json::to_vec(&json!({"inventory": {"shelf_498": "item_4242"}})).unwrap(),
                ),
        )
        .await;
    written.expect(200);
    let seen = Seen {
        id: id.clone(),
        key_id,
        word,
        word_step,
        model_pointer: newest["pointer"].as_str().unwrap().to_owned(),
        model_step: newest["step"].as_u64().unwrap(),
        api_step: version + 1,
    };

    let browser = driver.session(1400, 1000).await.unwrap();
    let shots = screenshots();
    let result = drive(&browser, &api, &key, &seen, &shots).await;
    if result.is_err() {
        let _ = browser.screenshot(&shots.join("search-failure.png")).await;
    }
    let _ = browser.quit().await;
    api.stop().await;
    harness.db.destroy().await;
    result.unwrap();
}

async fn drive(
    browser: &Browser,
    api: &Socket,
    key: &str,
    seen: &Seen,
    shots: &std::path::Path,
) -> anyhow::Result<()> {
    let id = &seen.id;
    // The link `skillstate view` prints carries the key in the fragment.
    browser.goto(&format!("{}/#key={key}", api.base)).await?;
    browser.wait("#task-table", WAIT).await?;
    browser.goto(&format!("{}/#/tasks/{id}", api.base)).await?;
    let input = browser.wait("#journal-q", WAIT).await?;
    browser.wait("#state-tree a.prov", WAIT).await?;

    // Words typed into the search box: the hits the API finds, newest first, with steps.
    browser.type_into(&input, &seen.word).await?;
    browser.type_into(&input, keys::ENTER).await?;
    browser
        .wait(
            &format!(
                "#journal-hits li.hit[data-step='{}'][data-kind='observation']",
                seen.word_step
            ),
            WAIT,
        )
        .await?;
    let answer = get(
        api,
        key,
        &format!("/v1/tasks/{id}/journal?q={}&limit=20", seen.word),
    )
    .await;
    let expected: Vec<Value> = answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| json!([h["step"], h["kind"]]))
        .collect();
    let shown = browser
        .script(
            "return [...document.querySelectorAll('#journal-hits li.hit')].map((li) => [Number(li.dataset.step), li.dataset.kind])",
            json!([]),
        )
        .await?;
    assert_eq!(shown, Value::Array(expected.clone()));
    let status = browser.text_of("#journal-status").await?;
    assert!(
        status.starts_with(&format!("{} hit", expected.len())),
        "{status}"
    );
    // The words are marked in each hit, as text.
    let marked = browser
        .script(
            "return [...document.querySelectorAll('#journal-hits mark')].map((m) => m.textContent.toLowerCase())",
            json!([]),
        )
        .await?;
    let tokens: Vec<String> = seen
        .word
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect();
    let marked: Vec<String> = serde_json::from_value(marked)?;
    assert!(!marked.is_empty());
    assert!(marked.iter().all(|m| tokens.contains(m)), "{marked:?}");
    // The search stays in the address.
    let hash = browser.script("return location.hash", json!([])).await?;
    assert!(
        hash.as_str().unwrap().contains(&format!("q={}", seen.word)),
        "{hash}"
    );
    browser.screenshot(&shots.join("search.png")).await?;

    // A hit's step opens above the timeline, as the API shows it.
    let link = browser
        .wait(
            &format!(
                "#journal-hits li.hit[data-step='{}'][data-kind='observation'] a.step-link",
                seen.word_step
            ),
            WAIT,
        )
        .await?;
    browser.click(&link).await?;
    let opened = browser
        .wait(
            &format!(
                "#step-alone .step-detail[data-step='{}'] pre.observation",
                seen.word_step
            ),
            WAIT,
        )
        .await?;
    let detail = get(
        api,
        key,
        &format!("/v1/tasks/{id}/steps/{}", seen.word_step),
    )
    .await;
    let shown = browser.text(&opened).await?;
    assert_eq!(shown.trim(), detail["observation"].as_str().unwrap().trim());

    // Words nothing has: said so.
    let input = browser.wait("#journal-q", WAIT).await?;
    browser
        .script("document.getElementById('journal-q').value = ''", json!([]))
        .await?;
    browser.type_into(&input, "zebra_0000001").await?;
    browser.type_into(&input, keys::ENTER).await?;
    browser
        .wait_script(
            "the empty search",
            "return document.getElementById('journal-status').textContent.startsWith('No hits')",
            WAIT,
        )
        .await?;
    assert!(browser.find_all("#journal-hits li").await?.is_empty());

    // The value the API wrote: by the key, at its step.
    let value = browser
        .wait(
            "#state-tree a.prov[data-pointer='/inventory/shelf_498']",
            WAIT,
        )
        .await?;
    assert_eq!(browser.text(&value).await?, "\"item_4242\"");
    browser.click(&value).await?;
    let write = browser
        .wait(
            &format!("#provenance-writes li.write[data-step='{}']", seen.api_step),
            WAIT,
        )
        .await?;
    let text = browser.text(&write).await?;
    assert!(
        text.contains(&format!("API key {}", seen.key_id)) && text.contains("\"item_4242\""),
        "{text}"
    );
    assert_eq!(
        browser.text_of("#provenance-pointer").await?,
        "/inventory/shelf_498"
    );
    assert_eq!(
        browser.text_of("#provenance-current").await?,
        "\"item_4242\""
    );

    // A value the model wrote: by the model, at the step the API names.
    let selector = format!("#state-tree a.prov[data-pointer='{}']", seen.model_pointer);
    let value = browser.wait(&selector, WAIT).await?;
    browser.click(&value).await?;
    browser
        .wait_script(
            "the model's write",
            &format!(
                "return document.getElementById('provenance-pointer')?.textContent === '{}' && document.querySelector('#provenance-writes li.write')",
                seen.model_pointer
            ),
            WAIT,
        )
        .await?;
    let answer = get(
        api,
        key,
        &format!(
            "/v1/tasks/{id}/state/provenance?pointer={}",
            seen.model_pointer
        ),
    )
    .await;
    let steps_shown = browser
        .script(
            "return [...document.querySelectorAll('#provenance-writes li.write')].map((li) => Number(li.dataset.step))",
            json!([]),
        )
        .await?;
    let steps: Vec<Value> = answer["writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["step"].clone())
        .collect();
    assert_eq!(steps_shown, Value::Array(steps));
    assert_eq!(answer["writes"][0]["step"], seen.model_step);
    let first = browser.text_of("#provenance-writes li.write").await?;
    assert!(first.contains("the model oracle"), "{first}");
    // Every earlier write too, on request: what the API lists with all=true.
    let all = browser.wait("#provenance-all", WAIT).await?;
    browser.click(&all).await?;
    browser
        .wait_script(
            "every write",
            "return document.getElementById('provenance-writes') && !document.getElementById('provenance-all')",
            WAIT,
        )
        .await?;
    let every = get(
        api,
        key,
        &format!(
            "/v1/tasks/{id}/state/provenance?pointer={}&all=true",
            seen.model_pointer
        ),
    )
    .await;
    let shown = browser.find_all("#provenance-writes li.write").await?.len();
    assert_eq!(shown, every["writes"].as_array().unwrap().len());
    browser.screenshot(&shots.join("provenance.png")).await?;

    // The page logged no error on the way.
    for (level, message) in browser.console().await? {
        assert_ne!(level, "SEVERE", "{message}");
    }
    Ok(())
}
