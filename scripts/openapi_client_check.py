"""Drives a running `skillstate serve` through the Python client that openapi-python-client
generated from the server's /openapi.json, and nothing else: no hand-written HTTP. Called by
scripts/openapi-client, which starts the server, makes the key and generates the client.

    python3 openapi_client_check.py BASE_URL API_KEY

Creates a warehouse task (oracle model), waits for it to complete, reads its state with the
ETag, lists its steps, sends it a message and waits for a worker to deliver it. Every check
that fails says what was expected and what came back, and exits non-zero.
"""

import importlib
import json
import pkgutil
import sys
import time
from http import HTTPStatus

import httpx
import skillstate_client
from skillstate_client import AuthenticatedClient
from skillstate_client.api.inbox import list_messages, send_message
from skillstate_client.api.journal import list_steps
from skillstate_client.api.state import get_state
from skillstate_client.api.tasks import create_task, get_task
from skillstate_client.models import (
    CreatedTask,
    CreateTaskRequest,
    CreateTaskRequestEnvironment,
    GetStateResponse200,
    MessageKindName,
    MessageList,
    MessageRequest,
    MessageView,
    PatchStateResponse200,
    Problem,
    StatusName,
    StepPage,
    TaskView,
)

# The warehouse environment with the oracle finishes 4 events in well under a second on a
# debug build; the bound is for a loaded CI machine.
WAIT_SECONDS = 60.0
POLL_SECONDS = 0.1


# Generated modules that do not load, each for a bug of the pinned generator rather than of
# the document. openapi-python-client 0.29.1 writes a required request body with several
# content types as `... | Unset = UNSET` without importing `Unset` (its issue #1451, open), so
# patchState and patchBoardState (merge patch or JSON Patch) are sent through the client's
# httpx client. When the pin moves to a release that fixes it, this check fails until the
# entries are removed.
KNOWN_BROKEN = {
    "skillstate_client.api.state.patch_state": "name 'Unset' is not defined",
    "skillstate_client.api.boards.patch_board_state": "name 'Unset' is not defined",
}


class CheckFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


def parsed_as(response, kind, status: HTTPStatus, what: str):
    """The response's parsed body, which must be `kind` with `status`."""
    check(
        response.status_code == status and isinstance(response.parsed, kind),
        f"{what}: expected {status.value} with a {kind.__name__}, got "
        f"{response.status_code.value}: {response.content[:500]!r}",
    )
    return response.parsed


def wait_for_status(client: AuthenticatedClient, task_id: str, wanted: StatusName) -> TaskView:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        task = parsed_as(
            get_task.sync_detailed(task_id, client=client), TaskView, HTTPStatus.OK, "getTask"
        )
        if task.status == wanted:
            return task
        check(
            task.status != StatusName.FAILED,
            f"task {task_id} failed while waiting for {wanted}: {task.outcome!r}",
        )
        check(
            time.monotonic() < deadline,
            f"task {task_id} still {task.status} (version {task.version}) after {WAIT_SECONDS:.0f} s",
        )
        time.sleep(POLL_SECONDS)


def all_steps(client: AuthenticatedClient, task_id: str) -> list:
    steps, cursor = [], None
    for _ in range(1000):  # pages of 2: more than any task of this check has
        kwargs = {"limit": 2} if cursor is None else {"limit": 2, "cursor": cursor}
        page = parsed_as(
            list_steps.sync_detailed(task_id, client=client, **kwargs),
            StepPage,
            HTTPStatus.OK,
            "listSteps",
        )
        steps.extend(page.steps)
        cursor = page.next_cursor if isinstance(page.next_cursor, str) else None
        if cursor is None:
            return steps
    raise CheckFailed("listSteps: the cursor never ended")


