"""Gemini CLI (npm ``@google/gemini-cli``, tested 0.61.0; Node >= 20).

Non-obvious bits (observed on 0.61.0 through ``serve``):
- Redirected by ``GOOGLE_GEMINI_BASE_URL`` *without* ``/v1`` or ``/v1beta`` (the bundled
  ``@google/genai`` 1.30.0 appends ``/v1beta/models/{model}:streamGenerateContent?alt=sse``);
  plain ``http://`` to a local proxy works (the URL is only checked to parse).
- Auth: the base URL alone makes it pick its ``gateway`` auth type, which 0.61.0's non-interactive
  check then refuses ("Invalid auth method selected."); ``settings.json`` selects
  ``security.auth.selectedType: "gemini-api-key"`` and ``GEMINI_API_KEY`` is the key, sent as
  ``x-goog-api-key`` (never stored). No Google login.
- Always streams (``:streamGenerateContent?alt=sse``); the model is named in the URL (``-m``).
  Body: ``contents``, ``systemInstruction`` (~30k tokens with its 15 tools), ``tools[0].
  functionDeclarations`` with ``parametersJsonSchema``, ``generationConfig`` (``temperature`` 1,
  ``topP`` 0.95, ``topK`` 64, ``thinkingConfig.includeThoughts``).
- Headers: ``User-Agent: GeminiCLI-tui/0.61.0/<model> (linux; x64; terminal)``,
  ``x-goog-api-client: google-genai-sdk/1.30.0 gl-node/v20.20.2``. No session header and no
  session field: runs are tagged by the ``/s/{id}`` base URL; without one the proxy groups calls
  by their opening (system instruction and first user turn).
- ``-p`` runs one prompt non-interactively; ``--approval-mode yolo`` lets it run its shell tool
  (``run_shell_command``) without asking. It reads ``~/.gemini``: ``prepare`` writes
  ``settings.json`` there in the private home (usage statistics, telemetry and update checks off,
  so no other host is contacted).
- History: each call resends ``contents`` whole. The model's turn comes back with our
  ``functionCall`` (its ``id`` kept, keys reordered, a ``thoughtSignature`` added: not prompt), the
  result as a ``functionResponse`` with that ``id`` and ``{"output": ...}``: the same rendering,
  so its prompts extend each other: one exact sample as recorded (split).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["GEMINI_CLI"]


class _GeminiCli(Harness):
    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            "# ~/.gemini/settings.json (0.61.0 refuses the auth type a base URL alone picks):\n"
            '#   {"security": {"auth": {"selectedType": "gemini-api-key"}}}\n'
            f"export GOOGLE_GEMINI_BASE_URL={self.base_url(proxy, session)}\n"
            "export GEMINI_API_KEY=orchard-gemini-key\n"
            f'gemini -m {model} --approval-mode yolo -p "..."\n'
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
        cfg = home / ".gemini"
        cfg.mkdir(parents=True, exist_ok=True)
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "ui": {"hideTips": True},
        }
        (cfg / "settings.json").write_text(json.dumps(settings, indent=2))
        env = {
            "GOOGLE_GEMINI_BASE_URL": self.base_url(proxy, session),
            "GEMINI_API_KEY": "orchard-gemini-key",
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }
        argv = [self.binary(binary), "-m", model, "--approval-mode", "yolo", "-p", *args]
        return Launch(argv, env, workdir)


GEMINI_CLI = _GeminiCli(
    name="gemini-cli",
    command="gemini",
    cache_bin="gemini-cli/node_modules/.bin/gemini",
    npm=("@google/gemini-cli@0.61.0",),
    dialect="gemini",
    base_path="",  # the SDK adds /v1beta/models/...
    version="0.61.0",
    user_agents=("geminicli",),
    session_headers=(),
    history="contents resent whole, calls and results paired by our ids: one exact sample as recorded",
)
