"""Streams (`x-queue-type: stream`, queues/stream_queue.py) through the broker's AMQP methods:
declare, publish confirmed after fsync, consume from any offset with the offset header, credit
only on ack, offset tracking that resumes after the last *acked* message, exact filtering and
retention. (interop_tests/test_streams_*.py checks RabbitMQ's behaviour with real clients.)"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from persistence.definitions import FileDefinitionStore
from queues.raw_properties import RawProperties, encode_field
from queues.stream_queue import with_offset_header
from tests.frame_driver import FakeClient, methods, opened_client, publish_frames, unmarshal_all

STREAM = {"x-queue-type": "stream"}


def run(tmp_path: Path, scenario: Callable[[Broker], Awaitable[None]], restarts: bool = False) -> None:
    """`scenario` on a broker over `tmp_path`; with `restarts`, its definitions are kept in files
    too, so a later run finds the stream again."""
    async def main() -> None:
        broker = Broker(store=FileDefinitionStore(tmp_path) if restarts else None, message_dir=tmp_path)
        try:
            await scenario(broker)
        finally:
            await broker.close()

    asyncio.run(main())


def deliveries(received: list[tuple[int, Any]]) -> list[tuple[commands.Basic.Deliver, ContentHeader, bytes]]:
    """(deliver, content header, body) of each basic.deliver in `received`."""
    found: list[Any] = []
    for _channel, frame in received:
        if isinstance(frame, commands.Basic.Deliver):
            found.append([frame, None, b""])
        elif isinstance(frame, ContentHeader) and found and found[-1][1] is None:
            found[-1][1] = frame
        elif isinstance(frame, ContentBody):
            found[-1][2] += frame.value
    return [tuple(item) for item in found]


def offsets_and_bodies(received: list[tuple[int, Any]]) -> list[tuple[int, bytes]]:
    return [(header.properties.headers["x-stream-offset"], body) for _d, header, body in deliveries(received)]


# What a client was sent while a helper here drove it, for the next settle() to return.
_UNREAD: dict[int, list[tuple[int, Any]]] = {}


async def settle(broker: Broker, client: FakeClient) -> list[tuple[int, Any]]:
    """Let the committer's rounds finish (records become readable, confirms leave) and take
    what the broker sent meanwhile (and what it sent during consume())."""
    received: list[tuple[int, Any]] = _UNREAD.pop(id(client), [])
    for _ in range(5):
        await broker.committer.idle()
        received += client.take()
    return received


async def published_stream(broker: Broker, count: int, name: str = "s", **headers_of: Any) -> FakeClient:
    client = opened_client(broker)
    send(client, 1, commands.Queue.Declare(queue=name, durable=True, arguments=STREAM))
    assert [m for m in methods(await settle(broker, client)) if isinstance(m, commands.Queue.DeclareOk)]
    client.call(1, commands.Confirm.Select())
    for n in range(count):
        headers = headers_of.get("headers", lambda n: None)(n)
        client.send_bytes(publish_frames(1, b"m%d" % n, routing_key=name,
                                         properties=commands.Basic.Properties(headers=headers)))
    acks = [m for m in methods(await settle(broker, client)) if isinstance(m, commands.Basic.Ack)]
    assert acks and acks[-1].delivery_tag == count
    return client


def send(client: FakeClient, channel: int, method: Any) -> None:
    """Send `method`; what the broker answers (deliveries included) is for the next settle()."""
    _UNREAD.setdefault(id(client), []).extend(client.send(channel, method))


def consume(client: FakeClient, channel: int, queue: str, prefetch: int = 100, **arguments: Any) -> None:
    client.open_channel(channel)
    client.call(channel, commands.Basic.Qos(prefetch_count=prefetch))
    sent = client.send(channel, commands.Basic.Consume(queue=queue, consumer_tag=f"c{channel}", arguments=arguments))
    _UNREAD.setdefault(id(client), []).extend(sent)


# -- declare -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "refused"), [
    ({"exclusive": True}, "exclusive-owner"),
    ({"auto_delete": True}, "auto-delete"),
    ({"durable": False}, "non-durable"),
])
def test_a_stream_is_durable_shared_and_not_auto_deleted(tmp_path: Path, options: dict[str, Any], refused: str) -> None:
    async def scenario(broker: Broker) -> None:
        client = opened_client(broker)
        declare = {"queue": "s", "durable": True, "arguments": STREAM, **options}
        close = client.call(1, commands.Queue.Declare(**declare))
        assert isinstance(close, commands.Channel.Close) and close.reply_code == 406
        assert close.reply_text == f"PRECONDITION_FAILED - invalid property '{refused}' for queue 's' in vhost '/'"

    run(tmp_path, scenario)


@pytest.mark.parametrize("argument", [
    {"x-message-ttl": 1000}, {"x-dead-letter-exchange": "dlx"}, {"x-max-length": 10}, {"x-overflow": "reject-publish"},
    {"x-max-priority": 5}, {"x-single-active-consumer": True}, {"x-delivery-limit": 3}, {"x-expires": 1000},
])
def test_arguments_streams_do_not_take_are_refused_with_the_stream_module(tmp_path: Path, argument: dict[str, Any]) -> None:
    async def scenario(broker: Broker) -> None:
        close = opened_client(broker).call(1, commands.Queue.Declare(queue="s", durable=True,
                                                                      arguments={**STREAM, **argument}))
        [key] = argument
        assert close.reply_code == 406
        assert close.reply_text == (f"PRECONDITION_FAILED - invalid arg '{key}' for queue 's' in vhost '/' "
                                    "of queue type rabbit_stream_queue")

    run(tmp_path, scenario)


@pytest.mark.parametrize("max_age", ["7X", "abc", "0D", "-1h", 5])
def test_a_bad_max_age_is_refused(tmp_path: Path, max_age: Any) -> None:
    async def scenario(broker: Broker) -> None:
        close = opened_client(broker).call(1, commands.Queue.Declare(queue="s", durable=True,
                                                                      arguments={**STREAM, "x-max-age": max_age}))
        assert close.reply_code == 406 and "invalid arg 'x-max-age'" in close.reply_text

    run(tmp_path, scenario)


def test_retention_arguments_are_taken(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        ok = opened_client(broker).call(1, commands.Queue.Declare(queue="s", durable=True, arguments={
            **STREAM, "x-max-age": "7D", "x-max-length-bytes": 1_000_000, "x-stream-max-segment-size-bytes": 100_000,
            "x-initial-cluster-size": 1}))
        assert isinstance(ok, commands.Queue.DeclareOk)
        settings = broker.vhosts["/"].queues["s"].settings
        assert (settings.max_age_ms, settings.max_length_bytes) == (7 * 86_400_000, 1_000_000)

    run(tmp_path, scenario)


# -- publish: confirmed once fsynced ----------------------------------------------------------


def test_a_publish_to_a_stream_is_confirmed_only_after_its_record_is_fsynced(tmp_path: Path, monkeypatch) -> None:
    async def scenario(broker: Broker) -> None:
        syncing = threading.Event()
        disk_done = threading.Event()

        def slow_fsync(fd: int) -> None:
            syncing.set()
            assert disk_done.wait(10), "the test never let the fsync finish"

        monkeypatch.setattr(broker.committer, "_sync_file", slow_fsync)
        client = opened_client(broker)
        client.call(1, commands.Queue.Declare(queue="s", durable=True, arguments=STREAM))
        client.call(1, commands.Confirm.Select())
        client.send_bytes(b"".join(publish_frames(1, b"m%d" % n, routing_key="s") for n in range(3)))
        await asyncio.get_running_loop().run_in_executor(None, syncing.wait, 10)
        assert not [m for m in methods(client.take()) if isinstance(m, commands.Basic.Ack)], "confirmed before fsync"
        disk_done.set()
        acks = [m for m in methods(await settle(broker, client)) if isinstance(m, commands.Basic.Ack)]
        assert [(a.delivery_tag, a.multiple) for a in acks] == [(3, True)]

    run(tmp_path, scenario)


# -- consume -----------------------------------------------------------------------------------


def test_an_offset_past_the_end_waits_for_that_very_offset(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 2)
        consume(client, 2, "s", **{"x-stream-offset": 4})
        for n in range(2, 6):
            client.send_bytes(publish_frames(1, b"m%d" % n, routing_key="s"))
        assert offsets_and_bodies(await settle(broker, client)) == [(4, b"m4"), (5, b"m5")]

    run(tmp_path, scenario)


@pytest.mark.parametrize(("offset", "first"), [("first", 0), (3, 3), (0, 0), (-2, 0), (99, None), ("next", None)])
def test_a_consumer_starts_where_its_offset_says(tmp_path: Path, offset: Any, first: int | None) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 5)
        consume(client, 2, "s", **{"x-stream-offset": offset})
        got = offsets_and_bodies(await settle(broker, client))
        expected = [] if first is None else [(n, b"m%d" % n) for n in range(first, 5)]
        assert got == expected

    run(tmp_path, scenario)


def test_every_delivery_carries_its_offset_as_a_64_bit_long(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 2, headers=lambda n: {"app": n} if n else None)
        consume(client, 2, "s", **{"x-stream-offset": "first"})
        found = deliveries(await settle(broker, client))
        assert [header.properties.headers for _d, header, _b in found] == [
            {"x-stream-offset": 0}, {"x-stream-offset": 1, "app": 1}]
        assert [d.redelivered for d, _h, _b in found] == [False, False]

    run(tmp_path, scenario)


def test_last_is_the_first_record_of_the_last_chunk_written(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 3)  # one read, one chunk
        client.send_bytes(publish_frames(1, b"late", routing_key="s"))
        await settle(broker, client)
        consume(client, 2, "s", **{"x-stream-offset": "last"})
        assert offsets_and_bodies(await settle(broker, client)) == [(3, b"late")]

    run(tmp_path, scenario)


def test_a_timestamp_or_an_interval_starts_at_the_first_record_since(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 3)
        consume(client, 2, "s", **{"x-stream-offset": "1h"})
        assert [o for o, _b in offsets_and_bodies(await settle(broker, client))] == [0, 1, 2]
        future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
        consume(client, 3, "s", **{"x-stream-offset": future})
        assert offsets_and_bodies(await settle(broker, client)) == []

    run(tmp_path, scenario)


def test_a_consumer_at_the_tail_is_pushed_what_is_published_later(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 2)
        consume(client, 2, "s")  # next
        assert offsets_and_bodies(await settle(broker, client)) == []
        client.send_bytes(publish_frames(1, b"new", routing_key="s"))
        assert offsets_and_bodies(await settle(broker, client)) == [(2, b"new")]

    run(tmp_path, scenario)


def test_many_consumers_read_the_same_records_at_their_own_pace(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 6)
        consume(client, 2, "s", **{"x-stream-offset": "first"})
        consume(client, 3, "s", **{"x-stream-offset": 4})
        received = await settle(broker, client)
        by_channel: dict[int, list[int]] = {2: [], 3: []}
        for channel, frame in received:
            if isinstance(frame, commands.Basic.Deliver):
                by_channel[channel].append(frame.delivery_tag)
        assert (len(by_channel[2]), len(by_channel[3])) == (6, 2)
        assert broker.vhosts["/"].queues["s"].message_count == 6  # nothing was taken away

    run(tmp_path, scenario)


def _long_history() -> list[tuple[str, dict[str, Any] | None, bytes]]:
    """(routing key, headers, body) of 3,000 publishes: runs of one envelope and envelopes that
    alternate, an empty body and bodies larger than a frame (frame_max 131072) among them."""
    history = []
    for n in range(3000):
        key = "s" if n < 1500 or n % 2 else "other"
        headers = None if n % 3 else {"n": n % 5, "x-stream-offset": 7} if n % 7 == 0 else {"n": n % 5}
        body = b"" if n == 10 else b"B" * 300_000 if n in (400, 2001) else b"m%d" % n
        history.append((key, headers, body))
    return history


def test_ten_consumers_reading_a_long_history_each_get_every_record_as_published(tmp_path: Path) -> None:
    # (History is read by blocks each read once for all readers: persistence/stream_blocks.py.)
    history = _long_history()

    async def scenario(broker: Broker) -> None:
        client = opened_client(broker)
        send(client, 1, commands.Queue.Declare(queue="s", durable=True, arguments=STREAM))
        send(client, 1, commands.Queue.Bind(queue="s", exchange="amq.direct", routing_key="other"))
        client.call(1, commands.Confirm.Select())
        for key, headers, body in history:
            client.send_bytes(publish_frames(1, body, exchange="" if key == "s" else "amq.direct", routing_key=key,
                                             properties=commands.Basic.Properties(headers=headers, delivery_mode=2)))
        await settle(broker, client)
        channels = range(2, 12)
        for channel in channels:
            consume(client, channel, "s", prefetch=300, **{"x-stream-offset": "first"})
        got: dict[int, list[tuple[int, str, dict[str, Any], bytes]]] = {channel: [] for channel in channels}
        while any(len(got[channel]) < len(history) for channel in channels):
            received = await settle(broker, client)
            by_channel: dict[int, list[Any]] = {}
            for channel, frame in received:
                by_channel.setdefault(channel, []).append((channel, frame))
            assert by_channel, "deliveries stopped"
            for channel, frames in by_channel.items():
                found = deliveries(frames)
                for deliver, header, body in found:
                    got[channel].append((deliver.redelivered, deliver.exchange, deliver.routing_key,
                                         dict(header.properties.headers), body))
                if found:
                    send(client, channel, commands.Basic.Ack(delivery_tag=found[-1][0].delivery_tag, multiple=True))
        for channel in channels:
            for offset, (redelivered, exchange, key, headers, body) in enumerate(got[channel]):
                published_key, published_headers, published_body = history[offset]
                assert not redelivered
                assert (exchange, key) == ("" if published_key == "s" else "amq.direct", published_key)
                assert headers == {**(published_headers or {}), "x-stream-offset": offset}
                assert body == published_body

    run(tmp_path, scenario)


def test_a_stream_consumers_first_batch_is_offered_for_writing_before_the_turn_ends(tmp_path: Path) -> None:
    from amqp_server.connection.connection import EARLY_WRITE_DELIVERIES

    async def scenario(broker: Broker) -> None:
        await published_stream(broker, 3 * EARLY_WRITE_DELIVERIES)
        early: list[bytes] = []
        reader = FakeClient(broker, on_early_write=lambda: early.append(reader.connection.take_early_output()))
        reader.handshake()
        consume(reader, 2, "s", prefetch=1000, **{"x-stream-offset": "first"})
        assert len(early) == 1, "offered once, when EARLY_WRITE_DELIVERIES deliveries waited"
        offered = deliveries(unmarshal_all(early[0]))
        assert len(offered) >= EARLY_WRITE_DELIVERIES
        rest = deliveries(await settle(broker, reader))
        assert [d.delivery_tag for d, _h, _b in offered + rest] == list(range(1, 3 * EARLY_WRITE_DELIVERIES + 1))

    run(tmp_path, scenario)


def test_stream_deliveries_are_traced_as_delivered(tmp_path: Path) -> None:
    from amqp_server.broker.firehose import set_tracing
    from tests.test_firehose import drain

    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 3)
        client.call(1, commands.Queue.Declare(queue="trace"))
        client.call(1, commands.Queue.Bind(queue="trace", exchange="amq.rabbitmq.trace", routing_key="deliver.#"))
        set_tracing(broker.vhosts["/"], True, broker.node_name)
        consume(client, 2, "s", **{"x-stream-offset": "first"})
        assert len(deliveries(await settle(broker, client))) == 3
        traced = drain(client, "trace")
        assert [(key, body) for key, _headers, body in traced] == [("deliver.s", b"m%d" % n) for n in range(3)]
        assert [headers["properties"]["headers"]["x-stream-offset"] for _k, headers, _b in traced] == [0, 1, 2]

    run(tmp_path, scenario)


def test_a_damaged_record_is_stepped_over_and_the_consumer_goes_on(tmp_path: Path) -> None:
    from tests.test_stream_log import flip_byte_in_record

    async def first_run(broker: Broker) -> None:
        await published_stream(broker, 3000)

    async def second_run(broker: Broker) -> None:
        client = opened_client(broker)
        consume(client, 2, "s", prefetch=5000, **{"x-stream-offset": "first"})
        got = [o for o, _b in offsets_and_bodies(await settle(broker, client))]
        assert got == [n for n in range(3000) if n != 1234]
        client.send_bytes(publish_frames(1, b"after", routing_key="s"))
        assert offsets_and_bodies(await settle(broker, client)) == [(3000, b"after")], "and the stream works on"

    run(tmp_path, first_run, restarts=True)
    [segment] = sorted(tmp_path.glob("streams/*/*/*.seg"))
    flip_byte_in_record(segment, 1234, 46)  # in its body (the record is 49 bytes)
    run(tmp_path, second_run, restarts=True)


def test_a_channel_wide_limit_set_after_the_consume_holds_back_deliveries(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 4)
        consume(client, 2, "s", prefetch=100, **{"x-stream-offset": "first"})
        assert len(deliveries(await settle(broker, client))) == 4
        client.call(2, commands.Basic.Qos(prefetch_count=6, global_=True))
        for n in range(4, 14):
            client.send_bytes(publish_frames(1, b"m%d" % n, routing_key="s"))
        assert [o for o, _b in offsets_and_bodies(await settle(broker, client))] == [4, 5], "6 unacked on the channel"
        send(client, 2, commands.Basic.Ack(delivery_tag=6, multiple=True))
        assert [o for o, _b in offsets_and_bodies(await settle(broker, client))] == [6, 7, 8, 9, 10, 11]

    run(tmp_path, scenario)


def test_acks_only_return_credit_and_nothing_is_requeued(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 5)
        consume(client, 2, "s", prefetch=2, **{"x-stream-offset": "first"})
        first = deliveries(await settle(broker, client))
        assert [d.delivery_tag for d, _h, _b in first] == [1, 2]  # the prefetch, then it waits
        send(client, 2, commands.Basic.Nack(delivery_tag=1, multiple=False, requeue=True))
        send(client, 2, commands.Basic.Reject(delivery_tag=2, requeue=True))
        again = offsets_and_bodies(await settle(broker, client))
        assert again == [(2, b"m2"), (3, b"m3")]  # the next records, not the rejected ones again

    run(tmp_path, scenario)


@pytest.mark.parametrize(("setup", "code", "text"), [
    ("no-prefetch", 406, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 's' in vhost '/''"),
    ("no-ack", 540, "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 's' in vhost '/'"),
    ("global-qos", 540, "NOT_IMPLEMENTED - queue 's' in vhost '/' does not support global qos"),
    ("bad-offset", 406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': "
                        '{invalid_stream_offset_arg,{longstr,<<"bogus">>}}'),
    ("float-offset", 406, "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': "
                          "{invalid_stream_offset_arg,{double,1.5}}"),
    ("priority", 406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 's' in vhost '/' of queue type "
                      "rabbit_stream_queue"),
])
def test_consumes_a_stream_refuses(tmp_path: Path, setup: str, code: int, text: str) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 1)
        client.open_channel(2)
        if setup != "no-prefetch":
            client.call(2, commands.Basic.Qos(prefetch_count=10))
        if setup == "global-qos":  # a global limit after the per-consumer one: RabbitMQ's limiter is active
            client.call(2, commands.Basic.Qos(prefetch_count=10, global_=True))
        arguments = {"bad-offset": {"x-stream-offset": "bogus"}, "float-offset": {"x-stream-offset": 1.5},
                     "priority": {"x-priority": 5}}.get(setup, {})
        [reply] = [m for m in methods(client.send(2, commands.Basic.Consume(
            queue="s", no_ack=setup == "no-ack", arguments=arguments)))]
        closing = commands.Connection.Close if code == 540 else commands.Channel.Close
        assert isinstance(reply, closing) and (reply.reply_code, reply.reply_text) == (code, text)

    run(tmp_path, scenario)


def test_basic_get_on_a_stream_closes_the_connection_with_540(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 1)
        reply = client.call(1, commands.Basic.Get(queue="s"))
        assert isinstance(reply, commands.Connection.Close)
        assert (reply.reply_code, reply.reply_text) == (
            540, "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 's' in vhost '/'")

    run(tmp_path, scenario)


# -- beyond RabbitMQ: offset tracking and exact filtering --------------------------------------


def test_a_tracked_consumer_resumes_after_its_last_acked_message_across_a_restart(tmp_path: Path) -> None:
    """LavinMQ's x-stream-automatic-offset-tracking resumes after the last *delivered* message,
    so prefetched messages never acked are skipped; here they are delivered again."""
    async def first_run(broker: Broker) -> None:
        client = await published_stream(broker, 6)
        consume(client, 2, "s", prefetch=4, **{"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
        delivered = deliveries(await settle(broker, client))
        assert len(delivered) == 4  # offsets 0..3 prefetched
        send(client, 2, commands.Basic.Ack(delivery_tag=2, multiple=True))  # 0 and 1 acked, 2 and 3 not
        await settle(broker, client)

    async def second_run(broker: Broker) -> None:
        client = opened_client(broker)
        consume(client, 2, "s", prefetch=10, **{"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
        assert [o for o, _b in offsets_and_bodies(await settle(broker, client))] == [2, 3, 4, 5]

    run(tmp_path, first_run, restarts=True)
    run(tmp_path, second_run, restarts=True)


def test_an_out_of_order_ack_does_not_move_the_resume_point_past_an_unacked_message(tmp_path: Path) -> None:
    async def first_run(broker: Broker) -> None:
        client = await published_stream(broker, 4)
        consume(client, 2, "s", prefetch=4, **{"x-stream-offset": "first", "x-stream-automatic-offset-tracking": True})
        await settle(broker, client)
        send(client, 2, commands.Basic.Ack(delivery_tag=1))  # offset 0
        send(client, 2, commands.Basic.Ack(delivery_tag=3))  # offset 2, while 1 is not acked
        await settle(broker, client)

    async def second_run(broker: Broker) -> None:
        client = opened_client(broker)
        consume(client, 2, "s", **{"x-stream-automatic-offset-tracking": True})
        assert [o for o, _b in offsets_and_bodies(await settle(broker, client))] == [1, 2, 3]

    run(tmp_path, first_run, restarts=True)
    run(tmp_path, second_run, restarts=True)


def test_a_filter_gets_exactly_the_matching_records(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        colours = ["red", "blue", None, "red", "green", None]
        client = await published_stream(broker, 6, headers=lambda n: (
            {"x-stream-filter-value": colours[n]} if colours[n] else {"other": 1}))
        consume(client, 2, "s", **{"x-stream-offset": "first", "x-stream-filter": "red"})
        consume(client, 3, "s", **{"x-stream-offset": "first", "x-stream-filter": ["blue", "green"],
                                    "x-stream-match-unfiltered": True})
        received = await settle(broker, client)
        on = {2: [], 3: []}
        for channel, (deliver, header, body) in [(c, d) for c, d in _by_channel(received)]:
            on[channel].append(header.properties.headers["x-stream-offset"])
        assert on == {2: [0, 3], 3: [1, 2, 4, 5]}

    run(tmp_path, scenario)


def test_a_filter_finds_its_records_past_megabytes_of_others(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = opened_client(broker)
        send(client, 1, commands.Queue.Declare(queue="s", durable=True, arguments=STREAM))
        client.call(1, commands.Confirm.Select())
        for n in range(3001):  # 3 MB of others, more than a consumer's batch reads, then one of its own
            value, body = ("mine", b"wanted") if n == 3000 else ("other", b"s" * 1000)
            client.send_bytes(publish_frames(1, body, routing_key="s", properties=commands.Basic.Properties(
                headers={"x-stream-filter-value": value})))
        await settle(broker, client)
        consume(client, 2, "s", **{"x-stream-offset": "first", "x-stream-filter": "mine"})
        assert offsets_and_bodies(await settle(broker, client)) == [(3000, b"wanted")]

    run(tmp_path, scenario)


def _by_channel(received: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    out = []
    for channel in sorted({c for c, _f in received}):
        for item in deliveries([(c, f) for c, f in received if c == channel]):
            out.append((channel, item))
    return out


# -- retention and restarts ---------------------------------------------------------------------


def test_retention_drops_whole_segments_and_a_consumer_goes_on_from_the_first_kept(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = opened_client(broker)
        client.call(1, commands.Queue.Declare(queue="s", durable=True, arguments={
            **STREAM, "x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 5_000}))
        client.call(1, commands.Confirm.Select())
        for n in range(200):
            client.send_bytes(publish_frames(1, b"x" * 200, routing_key="s"))
            await settle(broker, client)
        stream = broker.vhosts["/"].queues["s"]
        assert stream.log.first_offset > 0, "nothing was dropped"
        assert stream.log.disk_bytes() <= 20_000 + 5_000 + 1_000  # the limit plus one segment (and headers)
        consume(client, 2, "s", prefetch=1000, **{"x-stream-offset": 0})
        got = [o for o, _b in offsets_and_bodies(await settle(broker, client))]
        assert got == list(range(stream.log.first_offset, 200))

    run(tmp_path, scenario)


def test_a_stream_is_back_after_a_restart_at_the_same_offsets(tmp_path: Path) -> None:
    async def first_run(broker: Broker) -> None:
        await published_stream(broker, 5)

    async def second_run(broker: Broker) -> None:
        client = opened_client(broker)
        send(client, 1, commands.Queue.Declare(queue="s", durable=True, arguments=STREAM, passive=True))
        [ok] = [m for m in methods(await settle(broker, client)) if isinstance(m, commands.Queue.DeclareOk)]
        assert ok.message_count == 0  # a stream's declare-ok counts nothing, as RabbitMQ's
        assert broker.vhosts["/"].queues["s"].message_count == 5
        consume(client, 2, "s", **{"x-stream-offset": "first"})
        assert offsets_and_bodies(await settle(broker, client)) == [(n, b"m%d" % n) for n in range(5)]

    run(tmp_path, first_run, restarts=True)
    run(tmp_path, second_run, restarts=True)


def test_queue_delete_removes_the_streams_files(tmp_path: Path) -> None:
    async def scenario(broker: Broker) -> None:
        client = await published_stream(broker, 3)
        directory = broker.vhosts["/"].queues["s"].log.directory
        assert directory.exists()
        reply = client.call(1, commands.Queue.Delete(queue="s"))
        assert isinstance(reply, commands.Queue.DeleteOk) and reply.message_count == 0  # as RabbitMQ's
        assert not directory.exists()

    run(tmp_path, scenario)


# -- the offset header, spliced as bytes --------------------------------------------------------


@pytest.mark.parametrize("properties", [
    commands.Basic.Properties(),
    commands.Basic.Properties(content_type="text/plain", content_encoding="gzip", priority=3),
    commands.Basic.Properties(content_type="a", headers={"b": "c", "n": 5}, message_id="m"),
    commands.Basic.Properties(headers={"x-stream-offset": 77, "z": 1}),
])
def test_the_offset_header_is_set_as_a_decoder_would_set_it(properties: commands.Basic.Properties) -> None:
    from pamqp import header as pamqp_header

    raw = pamqp_header.ContentHeader(0, 3, properties).marshal()[12:]  # after class, weight and body size
    spliced = with_offset_header(raw, 12345)
    decoded = RawProperties(spliced)
    fields = dict(decoded.header_fields())
    assert fields["x-stream-offset"] == encode_field(12345)
    expected = dict(properties.headers or {})
    expected["x-stream-offset"] = 12345
    again = pamqp_header.ContentHeader()
    again.unmarshal(b"\x00\x3c\x00\x00" + (3).to_bytes(8, "big") + spliced)
    assert again.properties.headers == expected
    assert (again.properties.content_type, again.properties.message_id) == (properties.content_type,
                                                                           properties.message_id)
