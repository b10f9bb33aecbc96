"""A basic.publish whose `expiration` property RabbitMQ 3.10 refuses closes the channel with its 406 text.

The expected texts were read from RabbitMQ 3.10 (class 60, method 40 in every channel.close).
"""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp.body import ContentBody

from amqp_server.wire.errors import AMQPError
from amqp_server.channel.publish_expiration import check_expiration
from tests.frame_driver import marshal, opened_client, raw_frame


def declared_client():
    client = opened_client()
    assert isinstance(client.call(1, commands.Queue.Declare(queue="q")), commands.Queue.DeclareOk)
    return client


def publish_with_expiration(client, expiration: str):
    return client.publish(1, b"x", routing_key="q", properties=commands.Basic.Properties(expiration=expiration))


@pytest.mark.parametrize(
    ("expiration", "reason"),
    [
        ("abc", "no_integer"),
        (" 100", "no_integer"),
        ("+", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
        ("100 ", '{leftover_string," "}'),
        ("1e3", '{leftover_string,"e3"}'),
        ('1"x', '{leftover_string,"\\"x"}'),
        ("1\n", '{leftover_string,"\\n"}'),
        ("1\x01", "{leftover_string,[1]}"),
        ("315360000001", "{value_too_large,315360000001}"),
    ],
)
def test_an_unusable_expiration_closes_the_channel_with_rabbitmqs_text(expiration, reason):
    client = declared_client()
    received = publish_with_expiration(client, expiration)
    assert len(received) == 1
    close = received[0][1]
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
    assert close.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}"


def test_an_empty_expiration_that_is_present_is_no_integer():
    # pamqp leaves an empty string out of the property list, so build the header by hand.
    client = declared_client()
    header = raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 1, 1 << 8) + b"\x00")
    received = client.send_bytes(
        marshal(1, commands.Basic.Publish(routing_key="q")) + header + marshal(1, ContentBody(b"x"))
    )
    close = received[0][1]
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
    assert close.reply_text == "PRECONDITION_FAILED - invalid expiration '': no_integer"


@pytest.mark.parametrize("expiration", ["0", "+5", "007", "-0", "315360000000"])
def test_expirations_rabbitmq_accepts_are_enqueued(expiration):
    client = declared_client()
    assert publish_with_expiration(client, expiration) == []
    # The channel is still open ("0" may already have expired the message, so no count).
    assert isinstance(client.call(1, commands.Queue.Declare(queue="q", passive=True)), commands.Queue.DeclareOk)


def test_a_value_too_large_that_runs_past_column_78_wraps_as_erlangs_tilde_p_does():
    client = declared_client()
    close = publish_with_expiration(client, "99999999999999999999")[0][1]
    assert close.reply_text == (
        "PRECONDITION_FAILED - invalid expiration '99999999999999999999': {value_too_large,\n"
        + " " * 44
        + "99999999999999999999}"
    )


def test_the_wrap_starts_one_column_past_78():
    # 00000000000000999999999999 ends at column 79 and wraps; one zero fewer ends at 78 and does not.
    assert "\n" not in _explained("0000000000000999999999999")
    assert "\n" + " " * 50 + "999999999999}" in _explained("00000000000000999999999999")


def test_a_reply_text_longer_than_a_short_string_is_cut_to_252_bytes_and_dots():
    client = declared_client()
    expiration = "1" + "x" * 200
    close = publish_with_expiration(client, expiration)[0][1]
    assert len(close.reply_text) == 255
    assert close.reply_text.endswith("...")
    assert close.reply_text.startswith(f"PRECONDITION_FAILED - invalid expiration '{expiration}': {{lefto")


def test_a_publish_without_expiration_is_not_checked():
    client = declared_client()
    assert client.publish(1, b"x", routing_key="q", properties=commands.Basic.Properties(message_id="m")) == []


def _explained(expiration: str) -> str:
    with pytest.raises(AMQPError) as refused:
        check_expiration(expiration)
    return refused.value.explanation
