//! The cost of reading a board at an old version (`board_state_at`, the base of a stale
//! If-Match write's rebase and of `GET /v1/boards/{id}/state?version=`): the state at the
//! newest-but-one version of a board with 20,000 writes, on SQLite. Two stores show before and
//! after board snapshots: one with a snapshot interval of 1<<62 (no snapshot is ever written, so
//! the read replays every write from the initial state) and one with the default interval
//! (the read starts from the newest snapshot and replays at most that many writes).
//!
//! Run: `cargo bench -p skillstate-store --bench board_history`

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use skillstate_core::StatePatch;
use skillstate_core::json::state_hash;
use skillstate_store::prelude::*;
use skillstate_store::{
    BoardAuthor, BoardWrite, DEFAULT_SNAPSHOT_EVERY, NewBoard, SqliteStore, Synchronous,
    board_state_at,
};
use tokio::runtime::Runtime;

const WRITES: u64 = 20_000;

/// Write `n`: one of 50 counters set to `n`, so the state keeps its size.
fn write(state: &Value, n: u64) -> BoardWrite {
    let patch = json!({"counters": {format!("c{}", n % 50): n}});
    let new_state = StatePatch::from_value(&patch)
        .expect("a merge patch")
        .apply(state)
        .expect("a merge patch applies to an object");
    BoardWrite {
        state_hash: state_hash(&new_state),
        patch,
        new_state,
        author: BoardAuthor::Cli,
        rebased_from: None,
    }
}

/// A store in `dir` holding one board with `WRITES` writes; returns the store and board id.
async fn board_with_writes(dir: &std::path::Path, snapshot_every: u64) -> (SqliteStore, String) {
    let path = dir.join("store.db");
    let store = SqliteStore::open(path.to_str().expect("a UTF-8 path"), Synchronous::Normal)
        .await
        .expect("open the store")
        .with_snapshot_every(snapshot_every);
    let mut state = json!({"counters": {}});
    let board = store
        .create_board(NewBoard {
            name: "bench".into(),
            schema: json!({"type": "object"}),
            initial_state: state.clone(),
            tenant: None,
        })
        .await
        .expect("create the board");
    for n in 1..=WRITES {
        let next = write(&state, n);
        store
            .commit_board_write(&board.id, n - 1, &next)
            .await
            .expect("a board write");
        state = next.new_state;
    }
    (store, board.id)
}

fn bench(c: &mut Criterion) {
    let runtime = Runtime::new().expect("a tokio runtime");
    let mut group = c.benchmark_group("board_history");
    for (label, every) in [
        ("state_at_newest_but_one/no_snapshots", 1u64 << 62),
        (
            "state_at_newest_but_one/snapshot_every_default",
            DEFAULT_SNAPSHOT_EVERY,
        ),
    ] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (store, board) = runtime.block_on(board_with_writes(dir.path(), every));
        group.bench_function(label, |b| {
            b.iter(|| {
                runtime
                    .block_on(board_state_at(&store, &board, WRITES - 1))
                    .expect("the board rebuilds")
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
