"""ZeroClaw (a Rust binary from crates.io / GitHub releases; not installable from the
registries this project reaches, so it is configured here and tested at the HTTP level).

Non-obvious bits (from its source and test fixtures, config schema v3):
- ``[providers.models.custom.<name>]`` with ``uri`` (base URL with ``/v1``), ``api_key``,
  ``model``, ``wire_api`` (``chat_completions`` | ``responses``) and ``native_tools = true``
  (without it the custom slot sends no tools and expects ``<tool_call>`` text). An agent's
  ``model_provider`` must name the slot (its default is ``openrouter.default``).
- Its OpenAI-compatible provider sends ``model, messages, temperature`` (always),
  ``tools`` and ``tool_choice: "auto"``, ``stream``; tool-call ids it makes itself are 9
  alphanumerics. No session header: use the ``/s/{id}`` route.
- ``[reliability] provider_retries = 0`` keeps retries from duplicating calls.
"""

from __future__ import annotations

from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["ZEROCLAW"]


class _ZeroClaw(Harness):
    def config_toml(self, proxy: str, session: str | None, model: str) -> str:
        return (
            "schema_version = 3\n\n[reliability]\nprovider_retries = 0\n\n"
            f'[providers.models.custom.orchard]\nuri = "{self.base_url(proxy, session)}"\napi_key = "sk-orchard"\n'
            f'model = "{model}"\nwire_api = "chat_completions"\nnative_tools = true\n\n'
            '[agents.main]\nmodel_provider = "custom.orchard"\n'
        )

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return "# ~/.zeroclaw/config.toml (or --config-dir DIR / ZEROCLAW_CONFIG_DIR)\n" + self.config_toml(
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
        cfg = home / ".zeroclaw"
        cfg.mkdir(parents=True, exist_ok=True)
        (cfg / "config.toml").write_text(self.config_toml(proxy, session, model))
        argv = [self.binary(binary), "--config-dir", str(cfg), "agent", "-m", *args]
        return Launch(argv, {"ZEROCLAW_CONFIG_DIR": str(cfg)}, workdir)


ZEROCLAW = _ZeroClaw(
    name="zeroclaw",
    command="zeroclaw",
    npm=(),
    dialect="chat",
    session_headers=(),
    user_agents=("zeroclaw",),
    history="untested against the real binary",
)
