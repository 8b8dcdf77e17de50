-- Tasks: one row per task, holding the current state and its version (= accepted steps).
CREATE TABLE tasks (
    id             TEXT PRIMARY KEY,
    skill_name     TEXT NOT NULL,
    skill          TEXT NOT NULL,            -- SkillDefinition JSON, frozen at task creation
    tools          TEXT NOT NULL,            -- ToolSpec JSON array, as presented to the model
    context        TEXT NOT NULL,            -- context strategy
    context_budget INTEGER,                  -- token budget for window/summary, if any
    model          TEXT NOT NULL,            -- model spec
    environment    TEXT,                     -- [environment] settings JSON
    env_checkpoint TEXT,                     -- latest environment checkpoint JSON
    status         TEXT NOT NULL,
    state          TEXT NOT NULL,            -- current state JSON
    version        INTEGER NOT NULL,
    outcome        TEXT,                     -- result or failure JSON
    parent_task    TEXT REFERENCES tasks(id),
    parent_step    INTEGER,
    created_at     INTEGER NOT NULL,         -- unix milliseconds
    updated_at     INTEGER NOT NULL
);
CREATE INDEX tasks_by_update ON tasks(updated_at);

-- Full states at step 0 (the initial state) and every K steps, so time travel replays at most
-- K patches.
CREATE TABLE snapshots (
    task_id    TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step       INTEGER NOT NULL,
    state      TEXT NOT NULL,
    state_hash TEXT NOT NULL,
    PRIMARY KEY (task_id, step)
) WITHOUT ROWID;

-- The observation each step starts from.
CREATE TABLE observations (
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    INTEGER NOT NULL,
    text    TEXT NOT NULL,
    PRIMARY KEY (task_id, step)
) WITHOUT ROWID;

-- The append-only step journal: every model answer, accepted or rejected.
CREATE TABLE journal (
    task_id       TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step          INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    verdict       TEXT NOT NULL CHECK (verdict IN ('accepted', 'rejected')),
    output        TEXT NOT NULL,             -- raw model output, reasoning included
    patch         TEXT,                      -- accepted: the state patch JSON
    action        TEXT,                      -- accepted: {"tool", "args"} JSON
    errors        TEXT,                      -- rejected: validation errors JSON
    state_hash    TEXT,                      -- accepted: hash of the state after the step
    prompt_tokens INTEGER NOT NULL,
    prompt_hash   TEXT NOT NULL,
    usage         TEXT,                      -- provider-reported usage JSON
    latency_ms    INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (task_id, step, attempt)
) WITHOUT ROWID;

-- Actions: the intent is written with its step, the result when the tool returns.
CREATE TABLE intents (
    task_id         TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step            INTEGER NOT NULL,
    tool            TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    side_effect     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'done')),
    ok              INTEGER,
    result          TEXT,
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    PRIMARY KEY (task_id, step)
) WITHOUT ROWID;
