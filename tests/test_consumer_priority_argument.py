"""basic.consume with an x-priority that is not an integer: RabbitMQ 3.10's 406 text (class 60, method 20)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pamqp import commands

from tests.frame_driver import opened_client


@pytest.mark.parametrize(
    ("priority", "type_name"),
    [("abc", "longstr"), (True, "bool"), (None, "void"), (Decimal("1.5"), "decimal"), ({"a": 1}, "table"), ([1], "array")],
)
def test_a_non_integer_consumer_priority_is_refused_with_rabbitmqs_text(priority, type_name):
    client = opened_client()
    assert isinstance(client.call(1, commands.Queue.Declare(queue="q")), commands.Queue.DeclareOk)
    close = client.call(1, commands.Basic.Consume(queue="q", arguments={"x-priority": priority}))
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 20)
    assert close.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'q' in vhost '/': \"expected integer, got {type_name}\""
    )


@pytest.mark.parametrize("priority", [5, -5, 2**40])
def test_any_integer_consumer_priority_is_accepted(priority):
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q"))
    assert isinstance(client.call(1, commands.Basic.Consume(queue="q", arguments={"x-priority": priority})), commands.Basic.ConsumeOk)
