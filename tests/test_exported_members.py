"""Every subpackage declares ``__all__``, and every name in it exists."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "orchard_rec",
    "orchard_rec.proxy",
    "orchard_rec.storage",
    "orchard_rec.reconstruct",
    "orchard_rec.exporters",
    "orchard_rec.trainers",
    "orchard_rec.harnesses",
    "orchard_rec.demo",
    "orchard_rec.dialects",
    "orchard_rec.verify",
    "orchard_rec.intercept",
    "orchard_rec.selection",
    "orchard_rec.rewards",
    "orchard_rec.steps",
    "orchard_rec.teacher",
    "orchard_rec.ui",
    "orchard_rec.pipeline",
    "orchard_rec.render",
    "orchard_rec.exporters.contracts",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_declared_and_resolves(name: str) -> None:
    mod = importlib.import_module(name)
    assert hasattr(mod, "__all__"), name
    for member in mod.__all__:
        assert hasattr(mod, member), f"{name}.{member}"


def _modules() -> list[str]:
    import pkgutil

    import orchard_rec

    return sorted(
        m.name
        for m in pkgutil.walk_packages(orchard_rec.__path__, "orchard_rec.")
        # the mitmproxy addon runs in intercept's own runtime; alembic's env.py and the
        # migration scripts run under alembic's context only
        if m.name != "orchard_rec.intercept.addon"
        and not m.name.startswith("orchard_rec.migrations.")
        and m.name != "orchard_rec.migrations"
    )


@pytest.mark.parametrize("name", _modules())
def test_every_module_imports(name: str) -> None:
    """A module importing a moved or deleted one fails here, not in front of a user (mypy is
    told to ignore missing imports, so it does not see our own)."""
    importlib.import_module(name)


@pytest.mark.slow  # a fresh interpreter importing proxy, storage and the CLI: ~10 s on a loaded machine
def test_torch_is_not_imported_by_the_core() -> None:
    import subprocess
    import sys

    code = "import orchard_rec.proxy, orchard_rec.storage, orchard_rec.reconstruct, orchard_rec.exporters, orchard_rec.cli, sys; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


@pytest.mark.slow  # one fresh interpreter per module: ~2-4 s each on a loaded machine
@pytest.mark.parametrize(
    "name", PACKAGES + ["orchard_rec.cli", "orchard_rec.trainers.slime", "orchard_rec.exporters.pipeline"]
)
def test_each_module_imports_first_in_a_fresh_interpreter(name: str) -> None:
    """No import cycle depends on which module a user imports first."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_version_is_written_once_and_no_package_is_both_core_and_extra() -> None:
    import re
    import tomllib
    from pathlib import Path

    import orchard_rec

    project = tomllib.loads((Path(orchard_rec.__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "orchard_rec.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", orchard_rec.__version__)

    def name(req: str) -> str:
        return re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0].lower()

    core = {name(r) for r in project["project"]["dependencies"]}
    for extra, reqs in project["project"]["optional-dependencies"].items():
        both = core & {name(r) for r in reqs}
        assert not both, f"{sorted(both)} both core and in extra {extra!r}"
