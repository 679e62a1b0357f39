"""hermes-agent (PyPI ``hermes-agent``, tested 0.19.0; Python >= 3.11, < 3.14).

Non-obvious bits:
- Redirected by ``$HERMES_HOME/config.yaml`` (default ``~/.hermes/``): ``model.provider: custom``,
  ``base_url`` (with ``/v1``), ``api_key``, and ``context_length`` (without it, it asks the server
  and models.dev for the model's context). ``hermes -z PROMPT`` is its one-shot, approvals bypassed.
- ``User-Agent: OpenAI/Python 2.24.0`` and no session id of its own: it is named by its tool set
  (``terminal``, ``delegate_task``, ``session_search``, ``skill_view`` ...). Runs without ``/s/ID``
  are grouped by their conversation's opening, whose system prompt carries only the date
  ("Conversation started: <day>"): same-day runs of one task share a session, so give each run
  its ``/s/ID`` (``orchard-rec run`` does). Its ``--pass-session-id`` (session id in the system
  prompt) is not honoured by ``-z``.
- Probes: with a local base URL it first asks what server this is (LM Studio
  ``/api/v1/models``, Ollama ``/api/tags``, llama.cpp ``/v1/props`` and ``/props``, vLLM
  ``/version``, and the server root, from ``python-httpx``), and it lists ``/v1/models``
  (``python-requests``). The proxy relays these and records none of them (they would name the
  session after an HTTP library).
- History quirk: the assistant's text is whitespace-stripped before it is resent
  (``"file.\\n<tool_call>"`` comes back as ``"file.<tool_call>"``), so the next prompt never
  extends the last generation: ``--on-mismatch realign`` keeps the run one sample with the exact
  generated ids (the observation delta comes from the new prompt).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["HERMES"]


class _Hermes(Harness):
    def config_yaml(self, proxy: str, session: str | None, model: str) -> str:
        # JSON is YAML: values quoted exactly, no YAML dependency.
        return (
            "model:\n"
            "  provider: custom\n"
            f"  default: {json.dumps(model)}\n"
            f"  base_url: {json.dumps(self.base_url(proxy, session))}\n"
            '  api_key: "sk-orchard"\n'
            "  context_length: 128000\n"
        )

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            '# $HERMES_HOME/config.yaml (default ~/.hermes/config.yaml); then: hermes -z "..."\n'
            + self.config_yaml(proxy, session, model)
        )

    def prepare(
        self,
        home: Path,
        workdir: Path,
        proxy: str,
        session: str | None,
        model: str,
        args: list[str],
        binary: str | None,
    ) -> Launch:
        hh = home / "hermes"
        hh.mkdir(parents=True, exist_ok=True)
        (hh / "config.yaml").write_text(self.config_yaml(proxy, session, model))
        argv = [self.binary(binary), "-z", *args]
        return Launch(argv, {"HERMES_HOME": str(hh)}, workdir)


HERMES = _Hermes(
    name="hermes",
    command="hermes",
    cache_bin="hermes/bin/hermes",
    version="0.19.0",
    npm=(),
    pypi=("hermes-agent==0.19.0",),
    python=(3, 11, 0),
    python_below=(3, 14),
    dialect="chat",
    session_headers=(),
    tool_marks=("terminal", "delegate_task", "session_search", "skill_view"),
    probes=("/", "/api/v1/models", "/api/tags", "/v1/props", "/props", "/version", "/v1/models"),
    probe_agents=("python-httpx", "python-requests"),
    on_mismatch="realign",
    history="assistant text whitespace-stripped when resent: realign (exact generated ids, one sample)",
)
