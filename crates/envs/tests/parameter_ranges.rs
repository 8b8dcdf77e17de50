//! Every documented `[environment]` setting builds its episode and first observation in
//! bounded work. The settings are enumerated from each kind's parameter table
//! (`skillstate_envs::parameters`), so a new parameter or a wider range is covered as soon as
//! it is declared. Work is counted (random draws and scans, `rng::work_done`), not timed.

use proptest::prelude::*;
use proptest::strategy::Union;
use serde_json::{Map, Value, json};
use skillstate_core::skill::EnvironmentSettings;
use skillstate_envs::params::{ParamKind, ParamSpec};
use skillstate_envs::{ENVIRONMENTS, build_environment, parameters, rng};

/// Work allowed per event of the horizon, and for everything else an episode sets up.
const WORK_PER_EVENT: u64 = 1_000;
const WORK_BASE: u64 = 100_000;

/// Absent (the default), the ends of the range, or anything documented in between.
fn value(spec: &ParamSpec) -> BoxedStrategy<Option<Value>> {
    match spec.kind {
        ParamKind::Whole { min, max, .. } => Union::new(vec![
            Just(None).boxed(),
            Just(Some(json!(min))).boxed(),
            Just(Some(json!(max))).boxed(),
            (min..=max).prop_map(|n| Some(json!(n))).boxed(),
        ])
        .boxed(),
        ParamKind::OneOf { allowed, .. } => Union::new(vec![
            Just(None).boxed(),
            proptest::sample::select(allowed)
                .prop_map(|name| Some(json!(name)))
                .boxed(),
        ])
        .boxed(),
        ParamKind::Text { examples } => Union::new(vec![
            Just(None).boxed(),
            proptest::sample::select(examples)
                .prop_map(|text| Some(json!(text)))
                .boxed(),
        ])
        .boxed(),
        // A file on the host, written only when a tool runs: not part of building an episode.
        ParamKind::Path => Just(None).boxed(),
    }
}

/// A kind and one combination of its documented settings.
fn settings() -> impl Strategy<Value = EnvironmentSettings> {
    proptest::sample::select(ENVIRONMENTS).prop_flat_map(|kind| {
        let table = parameters(kind);
        let values: Vec<BoxedStrategy<Option<Value>>> = table.iter().map(value).collect();
        values.prop_map(move |values| {
            let mut params = Map::new();
            for (spec, value) in table.iter().zip(values) {
                if let Some(value) = value {
                    params.insert(spec.key.to_owned(), value);
                }
            }
            EnvironmentSettings {
                kind: kind.to_owned(),
                params,
            }
        })
    })
}

/// A combination the table documents but the kind refuses as a whole, with its reason.
fn refused_combination(settings: &EnvironmentSettings) -> bool {
    let n = |key: &str| settings.params.get(key).and_then(Value::as_u64);
    // bug-fix: every bug fails a test of its own (`tests` defaults to `bugs + 3`).
    settings.kind.starts_with("bugfix")
        && n("tests").is_some_and(|tests| tests < n("bugs").unwrap_or(3))
}

fn check(settings: &EnvironmentSettings) -> Result<(), TestCaseError> {
    let events = settings
        .params
        .get("events")
        .and_then(Value::as_u64)
        .unwrap_or(100);
    let bound = WORK_PER_EVENT * events + WORK_BASE;
    let before = rng::work_done();
    // A generator that would never end panics at the bound instead (a failing case).
    rng::limit_work(before + bound);
    let built = build_environment(settings);
    let mut env = match built {
        Ok(env) => env,
        Err(error) => {
            rng::limit_work(u64::MAX);
            prop_assert!(
                refused_combination(settings),
                "{settings:?} is documented but refused: {error}"
            );
            return Ok(());
        }
    };
    let first = env.opening_observation();
    rng::limit_work(u64::MAX);
    prop_assert!(!first.is_empty(), "{settings:?}: empty first observation");
    let work = rng::work_done() - before;
    prop_assert!(
        work <= bound,
        "{settings:?}: {work} units of work for {events} events"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_documented_setting_builds_its_episode_in_bounded_work(settings in settings()) {
        check(&settings)?;
    }
}

/// The settings the service was held by: 40,000 events used up the item ids and the generator
/// drew forever. Also the largest horizon with the fewest shelves, and every drift on two shelves.
#[test]
fn the_extremes_of_the_warehouse_build() {
    let mut cases = vec![
        json!({"events": 40_000}),
        json!({"events": 100_000}),
        json!({"events": 100_000, "shelves": 2}),
        json!({"events": 100_000, "shelves": 100_000}),
    ];
    for drift in skillstate_envs::warehouse::DRIFT_NAMES {
        cases.push(json!({"events": 5_000, "shelves": 2, "drift": drift}));
        cases.push(json!({"events": 100_000, "drift": drift}));
    }
    for params in cases {
        let settings = EnvironmentSettings {
            kind: "warehouse".into(),
            params: params.as_object().cloned().unwrap_or_default(),
        };
        check(&settings).unwrap();
    }
}

/// The warehouse archive at its extremes: the longest run on the fewest and on the most shelves.
#[test]
fn the_extremes_of_the_archive_build() {
    for params in [
        json!({"events": 100_000}),
        json!({"events": 100_000, "shelves": 2}),
        json!({"events": 100_000, "shelves": 100_000}),
        json!({"events": 1, "shelves": 100_000}),
    ] {
        let settings = EnvironmentSettings {
            kind: skillstate_envs::warehouse_archive::KIND.into(),
            params: params.as_object().cloned().unwrap_or_default(),
        };
        check(&settings).unwrap();
    }
}

#[test]
fn the_tables_name_each_parameter_once_and_the_paths_are_operator_only() {
    for kind in ENVIRONMENTS {
        let table = parameters(kind);
        assert!(!table.is_empty(), "{kind} declares no parameters");
        for (i, spec) in table.iter().enumerate() {
            assert!(
                table[i + 1..].iter().all(|other| other.key != spec.key),
                "{kind}: `{}` declared twice",
                spec.key
            );
        }
    }
    assert_eq!(skillstate_envs::operator_only_parameters(), ["audit_log"]);
    let drift: Vec<&str> = skillstate_envs::warehouse::Drift::ALL
        .iter()
        .map(|d| d.as_str())
        .collect();
    assert_eq!(skillstate_envs::warehouse::DRIFT_NAMES[1..], drift[..]);
}
