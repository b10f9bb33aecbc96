"""queue.declare with an x-argument RabbitMQ 3.10 refuses: its exact 406 text, and which argument it names first.

Every expected text was read from RabbitMQ 3.10 with pika declaring queue 'q' in vhost '/'.
pika sends an int that fits 32 bits as a signedint and a larger one as a long, so those are
the type names RabbitMQ prints for it.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from pamqp import commands

from queues.arguments import InvalidArgument, QueueArguments
from tests.frame_driver import opened_client

Q = "queue 'q' in vhost '/'"


def refusal(arguments: dict) -> str:
    with pytest.raises(InvalidArgument) as refused:
        QueueArguments.parse(arguments)
    return refused.value.describe(Q)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-message-ttl": "abc"}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got longstr\""),
        ({"x-message-ttl": True}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got bool\""),
        ({"x-message-ttl": Decimal("1.5")}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got decimal\""),
        ({"x-message-ttl": bytearray(b"ab")}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got binary\""),
        ({"x-message-ttl": None}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got void\""),
        ({"x-message-ttl": {"a": 1}}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got table\""),
        ({"x-message-ttl": [1]}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got array\""),
        ({"x-message-ttl": datetime(2020, 1, 1)}, "invalid arg 'x-message-ttl' for %s: \"expected integer, got timestamp\""),
        ({"x-message-ttl": 2**40}, "invalid arg 'x-message-ttl' for %s: {value_too_large,1099511627776}"),
        ({"x-message-ttl": 315360000001}, "invalid arg 'x-message-ttl' for %s: {value_too_large,315360000001}"),
        ({"x-expires": 2**40}, "invalid arg 'x-expires' for %s: {value_too_large,1099511627776}"),
        ({"x-expires": "abc"}, "invalid arg 'x-expires' for %s: \"expected integer, got longstr\""),
        ({"x-expires": True}, "invalid arg 'x-expires' for %s: \"expected integer, got bool\""),
        ({"x-max-length": "abc"}, "invalid arg 'x-max-length' for %s: \"expected integer, got longstr\""),
        ({"x-max-length-bytes": "abc"}, "invalid arg 'x-max-length-bytes' for %s: \"expected integer, got longstr\""),
        ({"x-max-priority": "abc"}, "invalid arg 'x-max-priority' for %s: \"expected integer, got longstr\""),
        ({"x-max-priority": 2**40}, "invalid arg 'x-max-priority' for %s: {max_value_exceeded,1099511627776}"),
        ({"x-overflow": "bogus"}, "invalid arg 'x-overflow' for %s: invalid_overflow"),
        ({"x-overflow": 1}, "invalid arg 'x-overflow' for %s: {unacceptable_type,signedint}"),
        ({"x-overflow": 2**40}, "invalid arg 'x-overflow' for %s: {unacceptable_type,long}"),
        ({"x-overflow": True}, "invalid arg 'x-overflow' for %s: {unacceptable_type,bool}"),
        ({"x-overflow": bytearray(b"drop-head")}, "invalid arg 'x-overflow' for %s: {unacceptable_type,binary}"),
        ({"x-queue-mode": "bogus"}, "invalid arg 'x-queue-mode' for %s: \"unsupported queue mode 'bogus'\""),
        ({"x-queue-mode": ""}, "invalid arg 'x-queue-mode' for %s: \"unsupported queue mode ''\""),
        ({"x-queue-mode": 1}, "invalid arg 'x-queue-mode' for %s: {unacceptable_type,signedint}"),
        ({"x-queue-type": "bogus"}, "invalid arg 'x-queue-type' for %s: \"unsupported queue type 'bogus'\""),
        ({"x-queue-type": 1}, "invalid arg 'x-queue-type' for %s: {unacceptable_type,signedint}"),
        ({"x-queue-type": None}, "invalid arg 'x-queue-type' for %s: {unacceptable_type,void}"),
        ({"x-queue-version": 3}, "invalid arg 'x-queue-version' for %s: \"unsupported queue version '3'\""),
        ({"x-queue-version": 0}, "invalid arg 'x-queue-version' for %s: \"unsupported queue version '0'\""),
        ({"x-queue-version": -1}, "invalid arg 'x-queue-version' for %s: {value_negative,-1}"),
        ({"x-queue-version": "1"}, "invalid arg 'x-queue-version' for %s: \"expected integer, got longstr\""),
        ({"x-queue-version": True}, "invalid arg 'x-queue-version' for %s: \"expected integer, got bool\""),
        ({"x-dead-letter-exchange": 1}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in %s"),
        ({"x-dead-letter-exchange": 2**40}, "invalid type 'long' for arg 'x-dead-letter-exchange' in %s"),
        ({"x-dead-letter-exchange": True}, "invalid type 'bool' for arg 'x-dead-letter-exchange' in %s"),
        ({"x-dead-letter-exchange": None}, "invalid type 'void' for arg 'x-dead-letter-exchange' in %s"),
        ({"x-dead-letter-routing-key": 1}, "invalid arg 'x-dead-letter-routing-key' for %s: {unacceptable_type,signedint}"),
        ({"x-dead-letter-routing-key": "rk"}, "invalid arg 'x-dead-letter-routing-key' for %s: routing_key_but_no_dlx_defined"),
        (
            {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 5},
            "invalid arg 'x-dead-letter-routing-key' for %s: {unacceptable_type,signedint}",
        ),
        ({"x-single-active-consumer": 1}, "invalid arg 'x-single-active-consumer' for %s: {unacceptable_type,signedint}"),
        ({"x-single-active-consumer": "true"}, "invalid arg 'x-single-active-consumer' for %s: {unacceptable_type,longstr}"),
    ],
)
def test_a_refused_argument_has_rabbitmqs_text(arguments, text):
    assert refusal(arguments) == text % Q


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        # The channel checks the DLX name's type before anything else, then the queue type.
        ({"x-expires": 0, "x-dead-letter-exchange": 1}, "x-dead-letter-exchange"),
        ({"x-queue-type": "bogus", "x-dead-letter-exchange": 1}, "x-dead-letter-exchange"),
        ({"x-queue-type": "bogus", "x-expires": 0}, "x-queue-type"),
        ({"x-queue-type": 1, "x-expires": 0}, "x-queue-type"),
        # Then rabbit_amqqueue:declare_args/0's order, whatever order the table has.
        ({"x-message-ttl": "abc", "x-expires": 0}, "x-expires"),
        ({"x-dead-letter-exchange": "a", "x-dead-letter-routing-key": 1, "x-message-ttl": "a"}, "x-message-ttl"),
        ({"x-dead-letter-routing-key": 1, "x-max-length": "a"}, "x-dead-letter-routing-key"),
        ({"x-max-priority": "a", "x-max-length": "a"}, "x-max-length"),
        ({"x-max-priority": "a", "x-overflow": "bogus"}, "x-max-priority"),
        ({"x-queue-mode": "bogus", "x-overflow": "bogus"}, "x-overflow"),
        ({"x-queue-version": 3, "x-queue-mode": "bogus"}, "x-queue-mode"),
        ({"x-single-active-consumer": 1, "x-queue-version": 3}, "x-queue-version"),
    ],
)
def test_the_first_refused_argument_is_the_one_rabbitmq_names(arguments, named):
    with pytest.raises(InvalidArgument) as refused:
        QueueArguments.parse(arguments)
    assert refused.value.key == named


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": 315360000000},
        {"x-expires": 2**32},
        {"x-max-length": 2**62},
        {"x-queue-version": 1},
        {"x-queue-version": 2},
        {"x-queue-mode": "lazy"},
        {"x-queue-mode": "default"},
        {"x-overflow": "reject-publish-dlx"},
        {"x-dead-letter-exchange": ""},
        {"x-single-active-consumer": True},
    ],
)
def test_arguments_rabbitmq_accepts_parse(arguments):
    QueueArguments.parse(arguments)


def test_queue_declare_sends_the_text_in_channel_close():
    client = opened_client()
    close = client.call(1, commands.Queue.Declare(queue="q", arguments={"x-dead-letter-exchange": 1}))
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 50, 10)
    assert close.reply_text == "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in " + Q
