#!/usr/bin/env python3
"""Fail when a link in the repository's Markdown or rustdoc points nowhere.

Checks every tracked `*.md` file: each relative link `[text](path)`, `[text](path#anchor)` or
`[text](#anchor)`, also when its text wraps a line, and each reference definition
`[name]: path` must name a file or folder of the repository and, when it has an anchor, a
heading of that Markdown file (GitHub's slugs: lower case, spaces to hyphens, punctuation
other than `-` and `_` dropped, a `-N` suffix for repeated headings); each reference-style
link `[text][name]` must have its definition. Links into the project's own repository (the
workspace's `repository`, `.../blob/main/<path>` or `.../tree/main/<path>`), in Markdown and in
the Rust sources' docs, must name a file of this checkout. Other links with a scheme are not
followed: CI has no network.

Names cited in inline code are held to the code too: a path such as `tests/ha.rs` or
`src/loss/mod.rs` must exist, and a test's name (a `snake_case` name of four words or more,
as this project names its tests) must be a function somewhere in the workspace's Rust files.
Dated records (the CHANGELOG, the benchmarks notebook, the mutants' run) may cite what has
since gone, and are not checked for names.

Usage: python3 scripts/check-links.py   (exit status 1 and one line per broken link)
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)")
HTML_SRC = re.compile(r"""(?:src|href)=["']([^"']+)["']""")
FENCE = re.compile(r"^\s*(```|~~~)")
DEFINITION = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
REFERENCE = re.compile(r"(?<![\]!])\[((?:[^\]\[]|\[[^\]]*\])+)\]\[([^\]]*)\]")


def repository() -> str:
    text = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    m = re.search(r'^repository\s*=\s*"([^"]+)"', text, re.M)
    return m.group(1).rstrip("/") if m else ""


REPOSITORY = repository()
OWN = re.compile(re.escape(REPOSITORY) + r"/(?:blob|tree)/main/([^)\s#>\"'`]+)") if REPOSITORY else None


def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def outside_fences(text: str):
    """The file's lines outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchors(path: Path, cache: dict) -> set:
    if path not in cache:
        seen: dict = {}
        found = set()
        for _, line in outside_fences(path.read_text(encoding="utf-8")):
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                for explicit in re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", line):
                    found.add(explicit)
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def blocks(text: str):
    """Runs of lines outside fenced code blocks, joined, with the number of their first line."""
    run, first = [], 0
    for number, line in outside_fences(text):
        if run and number != first + len(run):
            yield first, "\n".join(run)
            run = []
        if not run:
            first = number
        run.append(line)
    if run:
        yield first, "\n".join(run)


def check_target(name, number, source, target, cache, broken):
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return  # a URL (https:, mailto:, ...)
    path_part, _, anchor = target.partition("#")
    dest = (source.parent / path_part).resolve() if path_part else source
    if ROOT not in dest.parents and dest != ROOT:
        broken.append(f"{name}:{number}: {target} leaves the repository")
    elif not dest.exists():
        broken.append(f"{name}:{number}: {target} (no such file)")
    elif anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
        broken.append(f"{name}:{number}: {target} (no such heading)")


def check_own(name, text, broken):
    """Links into the project's own repository must name a file of this checkout."""
    if OWN is None:
        return
    for m in OWN.finditer(text):
        if not (ROOT / m.group(1)).exists():
            number = text.count("\n", 0, m.start()) + 1
            broken.append(f"{name}:{number}: {m.group(0)} (no such file in this checkout)")


CITED_PATH = re.compile(r"`((?:src|tests|examples|scripts|docs|pglock-[a-z]+)/[\w./-]*\w)`")
CITED_TEST = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+){4,})`")
# Long snake_case names that are not ours: the server's settings, functions and roles.
NOT_OURS = re.compile(r"^(pg_|pglock_|yb_)|^idle_in_transaction_session_timeout$")


RECORDS = re.compile(r"(^CHANGELOG\.md|/notebook\.md|/mutation-testing\.md)$")


def check_citations(name, text, functions, broken):
    """Paths and test names in inline code must exist."""
    for number, line in outside_fences(text):
        for path in CITED_PATH.findall(line):
            if "*" not in path and not (ROOT / path).exists() and not (ROOT / name).parent.joinpath(path).exists():
                broken.append(f"{name}:{number}: `{path}` (cited, no such path)")
        for function in CITED_TEST.findall(line):
            if function not in functions and not NOT_OURS.search(function):
                broken.append(f"{name}:{number}: `{function}` (cited, no such function)")


def rust_functions() -> set:
    names = set()
    for name in tracked("*.rs"):
        path = ROOT / name
        if path.exists():
            names.update(re.findall(r"\bfn\s+([a-z_][a-z0-9_]*)", path.read_text(encoding="utf-8")))
    return names


def tracked(pattern: str):
    return subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", pattern],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()


def main() -> int:
    cache: dict = {}
    broken = []
    functions = rust_functions()
    for name in tracked("*.md"):
        source = ROOT / name
        if not source.exists():
            continue
        text = source.read_text(encoding="utf-8")
        check_own(name, text, broken)
        if not RECORDS.search(name):
            check_citations(name, text, functions, broken)
        definitions = {}
        for first, block in blocks(text):
            block = re.sub(r"`[^`]*`", "", block)
            for m in DEFINITION.finditer(block):
                number = first + block.count("\n", 0, m.start())
                definitions[re.sub(r"\s+", " ", m.group(1).lower())] = (number, m.group(2))
        for first, block in blocks(text):
            block = re.sub(r"`[^`]*`", "", block)  # inline code is not a link
            found = []
            for pattern in (LINK, IMAGE, HTML_SRC):
                found += [(m.start(), m.group(1)) for m in pattern.finditer(block)]
            for at, target in found:
                check_target(name, first + block.count("\n", 0, at), source, target, cache, broken)
            for m in REFERENCE.finditer(block):
                label = re.sub(r"\s+", " ", (m.group(2) or m.group(1)).lower())
                if label not in definitions:
                    number = first + block.count("\n", 0, m.start())
                    broken.append(f"{name}:{number}: [{m.group(1)}][{m.group(2)}] (no definition)")
        for label, (number, target) in definitions.items():
            check_target(name, number, source, target, cache, broken)
    for name in tracked("*.rs"):
        source = ROOT / name
        if source.exists():
            check_own(name, source.read_text(encoding="utf-8"), broken)
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} broken link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
