"""Start and stop the broker's HTTP services: Prometheus metrics and the management API.

`serve()` calls these; a port of 0 in the configuration disables that service. A service
whose port cannot be bound (another broker or RabbitMQ holds it) is logged as an error and
left out: the AMQP listener, which clients depend on, keeps running without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from amqp_server.management.app import build_management_app
from amqp_server.metrics.http_endpoint import build_metrics_app
from amqp_server.metrics.http_service import HttpService

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.config import ServerConfig

log = logging.getLogger(__name__)


async def start_http_services(config: "ServerConfig", broker: "Broker", amqp_port: int) -> list[HttpService]:
    """Start the enabled services; the caller stops them with `stop_http_services`."""
    listeners = [{"protocol": "amqp", "port": amqp_port}]
    if config.management_port:
        listeners.append({"protocol": "http", "port": config.management_port})
    if config.metrics_port:
        listeners.append({"protocol": "http/prometheus", "port": config.metrics_port})
    services = []
    if config.metrics_port:
        services.append(
            HttpService(build_metrics_app(broker), config.host, config.metrics_port,
                        "Prometheus metrics")
        )
    if config.management_port:
        services.append(
            HttpService(build_management_app(broker, listeners=listeners, settings=config.management), config.host,
                        config.management_port, "Management API")
        )
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
