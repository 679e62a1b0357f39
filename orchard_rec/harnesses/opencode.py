"""opencode (npm ``opencode-ai`` + its native Bun binary ``opencode-linux-x64``, tested 1.18.33).

Non-obvious bits:
- Redirected by a config file (``OPENCODE_CONFIG``): a provider using the bundled
  ``@ai-sdk/openai-compatible`` package with ``options.baseURL`` (with ``/v1``); ``model`` and
  ``small_model`` both name it. ``--pure`` / ``OPENCODE_DISABLE_DEFAULT_PLUGINS`` keep it from
  npm-installing its plug-ins at start-up.
- ``User-Agent: opencode/1.18.33 ...``; session: headers ``x-session-id`` = ``x-session-affinity``
  = its session id (``ses_…``) on every call of the run.
- Side conversation: before the agent's calls it asks the model for a session title
  (system "You are a title generator…", no tools) with the same headers. Those calls are
  flagged ``auxiliary = "title"`` and reconstruct into their own sample.
- The prompt reaches the model wrapped in double quotes; tool-call arguments come back
  re-serialised (same rendering): the agent conversation is one exact sample (split).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard_rec.harnesses.base import Harness, Launch, SideConversation

__all__ = ["OPENCODE"]


class _OpenCode(Harness):
    def config(self, proxy: str, session: str | None, model: str) -> dict[str, Any]:
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "orchard": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "orchard",
                    "options": {
                        "baseURL": self.base_url(proxy, session),
                        "apiKey": "{env:ORCHARD_PROXY_KEY}",
                    },
                    "models": {model: {"name": model, "limit": {"context": 128000, "output": 4096}}},
                }
            },
            "model": f"orchard/{model}",
            "small_model": f"orchard/{model}",
            "autoupdate": False,
            "share": "disabled",
            "permission": {"bash": "allow", "edit": "allow", "webfetch": "deny"},
        }

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            '// opencode.json; then: OPENCODE_CONFIG=opencode.json ORCHARD_PROXY_KEY=... opencode run --pure "..."\n'
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
        cfg = home / "opencode.json"
        cfg.write_text(json.dumps(self.config(proxy, session, model), indent=2))
        env = {
            "OPENCODE_CONFIG": str(cfg),
            "ORCHARD_PROXY_KEY": "sk-orchard",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_PURE": "1",
        }
        for var, sub in (
            ("XDG_CONFIG_HOME", ".config"),
            ("XDG_DATA_HOME", ".local/share"),
            ("XDG_CACHE_HOME", ".cache"),
            ("XDG_STATE_HOME", ".local/state"),
        ):
            (home / sub).mkdir(parents=True, exist_ok=True)
            env[var] = str(home / sub)
        argv = [
            self.binary(binary),
            "run",
            "--pure",
            "--format",
            "json",
            "-m",
            f"orchard/{model}",
            "--dir",
            str(workdir),
            *args,
        ]
        return Launch(argv, env, workdir)


OPENCODE = _OpenCode(
    name="opencode",
    command="opencode",
    cache_bin="opencode/node_modules/.bin/opencode",
    version="1.18.33",
    npm=("opencode-ai@1.18.33",),
    dialect="chat",
    user_agents=("opencode/",),
    session_headers=("x-session-id", "x-session-affinity"),
    side_conversations=(SideConversation("title", "You are a title generator"),),
    history="title generation is a side conversation (auxiliary sample); the agent's is one exact sample as recorded",
)
