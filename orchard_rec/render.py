"""Terminal rendering of a sample (the CLI's ``show`` and ``demo``): prompt plain,
observations dim, trained tokens highlighted. CLI side: imports rich; ``reconstruct/`` never does."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from orchard_rec.reconstruct import Sample

__all__ = ["render_sample"]

_TRAINED = "bold green"
_GENERATED_UNTRAINED = "yellow"
_OBSERVATION = "dim cyan"


def _piece(tok: Any, ids: list[int]) -> str:
    if tok is None:
        return " ".join(map(str, ids)) + " "
    try:
        return str(tok.decode(ids, skip_special_tokens=False))
    except TypeError:
        return str(tok.decode(ids))


def render_sample(s: Sample, tok: Any = None, *, prompt_chars: int = 600) -> Panel:
    generated = [False] * s.response_length
    for t in s.turns:
        for i in range(t.start, t.end):
            generated[i] = True
    body = Text()
    prompt = _piece(tok, s.prompt_ids)
    if len(prompt) > prompt_chars:
        body.append(f"[... {len(prompt) - prompt_chars} characters of prompt]\n", style="dim italic")
        prompt = prompt[-prompt_chars:]
    body.append(prompt)
    resp = s.response_ids
    i = 0
    while i < len(resp):  # group runs of the same style so multi-byte tokens decode whole
        style = _TRAINED if s.loss_mask[i] else (_GENERATED_UNTRAINED if generated[i] else _OBSERVATION)
        j = i
        while (
            j < len(resp)
            and (_TRAINED if s.loss_mask[j] else (_GENERATED_UNTRAINED if generated[j] else _OBSERVATION))
            == style
        ):
            j += 1
        body.append(_piece(tok, resp[i:j]), style=style)
        i = j
    trained = sum(s.loss_mask)
    head = (
        f"session {s.session_id}  sample {s.index}  status {s.status}  reward {s.reward}  "
        f"tokens {len(s.tokens)} (prompt {s.prompt_length}, response {s.response_length}, trained {trained})  "
        f"turns {len(s.turns)}  source {s.metadata.get('token_source')}"
    )
    extra = {k: s.metadata[k] for k in ("reason", "split_from", "realigned") if k in s.metadata}
    legend = Text.assemble(
        ("trained", _TRAINED),
        "  ",
        ("generated, not credited", _GENERATED_UNTRAINED),
        "  ",
        ("observation", _OBSERVATION),
        "  prompt",
    )
    parts: list[Any] = [legend]
    if extra:
        parts.append(Text(str(extra), style="magenta"))
    parts.append(body)
    return Panel(Group(*parts), title=head, title_align="left")
