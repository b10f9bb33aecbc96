"""The x-delayed-message exchange type (the rabbitmq-delayed-message-exchange plugin's).

Declared with `x-delayed-type` naming another exchange type, it routes exactly like that type
(its bindings live in an exchange of that type), except that a message carrying a positive
`x-delay` header (milliseconds) is held until the delay passes and only then routed. Holding
(and reading x-delay) is not this package's business: the vhost keeps the held messages
(queues/delays/delayed_exchange.py) and hands them back to `route` when due.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any

from .errors import UnknownExchangeType
from .exchange import Exchange

TYPE_NAME = "x-delayed-message"


class InvalidDelayedType(ValueError):
    """`x-delayed-type` is missing or not text (406 PRECONDITION_FAILED with this text)."""

    def __init__(self) -> None:
        super().__init__("Invalid argument, 'x-delayed-type' must be an existing exchange type")


class DelayedMessageExchange(Exchange):
    """Routes like its `x-delayed-type`; `pending` is the vhost's store of held messages."""

    type_name = TYPE_NAME

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        from .registry import EXCHANGE_TYPES  # the registry lists this type too

        inner_type = self.arguments.get("x-delayed-type")
        if isinstance(inner_type, (bytes, bytearray)):
            inner_type = bytes(inner_type).decode("utf-8", "replace")
        if not isinstance(inner_type, str):
            raise InvalidDelayedType()
        if inner_type not in EXCHANGE_TYPES or inner_type == TYPE_NAME:
            raise UnknownExchangeType(inner_type)
        self._inner = EXCHANGE_TYPES[inner_type](name)
        self.needs_headers = self._inner.needs_headers  # type: ignore[misc]
        self.pending: Any = None  # where held messages wait (hold_in)

    def hold_in(self, pending: Any) -> None:
        """Hold messages routed here in `pending` until their x-delay passes (queues/delays)."""
        self.pending = pending

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        return self._inner.route(routing_key, headers)

    def _validate_binding_arguments(self, arguments: dict[str, Any]) -> None:
        self._inner._validate_binding_arguments(arguments)

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self._inner._index_add(destination, routing_key, arguments)

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self._inner._index_remove(destination, routing_key, arguments)
