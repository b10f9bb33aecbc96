"""Where a stream consumer starts: the `x-stream-offset` argument of basic.consume.

RabbitMQ's values (rabbit_stream_queue's parse_offset_arg): `first`, `last` (the first record of
the last chunk written), `next` (the default: only what is published from now on), an integer
offset, an AMQP timestamp (seconds), or an interval before now as a string with a unit
(`"1h"`, `"30m"`, `"7D"`: the units of x-max-age). Anything else is refused.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from queues.arguments.intervals import interval_ms

class InvalidOffset(ValueError):
    """An x-stream-offset RabbitMQ refuses."""


@dataclass(frozen=True)
class StartAt:
    """A parsed x-stream-offset: one of `first`, `last`, `next`, an offset, or a time (ms)."""

    kind: str  # "first", "last", "next", "offset", "timestamp"
    value: int = 0


NEXT = StartAt("next")


def parse_offset(value: Any, now_ms: int) -> StartAt:
    """The start that `value` (the argument as the client sent it; absent: None) names."""
    if value is None:
        return NEXT
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return StartAt(value)
        span = interval_ms(value)
        if span is None:
            raise InvalidOffset(value)
        return StartAt("timestamp", max(now_ms - span, 0))
    if isinstance(value, datetime.datetime):  # an AMQP timestamp (pamqp decodes it so)
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return StartAt("timestamp", int(value.timestamp() * 1000))
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidOffset(value)
        return StartAt("offset", value)
    raise InvalidOffset(value)
