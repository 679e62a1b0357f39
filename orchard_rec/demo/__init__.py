"""The bundled demo: a vLLM-compatible upstream with a tiny tokenizer, a scripted agent,
and ``run_demo`` which ties them to a proxy on SQLite (``orchard-rec demo``). ``vision``: Qwen2-VL's
image-token arithmetic for the upstream's VLM mode (``--vlm``); ``gui``: a screenshot-sending agent."""

from orchard_rec.demo.agent import SHELL_TOOL, run_agent
from orchard_rec.demo.model import ScriptedModel
from orchard_rec.demo.tokenizer import build_tokenizer, save_tokenizer
from orchard_rec.demo.upstream import DemoUpstream

__all__ = ["SHELL_TOOL", "DemoUpstream", "ScriptedModel", "build_tokenizer", "run_agent", "save_tokenizer"]
