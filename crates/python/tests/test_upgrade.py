"""Runtime.upgrade: a task moved to another version of its skill, on a real SQLite file. A task
paused for approval on 1.0.0 is upgraded to 2.0.0, whose migration renames a field: the upgrade
is scheduled, approving runs the action under 1.0.0, then the upgrade is the next step and the
task completes under 2.0.0. A dry run writes nothing; a migration that breaks the new schema is
refused with its pointer and changes nothing."""

import json
import os
import pathlib

import jsonpatch
import pytest
import skillstate

from conftest import WAREHOUSE, answer

V1_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
    "required": ["notes"],
    "additionalProperties": False,
}

# 2.0.0 calls the notes `entries` and adds a read-only `owner`.
V2_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "entries": {"type": "array", "items": {"type": "string"}},
        "owner": {"type": "string", "readOnly": True},
    },
    "required": ["entries", "owner"],
    "additionalProperties": False,
}

RENAME = [
    {"op": "move", "from": "/notes", "path": "/entries"},
    {"op": "add", "path": "/owner", "value": "ops"},
]

# Renames, but gives `owner` a number where 2.0.0 wants a string.
BREAKS_OWNER = [
    {"op": "move", "from": "/notes", "path": "/entries"},
    {"op": "add", "path": "/owner", "value": 7},
]


def write_skill(parent, version, schema, initial, procedure, migration=None, name="notes"):
    """The skill directory `parent/name` (a skill is named as its directory): SKILL.md, schema,
    initial state, skill.toml with its version, and `migrations/1.0.0.json` when given."""
    root = pathlib.Path(parent) / name
    root.mkdir(parents=True)
    (root / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Keeps the user's notes and files them.\n---\n# Notes\n\n{procedure}\n"
    )
    (root / "state.schema.json").write_text(json.dumps(schema))
    (root / "state.init.json").write_text(json.dumps(initial))
    (root / "skill.toml").write_text(f'version = "{version}"\n\n[run]\nmax_retries = 2\nmax_steps = 10\n')
    if migration is not None:
        (root / "migrations").mkdir()
        (root / "migrations" / "1.0.0.json").write_text(json.dumps(migration))
    return root


def v1(tmp_path):
    return write_skill(
        tmp_path / "v1", "1.0.0", V1_SCHEMA, {"notes": []}, "Write down what the user says in notes, file them, then finish."
    )


def v2(tmp_path, migration=RENAME, parent="v2"):
    return write_skill(
        tmp_path / parent,
        "2.0.0",
        V2_SCHEMA,
        {"entries": [], "owner": "ops"},
        "Keep what the user says in entries, then finish.",
        migration,
    )


def make_tools(filed):
    def file() -> str:
        """Files the notes (a human approves each filing)."""
        filed.append(1)
        return "filed"

    return {"file": skillstate.tool(file, side_effect="effectful", needs_approval=True)}


def policy(request):
    """Under 2.0.0 (the state has entries) adds one and finishes; under 1.0.0 writes a note and
    files it, then finishes once it is filed."""
    body = request.body
    if '"entries"' in body:
        return answer([{"op": "add", "path": "/entries/-", "value": "eggs"}], "finish", {"result": "kept"})
    if "filed" in body:
        return answer({}, "finish", {"result": "filed"})
    return answer({"notes": ["milk"]}, "file")


def paused_task(tmp_path, rt, filed):
    task = rt.run(skillstate.Skill.load(str(v1(tmp_path))), policy, tools=make_tools(filed), input="Note: milk.")
    assert task.status == "awaiting_approval", task.outcome
    assert (task.version, task.state) == (1, {"notes": ["milk"]})
    assert filed == []
    return task


def test_a_paused_task_is_upgraded_once_its_approval_is_settled(tmp_path):
    filed = []
    db = tmp_path / "tasks.db"
    with skillstate.Runtime(str(db)) as rt:
        task = paused_task(tmp_path, rt, filed)
        target = v2(tmp_path)

        # A path to the new version: the Python tool the task was given stays offered.
        outcome = rt.upgrade(task.id, target, apply=True)
        assert list(outcome) == ["task", "outcome", "from", "to", "migrations", "diff", "step", "applied", "scheduled"]
        assert (outcome["task"], outcome["outcome"], outcome["step"]) == (task.id, "scheduled", 2)
        assert (outcome["applied"], outcome["scheduled"]) == (False, True)
        assert outcome["migrations"] == ["1.0.0"]
        assert outcome["from"]["version"] == "1.0.0" and outcome["to"]["version"] == "2.0.0"
        assert len(outcome["from"]["hash"]) == 64 and outcome["from"]["hash"] != outcome["to"]["hash"]
        # The diff (RFC 6902) takes the state before to the migrated one.
        assert jsonpatch.apply_patch({"notes": ["milk"]}, outcome["diff"]) == {"entries": ["milk"], "owner": "ops"}
        # Scheduled: the waiting action keeps the version that proposed it.
        waiting = rt.task(task.id)
        assert (waiting.status, waiting.version, waiting.state) == ("awaiting_approval", 1, {"notes": ["milk"]})

    # Another runtime on the same file approves: the action runs once under 1.0.0, the upgrade
    # is step 2, and the model goes on under 2.0.0's procedure and state.
    with skillstate.Runtime(str(db)) as rt:
        done = rt.approve(task.id, policy, tools=make_tools(filed))
        assert done.status == "completed", done.outcome
        assert filed == [1]
        assert done.version == 3
        assert done.state == {"entries": ["milk", "eggs"], "owner": "ops"}
        steps = done.steps()
        assert [(s["step"], s["author"]) for s in steps] == [(1, None), (2, "operator"), (3, None)]
        assert steps[0]["tool"] == "file" and steps[0]["action_outcome"] == "succeeded"
        assert done.state_at(1) == {"notes": ["milk"]}
        assert done.state_at(2) == {"entries": ["milk"], "owner": "ops"}
        assert "in notes, file them" in done.prompt_at(1)
        after = done.prompt_at(3)
        assert "in entries" in after and "upgraded from 1.0.0" in after
        versions = sorted(rt.skills(), key=lambda v: v["version"])
        assert [(v["name"], v["version"], v["tasks"], v["former_tasks"]) for v in versions] == [
            ("notes", "1.0.0", 0, 1),
            ("notes", "2.0.0", 1, 0),
        ]
        assert versions[1]["hash"] == outcome["to"]["hash"] and versions[1]["bytes"] > 0
        # The same version again is no upgrade.
        with pytest.raises(skillstate.TaskError) as again:
            rt.upgrade(task.id, str(target), apply=True)
        assert again.value.kind == "unchanged"


