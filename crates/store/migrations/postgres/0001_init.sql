-- The PostgreSQL twin of migrations/sqlite/0001_init.sql: same tables, columns and constraints.
-- JSON columns are TEXT (not JSONB) so both backends store, hash and measure the very same text.
-- Ids are COLLATE "C" so that ordering and prefix matching are bytewise, as in SQLite, and the
-- primary-key index serves `id LIKE 'prefix%'`.

-- Tasks: one row per task, holding the current state and its version (= accepted steps).
CREATE TABLE tasks (
    id             TEXT COLLATE "C" PRIMARY KEY,
    skill_name     TEXT NOT NULL,
    skill          TEXT NOT NULL,            -- SkillDefinition JSON, frozen at task creation
    tools          TEXT NOT NULL,            -- ToolSpec JSON array, as presented to the model
    context        TEXT NOT NULL,            -- context strategy
    context_budget BIGINT,                   -- token budget for window/summary, if any
    model          TEXT NOT NULL,            -- model spec
    environment    TEXT,                     -- [environment] settings JSON
    env_checkpoint TEXT,                     -- latest environment checkpoint JSON
    status         TEXT NOT NULL,
    state          TEXT NOT NULL,            -- current state JSON
    version        BIGINT NOT NULL,
    outcome        TEXT,                     -- result or failure JSON
    parent_task    TEXT COLLATE "C" REFERENCES tasks(id),
    parent_step    BIGINT,
    created_at     BIGINT NOT NULL,          -- unix milliseconds
    updated_at     BIGINT NOT NULL
);
CREATE INDEX tasks_by_update ON tasks(updated_at);
-- Deleting a task clears its forks' parent links; without this index that is a full scan.
CREATE INDEX tasks_by_parent ON tasks(parent_task);

-- Full states at step 0 (the initial state) and every K steps, so time travel replays at most
-- K patches.
CREATE TABLE snapshots (
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step       BIGINT NOT NULL,
    state      TEXT NOT NULL,
    state_hash TEXT NOT NULL,
    PRIMARY KEY (task_id, step)
);

-- The observation each step starts from.
CREATE TABLE observations (
    task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    BIGINT NOT NULL,
    text    TEXT NOT NULL,
    PRIMARY KEY (task_id, step)
);

-- The append-only step journal: every model answer, accepted or rejected.
CREATE TABLE journal (
    task_id       TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step          BIGINT NOT NULL,
    attempt       BIGINT NOT NULL,
    verdict       TEXT NOT NULL CHECK (verdict IN ('accepted', 'rejected')),
    output        TEXT NOT NULL,             -- raw model output, reasoning included
    patch         TEXT,                      -- accepted: the state patch JSON
    action        TEXT,                      -- accepted: {"tool", "args"} JSON
    errors        TEXT,                      -- rejected: validation errors JSON
    state_hash    TEXT,                      -- accepted: hash of the state after the step
    prompt_tokens BIGINT NOT NULL,
    prompt_hash   TEXT NOT NULL,
    usage         TEXT,                      -- provider-reported usage JSON
    latency_ms    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (task_id, step, attempt)
);

-- Actions: the intent is written with its step, the result when the tool returns.
CREATE TABLE intents (
    task_id         TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step            BIGINT NOT NULL,
    tool            TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    side_effect     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'done')),
    ok              BOOLEAN,
    result          TEXT,
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    PRIMARY KEY (task_id, step)
);
