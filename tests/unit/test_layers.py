"""The package's layers (docs/architecture.md): the runtime never imports the tools, and
no module of vllm_x86 imports itself back through a chain of imports.

Both are read from the import graph that import-linter builds (grimp), imports inside
functions included: the contracts themselves are in pyproject.toml [tool.importlinter],
checked here by running `lint-imports` as a contributor would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _graph():
    return grimp.build_graph("vllm_x86", include_external_packages=False)


def cycles(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's
    algorithm, iterative): each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(adjacency):
        if root in index:
            continue
        work = [(root, iter(sorted(adjacency[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(adjacency.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    g = _graph()
    adjacency = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    circles = cycles(adjacency)
    lines = []
    for circle in circles:
        members = set(circle)
        for m in circle:
            lines += [f"{m} -> {t}" for t in sorted(adjacency[m] & members)]
    assert not circles, "import circles:\n" + "\n".join(lines)


def test_the_runtime_never_imports_the_tools():
    g = _graph()
    bad = [
        f"{m} -> {t}"
        for m in sorted(g.modules)
        if m.startswith("vllm_x86.runtime")
        for t in sorted(g.find_modules_directly_imported_by(m))
        if t.startswith("vllm_x86.tools")
    ]
    assert not bad, "the runtime imports tools:\n" + "\n".join(bad)


def test_the_layer_contracts_are_kept():
    """pyproject.toml's contracts, as `lint-imports` (import-linter) checks them."""
    lint = Path(sys.executable).with_name("lint-imports")
    p = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout
