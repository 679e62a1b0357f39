"""MoE routing replay (R3): the experts the server routed each token to, stored compactly.

vLLM with ``--enable-return-routed-experts`` answers, per choice, ``routed_experts``: a base64
``.npy`` array of shape ``(num_tokens - 1, num_layers, num_experts_per_tok)`` (uint8/uint16/int32),
over the prompt (from ``routed_experts_prompt_start``, default 0) and the output; the last
sampled token was never forwarded, so it has no row (``vllm/entrypoints/openai/chat_completion/
protocol.py``, ``.../token_in_token_out/protocol.py``; ``vllm/utils/serial_utils.numpy2base64``).

Stored narrowed to the smallest unsigned width that holds every expert id (1 or 2 bytes, else 4)
and zstd-compressed, behind a 24-byte header (``pack``). Pure standard library: the ``.npy``
header is read here, not by numpy.
"""

from __future__ import annotations

import ast
import base64
import struct
import sys
from array import array
from dataclasses import dataclass

import zstandard

__all__ = ["Routing", "covers", "from_npy_b64", "pack", "to_npy", "unpack"]

_MAGIC = b"\x93NUMPY"
_HEAD = struct.Struct("<4sBxxxIIII")
_TAG = b"RE1\x00"
_CODES = {1: "B", 2: "H", 4: "I"}
_DESCR = {"u1": 1, "i1": 1, "u2": 2, "i2": 2, "u4": 4, "i4": 4, "u8": 8, "i8": 8}


@dataclass(frozen=True, slots=True)
class Routing:
    """``rows`` x ``layers`` x ``topk`` expert ids, little-endian, ``width`` bytes each."""

    rows: int
    layers: int
    topk: int
    width: int
    data: bytes
    prompt_start: int = 0
    """The first prompt token the rows start at (vLLM's ``routed_experts_prompt_start``)."""

    def values(self) -> array[int]:
        a = array(_CODES[self.width])
        a.frombytes(self.data)
        if sys.byteorder == "big":
            a.byteswap()
        return a

    def to_lists(self) -> list[list[list[int]]]:
        """As slime's ``rollout_routed_experts``: ``[row][layer][k]``."""
        v, lk = self.values().tolist(), self.layers * self.topk
        return [
            [v[r * lk + layer * self.topk : r * lk + (layer + 1) * self.topk] for layer in range(self.layers)]
            for r in range(self.rows)
        ]

    @property
    def dtype(self) -> str:
        return {1: "uint8", 2: "uint16", 4: "uint32"}[self.width]


def from_npy_b64(text: str, prompt_start: int = 0) -> Routing:
    """vLLM's ``routed_experts`` field; ``ValueError`` for anything that is not a 3-d integer ``.npy``."""
    raw = base64.b64decode(text, validate=True)
    if not raw.startswith(_MAGIC) or len(raw) < 10:
        raise ValueError("routed_experts is not a .npy array")
    major = raw[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", raw, 8), 10
    else:
        (hlen,), start = struct.unpack_from("<I", raw, 8), 12
    header = ast.literal_eval(raw[start : start + hlen].decode("latin-1"))
    descr, shape = str(header["descr"]), tuple(header["shape"])
    if header.get("fortran_order") or len(shape) != 3 or descr[1:] not in _DESCR:
        raise ValueError(f"routed_experts: expected a C-order 3-d integer array, got {descr} {shape}")
    width = _DESCR[descr[1:]]
    body = raw[start + hlen :]
    values = array(
        {1: "b", 2: "h", 4: "i", 8: "q"}[width]
        if descr[1] == "i"
        else {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
    )
    values.frombytes(body[: shape[0] * shape[1] * shape[2] * width])
    if (descr[0] == ">") != (sys.byteorder == "big") and width > 1:
        values.byteswap()
    return _narrow(values, shape, prompt_start)


def _narrow(values: array[int], shape: tuple[int, ...], prompt_start: int) -> Routing:
    top = max(values, default=0)
    if min(values, default=0) < 0:
        raise ValueError("routed_experts: negative expert id")
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4
    out = array(_CODES[width], values)
    if sys.byteorder == "big":
        out.byteswap()
    return Routing(shape[0], shape[1], shape[2], width, out.tobytes(), prompt_start)


def covers(blob: bytes) -> int:
    """How many tokens from the sequence's first a packed routing has rows for (-1 when its rows
    start later, at ``routed_experts_prompt_start``); read from the header only."""
    _, _, rows, _, _, start = _HEAD.unpack_from(blob)
    return rows if start == 0 else -1


def pack(r: Routing) -> bytes:
    """The stored form: a header, then the ids zstd-compressed."""
    head = _HEAD.pack(_TAG, r.width, r.rows, r.layers, r.topk, r.prompt_start)
    return head + zstandard.ZstdCompressor(level=3).compress(r.data)


def unpack(blob: bytes) -> Routing:
    tag, width, rows, layers, topk, start = _HEAD.unpack_from(blob)
    if tag != _TAG:
        raise ValueError("not a packed routing")
    data = zstandard.ZstdDecompressor().decompress(
        blob[_HEAD.size :], max_output_size=rows * layers * topk * width
    )
    return Routing(rows, layers, topk, width, data, start)


def to_npy(r: Routing) -> bytes:
    """The ``.npy`` bytes (``np.load`` reads them): the parquet export's column."""
    descr = {1: "|u1", 2: "<u2", 4: "<u4"}[r.width]
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({r.rows}, {r.layers}, {r.topk}), }}"
    pad = 64 - (10 + len(header) + 1) % 64
    text = (header + " " * pad + "\n").encode("latin-1")
    return _MAGIC + b"\x01\x00" + struct.pack("<H", len(text)) + text + r.data
