"""Start and stop the broker's HTTP services: Prometheus metrics and the management API.

`serve()` calls these; a port of 0 in the configuration disables that service. A service
whose port cannot be bound (another broker or RabbitMQ holds it) is logged as an error and
left out: the AMQP listener, which clients depend on, keeps running without it.

Each service is an `HttpService`: an aiohttp application listening on one port of the broker's
event loop (start, learn the bound port: port 0 binds an ephemeral one, which tests use; stop).
One application may listen on a plain port, an HTTPS port, or both (one runner, two sites, so
the app's background tasks run once). The applications themselves are built by
amqp_server/management/app.py and amqp_server/metrics/http_endpoint.py, which start nothing.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from amqp_server.management.app import build_management_app
from amqp_server.runtime.listening import bound_socket
from amqp_server.metrics.http_endpoint import build_metrics_app

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.config.settings import ServerConfig
    from amqp_server.config.tls import TlsListenerContext

log = logging.getLogger(__name__)


class AmqpListeners(Protocol):
    """The AMQP listeners' ports (server.AMQPServer, once started; None: that listener is off)."""

    @property
    def port(self) -> int | None: ...

    @property
    def tls_port(self) -> int | None: ...


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
            await web.SockSite(self._runner, bound_socket(self.host, self.port)).start()
            self.port = self._runner.addresses[-1][1]
            log.info("%s listening on http://%s:%d/", self.description, self.host, self.port)
        if self.tls_port is not None:
            site = web.SockSite(self._runner, bound_socket(self.host, self.tls_port), ssl_context=self.ssl_context)
            await site.start()
            self.tls_port = self._runner.addresses[-1][1]
            log.info("%s listening on https://%s:%d/", self.description, self.host, self.tls_port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def start_http_services(config: "ServerConfig", broker: "Broker", amqp: AmqpListeners,
                              tls: "TlsListenerContext | None") -> list[HttpService]:
    """Start the enabled services, HTTPS ones too when `tls` is given; the caller stops them with
    `stop_http_services`."""
    # RabbitMQ's protocol names for its listeners, as /api/overview lists them.
    listeners = []
    if amqp.port is not None:
        listeners.append({"protocol": "amqp", "port": amqp.port})
    if amqp.tls_port is not None:
        listeners.append({"protocol": "amqp/ssl", "port": amqp.tls_port})
    if config.management_port:
        listeners.append({"protocol": "http", "port": config.management_port})
    https_management = config.tls.management_port if tls is not None else 0
    https_metrics = config.tls.metrics_port if tls is not None else 0
    if https_management:
        listeners.append({"protocol": "https", "port": https_management})
    if config.metrics_port:
        listeners.append({"protocol": "http/prometheus", "port": config.metrics_port})
    if https_metrics:
        listeners.append({"protocol": "https/prometheus", "port": https_metrics})
    tls_context = tls.context if tls is not None else None
    services = []
    if config.metrics_port or https_metrics:
        services.append(HttpService(build_metrics_app(broker), config.host, config.metrics_port or None,
                                    "Prometheus metrics", https_metrics or None, tls_context))
    if config.management_port or https_management:
        management_app = build_management_app(broker, listeners=listeners, settings=config.management, tls=tls)
        services.append(HttpService(management_app, config.host, config.management_port or None, "Management API",
                                    https_management or None, tls_context))
    started: list[HttpService] = []
    for service in services:
        try:
            await service.start()
        except OSError as error:
            log.error("%s not started: cannot listen on %s:%d: %s", service.description, service.host,
                      service.port, error.strerror or error)
            await service.stop()
            continue
        started.append(service)
    return started


async def stop_http_services(services: Iterable[HttpService]) -> None:
    for service in services:
        await service.stop()
