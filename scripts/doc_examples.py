#!/usr/bin/env python3
"""Runs the shell examples of README.md and the guide (docs/**/*.md) against a skillstate binary.

Called by scripts/doc-examples (which builds the release binary first); Python's standard library
only. The convention, in short (docs/testing.md has it in full):

* A ```sh (or bash, shell) block is run with bash; every command of it must succeed (the rule of
  `set -e`: a failing command fails the block, with its line).
* A ```console block holds `$ command` lines (`> ` continues one) each followed by its expected
  output (stdout and stderr together). `[..]` matches any text within a line, `...` alone on a
  line any number of lines, `[ID]` an id (task, batch, key: letters, digits, `-`, `_`), `[TIME]`
  a date and time, `[N]` a number. A last line `? 1` expects that exit status instead of 0.
* The blocks of a page run in order in one bash process, in a fresh directory under
  target/doc-examples/ (so `cargo` finds the workspace) holding copies of the repository's
  skills/ and boards/, with the binary first on PATH and HOME inside it, so files and shell
  variables ($TASK) carry from one block to the next; processes a block starts in the
  background are stopped when the page ends, and one that exits with a failure fails the page.
* An HTML comment right before a block annotates it:
  `<!-- doc-example no-run: REASON -->` leaves the block out (REASON is printed; its `skillstate`
  commands' subcommands and flags are still checked against the binary's --help);
  `<!-- doc-example setup: COMMANDS -->` (one or more lines) runs hidden commands at that point;
  `<!-- doc-example teardown: COMMANDS -->` runs hidden commands when the page ends.
  A setup or teardown comment may stand anywhere in the page.
* ```python blocks and `<!-- doc-example python-setup: CODE -->` comments are not run here:
  crates/python/tests/test_doc_examples.py runs them under pytest (scripts/test-python).

  python3 scripts/doc_examples.py [--bin DIR] [--timeout S] [PAGE.md ...]
"""

import argparse
import os
import shlex
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_LANGS = {"sh", "bash", "shell"}
# python-setup belongs to the ```python blocks, which crates/python/tests/test_doc_examples.py
# runs under pytest; it is skipped here.
DIRECTIVE = re.compile(r"<!--\s*doc-example\s+(no-run|setup|teardown|python-setup)\s*:\s*(.*?)\s*-->", re.S)
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)(.*)$")


class Step:
    def __init__(self, page, line, kind, script, expected=None, status=0, reason=None):
        self.page, self.line, self.kind = page, line, kind  # kind: sh, console, setup, teardown
        self.script, self.expected, self.status, self.reason = script, expected, status, reason


def parse_console(lines, first_line):
    """The `$ command` / expected output pairs of a console block: [(line, command, expected, status)]."""
    items, i = [], 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ ") and line.strip() != "$":
            raise ValueError(f"{first_line + i}: a console block starts each command with `$ `")
        cmd_line = first_line + i
        cmd = [line[2:]]
        i += 1
        while i < len(lines) and lines[i].startswith("> "):
            cmd.append(lines[i][2:])
            i += 1
        out = []
        while i < len(lines) and not lines[i].startswith("$ ") and lines[i].strip() != "$":
            out.append(lines[i])
            i += 1
        status = 0
        if out and re.fullmatch(r"\? \d+", out[-1].strip()):
            status = int(out.pop().strip()[2:])
        items.append((cmd_line, "\n".join(cmd), out, status))
    return items


def parse_page(path):
    rel = os.path.relpath(path, ROOT)
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    steps, teardown, skipped = [], [], []
    pending = None  # the no-run reason of the next block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if line.lstrip().startswith("<!--") and "doc-example" in line:
            j, chunk = i, line
            while "-->" not in chunk and j + 1 < len(lines):
                j += 1
                chunk += "\n" + lines[j]
            d = DIRECTIVE.search(chunk)
            if not d:
                raise ValueError(f"{rel}:{i + 1}: a doc-example comment must read `<!-- doc-example no-run|setup|teardown|python-setup: ... -->`")
            kind, body = d.group(1), d.group(2)
            if kind == "python-setup":
                pass
            elif kind == "no-run":
                if not body:
                    raise ValueError(f"{rel}:{i + 1}: no-run needs a reason")
                pending = (body.replace("\n", " "), i + 1)
            elif kind == "setup":
                steps.append(Step(rel, i + 1, "setup", body))
            else:
                teardown.append(Step(rel, i + 1, "teardown", body))
            i = j + 1
            continue
        if m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            start = i + 1
            j = i + 1
            while j < len(lines) and not (lines[j].strip().startswith(fence[0] * len(fence)) and lines[j].strip().strip(fence[0]) == ""):
                j += 1
            body = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[start:j]]
            if lang in SHELL_LANGS or lang == "console":
                if pending:
                    skipped.append((rel, start, pending[0], body if lang in SHELL_LANGS else
                                    [l[2:] for l in body if l.startswith(("$ ", "> "))]))
                elif lang == "console":
                    try:
                        items = parse_console(body, start + 1)
                    except ValueError as e:
                        raise ValueError(f"{rel}:{e}") from None
                    for cmd_line, cmd, out, status in items:
                        steps.append(Step(rel, cmd_line, "console", cmd, out, status))
                else:
                    steps.append(Step(rel, start, "sh", "\n".join(body) + "\n"))
            pending = None
            i = j + 1
            continue
        if pending and line.strip() and i + 1 - pending[1] > 1:
            raise ValueError(f"{rel}:{pending[1]}: a no-run comment must come right before a code block")
        i += 1
    if pending:
        raise ValueError(f"{rel}:{pending[1]}: a no-run comment must come right before a code block")
    return steps, teardown, skipped


