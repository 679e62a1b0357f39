"""Running mitmproxy as a library with the orchard-rec addon, and its CA for clients."""

from __future__ import annotations

import asyncio
import re
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path

from orchard_rec.intercept.config import InterceptConfig

__all__ = ["CaInfo", "ca_info", "run_intercept"]


@dataclass(frozen=True)
class CaInfo:
    cert: Path
    """mitmproxy's CA certificate (PEM): what a client must trust."""
    bundle: Path
    """The system's CA bundle plus that certificate: for SSL_CERT_FILE / REQUESTS_CA_BUNDLE, so the
    harness still verifies every host that is not intercepted."""

    def env(self) -> dict[str, str]:
        return {
            "SSL_CERT_FILE": str(self.bundle),
            "REQUESTS_CA_BUNDLE": str(self.bundle),
            "CURL_CA_BUNDLE": str(self.bundle),
            "NODE_EXTRA_CA_CERTS": str(self.cert),
        }


def ca_info(confdir: str | Path) -> CaInfo:
    """Create mitmproxy's CA in ``confdir`` if it is not there yet; write the combined bundle."""
    from mitmproxy import certs
    from mitmproxy.options import KEY_SIZE

    confdir = Path(confdir).expanduser()
    certs.CertStore.from_store(confdir, "mitmproxy", KEY_SIZE)
    cert = confdir / "mitmproxy-ca-cert.pem"
    bundle = confdir / "orchard-ca-bundle.pem"
    paths = ssl.get_default_verify_paths()
    system = next(
        (
            Path(p)
            for p in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt")
            if p and Path(p).is_file() and Path(p).resolve() != bundle.resolve()
        ),
        Path(""),
    )
    parts = [system.read_bytes()] if system.is_file() else []
    parts.append(cert.read_bytes())
    data = b"\n".join(parts)
    if not bundle.exists() or bundle.read_bytes() != data:
        tmp = bundle.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(bundle)
    return CaInfo(cert, bundle)


def _allow(hosts: tuple[str, ...]) -> list[str]:
    return [rf"^{re.escape(h)}:\d+$" for h in hosts]


async def _main(config: InterceptConfig, verbose: bool) -> None:
    from mitmproxy import options
    from mitmproxy.tools.dump import DumpMaster

    from orchard_rec.intercept.addon import InterceptAddon

    opts = options.Options(
        listen_host=config.listen_host, listen_port=config.listen_port, confdir=config.confdir
    )
    master = DumpMaster(opts, with_termlog=verbose, with_dumper=False)
    opts.update(
        allow_hosts=_allow(config.hosts),
        # with an override the real host is never needed: don't connect to it at CONNECT time
        connection_strategy="lazy" if config.upstream_override else "eager",
        ssl_insecure=config.ssl_insecure,
        ssl_verify_upstream_trusted_ca=config.upstream_ca,
        http2=True,
    )
    master.addons.add(InterceptAddon(config))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()


def run_intercept(config: InterceptConfig, *, verbose: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; the recorder drains before the process exits."""
    ca_info(config.confdir)
    asyncio.run(_main(config, verbose))
