"""What a pika user sees declaring, filling and reading stream queues, as RabbitMQ 3.10.8 shows it.

A stream (`x-queue-type: stream`) is an append-only log: every consumer reads it from an offset of
its own (`x-stream-offset`), nothing is removed by acks, and each delivery says its offset in the
header `x-stream-offset` (a long). Refusals are asserted with RabbitMQ's codes and texts, and with
whether the channel or the whole connection closes. Running this file with
INTEROP_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ checks it against RabbitMQ itself;
docs/streams-rabbitmq-behaviour.md lists what each test pins and how it was checked.

Not here, because RabbitMQ 3.10.8 lacks them over AMQP 0-9-1: nack/reject as a mere return of
credit (3.10.8 answers 540 and closes the connection, 3.13 returns credit), server-side offset
tracking, filtering, basic.recover on a stream consumer (3.10.8 crashes with 541).

pika caveat these tests respect: BlockingChannel.basic_cancel and close reject the deliveries a
consumer has received but not yet dispatched, and RabbitMQ 3.10.8 answers such a reject with 540.
Every consumer here is given a prefetch that leaves nothing in flight when a test ends.
"""

from __future__ import annotations

import datetime
import decimal
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.compat import long as wire_long
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from interop_tests.broker_process import BrokerProcess
from interop_tests.pika_helpers import WAIT_S, channel_error, connect, connection_error, numbered_bodies, pumping
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll

STREAM = {"x-queue-type": "stream"}
NEXT = object()  # no x-stream-offset argument at all


@pytest.fixture
def stream(broker: BrokerProcess, unique) -> Iterator[Callable[..., str]]:
    """Declares durable streams and deletes them afterwards (on a fresh connection: a test may
    have had its own closed by a 540)."""
    names: list[str] = []

    def declare(prefix: str = "stream", arguments: dict | None = None) -> str:
        name = unique(f"{prefix}{len(names)}")
        names.append(name)
        client = connect(broker)
        try:
            client.channel().queue_declare(name, durable=True, arguments={**STREAM, **(arguments or {})})
        finally:
            client.close()
        return name

    yield declare
    client = connect(broker)
    channel = client.channel()
    for name in names:
        channel.queue_delete(name)
    client.close()


def append(connection: pika.BlockingConnection, queue: str, bodies: list[bytes],
           properties: pika.BasicProperties | None = None) -> None:
    """Publish `bodies` to the stream one by one, each confirmed before the next is sent (so each
    is a chunk of its own in RabbitMQ's log)."""
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, properties, mandatory=True)
    channel.close()


class Delivery(NamedTuple):
    body: bytes
    offset: Any
    tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: pika.BasicProperties


class Reader:
    """One stream consumer: its channel (its own unless given one) and what it received, in order."""

    def __init__(self, connection: pika.BlockingConnection, queue: str, offset: Any = NEXT,
                 prefetch: int | None = 100, channel: BlockingChannel | None = None,
                 arguments: dict | None = None) -> None:
        """`prefetch` None: no basic.qos before the consume (the channel's own settings apply)."""
        self.connection = connection
        self.channel = channel if channel is not None else connection.channel()
        if prefetch is not None:
            self.channel.basic_qos(prefetch_count=prefetch)
        consume_arguments = dict(arguments or {})
        if offset is not NEXT:
            consume_arguments["x-stream-offset"] = offset
        self.deliveries: list[Delivery] = []
        self.tag = self.channel.basic_consume(queue, self._on_message, arguments=consume_arguments)

    def _on_message(self, _channel, method, properties, body: bytes) -> None:
        offset = (properties.headers or {}).get("x-stream-offset")
        self.deliveries.append(Delivery(body, offset, method.delivery_tag, method.redelivered,
                                        method.exchange, method.routing_key, properties))

    def wait_for(self, count: int, timeout: float = 2 * WAIT_S) -> list[bytes]:
        """Pump until `count` deliveries arrived (fail otherwise); return every body so far."""
        if not poll(lambda: len(self.deliveries) >= count, timeout, pump=pumping(self.connection)):
            pytest.fail(f"{len(self.deliveries)} of {count} deliveries after {timeout} s: {self.bodies()}")
        return self.bodies()

    def quiet(self, seconds: float = 0.5) -> list[bytes]:
        """Pump for `seconds` (a check that nothing more arrives); return every body so far."""
        poll(lambda: False, seconds, pump=pumping(self.connection))
        return self.bodies()

    def bodies(self) -> list[bytes]:
        return [delivery.body for delivery in self.deliveries]

    def offsets(self) -> list[Any]:
        return [delivery.offset for delivery in self.deliveries]


def filled(stream: Callable[..., str], connection: pika.BlockingConnection, count: int = 10, **kwargs) -> str:
    """A new stream holding m1 .. m<count> at offsets 0 .. count-1."""
    name = stream(**kwargs)
    append(connection, name, numbered_bodies(count))
    return name