def import_every_module() -> int:
    """Every generated module loads, but for KNOWN_BROKEN, which fails as described."""
    names = [
        m.name for m in pkgutil.walk_packages(skillstate_client.__path__, "skillstate_client.")
    ]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 — whatever a user importing it would see
            expected = KNOWN_BROKEN.get(name)
            check(
                expected is not None and expected in str(error),
                f"generated module {name} does not import: {error!r}",
            )
        else:
            check(
                name not in KNOWN_BROKEN,
                f"{name} imports now: remove it from KNOWN_BROKEN and call it instead",
            )
    missing = set(KNOWN_BROKEN) - set(names)
    check(not missing, f"not generated at all: {sorted(missing)}")
    return len(names)


def patch_state(client: AuthenticatedClient, task_id: str, etag: str, patch: dict):
    """PATCH …/state as a merge patch, through the generated client's own httpx client (see
    KNOWN_BROKEN); the answer is parsed with the generated models."""
    return client.get_httpx_client().patch(
        f"/v1/tasks/{task_id}/state",
        content=json.dumps(patch),
        headers={"If-Match": etag, "Content-Type": "application/merge-patch+json"},
    )


def run(base_url: str, key: str) -> None:
    modules = import_every_module()
    print(f"{modules} generated modules import ({len(KNOWN_BROKEN)} with the known generator bug)")
    client = AuthenticatedClient(
        base_url=base_url,
        token=key,
        timeout=httpx.Timeout(30.0),
        raise_on_unexpected_status=True,
    )
    with client:
        # Create, and create again with the same Idempotency-Key: the same task, 200 not 201.
        request = CreateTaskRequest(
            skill="warehouse",
            model="oracle",
            environment=CreateTaskRequestEnvironment.from_dict({"seed": 11, "events": 4}),
        )
        created = parsed_as(
            create_task.sync_detailed(client=client, body=request, idempotency_key="oac-1"),
            CreatedTask,
            HTTPStatus.CREATED,
            "createTask",
        )
        check(created.created, f"createTask: created is {created.created}")
        task_id = created.task.id
        check(created.task.skill == "warehouse", f"createTask: skill {created.task.skill!r}")
        check(created.task.model == "oracle", f"createTask: model {created.task.model!r}")
        again = parsed_as(
            create_task.sync_detailed(client=client, body=request, idempotency_key="oac-1"),
            CreatedTask,
            HTTPStatus.OK,
            "createTask (replayed)",
        )
        check(
            not again.created and again.task.id == task_id,
            f"replayed createTask: created={again.created} id={again.task.id}, first id {task_id}",
        )
        print(f"created task {task_id}")

        # The embedded worker runs it to the end.
        task = wait_for_status(client, task_id, StatusName.COMPLETED)
        check(task.version > 0, f"completed task has version {task.version}")
        print(f"completed at version {task.version}: {task.outcome!r}")

        # The state, with its version as ETag; If-None-Match with it is a 304.
        response = get_state.sync_detailed(task_id, client=client)
        state = parsed_as(response, GetStateResponse200, HTTPStatus.OK, "getState")
        etag = response.headers.get("etag")
        check(etag == f'"{task.version}"', f"getState: ETag {etag!r}, task version {task.version}")
        fields = state.to_dict()
        check(
            isinstance(fields, dict) and len(fields) > 0,
            f"getState: the state is {fields!r}",
        )
        unchanged = get_state.sync_detailed(task_id, client=client, if_none_match=etag)
        check(
            unchanged.status_code == HTTPStatus.NOT_MODIFIED,
            f"getState with If-None-Match {etag}: {unchanged.status_code.value}",
        )
        print(f"state at ETag {etag}: fields {sorted(fields)}")

        # The journal: one accepted step per version, in order, across pages.
        steps = all_steps(client, task_id)
        accepted = [s for s in steps if s.verdict == "accepted"]
        check(
            len(accepted) == task.version,
            f"listSteps: {len(accepted)} accepted steps, version {task.version}",
        )
        numbers = [s.step for s in steps]
        check(numbers == sorted(set(numbers)), f"listSteps: step numbers {numbers}")
        check(
            all(s.author is None for s in steps),
            "listSteps: a step of the model has an author",
        )
        print(f"{len(steps)} steps, {len(accepted)} accepted")

        # A state write with If-Match: the next version, journaled as a step with the key as
        # its author; the same If-Match again is stale (412, a Problem).
        written = patch_state(client, task_id, etag, {"inventory": {"shelf_499": "item_1"}})
        check(written.status_code == 200, f"patchState: {written.status_code} {written.text[:500]}")
        new_state = PatchStateResponse200.from_dict(written.json()).to_dict()
        check(
            new_state.get("inventory", {}).get("shelf_499") == "item_1",
            f"patchState: the new state is {new_state!r}",
        )
        version = task.version + 1
        check(
            written.headers.get("etag") == f'"{version}"',
            f'patchState: ETag {written.headers.get("etag")!r}, expected "{version}"',
        )
        stale = patch_state(client, task_id, etag, {"inventory": {"shelf_498": "item_2"}})
        problem = Problem.from_dict(stale.json()) if stale.status_code == 412 else None
        check(
            problem is not None and problem.status == 412,
            f"patchState with a stale If-Match: {stale.status_code} {stale.text[:500]}",
        )
        steps = all_steps(client, task_id)
        check(
            steps[-1].step == version and isinstance(steps[-1].author, str),
            f"listSteps after patchState: last step {steps[-1].to_dict()!r}",
        )
        task = wait_for_status(client, task_id, StatusName.COMPLETED)
        check(task.version == version, f"getTask after patchState: version {task.version}")
        print(
            f'patched to ETag "{version}" by key {steps[-1].author}; a stale If-Match is {problem.status}'
        )

        # A message reopens the completed task; a worker delivers it at the next step.
        text = "Please double-check the last restock before closing."
        sent = parsed_as(
            send_message.sync_detailed(task_id, client=client, body=MessageRequest(text=text)),
            MessageView,
            HTTPStatus.ACCEPTED,
            "sendMessage",
        )
        check(
            sent.kind == MessageKindName.MESSAGE and sent.text == text and sent.task == task_id,
            f"sendMessage: {sent.to_dict()!r}",
        )
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            messages = parsed_as(
                list_messages.sync_detailed(task_id, client=client),
                MessageList,
                HTTPStatus.OK,
                "listMessages",
            ).messages
            mine = [m for m in messages if m.id == sent.id]
            check(len(mine) == 1, f"listMessages: message {sent.id} appears {len(mine)} times")
            if isinstance(mine[0].delivered_step, int):
                break
            check(
                time.monotonic() < deadline,
                f"message {sent.id} not delivered after {WAIT_SECONDS:.0f} s",
            )
            time.sleep(POLL_SECONDS)
        delivered = mine[0].delivered_step
        # A completed task is reopened by the message: it is the observation of its next step.
        check(
            delivered == task.version + 1,
            f"message delivered at step {delivered}, not the step after version {task.version}",
        )
        after = wait_for_status(client, task_id, StatusName.COMPLETED)
        # Whether the reopened task took that step decides what the listing says: an episode
        # that is over completes again at once, and the message was then never shown.
        listed = parsed_as(
            list_messages.sync_detailed(task_id, client=client),
            MessageList,
            HTTPStatus.OK,
            "listMessages",
        ).messages
        mine = next(m for m in listed if m.id == sent.id)
        if after.version >= delivered:
            check(mine.delivery.value == "shown", f"listMessages: {mine.to_dict()!r}")
        else:
            check(
                mine.delivery.value == "unshown" and mine.finished_at_step == after.version,
                f"listMessages: {mine.to_dict()!r}",
            )
        print(f"message {sent.id}: {mine.summary} (task completed at version {after.version})")


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: openapi_client_check.py BASE_URL API_KEY", file=sys.stderr)
        return 2
    try:
        run(sys.argv[1], sys.argv[2])
    except CheckFailed as failure:
        print(f"openapi client check FAILED: {failure}", file=sys.stderr)
        return 1
    print("openapi client check: all calls through the generated client passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
