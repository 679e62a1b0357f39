"""``export --out URL``: a partitioned parquet dataset on an S3-compatible server on loopback.

The server is moto in server mode (real HTTP on 127.0.0.1, an ephemeral port); the export
runs through the CLI (s3fs underneath, endpoint and keys from ``--storage-option`` or the
``AWS_*`` environment). What was written is read back the ways users read it: pyarrow's
dataset API on its own S3 client, DuckDB's ``read_parquet('.../**/*.parquet',
hive_partitioning=true)`` (over the fsspec filesystem registered with DuckDB: its httpfs
extension is a download), Ray Data when installed, and ``orchard_rec.datasets``. Each must
equal the local exports of the same database: the ``parquet`` file row for row, the ``jsonl``
file sample for sample (images by bytes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.datasets import open_dataset
from orchard_rec.exporters import read_jsonl
from orchard_rec.exporters.dataset import PARTITION_SCHEMA, write_dataset
from orchard_rec.records import Outcome
from orchard_rec.storage import Store
from tests.exporters.test_images_export import _gui_calls, _text_calls

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

runner = CliRunner()
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
TEXT_COLUMNS = ["session_id", "index", "group_index", "tokens", "response_length", "loss_mask"]
TEXT_COLUMNS += ["rollout_log_probs", "token_weights", "reward", "reward_json", "status", "metadata_json"]


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """The endpoint URL of a moto S3 server on loopback."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    name = "b-" + request.node.name.lower().replace("_", "-")[:50]
    boto3.client("s3", endpoint_url=s3, **_boto_keys()).create_bucket(Bucket=name)
    return name


def _boto_keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def _db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch(_text_calls("a-text", 1000.0) + _gui_calls("b-gui", 2000.0))
    store.set_outcome("b-gui", Outcome(reward=1.0, metadata={"run": "exp7"}))
    store.close()
    return url


def _export(*args: str) -> Any:
    r = runner.invoke(app, ["export", *args])
    assert r.exit_code == 0, r.output
    return r


def _by_key(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.select(TEXT_COLUMNS).to_pylist(), key=lambda r: (r["session_id"], r["index"]))


def _objects(s3: str, bucket: str) -> dict[str, str]:
    client = boto3.client("s3", endpoint_url=s3, **_boto_keys())
    listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_export_to_s3_reads_back_as_the_local_export(s3: str, bucket: str, tmp_path: Path) -> None:
    db = _db(tmp_path)
    r = _export("--db", db, "--out", f"s3://{bucket}/ds/", "--storage-option", f"endpoint_url={s3}")
    assert f"s3://{bucket}/ds/_manifests/manifest-" in r.output
    _export("--db", db, "--format", "parquet", "--out", str(tmp_path / "ref.parquet"))
    _export("--db", db, "--out", str(tmp_path / "ref.jsonl"))
    ref = _by_key(pq.read_table(tmp_path / "ref.parquet"))
    assert len(ref) == 4

    keys = _objects(s3, bucket)
    parts = sorted(k for k in keys if k.endswith(".parquet"))
    assert [k.split("/")[1:4] for k in parts] == [
        ["run=__HIVE_DEFAULT_PARTITION__", "policy_version=__HIVE_DEFAULT_PARTITION__", f"date={_today()}"],
        ["run=exp7", "policy_version=__HIVE_DEFAULT_PARTITION__", f"date={_today()}"],
    ]
    assert len([k for k in keys if k.startswith("ds/_images/")]) == 4  # each screenshot once

    # pyarrow, with its own S3 client
    fs = pa.fs.S3FileSystem(endpoint_override=s3, scheme="http", access_key="testing", secret_key="testing")
    hive = pads.partitioning(PARTITION_SCHEMA, flavor="hive")
    table = pads.dataset(f"{bucket}/ds", filesystem=fs, format="parquet", partitioning=hive).to_table()
    assert _by_key(table) == ref
    assert sorted(set(zip(table["session_id"].to_pylist(), table["run"].to_pylist()))) == [
        ("a-text", None),
        ("b-gui", "exp7"),
    ]

    # DuckDB over the fsspec filesystem
    duckdb = pytest.importorskip("duckdb")
    import s3fs

    con = duckdb.connect()
    con.register_filesystem(s3fs.S3FileSystem(endpoint_url=s3, key="testing", secret="testing"))
    got = con.sql(
        f"select * from read_parquet('s3://{bucket}/ds/**/*.parquet', hive_partitioning=true)"
    ).arrow()
    got = got.read_all() if hasattr(got, "read_all") else got
    assert _by_key(got) == ref
    runs = con.sql(
        f"select run, count(*) from read_parquet('s3://{bucket}/ds/**/*.parquet', hive_partitioning=true) group by run order by run"
    ).fetchall()
    assert runs == [("exp7", 3), (None, 1)]

    # orchard_rec.datasets: the samples, images with their bytes, equal the jsonl export's
    ds = open_dataset(f"s3://{bucket}/ds/", {"endpoint_url": s3})
    assert ds.rows == 4 and ds.manifest["selection"]["auxiliary"] is True
    mine = sorted(ds.samples(), key=lambda s: (s.session_id, s.index))
    local = list(read_jsonl(tmp_path / "ref.jsonl"))
    assert [s.to_dict() for s in mine] == [s.to_dict() for s in local]
    assert [[im.data for im in s.images] for s in mine] == [[im.data for im in s.images] for s in local]
    assert {r["session_id"] for r in ds.table(["session_id"]).to_pylist()} == {"a-text", "b-gui"}


