"""The service's OpenAPI document read by LangChain's OpenAPI tooling, then a route called
through it (scripts/openapi-langchain starts the server and runs this).

    python scripts/openapi_langchain_check.py BASE KEY [PUBLIC_URL]

1. The document parses as OpenAPI 3.1 with openapi-pydantic, strictly (LangChain's
   `OpenAPISpec.parse_obj` drops whatever does not validate and carries on, so a clean strict
   parse is checked first), then as LangChain's `OpenAPISpec.from_url`, with nothing dropped.
2. `APIOperation.from_openapi_spec` (langchain-community) builds every operation, and
   `openapi_spec_to_openai_fn` (langchain-classic) turns the spec into one function per
   operationId and a caller.
3. Through that caller — which sends each call to `servers[0].url` + the path — `createTask`
   creates a task and `getTask` reads it back; then `getState` reads its state once a
   worker has run it.
4. What Dify's importer does: fetch the document, take `servers[0].url`, call a route there.
   With PUBLIC_URL (the server's `--public-url`), `servers[0].url` is it (without its trailing
   `/`) even when the document is asked for with another Host.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import urllib.request
import warnings


def fail(message: str) -> None:
    print(f"openapi-langchain check FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def fetch_json(url: str, key: str | None = None, host: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if host:
        request.add_header("Host", host)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def main() -> None:
    base, key = sys.argv[1], sys.argv[2]
    public = sys.argv[3].rstrip("/") if len(sys.argv) > 3 else None
    document_url = f"{base}/openapi.json"
    _, raw = fetch_json(document_url)
    if public is not None:
        _, elsewhere = fetch_json(document_url, host="agents.example.invalid")
        if elsewhere["servers"] != [{"url": public}] or raw["servers"] != [{"url": public}]:
            fail(f"servers is {elsewhere['servers']} (and {raw['servers']}), not the public URL {public}")
        print(f"openapi-langchain: servers[0].url is the public URL {public}, whatever the Host")

    # 1. Strict parse, then LangChain's.
    from openapi_pydantic import OpenAPI

    try:
        OpenAPI.model_validate(raw)
    except Exception as error:  # noqa: BLE001 - any refusal is the finding
        fail(f"openapi-pydantic refuses the document: {error}")
    warnings.simplefilter("ignore", DeprecationWarning)
    logged: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                logged.append(record.getMessage())

    logging.getLogger("langchain_community").addHandler(Collect())
    from langchain_community.tools import APIOperation
    from langchain_community.utilities.openapi import OpenAPISpec

    spec = OpenAPISpec.from_url(document_url)
    if logged:
        fail(f"OpenAPISpec warned: {logged}")
    if spec.base_url != raw["servers"][0]["url"]:
        fail(f"spec.base_url {spec.base_url!r} is not servers[0].url {raw['servers'][0]['url']!r}")
    if not spec.base_url.startswith("http://127.0.0.1:"):
        fail(f"servers[0].url {spec.base_url!r} is not where the document was fetched ({base})")
    paths = spec.paths or {}
    if sorted(paths) != sorted(raw["paths"]):
        fail(f"OpenAPISpec kept {len(paths)} of {len(raw['paths'])} paths")

    # 2. Every operation, and the functions.
    operations = []
    for path, item in raw["paths"].items():
        for method in item:
            try:
                operation = APIOperation.from_openapi_spec(spec, path, method)
            except Exception as error:  # noqa: BLE001
                fail(f"APIOperation refuses {method.upper()} {path}: {error}")
            operations.append(operation)
    from langchain_classic.chains.openai_functions.openapi import openapi_spec_to_openai_fn

    # Deprecated in langchain-classic (its import installs a filter that shows the warning).
    warnings.filterwarnings("ignore", message=".*openapi_spec_to_openai_fn.*")
    functions, call_api = openapi_spec_to_openai_fn(spec)
    names = {function["name"] for function in functions}
    wanted = {
        operation["operationId"]
        for item in raw["paths"].values()
        for operation in item.values()
    }
    if names != wanted:
        fail(f"functions {sorted(names ^ wanted)} differ from the operationIds")
    create = next(f for f in functions if f["name"] == "createTask")
    if "json" not in create["parameters"]["properties"]:
        fail(f"createTask takes no JSON body: {create}")
    print(
        f"openapi-langchain: {len(operations)} operations as APIOperation, "
        f"{len(functions)} functions; base URL {spec.base_url}"
    )

    # 3. Calls through LangChain's caller.
    auth = {"Authorization": f"Bearer {key}"}
    body = {"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": 2}}
    response = call_api("createTask", {"json": body}, headers=auth)
    if response.status_code != 201:
        fail(f"createTask answered {response.status_code}: {response.text}")
    task = response.json()["task"]
    if task["skill"] != "warehouse" or task["model"] != "oracle":
        fail(f"createTask answered {task}")
    response = call_api("getTask", {"path_params": {"id": task["id"]}}, headers=auth)
    if response.status_code != 200 or response.json()["id"] != task["id"]:
        fail(f"getTask answered {response.status_code}: {response.text}")
    deadline = time.monotonic() + 60
    while response.json()["status"] == "running":
        if time.monotonic() > deadline:
            fail(f"task {task['id']} still running after 60 s")
        time.sleep(0.2)
        response = call_api("getTask", {"path_params": {"id": task["id"]}}, headers=auth)
    if response.json()["status"] != "completed":
        fail(f"the task ended {response.json()['status']}: {response.text}")
    response = call_api("getState", {"path_params": {"id": task["id"]}}, headers=auth)
    if response.status_code != 200 or "inventory" not in response.json():
        fail(f"getState answered {response.status_code}: {response.text}")
    response = call_api("getTask", {"path_params": {"id": "no-such-task"}}, headers=auth)
    if response.status_code != 404:
        fail(f"getTask of a missing task answered {response.status_code}")
    print(f"openapi-langchain: createTask, getTask and getState through LangChain's caller (task {task['id']})")

    # 4. A Dify-like reader: servers[0].url, unconditionally.
    _, doc = fetch_json(document_url)
    server = doc["servers"][0]["url"]
    status, read = fetch_json(f"{server}/v1/tasks/{task['id']}", key)
    if status != 200 or read["id"] != task["id"]:
        fail(f"GET {server}/v1/tasks/{task['id']} answered {status}: {read}")
    print(f"openapi-langchain: a Dify-like reader reached the task at servers[0].url {server}")


if __name__ == "__main__":
    main()
