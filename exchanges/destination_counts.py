"""Reference-counted destination sets, the building block of the exchange indexes.

One destination can reach an index entry through several bindings (the same
queue bound with the same key but different arguments); it must stay routable
until the last of them goes. ``dict.keys()`` of these counters is what routing
returns: a set-like view, built without copying.
"""

from __future__ import annotations

from collections.abc import Hashable


def add_destination(counts: dict[Hashable, int], destination: Hashable) -> None:
    counts[destination] = counts.get(destination, 0) + 1


def remove_destination(counts: dict[Hashable, int], destination: Hashable) -> None:
    """Drop one reference; the destination leaves ``counts`` with its last one."""
    remaining = counts[destination] - 1
    if remaining:
        counts[destination] = remaining
    else:
        del counts[destination]
