"""What the coordination service holds of the shared definitions, as this node last saw it.

Filled by listings and watches (cluster_definitions.py); read to diff a new listing against, to
find a deleted queue's or exchange's bindings, and to answer who owns a queue.
"""

from __future__ import annotations

from typing import Any

from cluster.definitions.keys import SharedValue

# (vhost, "source" | "queue" | "exchange", name): one end of a binding
BindingEnd = tuple[str, str, str]


def binding_ends(entry: dict[str, Any]) -> tuple[BindingEnd, BindingEnd]:
    vhost = entry["vhost"]
    return (vhost, "source", entry["source"]), (vhost, entry["destination_type"], entry["destination"])


class ServiceMirror:
    """Shared definitions by key, with the bindings of each end indexed."""

    def __init__(self) -> None:
        self._values: dict[str, SharedValue] = {}
        self._bindings_by_end: dict[BindingEnd, set[str]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: str) -> SharedValue | None:
        return self._values.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def items(self) -> list[tuple[str, SharedValue]]:
        return list(self._values.items())

    def keys_in(self, directory: str) -> list[str]:
        prefix = directory + "/"
        return [key for key in self._values if key.startswith(prefix)]

    def bindings_of(self, end: BindingEnd) -> set[str]:
        """Keys of the bindings with this end (a copy)."""
        return set(self._bindings_by_end.get(end, ()))

    def remember(self, key: str, value: SharedValue | None) -> SharedValue | None:
        """The service holds `value` at `key` now (None: nothing); returns what it held before."""
        old = self._values.pop(key, None)
        if old is not None and old.kind == "bindings":
            for end in binding_ends(old.entry):
                keys = self._bindings_by_end.get(end)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._bindings_by_end[end]
        if value is not None:
            self._values[key] = value
            if value.kind == "bindings":
                for end in binding_ends(value.entry):
                    self._bindings_by_end.setdefault(end, set()).add(key)
        return old
