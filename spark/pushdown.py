"""Which Spark filters the reader applies itself, and how.

``translate(filters)`` splits the filters Spark offers (``pushFilters``) into
the ones the reader fully handles and the rest, which Spark keeps applying:

* ``vhost`` and ``queue``: ``=``, ``IN``, ``startswith`` -> queues and streams skipped at planning;
* ``queue_type``: ``=``, ``IN`` -> all queues or all streams skipped at planning;
* ``seq``: ``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN`` -> segments skipped at planning (their
  file names give their seq ranges; a stream's side index files also place every 64 KiB
  of a segment, so only the byte ranges holding the offsets asked for are read), and rows
  outside never decoded;
* ``published_at``: ``=``, ``<``, ``<=``, ``>``, ``>=`` -> rows dropped before decoding; for a
  stream (whose records' timestamps never decrease) whole segments and byte ranges are
  skipped at planning too;
* ``state``: ``=``, ``IN`` -> rows dropped after the state replay, before decoding (streams,
  whose rows are all ``in_stream``, skipped at planning).

A handled filter is applied exactly, so Spark may drop it from its own plan.
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

from spark.message_states import STATE_NAMES, STREAM_STATE

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class Pushed(NamedTuple):
    """The handled filters, combined (all of them must hold)."""

    vhosts: frozenset[str] | None = None
    queues: frozenset[str] | None = None
    queue_prefixes: tuple[str, ...] = ()
    queue_types: frozenset[str] | None = None
    seq_min: int | None = None
    seq_max: int | None = None
    seq_values: frozenset[int] | None = None
    published_min_us: int | None = None
    published_max_us: int | None = None
    states: frozenset[str] | None = None

    def accepts_queue(self, vhost: str, queue: str) -> bool:
        if self.vhosts is not None and vhost not in self.vhosts:
            return False
        if self.queues is not None and queue not in self.queues:
            return False
        return all(queue.startswith(prefix) for prefix in self.queue_prefixes)

    def accepts_type(self, queue_type: str) -> bool:
        return self.queue_types is None or queue_type in self.queue_types


def translate(filters: list[Any]) -> tuple[Pushed, list[Any]]:
    """(what the reader handles, the filters it leaves to Spark)."""
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        LessThanOrEqual,
        StringStartsWith,
    )

    pushed = Pushed()
    rest = []
    for f in filters:
        column = f.attribute[0] if len(getattr(f, "attribute", ())) == 1 else None
        updated = None
        if column in ("vhost", "queue", "queue_type", "state"):
            values = None
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                values = frozenset([f.value])
            elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                values = frozenset(f.value)
            if values is not None:
                field = {"vhost": "vhosts", "queue": "queues", "queue_type": "queue_types", "state": "states"}[column]
                current = getattr(pushed, field)
                change: dict[str, Any] = {field: values if current is None else current & values}  # a field by name
                updated = pushed._replace(**change)
            elif column == "queue" and isinstance(f, StringStartsWith):
                updated = pushed._replace(queue_prefixes=(*pushed.queue_prefixes, f.value))
        elif column == "seq" and isinstance(f, In) and all(_is_int(v) for v in f.value):
            offsets = frozenset(int(v) for v in f.value)
            current_offsets = pushed.seq_values
            updated = pushed._replace(seq_values=offsets if current_offsets is None else current_offsets & offsets)
        elif column in ("seq", "published_at"):
            bound = _bound(column, f.value)
            if bound is not None:
                low, high = ("seq_min", "seq_max") if column == "seq" else ("published_min_us", "published_max_us")
                if isinstance(f, EqualTo):
                    updated = _narrow(_narrow(pushed, low, bound, max), high, bound, min)
                elif isinstance(f, GreaterThan):
                    updated = _narrow(pushed, low, bound + 1, max)
                elif isinstance(f, GreaterThanOrEqual):
                    updated = _narrow(pushed, low, bound, max)
                elif isinstance(f, LessThan):
                    updated = _narrow(pushed, high, bound - 1, min)
                elif isinstance(f, LessThanOrEqual):
                    updated = _narrow(pushed, high, bound, min)
        if updated is None:
            rest.append(f)
        else:
            pushed = updated
    if pushed.states is not None:
        pushed = pushed._replace(states=pushed.states & frozenset((*STATE_NAMES, STREAM_STATE)))
    return pushed, rest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _narrow(pushed: Pushed, field: str, value: int, pick) -> Pushed:
    current = getattr(pushed, field)
    change: dict[str, Any] = {field: value if current is None else pick(current, value)}  # a field by name
    return pushed._replace(**change)


def _bound(column: str, value: Any) -> int | None:
    """The filter's value as an integer: seq as is, a timestamp in microseconds since the epoch."""
    if column == "seq":
        return value if _is_int(value) else None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return None  # a local time of unknown zone: leave it to Spark
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None
