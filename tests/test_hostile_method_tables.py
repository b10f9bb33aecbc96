"""Tables in method arguments (declare, bind, consume) that pamqp cannot decode, including ones
nested too deep for its recursion, close the connection with 501 as undecodable frames, not with
an internal error."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from tests.frame_driver import opened_client, raw_frame


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def nested(levels: int) -> bytes:
    inner = table(b"")
    for _ in range(levels - 1):
        inner = table(b"\x01aF" + inner)
    return inner


def shortstr(text: bytes) -> bytes:
    return bytes((len(text),)) + text


def declare(arguments: bytes) -> bytes:
    return struct.pack(">HHH", 50, 10, 0) + shortstr(b"q") + b"\x00" + arguments


def bind(arguments: bytes) -> bytes:
    names = shortstr(b"q") + shortstr(b"amq.direct") + shortstr(b"k")
    return struct.pack(">HHH", 50, 20, 0) + names + b"\x00" + arguments


def consume(arguments: bytes) -> bytes:
    return struct.pack(">HHH", 60, 20, 0) + shortstr(b"q") + shortstr(b"") + b"\x00" + arguments


@pytest.mark.parametrize("method", [declare, bind, consume])
@pytest.mark.parametrize("arguments", [nested(1000), nested(10_000), table(b"\x01kZ\x00")], ids=["1000", "10000", "Z"])
def test_undecodable_or_too_deep_arguments_close_with_501_cannot_decode(method, arguments):
    client = opened_client()
    payload = method(arguments)
    [(channel, close)] = client.send_bytes(raw_frame(1, 1, payload))
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert close.reply_code == 501 and close.reply_text.startswith("FRAME_ERROR - cannot decode <<")
    assert (close.class_id, close.method_id) == struct.unpack_from(">HH", payload)
