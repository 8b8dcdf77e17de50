//! What the store counts, through the `metrics` facade: how the SQLite backend's group-commit
//! writer and its checkpoints spend their time, which is where a write's latency comes from
//! under load (docs/performance.md, "Where a PATCH's time goes").
//!
//! Every call is a no-op (one atomic load) until the process installs a recorder, as
//! `skillstate serve` does for `/metrics`. Each figure is recorded once per group or per
//! checkpoint, except the wait, which is once per write: a few hundred nanoseconds against a
//! write's hundreds of microseconds. No label names a task, a tenant or a database.

/// One of the store's histograms: its name, its `# HELP`, and its buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreMetric {
    pub name: &'static str,
    pub help: &'static str,
    pub buckets: &'static [f64],
}

pub const WRITE_WAIT: &str = "skillstate_sqlite_write_wait_seconds";
pub const GROUP: &str = "skillstate_sqlite_group_seconds";
pub const COMMIT: &str = "skillstate_sqlite_commit_seconds";
pub const GROUP_WRITES: &str = "skillstate_sqlite_group_writes";
pub const CHECKPOINT: &str = "skillstate_sqlite_checkpoint_seconds";

/// Durations from a tenth of a millisecond (an idle writer's group) to a second (a stall).
const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];
/// Writes per group, up to the writer's limit (256).
const WRITES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Everything the store reports (all histograms), for `# HELP` lines, buckets and the docs.
pub const METRICS: &[StoreMetric] = &[
    StoreMetric {
        name: WRITE_WAIT,
        help: "Time a write handed to the SQLite group-commit writer waited for its group to begin (the group before it running), in seconds.",
        buckets: SECONDS,
    },
    StoreMetric {
        name: GROUP,
        help: "Time the SQLite group-commit writer took for one group, from BEGIN to the end of COMMIT (every write's statements, then the log's write and sync), in seconds.",
        buckets: SECONDS,
    },
    StoreMetric {
        name: COMMIT,
        help: "Time of a group's COMMIT alone: its pages written to the write-ahead log and the log synced, in seconds.",
        buckets: SECONDS,
    },
    StoreMetric {
        name: GROUP_WRITES,
        help: "Writes committed together in one SQLite group.",
        buckets: WRITES,
    },
    StoreMetric {
        name: CHECKPOINT,
        help: "Time of a SQLite checkpoint, by mode: passive (on its own thread, copying the log into the database file and syncing it; writes go on) or restart (on the writer, between two groups, starting the log over; writes wait), in seconds.",
        buckets: SECONDS,
    },
];

pub(crate) fn write_waited(waited: std::time::Duration) {
    metrics::histogram!(WRITE_WAIT).record(waited.as_secs_f64());
}

pub(crate) fn group_committed(
    writes: usize,
    took: std::time::Duration,
    commit: std::time::Duration,
) {
    metrics::histogram!(GROUP).record(took.as_secs_f64());
    metrics::histogram!(COMMIT).record(commit.as_secs_f64());
    metrics::histogram!(GROUP_WRITES).record(writes as f64);
}

/// A checkpoint of `mode` (`"passive"`, `"restart"`) took `took`.
pub(crate) fn checkpointed(mode: &'static str, took: std::time::Duration) {
    metrics::histogram!(CHECKPOINT, "mode" => mode).record(took.as_secs_f64());
}