PLACEHOLDERS = {
    "[..]": ".*?",
    "[ID]": r"[A-Za-z0-9_][A-Za-z0-9_.:-]*",
    "[TIME]": r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?",
    "[N]": r"-?\d+(?:\.\d+)?",
}
PLACEHOLDER = re.compile(r"\[\.\.\]|\[ID\]|\[TIME\]|\[N\]")


def line_regex(expected):
    parts, pos = [], 0
    for m in PLACEHOLDER.finditer(expected):
        parts.append(re.escape(expected[pos:m.start()]))
        parts.append(PLACEHOLDERS[m.group(0)])
        pos = m.end()
    parts.append(re.escape(expected[pos:]))
    return re.compile("".join(parts) + r"\Z")


def matches(expected, actual):
    """trycmd-like: `...` lines match any lines, placeholders match within a line."""
    exp = [l.rstrip() for l in expected]
    act = [l.rstrip() for l in actual]
    while exp and not exp[-1]:
        exp.pop()
    while act and not act[-1]:
        act.pop()
    memo = {}

    def go(i, j):
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(exp):
            r = j == len(act)
        elif exp[i].strip() == "...":
            r = any(go(i + 1, k) for k in range(j, len(act) + 1))
        else:
            r = j < len(act) and bool(line_regex(exp[i]).match(act[j])) and go(i + 1, j + 1)
        memo[key] = r
        return r

    return go(0, 0)


