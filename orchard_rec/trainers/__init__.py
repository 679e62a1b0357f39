"""Glue that plugs recorded samples into RL trainers (torch only as an optional extra).

Owns: the trainers' in-process plug-ins: ``trainers.slime`` (rollout and generate plug-ins
with slime's signatures), ``trainers.verl`` (agent-loop outputs), ``trainers.dataset`` and
``trainers.sft`` (torch, the ``train`` extra). The data contracts themselves (slime's
``Sample`` fields, verl's ``AgentLoopOutput``) live in ``orchard_rec.exporters.contracts``.

May import: ``exporters``, ``reconstruct``, ``pipeline``, ``storage``, ``errors``, and
(``trainers.slime.generate`` only, at call time) ``proxy`` and ``harnesses`` to run a harness
through a recording proxy. Nothing below imports ``trainers``. Import the submodule you
need; nothing here imports torch until you do.
"""

__all__: list[str] = []
