"""``openrlhf``: jsonl rows of what OpenRLHF's agent executor returns per episode.

OpenRLHF 0.11 (openrlhf/utils/agent.py ``AgentExecutorBase.execute``) hands
``_process_response_into_experience`` (ppo_utils/samples_generator.py) a dict with
``observation_tokens`` (prompt + every action and feedback token), ``action_ranges``
(``[start, end)`` of each model action in ``observation_tokens``), ``rollout_log_probs``
(one per observation token: 0.0 on prompt and feedback, the action's logprob on actions;
the experience maker shifts it by one), ``reward``, ``scores``, ``truncated``, ``prompt``,
``label`` and ``extra_logs``. Action ranges are the credited runs of each generation, so a
credit policy that drops a turn drops its range.

Images are not carried: OpenRLHF's agent executor output has no field for them (its VLM
path re-renders prompts with the processor); a warning says so. Use ``jsonl`` for image
references with their files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.images import warn_images_dropped
from orchard_rec.exporters.jsonl import write_jsonl_rows
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = ["OpenRLHFExporter", "openrlhf_row"]


def openrlhf_row(s: Sample) -> dict[str, Any]:
    p = s.prompt_length
    ranges: list[list[int]] = []
    for i, m in enumerate(s.loss_mask):
        if m:
            if ranges and ranges[-1][1] == p + i:
                ranges[-1][1] += 1
            else:
                ranges.append([p + i, p + i + 1])
    reward = numeric_reward(s.reward)
    return {
        "prompt": s.messages_prompt(),
        "label": None,
        "observation_tokens": s.tokens,
        "action_ranges": ranges,
        "rollout_log_probs": [0.0] * p + s.rollout_log_probs,
        "reward": reward,
        "scores": reward,
        "truncated": s.status == "truncated",
        "extra_logs": {},
        "session_id": s.session_id,
        "index": s.index,
        "group_index": s.group_index,
    }


class OpenRLHFExporter:
    name = "openrlhf"

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        warned: list[bool] = []

        def row(s: Sample) -> dict[str, Any]:
            warn_images_dropped(self.name, s, warned)
            return openrlhf_row(s)

        return write_jsonl_rows(samples, out, row)
