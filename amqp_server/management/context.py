"""What every management request handler needs: the broker, the caller, rates.

One `ManagementContext` per application, reachable from a request with `context(request)`;
the authenticated user with `caller(request)`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.connection.views import connections_of
from amqp_server.management.message_stats import broker_message_counts, queue_depth_counts, queue_message_counts
from amqp_server.management.connection_json import connection_traffic
from amqp_server.management.login_throttle import LoginThrottle
from amqp_server.management.rates import RateSampler
from amqp_server.management.request_guard import RequestPolicy
from amqp_server.management.ui_sessions import UiSessions
from amqp_server.metrics.broker_view import queue_depth, take_snapshot, vhost_totals
from amqp_server.metrics.process_stats import ProcessStats

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.management.caller import Caller
    from amqp_server.config.tls import TlsListenerContext

# (Typed by their annotations: ManagementContext is defined below, Caller imported for types only.)
CONTEXT_KEY: web.AppKey[ManagementContext] = web.AppKey("management_context")
# aiohttp 3.12+ types request keys; older versions take a plain string.
CALLER_KEY: web.RequestKey[Caller] | str = (
    web.RequestKey("management_caller") if hasattr(web, "RequestKey") else "management_caller"
)

OVERVIEW_KEY = ("overview",)


@dataclass
class ManagementContext:
    broker: "Broker"
    process_stats: Callable[[], ProcessStats]
    request_policy: RequestPolicy  # which Host names and web origins are served (request_guard.py)
    login_throttle: LoginThrottle  # failed logins per client address
    ui_sessions: UiSessions  # the web UI's logins (session cookies)
    # {"protocol": "amqp"|"amqp/ssl"|"http"|"https"|..., "port": n} for /api/overview's listeners.
    listeners: list[dict[str, Any]] = field(default_factory=list)
    # The overview keeps an hour of samples for its charts (?msg_rates_age=...); other objects two.
    rates: RateSampler = field(default_factory=lambda: RateSampler(history_keys=(OVERVIEW_KEY,)))
    # The TLS listeners' certificate (certificate-expiration check, reload_certificates), if TLS is on.
    tls: "TlsListenerContext | None" = None

    def rate_samples(self) -> Iterator[tuple[Hashable, dict[str, int]]]:
        """Every object's counters now: what the rate sampler records each round."""
        broker = self.broker
        snapshot = take_snapshot(broker)
        overview = broker_message_counts(broker.stats, snapshot.queue_stats)
        overview.update(queue_depth_counts(snapshot.messages_ready, snapshot.messages_unacked))
        yield OVERVIEW_KEY, overview
        for vhost in list(broker.vhosts.values()):
            counts = queue_message_counts(vhost.queue_stats_total(), include_publish=False)
            counts.update(vhost_totals(vhost))
            yield ("vhost", vhost.name), counts
            for queue in list(vhost.queues.values()):
                counts = queue_message_counts(queue.stats)
                counts.update(queue_depth_counts(*queue_depth(queue)))
                yield ("queue", vhost.name, queue.name), counts
        for connection in connections_of(broker):
            yield ("connection", connection.name), connection_traffic(connection)


def context(request: web.Request) -> ManagementContext:
    return request.app[CONTEXT_KEY]


def caller(request: web.Request) -> "Caller":
    return request[CALLER_KEY]
