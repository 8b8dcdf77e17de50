"""skill.validate calls per second, against the same check written in Python with the
`jsonschema` and `jsonpatch` packages, on the warehouse skill's state.

Both sides do the same work per call: parse the answer (a JSON text), check its shape, apply
the patch to a copy of the state (RFC 7396 merge patch; jsonpatch for RFC 6902), refuse a
change to the read-only `shelf_count`, validate the new state against state.schema.json
(a compiled Draft 2020-12 validator), check the state budget, check that the action's tool
exists and validate its arguments, and hash the new state (SHA-256 of canonical JSON).
"""

import copy
import hashlib
import json
import pathlib
import sys
import time

import jsonpatch
import jsonschema

import skillstate

REPO = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
WAREHOUSE = REPO / "skills" / "warehouse"
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0

skill = skillstate.Skill.load(str(WAREHOUSE))

def warehouse(shelves):
    """The warehouse's state with `shelves` occupied shelves."""
    state = skill.initial_state
    state["inventory"] = {f"shelf_{i * 7 % 500}": f"item_{1000 + i}" for i in range(shelves)}
    return state

answers = [
    json.dumps({
        "reasoning": "item_4298 arrived for shelf_122; store it and record it.",
        "state_patch": {"inventory": {"shelf_122": "item_4298"}},
        "action": {"tool": "store", "args": {"item": "item_4298", "shelf": "shelf_122"}},
    }),
    json.dumps({
        "reasoning": "shelf_7 holds item_1001; move it to shelf_206 and update both shelves.",
        "state_patch": {"inventory": {"shelf_7": None, "shelf_206": "item_1001"}},
        "action": {"tool": "move", "args": {"from": "shelf_7", "item": "item_1001", "to": "shelf_206"}},
    }),
    json.dumps({
        "reasoning": "a slip: a number where an item belongs",
        "state_patch": {"inventory": {"shelf_9": 9}},
        "action": {"tool": "store", "args": {"item": "item_1", "shelf": "shelf_9"}},
    }),
]

schema = skill.schema
validator = jsonschema.Draft202012Validator(schema)
tools = {t["name"]: jsonschema.Draft202012Validator(t["input_schema"]) for t in skill.tools}
budget_bytes = 1500 * 4  # the state budget, checked in bytes as the runtime does first


def merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def python_validate(current, text):
    errors = []
    try:
        answer = json.loads(text)
    except ValueError as e:
        return [("parse", "", str(e))]
    if not isinstance(answer, dict) or not isinstance(answer.get("action"), dict):
        return [("parse", "", "not an answer object")]
    patch = answer.get("state_patch", {})
    if isinstance(patch, list):
        try:
            new = jsonpatch.apply_patch(current, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            return [("patch_apply", "/state_patch", str(e))]
    elif isinstance(patch, dict):
        new = merge(copy.deepcopy(current), patch)
    else:
        return [("patch_shape", "/state_patch", "not a patch")]
    if new.get("shelf_count") != current.get("shelf_count"):
        errors.append(("read_only", "/shelf_count", "read-only"))
    for error in validator.iter_errors(new):
        errors.append(("schema", "/" + "/".join(str(p) for p in error.absolute_path), error.message))
    canonical = json.dumps(new, sort_keys=True, separators=(",", ":"))
    if len(canonical) > budget_bytes:
        errors.append(("state_budget", "", "too large"))
    action = answer["action"]
    tool = tools.get(action.get("tool"))
    if tool is None:
        errors.append(("unknown_tool", "/action/tool", "unknown"))
    else:
        for error in tool.iter_errors(action.get("args", {})):
            errors.append(("tool_args", "/action/args", error.message))
    if errors:
        return errors
    hashlib.sha256(canonical.encode()).hexdigest()
    return new


def measure(check, state):
    calls = 0
    started = time.perf_counter()
    while True:
        for text in answers:
            check(state, text)
        calls += len(answers)
        elapsed = time.perf_counter() - started
        if elapsed >= SECONDS:
            return calls / elapsed


# 30 shelves: under the state budget's 1,500 bytes of compact JSON, so the runtime needs no
# token count (nor does the Python check). 90 shelves: over it, so the runtime also counts the
# new state's o200k_base tokens on each call (the Python check still compares bytes only: it
# has no tokenizer).
for shelves in (30, 90):
    state = warehouse(shelves)
    for text in answers:
        native = skill.validate(state, text)
        python = python_validate(state, text)
        assert native.accepted == isinstance(python, dict), (text, native, python)
        if native.accepted:
            assert native.new_state == python
    size = len(json.dumps(state, separators=(",", ":")))
    native = measure(skill.validate, state)
    python = measure(python_validate, state)
    print(f"warehouse state, {shelves} shelves ({size:,} bytes):")
    print(f"  skill.validate (native):          {native:>10,.0f} calls/s")
    print(f"  jsonschema + jsonpatch (Python):  {python:>10,.0f} calls/s")
    print(f"  native / Python:                  {native / python:>10.1f}x")