def declare_refusal(connection: pika.BlockingConnection, name: str, arguments: dict, **flags) -> tuple[int, str]:
    channel = connection.channel()
    return channel_error(lambda: channel.queue_declare(name, arguments=arguments, **flags))


def refusal(operation: Callable[[], object]) -> tuple[str, int, str]:
    """Run `operation`, which the broker must refuse: ("channel" | "connection", code, text)."""
    try:
        operation()
    except ChannelClosedByBroker as error:
        return "channel", error.reply_code, error.reply_text
    except ConnectionClosedByBroker as error:
        return "connection", error.reply_code, error.reply_text
    pytest.fail("the broker accepted it")


def queue_exists(broker: BrokerProcess, name: str) -> bool:
    client = connect(broker)
    try:
        client.channel().queue_declare(name, passive=True)
        return True
    except ChannelClosedByBroker:
        return False
    finally:
        if client.is_open:
            client.close()


def where(name: str) -> str:
    return f"for queue '{name}' in vhost '/'"


def param_id(value: Any) -> str | None:
    """Readable test ids for tables, arrays and decimals (pytest's default is `arguments7`)."""
    if isinstance(value, dict):
        return ",".join(f"{key}={item}" for key, item in value.items()) or "none"
    if isinstance(value, (list, decimal.Decimal)):
        return f"{type(value).__name__}{value}"
    return None


# -- declare -------------------------------------------------------------------------------------


def test_a_stream_is_declared_durable_and_redeclared_alike(connection, unique):
    name = unique("stream")
    channel = connection.channel()
    try:
        declared = channel.queue_declare(name, durable=True, arguments=STREAM).method
        again = channel.queue_declare(name, durable=True, arguments=STREAM).method
        passive = channel.queue_declare(name, passive=True).method
    finally:
        connection.channel().queue_delete(name)

    assert (declared.queue, again.queue, passive.queue) == (name, name, name)
    assert (declared.message_count, declared.consumer_count) == (0, 0)


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        ({"durable": False}, "invalid property 'non-durable'"),
        ({"durable": True, "exclusive": True}, "invalid property 'exclusive-owner'"),
        ({"durable": True, "auto_delete": True}, "invalid property 'auto-delete'"),
        # Checked in the order auto-delete, exclusive, durable.
        ({"durable": False, "exclusive": True, "auto_delete": True}, "invalid property 'auto-delete'"),
        ({"durable": False, "auto_delete": True}, "invalid property 'auto-delete'"),
        ({"durable": False, "exclusive": True}, "invalid property 'exclusive-owner'"),
    ],
    ids=param_id,
)
def test_a_stream_must_be_durable_shared_and_kept(connection, unique, broker, flags, text):
    name = unique("stream-refused")

    assert declare_refusal(connection, name, STREAM, **flags) == (406, f"PRECONDITION_FAILED - {text} {where(name)}")
    assert not queue_exists(broker, name)


@pytest.mark.parametrize("flags", [{"durable": True}, {"durable": True, "exclusive": True}], ids=param_id)
def test_a_server_named_stream_is_refused(connection, flags):
    assert declare_refusal(connection, "", STREAM, **flags) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")


UNSUPPORTED = [
    ("x-message-ttl", 1000), ("x-message-ttl", -1), ("x-message-ttl", "x"),
    ("x-expires", 60000), ("x-expires", 0),
    ("x-dead-letter-exchange", "dlx"), ("x-dead-letter-routing-key", "k"), ("x-dead-letter-strategy", "at-least-once"),
    ("x-max-length", 10), ("x-max-length", -1), ("x-max-length", "abc"),
    ("x-overflow", "reject-publish"), ("x-overflow", "drop-head"), ("x-overflow", "bogus"),
    ("x-max-priority", 5), ("x-max-priority", 500), ("x-max-priority", "x"),
    ("x-single-active-consumer", True), ("x-single-active-consumer", "x"),
    ("x-delivery-limit", 3),
    ("x-queue-mode", "lazy"), ("x-queue-version", 2), ("x-queue-master-locator", "min-masters"),
    ("x-quorum-initial-group-size", 3), ("x-max-in-memory-length", 10), ("x-max-in-memory-bytes", 10),
]


