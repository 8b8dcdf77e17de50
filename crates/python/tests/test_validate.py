"""Verdicts, pointers and prompts equal the Rust runtime's on the same inputs: the CLI runs a
skill, its journal is read with sqlite3, and the package re-validates every recorded answer."""

import contextlib
import json
import sqlite3

import pytest
import skillstate

from conftest import REPO, WAREHOUSE


def bad_answers():
    """Answers a runner must reject, one per check of the pipeline."""
    good_action = {"tool": "store", "args": {"item": "item_4298", "shelf": "shelf_122"}}
    return [
        "this is not JSON at all",
        json.dumps({"reasoning": "r", "state_patch": {"inventory": {"shelf_122": 9}}, "action": good_action}),
        json.dumps({"reasoning": "r", "state_patch": {"shelf_count": 7}, "action": good_action}),
        json.dumps({"reasoning": "r", "state_patch": [{"op": "remove", "path": "/inventory/shelf_9"}], "action": good_action}),
        json.dumps({"reasoning": "r", "state_patch": {}, "action": {"tool": "teleport", "args": {}}}),
        json.dumps({"reasoning": "r", "state_patch": {}, "action": {"tool": "store", "args": {"item": 5}}}),
        json.dumps({"reasoning": "r", "state_patch": "nope", "action": good_action}),
        '{"reasoning": "r", "reasoning": "twice", "state_patch": {}, "action": {"tool": "store", "args": {}}}',
    ]


@pytest.fixture(scope="module")
def journal(cli, tmp_path_factory):
    """A CLI run of the warehouse skill whose script mixes rejected answers (two before each
    accepted one, while they last) into the demo's accepted ones; the journal as stored."""
    tmp = tmp_path_factory.mktemp("verdicts")
    demo = (WAREHOUSE / "examples" / "demo.jsonl").read_text().splitlines()
    bad = bad_answers()
    lines = []
    for good in demo:
        lines.extend(bad[:2])
        bad = bad[2:]
        lines.append(good)
    script = tmp / "answers.jsonl"
    # Each line a JSON string: the raw text the model "returned", byte for byte.
    script.write_text("".join(json.dumps(line) + "\n" for line in lines))
    db = tmp / "run.db"
    cli("--db", str(db), "run", str(WAREHOUSE), "--model", f"scripted:{script}", "-q", check=False)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT task_id, step, attempt, verdict, output, errors, state_hash FROM journal ORDER BY step, attempt"
        ).fetchall()
    assert rows, "the CLI run journaled nothing"
    return db, rows


def test_every_recorded_verdict_is_reproduced(journal):
    _, rows = journal
    skill = skillstate.Skill.load(str(WAREHOUSE))
    state = skill.initial_state
    rejected = accepted = 0
    for task_id, step, attempt, verdict, output, errors, state_hash in rows:
        mine = skill.validate(state, output)
        assert mine.accepted == (verdict == "accepted"), (step, attempt, output, mine)
        if verdict == "rejected":
            rejected += 1
            recorded = [(e["kind"], e["pointer"], e["message"]) for e in json.loads(errors)]
            assert mine.errors == recorded, (step, attempt, output)
            assert [r["document"] for r in mine.rejections] == [e["document"] for e in json.loads(errors)]
        else:
            accepted += 1
            assert mine.state_hash == state_hash, (step, attempt)
            state = mine.new_state
    assert rejected >= 6 and accepted >= 8, (rejected, accepted)


def test_rejection_kinds_cover_the_pipeline(journal):
    _, rows = journal
    kinds = {e["kind"] for row in rows if row[5] for e in json.loads(row[5])}
    assert {"parse", "schema", "read_only", "unknown_tool", "tool_args"} <= kinds, kinds


def test_rendered_prompt_equals_the_one_the_runtime_sent(journal, cli):
    db, rows = journal
    task_id = rows[0][0]
    skill = skillstate.Skill.load(str(WAREHOUSE))
    observation = cli("--db", str(db), "show", task_id, "--step", "1", "--observation").stdout
    assert observation.endswith("\n")
    observation = observation[:-1]
    sent = cli("--db", str(db), "show", task_id, "--step", "1", "--prompt", "--attempt", "1").stdout
    mine = skill.render(skill.initial_state, observation)
    assert sent in (mine, mine + "\n")
    # The retry prompt carries the rejected answer's errors, as the runtime fed them back.
    retry = cli("--db", str(db), "show", task_id, "--step", "1", "--prompt", "--attempt", "2").stdout
    first = skill.validate(skill.initial_state, rows[0][4])
    assert not first.accepted
    mine_retry = skill.render(skill.initial_state, observation, rejected=first)
    assert retry in (mine_retry, mine_retry + "\n")
    prefix, body = skill.render_parts(skill.initial_state, observation)
    assert prefix + body == mine


def test_skill_errors_name_the_same_files_and_pointers_as_the_cli(tmp_path, cli):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "SKILL.md").write_text("---\nname: Broken Name\n---\nDo things.\n")
    (broken / "state.schema.json").write_text('{"type": "object", "properties": {"n": {"type": "integre"}}}')
    (broken / "state.init.json").write_text('{"n": "x"}')
    printed = cli("validate", str(broken), check=False)
    assert printed.returncode != 0
    cli_lines = [l for l in printed.stdout.splitlines() if l.startswith("error: ")]
    assert cli_lines
    with pytest.raises(skillstate.SkillError) as raised:
        skillstate.Skill.load(str(broken))
    error = raised.value
    assert isinstance(error, skillstate.SkillstateError)
    assert error.kind == "skill"
    mine = []
    for file, location, message in error.errors:
        where = file
        if location.startswith("/") or location == "":
            where += f"#{location or '/'}" if location or any(l.startswith(f"error: {file}#") for l in cli_lines) else ""
        else:
            where += f":{location}"
        mine.append(f"error: {where}: {message}")
    assert sorted(mine) == sorted(cli_lines), (mine, cli_lines)


def test_a_state_given_as_json_text_is_the_same_state():
    skill = skillstate.Skill.load(str(WAREHOUSE))
    line = (WAREHOUSE / "examples" / "demo.jsonl").read_text().splitlines()[0]
    a = skill.validate(skill.initial_state, line)
    b = skill.validate(json.dumps(skill.initial_state), line)
    assert a.accepted and b.accepted and a.state_hash == b.state_hash
    assert a.action == {"tool": "store", "args": {"item": "item_4298", "shelf": "shelf_122"}}
    assert a.patch == {"inventory": {"shelf_122": "item_4298"}}
    assert a.new_state["inventory"] == {"shelf_122": "item_4298"}


def test_raise_for_errors_carries_kind_and_pointer():
    skill = skillstate.Skill.load(str(WAREHOUSE))
    verdict = skill.validate(skill.initial_state, bad_answers()[1])
    assert not verdict
    with pytest.raises(skillstate.ValidationError) as raised:
        verdict.raise_for_errors()
    assert raised.value.kind == verdict.errors[0][0] == "schema"
    assert raised.value.pointer == verdict.errors[0][1]
    assert raised.value.errors == verdict.errors
