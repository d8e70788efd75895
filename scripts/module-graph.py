#!/usr/bin/env python3
"""The module graph of the lock crate's src/, regenerated from the code.

Each node is a top-level module (a file or folder under src/); an edge is a `crate::` path
from one to another. The crate's own tests (`#[cfg(test)] mod tests`, the simulation under
src/core/sim/) are left out. Prints the graph as a Mermaid flowchart and exits with 1 when it
has a circle, naming the modules on it. CI runs it; docs/design.md shows its output.
"""
import collections
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def is_module(name):
    return os.path.exists(os.path.join(ROOT, name + ".rs")) or os.path.isdir(os.path.join(ROOT, name))


def reexports():
    """Root re-exports (`pub use crate::module::{A, B}`): a type's name to its module."""
    lib = open(os.path.join(ROOT, "lib.rs")).read()
    names = {}
    for m in re.finditer(r"pub use crate::(\w+)::\{?([^;]+?)\}?;", lib):
        for name in re.split(r"[,\s{}]+", m.group(2)):
            name = name.split(" as ")[0].strip()
            if name:
                names[name] = m.group(1)
    return names


def graph():
    names = reexports()
    edges = collections.defaultdict(set)
    for folder, dirs, files in os.walk(ROOT):
        if "sim" in os.path.relpath(folder, ROOT).split(os.sep):
            continue
        for file in files:
            path = os.path.join(folder, file)
            if not file.endswith(".rs") or os.path.relpath(path, ROOT) == "lib.rs":
                continue
            first = os.path.relpath(path, ROOT).split(os.sep)[0]
            node = first[:-3] if first.endswith(".rs") else first
            text = re.sub(r"//[^\n]*", "", open(path).read())
            cut = text.find("#[cfg(test)]\nmod tests")
            if cut >= 0:
                text = text[:cut]
            targets = [m.group(1) for m in re.finditer(r"crate::(\w+)", text)]
            for group in re.finditer(r"crate::\{([^}]*)\}", text):
                targets += [n.split("::")[0] for n in re.split(r"[,\s]+", group.group(1)) if n]
            for target in targets:
                target = names.get(target, target)
                if target != node and is_module(target):
                    edges[node].add(target)
            edges.setdefault(node, set())
    return edges


def circles(edges):
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main():
    edges = graph()
    print("flowchart LR")
    for node in sorted(edges):
        for target in sorted(edges[node]):
            print(f"    {node} --> {target}")
    found = circles(edges)
    for part in found:
        print("circle: " + " -> ".join(part), file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
