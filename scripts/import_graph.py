"""Print the import graph of the top-level packages and every import circle between modules; exit 1 on a circle.

`make test` runs it after `lint-imports`: the layers contract (pyproject.toml) keeps packages importing one way,
this keeps modules inside a package from importing each other in a circle. Every import counts, also those
inside functions, so a circle cannot be hidden by a late import. Usage: `.venv/bin/python scripts/import_graph.py`.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "ops", "channels_app", "notifier", "preferences", "templates_app", "projects", "audit", "core")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def main() -> int:
    """Print the package graph and the circles; return 1 if there is any circle."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges: Counter[tuple[str, str]] = Counter()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split(".")[0], imported.split(".")[0]
            if a != b:
                edges[(a, b)] += 1
    print("Imports between top-level packages (importer -> imported: module pairs):")
    for (a, b), n in sorted(edges.items(), key=lambda e: (PACKAGES.index(e[0][0]), PACKAGES.index(e[0][1]))):
        print(f"  {a} -> {b}: {n}")
    found = circles(graph)
    print(f"Import circles between modules: {len(found)} ({len(graph.modules)} modules)")
    for component in found:
        print("  " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
