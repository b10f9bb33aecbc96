"""Reading delivery_mode from the raw property list agrees with decoding the properties."""

from __future__ import annotations

import itertools

import pytest
from pamqp import commands

from queues.message import Message, content_header

OPTIONAL_FIELDS = {
    "content_type": "application/json",
    "content_encoding": "gzip",
    "headers": {"retry": 3, "nested": {"a": [1, "x"]}},
    "priority": 5,
    "message_id": "m-1",
}


def message_with(**properties) -> Message:
    raw = commands.Basic.Properties(**properties).marshal()
    return Message("", "q", content_header(4, raw), b"body")


@pytest.mark.parametrize("delivery_mode", [None, 1, 2])
@pytest.mark.parametrize(
    "fields", [combo for n in range(len(OPTIONAL_FIELDS) + 1) for combo in itertools.combinations(OPTIONAL_FIELDS, n)]
)
def test_is_persistent_matches_the_decoded_delivery_mode(delivery_mode, fields):
    properties = {name: OPTIONAL_FIELDS[name] for name in fields}
    if delivery_mode is not None:
        properties["delivery_mode"] = delivery_mode
    message = message_with(**properties)

    assert message.is_persistent == (delivery_mode == 2)
    assert message_with(**properties).properties.delivery_mode == delivery_mode  # the decoder agrees
