"""``export --engine ray``: the dataset export sharded over a local Ray cluster (2 CPUs, started
here) equals the single-process export sample for sample, on SQLite and PostgreSQL; an export
interrupted mid-run leaves no manifest and no visible dataset; without ``--engine`` Ray is
never imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.datasets import open_dataset
from orchard_rec.exporters.ray_engine import export_dataset_ray, shards_of
from orchard_rec.records import Outcome
from orchard_rec.storage import Store
from tests.exporters.test_images_export import _gui_calls, _text_calls

ray = pytest.importorskip("ray")
runner = CliRunner()


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _fill(url: str) -> None:
    store = Store(url)
    store.upgrade()
    calls = _gui_calls("b-gui", 2000.0)
    for k in range(7):
        calls += _text_calls(f"t{k}-text", 1000.0 + k)
    store.write_batch(calls)
    store.set_outcome("b-gui", Outcome(reward=1.0, metadata={"run": "exp7"}))
    store.set_outcome("t3-text", Outcome(reward=0.0, metadata={"run": "exp7"}))
    store.close()


def _rows(url: str) -> list[dict[str, Any]]:
    ds = open_dataset(url)
    return [s.to_dict() for s in sorted(ds.samples(), key=lambda s: s.index)]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow  # a Ray cluster: ~30 s to start on a loaded machine
def test_ray_engine_equals_the_single_process_export(cluster: None, db_url: str, tmp_path: Path) -> None:
    _fill(db_url)
    r = runner.invoke(app, ["export", "--db", db_url, "--out", f"file://{tmp_path}/one"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", "--db", db_url, "--out", f"file://{tmp_path}/ray", "--engine", "ray"])
    assert r.exit_code == 0, r.output
    one, sharded = _rows(f"file://{tmp_path}/one"), _rows(f"file://{tmp_path}/ray")
    assert len(one) == 10 and [s["index"] for s in one] == list(range(10))
    assert sharded == one
    m = open_dataset(f"file://{tmp_path}/ray").manifest
    assert (
        m["selection"]["engine"] == "ray" and len({f["path"].split("part-")[1][:40] for f in m["files"]}) > 1
    )
    assert not any("_staging" in f or f.endswith(".staged") for f in _files(tmp_path / "ray"))
    # images: the same files, once each
    assert [f for f in _files(tmp_path / "ray") if f.startswith("_images")] == [
        f for f in _files(tmp_path / "one") if f.startswith("_images")
    ]


@pytest.mark.slow
def test_an_interrupted_ray_export_leaves_nothing(cluster: None, sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url)
    seen: list[Any] = []

    def interrupt(_s: Any) -> None:  # Ctrl-C on the driver once the first shard is in
        seen.append(_s)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_dataset_ray(sqlite_url, f"file://{tmp_path}/ds", on_session=interrupt, shards=4)
    assert seen and _files(tmp_path / "ds") == []
    with pytest.raises(Exception, match="no orchard-rec dataset"):
        open_dataset(f"file://{tmp_path}/ds")


def test_shards_and_refusals(sqlite_url: str, tmp_path: Path) -> None:
    assert shards_of(list("abcde"), 2) == [["a", "b", "c"], ["d", "e"]]
    assert shards_of(list("ab"), 8) == [["a"], ["b"]] and shards_of([], 3) == []
    _fill(sqlite_url)
    r = runner.invoke(
        app, ["export", "--db", sqlite_url, "--out", str(tmp_path / "a.parquet"), "--engine", "ray"]
    )
    assert r.exit_code == 2 and "give --out URL" in r.output
    r = runner.invoke(
        app,
        [
            "export",
            "--db",
            sqlite_url,
            "--out",
            f"file://{tmp_path}/x",
            "--engine",
            "ray",
            "--group-by",
            "task",
        ],
    )
    assert r.exit_code == 2 and "--group-by" in r.output and not (tmp_path / "x").exists()


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_without_engine_ray_is_never_imported(sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url)
    code = (
        "import sys\nfrom orchard_rec.cli import main\nsys.argv=['orchard-rec','export','--db',"
        f"{sqlite_url!r},'--out','file://{tmp_path}/ds']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'ray' not in sys.modules, 'ray imported'\nprint('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("ok"), out.stderr
    assert (tmp_path / "ds" / "_manifests").is_dir()


@pytest.mark.slow
def test_ray_engine_to_s3_equals_the_single_process_export(
    cluster: None, sqlite_url: str, tmp_path: Path
) -> None:
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        keys = {"key": "testing", "secret": "testing", "endpoint_url": endpoint}
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="ray")
        _fill(sqlite_url)
        options = [x for k, v in keys.items() for x in ("--storage-option", f"{k}={v}")]
        r = runner.invoke(
            app, ["export", "--db", sqlite_url, "--out", "s3://ray/ds/", "--engine", "ray", *options]
        )
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["export", "--db", sqlite_url, "--out", f"file://{tmp_path}/one"])
        assert r.exit_code == 0, r.output
        sharded = open_dataset("s3://ray/ds/", keys)
        assert [s.to_dict() for s in sorted(sharded.samples(), key=lambda s: s.index)] == _rows(
            f"file://{tmp_path}/one"
        )
        assert not any("_staging" in p for p in sharded.fs.find("ray/ds"))
    finally:
        server.stop()
