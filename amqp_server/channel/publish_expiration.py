"""The per-message `expiration` property, checked at basic.publish as RabbitMQ 3.10 checks it.

RabbitMQ (rabbit_basic:parse_expiration/1) reads the property with Erlang's string:to_integer:
an optional sign and decimal digits, nothing else, at most 315360000000 ms (ten years). A
value it cannot use closes the channel with 406 and `invalid expiration '<value>': <reason>`,
the reason printed with Erlang's ~p: `no_integer`, `{value_negative,-1}`,
`{value_too_large,N}` or `{leftover_string,".5"}`. ~p breaks a tuple that would run past
column 78 onto a second line indented under its first element, so long values do too.
"""

from __future__ import annotations

import re

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError

MAX_EXPIRY_MS = 315_360_000_000  # RabbitMQ's ?MAX_EXPIRY_TIMER
_INTEGER_PREFIX = re.compile(rb"[+-]?[0-9]+")
# Erlang ~p prints these control characters inside a string as escapes; any other byte
# below 32 (or 127..159) makes the list print as integers.
_STRING_ESCAPES = {8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r", 27: b"\\e", 34: b'\\"', 92: b"\\\\"}


def check_expiration(expiration: str | bytes) -> None:
    """Raise RabbitMQ's 406 (basic.publish) unless `expiration` is a usable TTL."""
    raw = expiration.encode("utf-8", "surrogateescape") if isinstance(expiration, str) else bytes(expiration)
    reason = expiration_error(raw)
    if reason is not None:
        raise AMQPError(errors.PRECONDITION_FAILED, _explanation(raw, reason), 60, 40)


def expiration_error(raw: bytes) -> bytes | None:
    """RabbitMQ's reason (as ~p would print it at column 0) for a bad expiration, else None."""
    match = _INTEGER_PREFIX.match(raw)
    if match is None:
        return b"no_integer"
    if match.end() != len(raw):
        return b"{leftover_string," + _erlang_string(raw[match.end() :]) + b"}"
    value = int(match.group())
    if value < 0:
        return b"{value_negative,%d}" % value
    if value > MAX_EXPIRY_MS:
        return b"{value_too_large,%d}" % value
    return None


def _erlang_string(chars: bytes) -> bytes:
    """A byte list as Erlang's ~p shows it: "text" when latin-1 printable, else [1,2,3]."""
    if all(32 <= byte <= 126 or byte >= 160 or byte in _STRING_ESCAPES for byte in chars):
        return b'"' + b"".join(_STRING_ESCAPES.get(byte) or bytes((byte,)) for byte in chars) + b'"'
    return b"[" + b",".join(b"%d" % byte for byte in chars) + b"]"


def _explanation(raw: bytes, reason: bytes) -> str:
    head = b"invalid expiration '" + raw + b"': "
    column = len(head)
    if reason.startswith(b"{") and column + len(reason) > 78:
        tag, _, element = reason.partition(b",")
        reason = tag + b",\n" + b" " * (column + 1) + element
    # A long text is cut by AMQPError.reply_text, as RabbitMQ cuts every reply text.
    return (head + reason).decode("utf-8", "ignore")
