"""The shape the library keeps, checked on the syntax tree: small parts, and no catch-all that decides silently.

A class over 300 lines or a function over 50 is a sign of more than one job; a broad catch (``except
Exception``, ``except BaseException``, a bare ``except``, ``suppress(Exception)``) either re-raises what it
caught or says on its line (or the next) why swallowing everything is safe there.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("aligner", "connectors", "coordinator")
MAX_CLASS = 300
MAX_FUNCTION = 50
BROAD = {"Exception", "BaseException"}


def library() -> Iterator[tuple[str, str, ast.Module]]:
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            yield rel, text, ast.parse(text, filename=rel)


def oversized(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
            if lines > limit:
                yield f"{node.name} ({lines} lines, limit {limit}) at line {node.lineno}"


def test_no_class_over_300_lines_and_no_function_over_50() -> None:
    found = [f"{rel}: {what}" for rel, _text, tree in library() for what in oversized(tree)]
    assert found == [], "split these into parts with one job each:\n" + "\n".join(found)


def _is_broad(expr: ast.expr | None) -> bool:
    if expr is None:
        return True  # a bare except
    names = expr.elts if isinstance(expr, ast.Tuple) else [expr]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def _reraises(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Raise) for stmt in body for n in ast.walk(stmt))


def _comment_lines(text: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT}


def silent_broad_catches(text: str, tree: ast.Module) -> Iterator[int]:
    """Lines of broad catches that neither re-raise nor say why they are safe."""
    said = _comment_lines(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and _is_broad(node.type):
            if not _reraises(node.body) and not {node.lineno, node.lineno + 1} & said:
                yield node.lineno
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else None
                if (isinstance(call, ast.Call) and getattr(func, "attr", getattr(func, "id", "")) == "suppress"
                        and any(isinstance(a, ast.Name) and a.id in BROAD for a in call.args)
                        and not {node.lineno, node.lineno + 1} & said):
                    yield node.lineno


def test_every_broad_catch_reraises_or_says_why() -> None:
    found = [f"{rel}:{line}" for rel, text, tree in library() for line in silent_broad_catches(text, tree)]
    assert found == [], ("a catch-all must re-raise, or say on its line why swallowing everything is safe:\n"
                         + "\n".join(found))


@pytest.mark.parametrize(("code", "hits"), [
    ("try:\n    f()\nexcept Exception:\n    pass\n", 1),
    ("try:\n    f()\nexcept Exception:  # safe: best effort\n    pass\n", 0),
    ("try:\n    f()\nexcept (ValueError, Exception) as e:\n    log(e)\n    raise\n", 0),
    ("try:\n    f()\nexcept:\n    pass\n", 1),
    ("try:\n    f()\nexcept KeyError:\n    pass\n", 0),
    ("with contextlib.suppress(Exception):\n    f()\n", 1),
    ("with suppress(Exception):  # closing: nothing to save\n    f()\n", 0),
    ("with suppress(KeyError):\n    f()\n", 0),
])
def test_broad_catch_detector(code: str, hits: int) -> None:
    assert len(list(silent_broad_catches(code, ast.parse(code)))) == hits


def test_size_detector() -> None:
    code = "def f():\n" + "    x = 1\n" * 50 + "\nclass C:\n    def g(self):\n        pass\n"
    assert [w.split(" ")[0] for w in oversized(ast.parse(code))] == ["f"]
