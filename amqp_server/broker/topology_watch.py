"""Telling components above the broker about topology changes: exchanges, queues, bindings, policies.

A component that acts on the topology (federation: a federated exchange's bindings go
upstream, a policy starts or stops links) registers a `TopologyWatcher` with the broker's
`TopologyWatchers`; every vhost tells them each exchange and queue that appears or goes, each
binding that appears or goes (those that go with a deleted queue or exchange too), and each
change of its policies. Nothing here runs per message, and with no watcher registered a change
costs one test.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost
    from exchanges.exchange import Exchange
    from queues.queue import Queue

log = logging.getLogger(__name__)


class TopologyWatcher(Protocol):
    def exchange_added(self, vhost: "VirtualHost", exchange: "Exchange") -> None: ...

    def exchange_removed(self, vhost: "VirtualHost", exchange: "Exchange") -> None: ...

    def queue_added(self, vhost: "VirtualHost", queue: "Queue") -> None: ...

    def queue_removed(self, vhost: "VirtualHost", queue: "Queue") -> None: ...

    def binding_added(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                      arguments: dict[str, Any]) -> None: ...

    def binding_removed(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                        arguments: dict[str, Any]) -> None: ...

    def policies_changed(self, vhost: "VirtualHost") -> None: ...


class TopologyWatchers:
    """The registered watchers; each hears every change, in the order they registered. A
    watcher's failure is logged and never undoes the change or reaches the client."""

    def __init__(self) -> None:
        self._watchers: list[TopologyWatcher] = []

    def __bool__(self) -> bool:
        return bool(self._watchers)

    def watch(self, watcher: TopologyWatcher) -> None:
        """`watcher` hears every change from now on."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: TopologyWatcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def _tell(self, event: str, *args: Any) -> None:
        for watcher in list(self._watchers):
            try:
                getattr(watcher, event)(*args)
            except Exception:
                log.exception("%r failed on %s", watcher, event)

    def exchange_added(self, vhost: "VirtualHost", exchange: "Exchange") -> None:
        self._tell("exchange_added", vhost, exchange)

    def exchange_removed(self, vhost: "VirtualHost", exchange: "Exchange") -> None:
        self._tell("exchange_removed", vhost, exchange)

    def queue_added(self, vhost: "VirtualHost", queue: "Queue") -> None:
        self._tell("queue_added", vhost, queue)

    def queue_removed(self, vhost: "VirtualHost", queue: "Queue") -> None:
        self._tell("queue_removed", vhost, queue)

    def binding_added(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                      arguments: dict[str, Any]) -> None:
        self._tell("binding_added", vhost, source, destination, routing_key, arguments)

    def binding_removed(self, vhost: "VirtualHost", source: "Exchange", destination: Hashable, routing_key: str,
                        arguments: dict[str, Any]) -> None:
        self._tell("binding_removed", vhost, source, destination, routing_key, arguments)

    def policies_changed(self, vhost: "VirtualHost") -> None:
        self._tell("policies_changed", vhost)
