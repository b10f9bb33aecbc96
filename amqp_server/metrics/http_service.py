"""An aiohttp application listening on one port of the broker's event loop.

Shared by the Prometheus endpoint and the management API: start, learn the bound port (port 0
binds an ephemeral one, which tests use), stop. One application may listen on a plain port, an
HTTPS port, or both (one runner, two sites, so the app's background tasks run once).
"""

from __future__ import annotations

import logging
import ssl

from aiohttp import web

log = logging.getLogger(__name__)


class HttpService:
    def __init__(self, app: web.Application, host: str, port: int | None, description: str,
                 tls_port: int | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        """`port` None: no plain HTTP; `tls_port` with `ssl_context`: HTTPS as well."""
        self.app = app
        self.host = host
        self.port = port
        self.tls_port = tls_port if ssl_context is not None else None
        self.ssl_context = ssl_context
        self.description = description
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        # access_log=None: no log line per request (scrapes come every few seconds).
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        if self.port is not None:
            await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()
            self.port = self._runner.addresses[-1][1]
            log.info("%s listening on http://%s:%d/", self.description, self.host, self.port)
        if self.tls_port is not None:
            site = web.TCPSite(self._runner, self.host, self.tls_port, reuse_address=True,
                               ssl_context=self.ssl_context)
            await site.start()
            self.tls_port = self._runner.addresses[-1][1]
            log.info("%s listening on https://%s:%d/", self.description, self.host, self.tls_port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
