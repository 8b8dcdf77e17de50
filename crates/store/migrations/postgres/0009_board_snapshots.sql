-- The PostgreSQL twin of migrations/sqlite/0009_board_snapshots.sql: board snapshots
-- (src/boards_history.rs), the full state at every version that is a multiple of the store's
-- snapshot interval, written in the transaction of that write, so rebuilding a board at an old
-- version replays at most that many writes. The hash to check a snapshot against is its
-- version's row in board_writes. Boards written before this migration have none and rebuild
-- from their initial state.
CREATE TABLE board_snapshots (
    board_id TEXT COLLATE "C" NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    version  BIGINT NOT NULL,
    state    TEXT NOT NULL,                       -- the state JSON after write `version`
    PRIMARY KEY (board_id, version)
);
