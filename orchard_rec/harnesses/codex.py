"""Codex CLI (npm ``@openai/codex``, tested 0.171.0).

Non-obvious bits:
- It speaks only the Responses API, always streaming, and resends the full history each
  turn (``store: false``); in token mode the proxy translates it to chat completions.
- ``OPENAI_BASE_URL`` is ignored: it is redirected by a ``[model_providers.X]`` entry in
  ``$CODEX_HOME/config.toml`` with ``wire_api = "responses"``. A custom provider never tries
  the Responses WebSocket; the built-in one does, and the proxy refuses the upgrade with a
  426 at once so it falls back to HTTP.
- Session: headers ``session-id`` (= thread id), ``x-codex-turn-metadata`` (turn id per user
  turn). Tools include a ``namespace`` (flattened) and hosted ``web_search`` (dropped).
- No side conversation seen in ``exec`` (every call's ``request_kind`` is ``turn``).
- ``plugins``/``remote_plugin`` features are turned off only to stop an offline plugin sync.
"""

from __future__ import annotations

from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["CODEX"]


class _Codex(Harness):
    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            f'# $CODEX_HOME/config.toml (default ~/.codex/config.toml); then: PROXY_API_KEY=... codex exec "..."\n'
            f'model = "{model}"\nmodel_provider = "orchard"\n\n[model_providers.orchard]\nname = "orchard"\n'
            f'base_url = "{self.base_url(proxy, session)}"\nwire_api = "responses"\nenv_key = "PROXY_API_KEY"\n'
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
        codex_home = home / "codex-home"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "orchard"\napproval_policy = "never"\n'
            "[features]\nplugins = false\nremote_plugin = false\n[analytics]\nenabled = false\n[feedback]\nenabled = false\n"
            '[history]\npersistence = "none"\n'
            f'[model_providers.orchard]\nname = "orchard"\nbase_url = "{self.base_url(proxy, session)}"\nwire_api = "responses"\n'
            'env_key = "PROXY_API_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
        )
        argv = [
            self.binary(binary),
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
            "--json",
            "--color",
            "never",
            *args,
        ]
        return Launch(argv, {"CODEX_HOME": str(codex_home), "PROXY_API_KEY": "sk-orchard"}, workdir)


CODEX = _Codex(
    name="codex",
    command="codex",
    cache_bin="codex/node_modules/.bin/codex",
    npm=("@openai/codex@0.171.0",),
    dialect="responses",
    version="0.171.0",
    user_agents=("codex",),
    header_marks=(("originator", "codex"),),
    session_headers=("session-id", "thread-id"),
    history="resent verbatim (store=false): one exact sample as recorded",
)
