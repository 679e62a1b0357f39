"""Kimi CLI (PyPI ``kimi-cli``, tested 1.50.0; Python >= 3.12.2: 3.12.0/3.12.1 crash at start-up).

1.51.0 and later are archived stubs that only print "no longer maintained": pin 1.50.0.

Non-obvious bits:
- Redirected by ``--config-file FILE`` (TOML): a provider of ``type = "kimi"`` (chat completions)
  with ``base_url`` (with ``/v1``); ``KIMI_SHARE_DIR`` replaces ``~/.kimi``. The ``kimi`` type also
  reads ``KIMI_BASE_URL`` / ``KIMI_API_KEY`` / ``KIMI_MODEL_NAME``, which override the file.
- ``User-Agent: KimiCLI/1.50.0``, ``X-Msh-Platform: kimi_cli``; session: the body field
  ``prompt_cache_key`` = its session id (``kimi -r <id>``). No session header.
- Body adds ``thinking: {"type": "disabled"}`` (ignored by vLLM-style servers) and a
  ``max_completion_tokens`` that shrinks every call.
- History: assistant text, tool-call ids and argument strings verbatim; tool results a list of
  text parts. One exact sample as recorded (split).
"""

from __future__ import annotations

import json
from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["KIMI"]


class _Kimi(Harness):
    def config_toml(self, proxy: str, session: str | None, model: str) -> str:
        return (
            'default_model = "orchard"\ntelemetry = false\n\n'
            "[providers.orchard]\n"
            'type = "kimi"\n'
            f"base_url = {json.dumps(self.base_url(proxy, session))}\n"
            'api_key = "sk-orchard"\n\n'
            "[models.orchard]\n"
            'provider = "orchard"\n'
            f"model = {json.dumps(model)}\n"
            "max_context_size = 128000\n"
        )

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return '# kimi.toml; then: kimi --config-file kimi.toml --print -p "..."\n' + self.config_toml(
            proxy, session, model
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
        share = home / "kimi"
        share.mkdir(parents=True, exist_ok=True)
        cfg = home / "kimi.toml"
        cfg.write_text(self.config_toml(proxy, session, model))
        argv = [
            self.binary(binary),
            "--config-file",
            str(cfg),
            "--work-dir",
            str(workdir),
            "--print",
            "--output-format",
            "stream-json",
            "-p",
            *args,
        ]
        return Launch(argv, {"KIMI_SHARE_DIR": str(share), "KIMI_DISABLE_TELEMETRY": "1"}, workdir)


KIMI = _Kimi(
    name="kimi",
    command="kimi",
    cache_bin="kimi/bin/kimi",
    version="1.50.0",
    npm=(),
    pypi=("kimi-cli==1.50.0",),
    python=(3, 12, 2),
    dialect="chat",
    user_agents=("kimicli/",),
    header_marks=(("x-msh-platform", "kimi_cli"),),
    session_headers=(),
    session_fields=("prompt_cache_key",),
    history="verbatim: one exact sample as recorded",
)
