#!/usr/bin/env python3
"""Checks the links of the built guide and of the Markdown files GitHub renders.

    scripts/check-links.py --book target/book --book-src docs README.md CHANGELOG.md docs

HTML files under --book: every relative href/src must name a file of the book, and every #anchor
an id in that file. A link that leaves the book (README.md, ARCHITECTURE.md, CHANGELOG.md) is
resolved against --book-src in the repository instead, as GitHub would (mdBook writes such a
`../X.md` link as `../X.html`; the checker looks for `X.md`): those links work where the book is
read next to the repository, as on GitHub, not in a copy of target/book alone.

Markdown files and directories (searched for *.md) given as arguments: every relative link and
image must name a file of the repository, and every #anchor a heading of the target Markdown file
(GitHub's heading ids). External http(s) links are never fetched (there is no network in CI);
they are counted and, with --list-external, listed.

Exit status 1, with one line per broken link naming the file and the link, when any is broken.
Standard library only.
"""
import argparse
import html.parser
import os
import re
import sys
import urllib.parse

EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, javascript: …


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (line, url)

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            if (name == "href" and tag in ("a", "link", "area")) or (
                name == "src" and tag in ("img", "script", "iframe", "source")
            ):
                self.links.append((self.getpos()[0], value))


def slug(title):
    """GitHub's (and mdBook's) id of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", title)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.strip():
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def markdown_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        match = re.match(r"(`{3,}|~{3,})", stripped)
        if match:
            if fence is None:
                fence = match.group(1)
                continue
            closing = stripped.strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                fence = None
                continue
        if fence is None:
            yield number, line


_anchor_cache = {}


def markdown_anchors(path):
    if path not in _anchor_cache:
        seen = {}
        ids = set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in markdown_lines(text):
            match = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not match:
                continue
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            ids.add(base if count == 0 else f"{base}-{count}")
        for match in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', text):
            ids.add(match.group(1))
        _anchor_cache[path] = ids
    return _anchor_cache[path]


def markdown_links(text):
    for number, line in markdown_lines(text):
        line = re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)  # inline code
        for match in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            yield number, match.group(1)
        for match in re.finditer(r"^\s*\[[^\]]+\]:\s*(\S+)", line):
            yield number, match.group(1)
    # A link whose text wraps onto the next line: [text\ntext](target)
    joined = "\n".join(line for _, line in markdown_lines(text))
    for match in re.finditer(r"\[[^\[\]`]*\n[^\[\]`]*\]\(([^)\s]+)\)", joined):
        yield joined.count("\n", 0, match.start()) + 2, match.group(1)


class Checker:
    def __init__(self, repo, list_external):
        self.repo = os.path.realpath(repo)
        self.broken = []
        self.external = []
        self.checked = 0
        self.list_external = list_external

    def report(self, where, url, why):
        self.broken.append(f"{where}: broken link `{url}`: {why}")

    def check_markdown_target(self, where, base_dir, url):
        parsed = urllib.parse.urlsplit(url)
        path = urllib.parse.unquote(parsed.path)
        target = os.path.normpath(os.path.join(base_dir, path)) if path else None
        if target is not None:
            if not os.path.realpath(target).startswith(self.repo):
                return self.report(where, url, "leaves the repository")
            if not os.path.exists(target):
                return self.report(where, url, f"{os.path.relpath(target, self.repo)} does not exist")
        if parsed.fragment and target is not None:
            file = target
            if os.path.isdir(file) or not file.endswith(".md"):
                return
            if parsed.fragment not in markdown_anchors(file):
                return self.report(where, url, f"no heading with the id `{parsed.fragment}` in {os.path.relpath(file, self.repo)}")

    def check_markdown(self, path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, url in markdown_links(text):
            self.checked += 1
            where = f"{os.path.relpath(path, self.repo)}:{line}"
            if EXTERNAL.match(url):
                self.external.append((where, url))
                continue
            if url.startswith("#"):
                self.check_fragment_same(path, where, url)
            else:
                self.check_markdown_target(where, os.path.dirname(os.path.abspath(path)), url)

    def check_fragment_same(self, path, where, url):
        fragment = url[1:]
        if fragment and fragment not in markdown_anchors(os.path.abspath(path)):
            self.report(where, url, f"no heading with the id `{fragment}` in {os.path.relpath(path, self.repo)}")

    def check_book(self, book, book_src):
        book = os.path.abspath(book)
        pages = {}
        for root, _, files in os.walk(book):
            for name in files:
                if name.endswith(".html"):
                    page = Page()
                    full = os.path.join(root, name)
                    with open(full, encoding="utf-8") as f:
                        page.feed(f.read())
                    pages[os.path.normpath(full)] = page
        for full, page in sorted(pages.items()):
            rel_page = os.path.relpath(full, self.repo)
            for line, url in page.links:
                self.checked += 1
                where = f"{rel_page}:{line}"
                if EXTERNAL.match(url):
                    self.external.append((where, url))
                    continue
                parsed = urllib.parse.urlsplit(url)
                path = urllib.parse.unquote(parsed.path)
                if not path:
                    if parsed.fragment and parsed.fragment not in page.ids:
                        self.report(where, url, f"no element with the id `{parsed.fragment}`")
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(full), path))
                if path.endswith("/"):
                    target = os.path.join(target, "index.html")
                if not (target + os.sep).startswith(book + os.sep):
                    # Outside the book: a file of the repository, resolved from the book's source.
                    source = os.path.normpath(os.path.join(os.path.abspath(book_src), os.path.relpath(target, book)))
                    # mdBook renders every `.md` link as `.html`, also one that leaves the book.
                    if source.endswith(".html") and not os.path.exists(source) and os.path.exists(source[:-5] + ".md"):
                        source = source[:-5] + ".md"
                    source_url = os.path.relpath(source, os.path.dirname(source)) + (f"#{parsed.fragment}" if parsed.fragment else "")
                    self.check_markdown_target(where, os.path.dirname(source), source_url)
                    continue
                if not os.path.exists(target):
                    self.report(where, url, f"{os.path.relpath(target, self.repo)} does not exist")
                    continue
                if parsed.fragment and target.endswith(".html"):
                    ids = pages[target].ids if target in pages else set()
                    if parsed.fragment not in ids:
                        self.report(where, url, f"no element with the id `{parsed.fragment}` in {os.path.relpath(target, self.repo)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--book", help="the built book (HTML)")
    parser.add_argument("--book-src", default="docs", help="the book's Markdown sources")
    parser.add_argument("--repo", default=".", help="the repository root")
    parser.add_argument("--list-external", action="store_true", help="list the external links (never fetched)")
    parser.add_argument("markdown", nargs="*", help="Markdown files or directories")
    args = parser.parse_args()
    checker = Checker(args.repo, args.list_external)
    if args.book:
        checker.check_book(args.book, args.book_src)
        # Every page of the sources is a chapter: one left out of SUMMARY.md is never built.
        summary = os.path.join(args.book_src, "SUMMARY.md")
        with open(summary, encoding="utf-8") as f:
            listed = {os.path.normpath(url.split("#")[0]) for _, url in markdown_links(f.read())}
        for root, _, files in os.walk(args.book_src):
            for name in sorted(files):
                page = os.path.normpath(os.path.relpath(os.path.join(root, name), args.book_src))
                if name.endswith(".md") and name != "SUMMARY.md" and page not in listed:
                    checker.broken.append(f"{summary}: {page} is not listed, so the book leaves it out")
    for item in args.markdown:
        if os.path.isdir(item):
            for root, _, files in os.walk(item):
                for name in sorted(files):
                    if name.endswith(".md"):
                        checker.check_markdown(os.path.join(root, name))
        else:
            checker.check_markdown(item)
    if args.list_external:
        for where, url in checker.external:
            print(f"{where}: external, not fetched: {url}")
    for line in checker.broken:
        print(line, file=sys.stderr)
    external = len({url for _, url in checker.external})
    if checker.broken:
        print(f"check-links: {len(checker.broken)} broken link(s) of {checker.checked} checked", file=sys.stderr)
        return 1
    print(f"check-links: {checker.checked} links checked, all resolve ({external} distinct external links not fetched)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
