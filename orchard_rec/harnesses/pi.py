"""pi (npm ``@mariozechner/pi-coding-agent``, tested 0.73.1; Node >= 20.6).

Non-obvious bits:
- Redirected by ``$PI_CODING_AGENT_DIR/models.json`` (default ``~/.pi/agent/``): a provider with
  ``baseUrl`` (with ``/v1``), ``api: "openai-completions"`` and ``apiKey`` (an env var name or a
  literal). ``--offline`` stops its version check and install telemetry.
- Its requests look like any OpenAI JS SDK's (``User-Agent: OpenAI/JS 6.26.0``) and name no
  session by default; the written config turns on ``compat.sendSessionAffinityHeaders``, so it
  sends ``session_id`` = ``x-session-affinity`` = its per-run session id, which names it and
  its session.
- History: assistant text and tool-call ids come back verbatim, tool-call arguments
  re-serialised (compact ``JSON.stringify``), which renders the same: one exact sample (split).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["PI"]


class _Pi(Harness):
    def models_json(self, proxy: str, session: str | None, model: str) -> dict[str, Any]:
        return {
            "providers": {
                "orchard": {
                    "baseUrl": self.base_url(proxy, session),
                    "api": "openai-completions",
                    "apiKey": "ORCHARD_PROXY_KEY",
                    "compat": {"sendSessionAffinityHeaders": True},
                    "models": [{"id": model, "contextWindow": 128000, "maxTokens": 4096}],
                }
            }
        }

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            "// $PI_CODING_AGENT_DIR/models.json (default ~/.pi/agent/models.json); then:\n"
            f'// ORCHARD_PROXY_KEY=... pi --provider orchard --model {model} -p "..."\n'
            + json.dumps(self.models_json(proxy, session, model), indent=2)
            + "\n"
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
        agent = home / "pi"
        agent.mkdir(parents=True, exist_ok=True)
        (agent / "models.json").write_text(json.dumps(self.models_json(proxy, session, model), indent=2))
        argv = [
            self.binary(binary),
            "--offline",
            "--no-session",
            "--no-extensions",
            "--no-skills",
            "--no-context-files",
            "--provider",
            "orchard",
            "--model",
            model,
            "-p",
            *args,
        ]
        env = {"PI_CODING_AGENT_DIR": str(agent), "PI_OFFLINE": "1", "ORCHARD_PROXY_KEY": "sk-orchard"}
        return Launch(argv, env, workdir)


PI = _Pi(
    name="pi",
    command="pi",
    cache_bin="pi/node_modules/.bin/pi",
    version="0.73.1",
    npm=("@mariozechner/pi-coding-agent@0.73.1",),
    dialect="chat",
    session_headers=("session_id", "x-session-affinity"),
    header_marks=(("session_id", ""),),
    history="tool-call arguments re-serialised (same rendering): one exact sample as recorded",
)
