"""Help that teaches: examples, metavars and number checks for every ``orchard-rec`` command.

``teach(root)`` walks the click command tree typer builds from ``orchard_rec.cli.app`` once,
before parsing, and gives every command and option what the declarations do not repeat:

- ``EXAMPLES``: one or two command lines shown under each command's ``--help`` (keyed by the
  command's path, ``"db upgrade"``; ``""`` is the root).
- Metavars in typer's conventions (``TEXT``, ``INTEGER``, ``FLOAT``, ``PATH``, ``[a|b]``), or a
  name that says what goes there (``SESSION``, ``URL``, ``LO:HI``): ``METAVARS`` by option.
  A metavar given in the declaration wins.
- A float option refuses ``nan`` and ``inf`` as it is parsed (exit 2, "--reward nan: not a
  finite number"): no number a person types means either.

``tests/cli/test_help.py`` walks the same tree and holds every command to it: examples that
parse, a description on every option, ``-h``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from orchard_rec.errors import UsageError

__all__ = ["EXAMPLES", "METAVARS", "commands", "teach"]

_PG = "postgresql+psycopg://me@localhost/orchard"

EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("orchard-rec demo", "orchard-rec serve --upstream http://127.0.0.1:8000/v1"),
    "serve": (
        "orchard-rec serve --upstream http://127.0.0.1:8000/v1",
        f"orchard-rec serve --upstream http://127.0.0.1:8000/v1 --mode tito --tokenizer ./Qwen3-8B --db {_PG}",
    ),
    "sessions": ("orchard-rec sessions", "orchard-rec sessions --status completed --min-reward 0.5 --json"),
    "calls": ("orchard-rec calls my-run", "orchard-rec calls my-run --seq 3 --json"),
    "show": ("orchard-rec show my-run --tokenizer demo", "orchard-rec show my-run --html my-run.html"),
    "ui": ("orchard-rec ui", f"orchard-rec ui --db {_PG} --port 8300"),
    "verify": (
        "orchard-rec verify --model ./Qwen3-0.6B",
        "orchard-rec verify --model ./Qwen3-0.6B -i samples.parquet --dtype bfloat16 --max-samples 100",
    ),
    "export": (
        "orchard-rec export --out samples.jsonl",
        "orchard-rec export -f slime --group-by task --filter nonzero-std --out rollout.pt",
    ),
    "outcome": (
        "orchard-rec outcome my-run --reward 1 --status completed",
        "orchard-rec outcome my-run --metadata task=t1",
    ),
    "intercept": (
        "orchard-rec intercept --install",
        "orchard-rec intercept --listen 127.0.0.1:8080 --hosts api.openai.com",
    ),
    "run": (
        "orchard-rec run codex --upstream http://127.0.0.1:8000/v1 -- 'fix the failing test'",
        "orchard-rec run claude-code --proxy http://127.0.0.1:8100 --session my-run -- 'add a test'",
    ),
    "steps": ("orchard-rec steps my-run", "orchard-rec steps my-run --json"),
    "reward": (
        "orchard-rec reward --dry-run",
        "orchard-rec reward --session my-run --weights '{\"f2p\": 0.6}'",
    ),
    "teacher": (
        "orchard-rec teacher --url http://127.0.0.1:8001",
        "orchard-rec teacher --url http://127.0.0.1:8001 --top-k 20 --shard 0/4",
    ),
    "db": ("orchard-rec db current", "orchard-rec db upgrade"),
    "db upgrade": ("orchard-rec db upgrade", f"orchard-rec db upgrade --db {_PG}"),
    "db current": ("orchard-rec db current", f"orchard-rec db current --db {_PG}"),
    "harness": ("orchard-rec harness config codex", "orchard-rec harness install all"),
    "harness config": (
        "orchard-rec harness config codex",
        "orchard-rec harness config claude-code --base-url http://127.0.0.1:8100 --session my-run",
    ),
    "harness install": ("orchard-rec harness install all", "orchard-rec harness install codex --force"),
    "train": ("orchard-rec train sft --model ./Qwen3-0.6B --out ./sft",),
    "train sft": (
        "orchard-rec train sft --model ./Qwen3-0.6B --out ./sft",
        "orchard-rec train sft --model ./Qwen3-0.6B --out ./sft --credit last-turn --steps 100",
    ),
    "demo": ("orchard-rec demo", "orchard-rec demo --mode tito --keep"),
    "demo upstream": ("orchard-rec demo upstream", "orchard-rec demo upstream --port 8000 --vlm"),
}
"""One or two command lines per command path, shown under its ``--help``."""

METAVARS: dict[str, str] = {
    "--db": "URL",
    "--upstream": "URL",
    "--upstream-override": "URL",
    "--url": "URL",
    "--base-url": "URL",
    "--proxy": "URL",
    "--session": "SESSION",
    "--tokenizer": "TOKENIZER",
    "--retokenize-teacher": "TOKENIZER",
    "--host": "HOST",
    "--listen": "HOST:PORT",
    "--port": "PORT",
    "--harness": "HARNESS",
    "--group-by": "KEY",
    "--reward-key": "KEY",
    "--metadata": "KEY=VALUE",
    "--metadata-json": "JSON",
    "--reward-json": "JSON",
    "--weights": "JSON",
    "--step-values": "V,V,...",
    "--pass-rate": "LO:HI",
    "--select": "bar:N:LO:HI",
    "--shard": "I/N",
    "--api-key": "KEY[:PREFIX]",
    "--admin-key": "KEY",
    "--upstream-key-env": "VARIABLE",
    "--since": "DATETIME",
    "--format": "FORMAT",
    "--filter": "FILTER",
    "--rules": "RULES",
    "--revision": "REVISION",
    "--storage-option": "KEY=VALUE",
    "--ray-address": "ADDRESS",
}
"""Options whose value has a shape worth naming."""

_ARGUMENTS = {"session": "SESSION", "name": "HARNESS"}
_TYPES = {str: "TEXT", int: "INTEGER", float: "FLOAT"}


def commands(root: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, command)`` for the root and every command and group under it."""
    yield path, root
    for name, sub in sorted(getattr(root, "commands", {}).items()):
        yield from commands(sub, f"{path} {name}".strip())


