"""Where a stream consumer starts: the `x-stream-offset` argument of basic.consume.

RabbitMQ's values (rabbit_stream_queue's parse_offset_arg): `first`, `last` (the first record of
the last chunk written), `next` (the default: only what is published from now on), an integer
offset, an AMQP timestamp (seconds), or an interval before now as a string with a unit
(`"1h"`, `"30m"`, `"7D"`: the units of x-max-age). A negative integer is the first record. Anything
else is refused with RabbitMQ's term for it (RabbitMQ 3.10.8 itself answers some of these, such as
`"bogus"` or a boolean, with a 541 crash: here they get the 406 it gives a malformed interval).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from queues.arguments.intervals import interval_ms
from queues.arguments.texts import amqp_type_name

class InvalidOffset(ValueError):
    """An x-stream-offset RabbitMQ refuses; `reason` is its Erlang term for it."""

    def __init__(self, value: Any) -> None:
        self.reason = f"{{invalid_stream_offset_arg,{{{_type_of(value)},{_term(value)}}}}}"
        super().__init__(self.reason)


def _type_of(value: Any) -> str:
    if isinstance(value, str):
        return "longstr"
    return amqp_type_name(value)


def _term(value: Any) -> str:
    """`value` as RabbitMQ prints it in the refusal (strings as binaries)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    return str(value)


@dataclass(frozen=True)
class StartAt:
    """A parsed x-stream-offset: one of `first`, `last`, `next`, an offset, or a time (ms)."""

    kind: str  # "first", "last", "next", "offset", "timestamp"
    value: int = 0


NEXT = StartAt("next")


def parse_offset(arguments: dict[str, Any], now_ms: int) -> StartAt:
    """The start that a consumer's `x-stream-offset` names (absent: next)."""
    if "x-stream-offset" not in arguments:
        return NEXT
    value = arguments["x-stream-offset"]
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
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
        return StartAt("offset", max(value, 0))  # a negative offset is the first, as RabbitMQ clamps it
    raise InvalidOffset(value)