@pytest.mark.parametrize(("argument", "value"), UNSUPPORTED)
def test_a_stream_refuses_the_arguments_rabbitmq_refuses_whatever_their_value(connection, unique, broker, argument, value):
    name = unique("stream-refused")

    assert declare_refusal(connection, name, {**STREAM, argument: value}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' {where(name)} of queue type rabbit_stream_queue")
    assert not queue_exists(broker, name)


@pytest.mark.parametrize(
    ("flags", "arguments", "refused"),
    [
        # The first unsupported argument in the client's order ...
        ({"durable": True}, {"x-queue-mode": "lazy", "x-max-priority": 5}, "x-queue-mode"),
        ({"durable": True}, {"x-max-priority": 5, "x-message-ttl": -1}, "x-max-priority"),
        # ... and arguments before properties.
        ({"durable": False}, {"x-max-priority": 5}, "x-max-priority"),
        ({"durable": True, "exclusive": True}, {"x-max-priority": 5}, "x-max-priority"),
    ],
    ids=param_id,
)
def test_unsupported_arguments_are_named_in_order_and_before_properties(connection, unique, flags, arguments, refused):
    name = unique("stream-refused")

    assert declare_refusal(connection, name, {**STREAM, **arguments}, **flags) == (
        406, f"PRECONDITION_FAILED - invalid arg '{refused}' {where(name)} of queue type rabbit_stream_queue")


def test_a_dead_letter_exchange_of_the_wrong_type_is_a_type_error_before_the_streams_refusal(connection, unique):
    name = unique("stream-refused")

    assert declare_refusal(connection, name, {**STREAM, "x-dead-letter-exchange": 5}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{name}' in vhost '/'")
    assert declare_refusal(connection, name, {**STREAM, "x-dead-letter-exchange": "dlx"}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-exchange' {where(name)} of queue type rabbit_stream_queue")


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        *[({"x-max-age": value}, "invalid_max_age")
          for value in ("7X", "1.5h", "10", "0D", "0s", "1W", "1d", "1H", "1S", "7D ", "1h30m")],
        ({"x-max-age": 5}, "{unacceptable_type,signedint}"),
        ({"x-max-age": True}, "{unacceptable_type,bool}"),
        ({"x-max-age": b"7D"}, "{unacceptable_type,binary}"),  # pika sends bytes as a byte array ('x')
        ({"x-max-length-bytes": -1}, "{value_negative,-1}"),
        ({"x-max-length-bytes": "abc"}, '"expected integer, got longstr"'),
        ({"x-max-length-bytes": "100"}, '"expected integer, got longstr"'),
        ({"x-max-length-bytes": True}, '"expected integer, got bool"'),
        ({"x-stream-max-segment-size-bytes": -1}, "{value_negative,-1}"),
        ({"x-stream-max-segment-size-bytes": "abc"}, '"expected integer, got longstr"'),
        ({"x-initial-cluster-size": 0}, "{value_zero,0}"),
        ({"x-initial-cluster-size": -1}, "{value_negative,-1}"),
        ({"x-initial-cluster-size": "abc"}, '"expected integer, got longstr"'),
        ({"x-queue-leader-locator": "bogus"}, "invalid_queue_locator_arg"),
    ],
    ids=param_id,
)
def test_bad_values_of_the_arguments_a_stream_takes_are_refused_with_rabbitmqs_reason(
        connection, unique, broker, arguments, reason):
    name = unique("stream-bad-value")
    argument = next(iter(arguments))

    assert declare_refusal(connection, name, {**STREAM, **arguments}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' {where(name)}: {reason}")
    assert not queue_exists(broker, name)


@pytest.mark.parametrize(
    ("flags", "arguments", "refused", "reason"),
    [
        # A bad value of an argument streams take is reported before unsupported arguments ...
        ({"durable": True}, {"x-max-priority": 5, "x-max-age": "7X"}, "x-max-age", "invalid_max_age"),
        ({"durable": True}, {"x-max-priority": 5, "x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
        # ... and before the properties.
        ({"durable": False}, {"x-max-age": "7X"}, "x-max-age", "invalid_max_age"),
        ({"durable": False}, {"x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
    ],
    ids=param_id,
)
def test_bad_values_come_before_unsupported_arguments_and_properties(connection, unique, flags, arguments, refused, reason):
    name = unique("stream-bad-value")

    assert declare_refusal(connection, name, {**STREAM, **arguments}, **flags) == (
        406, f"PRECONDITION_FAILED - invalid arg '{refused}' {where(name)}: {reason}")


def test_the_queue_type_is_case_sensitive(connection, unique, stream):
    name = unique("stream-type")

    assert declare_refusal(connection, name, {"x-queue-type": "STREAM"}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' {where(name)}: \"unsupported queue type 'STREAM'\"")
    stream("stream-type")  # while 'stream' is one


def test_a_segment_size_over_3_gb_is_refused(connection, unique, stream):
    name = unique("stream-segment")

    assert declare_refusal(connection, name, {**STREAM, "x-stream-max-segment-size-bytes": 3_000_000_001}, durable=True) == (
        406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes")
    stream("segment-max", {"x-stream-max-segment-size-bytes": 3_000_000_000})  # the limit itself is taken


@pytest.mark.parametrize("value", ["abc", "", "D", "-1D"])
def test_an_x_max_age_without_a_number_is_refused_and_the_broker_goes_on(connection, unique, broker, value):
    """RabbitMQ 3.10.8 crashes on these (541 INTERNAL_ERROR, the connection closes: list_to_integer in
    check_max_age); this broker answers as RabbitMQ does for every other malformed x-max-age."""
    name = unique("stream-no-number")
    channel = connection.channel()

    answer = refusal(lambda: channel.queue_declare(name, durable=True, arguments={**STREAM, "x-max-age": value}))

    if broker.is_external:
        assert answer == ("connection", 541, "INTERNAL_ERROR")
    else:
        assert answer == ("channel", 406, f"PRECONDITION_FAILED - invalid arg 'x-max-age' {where(name)}: invalid_max_age")
    assert not queue_exists(broker, name)


@pytest.mark.parametrize(
    "arguments",
    [
        *[{"x-max-age": value} for value in ("7D", "1Y", "1M", "1D", "10s", "1h", "30m", "1s", "007D")],
        {"x-max-length-bytes": 0}, {"x-max-length-bytes": 1000}, {"x-max-length-bytes": 2**40},
        {"x-stream-max-segment-size-bytes": 0}, {"x-stream-max-segment-size-bytes": 1_000_000},
        {"x-initial-cluster-size": 1}, {"x-initial-cluster-size": 3},
        {"x-queue-leader-locator": "balanced"}, {"x-queue-leader-locator": "client-local"},
        {"x-max-age": "7D", "x-max-length-bytes": 10_000_000, "x-stream-max-segment-size-bytes": 1_000_000},
        {"x-foo": 1},
    ],
    ids=param_id,
)
def test_a_stream_takes_the_arguments_rabbitmq_takes(connection, stream, arguments):
    name = stream("stream-ok", arguments)

    assert connection.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments}).method.queue == name


@pytest.mark.parametrize(
    ("declared", "flags", "arguments", "text"),
    [
        ({}, {"durable": True}, {},
         "inequivalent arg 'x-queue-type' {where}: received none but current is the value 'stream' of type 'longstr'"),
        ({}, {"durable": True}, {"x-queue-type": "quorum"},
         "inequivalent arg 'x-queue-type' {where}: received 'quorum' but current is 'stream'"),
        ({}, {"durable": True}, {"x-queue-type": "classic"},
         "inequivalent arg 'x-queue-type' {where}: received 'classic' but current is 'stream'"),
        ({}, {"durable": False}, STREAM, "inequivalent arg 'durable' {where}: received 'false' but current is 'true'"),
        ({}, {"durable": False}, {}, "inequivalent arg 'durable' {where}: received 'false' but current is 'true'"),
        ({}, {"durable": True}, {**STREAM, "x-max-age": "1D"},
         "inequivalent arg 'x-max-age' {where}: received the value '1D' of type 'longstr' but current is none"),
        ({"x-max-age": "7D"}, {"durable": True}, {**STREAM, "x-max-age": "1D"},
         "inequivalent arg 'x-max-age' {where}: received '1D' but current is '7D'"),
        ({"x-max-age": "7D"}, {"durable": True}, STREAM,
         "inequivalent arg 'x-max-age' {where}: received none but current is the value '7D' of type 'longstr'"),
        ({}, {"durable": True}, {**STREAM, "x-max-length-bytes": 100},
         "inequivalent arg 'x-max-length-bytes' {where}: received the value '100' of type 'signedint' but current is none"),
        ({}, {"durable": True}, {**STREAM, "x-stream-max-segment-size-bytes": 100},
         "inequivalent arg 'x-stream-max-segment-size-bytes' {where}: received the value '100' of type 'signedint' "
         "but current is none"),
        ({}, {"durable": True}, {**STREAM, "x-initial-cluster-size": 1},
         "inequivalent arg 'x-initial-cluster-size' {where}: received the value '1' of type 'signedint' but current is none"),
        ({}, {"durable": True}, {**STREAM, "x-queue-leader-locator": "balanced"},
         "inequivalent arg 'x-queue-leader-locator' {where}: received the value 'balanced' of type 'longstr' "
         "but current is none"),
    ],
    ids=param_id,
)
def test_redeclaring_a_stream_otherwise_is_406_inequivalent(connection, stream, declared, flags, arguments, text):
    name = stream("stream-redeclare", declared)

    assert declare_refusal(connection, name, arguments, **flags) == (
        406, "PRECONDITION_FAILED - " + text.format(where=where(name)))


def test_redeclaring_a_stream_exclusive_is_405(connection, stream):
    name = stream("stream-redeclare")

    assert declare_refusal(connection, name, STREAM, durable=True, exclusive=True) == (
        405, f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could be "
             "originally declared on another connection or the exclusive property value does not match that of the "
             "original declaration.")


@pytest.mark.parametrize("arguments", [{"x-foo": 1}, {"x-max-priority": 5}, {"x-message-ttl": 1000}], ids=param_id)
def test_redeclaring_with_an_argument_equivalence_ignores_is_accepted(connection, stream, arguments):
    """RabbitMQ compares only the arguments of its equivalence list on a redeclare, and does not apply the
    stream's refusals to an existing stream."""
    name = stream("stream-redeclare")

    assert connection.channel().queue_declare(name, durable=True, arguments={**STREAM, **arguments}).method.queue == name


# -- publish and read ----------------------------------------------------------------------------


def test_published_messages_are_confirmed_and_read_from_first_with_consecutive_long_offsets(connection, stream):
    name = stream()
    append(connection, name, numbered_bodies(10))  # mandatory, confirmed: no basic.return, every ack
    reader = Reader(connection, name, "first")

    assert reader.wait_for(10) == numbered_bodies(10)
    assert reader.offsets() == list(range(10))
    # pika decodes a long-long ('l') field as pika.compat.long and a 32-bit one ('I') as int.
    assert all(type(delivery.offset) is wire_long for delivery in reader.deliveries)
    assert [delivery.tag for delivery in reader.deliveries] == list(range(1, 11))
    assert {(delivery.redelivered, delivery.exchange, delivery.routing_key) for delivery in reader.deliveries} == {
        (False, "", name)}
    assert reader.quiet() == numbered_bodies(10)


@pytest.mark.parametrize(
    ("offset", "first"),
    [(0, 0), (3, 3), (9, 9), (-1, 0), (-5, 0), ("first", 0), (b"first", 0)],
)
def test_a_consumer_at_an_offset_reads_from_that_offset(connection, stream, offset, first):
    """An integer names the first offset delivered; a negative one is clamped to the start of the log.
    (b"first" is a byte array on the wire: RabbitMQ reads its bytes like the string's.)"""
    name = filled(stream, connection, 10)
    reader = Reader(connection, name, offset)

    assert reader.wait_for(10 - first) == numbered_bodies(10)[first:]
    assert reader.offsets() == list(range(first, 10))
    assert reader.quiet() == numbered_bodies(10)[first:]


def test_an_offset_past_the_end_waits_for_that_offset(connection, stream):
    name = filled(stream, connection, 5)
    reader = Reader(connection, name, 7)
    beyond = Reader(connection, name, 2**40)
    assert reader.quiet() == [] and beyond.quiet(0.1) == []

    append(connection, name, [b"n5", b"n6", b"n7", b"n8"])

    assert reader.wait_for(2) == [b"n7", b"n8"]  # offsets 5 and 6 are not delivered to it
    assert reader.offsets() == [7, 8]
    assert beyond.quiet() == []


def test_last_starts_at_the_last_chunk_and_goes_on_with_new_messages(connection, stream):
    name = filled(stream, connection, 10)  # published one confirm at a time: one message per chunk
    reader = Reader(connection, name, "last")

    assert reader.wait_for(1) == [b"m10"]
    assert reader.quiet() == [b"m10"]
    append(connection, name, [b"n1", b"n2"])
    assert reader.wait_for(3) == [b"m10", b"n1", b"n2"]
    assert reader.offsets() == [9, 10, 11]


@pytest.mark.parametrize("offset", ["next", NEXT], ids=["next", "no-offset"])
def test_next_and_no_offset_read_only_what_is_published_after_the_consume(connection, stream, offset):
    name = filled(stream, connection, 5)
    reader = Reader(connection, name, offset)
    assert reader.quiet() == []

    append(connection, name, [b"n1", b"n2", b"n3"])

    assert reader.wait_for(3) == [b"n1", b"n2", b"n3"]
    assert reader.offsets() == [5, 6, 7]


def test_first_last_and_next_on_an_empty_stream_all_get_the_first_message(connection, stream):
    name = stream()
    readers = [Reader(connection, name, offset) for offset in ("first", "last", "next", 0)]
    assert all(reader.quiet(0.2) == [] for reader in readers)

    append(connection, name, [b"a", b"b"])

    for reader in readers:
        assert reader.wait_for(2) == [b"a", b"b"]
        assert reader.offsets() == [0, 1]


def utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(seconds), datetime.timezone.utc)


def test_a_timestamp_or_an_interval_selects_the_chunks_written_since(connection, stream):
    """A timestamp (seconds, 'T') or an interval ("2s": now minus 2 s) starts at the first chunk written
    at or after it; older chunks are skipped, and one in the future waits like next."""
    name = stream()
    append(connection, name, [b"old1", b"old2"])
    split = int(time.time()) + 1
    time.sleep(max(split - time.time(), 0) + 2.5)  # the old chunks are > 2 s old and before `split`
    append(connection, name, [b"new1", b"new2"])

    since_split, since_2s = Reader(connection, name, utc(split)), Reader(connection, name, "2s")
    before_all, future = Reader(connection, name, utc(split - 3600)), Reader(connection, name, utc(time.time() + 3600))

    assert since_split.wait_for(2) == [b"new1", b"new2"] and since_split.offsets() == [2, 3]
    assert since_2s.wait_for(2) == [b"new1", b"new2"] and since_2s.offsets() == [2, 3]
    assert before_all.wait_for(4) == [b"old1", b"old2", b"new1", b"new2"]
    assert future.quiet() == []
    append(connection, name, [b"later"])
    assert future.wait_for(1) == [b"later"] and future.offsets() == [4]
    assert since_2s.wait_for(3) == [b"new1", b"new2", b"later"]


@pytest.mark.parametrize("interval", ["1h", "30m", "2D", "1Y", "1M", "59s", "007D"])
def test_an_interval_longer_than_the_streams_age_reads_everything(connection, stream, interval):
    name = filled(stream, connection, 3)
    reader = Reader(connection, name, interval)

    assert reader.wait_for(3) == numbered_bodies(3)
    assert reader.offsets() == [0, 1, 2]


def test_a_timestamp_before_the_stream_reads_everything(connection, stream):
    name = filled(stream, connection, 3)
    reader = Reader(connection, name, datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc))

    assert reader.wait_for(3) == numbered_bodies(3)


def test_many_consumers_at_different_offsets_read_the_same_stream(connection, stream):
    name = filled(stream, connection, 10)
    shared = connection.channel()
    readers = {
        "first": Reader(connection, name, "first"),
        3: Reader(connection, name, 3),
        7: Reader(connection, name, 7, channel=shared),
        "last": Reader(connection, name, "last", channel=shared),
        "next": Reader(connection, name, "next"),
        "again-first": Reader(connection, name, "first", channel=shared),
    }
    expected_start = {"first": 0, 3: 3, 7: 7, "last": 9, "next": 10, "again-first": 0}
    for key, reader in readers.items():
        reader.wait_for(10 - expected_start[key])

    append(connection, name, [b"m11", b"m12"])

    everything = numbered_bodies(12)
    for key, reader in readers.items():
        start = expected_start[key]
        assert reader.wait_for(12 - start) == everything[start:], key
        assert reader.offsets() == list(range(start, 12)), key


def test_a_consumer_at_the_tail_is_pushed_each_message_as_it_is_appended(connection, stream, broker):
    name = filled(stream, connection, 3)
    reader = Reader(connection, name, "next")
    other = connect(broker)
    try:
        publisher = other.channel()
        publisher.confirm_delivery()
        for index in range(5):
            publisher.basic_publish("", name, f"tail{index}".encode())
            assert reader.wait_for(index + 1)[-1] == f"tail{index}".encode()
    finally:
        other.close()
    assert reader.offsets() == [3, 4, 5, 6, 7]


def test_headers_and_properties_are_kept_and_the_offset_header_is_the_brokers(connection, stream):
    name = stream()
    append(connection, name, [b"first"])
    properties = pika.BasicProperties(headers={"k": 1, "x-stream-offset": 999}, content_type="text/plain",
                                      message_id="id1", priority=3, delivery_mode=2)
    append(connection, name, [b"with-headers"], properties)
    reader = Reader(connection, name, "first")

    reader.wait_for(2)
    received = reader.deliveries[1].properties
    assert received.headers == {"k": 1, "x-stream-offset": 1}  # the publisher's 999 is replaced
    assert type(received.headers["x-stream-offset"]) is wire_long
    assert (received.content_type, received.message_id, received.priority, received.delivery_mode) == (
        "text/plain", "id1", 3, 2)
    assert reader.deliveries[0].properties.headers == {"x-stream-offset": 0}


def test_messages_routed_through_an_exchange_keep_its_name_and_routing_key(connection, stream, unique):
    name = stream()
    exchange = unique("stream-fanout")
    channel = connection.channel()
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    channel.queue_bind(name, exchange)
    channel.confirm_delivery()
    channel.basic_publish(exchange, "some.key", b"routed", mandatory=True)
    reader = Reader(connection, name, "first")

    reader.wait_for(1)
    assert (reader.deliveries[0].exchange, reader.deliveries[0].routing_key, reader.deliveries[0].offset) == (
        exchange, "some.key", 0)
    channel.exchange_delete(exchange)


# -- credit, ack, cancel -------------------------------------------------------------------------


def test_the_prefetch_bounds_unacked_deliveries_and_an_ack_returns_credit(connection, stream):
    name = filled(stream, connection, 10)
    reader = Reader(connection, name, "first", prefetch=2)
    assert reader.wait_for(2) == numbered_bodies(2)
    assert reader.quiet() == numbered_bodies(2)

    reader.channel.basic_ack(reader.deliveries[0].tag)
    assert reader.wait_for(3) == numbered_bodies(3)
    assert reader.quiet() == numbered_bodies(3)

    reader.channel.basic_ack(reader.deliveries[2].tag, multiple=True)  # settles tags 2 and 3
    assert reader.wait_for(5) == numbered_bodies(5)
    assert reader.quiet() == numbered_bodies(5)
    # Acked messages stay in the stream: a new consumer reads them again; nothing was redelivered.
    assert not any(delivery.redelivered for delivery in reader.deliveries)
    again = Reader(connection, name, "first", prefetch=10)
    assert again.wait_for(10) == numbered_bodies(10)


def test_acking_a_delivery_twice_is_406_unknown_delivery_tag(connection, stream):
    name = filled(stream, connection, 3)
    reader = Reader(connection, name, "first", prefetch=1)
    reader.wait_for(1)
    closed: list[Any] = []
    reader.channel._impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))

    reader.channel.basic_ack(reader.deliveries[0].tag)
    try:
        reader.channel.basic_ack(reader.deliveries[0].tag)
    except ChannelClosedByBroker:
        pass  # pika raises when the close arrives while it flushes this ack; the callback has it too

    assert poll(lambda: closed, WAIT_S, pump=pumping(connection))
    assert (closed[0].reply_code, closed[0].reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_a_cancelled_consumer_gets_nothing_more_and_a_new_one_replays(connection, stream):
    name = filled(stream, connection, 10)
    reader = Reader(connection, name, "first", prefetch=3)
    assert reader.wait_for(3) == numbered_bodies(3)  # the window is full: nothing is in flight

    reader.channel.basic_cancel(reader.tag)
    append(connection, name, [b"m11"])

    assert reader.quiet() == numbered_bodies(3)
    replay = Reader(connection, name, 2, prefetch=20, channel=reader.channel)
    assert replay.wait_for(9) == numbered_bodies(11)[2:]
    assert replay.offsets() == list(range(2, 11))


def test_deleting_a_stream_cancels_its_consumers(connection, broker, unique):
    name = unique("stream-deleted")
    connection.channel().queue_declare(name, durable=True, arguments=STREAM)
    reader = Reader(connection, name, "next", prefetch=1)
    cancelled: list[Any] = []
    reader.channel.add_on_cancel_callback(cancelled.append)

    client = connect(broker)
    deleted = client.channel().queue_delete(name).method
    client.close()

    assert poll(lambda: cancelled, WAIT_S, pump=pumping(connection))
    assert cancelled[0].method.consumer_tag == reader.tag
    assert deleted.message_count == 0  # RabbitMQ counts no messages in a stream's delete-ok
    assert not queue_exists(broker, name)


def test_delete_if_empty_and_if_unused_delete_a_stream_holding_messages(connection, stream, broker):
    """RabbitMQ's stream reports 0 messages, so if-empty never refuses; if-unused with no consumer deletes."""
    for condition in ({"if_empty": True}, {"if_unused": True}):
        name = filled(stream, connection, 3)
        assert connection.channel().queue_delete(name, **condition).method.message_count == 0
        assert not queue_exists(broker, name)


# -- what a stream refuses on consume, get, qos and purge ----------------------------------------


def test_a_consumer_without_a_prefetch_is_406_on_its_channel(connection, stream):
    name = stream()
    text = f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{name}' in vhost '/''"
    plain, zero, only_global = connection.channel(), connection.channel(), connection.channel()
    zero.basic_qos(prefetch_count=0)
    only_global.basic_qos(prefetch_count=10, global_qos=True)

    for channel in (plain, zero, only_global):
        assert channel_error(lambda: channel.basic_consume(name, lambda *args: None)) == (406, text)
    # The prefetch is checked before no-ack.
    no_ack = connection.channel()
    assert channel_error(lambda: no_ack.basic_consume(name, lambda *args: None, auto_ack=True)) == (406, text)
    assert connection.is_open


def test_a_no_ack_consumer_is_540_and_closes_the_connection(connection, stream):
    name = stream()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)

    assert connection_error(lambda: channel.basic_consume(name, lambda *args: None, auto_ack=True)) == (
        540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{name}' in vhost '/'")
    assert connection.is_closed


@pytest.mark.parametrize("auto_ack", [False, True])
def test_basic_get_is_540_and_closes_the_connection(connection, stream, auto_ack):
    name = filled(stream, connection, 1)
    channel = connection.channel()

    assert connection_error(lambda: channel.basic_get(name, auto_ack=auto_ack)) == (
        540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{name}' in vhost '/'")


def test_a_consume_after_a_global_qos_is_540_and_closes_the_connection(connection, stream):
    """The channel has a per-consumer prefetch, then a global one: RabbitMQ's limiter is active."""
    name = filled(stream, connection, 3)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=5)
    channel.basic_qos(prefetch_count=3, global_qos=True)

    assert connection_error(lambda: channel.basic_consume(
        name, lambda *args: None, arguments={"x-stream-offset": "first"})) == (
        540, f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos")


@pytest.mark.parametrize(
    ("steps", "delivered"),
    [
        # A per-consumer basic.qos lifts the channel's global limit (RabbitMQ 3.10 unlimits the limiter) ...
        (["global 2", "consumer 5", "consume"], 5),
        (["consumer 5", "global 3", "consumer 4", "consume"], 4),
        # ... a global qos of 0 is no limit ...
        (["consumer 5", "global 0", "consume"], 5),
        (["consumer 5", "global 3", "global 0", "consume"], 5),
        # ... and a global qos sent once the stream consumer runs is accepted and changes nothing for it.
        (["consumer 5", "consume", "global 2"], 5),
    ],
    ids=lambda value: "-".join(value).replace(" ", "") if isinstance(value, list) else str(value),
)
def test_a_global_qos_that_is_not_active_at_consume_time_is_accepted(connection, stream, steps, delivered):
    name = filled(stream, connection, 10)
    channel = connection.channel()
    reader: Reader | None = None
    for step in steps:
        kind, _, count = step.partition(" ")
        if kind == "consume":
            reader = Reader(connection, name, "first", prefetch=None, channel=channel)
        else:
            channel.basic_qos(prefetch_count=int(count), global_qos=kind == "global")
    assert reader is not None

    assert reader.wait_for(delivered) == numbered_bodies(delivered)
    assert reader.quiet() == numbered_bodies(delivered)


def test_purging_a_stream_is_540_and_closes_the_connection(connection, stream, broker):
    name = filled(stream, connection, 3)
    channel = connection.channel()

    assert connection_error(lambda: channel.queue_purge(name)) == (
        540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{name}' in vhost '/'")
    client = connect(broker)
    try:
        reader = Reader(client, name, "first")
        assert reader.wait_for(3) == numbered_bodies(3)  # nothing was removed
    finally:
        client.close()


@pytest.mark.parametrize(
    "arguments",
    [{"x-priority": 5}, {"x-priority": "x"}, {"x-cancel-on-ha-failover": True}],
    ids=param_id,
)
def test_consumer_arguments_a_stream_does_not_take_are_406(connection, stream, arguments):
    name = stream()
    argument = next(iter(arguments))
    text = f"PRECONDITION_FAILED - invalid arg '{argument}' {where(name)} of queue type rabbit_stream_queue"
    with_prefetch, without = connection.channel(), connection.channel()
    with_prefetch.basic_qos(prefetch_count=10)

    assert channel_error(lambda: with_prefetch.basic_consume(name, lambda *args: None, arguments=arguments)) == (406, text)
    # Checked before the prefetch.
    assert channel_error(lambda: without.basic_consume(name, lambda *args: None, arguments=arguments)) == (406, text)


@pytest.mark.parametrize("offset", ["7X", "0s", "1h30m", "1.5h", "10"])
def test_a_malformed_interval_offset_is_406_on_the_channel(connection, stream, offset):
    name = stream()
    text = (f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' {where(name)}: "
            f'{{invalid_stream_offset_arg,{{longstr,<<"{offset}">>}}}}')
    channel, no_prefetch, no_ack = connection.channel(), connection.channel(), connection.channel()
    channel.basic_qos(prefetch_count=10)
    no_ack.basic_qos(prefetch_count=10)
    arguments = {"x-stream-offset": offset}

    assert channel_error(lambda: channel.basic_consume(name, lambda *args: None, arguments=arguments)) == (406, text)
    # The offset is checked before the prefetch, before no-ack and before the other consumer arguments.
    assert channel_error(lambda: no_prefetch.basic_consume(name, lambda *args: None, arguments=arguments)) == (406, text)
    assert channel_error(lambda: no_ack.basic_consume(
        name, lambda *args: None, auto_ack=True, arguments=arguments)) == (406, text)
    other = connection.channel()
    other.basic_qos(prefetch_count=10)
    assert channel_error(lambda: other.basic_consume(
        name, lambda *args: None, arguments={"x-priority": 1, **arguments})) == (406, text)


@pytest.mark.parametrize(
    "offset",
    ["bogus", "", "abc", "-1h", "FIRST", True, False, {"a": 1}, [1], decimal.Decimal("1.5"), None],
    ids=param_id,
)
def test_an_offset_of_another_kind_is_refused_and_the_broker_goes_on(connection, stream, broker, offset):
    """RabbitMQ 3.10.8 crashes on these (541 INTERNAL_ERROR, the connection closes): an interval without a
    number fails in list_to_integer, other types in osiris_log:init_offset_reader0. This broker answers as
    RabbitMQ does for a malformed interval: 406 on the channel."""
    name = filled(stream, connection, 2)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    delivered: list[bytes] = []

    answer = refusal(lambda: channel.basic_consume(
        name, lambda _ch, _method, _props, body: delivered.append(body), arguments={"x-stream-offset": offset}))

    if broker.is_external:
        assert answer == ("connection", 541, "INTERNAL_ERROR")
    elif isinstance(offset, str):
        assert answer == ("channel", 406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' {where(name)}: "
                                          f'{{invalid_stream_offset_arg,{{longstr,<<"{offset}">>}}}}')
    else:
        assert answer[:2] == ("channel", 406)
        assert answer[2].startswith(f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' {where(name)}: ")
    assert delivered == []
    client = connect(broker)
    try:
        assert Reader(client, name, "first").wait_for(2) == numbered_bodies(2)  # the stream still serves
    finally:
        client.close()


@pytest.mark.parametrize(("queue_type", "offset"), [("classic", "first"), ("classic", 5), ("classic", "bogus"),
                                                    ("quorum", "first")])
def test_x_stream_offset_on_another_queue_type_is_406(connection, unique, queue_type, offset):
    name = unique(f"{queue_type}-offset")
    declaring = connection.channel()
    declaring.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    try:
        assert channel_error(lambda: channel.basic_consume(
            name, lambda *args: None, arguments={"x-stream-offset": offset})) == (
            406,
            f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' {where(name)} of queue type rabbit_{queue_type}_queue")
    finally:
        declaring.queue_delete(name)
