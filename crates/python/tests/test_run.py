"""Runs with Python models and tools: persisted to SQLite, resumed after SIGKILL in another
process without re-running an effectful tool, errors as exceptions, the GIL released."""

import asyncio
import contextlib
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import skillstate

from conftest import HERE, ORDERS, WAREHOUSE, orders_policy


def make_tools(effects_dir, hang=None):
    """lookup (read_only) and ship (effectful); every call appends a line to its file."""
    effects_dir = pathlib.Path(effects_dir)

    def record(name, context):
        with open(effects_dir / f"{name}.log", "a") as log:
            log.write(f"{context['step']}\n")
            log.flush()
            os.fsync(log.fileno())
        if hang:
            hang(name, context)

    def lookup(order: str, context=None) -> str:
        """Tells whether an order is ready to ship."""
        record("lookup", context)
        return f"{order} is ready"

    def ship(order: str, context=None) -> str:
        """Ships an order to the customer."""
        record("ship", context)
        return f"shipped {order}"

    return {
        "lookup": skillstate.tool(lookup, side_effect="read_only", pass_context=True),
        "ship": skillstate.tool(ship, side_effect="effectful", pass_context=True),
    }


def calls(effects_dir, name):
    path = pathlib.Path(effects_dir) / f"{name}.log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_run_persists_every_step_to_sqlite(tmp_path):
    db = tmp_path / "tasks.db"
    rt = skillstate.Runtime(str(db))
    task = rt.run(skillstate.Skill.load(str(ORDERS)), orders_policy, tools=make_tools(tmp_path), input="Ship order o-1.")
    assert task.status == "completed"
    assert task.state == {"order": "o-1", "status": "shipped", "shipped": ["o-1"]}
    assert task.version == 3
    steps = task.steps()
    assert [(s["step"], s["verdict"]) for s in steps] == [(1, "accepted"), (2, "accepted"), (3, "accepted")]
    assert steps[0]["tool"] == "lookup" and steps[0]["result"] == "o-1 is ready"
    assert steps[1]["tool"] == "ship" and steps[1]["side_effect"] == "effectful" and steps[1]["ok"] is True
    assert task.state_at(0) == {"order": "o-1", "status": "new", "shipped": []}
    assert task.state_at(2)["status"] == "ready"
    assert "o-1 is ready" in task.prompt_at(2)
    assert task.model.startswith("python:")
    assert calls(tmp_path, "lookup") == ["1"] and calls(tmp_path, "ship") == ["2"]
    final = task.state
    rt.close()
    with pytest.raises(skillstate.StoreError) as closed:
        task.state
    assert closed.value.kind == "closed"
    # close() returned after the last connection closed: SQLite copied the log into the file
    # and removed it, so nothing of the run lives only in the log.
    assert not db.with_name(db.name + "-wal").exists()
    # Python's own sqlite3 (a second SQLite library in this process) may open the file only
    # while no runtime has it open: the two libraries do not see each other's locks.
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 3
    # Another runtime reads the same task from the file.
    with skillstate.Runtime(str(db)) as other:
        again = other.task(task.id[:8])
        assert again == task and again.state == final
    with pytest.raises(skillstate.StoreError):
        again.state


@pytest.mark.parametrize("killed_in, ship_calls, lookup_calls", [("ship", 1, 1), ("lookup", 1, 2)])
def test_resume_after_sigkill_does_not_rerun_an_effectful_tool(tmp_path, killed_in, ship_calls, lookup_calls):
    db = tmp_path / "tasks.db"
    marker = tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(HERE))
    child = subprocess.Popen(
        [sys.executable, str(HERE / "crash_child.py"), str(db), str(tmp_path), str(marker), killed_in],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():
        assert child.poll() is None, f"the child exited {child.returncode}: {child.stderr.read()}"
        assert time.monotonic() < deadline, "the tool never signalled"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    task_id = marker.read_text()
    assert calls(tmp_path, killed_in)  # the call had started

    rt = skillstate.Runtime(str(db))
    assert rt.task(task_id).status == "running"
    task = rt.resume(task_id, orders_policy, tools=make_tools(tmp_path))
    assert task.status == "completed", task.outcome
    assert len(calls(tmp_path, "ship")) == ship_calls
    assert len(calls(tmp_path, "lookup")) == lookup_calls
    if killed_in == "ship":
        # Not re-run: the model was told the outcome is unknown, and finished without shipping again.
        assert task.state["status"] == "unknown"
        step2 = [s for s in task.steps() if s["step"] == 2][0]
        # Its own outcome, not a tool error.
        assert step2["ok"] is None and step2["action_outcome"] == "unknown"
        assert step2["result"].startswith("Outcome unknown")
    else:
        # A read-only call in flight runs again, then the task goes on as usual.
        assert task.state["status"] == "shipped"


def test_max_steps_advances_exactly_that_many_steps(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "t.db"))
    skill = skillstate.Skill.load(str(ORDERS), tools=make_tools(tmp_path))
    task = rt.run(skill, orders_policy, input="Ship order o-1.", max_steps=1)
    assert (task.status, task.version) == ("running", 1)
    task = rt.resume(task.id, orders_policy, tools=make_tools(tmp_path), max_steps=1)
    assert (task.status, task.version) == ("running", 2)
    task = rt.resume(task.id, orders_policy, tools=make_tools(tmp_path))
    assert (task.status, task.version) == ("completed", 3)