@pytest.mark.slow  # starting Ray takes ~30 s on a loaded machine
def test_ray_data_reads_the_dataset(s3: str, bucket: str, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    db = _db(tmp_path)
    _export("--db", db, "--out", f"s3://{bucket}/ds/", "--storage-option", f"endpoint_url={s3}")
    _export("--db", db, "--format", "parquet", "--out", str(tmp_path / "ref.parquet"))
    fs = pa.fs.S3FileSystem(endpoint_override=s3, scheme="http", access_key="testing", secret_key="testing")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        rows = ray.data.read_parquet(f"{bucket}/ds", filesystem=fs).take_all()
    finally:
        ray.shutdown()
    assert _by_key(pa.Table.from_pylist(rows)) == _by_key(pq.read_table(tmp_path / "ref.parquet"))
    # Ray Data keeps Hive's null marker as the string (pyarrow and DuckDB read null)
    assert sorted({(r["session_id"], r["run"]) for r in rows}) == [
        ("a-text", "__HIVE_DEFAULT_PARTITION__"),
        ("b-gui", "exp7"),
    ]


def _today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_since_appends_a_new_export_and_manifest(
    s3: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)  # the endpoint from the environment this time
    db = _db(tmp_path)
    url = f"s3://{bucket}/ds"
    _export("--db", db, "--out", url)
    first = _objects(s3, bucket)
    time.sleep(1.1)  # --since has one-second resolution
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    time.sleep(1.1)
    store = Store(db)
    store.write_batch(_text_calls("c-text", 3000.0))
    store.close()
    r = _export("--db", db, "--out", url, "--since", since)
    assert "wrote 1 samples" in r.output
    second = _objects(s3, bucket)
    assert {k: second[k] for k in first} == first  # nothing earlier rewritten
    new = sorted(set(second) - set(first))
    assert len(new) == 2 and new[0].startswith("ds/_manifests/") and new[1].endswith(".parquet")
    ds = open_dataset(url + "/")
    assert ds.rows == 5 and ds.manifest["added_rows"] == 1 and ds.manifest["previous"].startswith("manifest-")
    assert ds.manifest["selection"]["since"] is not None
    assert sorted(s.session_id for s in ds.samples()) == ["a-text", "b-gui", "b-gui", "b-gui", "c-text"]


def test_an_interrupted_export_leaves_no_manifest_and_no_parts(s3: str, bucket: str, tmp_path: Path) -> None:
    db = _db(tmp_path)
    url = f"s3://{bucket}/ds"
    store = Store(db, readonly=True)
    from orchard_rec.pipeline import iter_samples

    samples = list(iter_samples(store))
    store.close()

    def interrupted() -> Iterator[Any]:
        yield from samples[:3]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_dataset(interrupted(), url, storage_options={"endpoint_url": s3})
    assert _objects(s3, bucket) == {}
    with pytest.raises(Exception, match="no orchard-rec dataset"):
        open_dataset(url, {"endpoint_url": s3})


def test_local_file_url_and_mistakes(tmp_path: Path) -> None:
    db = _db(tmp_path)
    _export("--db", db, "--out", f"file://{tmp_path}/ds/")
    manifests = list((tmp_path / "ds" / "_manifests").iterdir())
    assert len(manifests) == 1
    m = orjson.loads(manifests[0].read_bytes())
    assert m["rows"] == 4 and m["orchard_rec"] and [f["rows"] for f in m["files"]] == [1, 3]
    assert sorted(r["index"] for r in open_dataset(f"file://{tmp_path}/ds").table(["index"]).to_pylist()) == [
        0,
        1,
        2,
        3,
    ]

    torch_ds = open_dataset(f"file://{tmp_path}/ds").torch()  # the trainers' tensors
    local = sorted(read_jsonl_rows(db, tmp_path), key=lambda s: (s.session_id, s.index))
    items = list(torch_ds)
    assert sorted(it["input_ids"].tolist() for it in items) == sorted(s.tokens for s in local)

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    r = runner.invoke(app, ["export", "--db", db, "--out", f"file://{tmp_path}/other"])
    assert r.exit_code != 0 and "holds files but no orchard-rec dataset" in r.output
    assert "Traceback" not in r.output and sorted(p.name for p in (tmp_path / "other").iterdir()) == [
        "notes.txt"
    ]
    r = runner.invoke(app, ["export", "--db", db, "--format", "slime", "--out", f"file://{tmp_path}/x"])
    assert r.exit_code == 2 and "partitioned parquet dataset" in r.output
    r = runner.invoke(
        app, ["export", "--db", db, "--out", str(tmp_path / "a.jsonl"), "--storage-option", "a=b"]
    )
    assert r.exit_code == 2 and "--storage-option is for an --out URL" in r.output
    r = runner.invoke(app, ["export", "--db", db, "--out", f"file://{tmp_path}/y", "--storage-option", "ab"])
    assert r.exit_code == 2 and "KEY=VALUE" in r.output


def test_a_missing_bucket_is_one_line_and_writes_nothing(s3: str, bucket: str, tmp_path: Path) -> None:
    db = _db(tmp_path)
    r = runner.invoke(
        app,
        ["export", "--db", db, "--out", "s3://no-such-bucket/ds/", "--storage-option", f"endpoint_url={s3}"],
    )
    assert r.exit_code == 1 and "cannot write the dataset at s3://no-such-bucket/ds/" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) <= 2


