"""The long-task curve of `skillstate bench warehouse --long-task N`, run as a LangGraph agent loop
with LangGraph's own SQLite checkpointer, for comparison (docs/performance.md, "Performance").

The graph is the usual agent loop: a `model` node and a `tool` node in a cycle, checkpointed after
every super-step (`durability="sync"`: each checkpoint is written before the next step starts)
to a SQLite file in WAL mode with `synchronous=FULL`, as skillstate's long task is. Its state is
the one skillstate's steady workload keeps — 40 occupied shelves, one more item put on a shelf
and taken off again at alternate steps — so it stays the same size, and the model is scripted:
it builds a prompt (the skill's procedure, the state as JSON, the observation) and answers
without reading it. The tool does nothing. LangGraph validates nothing here and counts no
tokens; skillstate does both at every step.

A step's in-loop time is the time from one model call to the next (two checkpoints, the tool,
the prompt), as skillstate's figure is from one accepted answer to the next. Prints the medians
of steps 101-200 and of the last 100 steps, wall and process CPU time, and their ratio.
"""

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import time
from typing import TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

WINDOW = 100


class Loop(TypedDict):
    shelf_count: int
    inventory: dict
    step: int
    observation: str
    action: dict


def steady_state():
    inventory = {f"shelf_{i * 7}": f"item_{1000 + i}" for i in range(40)}
    return {"shelf_count": 500, "inventory": inventory}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--procedure", default="skills/warehouse/SKILL.md")
    parser.add_argument("--db", help="the SQLite file (default: a fresh one in a temporary directory)")
    args = parser.parse_args()
    if args.steps < 2 * WINDOW + 1:
        parser.error(f"--steps: at least {2 * WINDOW + 1}, for two windows of {WINDOW} steps")
    with open(args.procedure, encoding="utf-8") as f:
        procedure = f.read()
    marks = []

    def model(state: Loop):
        marks.append((time.perf_counter(), time.process_time()))
        shown = {"shelf_count": state["shelf_count"], "inventory": state["inventory"]}
        prompt = f"# Procedure\n{procedure}\n# Current state\n{json.dumps(shown)}\n# Observation\n{state['observation']}\n"
        call = state["step"] + 1
        answer = json.dumps(
            {
                "reasoning": "steady workload",
                "state_patch": {"inventory": {"shelf_499": "item_9" if call % 2 == 1 else None}},
                "action": {"tool": "wait", "args": {}},
                "prompt_bytes": len(prompt),
            }
        )
        parsed = json.loads(answer)
        inventory = dict(state["inventory"])
        for shelf, item in parsed["state_patch"]["inventory"].items():
            if item is None:
                inventory.pop(shelf, None)
            else:
                inventory[shelf] = item
        return {"inventory": inventory, "step": call, "action": parsed["action"]}

    def tool(state: Loop):
        return {"observation": f"step {state['step']}: {state['action']['tool']} done"}

    def next_node(state: Loop):
        return END if state["step"] > args.steps else "tool"

    graph = StateGraph(Loop)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", next_node, ["tool", END])
    graph.add_edge("tool", "model")

    directory = tempfile.mkdtemp(prefix="bench-langgraph-")
    path = args.db or os.path.join(directory, "checkpoints.db")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "long-task"}, "recursion_limit": 2 * args.steps + 10}
    start = dict(steady_state(), step=0, observation="the warehouse opens", action={})
    began = time.perf_counter()
    app.invoke(start, config, durability="sync")
    elapsed = time.perf_counter() - began
    # marks[k] is the model call of step k+1; step k's time runs to the next call.
    wall = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
    cpu = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
    n = len(wall)

    def window(values, first):
        return statistics.median(values[first - 1 : first - 1 + WINDOW]) * 1000

    early_wall, late_wall = window(wall, 101), window(wall, n - WINDOW + 1)
    early_cpu, late_cpu = window(cpu, 101), window(cpu, n - WINDOW + 1)
    size = os.path.getsize(path) + (os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0)
    print(
        f"langgraph long task: {n} steps, SqliteSaver (journal_mode={mode}, synchronous={sync}), durability=sync"
    )
    print(f"steps {101:>5}-{200:<5}  median in-loop step time {early_wall:.2f} ms wall, {early_cpu:.2f} ms CPU")
    print(f"steps {n - WINDOW + 1:>5}-{n:<5}  median in-loop step time {late_wall:.2f} ms wall, {late_cpu:.2f} ms CPU")
    print(f"ratio late/early: {late_wall / early_wall:.2f} wall, {late_cpu / early_cpu:.2f} CPU")
    print(f"whole loop: {elapsed:.1f} s, {n / elapsed:.0f} steps/s; checkpoint file {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
