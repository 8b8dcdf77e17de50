"""Shared fixtures: the repository, the `skillstate` CLI (the Rust side the package is compared
with), the test skill and its deterministic model and tools."""

import json
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
HERE = pathlib.Path(__file__).resolve().parent
ORDERS = HERE / "skills" / "orders"
WAREHOUSE = REPO / "skills" / "warehouse"


@pytest.fixture(scope="session")
def cli():
    """Runs the `skillstate` binary (SKILLSTATE_BIN, else target/debug/skillstate)."""
    binary = os.environ.get("SKILLSTATE_BIN", str(REPO / "target" / "debug" / "skillstate"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} is missing: build it with `cargo build -p skillstate` (scripts/test-python does)")

    def run(*args, check=True, cwd=None):
        done = subprocess.run([binary, *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=300)
        if check and done.returncode != 0:
            raise AssertionError(f"skillstate {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    return run


def answer(patch, tool, args=None, reasoning="r"):
    return json.dumps({"reasoning": reasoning, "state_patch": patch, "action": {"tool": tool, "args": args or {}}})


def orders_policy(request):
    """The orders skill's model: decides from the prompt's body alone (state and observation),
    so a resumed task in another process gets the same answers."""
    body = request.body
    if "Outcome unknown" in body:
        return answer({"status": "unknown"}, "finish", {"result": "outcome unknown; not shipped again"})
    if "shipped o-1" in body:
        return answer({"status": "shipped", "shipped": ["o-1"]}, "finish", {"result": "shipped"})
    if "o-1 is ready" in body:
        return answer({"status": "ready"}, "ship", {"order": "o-1"})
    return answer({}, "lookup", {"order": "o-1"})


@pytest.fixture
def orders_skill():
    import skillstate

    return skillstate.Skill.load(str(ORDERS))


# The guide's Python blocks (test_doc_examples.py): (page:line, None when it ran, else why it
# was only compiled), summed up at the end of the run.
DOC_BLOCKS = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[DOC_BLOCKS] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    blocks = config.stash.get(DOC_BLOCKS, [])
    if not blocks:
        return
    ran = sum(1 for _, reason in blocks if reason is None)
    terminalreporter.write_line(f"doc examples: {ran} python blocks ran, {len(blocks) - ran} compiled only")
    for where, reason in blocks:
        if reason is not None:
            terminalreporter.write_line(f"  compiled only: {where}: {reason}")
