use serde_json::json;

use super::*;

fn texts(entries: &[IndexEntry]) -> Vec<(RecallKind, Option<&str>, &str)> {
    entries
        .iter()
        .map(|e| (e.kind, e.pointer.as_deref(), e.text.as_str()))
        .collect()
}

#[test]
fn a_step_is_indexed_as_reasoning_action_and_each_location_written() {
    let output = r#"{"reasoning": "Order for item_7; it sits on shelf_3.", "state_patch": {}, "action": {"tool": "ship", "args": {}}}"#;
    let patch =
        json!({"inventory": {"shelf_3": null, "shelf_9": "item_2"}, "count": 4, "seen": {}});
    let action = json!({"tool": "ship", "args": {"item": "item_7", "shelf": "shelf_3"}});
    let entries = step_entries(output, Some(&patch), Some(&action));
    assert_eq!(
        texts(&entries),
        vec![
            (
                RecallKind::Reasoning,
                None,
                "Order for item_7; it sits on shelf_3."
            ),
            (
                RecallKind::Action,
                None,
                r#"ship {"item":"item_7","shelf":"shelf_3"}"#
            ),
            (
                RecallKind::State,
                Some("/inventory/shelf_3"),
                "/inventory/shelf_3 removed"
            ),
            (
                RecallKind::State,
                Some("/inventory/shelf_9"),
                r#"/inventory/shelf_9 = "item_2""#
            ),
            (RecallKind::State, Some("/count"), "/count = 4"),
            (RecallKind::State, Some("/seen"), "/seen = {}"),
        ]
    );
}

#[test]
fn json_patch_operations_are_indexed_by_their_paths() {
    let patch = json!([
        {"op": "add", "path": "/a~1b", "value": {"x": 1}},
        {"op": "remove", "path": "/c"},
        {"op": "move", "from": "/d", "path": "/e"},
        {"op": "test", "path": "/f", "value": 1}
    ]);
    let entries = step_entries("not json", Some(&patch), None);
    assert_eq!(
        texts(&entries),
        vec![
            (RecallKind::State, Some("/a~1b/x"), "/a~1b/x = 1"),
            (RecallKind::State, Some("/c"), "/c removed"),
            (RecallKind::State, Some("/d"), "/d removed (moved to /e)"),
            (RecallKind::State, Some("/e"), "/e moved from /d"),
        ]
    );
}

#[test]
fn a_huge_patch_adds_a_bounded_number_of_entries_of_bounded_size() {
    let mut inventory = serde_json::Map::new();
    for i in 0..2000 {
        inventory.insert(format!("k{i}"), json!("v".repeat(5000)));
    }
    let patch = json!({ "inventory": inventory });
    let entries = step_entries("", Some(&patch), None);
    assert_eq!(entries.len(), MAX_STATE_ENTRIES);
    assert!(
        entries.iter().all(|e| e.text.len() <= 1100),
        "values are cut"
    );
    let output = format!(
        r#"{{"reasoning": "{}", "state_patch": {{}}, "action": {{"tool": "wait", "args": {{}}}}}}"#,
        "é".repeat(20_000)
    );
    let long = &step_entries(&output, None, None)[0];
    assert!(long.text.len() <= ENTRY_TEXT_BYTES && long.text.ends_with('…'));
}

