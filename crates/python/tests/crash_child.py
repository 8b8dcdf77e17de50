"""Runs the orders skill with a Python model and Python tools in its own process until the
parent SIGKILLs it: the tool named by argv[4] writes the task id to the marker file and waits."""

import pathlib
import sys
import time

import skillstate

from conftest import ORDERS, orders_policy
from test_run import make_tools

db, effects_dir, marker, stop_in = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4]


def hang(tool, context):
    if tool == stop_in:
        marker.write_text(context["task_id"])
        time.sleep(120)


rt = skillstate.Runtime(db)
skill = skillstate.Skill.load(str(ORDERS))
rt.run(skill, orders_policy, tools=make_tools(effects_dir, hang), input="Ship order o-1.")
print("the run ended without being killed", file=sys.stderr)
sys.exit(3)
