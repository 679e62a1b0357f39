"""``orchard_rec.dialects`` is the bottom of the tree: importing it loads no server, database or layer above."""

from __future__ import annotations

import subprocess
import sys


def test_dialects_import_nothing_above_them() -> None:
    code = (
        "import sys, orchard_rec.dialects; orchard_rec.dialects.known();"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'sqlalchemy', 'alembic', 'torch', 'pyarrow')"
        " or m.startswith(('orchard_rec.proxy', 'orchard_rec.storage', 'orchard_rec.reconstruct',"
        " 'orchard_rec.exporters', 'orchard_rec.intercept', 'orchard_rec.trainers', 'orchard_rec.demo', 'orchard_rec.ui'))];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