def _metavar(param: Any) -> str | None:
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return None
    if param.param_type_name == "argument":
        return _ARGUMENTS.get(param.name or "", (param.name or "VALUE").upper())
    if getattr(param, "is_flag", False):
        return None
    named = next((METAVARS[o] for o in param.opts if o in METAVARS), None)
    if named:
        return named
    if desc.is_choice and desc.choices:
        return "[" + "|".join(str(c) for c in desc.choices) + "]"
    if desc.is_path:
        return "PATH"
    if desc.is_datetime:
        return "DATETIME"
    annotation = desc.annotation
    if desc.is_list:
        annotation = getattr(annotation, "__args__", (str,))[0]
    return _TYPES.get(annotation, "TEXT")


def _finite(callback: Any) -> Any:
    def check(ctx: Any, param: Any, value: Any) -> Any:
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise UsageError(f"{param.opts[0]} {v}: not a finite number")
        return callback(ctx, param, value) if callback is not None else value

    return check


def _no_type(ctx: Any) -> None:
    return None


def teach(root: Any) -> None:
    """Examples, metavars and finite floats for every command under ``root`` (idempotent)."""
    for path, cmd in commands(root):
        lines = EXAMPLES.get(path)
        if lines and not cmd.epilog:
            cmd.epilog = "\b\nExamples:\n" + "\n".join(f"  {x}" for x in lines)
        for p in cmd.params:
            if getattr(p, "_taught", False):
                continue
            p._taught = True
            if p.metavar is None:
                p.metavar = _metavar(p)
                if p.param_type_name == "argument":
                    p.display_type_rich = _no_type  # the name is the metavar: not "SESSION SESSION"
            desc = getattr(p, "type_descriptor", None)
            annotation = getattr(desc, "annotation", None)
            if desc is not None and desc.is_list:
                annotation = getattr(annotation, "__args__", (None,))[0]
            if annotation is float:
                p.callback = _finite(p.callback)
