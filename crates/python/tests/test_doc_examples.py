"""The ```python blocks of README.md and the guide (docs/**/*.md), run against the installed
package the way scripts/doc-examples runs the shell blocks.

* The blocks of a page run in order in one namespace, in a fresh directory holding a copy of
  the repository's skills/ (so `skills/warehouse` and `skillstate.db` mean what they say), so
  names carry from one block to the next.
* `<!-- doc-example python-setup: CODE -->` (one or more lines, anywhere in the page) runs CODE
  at that point, unseen by the reader: the names a fragment assumes (`answer_text`,
  `call_my_llm`). CODE sees `fixtures` (doc_fixtures.py: stand-in models answering from the
  prompt, no paid model) and `needs("module", …)`, which leaves the rest of the page compiled
  only when a module is not installed.
* `<!-- doc-example no-run: REASON -->` right before a block leaves it compiled only, as does a
  block importing a module this environment does not have (the optional `langchain-core` and
  `langgraph` are in requirements-test.txt, so those blocks run). On the pages of MUST_RUN, a
  block is left out only by a `no-run` or a `needs(…)` that found a module missing.
* Every block, run or not, is compiled: a syntax error fails.

The summary at the end of the pytest run says how many blocks ran and how many were only
compiled, with the reasons."""

import ast
import importlib.util
import os
import pathlib
import re
import shutil
import textwrap
import traceback

import pytest

import doc_fixtures
from conftest import DOC_BLOCKS, REPO

PYTHON_LANGS = {"python", "py", "python3"}
DIRECTIVE = re.compile(r"<!--\s*doc-example\s+(no-run|setup|teardown|python-setup)\s*:\s*(.*?)\s*-->", re.S)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)(.*)$")
# Pages whose blocks all run but those a `no-run` comment leaves out.
MUST_RUN = {"docs/python.md"}


class Item:
    def __init__(self, page, line, kind, code, reason=None):
        self.page, self.line, self.kind, self.code, self.reason = page, line, kind, code, reason

    def compiled(self):
        # Blank lines first, so a traceback names the page's own line numbers.
        label = f"{self.page} (python-setup)" if self.kind == "setup" else self.page
        return compile("\n" * (self.line - 1) + self.code, label, "exec")


def pages():
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def parse(path):
    """The page's python blocks and python-setup comments, in order."""
    rel = path.relative_to(REPO).as_posix()
    lines = path.read_text(encoding="utf-8").split("\n")
    items, pending, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("<!--") and "doc-example" in line:
            j, chunk = i, line
            while "-->" not in chunk and j + 1 < len(lines):
                j += 1
                chunk += "\n" + lines[j]
            d = DIRECTIVE.search(chunk)
            assert d, f"{rel}:{i + 1}: a doc-example comment must read `<!-- doc-example no-run|setup|teardown|python-setup: ... -->`"
            kind, body = d.group(1), d.group(2)
            if kind == "no-run":
                pending = body.replace("\n", " ")
            elif kind == "python-setup":
                # One line after the colon, or lines of their own from the next line on.
                raw = chunk.split("python-setup", 1)[1].split(":", 1)[1].rsplit("-->", 1)[0]
                first, _, rest = raw.partition("\n")
                if first.strip():
                    start, code = i + 1, raw.strip()
                else:
                    start, code = i + 2, textwrap.dedent(rest).strip("\n")
                items.append(Item(rel, start, "setup", code + "\n"))
            i = j + 1
            continue
        m = FENCE.match(line)
        if m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            j = i + 1
            while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence)) and lines[j].strip().strip(fence[0]) == ""):
                j += 1
            if lang in PYTHON_LANGS:
                body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[i + 1 : j]]
                items.append(Item(rel, i + 2, "block", "\n".join(body) + "\n", reason=pending))
            pending = None
            i = j + 1
            continue
        i += 1
    return items


ALL = [(path, parse(path)) for path in pages()]
BLOCKS = [item for _, items in ALL for item in items if item.kind == "block"]
RUNNABLE = [(path, items) for path, items in ALL if any(item.kind == "block" for item in items)]


def missing_imports(code):
    """The top-level modules the code imports that are not installed here."""
    wanted = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            wanted.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted.add(node.module.split(".")[0])
    return sorted(name for name in wanted if importlib.util.find_spec(name) is None)


class NotHere(Exception):
    """Raised by `needs`: a module the rest of the page needs is not installed."""


def needs(*modules):
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if absent:
        raise NotHere(f"needs {', '.join(absent)}, not installed here")


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_every_python_block_compiles(block):
    try:
        block.compiled()
    except SyntaxError as error:
        pytest.fail(f"{block.page}:{error.lineno}: {error.msg}\n{error.text or ''}")


def test_the_guide_has_python_examples():
    # The extraction finds the blocks at all: python.md has several.
    assert sum(1 for b in BLOCKS if b.page == "docs/python.md") >= 4


@pytest.mark.parametrize("path,items", RUNNABLE, ids=[p.relative_to(REPO).as_posix() for p, _ in RUNNABLE])
def test_python_examples_run(path, items, tmp_path, monkeypatch, request):
    import skillstate

    shutil.copytree(REPO / "skills", tmp_path / "skills")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc_example__", "fixtures": doc_fixtures, "needs": needs}
    record = request.config.stash[DOC_BLOCKS]
    left_out = None  # why the rest of the page is compiled only
    try:
        for item in items:
            code = item.compiled()
            where = f"{item.page}:{item.line}"
            if item.kind == "block":
                reason = item.reason or left_out
                if reason is None:
                    absent = missing_imports(item.code)
                    if absent:
                        reason = f"needs {', '.join(absent)}, not installed here"
                        # An optional package is declared with needs(…) in a python-setup.
                        assert item.page not in MUST_RUN, f"{where}: every block of {item.page} runs, but this one {reason}"
                if reason is not None:
                    record.append((where, reason))
                    continue
            elif left_out is not None:
                continue
            try:
                exec(code, namespace)
            except NotHere as why:
                left_out = str(why)
                continue
            except Exception:
                kind = "the python-setup at" if item.kind == "setup" else "the block at"
                pytest.fail(f"{kind} {where} failed:\n{traceback.format_exc()}", pytrace=False)
            if item.kind == "block":
                record.append((where, None))
    finally:
        for value in list(namespace.values()):
            if isinstance(value, skillstate.Runtime):
                value.close()
