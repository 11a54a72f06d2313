"""No import cycle among the product's modules, function-local and TYPE_CHECKING imports included.

A cycle hidden inside a function still ties two modules together (neither can be understood, tested or
moved without the other) and type checkers and code-structure tools see it; so every import statement
anywhere in a file counts. Checked on the syntax tree of every module under aligner/, connectors/ and
coordinator/, with each file's module name from its path (aligner/aligner/x.py is ``aligner.x``,
connectors/aligner/connectors/x.py is ``aligner.connectors.x``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PORTIONS = ("aligner", "connectors", "coordinator")
"""Top-level folders, each a portion of the namespace package ``aligner``."""

def modules() -> dict[str, Path]:
    """Module name -> file, for every Python file of the product."""
    out = {}
    for portion in PORTIONS:
        for path in sorted((ROOT / portion / "aligner").rglob("*.py")):
            parts = list(path.relative_to(ROOT / portion).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement anywhere in ``tree`` may name (relative ones resolved)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import mod`


def graph() -> dict[str, set[str]]:
    found = modules()
    edges: dict[str, set[str]] = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = set(_imported(tree, name, path.name == "__init__.py"))
        edges[name] = {t for t in targets if t in found and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.add(member)
                    if member == node:
                        break
                if len(scc) > 1:
                    out.append(frozenset(scc))
    return out


def _layer(module: str) -> str:
    return module.split(".")[1] if module.split(".")[1:2] in (["connectors"], ["coordinator"]) else "aligner"


def test_the_checker_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    a = ast.parse("def f():\n    from aligner.b import x\n")
    b = ast.parse("from aligner import a\n")
    edges = {"aligner.a": set(_imported(a, "aligner.a", False)) & {"aligner.b"},
             "aligner.b": set(_imported(b, "aligner.b", False)) & {"aligner.a"}}
    assert cycles(edges) == [frozenset({"aligner.a", "aligner.b"})]
    assert cycles({"aligner.a": {"aligner.b"}, "aligner.b": set()}) == []


def test_modules_are_named_by_their_path() -> None:
    found = modules()
    assert {"aligner.ledger", "aligner.zk", "aligner.connectors.runtime", "aligner.coordinator"} <= set(found)


def test_no_import_cycle_touches_aligner() -> None:
    found = [sorted(c) for c in cycles(graph()) if any(_layer(m) == "aligner" for m in c)]
    assert found == [], "aligner/ (ledger and protocol) has import cycles:\n" + "\n".join(map(str, found))


def test_no_import_cycle() -> None:
    found = [sorted(c) for c in cycles(graph())]
    assert found == [], "import cycles (function-local imports count):\n" + "\n".join(map(str, found))
