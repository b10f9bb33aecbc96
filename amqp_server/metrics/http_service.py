"""An aiohttp application listening on one port of the broker's event loop.

Shared by the Prometheus endpoint and the management API: start, learn the bound port (port 0
binds an ephemeral one, which tests use), stop.
"""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger(__name__)


class HttpService:
    def __init__(self, app: web.Application, host: str, port: int, description: str) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.description = description
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        # access_log=None: no log line per request (scrapes come every few seconds).
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, reuse_address=True).start()
        self.port = self._runner.addresses[0][1]
        log.info("%s listening on http://%s:%d/", self.description, self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
