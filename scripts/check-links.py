#!/usr/bin/env python3
"""Fail when a relative link in the repository's Markdown points nowhere.

Checks every tracked `*.md` file: each relative link `[text](path)`, `[text](path#anchor)` or
`[text](#anchor)` must name a file or folder of the repository and, when it has an anchor, a
heading of that Markdown file (GitHub's slugs: lower case, spaces to hyphens, punctuation
other than `-` and `_` dropped, a `-N` suffix for repeated headings). Links with a scheme
(`https:` and the like) are not followed: CI has no network.

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


def main() -> int:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.md"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()
    cache: dict = {}
    broken = []
    for name in files:
        source = ROOT / name
        if not source.exists():
            continue
        text = source.read_text(encoding="utf-8")
        for number, line in outside_fences(text):
            line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
            targets = LINK.findall(line) + IMAGE.findall(line) + HTML_SRC.findall(line)
            for target in targets:
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue  # a URL (https:, mailto:, ...)
                path_part, _, anchor = target.partition("#")
                dest = (source.parent / path_part).resolve() if path_part else source
                if ROOT not in dest.parents and dest != ROOT:
                    broken.append(f"{name}:{number}: {target} leaves the repository")
                    continue
                if not dest.exists():
                    broken.append(f"{name}:{number}: {target} (no such file)")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
                    broken.append(f"{name}:{number}: {target} (no such heading)")
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} broken link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
