"""The Prometheus HTTP endpoint: `/metrics`, `/metrics/per-object`, `/metrics/detailed`.

Served by aiohttp on the broker's own event loop, so a scrape reads the broker between two
events and never races it (prometheus_client's own server would scrape from another thread).
The text format or OpenMetrics is chosen from the Accept header, as prometheus_client does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from amqp_server.metrics.detailed_collector import DetailedCollector
from amqp_server.metrics.broker_view import process_stats_of
from amqp_server.metrics.process_stats import ProcessStats

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker


def build_metrics_app(
    broker: "Broker",
    process_stats: Callable[[], ProcessStats] | None = None,
) -> web.Application:
    """The aiohttp application."""
    if process_stats is None:
        process_stats = lambda: process_stats_of(broker)  # noqa: E731
    aggregated = _registry(CoreCollector(broker, AGGREGATED, process_stats))
    per_object = _registry(CoreCollector(broker, PER_OBJECT, process_stats))

    async def metrics(request: web.Request) -> web.Response:
        return _expose(request, aggregated)

    async def metrics_per_object(request: web.Request) -> web.Response:
        return _expose(request, per_object)

    async def metrics_detailed(request: web.Request) -> web.Response:
        query = request.query
        collector = DetailedCollector(broker, query.getall("family", []), query.getall("vhost", []))
        return _expose(request, _registry(collector))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/per-object", metrics_per_object)
    app.router.add_get("/metrics/detailed", metrics_detailed)
    return app


def _registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _expose(request: web.Request, registry: CollectorRegistry) -> web.Response:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = web.Response(body=encoder(registry), headers={"Content-Type": content_type})
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        response.enable_compression()
    return response