#[test]
fn an_identifier_is_looked_up_by_its_number_and_checked_whole() {
    let q = RecallQuery::from_args(&json!({"query": "order-2026-item_4298 the item item_7"}))
        .expect("query");
    let words: Vec<Vec<&str>> = q
        .index_words()
        .iter()
        .map(|w| w.tokens().iter().map(String::as_str).collect())
        .collect();
    // The longest token with a digit (of equal lengths, the last), words of one token, and a
    // number too short to be specific (the word stays a phrase).
    assert_eq!(
        words,
        [vec!["4298"], vec!["the"], vec!["item"], vec!["item", "7"]]
    );
    assert!(matches!(q.index_words()[0], IndexWord::Anchor(_)));
    assert!(q.needs_check());
    let exact = RecallQuery::from_args(&json!({"query": "item_4298"})).expect("query");
    assert!(exact.matches("Moved item_4298 from shelf_1 to shelf_2."));
    assert!(exact.matches("ITEM-4298 arrived"));
    // The anchor alone is not the word: `4298` elsewhere, or the tokens apart or reversed.
    for text in [
        "shelf_4298 is empty",
        "item 17, 4298 units",
        "4298_item",
        "item4298",
    ] {
        assert!(!exact.matches(text), "{text}");
    }
    let phrases = RecallQuery::from_args(&json!({"query": "the item"})).expect("query");
    assert!(!phrases.needs_check());
}