def test_a_dry_run_writes_nothing(tmp_path):
    filed = []
    with skillstate.Runtime(str(tmp_path / "tasks.db")) as rt:
        task = paused_task(tmp_path, rt, filed)
        before = (task.version, task.state, len(task.steps()))
        # A Skill loaded with the tool: what the new version offers.
        target = skillstate.Skill.load(str(v2(tmp_path)), tools=make_tools(filed))
        assert target.version == "2.0.0"
        planned = rt.upgrade(task.id, target)
        assert planned["outcome"] == "planned"
        assert (planned["applied"], planned["scheduled"], planned["step"]) == (False, True, 2)
        assert planned["migrations"] == ["1.0.0"]
        assert jsonpatch.apply_patch(task.state, planned["diff"]) == {"entries": ["milk"], "owner": "ops"}
        assert (task.version, task.state, len(task.steps())) == before
        assert [v["version"] for v in rt.skills()] == ["1.0.0"]
        # Nothing was scheduled: approved, the task finishes under 1.0.0.
        done = rt.approve(task.id, policy, tools=make_tools(filed))
        assert done.status == "completed", done.outcome
        assert done.state == {"notes": ["milk"]} and done.version == 2
        # A task that waits on nothing would move at once when applied.
        planned = rt.upgrade(task.id, target)
        assert (planned["outcome"], planned["scheduled"], planned["step"]) == ("planned", False, 3)
        assert done.version == 2


def test_a_migration_that_breaks_the_schema_is_refused_with_its_pointer(tmp_path):
    filed = []
    with skillstate.Runtime(str(tmp_path / "tasks.db")) as rt:
        task = paused_task(tmp_path, rt, filed)
        broken = v2(tmp_path, BREAKS_OWNER, parent="v2-broken")
        for apply in (False, True):
            with pytest.raises(skillstate.UpgradeRefused) as refused:
                rt.upgrade(task.id, os.fspath(broken), apply=apply)
            error = refused.value
            assert isinstance(error, skillstate.ValidationError) and isinstance(error, skillstate.SkillstateError)
            assert error.pointer == "/owner" and error.kind == "schema"
            assert [(kind, pointer) for kind, pointer, _ in error.errors] == [("schema", "/owner")]
            assert [(r["kind"], r["pointer"]) for r in error.rejections] == [("schema", "/owner")]
            assert "string" in error.rejections[0]["message"]
            assert (error.task, error.to["version"]) == (task.id, "2.0.0")
            assert "nothing was changed" in str(error) and "/owner" in str(error)
        # Nothing changed: the task still waits on 1.0.0, no version was stored, and approving
        # finishes it under 1.0.0.
        assert (task.status, task.version, task.state) == ("awaiting_approval", 1, {"notes": ["milk"]})
        assert [v["version"] for v in rt.skills()] == ["1.0.0"]
        done = rt.approve(task.id, policy, tools=make_tools(filed))
        assert done.status == "completed" and done.state == {"notes": ["milk"]}
        assert all(s["author"] is None for s in done.steps())


def test_what_cannot_be_upgraded_says_what_to_do(tmp_path):
    with skillstate.Runtime(str(tmp_path / "tasks.db")) as rt:
        task = paused_task(tmp_path, rt, [])
        with pytest.raises(skillstate.StoreError) as missing:
            rt.upgrade("no-such-task", v2(tmp_path))
        assert missing.value.kind == "not_found"
        with pytest.raises(skillstate.SkillError):
            rt.upgrade(task.id, tmp_path / "nowhere")
        with pytest.raises(TypeError):
            rt.upgrade(task.id, 42)
        with pytest.raises(ValueError):
            rt.upgrade(task.id, tmp_path / "v2" / "notes", author=" ")
        other = write_skill(tmp_path, "2.0.0", V1_SCHEMA, {"notes": []}, "Other.", name="other")
        with pytest.raises(skillstate.TaskError) as wrong:
            rt.upgrade(task.id, other)
        assert wrong.value.kind == "other_skill" and "pass a version of `notes`" in str(wrong.value)
        # The author is recorded as given.
        rt.upgrade(task.id, tmp_path / "v2" / "notes", apply=True, author="release-bot")
        done = rt.approve(task.id, policy, tools=make_tools([]))
        assert [s["author"] for s in done.steps()] == [None, "release-bot", None]
        # A task of a built-in environment: its world is rebuilt from the task's record, so the
        # skill it runs is the version it already runs.
        warehouse = rt.run(skillstate.Skill.load(str(WAREHOUSE)), "oracle", max_steps=1)
        with pytest.raises(skillstate.TaskError) as same:
            rt.upgrade(warehouse.id, WAREHOUSE)
        assert same.value.kind == "unchanged"