def test_a_model_exception_is_raised_with_its_cause(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "t.db"))

    def broken(request):
        raise KeyError("no such model")

    with pytest.raises(skillstate.ModelError) as raised:
        rt.run(skillstate.Skill.load(str(ORDERS)), broken, tools=make_tools(tmp_path), input="x")
    assert isinstance(raised.value.__cause__, KeyError)
    assert "KeyError" in str(raised.value)


def test_a_tool_exception_is_a_failed_call_the_model_sees(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "t.db"))
    seen = []

    def lookup(order: str) -> str:
        raise RuntimeError("the order service is down")

    def model(request):
        seen.append(request.body)
        if "the order service is down" in request.body:
            return '{"reasoning": "r", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "gave up"}}}'
        return '{"reasoning": "r", "state_patch": {}, "action": {"tool": "lookup", "args": {"order": "o-1"}}}'

    tools = [skillstate.tool(lookup, side_effect="read_only")]
    task = rt.run(skillstate.Skill.load(str(ORDERS)), model, tools=tools, input="x")
    assert task.status == "completed"
    step1 = task.steps()[0]
    assert step1["ok"] is False and "RuntimeError: the order service is down" in step1["result"]


def test_model_request_carries_messages_and_the_output_schema(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "t.db"))
    requests = []

    def model(request):
        requests.append(request)
        return orders_policy(request)

    skill = skillstate.Skill.load(str(ORDERS), tools=make_tools(tmp_path))
    rt.run(skill, model, input="Ship order o-1.")
    first = requests[0]
    assert first.messages == [{"role": "system", "content": first.prefix}, {"role": "user", "content": first.body}]
    assert first.text == first.prefix + first.body
    assert first.output_schema == skill.output_schema
    assert first.prompt_tokens == skillstate.count_tokens(first.text)
    assert first.text == skill.render(skill.initial_state, "Ship order o-1.")


def test_errors_are_typed_with_kinds(tmp_path):
    with pytest.raises(skillstate.SkillError):
        skillstate.Skill.load(str(tmp_path / "missing"))
    rt = skillstate.Runtime(str(tmp_path / "t.db"))
    with pytest.raises(skillstate.StoreError) as raised:
        rt.task("nope")
    assert raised.value.kind == "not_found"
    with pytest.raises(skillstate.ToolError):
        skillstate.tool(lambda: "x", name="x", side_effect="sometimes")
    with pytest.raises(skillstate.TaskError) as raised:
        rt.run(skillstate.Skill.load(str(ORDERS)), orders_policy)
    assert raised.value.kind == "input"
    with pytest.raises(skillstate.ModelError):
        rt.run(skillstate.Skill.load(str(ORDERS)), "nonsense:model", input="x")


def test_builtin_environment_with_oracle_and_the_gil_released(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "w.db"))
    skill = skillstate.Skill.load(str(WAREHOUSE))
    ticks = 0
    stop = threading.Event()

    def tick():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=tick)
    thread.start()
    time.sleep(0.05)
    before = ticks
    task = rt.run(skill, "oracle")
    during = ticks - before
    stop.set()
    thread.join()
    assert task.status == "completed", task.outcome
    assert task.version >= 10
    # With the GIL held through the run, the other thread could not have counted at all.
    assert during > 1000, during


def test_arun_works_with_asyncio(tmp_path):
    rt = skillstate.Runtime(str(tmp_path / "a.db"))
    skill = skillstate.Skill.load(str(ORDERS), tools=make_tools(tmp_path))
    beats = []

    async def heartbeat():
        for _ in range(1000):
            beats.append(1)
            await asyncio.sleep(0)

    async def main():
        task, _ = await asyncio.gather(rt.arun(skill, orders_policy, input="Ship order o-1."), heartbeat())
        return task

    task = asyncio.run(main())
    assert task.status == "completed" and len(beats) == 1000
    assert isinstance(rt, skillstate.Runtime)