#[test]
fn queries_are_words_and_never_syntax() {
    let q = RecallQuery::from_args(&json!({"query": "item_4298 \"OR\" shelf-12 NEAR(x"}))
        .expect("query");
    assert_eq!(
        q.fts5_match().as_deref(),
        Some(r#""4298" AND "or" AND "shelf 12" AND "near x""#)
    );
    assert!(q.needs_check());
    assert_eq!(q.limit, 5);
    for (args, field) in [
        (json!({}), "/query"),
        (json!({"query": "--- ***"}), "/query"),
        (json!({"query": 7}), "/query"),
        (json!({"pointer": "inventory"}), "/pointer"),
        (json!({"query": "x", "limit": 0}), "/limit"),
        (json!({"query": "x", "limit": 51}), "/limit"),
        (
            json!({"query": "x", "kinds": ["state", "dreams"]}),
            "/kinds/1",
        ),
        (
            json!({"query": "x", "from_step": 9, "to_step": 3}),
            "/from_step",
        ),
        (json!({"query": "x", "sort": "asc"}), "/sort"),
        (json!({"pointer": "/a", "kinds": ["observation"]}), "/query"),
        (json!({"query": "a ".repeat(17)}), "/query"),
        (json!("item_1"), "/"),
    ] {
        let problem = RecallQuery::from_args(&args).expect_err("refused");
        assert_eq!(problem.field, field, "{args}: {problem}");
    }
    let q =
        RecallQuery::from_args(&json!({"pointer": "/inventory", "to_step": 90})).expect("query");
    assert_eq!(q.kinds, vec![RecallKind::State]);
    assert_eq!(q.clone().up_to(40).to_step, Some(40));
    assert_eq!(q.up_to(400).to_step, Some(90));
}

#[test]
fn a_hit_shows_only_what_its_reader_may_see() {
    let schema = json!({
        "type": "object",
        "properties": {"token": {"type": "string", "writeOnly": true}, "note": {"type": "string"}}
    });
    let write_only = WriteOnly::of_schema(&schema);
    let secrets = write_only.secrets_of(&json!({"token": "hunter2-secret"}));
    let query = RecallQuery::new(Some("hunter2-secret"), None).expect("query");
    let reader = HitReader {
        write_only: &write_only,
        secrets: &secrets,
        words: &query.word_tokens,
    };
    let hit = |kind, pointer: Option<&str>, text: &str| {
        RawHit::from_index(1, 3, kind, pointer.map(str::to_owned), text.to_owned())
    };
    // The write itself, and free text that matched only through the value: nothing at all.
    assert_eq!(
        hit(
            RecallKind::State,
            Some("/token"),
            "/token = \"hunter2-secret\""
        )
        .reveal(&reader),
        None
    );
    assert_eq!(
        hit(RecallKind::Reasoning, None, "I saved hunter2-secret").reveal(&reader),
        None
    );
    // A hit that matches otherwise loses the value.
    let query = RecallQuery::new(Some("saved"), None).expect("query");
    let reader = HitReader {
        words: &query.word_tokens,
        ..reader
    };
    let shown = hit(RecallKind::Reasoning, None, "I saved hunter2-secret")
        .reveal(&reader)
        .expect("shown");
    assert!(!shown.text.contains("hunter2"), "{}", shown.text);
    let shown = hit(RecallKind::State, Some("/note"), "/note = \"saved\"")
        .reveal(&reader)
        .expect("shown");
    assert_eq!(shown.text, "/note = \"saved\"");
}

#[test]
fn results_are_cut_to_the_budget_by_whole_hits() {
    let query = RecallQuery::new(Some("item_1"), None).expect("query");
    let hits: Vec<RecallHit> = (0..40)
        .map(|i| RecallHit {
            id: i,
            step: 100 - i as u64,
            kind: RecallKind::Observation,
            pointer: None,
            text: format!(
                "Shipment arrived containing item_1. Store it on shelf_{i}.\nsecond line"
            ),
        })
        .collect();
    let text = render_hits(&query, &hits, false, 120);
    assert!(crate::count_tokens(&text) <= 120, "{text}");
    assert!(text.starts_with("Recall: "), "{text}");
    assert!(text.contains("[step 100 observation] Shipment arrived containing item_1. Store it on shelf_0. ⏎ second line"), "{text}");
    assert!(text.ends_with(&format!("{HITS_NOT_SHOWN}.")), "{text}");
    let all = render_hits(&query, &hits[..2], false, 10_000);
    assert!(
        all.starts_with("Recall: 2 matches for \"item_1\", newest first."),
        "{all}"
    );
    assert_eq!(
        render_hits(&query, &[], false, 100),
        "Recall: no matches for \"item_1\"."
    );
    let huge = RecallHit {
        text: "word ".repeat(5000),
        ..hits[0].clone()
    };
    let cut = render_hits(&query, &[huge], false, 50);
    assert!(crate::count_tokens(&cut) <= 50, "{cut}");
}

mod index_words {
    use proptest::prelude::*;

    use super::*;

    /// Tokens from a small vocabulary, so that words and texts share them often.
    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("item".to_owned()),
            Just("shelf".to_owned()),
            Just("Item".to_owned()),
            "[0-9]{1,5}",
            "[a-z]{1,3}[0-9]{0,3}",
        ]
    }

    fn joined(tokens: Vec<String>, separators: Vec<&'static str>) -> String {
        let mut text = String::new();
        for (i, token) in tokens.iter().enumerate() {
            if i > 0 {
                text.push_str(separators[i % separators.len()]);
            }
            text.push_str(token);
        }
        text
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the index is asked for a word is a run of that word's own tokens, and an
        /// entry with the whole word always has it: looking a word up by its anchor never loses
        /// an entry the phrase would find, and the check then decides exactly as the phrase.
        #[test]
        fn an_index_word_never_misses_an_entry_the_word_matches(
            word in prop::collection::vec(token(), 1..4),
            joiners in prop::collection::vec(prop_oneof![Just("_"), Just("-"), Just(".")], 1..3),
            text in prop::collection::vec(token(), 0..12),
            spaces in prop::collection::vec(prop_oneof![Just(" "), Just("_"), Just(", "), Just("/")], 1..4),
        ) {
            let word = joined(word, joiners);
            let text = joined(text, spaces);
            let query = RecallQuery::from_args(&json!({"query": word})).expect("a word of tokens");
            let indexed = query.index_words();
            prop_assert_eq!(indexed.len(), query.word_tokens.len());
            let text_tokens = tokens_of(&text);
            for (index_word, tokens) in indexed.iter().zip(&query.word_tokens) {
                let asked = index_word.tokens();
                prop_assert!(tokens.windows(asked.len()).any(|w| w == asked), "{asked:?} of {tokens:?}");
                if query.matches(&text) {
                    prop_assert!(
                        text_tokens.windows(asked.len()).any(|w| w == asked),
                        "{text:?} matches {word:?} but lacks {asked:?}"
                    );
                }
            }
            prop_assert_eq!(
                query.needs_check(),
                indexed.iter().any(|w| matches!(w, IndexWord::Anchor(_)))
            );
        }
    }
}
