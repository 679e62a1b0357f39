"""Claude Code (npm ``@anthropic-ai/claude-code``, tested 2.1.332).

Non-obvious bits:
- ``ANTHROPIC_BASE_URL`` without ``/v1``; it posts ``/v1/messages?beta=true`` (query string),
  always streaming, with ``thinking``, ``context_management`` and ``output_config`` fields
  and ``role: "system"`` entries inside ``messages`` (mapped to system messages).
- Session: header ``X-Claude-Code-Session-Id``, also inside ``metadata.user_id`` (a JSON string).
- History is resent but not byte-stable (``cache_control`` moves, a text block becomes a
  string): equal once rendered, so its sessions still merge exactly.
- Side requests (memory passes...) carry ``x-claude-code-auxiliary-type: <kind>`` (from its
  source; none in a ``-p`` tool task): recorded as auxiliary, their own samples.
- ``--dangerously-skip-permissions`` is refused as root; ``--allowedTools Bash`` suffices.
- Without ``ANTHROPIC_BASE_URL`` (``orchard-rec intercept``: it calls api.anthropic.com itself) it
  opens ``system`` with an ``x-anthropic-billing-header: ...; cch=<checksum>;`` text block that
  changes on every request; translation to chat drops it (accounting, not prompt), so the session
  stays one exact sample.
"""

from __future__ import annotations

from pathlib import Path

from orchard_rec.harnesses.base import Harness, Launch

__all__ = ["CLAUDE_CODE"]


class _ClaudeCode(Harness):
    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        return (
            f"export ANTHROPIC_BASE_URL={self.base_url(proxy, session)}\n"
            f"export ANTHROPIC_MODEL={model} ANTHROPIC_SMALL_FAST_MODEL={model}\n"
            'claude -p "..." --output-format json\n'
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
        cfg = home / ".claude"
        cfg.mkdir(parents=True, exist_ok=True)
        env = {
            "CLAUDE_CONFIG_DIR": str(cfg),
            "CLAUDE_CODE_TMPDIR": str(home / "tmp"),
            "ANTHROPIC_BASE_URL": self.base_url(proxy, session),
            "ANTHROPIC_API_KEY": "sk-ant-orchard",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_BUG_COMMAND": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        argv = [
            self.binary(binary),
            "-p",
            *args,
            "--output-format",
            "json",
            "--model",
            model,
            "--allowedTools",
            "Bash",
            "--permission-mode",
            "acceptEdits",
            "--max-turns",
            "8",
        ]
        return Launch(argv, env, workdir)


CLAUDE_CODE = _ClaudeCode(
    name="claude-code",
    command="claude",
    cache_bin="claude/node_modules/.bin/claude",
    npm=("@anthropic-ai/claude-code@2.1.332",),
    dialect="messages",
    base_path="",  # the SDK adds /v1/messages
    version="2.1.332",
    user_agents=("claude-cli",),
    header_marks=(("x-claude-code-session-id", ""),),
    session_headers=("x-claude-code-session-id",),
    side_headers=("x-claude-code-auxiliary-type",),
    history="cache_control moves, text blocks become strings: same rendering, one exact sample as recorded",
)
