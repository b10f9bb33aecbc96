"""Declaring a quorum queue refuses what RabbitMQ 3.10 refuses, with its texts and in its order,
and quorum deliveries carry x-delivery-count as RabbitMQ writes it."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from amqp_server.wire.errors import AMQPError
from amqp_server.broker.vhost import VirtualHost
from queues.arguments import QueueArguments
from queues.delivery_count import get_ok_header, header_with_delivery_count
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, content_header
from queues.raw_properties import RawProperties

OWNER = object()
QUORUM = {"x-queue-type": "quorum"}
WHERE = "for queue 'q' in vhost '/'"


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


def refusal(vhost: VirtualHost, name: str = "q", **kwargs) -> str:
    with pytest.raises(AMQPError) as raised:
        vhost.declare_queue(name, connection=OWNER, **kwargs)
    assert raised.value.code == 406
    return raised.value.reply_text.removeprefix("PRECONDITION_FAILED - ")


@pytest.mark.parametrize(
    ("flags", "prop"),
    [
        ({"durable": False}, "non-durable"),
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
        ({"durable": False, "exclusive": True, "auto_delete": True}, "auto-delete"),
        ({"durable": False, "exclusive": True}, "exclusive-owner"),
    ],
)
def test_a_quorum_queue_must_be_durable_shared_and_kept(vhost, flags, prop):
    assert refusal(vhost, arguments=QUORUM, **flags) == f"invalid property '{prop}' {WHERE}"
    assert "q" not in vhost.queues


@pytest.mark.parametrize(
    "key_value",
    [("x-max-priority", 5), ("x-max-priority", 500), ("x-max-priority", "x"), ("x-queue-mode", "lazy"),
     ("x-queue-version", 2), ("x-queue-master-locator", "min-masters"), ("x-max-age", "1D"),
     ("x-stream-max-segment-size-bytes", 100), ("x-initial-cluster-size", 1)],
)
def test_arguments_of_other_queue_types_are_refused_whatever_their_value(vhost, key_value):
    key, value = key_value
    text = refusal(vhost, durable=False, arguments={**QUORUM, key: value})

    assert text == f"invalid arg '{key}' {WHERE} of queue type rabbit_quorum_queue"


def test_the_first_refused_argument_in_the_clients_order_is_named(vhost):
    text = refusal(vhost, durable=True, arguments={**QUORUM, "x-queue-mode": "lazy", "x-max-priority": 5})
    assert text.startswith("invalid arg 'x-queue-mode'")


def test_bad_values_of_supported_arguments_come_before_refused_arguments(vhost):
    text = refusal(vhost, durable=False, arguments={**QUORUM, "x-max-priority": 5, "x-expires": 0})
    assert text == f"invalid arg 'x-expires' {WHERE}: {{value_zero,0}}"


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("x-dead-letter-strategy", "bogus", "invalid_dlx_strategy"),
        ("x-dead-letter-strategy", 5, "{unacceptable_type,signedint}"),
        ("x-quorum-initial-group-size", 0, "{value_zero,0}"),
        ("x-quorum-initial-group-size", "x", '"expected integer, got longstr"'),
        ("x-max-in-memory-length", -1, "{value_negative,-1}"),
        ("x-max-in-memory-bytes", "x", '"expected integer, got longstr"'),
        ("x-queue-leader-locator", "bogus", "invalid_queue_locator_arg"),
    ],
)
def test_quorum_only_arguments_are_checked(vhost, key, value, reason):
    assert refusal(vhost, durable=True, arguments={**QUORUM, key: value}) == f"invalid arg '{key}' {WHERE}: {reason}"


@pytest.mark.parametrize(
    "arguments",
    [{"x-message-ttl": 1000}, {"x-overflow": "reject-publish-dlx"}, {"x-delivery-limit": "x"},
     {"x-quorum-initial-group-size": 3}, {"x-dead-letter-strategy": "at-least-once"}, {"x-foo": 1}],
)
def test_a_durable_quorum_queue_takes_rabbitmqs_quorum_arguments(vhost, arguments):
    queue, created = vhost.declare_queue("q", connection=OWNER, durable=True, arguments={**QUORUM, **arguments})
    assert created and queue.settings.queue_type == "quorum"


def test_classic_queues_keep_their_arguments(vhost):
    vhost.declare_queue("c", connection=OWNER, arguments={"x-max-priority": 5, "x-delivery-limit": 2})
    assert vhost.queues["c"].settings.delivery_limit == 2


def test_a_server_named_quorum_queue_is_refused_first(vhost):
    text = refusal(vhost, "amq.gen-x", allow_reserved_name=True, server_named=True,
                   arguments={**QUORUM, "x-dead-letter-exchange": 5})
    assert text == "Cannot declare a server-named queue for type rabbit_quorum_queue"


def test_a_queue_type_nobody_has_is_unsupported(vhost):
    text = refusal(vhost, durable=True, arguments={"x-queue-type": "queue-of-the-future"})
    assert text == f"invalid arg 'x-queue-type' {WHERE}: \"unsupported queue type 'queue-of-the-future'\""


@pytest.mark.parametrize(("value", "limit"), [(3, 3), (0, 0), (-1, 0), ("x", None), (True, None)])
def test_a_quorum_delivery_limit_is_not_checked_and_only_an_integer_limits(value, limit):
    assert QueueArguments.parse({**QUORUM, "x-delivery-limit": value}).delivery_limit == limit


def message_with_headers(raw_table: bytes) -> Message:
    properties = struct.pack(">H", 1 << 13) + struct.pack(">I", len(raw_table)) + raw_table
    return Message("", "q", content_header(1, properties), b"m")


def test_the_count_is_a_long_in_a_sorted_table_and_other_fields_keep_their_types():
    # z: 32-bit 'I' 1, x-delivery-count: 'b' 7 (the publisher's), a: 'I' 2
    table = b"\x01zI\x00\x00\x00\x01" + b"\x10x-delivery-countb\x07" + b"\x01aI\x00\x00\x00\x02"
    header = header_with_delivery_count(message_with_headers(table), 2)

    fields = RawProperties(header[CONTENT_HEADER_PREFIX_SIZE:]).header_fields()
    assert fields == [("a", b"I\x00\x00\x00\x02"), ("x-delivery-count", b"l" + struct.pack(">q", 2)),
                      ("z", b"I\x00\x00\x00\x01")]


def test_basic_get_from_a_quorum_queue_counts_from_zero_and_other_queues_only_redeliveries():
    message = Message("", "q", content_header(1, commands.Basic.Properties().marshal()), b"m")
    quorum = QueueArguments.parse(QUORUM)
    limited = QueueArguments.parse({"x-delivery-limit": 3})

    assert RawProperties(get_ok_header(quorum, message, 0)[CONTENT_HEADER_PREFIX_SIZE:]).header_fields() == [
        ("x-delivery-count", b"l" + struct.pack(">q", 0))]
    assert get_ok_header(limited, message, 0) == message.raw_header
    assert get_ok_header(QueueArguments.parse({}), message, 2) == message.raw_header
    assert get_ok_header(limited, message, 2) != message.raw_header
