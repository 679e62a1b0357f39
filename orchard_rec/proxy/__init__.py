"""The recording proxy: OpenAI- and Anthropic-compatible HTTP front door (aiohttp).

``build_app(ProxyConfig(...))`` gives the aiohttp application; ``run_forever`` and
``BackgroundServer`` run it. Handlers hand finished calls to the ``Recorder`` and
never wait on SQL.
"""

from orchard_rec.proxy.app import build_app, dialect_of
from orchard_rec.proxy.config import Mode, ProxyConfig
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.proxy.server import BackgroundServer, run_forever

__all__ = ["BackgroundServer", "Mode", "ProxyConfig", "Recorder", "build_app", "dialect_of", "run_forever"]
