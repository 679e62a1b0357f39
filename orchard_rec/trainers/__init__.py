"""Glue that plugs recorded samples into RL trainers (torch only as an optional extra).

Import the submodule you need; nothing here imports torch until you do:
``trainers.slime`` (rollout and generate plug-ins), ``trainers.verl`` (agent-loop outputs),
``trainers.dataset`` and ``trainers.sft`` (torch, the ``train`` extra), ``trainers.slime_compat``
(slime's ``Sample`` contract without slime).
"""

__all__: list[str] = []
