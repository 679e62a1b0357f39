"""Size limits of the source (issue 36): no module of ``orchard_rec`` over 800 lines, no
function or method over 100.

A function's length is counted from its ``def`` line to its last line, signature and
docstring included, decorators not; a nested function counts toward its parent and is
checked on its own too. Offenders are reported as ``file:line name (N lines)``. The files
are read with ``ast``, nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import orchard_rec

ROOT = Path(orchard_rec.__file__).parent
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def function_spans(source: str) -> Iterator[tuple[str, int, int]]:
    """``(qualified name, def line, lines)`` for every function and method in ``source``."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                yield name, child.lineno, end - child.lineno + 1
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


def test_no_module_over_800_lines() -> None:
    sizes = {p: len(p.read_text().splitlines()) for p in _sources()}
    long = [f"{_rel(p)} ({n} lines)" for p, n in sizes.items() if n > MAX_MODULE_LINES]
    assert not long, "modules over 800 lines:\n" + "\n".join(long)


def test_no_function_over_100_lines() -> None:
    long = [
        f"{_rel(p)}:{line} {name} ({n} lines)"
        for p in _sources()
        for name, line, n in function_spans(p.read_text())
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 100 lines:\n" + "\n".join(long)


def test_the_span_counts_the_signature_not_the_decorators() -> None:
    src = "@deco\n@deco2(1)\ndef f(\n    a,\n    b,\n):\n    '''doc'''\n    return a\n\n\nclass C:\n    async def m(self):\n        def inner():\n            pass\n        return inner\n"
    assert list(function_spans(src)) == [("f", 3, 6), ("C.m", 12, 4), ("C.m.inner", 13, 2)]
