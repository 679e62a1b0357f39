"""``orchard_rec.settings``: every ``ORCHARD_*`` knob in the source is a ``Settings`` field, read
with the same defaults and the same one-line errors, and the README's table lists each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchard_rec.errors import UsageError
from orchard_rec.settings import KNOBS, Settings, readme_table

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"ORCHARD_[A-Z0-9_]*[A-Z0-9]")

NOT_KNOBS = {
    # the command line's own options (envvar= on a typer option; the slime plug-in reads ORCHARD_DB too)
    "ORCHARD_UPSTREAM", "ORCHARD_DB", "ORCHARD_WORKERS", "ORCHARD_DB_WRITER",
    "ORCHARD_API_KEYS", "ORCHARD_ADMIN_KEYS",
    "ORCHARD_DB_WRITER_URL",  # the proxy hands its writer child the database URL (not a user's knob)
    "ORCHARD_URL",  # the viewer's placeholder for the proxy's address in a shown curl command
    "ORCHARD_PROXY_KEY",  # the key variable a harness's generated config names
}  # fmt: skip


def test_every_orchard_name_in_the_source_is_a_settings_field() -> None:
    fields = {k.env for k in KNOBS}
    named: dict[str, str] = {}
    for path in (ROOT / "orchard_rec").rglob("*.py"):
        if path.name == "settings.py" and path.parent.name == "orchard_rec":
            continue
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    missing = {n: p for n, p in named.items() if n not in fields and n not in NOT_KNOBS}
    assert not missing, f"ORCHARD_* names read outside Settings: {missing}"


def test_no_module_reads_a_knob_from_the_environment() -> None:
    reads = re.compile(r"environ(?:\.get\(|\[)\s*f?[\"']ORCHARD_")
    found = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "orchard_rec").rglob("*.py")
        if p.name != "settings.py" and reads.search(p.read_text())
    ]
    # per-harness ORCHARD_<NAME>_BIN/_PYTHON (f-strings), the writer child's URL and the slime plug-in's ORCHARD_DB
    assert set(found) <= {
        "orchard_rec/harnesses/base.py", "orchard_rec/harnesses/install.py",
        "orchard_rec/proxy/dbproc.py", "orchard_rec/trainers/slime.py",
    }, found  # fmt: skip


def test_defaults_are_the_ones_the_modules_had() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    mb = 1 << 20
    assert (s.ids_cache_bytes, s.request_cache_bytes, s.state_cache_bytes, s.tito_cache_bytes) == (
        512 * mb, 256 * mb, 1024 * mb, 1024 * mb,
    )  # fmt: skip
    assert (s.spool_bases_bytes, s.spool_inline_bytes, s.spool_keep_bytes) == (256 * mb, 1 * mb, 4 * mb)
    assert (s.writer_linger_s, s.wal_db_delay_s, s.db_linger_s) == (0.005, 0.002, 0.01)
    assert (s.writer_nice, s.fault_write_delay_s, s.upstream_check_s) == (0, 0.0, 10.0)
    assert s.tracks_policy and not s.tito_renders_whole and not s.debugging
    assert s.gc_threshold == (50_000, 20, 100)


def test_values_are_read_as_before() -> None:
    s = Settings.from_env(
        {
            "ORCHARD_REQUEST_CACHE_MB": "0.5", "ORCHARD_DB_LINGER_S": "", "ORCHARD_WAL_DB_DELAY_S": "",
            "ORCHARD_WRITER_NICE": "5", "ORCHARD_POLICY_TRACKING": " OFF ", "ORCHARD_TITO_RENDER": "Whole",
            "ORCHARD_GC_THRESHOLD": "1,2,3", "ORCHARD_DEBUG": "1", "ORCHARD_UPSTREAM_CHECK_S": "0.3",
        }
    )  # fmt: skip
    assert s.request_cache_bytes == 1 << 19
    assert s.db_linger_s == 0.0 and s.wal_db_delay_s == 0.0  # set but empty: 0, as `or 0` made it
    assert s.writer_nice == 5 and s.upstream_check_s == 0.3
    assert not s.tracks_policy and s.tito_renders_whole and s.debugging
    assert s.gc_threshold == (1, 2, 3)
    assert Settings.from_env({"ORCHARD_GC_THRESHOLD": "x"}).gc_threshold == (50_000, 20, 100)  # lenient


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("ORCHARD_REQUEST_CACHE_MB", "256MB", "ORCHARD_REQUEST_CACHE_MB must be a number of megabytes (0 or more), got '256MB'"),
        ("ORCHARD_TITO_CACHE_MB", "-1", "ORCHARD_TITO_CACHE_MB must be a number of megabytes (0 or more), got '-1'"),
        ("ORCHARD_DB_LINGER_S", "soon", "ORCHARD_DB_LINGER_S must be a number of seconds (0 or more), got 'soon'"),
        ("ORCHARD_WRITER_NICE", "high", "ORCHARD_WRITER_NICE must be a whole number, got 'high'"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_variable(var: str, value: str, says: str) -> None:
    with pytest.raises(UsageError) as e:
        Settings.from_env({var: value})
    assert str(e.value) == says


def test_importing_the_proxy_reads_no_knob() -> None:
    import subprocess
    import sys

    code = (
        "import os; os.environ['ORCHARD_REQUEST_CACHE_MB'] = 'x'; os.environ['ORCHARD_UPSTREAM_CHECK_S'] = 'x'\n"
        "import orchard_rec.proxy.app, orchard_rec.proxy.server, orchard_rec.storage.store, orchard_rec.cli\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_readme_lists_every_knob() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme_table() in readme, (
        "README's table of knobs is stale: paste orchard_rec.settings.readme_table()"
    )
    for k in KNOBS:
        assert f"`{k.env}`" in readme
