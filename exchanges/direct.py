"""The direct exchange: a message goes to the bindings whose key equals its routing key."""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from .destination_counts import add_destination, remove_destination
from .exchange import Exchange

_NOTHING: frozenset[Hashable] = frozenset()


class DirectExchange(Exchange):
    """Exact routing-key match, one dict lookup per message."""

    type_name = "direct"

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._by_key: dict[str, dict[Hashable, int]] = {}

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """See Exchange.route: the result is a live view the caller must not keep across binds."""
        counts = self._by_key.get(routing_key)
        return counts.keys() if counts is not None else _NOTHING

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        add_destination(self._by_key.setdefault(routing_key, {}), destination)

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        counts = self._by_key[routing_key]
        remove_destination(counts, destination)
        if not counts:
            del self._by_key[routing_key]
