//! A key limited to board pointers receives nothing outside its reads, whatever the board's
//! schema: random schemas with root-level and cross-member keywords, random scopes and writes
//! (test-support/board_cases.rs). The key writes (at the current version and at a stale one,
//! so 422s and 412s happen) while another writer changes — and breaks — the parts it does not
//! read; every answer it gets (writes, the board with its schema, the state now and at every
//! version, the listing) holds no hidden member name, no hidden value and no write-only value.
//! Through the router for random cases, and over a real socket for a few.
#![allow(clippy::unwrap_used)]

mod support;

#[path = "../../../test-support/board_cases.rs"]
mod board_cases;

use axum::http::Method;
use board_cases::BoardCase;
use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::StatePatch;
use skillstate_server::{hash_secret, new_key_secret};
use skillstate_store::{BoardAuthor, BoardWrite, NewKey};
use support::*;

fn patch(path: &str, key: &str, if_match: &str, body: &Value) -> Call {
    Call::new(Method::PATCH, path)
        .key(key)
        .raw(
            "application/merge-patch+json",
            serde_json::to_vec(body).unwrap(),
        )
        .header("if-match", if_match)
}

/// Every answer the limited key of `case` gets, as text (status, then body).
async fn answers_to_the_limited_key(
    harness: &Harness,
    api: &dyn Transport,
    case: &BoardCase,
) -> Vec<String> {
    let (admin, _) = harness.key("acme").await;
    let secret = new_key_secret();
    harness
        .store()
        .create_key(&NewKey {
            tenant: "acme".into(),
            label: "limited".into(),
            secret_hash: hash_secret(&secret),
            scopes: Some(json!({"board": {"reads": case.reads, "writes": case.writes}})),
        })
        .await
        .unwrap();
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "random", "schema": case.schema, "initial_state": case.initial}),
            )
            .key(&admin),
        )
        .await;
    created.expect(201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let base = format!("/v1/boards/{id}");
    let mut out = Vec::new();
    let mut record = |reply: &Reply| {
        out.push(format!(
            "{} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        ))
    };
    for (n, attempt) in case.attempts.iter().enumerate() {
        // The other writer, straight to the store: it may break the board's schema in parts
        // the limited key does not read.
        if let Some(other) = case.others.get(n) {
            let board = harness.store().board(&id, None).await.unwrap();
            let new_state = StatePatch::from_value(other)
                .unwrap()
                .apply(&board.state)
                .unwrap();
            harness
                .store()
                .commit_board_write(
                    &id,
                    board.version,
                    &BoardWrite {
                        patch: other.clone(),
                        state_hash: skillstate_core::json::state_hash(&new_state),
                        new_state,
                        author: BoardAuthor::Cli,
                        rebased_from: None,
                    },
                )
                .await
                .unwrap();
        }
        let now = api
            .send(Call::get(format!("{base}/state")).key(&secret))
            .await;
        record(&now);
        let current = now.header("etag").unwrap().to_owned();
        // Even attempts at the version just read, odd ones at version 0 (rebased or 412).
        let tag = if n % 2 == 0 {
            current
        } else {
            "\"0\"".to_owned()
        };
        let written = api
            .send(patch(&format!("{base}/state"), &secret, &tag, attempt))
            .await;
        assert!(
            [200, 412, 422].contains(&written.status.as_u16()),
            "{} {}",
            written.status,
            String::from_utf8_lossy(&written.body)
        );
        record(&written);
    }
    let board = api.send(Call::get(&base).key(&secret)).await;
    board.expect(200);
    record(&board);
    let version = board.json()["version"].as_u64().unwrap();
    for at in 0..=version {
        let past = api
            .send(Call::get(format!("{base}/writes/{at}/state")).key(&secret))
            .await;
        past.expect(200);
        record(&past);
    }
    record(&api.send(Call::get("/v1/boards").key(&secret)).await);
    let journal = api
        .send(Call::get(format!("{base}/writes")).key(&secret))
        .await;
    journal.expect(403);
    record(&journal);
    out
}

fn check(case: &BoardCase, answers: &[String]) -> Result<(), TestCaseError> {
    let hidden = case.hidden(true);
    prop_assert!(!hidden.is_empty());
    for answer in answers {
        let leaks = BoardCase::leaks(&hidden, answer);
        prop_assert!(
            leaks.is_empty(),
            "{leaks:?} in the answer {answer}\ncase: {case:#?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_limited_key_receives_nothing_outside_its_reads(seed in any::<u64>()) {
        let case = BoardCase::generate(seed);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let answers = runtime.block_on(async {
            let harness = Harness::new(Db::sqlite().await).await;
            let transport = InProcess(harness.router());
            answers_to_the_limited_key(&harness, &transport, &case).await
        });
        check(&case, &answers)?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_key_receives_nothing_outside_its_reads_over_a_socket() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    for seed in [1_u64, 7, 42, 1234, 99_999] {
        let case = BoardCase::generate(seed);
        let answers = answers_to_the_limited_key(&harness, &socket, &case).await;
        check(&case, &answers).unwrap();
        // Each case's board, so the next may take its name.
        let board = harness.store().board("random", Some("acme")).await.unwrap();
        harness.store().delete_board(&board.id).await.unwrap();
    }
    // The OpenAPI document says what a limited key is shown of the schema.
    let document = socket.send(Call::get("/openapi.json")).await.json();
    let described =
        document["components"]["schemas"]["BoardView"]["properties"]["schema"]["description"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(described.contains("projected to"), "{described}");
    socket.stop().await;
}

/// The example over HTTP: a key limited to `/pub` (and `/extra`, which it writes)
/// meets a root `maxProperties`; the 422 names the root as a rule about a part it cannot read,
/// and `GET /v1/boards/{id}` shows a schema without the vault.
#[tokio::test]
async fn a_root_constraint_refusal_and_the_schema_show_a_limited_key_nothing_of_the_vault() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let case = BoardCase {
        schema: json!({
            "type": "object",
            "maxProperties": 2,
            "required": ["pub", "vault"],
            "properties": {"pub": {"type": "object"}, "vault": {"type": "object", "properties": {"pin": {"type": "string"}}}}
        }),
        initial: json!({"pub": {"note": "hello"}, "vault": {"pin": "4242-secret"}}),
        reads: vec!["/pub".into(), "/extra".into()],
        writes: vec!["/extra".into()],
        attempts: vec![json!({"extra": "x"})],
        others: Vec::new(),
    };
    let answers = answers_to_the_limited_key(&harness, &api, &case).await;
    let refused: Value = answers
        .iter()
        .find_map(|a| a.strip_prefix("422 Unprocessable Entity "))
        .map(|body| serde_json::from_str(body).unwrap())
        .unwrap();
    assert_eq!(refused["errors"][0]["pointer"], "");
    assert!(
        refused["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("a part you cannot read"),
        "{refused}"
    );
    let board: Value = answers
        .iter()
        .find_map(|a| {
            a.strip_prefix("200 OK ")
                .filter(|b| b.contains("\"schema\""))
        })
        .map(|body| serde_json::from_str(body).unwrap())
        .unwrap();
    assert_eq!(
        board["schema"],
        json!({"type": "object", "required": ["pub"], "properties": {"pub": {"type": "object"}}})
    );
    for answer in &answers {
        assert!(
            !answer.contains("vault") && !answer.contains("4242"),
            "{answer}"
        );
    }
}
