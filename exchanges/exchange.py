"""The Exchange base class: binding bookkeeping shared by every exchange type.

An exchange holds bindings ``(destination, routing_key, arguments)``. A
destination is any hashable the caller chooses (a queue or exchange object);
this package never looks inside it. As in RabbitMQ a binding's identity is the
whole triple, so binding the same triple twice makes one binding, while the
same destination bound twice with different keys or arguments has two.

Subclasses implement ``route`` and keep their own index up to date through
``_index_add`` / ``_index_remove``, which the base class calls exactly once per
binding that appears or disappears.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any, ClassVar

from .field_equality import canonical_table

# (routing_key, canonical arguments): a binding's identity within one destination.
_BindingKey = tuple[str, tuple[Any, ...]]


class Exchange:
    """Base class; see the module docstring. Not routable itself."""

    type_name: ClassVar[str] = ""
    #: True only for the headers exchange: only then must the caller decode message headers for ``route``.
    needs_headers: ClassVar[bool] = False

    def __init__(self, name: str, *, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments) if arguments else {}
        self.alternate_exchange: str | None = _alternate_exchange(self.arguments)
        # destination -> {(routing_key, canonical args): original args}
        self._by_destination: dict[Hashable, dict[_BindingKey, dict[str, Any]]] = {}
        self._count = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} bindings={self._count}>"

    def use_policy_alternate(self, name: str | None) -> None:
        """A policy's alternate exchange (None: no policy gives one); the exchange's own
        alternate-exchange argument wins over it, as in RabbitMQ."""
        own = _alternate_exchange(self.arguments)
        self.alternate_exchange = own if own is not None else name

    # -- bindings ---------------------------------------------------------

    def bind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any] | None) -> bool:
        """Add a binding; True if it was new. Raises InvalidBindingArguments if the type rejects ``arguments``."""
        self._validate_binding_arguments(arguments or {})
        key = (routing_key, canonical_table(arguments))
        existing = self._by_destination.setdefault(destination, {})
        if key in existing:
            return False
        args = dict(arguments) if arguments else {}
        existing[key] = args
        self._count += 1
        self._index_add(destination, routing_key, args)
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: dict[str, Any] | None) -> bool:
        """Remove a binding; True if it existed. Unbinding a missing binding is not an error."""
        existing = self._by_destination.get(destination)
        if existing is None:
            return False
        args = existing.pop((routing_key, canonical_table(arguments)), None)
        if args is None:
            return False
        if not existing:
            del self._by_destination[destination]
        self._count -= 1
        self._index_remove(destination, routing_key, args)
        return True

    def unbind_destination(self, destination: Hashable) -> int:
        """Remove every binding to ``destination`` (it was deleted); return how many there were."""
        existing = self._by_destination.pop(destination, None)
        if not existing:
            return 0
        for (routing_key, _), args in existing.items():
            self._index_remove(destination, routing_key, args)
        self._count -= len(existing)
        return len(existing)

    def has_binding(self, destination: Hashable, routing_key: str, arguments: dict[str, Any] | None) -> bool:
        existing = self._by_destination.get(destination)
        return existing is not None and (routing_key, canonical_table(arguments)) in existing

    def bindings(self) -> list[tuple[Hashable, str, dict[str, Any]]]:
        """Every binding as ``(destination, routing_key, arguments)``; the argument dicts are copies."""
        return [(destination, routing_key, dict(args))
                for destination, existing in self._by_destination.items()
                for (routing_key, _), args in existing.items()]

    def bindings_to(self, destination: Hashable) -> list[tuple[str, dict[str, Any]]]:
        """The ``(routing_key, arguments)`` of every binding to ``destination``; the argument dicts are copies."""
        existing = self._by_destination.get(destination)
        if not existing:
            return []
        return [(routing_key, dict(args)) for (routing_key, _), args in existing.items()]

    def binding_count(self) -> int:
        return self._count

    # -- routing ----------------------------------------------------------

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """The destinations a message with this key (and headers) goes to, each once.

        For speed the result may be an internal collection of the exchange (or a
        live view of one): the caller must not modify it, and must finish using
        it (or copy it) before the next bind/unbind on this exchange.
        """
        raise NotImplementedError

    # -- hooks for subclasses --------------------------------------------

    def _validate_binding_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise InvalidBindingArguments if this type rejects the arguments. Default: accept all."""

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        raise NotImplementedError

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        raise NotImplementedError


def _alternate_exchange(arguments: dict[str, Any]) -> str | None:
    value = arguments.get("alternate-exchange")
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return None
