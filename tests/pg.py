"""A throwaway PostgreSQL cluster for the test suite, started from the server binaries.

PostgreSQL refuses to run as root; as root the cluster is run as the ``postgres``
system user (created by Debian's package). The cluster lives in a temp folder, listens
on loopback on a free port, and is stopped (immediate mode) at the end of the session.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from factories import free_port


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError(
        "PostgreSQL server binaries not found: apt-get install -y postgresql (the test command does, unless ORCHARD_TEST_INSTALL=0)"
    )


class PgCluster:
    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable
        """Keep synchronous_commit on, so an immediate (crash) stop loses no committed transaction."""
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="orchard-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o755)

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _opts(self) -> str:
        fast = "" if self.durable else " -c synchronous_commit=off"
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=300"
            + fast
        )

    def start(self) -> PgCluster:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._pg_start()
        return self

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run(
            [*self._as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def restart(self) -> None:
        self._pg_start()

    def _pg_start(self) -> None:
        opts = self._opts()
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres"

    def new_database(self) -> str:
        """A fresh empty database; returns its SQLAlchemy URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        for _ in range(50):
            try:
                with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                break
            except psycopg.OperationalError:
                time.sleep(0.1)
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"
