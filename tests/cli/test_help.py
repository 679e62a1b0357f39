"""Help that teaches (issue 37), held for every command of the typer app, also those added later:
one or two examples that parse, a description on every option, typer-style metavars (never
``<str>``), ``-h`` as ``--help``, and ``orchard-rec`` alone prints the help and succeeds."""

from __future__ import annotations

import re
import shlex

import pytest
import typer.main
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.cli.help import EXAMPLES, commands

runner = CliRunner()
ROOT = typer.main.get_command(app)
COMMANDS = dict(commands(ROOT))
HELP = ("-h", "--help")
TYPER_TYPE = re.compile(r"<(str|int|float|bool|path|datetime|list\[[^\]]*\]|[\w-]+(\|[\w-]+)+)>")


def _resolve(argv: list[str]) -> tuple[str, list[str]]:
    """An example's command path and the arguments left for that command."""
    cmd, path, rest = ROOT, [], list(argv)
    while rest and rest[0] in getattr(cmd, "commands", {}):
        path.append(rest[0])
        cmd = cmd.commands[rest.pop(0)]
    return " ".join(path), rest


def test_every_command_has_examples() -> None:
    assert set(COMMANDS) <= set(EXAMPLES), sorted(set(COMMANDS) - set(EXAMPLES))
    assert set(EXAMPLES) <= set(COMMANDS), sorted(set(EXAMPLES) - set(COMMANDS))  # none stale


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_teaches(path: str) -> None:
    cmd = COMMANDS[path]
    for flag in HELP:
        r = runner.invoke(app, [*path.split(), flag])
        assert r.exit_code == 0, r.output
        assert "Examples:\n" in r.output, r.output
        examples = r.output.split("Examples:\n", 1)[1].split("\n")
        shown = [x.strip() for x in examples if x.strip()]
        assert 1 <= len(shown) <= 2 and all(x.startswith("orchard-rec ") for x in shown), r.output
        assert not TYPER_TYPE.search(r.output), r.output  # <str>, <list[str]>, <split|realign>
    for line in EXAMPLES[path]:  # each example names this command and parses
        at, rest = _resolve(shlex.split(line)[1:])
        assert at == path or at.startswith(f"{path} ".lstrip()), line
        target = COMMANDS[at]
        if not getattr(target, "commands", None) or rest:
            target.make_context(at or "orchard-rec", list(rest), resilient_parsing=False)
    for p in cmd.params:
        if p.name == "help":
            continue
        assert (getattr(p, "help", None) or "").strip(), f"{path or 'orchard-rec'} {p.opts[0]}: no help"
        if not getattr(p, "is_flag", False):
            assert p.metavar and "<" not in p.metavar, (path, p.opts, p.metavar)


def test_no_arguments_prints_the_help_and_succeeds() -> None:
    for args in ([], ["db"], ["harness"], ["train"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and r.output.startswith("Usage: ") and "Commands:" in r.output, r.output
        assert "error:" not in r.output


def test_status_lists_its_choices_everywhere() -> None:
    for path, cmd in COMMANDS.items():
        for p in cmd.params:
            if "--status" in getattr(p, "opts", ()):
                assert p.metavar == "[completed|truncated|aborted|failed]", (path, p.metavar)
