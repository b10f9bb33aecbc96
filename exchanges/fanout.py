"""The fanout exchange: every message goes to every bound destination; keys are ignored."""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from .destination_counts import add_destination, remove_destination
from .exchange import Exchange


class FanoutExchange(Exchange):
    """Routes to all destinations, each once however many bindings it has."""

    type_name = "fanout"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._destinations: dict[Hashable, int] = {}

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """See Exchange.route: the result is a live view the caller must not keep across binds."""
        return self._destinations.keys()

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        add_destination(self._destinations, destination)

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        remove_destination(self._destinations, destination)
