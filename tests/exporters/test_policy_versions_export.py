"""Every export carries the policy versions recorded per token, and ``export --policy-version V
--max-staleness K`` (``--min-policy-version``, ``--stale drop|mask``) drops or masks exactly the
stale tokens and says what it did. The database holds calls as the proxy stores them."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from factories import call
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.exporters import read_jsonl
from orchard_rec.exporters.contracts import SlimeSample
from orchard_rec.storage import Store

runner = CliRunner()
SYS = [1, 2, 3]


@pytest.fixture
def db(db_url: str) -> str:  # SQLite and PostgreSQL
    store = Store(db_url)
    store.upgrade()
    store.write_batch(
        [
            call(
                "old",
                prompt_ids=SYS,
                completion_ids=[10, 11],
                logprobs=[-0.1, -0.2],
                received_at=1,
                policy_versions=(("3", 0, 2),),
            ),
            call(
                "mixed",
                prompt_ids=SYS,
                completion_ids=[10, 11, 12],
                logprobs=[-0.1] * 3,
                received_at=2,
                policy_versions=(("4", 0, 1), ("6", 1, 3)),
            ),
            call(
                "mixed",
                prompt_ids=[*SYS, 10, 11, 12, 7],
                completion_ids=[13, 14],
                logprobs=[-0.3] * 2,
                received_at=3,
                policy_versions=(("6", 0, 2),),
            ),
            call(
                "fresh",
                prompt_ids=SYS,
                completion_ids=[20],
                logprobs=[-0.5],
                received_at=4,
                policy_versions=(("6", 0, 1),),
            ),
            call(
                "cut",
                prompt_ids=SYS,
                completion_ids=[30, 31],
                logprobs=[-0.5] * 2,
                received_at=5,
                finish_reason="abort",
                policy_versions=(("6", 0, 2),),
            ),
        ]
    )
    store.close()
    return db_url


def _export(db: str, out: Path, *args: str) -> str:
    r = runner.invoke(app, ["export", "--db", db, "--out", str(out), *args])
    assert r.exit_code == 0, r.output
    return r.output


def test_every_format_carries_the_versions(db: str, tmp_path: Path) -> None:
    _export(db, tmp_path / "s.jsonl")
    rows = {s.session_id: s for s in read_jsonl(tmp_path / "s.jsonl")}
    assert set(rows) == {"old", "mixed", "fresh"}  # the aborted generation stays out by default
    mixed = rows["mixed"]
    assert mixed.policy_versions == [("4", 0, 1), ("6", 1, 3), ("6", 4, 6)]
    per_token = ["4", "6", "6", None, "6", "6"]
    _export(db, tmp_path / "s.parquet", "--format", "parquet")
    pq_rows = {r["session_id"]: r for r in pq.read_table(tmp_path / "s.parquet").to_pylist()}
    assert pq_rows["mixed"]["policy_versions"] == per_token
    _export(db, tmp_path / "v.parquet", "--format", "verl")
    verl = {r["extra_fields"]["session_id"]: r for r in pq.read_table(tmp_path / "v.parquet").to_pylist()}
    assert verl["mixed"]["extra_fields"]["policy_versions"] == per_token
    _export(db, tmp_path / "t.parquet", "--format", "trl")
    trl = {r["session_id"]: r for r in pq.read_table(tmp_path / "t.parquet").to_pylist()}
    assert trl["mixed"]["policy_versions"] == [None] * 3 + per_token
    _export(db, tmp_path / "g.parquet", "--format", "trl-grpo")
    grpo = {r["session_id"]: r for r in pq.read_table(tmp_path / "g.parquet").to_pylist()}
    assert grpo["mixed"]["policy_versions"] == per_token
    _export(db, tmp_path / "slime.pt", "--format", "slime")
    dump = torch.load(tmp_path / "slime.pt", weights_only=False)
    samples = {d["session_id"]: SlimeSample.from_dict(d) for d in dump["samples"]}
    assert samples["mixed"].weight_versions == ["4", "6", "6"]
    assert samples["mixed"].metadata["policy_versions"] == [["4", 0, 1], ["6", 1, 3], ["6", 4, 6]]


def test_aborted_generations_are_kept_when_asked(db: str, tmp_path: Path) -> None:
    _export(db, tmp_path / "a.jsonl", "--aborted", "keep")
    rows = {s.session_id: s for s in read_jsonl(tmp_path / "a.jsonl")}
    assert rows["cut"].status == "aborted" and rows["cut"].response_ids == [30, 31]


def test_staleness_drops_or_masks_exactly_the_stale_tokens(db: str, tmp_path: Path) -> None:
    out = _export(db, tmp_path / "d.jsonl", "--policy-version", "6", "--max-staleness", "1")
    assert {s.session_id for s in read_jsonl(tmp_path / "d.jsonl")} == {"fresh"}
    assert "staleness: policy versions below 5 are stale; 2 of 3 samples dropped" in out
    out = _export(db, tmp_path / "m.jsonl", "--min-policy-version", "4", "--stale", "mask")
    rows = {s.session_id: s for s in read_jsonl(tmp_path / "m.jsonl")}
    assert set(rows) == {"mixed", "fresh"}  # "old" had no token left to train on
    assert rows["mixed"].loss_mask == [1, 1, 1, 0, 1, 1]  # version 4 is not below 4
    out = _export(db, tmp_path / "m5.jsonl", "--min-policy-version", "5", "--stale", "mask")
    rows = {s.session_id: s for s in read_jsonl(tmp_path / "m5.jsonl")}
    assert rows["mixed"].loss_mask == [0, 1, 1, 0, 1, 1]
    assert rows["mixed"].metadata["stale_masked"] == 1
    assert "1 tokens masked in 1 samples" in out and "stale tokens by version: 3 2, 4 1" in out


def test_staleness_options_are_checked(db: str, tmp_path: Path) -> None:
    r = runner.invoke(
        app, ["export", "--db", db, "--out", str(tmp_path / "x.jsonl"), "--policy-version", "3"]
    )
    assert r.exit_code != 0 and "--max-staleness" in r.output and "Traceback" not in r.output


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_the_slime_rollout_plugin_selects_by_staleness_too(db: str, caplog: pytest.LogCaptureFixture) -> None:
    from argparse import Namespace

    from orchard_rec.trainers import slime as slime_plugins

    args = Namespace(orchard_db=db, rollout_batch_size=10, orchard_policy_version=6, orchard_max_staleness=1)
    with caplog.at_level("INFO", logger="orchard_rec.trainers.slime"):
        groups = slime_plugins.generate_rollout(args, 0, None)
    assert [s.session_id for g in groups for s in g] == ["fresh"]
    assert "2 of 3 samples dropped" in caplog.text
    args = Namespace(orchard_db=db, rollout_batch_size=10, orchard_min_policy_version=5, orchard_stale="mask")
    served = {s.session_id: s for g in slime_plugins.generate_rollout(args, 0, None) for s in g}
    assert served["mixed"].loss_mask == [0, 1, 1, 0, 1, 1] and served["mixed"].weight_versions == [
        "4",
        "6",
        "6",
    ]
    args = Namespace(orchard_db=db, rollout_batch_size=10, orchard_aborted="keep")
    served = {s.session_id: s for g in slime_plugins.generate_rollout(args, 0, None) for s in g}
    assert served["cut"].status.value == "aborted"
