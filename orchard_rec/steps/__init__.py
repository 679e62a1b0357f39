"""Steps from traffic: what an agent did, read back from the conversation it sent.

A step is one tool call the model made and the tool result that answered it, in order,
with the turn (assistant message) it belongs to. ``parse_steps(dialect, request,
response)`` reads the last call of a session (its request holds the whole history,
its response the final answer) as its dialect reads it: the registry's dialect turns the
stored bodies into neutral turns (``dialects.turns_of``: Chat Completions' ``tool_calls`` and
``tool`` messages, Responses' ``function_call`` / ``custom_tool_call`` items and their outputs
(Codex), Anthropic's ``tool_use`` / ``tool_result`` blocks (Claude Code), any other dialect
through its chat view), so a dialect added by an entry point needs no edit here. What a tool *means* (a shell
command, a read, an edit of which files) comes from per-harness vocabularies in
``tools.py``; exit codes from the result conventions each harness uses (Codex's
``Process exited with code N``, hermes' ``{"exit_code": N}``, mini-swe-agent's
``<returncode>N</returncode>``, Claude Code's ``is_error``, Kimi's ``<system>`` line).

Owns: the ``Step`` record and the parsers. May import: the standard library, orjson and
``orchard_rec.dialects`` (a dialect's neutral turns); never proxy, storage or exporters.
"""

from orchard_rec.steps.parse import Step, parse_steps, steps_of_messages

__all__ = ["Step", "parse_steps", "steps_of_messages"]
