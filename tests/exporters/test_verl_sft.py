"""``verl-sft`` read back the way verl's ``MultiTurnSFTDataset`` reads it
(``verl/utils/dataset/multiturn_sft_dataset.py``): ``pd.read_parquet``, then
``convert_nested_value_to_list_recursive`` on ``messages`` and ``tools``, then
``tokenizer.apply_chat_template`` — the loaded values equal the chat view of each sample and
render to the same text as the originals with a real HF tokenizer (the demo tokenizer's
Hermes-tools template).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from orchard_rec.exporters import ExportError
from orchard_rec.exporters.pipeline import export
from orchard_rec.exporters.verl import VerlSftExporter


def convert_nested_value_to_list_recursive(data_item: Any) -> Any:
    # verl's own helper, re-stated: the consumer's contract
    import numpy as np  # here and pandas below: only the slow tests read parquet back

    if isinstance(data_item, dict):
        return {k: convert_nested_value_to_list_recursive(v) for k, v in data_item.items()}
    elif isinstance(data_item, list):
        return [convert_nested_value_to_list_recursive(elem) for elem in data_item]
    elif isinstance(data_item, np.ndarray):
        return convert_nested_value_to_list_recursive(data_item.tolist())
    else:
        return data_item


def _verl_load(path: Path) -> tuple[list[Any], list[Any]]:
    import pandas as pd

    df = pd.read_parquet(path)
    messages = df["messages"].apply(convert_nested_value_to_list_recursive).tolist()
    tools = df["tools"].apply(convert_nested_value_to_list_recursive).tolist()
    return messages, tools


_FIELDS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from orchard_rec.demo.tokenizer import save_tokenizer

    folder = save_tokenizer(tmp_path_factory.mktemp("tok"))
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _render(tok: Any, messages: Any, tools: Any) -> str:
    return tok.apply_chat_template(messages, tools=tools or None, tokenize=False)  # type: ignore[no-any-return]


def _chat_view(db: str, tmp: Path, **sel: Any) -> list[dict[str, Any]]:
    """Each sample's messages/tools as the exporters build them (slime-sft writes them as JSON)."""
    export(db, "slime-sft", tmp / "ref.jsonl", **sel)
    rows = [json.loads(line) for line in (tmp / "ref.jsonl").read_text().splitlines()]
    for r in rows:
        r["messages"] = [
            {k: v for k, v in m.items() if k != "step_loss_mask"} | {"loss": m["step_loss_mask"]}
            for m in r["messages"]
        ]
    return rows


def _original(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "loss"}


def _check(tok: Any, path: Path, want: list[dict[str, Any]], *, exact_tools: bool) -> None:
    messages, tools = _verl_load(path)
    assert len(messages) == len(want) > 0
    for got_m, got_t, w in zip(messages, tools, want):
        assert all(set(m) == {*_FIELDS, "loss"} for m in got_m)  # one fixed struct
        assert all(set(m) <= {*_FIELDS, "loss"} for m in w["messages"])  # nothing is dropped here
        # the same messages, a field a message lacks read back as None
        assert got_m == [{k: m.get(k) for k in (*_FIELDS, "loss")} for m in w["messages"]]
        if not exact_tools:
            continue
        assert got_t == w["tools"]  # the recorded JSON schemas, as dicts
        orig = [_original(m) for m in w["messages"]]
        loaded = [_original(m) for m in got_m]
        assert _render(tok, loaded, got_t) == _render(tok, orig, w["tools"])
        # verl renders turn by turn (tools with the first message only), then checks the whole
        for i, (a, b) in enumerate(zip(loaded, orig)):
            assert _render(tok, [a], got_t if i == 0 else None) == _render(
                tok, [b], w["tools"] if i == 0 else None
            )


@pytest.mark.slow  # the session-scoped recorded_db fixture records through a real proxy
def test_verl_loader_gets_the_recorded_messages_and_tools(recorded_db, tmp_path, tokenizer, caplog) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    ref = _chat_view(recorded_db, tmp_path)
    sessions = pd.read_parquet(_export(recorded_db, tmp_path / "all.parquet", caplog, warns=True))[
        "session_id"
    ]
    assert len(sessions) == len(ref) == 6
    _check(tokenizer, tmp_path / "all.parquet", ref, exact_tools=False)
    # one agent's tool set per export (chat + responses: exec_command; messages: Bash) is exact
    groups: dict[str, list[str]] = {}
    for r, sid in zip(ref, sessions):
        groups.setdefault(json.dumps(r["tools"]), []).append(sid)
    assert len(groups) == 2
    for n, sel in enumerate(groups.values()):
        out = _export(recorded_db, tmp_path / f"v{n}.parquet", caplog, warns=False, sessions=sel)
        _check(tokenizer, out, _chat_view(recorded_db, tmp_path, sessions=sel), exact_tools=True)


@pytest.mark.slow
def test_mixed_tool_shapes_get_null_fillers_and_a_warning(recorded_db, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    ref = _chat_view(recorded_db, tmp_path)
    _, tools = _verl_load(_export(recorded_db, tmp_path / "all.parquet", caplog, warns=True))
    for got, w in zip(tools, ref):
        props = got[0]["function"]["parameters"]["properties"]
        assert set(props) == {"cmd", "command"}  # the union of both agents' parameters
        assert {k: v for k, v in props.items() if v is not None} == w["tools"][0]["function"]["parameters"][
            "properties"
        ]


def _export(db: str, out: Path, caplog: Any, *, warns: bool, **sel: Any) -> Path:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="orchard_rec.exporters.verl"):
        export(db, "verl-sft", out, **sel)
    assert bool([r for r in caplog.records if "differ in shape" in r.getMessage()]) is warns
    return out


def test_tool_schemas_without_a_common_parquet_type_are_a_clear_error() -> None:
    def tool(name: str, default: Any) -> str:
        params = {"type": "object", "properties": {"n": {"default": default}}}
        return json.dumps([{"type": "function", "function": {"name": name, "parameters": params}}])

    assert VerlSftExporter._tools_type([tool("a", 5), tool("b", 6)]) is not None
    with pytest.raises(
        ExportError, match=r"cannot share one parquet type.*export sessions with different tool sets"
    ):
        VerlSftExporter._tools_type([tool("a", 5), tool("b", "x")])