class Shell:
    """One bash process per page: each step is sourced in it, so variables carry over."""

    def __init__(self, cwd, env):
        self.dir = cwd
        self.ctl_r, ctl_w = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(ctl_w,),
            start_new_session=True, text=True)
        os.close(ctl_w)
        self.ctl = os.fdopen(self.ctl_r, "r")
        self.n = 0
        # Every process a block starts in the background is remembered (the DEBUG trap, inherited
        # into sourced files by set -T, sees each new $!); one that has exited with a failure
        # fails the block it was found after (a server refusing a renamed flag, say).
        self.send(f"exec 9>&{ctl_w} {ctl_w}>&-\nset -o pipefail -T\n__doc_bgs=; __doc_seen=\n"
                  "__doc_bg() { local p s; for p in $__doc_bgs; do case \" $__doc_seen \" in *\" $p \"*) continue;; esac\n"
                  "  if ! kill -0 $p 2>/dev/null; then wait $p 2>/dev/null; s=$?; __doc_seen=\"$__doc_seen $p\"\n"
                  "    if [ $s -ne 0 ] && [ $s -ne 127 ]; then echo \"a command started in the background (pid $p) exited with status $s\" >> \"$1\"; fi\n"
                  "  fi; done; }\n")

    def send(self, text):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, script, timeout, errexit):
        """Runs script; returns (status, output, the failing commands)."""
        self.n += 1
        base = os.path.join(self.dir, ".doc-example")
        os.makedirs(base, exist_ok=True)
        src, out, err = (os.path.join(base, f"{self.n}.{x}") for x in ("sh", "out", "err"))
        self.out_path = out
        with open(src, "w") as f:
            f.write(script)
        open(err, "w").close()
        trap = f"trap 'echo \"line $LINENO (status $?): $BASH_COMMAND\" >> {err}' ERR\n" if errexit else "trap - ERR\n"
        track = "trap 'case \" $__doc_bgs \" in *\" $! \"*) ;; *) [ -n \"$!\" ] && __doc_bgs=\"$__doc_bgs $!\";; esac' DEBUG\n"
        self.send(f"{trap}{track}source {src} </dev/null >{out} 2>&1 9>&-; __doc_s=$?; trap - DEBUG ERR\n"
                  f"__doc_bg {err}; echo \"__done__ $__doc_s\" >&9\n")
        import select
        ready, _, _ = select.select([self.ctl], [], [], timeout)
        if not ready:
            return None, open(out, errors="replace").read(), []
        status_line = self.ctl.readline()
        if not status_line:
            return -1, open(out, errors="replace").read(), ["the shell exited (an `exit` in the block?)"]
        status = int(status_line.split()[1])
        failed = [l for l in open(err).read().splitlines() if l and f"source {src}" not in l]
        if not errexit:  # a console command: only what ran in the background counts
            failed = [l for l in failed if l.startswith("a command started in the background")]
        return status, open(out, errors="replace").read(), failed

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 5
        while time.time() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def excerpt(text, n=40):
    lines = text.rstrip("\n").split("\n")
    if len(lines) > n:
        lines = lines[:n // 2] + [f"… ({len(lines) - n} lines) …"] + lines[-n // 2:]
    return "\n".join("    | " + l for l in lines)


def run_page(path, bindir, timeout, keep):
    steps, teardown, skipped = parse_page(path)
    rel = os.path.relpath(path, ROOT)
    result = {"page": rel, "run": 0, "checked": 0, "skipped": skipped, "failures": [], "seconds": 0.0}
    if not steps:
        return result
    # Inside the repository's target/: `cargo` commands of the examples find the workspace.
    base = os.path.join(ROOT, "target", "doc-examples")
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix=rel.replace("/", "_").removesuffix(".md") + ".", dir=base)
    for d in ("skills", "boards"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(work, d), symlinks=True)
    home = os.path.join(work, ".home")
    os.makedirs(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_") or k == "SKILLSTATE_TEST_POSTGRES_URL"}
    env.update(HOME=home, PATH=bindir + os.pathsep + env.get("PATH", ""), SKILLSTATE_REPO=ROOT,
               NO_COLOR="1", TERM="dumb", COLUMNS="100")
    # npx (the file-librarian skill's MCP server) keeps its downloads in the real npm cache.
    env.setdefault("npm_config_cache", os.path.join(os.path.expanduser("~"), ".npm"))
    started = time.time()
    shell = Shell(work, env)
    last_out = None
    try:
        for step in steps:
            errexit = step.kind != "console"
            status, out, failed = shell.run(step.script if step.script.endswith("\n") else step.script + "\n",
                                            timeout, errexit)
            where = f"{step.page}:{step.line}"
            last_out = shell.out_path
            if step.kind in ("sh", "console"):
                result["run"] += 1
            problem = None
            if status is None:
                problem = f"timed out after {timeout} s"
            elif step.kind == "console":
                if failed:
                    problem = "failed: " + "; ".join(failed)
                elif status != step.status:
                    problem = f"exit status {status}, expected {step.status}"
                elif not matches(step.expected, out.split("\n")):
                    problem = "output differs from the expected output:\n" + excerpt("\n".join(step.expected) or "(no output)") + "\n  actual:"
                else:
                    result["checked"] += 1
            elif failed or status != 0:
                problem = "failed: " + ("; ".join(failed) if failed else f"exit status {status}")
            if problem:
                label = {"setup": "hidden setup", "sh": "block", "console": "command"}[step.kind]
                cmd = "  $ " + step.script.strip().replace("\n", "\n  > ") + "\n" if step.kind == "console" else ""
                msg = f"{where}: {label} {problem}\n" + cmd + excerpt(out or "(no output)")
                result["failures"].append(msg)
                break  # the later blocks depend on this one
        if not result["failures"]:
            # A server the last blocks started in the background has had time to refuse its flags.
            status, out, failed = shell.run("sleep 0.5\n", timeout, True)
            if failed:
                result["failures"].append(f"{rel}: at the end of the page: " + "; ".join(failed)
                                          + "\n  the output of the last block:\n" + excerpt(open(last_out, errors="replace").read() or "(no output)"))
        for step in teardown:
            shell.run(step.script + "\n", timeout, False)
    finally:
        shell.close()
        result["seconds"] = time.time() - started
        if keep or result["failures"]:
            result["dir"] = work
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def invocations(body):
    """The `skillstate` command lines of a block: [(words after the binary)]; `cargo run … --`
    counts as the binary, continuation lines are joined, comments dropped."""
    text = "\n".join(body).replace("\\\n", " ")
    found = []
    for line in text.split("\n"):
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError:
            continue
        command = []
        for token in tokens + [";"]:
            if token in (";", "&&", "||", "|", "&", "(", ")", "$(", ")"):
                if command:
                    found.append(command)
                command = []
                continue
            command.append(token)
    calls = []
    for command in found:
        for i, token in enumerate(command):
            if os.path.basename(token) == "skillstate" and (i == 0 or command[i - 1] not in ("-p", "--package", "--bin")):
                calls.append(command[i + 1:])
                break
            if token == "cargo" and "run" in command[i:] and "--" in command[i:] and "skillstate" in command[i:]:
                calls.append(command[command.index("--", i) + 1:])
                break
    return calls


class HelpCache:
    """`skillstate … --help`, once per subcommand path."""

    def __init__(self, binary):
        self.binary, self.cache = binary, {}

    def help(self, path):
        if path not in self.cache:
            p = subprocess.run([self.binary, *path, "--help"], capture_output=True, text=True, timeout=30)
            self.cache[path] = p.stdout if p.returncode == 0 else None
        return self.cache[path]


def subcommands(help_text):
    names, inside = set(), False
    for line in help_text.split("\n"):
        if line.startswith("Commands:"):
            inside = True
            continue
        if inside:
            if not line.startswith("  "):
                break
            names.add(line.split()[0])
    return names


def check_flags(call, helps):
    """What of a `skillstate` call its --help does not know: the subcommands, then each flag
    (checked against the help of the command and of each command above it)."""
    path, words = (), list(call)
    while words:
        word = words.pop(0)
        known = subcommands(helps.help(path) or "")
        if word.startswith("-"):
            # An option before the subcommand (`--db FILE`): its value is not a command.
            if "=" not in word and words and not words[0].startswith("-") and words[0] not in known:
                words.pop(0)
            continue
        if word in known:
            path += (word,)
        elif known and not any(w in known for w in words):
            return f"`skillstate {' '.join(path + (word,))}`: no such command"
        else:
            break
    texts = "\n".join(helps.help(path[:i]) or "" for i in range(len(path) + 1))
    problems = []
    for word in call:
        if word.startswith("--") and len(word) > 2:
            flag = word.split("=", 1)[0]
            if not re.search(re.escape(flag) + r"(?![\w-])", texts):
                problems.append(f"`skillstate {' '.join(path)}` has no flag {flag}")
    return "; ".join(problems) or None


def pages(args):
    if args:
        return [os.path.abspath(p) for p in args]
    found = [os.path.join(ROOT, "README.md")]
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "docs")):
        dirnames.sort()
        found += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release"),
                    help="the directory holding the skillstate binary, first on PATH (default target/release)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds each block may take (default 120)")
    ap.add_argument("--keep", action="store_true", help="keep every page's directory (a failing page's is always kept)")
    ap.add_argument("pages", nargs="*", help="Markdown files (default README.md and docs/**/*.md)")
    args = ap.parse_args()
    if not os.access(os.path.join(args.bin, "skillstate"), os.X_OK):
        sys.exit(f"doc-examples: no skillstate binary in {args.bin} (cargo build --release -p skillstate)")
    try:
        parsed = {p: parse_page(p) for p in pages(args.pages)}
    except ValueError as e:
        sys.exit(f"doc-examples: {e}")
    # The directories of the last run's failed pages go now.
    shutil.rmtree(os.path.join(ROOT, "target", "doc-examples"), ignore_errors=True)
    total = {"run": 0, "checked": 0, "skipped": 0, "failed": 0}
    results = []
    t0 = time.time()
    for p in parsed:
        r = run_page(p, os.path.abspath(args.bin), args.timeout, args.keep)
        results.append(r)
        if r["run"] or r["skipped"] or r["failures"]:
            state = "FAILED" if r["failures"] else "ok"
            print(f"{r['page']}: {state}: {r['run']} run, {r['checked']} checked against their output, "
                  f"{len(r['skipped'])} not run ({r['seconds']:.1f} s)", flush=True)
        for f in r["failures"]:
            print("  " + f.replace("\n", "\n  "), flush=True)
            print(f"  (the page ran in {r['dir']})", flush=True)
        total["run"] += r["run"]
        total["checked"] += r["checked"]
        total["skipped"] += len(r["skipped"])
        total["failed"] += bool(r["failures"])
    # The blocks not run still name real commands and flags: each `skillstate` call of them is
    # held against the binary's --help, so a renamed flag fails there too.
    helps = HelpCache(os.path.join(os.path.abspath(args.bin), "skillstate"))
    checked_calls = 0
    if total["skipped"]:
        print(f"\nnot run ({total['skipped']}; their skillstate commands' flags checked against --help):")
        for r in results:
            for page, line, reason, body in r["skipped"]:
                print(f"  {page}:{line}: {reason}")
                for call in invocations(body):
                    checked_calls += 1
                    problem = check_flags(call, helps)
                    if problem:
                        print(f"    FAILED: {problem}")
                        total["failed"] += 1
    print(f"\ndoc-examples: {total['run']} blocks and commands run, {total['checked']} checked against their "
          f"expected output, {total['skipped']} not run ({checked_calls} skillstate commands in them "
          f"checked against --help), {total['failed']} failure(s) "
          f"({time.time() - t0:.0f} s)")
    sys.exit(1 if total["failed"] else 0)


if __name__ == "__main__":
    main()
