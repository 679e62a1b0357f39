"""The package's layering, asserted from the source (issue 15's first acceptance bullet).

- No module under ``reconstruct/`` or ``exporters/`` imports ``orchard_rec.proxy``,
  ``orchard_rec.intercept`` or ``orchard_rec.trainers`` (every import statement, also those
  inside functions); ``reconstruct/`` does not import storage, the pipeline or the exporters
  either: it is the pure core.
- ``import orchard_rec.reconstruct`` in a fresh interpreter loads neither aiohttp nor
  SQLAlchemy (nor any ``orchard_rec.proxy`` / ``storage`` module).
- ``intercept/`` imports no private (underscore) name of another orchard_rec package.
- The module import graph of ``orchard_rec`` (module-level imports, as they run at import
  time: ``if TYPE_CHECKING:`` blocks excluded) has no cycle.
- What each package's docstring promises it never imports ("Never ``proxy``, ``storage`` ...",
  "nothing of the proxy ..."), it does not import: the promise is read from the docstring, so a
  package that states a rule is held to it. ``dialects/`` in particular imports nothing of
  ``proxy``, ``storage`` or ``ui``, and ``reconstruct/`` no I/O library (sockets, processes, HTTP,
  databases) either.
- No module outside ``storage/``, ``migrations/`` and ``teacher/store.py`` (the teacher table's
  access) imports SQLAlchemy's query constructs (anything but ``sqlalchemy.exc`` and ``make_url``)
  or reaches a store's ``.engine``; offenders are reported as ``file:line``.
- Outside ``dialects/`` nothing compares against a wire dialect's name, nor a key against a dialect's
  body key (``"messages"``, ``"contents"`` ...), but an allow-list whose entries state their reason;
  ``harnesses/`` reads no body key at all (it asks the dialect registry).

The checks read the files with ``ast``; nothing is imported but the module under test in
its own subprocess.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchard_rec

ROOT = Path(orchard_rec.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _absolute(module: str | None, level: int, importer: str) -> str:
    """The absolute module name of a (possibly relative) ``from ... import``."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _imports(tree: ast.AST, importer: str) -> Iterator[tuple[str, list[str], ast.stmt]]:
    """``(module, imported names, node)`` for every import statement anywhere in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node
        elif isinstance(node, ast.ImportFrom):
            yield _absolute(node.module, node.level, importer), [a.name for a in node.names], node


@functools.cache
def _parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# -- 1. reconstruct/ and exporters/ stay below proxy, intercept and trainers ----------------------------------

FORBIDDEN = {
    "orchard_rec.reconstruct": (
        "orchard_rec.proxy",
        "orchard_rec.intercept",
        "orchard_rec.trainers",
        "orchard_rec.storage",
        "orchard_rec.pipeline",
        "orchard_rec.exporters",
        "orchard_rec.cli",
        "orchard_rec.render",
        "aiohttp",
        "sqlalchemy",
        "alembic",
        "rich",
    ),
    "orchard_rec.exporters": ("orchard_rec.proxy", "orchard_rec.intercept", "orchard_rec.trainers"),
}


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for name in MODULES:
        if not _under(name, package):
            continue
        for module, names, node in _imports(_parse(name), name):
            targets = [module] + [f"{module}.{n}" for n in names]
            for bad in forbidden:
                if any(_under(t, bad) for t in targets):
                    found.append(f"{MODULES[name]}:{node.lineno} imports {module} ({bad})")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_import_nothing_above_them(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


def test_the_checker_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from orchard_rec.proxy.app import RECORDER\n")
    assert [m for m, _, _ in _imports(tree, "orchard_rec.exporters.x")] == ["orchard_rec.proxy.app"]


# -- 2. the pure core loads no server or database library -------------------------------------------------------


def test_importing_reconstruct_loads_neither_aiohttp_nor_sqlalchemy() -> None:
    code = (
        "import sys, orchard_rec.reconstruct\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'sqlalchemy', 'alembic', 'rich')"
        " or m.startswith(('orchard_rec.proxy', 'orchard_rec.storage', 'orchard_rec.intercept'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- 3. intercept/ uses other packages' public names only ---------------------------------------------------------


def _private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_intercept_imports_no_private_name_of_another_package() -> None:
    found = []
    for name in MODULES:
        if not _under(name, "orchard_rec.intercept"):
            continue
        tree = _parse(name)
        aliases: dict[str, str] = {}  # local name -> the other package's module it is bound to
        for module, names, node in _imports(tree, name):
            if not _under(module, "orchard_rec") or _under(module, "orchard_rec.intercept"):
                continue
            if _private(module):
                found.append(f"{MODULES[name]}:{node.lineno} imports private module {module}")
            for n in names:
                if _private(n):
                    found.append(f"{MODULES[name]}:{node.lineno} imports {module}.{n}")
            for a in node.names:
                if isinstance(node, ast.Import):  # ``import orchard_rec.proxy.app [as app]``
                    local = a.asname or a.name.split(".")[0]
                    aliases[local] = a.name if a.asname else local
                elif f"{module}.{a.name}" in MODULES:  # ``from orchard_rec.proxy import app``
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
        for node in ast.walk(tree):  # ``app._relay`` / ``orchard_rec.proxy.app._relay``
            if isinstance(node, ast.Attribute) and _private(node.attr):
                dotted = _dotted(node.value)
                if dotted is None or dotted.split(".")[0] not in aliases:
                    continue
                head, _, rest = dotted.partition(".")
                target = ".".join(filter(None, [aliases[head], rest]))
                if _under(target, "orchard_rec") and not _under(target, "orchard_rec.intercept"):
                    found.append(f"{MODULES[name]}:{node.lineno} uses {target}.{node.attr}")
    assert found == []


# -- 4. no import cycles ------------------------------------------------------------------------------------------


def _type_checking(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported (into try/if/with blocks, not into defs)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or _type_checking(node):
            continue
        yield node
        for field in ("body", "orelse", "finalbody"):
            yield from _module_level(getattr(node, field, []) or [])
        for handler in getattr(node, "handlers", []) or []:
            yield from _module_level(handler.body)


def import_graph() -> dict[str, set[str]]:
    """Module → the orchard_rec modules it imports at import time (the most specific one named:
    ``from pkg import mod`` is an edge to ``pkg.mod``, ``from pkg import name`` to ``pkg``)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for node in _module_level(_parse(name).body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _absolute(node.module, node.level, name)
                targets = [
                    f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names
                ]
            else:
                continue
            graph[name].update(t for t in targets if t in MODULES and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert sum(len(e) for e in graph.values()) > 100  # the graph is really built
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# -- 5. what each package's docstring promises ----------------------------------------------------------------

_PROMISE_WORDS = {
    "proxy": "orchard_rec.proxy",
    "storage": "orchard_rec.storage",
    "reconstruct": "orchard_rec.reconstruct",
    "reconstruction": "orchard_rec.reconstruct",
    "exporters": "orchard_rec.exporters",
    "intercept": "orchard_rec.intercept",
    "trainers": "orchard_rec.trainers",
    "ui": "orchard_rec.ui",
    "demo": "orchard_rec.demo",
    "pipeline": "orchard_rec.pipeline",
    "aiohttp": "aiohttp",
    "sqlalchemy": "sqlalchemy",
    "rich": "rich",
}
_NEVER = re.compile(r"(?:\bNever|\bnever|\bnothing of)\b(?! imported| writes)([^.;]*)")


def promised(package: str) -> set[str]:
    """The modules ``package``'s docstring says it never imports (its "Never ..." clauses)."""
    doc = ast.get_docstring(_parse(package)) or ""
    out = set()
    for clause in _NEVER.findall(doc):
        for word in re.findall(r"[A-Za-z_]+", clause):
            target = _PROMISE_WORDS.get(word.lower())
            if target is not None and not _under(package, target):
                out.add(target)
    return out


PACKAGES = sorted(n for n in MODULES if _is_package(n) and n.count(".") == 1)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_keeps_what_its_docstring_promises(package: str) -> None:
    assert _violations(package, tuple(sorted(promised(package)))) == []


def test_the_promises_read_are_the_ones_the_docstrings_state() -> None:
    assert {"orchard_rec.proxy", "orchard_rec.storage", "orchard_rec.ui"} <= promised("orchard_rec.dialects")
    assert {"orchard_rec.proxy", "orchard_rec.storage", "aiohttp", "sqlalchemy"} <= promised(
        "orchard_rec.reconstruct"
    )
    assert promised("orchard_rec.harnesses") >= {"orchard_rec.proxy", "orchard_rec.storage"}
    assert "orchard_rec.proxy" in promised("orchard_rec.ui")
    # "Never imported on ..." is not a rule about imports; "Never imports ``proxy``, ..." is
    assert promised("orchard_rec.storage") == {
        "orchard_rec.proxy",
        "orchard_rec.ui",
        "orchard_rec.exporters",
        "orchard_rec.pipeline",
    }


IO = ("socket", "subprocess", "sqlite3", "http", "urllib.request", "asyncio", "requests", "httpx", "aiohttp")


def test_reconstruct_is_pure() -> None:
    """Records in, samples out: no module of the core imports a socket, process, HTTP or database library."""
    assert _violations("orchard_rec.reconstruct", IO) == []


# -- 6. SQL lives in storage/ ------------------------------------------------------------------------------------

# The modules that may build queries and hold an engine: ``storage/`` (its package docstring: it owns
# every SQL statement and the engine), the Alembic migrations, and the teacher results table's access
# (the ``teacher`` package docstring: ``store.py`` owns that table and may import sqlalchemy).
QUERY_OWNERS = ("orchard_rec.storage", "orchard_rec.migrations", "orchard_rec.teacher.store")

# What any other module may take from SQLAlchemy: its errors, and URL parsing (a ``--db`` check).
SQLALCHEMY_ALLOWED = {"sqlalchemy.exc", "sqlalchemy.engine.make_url", "sqlalchemy.engine.URL"}


def _sql_outside_storage(name: str, tree: ast.AST) -> list[str]:
    found = []
    for module, names, node in _imports(tree, name):
        if not _under(module, "sqlalchemy"):
            continue
        targets = [module] if isinstance(node, ast.Import) else [f"{module}.{n}" for n in names]
        for t in targets:
            if not any(_under(t, ok) for ok in SQLALCHEMY_ALLOWED):
                found.append(
                    f"{MODULES.get(name, name)}:{node.lineno} imports {t} (queries live in storage/)"
                )
    for node in ast.walk(tree):  # ``store.engine``, ``self.store.engine``: a Store's engine
        if isinstance(node, ast.Attribute) and node.attr == "engine":
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                where = f"{MODULES.get(name, name)}:{node.lineno}"
                found.append(f"{where} uses {_dotted(node) or '….engine'} (the engine stays in storage/)")
    return found


def test_no_query_and_no_engine_outside_storage() -> None:
    found = []
    for name in MODULES:
        if any(_under(name, owner) for owner in QUERY_OWNERS):
            continue
        found += _sql_outside_storage(name, _parse(name))
    assert found == []


def test_the_sql_checker_sees_queries_and_engines() -> None:
    tree = ast.parse(
        "from sqlalchemy import exc, select\nfrom sqlalchemy.engine import make_url\n"
        "def f(store):\n    import sqlalchemy.orm\n    with store.engine.connect():\n        self.engine = 1\n"
    )
    assert _sql_outside_storage("x", tree) == [
        "x:1 imports sqlalchemy.select (queries live in storage/)",
        "x:4 imports sqlalchemy.orm (queries live in storage/)",
        "x:5 uses store.engine (the engine stays in storage/)",
    ]


# -- 7. dialect knowledge lives in dialects/ ---------------------------------------------------------------------

# The wire dialects' names (what ``Dialect`` members and stored calls hold): the registry's, read from the
# source so nothing is imported (``dialects/registry.py`` lists the modules, each names itself).
WIRE_NAMES = frozenset({"chat", "completions", "responses", "messages", "gemini"})
WIRE_MEMBERS = frozenset({"CHAT", "COMPLETIONS", "RESPONSES", "MESSAGES"})
"""``Dialect`` members that name a wire dialect (``MODELS`` and ``OTHER`` are the two non-generation
routes the proxy records without a dialect module: naming them is no dialect knowledge)."""

# Each place outside dialects/ that may still name a wire dialect, and why. A new one fails the test:
# ask the registry (``dialects.get(d).<what it knows>``) instead of branching on the name.
DIALECT_BRANCHES_ALLOWED = {
    # Token and tito modes translate every non-native dialect *to chat*: chat is the pivot of the
    # WireDialect interface itself (``to_chat`` / ``from_chat``), so the translated upstream is chat.
    ("orchard_rec.proxy.token", "Dialect.CHAT"),
    # tito asks the engine's ``/v1/completions`` with the rendered ids: the upstream's wire (vLLM's),
    # which a client's dialect does not change.
    ("orchard_rec.proxy.titocall", "Dialect.COMPLETIONS"),
    # Storage continues a completions session's prompt from the previous call's prompt + completion text
    # (``Encoder._continue``). Left as it is while storage/ is reworked; a registry trait is the follow-up.
    ("orchard_rec.storage.delta", '"completions"'),
    ("orchard_rec.storage.store", '"completions"'),
}


def _names_a_dialect(node: ast.expr) -> bool:
    """``dialect``, ``call.dialect``, ``r.dialect.value``, ``self.upstream_dialect``: an expression
    holding a dialect by its name."""
    d = _dotted(node) or ""
    return "dialect" in d.rsplit(".value", 1)[0].rsplit(".", 1)[-1].lower()


def _wire_strings(node: ast.expr) -> list[str]:
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        repr(e.value).replace("'", '"')
        for e in elts
        if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in WIRE_NAMES
    ]


def _dialect_branches(name: str, tree: ast.AST) -> list[str]:
    """``(module, what)`` for each ``Dialect.<wire member>`` and each comparison (or ``match``) of an
    expression holding a dialect against a wire dialect's name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WIRE_MEMBERS and _dotted(node.value) == "Dialect":
            found.append((name, f"Dialect.{node.attr}", node.lineno))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_a_dialect(o) for o in operands):
                found += [(name, s, node.lineno) for o in operands for s in _wire_strings(o)]
        elif isinstance(node, ast.Match) and _names_a_dialect(node.subject):
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, ast.MatchValue):
                        found += [(name, s, case.pattern.lineno) for s in _wire_strings(sub.value)]
    return found


def test_no_branch_on_a_dialect_outside_dialects() -> None:
    """Callers ask the registry; only the allow-listed places (each with its reason) name a wire dialect."""
    found, used = [], set()
    for name in MODULES:
        if _under(name, "orchard_rec.dialects") or name == "orchard_rec.records":
            continue  # the dialects themselves, and the ``Dialect`` name type that declares the members
        for module, what, line in _dialect_branches(name, _parse(name)):
            used.add((module, what))
            if (module, what) not in DIALECT_BRANCHES_ALLOWED:
                found.append(f"{MODULES[name]}:{line} names {what} (ask orchard_rec.dialects instead)")
    assert found == []
    assert DIALECT_BRANCHES_ALLOWED - used == set(), "an allow-list entry no longer needed: remove it"


def test_the_dialect_branch_checker_sees_branches() -> None:
    tree = ast.parse(
        "def f(call, dialect, kind):\n"
        "    if dialect == 'messages': pass\n"
        "    if call.dialect.value in ('responses', 'x'): pass\n"
        "    if call.dialect is Dialect.RESPONSES or call.dialect is Dialect.OTHER: pass\n"
        "    if kind == 'chat' or store.dialect == 'sqlite': pass\n"
        "    match call.upstream_dialect:\n"
        "        case 'gemini': pass\n"
    )
    assert sorted((n, w) for _, w, n in _dialect_branches("x", tree)) == [
        (2, '"messages"'),
        (3, '"responses"'),
        (4, "Dialect.RESPONSES"),
        (7, '"gemini"'),
    ]


# -- 8. a request body's shape is read by its dialect ------------------------------------------------------------

# The top-level keys the wire dialects keep a conversation, its instructions and its tools under (the dialect
# modules' ``conversation_keys`` and what their readers read), read from the source so nothing is imported.
BODY_KEYS = frozenset({"messages", "input", "contents", "instructions", "system", "systemInstruction"})
READ_KEYS = BODY_KEYS | {"tools", "prompt"}
"""What ``harnesses/`` may not read itself: it asks ``dialects.instructions_of`` / ``first_user_text`` /
``tool_names_of`` (the call's dialect, or each dialect whose shape the body has)."""

# Each place outside dialects/ that compares a key against a dialect's body key, and why.
BODY_KEY_COMPARISONS_ALLOWED = {
    # The upstream request of token and tito modes is the *translated chat request* (chat is the pivot of
    # ``WireDialect.to_chat``): its ``messages`` are kept by reference to the session's previous upstream body.
    ("orchard_rec.proxy.capline", '"messages"'),
    # The same translated chat request, stored as a recipe over the client's request: its message list is
    # split into blobs (``derive_upstream``'s ``"m"``).
    ("orchard_rec.storage.layout", '"messages"'),
}


def _key_constants(node: ast.expr, keys: frozenset[str]) -> list[str]:
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        repr(e.value).replace("'", '"')
        for e in elts
        if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in keys
    ]


def _body_key_comparisons(name: str, tree: ast.AST, keys: frozenset[str]) -> list[tuple[str, str, int]]:
    """``(module, key, line)`` for each comparison of an expression against a body key (a message's
    ``role`` compared with ``"system"`` is a role, not a key: left out)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any("role" in ast.unparse(o) for o in operands):
                continue
            found += [(name, k, node.lineno) for o in operands for k in _key_constants(o, keys)]
    return found


def _body_key_reads(name: str, tree: ast.AST) -> list[tuple[str, str, int]]:
    """``(module, key, line)`` for each ``x[KEY]``, ``x.get(KEY)`` and comparison against a body key."""
    found = _body_key_comparisons(name, tree, READ_KEYS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            found += [(name, k, node.lineno) for k in _key_constants(node.slice, READ_KEYS)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            found += [(name, k, node.lineno) for a in node.args[:1] for k in _key_constants(a, READ_KEYS)]
    return found


def test_harnesses_read_no_body_shape() -> None:
    """A harness plug-in recognises a body by what its dialect reads (``harnesses.base.instructions_of``
    / ``first_user_text`` / ``tool_names``), never by a key of one dialect's shape."""
    found = [
        f"{MODULES[name]}:{line} reads {key} (ask orchard_rec.dialects instead)"
        for name in MODULES
        if _under(name, "orchard_rec.harnesses")
        for _, key, line in _body_key_reads(name, _parse(name))
    ]
    assert found == []


def test_no_body_key_comparison_outside_dialects() -> None:
    """Outside dialects/ no key is compared against a dialect's body key, but the allow-listed places."""
    found, used = [], set()
    for name in MODULES:
        if _under(name, "orchard_rec.dialects") or _under(name, "orchard_rec.demo"):
            continue  # the dialects, and the demo upstream (which plays the chat server)
        for module, key, line in _body_key_comparisons(name, _parse(name), BODY_KEYS):
            used.add((module, key))
            if (module, key) not in BODY_KEY_COMPARISONS_ALLOWED:
                found.append(
                    f"{MODULES[name]}:{line} compares against {key} (ask orchard_rec.dialects instead)"
                )
    assert found == []
    assert BODY_KEY_COMPARISONS_ALLOWED - used == set(), "an allow-list entry no longer needed: remove it"


def test_the_body_key_checker_sees_reads() -> None:
    tree = ast.parse(
        "def f(body, m, k):\n"
        "    a = body.get('messages') or body['input']\n"
        "    if 'systemInstruction' in body or k == 'contents': pass\n"
        "    if m.get('role') == 'system' or body.get('model'): pass\n"
    )
    assert sorted((n, k) for _, k, n in _body_key_reads("x", tree)) == [
        (2, '"input"'),
        (2, '"messages"'),
        (3, '"contents"'),
        (3, '"systemInstruction"'),
    ]
