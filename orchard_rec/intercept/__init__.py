"""Intercept mode: record harnesses that cannot be pointed at a base URL (mitmproxy).

``orchard-rec intercept`` runs mitmproxy as a library with ``InterceptAddon``: the
harness runs with ``HTTPS_PROXY`` pointing at it and trusts mitmproxy's CA; calls to the
LLM API hosts are recorded by the same core as the HTTP proxy (``proxy.core.Call``: the addon
feeds it headers and bytes and holds no policy of its own), other traffic is tunnelled untouched.

Owns: ``addon`` (mitmproxy hooks driving the core), ``config``, ``run`` (mitmproxy as a library),
``runtime`` (the runtime venv), ``servers`` (the ``--upstream-override`` servers through
``serve``'s own fleet, policy tracker and tito continuation). May import the public names of
``orchard_rec.proxy`` (core, capture, recorder, identity, server, fleet, versions, partial,
titocall), ``dialects``, ``errors``, ``records``, ``storage``; never a private (underscored) name
of another package.

mitmproxy is an optional extra (``pip install 'orchard-rec[mitm]'``, Python >= 3.12 for
mitmproxy 12). Where the running Python has no mitmproxy, ``orchard-rec intercept
--install`` builds a runtime venv for it (``runtime.py``) and the command runs from there.
"""

from orchard_rec.intercept.config import DEFAULT_HOSTS, InterceptConfig

__all__ = ["DEFAULT_HOSTS", "InterceptConfig"]