def read_jsonl_rows(db: str, tmp_path: Path) -> list[Any]:
    _export("--db", db, "--out", str(tmp_path / "torch-ref.jsonl"))
    return list(read_jsonl(tmp_path / "torch-ref.jsonl"))


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_url_naming_a_file_uploads_that_format(s3: str, bucket: str, tmp_path: Path) -> None:
    import s3fs

    db = _db(tmp_path)
    opt = ["--storage-option", f"endpoint_url={s3}"]
    r = _export("--db", db, "--out", f"s3://{bucket}/x/samples.jsonl", *opt)
    assert f"s3://{bucket}/x/samples.jsonl" in r.output
    _export("--db", db, "--format", "parquet", "--out", f"s3://{bucket}/x/samples.parquet", *opt)
    keys = _objects(s3, bucket)
    assert "x/samples.jsonl" in keys and "x/samples.parquet" in keys
    assert len([k for k in keys if k.startswith("x/samples.jsonl.images/")]) == 4  # the sidecar, beside it
    fs = s3fs.S3FileSystem(endpoint_url=s3, key="testing", secret="testing")
    fs.get(f"{bucket}/x/", str(tmp_path / "down"), recursive=True)
    _export("--db", db, "--out", str(tmp_path / "ref.jsonl"))
    got, ref = list(read_jsonl(tmp_path / "down" / "samples.jsonl")), list(read_jsonl(tmp_path / "ref.jsonl"))
    assert [s.to_dict() for s in got] == [s.to_dict() for s in ref]
    assert [[i.data for i in s.images] for s in got] == [[i.data for i in s.images] for s in ref]
    _export("--db", db, "--format", "parquet", "--out", str(tmp_path / "ref.parquet"))
    assert _by_key(pq.read_table(tmp_path / "down" / "samples.parquet")) == _by_key(
        pq.read_table(tmp_path / "ref.parquet")
    )
    r = runner.invoke(
        app, ["export", "--db", db, "--format", "trl", "--out", f"s3://{bucket}/x/a.jsonl", *opt]
    )
    assert r.exit_code == 2 and "writes parquet" in r.output
