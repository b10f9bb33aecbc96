"""Any queue from any node: publishing, consuming and basic.get on node b for queues node a owns.

Both nodes run in this process with real TCP between them and to aio-pika (tests/cluster_pair.py);
node b holds stand-ins (RemoteQueue) for a's queues, as shared definitions make them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pytest
from pamqp import commands

from amqp_server.wire import codec
from cluster.links.frames import forward_to_frame
from amqp_server.broker.policies import parse_policy
from tests.cluster_pair import Pair, linked_pair
from tests.frame_driver import publish_frames

PERSISTENT = aio_pika.DeliveryMode.PERSISTENT


_open_connections: list[aio_pika.abc.AbstractConnection] = []


def run(tmp_path: Path, scenario: Callable[[Pair], Awaitable[None]]) -> None:
    async def main() -> None:
        async with linked_pair(tmp_path) as pair:
            try:
                await asyncio.wait_for(scenario(pair), 30)
            finally:
                while _open_connections:
                    connection = _open_connections.pop()
                    if not connection.is_closed:
                        await connection.close()

    asyncio.run(main())


async def opened(url: str) -> aio_pika.abc.AbstractConnection:
    """A connection to `url` that `run` closes when the scenario ends."""
    connection = await aio_pika.connect(url)
    _open_connections.append(connection)
    return connection


async def channel_on(url: str, confirms: bool = True) -> aio_pika.abc.AbstractChannel:
    return await (await opened(url)).channel(publisher_confirms=confirms)


async def get_within(queue: aio_pika.abc.AbstractQueue, seconds: float = 5) -> aio_pika.abc.AbstractIncomingMessage:
    """The next message of `queue` by basic.get, waiting up to `seconds` for one to arrive."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            return message
        assert asyncio.get_running_loop().time() < deadline, f"nothing arrived in {queue.name}"
        await asyncio.sleep(0.02)


async def next_message(queue: aio_pika.abc.AbstractQueue, received: asyncio.Queue) -> aio_pika.abc.AbstractIncomingMessage:
    return await asyncio.wait_for(received.get(), 10)


# -- publishing on b to a's queues -----------------------------------------------------------


def test_a_publish_on_b_is_confirmed_once_the_owner_has_it_and_keeps_its_exchange_and_key(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("orders", durable=True)
        await on_a.declare_queue("audit", durable=True)
        exchange = await on_a.declare_exchange("shop", aio_pika.ExchangeType.TOPIC, durable=True)
        await (await on_a.get_queue("orders")).bind(exchange, "order.*")
        await (await on_a.get_queue("audit")).bind(exchange, "#")
        # b's copy of the topology: the exchange and bindings, to stand-ins of a's queues.
        b_exchange = pair.b.vhost.declare_exchange("shop", "topic", durable=True)
        for name, key in (("orders", "order.*"), ("audit", "#")):
            pair.b.vhost.bind(b_exchange, pair.stand_in(name), key, {})

        on_b = await channel_on(pair.b.url)
        b_shop = await on_b.get_exchange("shop")
        for number in range(50):
            confirmation = await b_shop.publish(
                aio_pika.Message(f"order {number}".encode(), delivery_mode=PERSISTENT), "order.created")
            assert isinstance(confirmation, commands.Basic.Ack)
        # Confirmed on b means stored on a, in both queues, once each.
        assert pair.a.vhost.queues["orders"].message_count == 50
        assert pair.a.vhost.queues["audit"].message_count == 50
        message = await (await on_a.get_queue("orders")).get(no_ack=True)
        assert (message.body, message.exchange, message.routing_key) == (b"order 0", "shop", "order.created")
        assert message.delivery_mode == PERSISTENT

    run(tmp_path, scenario)


def test_the_owner_refusing_a_message_nacks_the_publish_on_b(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
        await on_a.declare_queue("small", durable=True, arguments=arguments)
        pair.stand_in("small", arguments=arguments)
        on_b = await channel_on(pair.b.url)
        await on_b.default_exchange.publish(aio_pika.Message(b"fits"), "small")
        with pytest.raises(aiormq.exceptions.DeliveryError):
            await on_b.default_exchange.publish(aio_pika.Message(b"does not fit"), "small")
        assert pair.a.vhost.queues["small"].message_count == 1

    run(tmp_path, scenario)


def test_a_publish_forwarded_to_a_queue_the_owner_does_not_hold_is_nacked_not_lost(tmp_path):
    """The owner restarting has not taken its queue back yet (or deleted it a moment ago): the
    message cannot go in, so the publisher hears a nack instead of a confirm."""
    async def scenario(pair: Pair) -> None:
        pair.stand_in("not-taken-back-yet")
        on_b = await channel_on(pair.b.url)
        with pytest.raises(aiormq.exceptions.DeliveryError):
            await on_b.default_exchange.publish(aio_pika.Message(b"keep me", delivery_mode=PERSISTENT),
                                                "not-taken-back-yet")

    run(tmp_path, scenario)


def test_publishes_after_an_old_forward_to_go_where_its_names_stand_now_never_nowhere(tmp_path):
    """The owner's link channel keeps the queues a forward-to named (b sends it again only when
    they change). When one of them goes (deleted; or a replicated queue handed over to a new
    leader, replaced here by a stand-in) the names are looked up again: the next publish goes
    into the queue the name stands for now, or is refused (nack) when there is none here; it is
    never confirmed into the queue object that went (before the fix: confirmed and lost, as the
    fault run found after a partition held publishes across a leader change)."""
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("moving", durable=True)
        pair.stand_in("moving")
        on_b = await channel_on(pair.b.url)
        publish = on_b.default_exchange.publish
        assert isinstance(await publish(aio_pika.Message(b"first", delivery_mode=PERSISTENT), "moving"),
                          commands.Basic.Ack)
        await on_a.queue_delete("moving")
        await on_a.declare_queue("moving", durable=True)  # a new queue object under the old name
        assert isinstance(await publish(aio_pika.Message(b"second", delivery_mode=PERSISTENT), "moving"),
                          commands.Basic.Ack)
        assert pair.a.vhost.queues["moving"].message_count == 1  # it went into the queue there now
        await on_a.queue_delete("moving")
        with pytest.raises(aiormq.exceptions.DeliveryError):  # nothing of that name here: refused
            await publish(aio_pika.Message(b"third", delivery_mode=PERSISTENT), "moving")

    run(tmp_path, scenario)


def test_a_publish_to_a_queue_whose_owner_is_down_is_nacked_and_consuming_it_is_refused(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("jobs", durable=True)
        pair.stand_in("jobs")
        pair.owner_down()
        on_b = await channel_on(pair.b.url)
        with pytest.raises(aiormq.exceptions.DeliveryError):
            await on_b.default_exchange.publish(aio_pika.Message(b"lost?"), "jobs")
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as refused:
            await on_b.declare_queue("jobs", passive=True)
        assert refused.value.args[0] == (
            "NOT_FOUND - home node 'a' of durable queue 'jobs' in vhost '/' is down or inaccessible")
        on_b = await channel_on(pair.b.url)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await (await on_b.get_queue("jobs", ensure=False)).consume(lambda message: None)

    run(tmp_path, scenario)


# -- consuming on b from a's queues ----------------------------------------------------------


def test_a_consumer_on_b_keeps_its_prefetch_and_its_acks_reach_the_owner(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("work", durable=True)
        for number in range(5):
            await on_a.default_exchange.publish(aio_pika.Message(str(number).encode(), delivery_mode=PERSISTENT), "work")
        pair.stand_in("work")
        on_b = await channel_on(pair.b.url, confirms=False)
        await on_b.set_qos(prefetch_count=2)
        received: asyncio.Queue = asyncio.Queue()
        queue = await on_b.get_queue("work", ensure=False)
        await queue.consume(received.put_nowait)
        first = await next_message(queue, received)
        second = await next_message(queue, received)
        assert (first.body, second.body) == (b"0", b"1")
        assert (first.delivery_tag, second.delivery_tag) == (1, 2)
        await asyncio.sleep(0.2)
        assert received.empty()  # prefetch 2: nothing more until an ack
        await first.ack()
        third = await next_message(queue, received)
        assert third.body == b"2"
        await second.ack()
        await third.ack()
        rest = [await next_message(queue, received) for _ in range(2)]
        for message in rest:
            await message.ack()
        await asyncio.sleep(0.2)
        owned = pair.a.vhost.queues["work"]
        assert (owned.message_count, owned.unacked_count) == (0, 0)

    run(tmp_path, scenario)


def test_a_new_prefetch_reaches_the_owner_for_a_running_consumer(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("celery", durable=True)
        for number in range(3):
            await on_a.default_exchange.publish(aio_pika.Message(str(number).encode()), "celery")
        pair.stand_in("celery")
        on_b = await channel_on(pair.b.url, confirms=False)
        await on_b.set_qos(prefetch_count=1)
        received: asyncio.Queue = asyncio.Queue()
        queue = await on_b.get_queue("celery", ensure=False)
        await queue.consume(received.put_nowait)
        assert (await next_message(queue, received)).body == b"0"
        await asyncio.sleep(0.2)
        assert received.empty()
        await on_b.set_qos(prefetch_count=3)  # Celery raises it while consuming; nothing acked
        assert [(await next_message(queue, received)).body for _ in range(2)] == [b"1", b"2"]

    run(tmp_path, scenario)


def test_a_policy_acts_on_the_owners_queue_only(tmp_path):
    """A policy that counts deliveries (delivery-limit) is the owner's to apply: the consumer on
    b sees the owner's x-delivery-count, not a second count of b's own."""
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("retried", durable=True)
        await on_a.default_exchange.publish(aio_pika.Message(b"again"), "retried")
        pair.stand_in("retried")
        for node in (pair.a, pair.b):  # shared definitions give every node the policy
            node.vhost.set_policy(parse_policy("/", "limit", {
                "pattern": "^retried$", "definition": {"delivery-limit": 5}, "priority": 0, "apply-to": "queues"}))
        on_b = await channel_on(pair.b.url, confirms=False)
        received: asyncio.Queue = asyncio.Queue()
        queue = await on_b.get_queue("retried", ensure=False)
        await queue.consume(received.put_nowait)
        counts = []
        for _ in range(3):
            message = await next_message(queue, received)
            counts.append((message.headers or {}).get("x-delivery-count"))
            await message.reject(requeue=True)
        assert counts == [None, 1, 2]

    run(tmp_path, scenario)


def test_reject_with_requeue_on_b_redelivers_and_without_dead_letters_on_the_owner(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("dead", durable=True)
        arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
        await on_a.declare_queue("tasks", durable=True, arguments=arguments)
        await on_a.default_exchange.publish(aio_pika.Message(b"task"), "tasks")
        pair.stand_in("tasks", arguments=arguments)
        on_b = await channel_on(pair.b.url, confirms=False)
        received: asyncio.Queue = asyncio.Queue()
        queue = await on_b.get_queue("tasks", ensure=False)
        await queue.consume(received.put_nowait)
        first = await next_message(queue, received)
        assert not first.redelivered
        await first.reject(requeue=True)
        again = await next_message(queue, received)
        assert (again.body, again.redelivered) == (b"task", True)
        await again.nack(requeue=False)
        dead = await get_within(await on_a.get_queue("dead"))
        assert dead.body == b"task"
        assert dead.headers["x-death"][0]["reason"] == "rejected"

    run(tmp_path, scenario)


def test_a_consumer_on_b_is_told_when_the_owner_deletes_its_queue(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("temporary", durable=True)
        pair.stand_in("temporary")
        on_b = await channel_on(pair.b.url, confirms=False)
        queue = await on_b.get_queue("temporary", ensure=False)
        await queue.consume(lambda message: None)
        underlay = await on_b.get_underlay_channel()
        cancelled: asyncio.Future = asyncio.get_running_loop().create_future()
        underlay.on_consumer_cancel_callbacks.add(
            lambda frame: cancelled.done() or cancelled.set_result(frame.consumer_tag))
        await on_a.queue_delete("temporary")
        tag = await asyncio.wait_for(cancelled, 5)
        assert tag not in underlay.consumers
        assert not on_b.is_closed

    run(tmp_path, scenario)


def test_an_exclusive_consumer_elsewhere_refuses_a_consumer_on_b_with_the_owners_error(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        queue_a = await on_a.declare_queue("mine", durable=True)
        await queue_a.consume(lambda message: None, exclusive=True)
        pair.stand_in("mine")
        on_b = await channel_on(pair.b.url, confirms=False)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as refused:
            await (await on_b.get_queue("mine", ensure=False)).consume(lambda message: None)
        assert refused.value.args[0] == "ACCESS_REFUSED - queue 'mine' in vhost '/' in exclusive use"

    run(tmp_path, scenario)


def test_consumer_priorities_hold_across_nodes(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url, confirms=False)
        await on_a.declare_queue("ranked", durable=True)
        pair.stand_in("ranked")
        low: asyncio.Queue = asyncio.Queue()
        await (await on_a.get_queue("ranked")).consume(low.put_nowait, arguments={"x-priority": 1})
        on_b = await channel_on(pair.b.url, confirms=False)
        high: asyncio.Queue = asyncio.Queue()
        await (await on_b.get_queue("ranked", ensure=False)).consume(high.put_nowait, arguments={"x-priority": 5})
        publisher = await channel_on(pair.a.url)
        for number in range(10):
            await publisher.default_exchange.publish(aio_pika.Message(str(number).encode()), "ranked")
        bodies = [(await asyncio.wait_for(high.get(), 10)).body for _ in range(10)]
        assert bodies == [str(number).encode() for number in range(10)]
        assert low.empty()

    run(tmp_path, scenario)


def test_a_transaction_touching_queues_of_two_nodes_is_refused_and_nothing_is_applied(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("remote-part", durable=True)
        pair.stand_in("remote-part")
        connection = await opened(pair.b.url)
        on_b = await connection.channel(publisher_confirms=False)
        await on_b.declare_queue("local-part", durable=True)
        transaction = on_b.transaction()
        await transaction.select()
        await on_b.default_exchange.publish(aio_pika.Message(b"here"), "local-part")
        await on_b.default_exchange.publish(aio_pika.Message(b"there"), "remote-part")
        with pytest.raises(aiormq.exceptions.ConnectionNotImplemented) as refused:
            await transaction.commit()
        assert "more than one cluster node" in refused.value.args[0]
        await asyncio.sleep(0.1)
        assert pair.b.vhost.queues["local-part"].message_count == 0
        assert pair.a.vhost.queues["remote-part"].message_count == 0

        # All of a transaction's queues on one other node: it commits, and commit-ok waits for it.
        on_b = await channel_on(pair.b.url, confirms=False)
        transaction = on_b.transaction()
        await transaction.select()
        await on_b.default_exchange.publish(aio_pika.Message(b"there", delivery_mode=PERSISTENT), "remote-part")
        await transaction.commit()
        assert pair.a.vhost.queues["remote-part"].message_count == 1

    run(tmp_path, scenario)


def test_single_active_consumer_holds_across_nodes(tmp_path):
    async def scenario(pair: Pair) -> None:
        arguments = {"x-single-active-consumer": True}
        on_a = await channel_on(pair.a.url, confirms=False)
        await on_a.declare_queue("one-at-a-time", durable=True, arguments=arguments)
        pair.stand_in("one-at-a-time", arguments=arguments)
        on_b = await channel_on(pair.b.url, confirms=False)
        first: asyncio.Queue = asyncio.Queue()
        first_tag = await (await on_b.get_queue("one-at-a-time", ensure=False)).consume(first.put_nowait)
        second: asyncio.Queue = asyncio.Queue()
        await (await on_a.get_queue("one-at-a-time")).consume(second.put_nowait)
        for number in range(5):
            await on_a.default_exchange.publish(aio_pika.Message(str(number).encode()), "one-at-a-time")
        bodies = [(await asyncio.wait_for(first.get(), 5)).body for _ in range(5)]
        assert bodies == [str(number).encode() for number in range(5)]
        assert second.empty()  # the consumer on b, first in, is the active one
        # It goes (cancelled on b): the one on a takes over, with what b left unacked.
        await (await on_b.get_queue("one-at-a-time", ensure=False)).cancel(first_tag)
        await on_b.close()
        redelivered = [await asyncio.wait_for(second.get(), 5) for _ in range(5)]
        assert [message.body for message in redelivered] == bodies
        assert all(message.redelivered for message in redelivered)

    run(tmp_path, scenario)


# -- basic.get and purge on b ----------------------------------------------------------------


def test_basic_get_and_declare_ok_on_b_come_from_the_owner(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("inbox", durable=True)
        for body in (b"one", b"two", b"three"):
            await on_a.default_exchange.publish(aio_pika.Message(body, delivery_mode=PERSISTENT), "inbox")
        pair.stand_in("inbox")
        on_b = await channel_on(pair.b.url, confirms=False)
        declared = await on_b.declare_queue("inbox", passive=True)
        assert declared.declaration_result.message_count == 3  # the owner's count
        inbox = await on_b.get_queue("inbox", ensure=False)
        first = await inbox.get(no_ack=False)
        assert (first.body, first.delivery_tag, first.message_count) == (b"one", 1, 2)
        await first.reject(requeue=True)
        again = await inbox.get(no_ack=True)
        assert (again.body, again.redelivered) == (b"one", True)
        second = await inbox.get(no_ack=False)
        await second.ack()
        assert await inbox.purge() is not None
        assert await inbox.get(fail=False) is None
        await asyncio.sleep(0.1)
        owned = pair.a.vhost.queues["inbox"]
        assert (owned.message_count, owned.unacked_count) == (0, 0)

    run(tmp_path, scenario)


def test_direct_reply_to_reaches_a_requester_on_another_node(tmp_path):
    async def scenario(pair: Pair) -> None:
        server = await channel_on(pair.a.url, confirms=False)
        requests = await server.declare_queue("rpc", durable=True)
        pair.stand_in("rpc")
        client = await channel_on(pair.b.url, confirms=False)
        replies: asyncio.Queue = asyncio.Queue()
        reply_queue = await client.get_queue("amq.rabbitmq.reply-to", ensure=False)
        await reply_queue.consume(replies.put_nowait, no_ack=True)
        await client.default_exchange.publish(
            aio_pika.Message(b"ping", reply_to="amq.rabbitmq.reply-to", correlation_id="1"), "rpc")
        request = await get_within(requests)
        assert request.reply_to.startswith("amq.rabbitmq.reply-to.")
        await server.default_exchange.publish(aio_pika.Message(b"pong", correlation_id="1"), request.reply_to)
        reply = await asyncio.wait_for(replies.get(), 5)
        assert (reply.body, reply.correlation_id) == (b"pong", "1")

    run(tmp_path, scenario)


def test_queue_delete_on_b_checks_if_empty_and_if_unused_against_the_owner(tmp_path):
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        await on_a.declare_queue("full", durable=True)
        for body in (b"1", b"2"):
            await on_a.default_exchange.publish(aio_pika.Message(body), "full")
        pair.stand_in("full")
        on_b = await channel_on(pair.b.url, confirms=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as refused:
            await on_b.queue_delete("full", if_empty=True)
        assert refused.value.args[0] == "PRECONDITION_FAILED - queue 'full' in vhost '/' not empty"
        assert "full" in pair.b.vhost.queues
        on_b = await channel_on(pair.b.url, confirms=False)
        deleted = await on_b.queue_delete("full")
        assert deleted.message_count == 2  # the owner's count

    run(tmp_path, scenario)


# -- the link itself ---------------------------------------------------------------------------


def test_forward_to_from_a_client_is_an_unknown_method(tmp_path):
    async def scenario(pair: Pair) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", pair.a.server.port)
        writer.write(codec.PROTOCOL_HEADER)
        frames = [
            commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0guest"),
            commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0),
            commands.Connection.Open(virtual_host="/"),
        ]
        writer.write(b"".join(codec.method_frame(0, frame) for frame in frames))
        writer.write(codec.method_frame(1, commands.Channel.Open()) + forward_to_frame(1, ("anything",)))
        data = b""
        while b"unknown method" not in data:
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            assert chunk, data
            data += chunk
        assert b"COMMAND_INVALID - unknown method" in data
        writer.close()

    run(tmp_path, scenario)


def test_the_link_login_needs_the_cluster_secret(tmp_path):
    async def scenario(pair: Pair) -> None:
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(
                f"amqp://amqp-server-cluster-link:wrong-secret-0123456789@127.0.0.1:{pair.a.server.port}/")

    run(tmp_path, scenario)


async def _raw_confirm_channel(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client on channel 1 in confirm mode, written by hand so that several publishes can be
    sent in one write (and so reach the broker in one read, as one batch of input)."""
    from pamqp import frame as pamqp_frame, header as pamqp_header

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(pamqp_frame.marshal(pamqp_header.ProtocolHeader(), 0))

    async def expect(kind: type) -> Any:
        while True:
            head = await reader.readexactly(7)
            size = int.from_bytes(head[3:7], "big")
            _, _, value = pamqp_frame.unmarshal(head + await reader.readexactly(size + 1))
            if isinstance(value, kind):
                return value

    await expect(commands.Connection.Start)
    writer.write(pamqp_frame.marshal(commands.Connection.StartOk(
        mechanism="PLAIN", response="\0guest\0guest", client_properties={}), 0))
    tune = await expect(commands.Connection.Tune)
    writer.write(pamqp_frame.marshal(commands.Connection.TuneOk(
        channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0), 0))
    writer.write(pamqp_frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    await expect(commands.Connection.OpenOk)
    writer.write(pamqp_frame.marshal(commands.Channel.Open(), 1))
    await expect(commands.Channel.OpenOk)
    writer.write(pamqp_frame.marshal(commands.Confirm.Select(), 1))
    await expect(commands.Confirm.SelectOk)
    reader.expect = expect  # type: ignore[attr-defined]
    return reader, writer


def test_a_nack_from_the_owner_reaches_its_publisher_when_later_publishes_of_the_batch_are_acked(tmp_path):
    """Three publishes in one read to a queue of node a: the owner refuses the second (its
    x-max-length-bytes with reject-publish) and takes the third. The publisher must get a
    nack for 2 and acks for 1 and 3, never one ack covering all three."""
    async def scenario(pair: Pair) -> None:
        on_a = await channel_on(pair.a.url)
        arguments = {"x-max-length-bytes": 100, "x-overflow": "reject-publish"}
        await on_a.declare_queue("bytes-capped", durable=True, arguments=arguments)
        pair.stand_in("bytes-capped", arguments=arguments)
        reader, writer = await _raw_confirm_channel(pair.b.server.port)
        persistent = commands.Basic.Properties(delivery_mode=2)
        # 50 fits, 150 would not, 60 fits
        writer.write(b"".join(publish_frames(1, body, routing_key="bytes-capped", properties=persistent)
                              for body in (b"a" * 50, b"b" * 100, b"c" * 10)))
        outcome: dict[int, bool] = {}
        while len(outcome) < 3:
            confirm = await reader.expect((commands.Basic.Ack, commands.Basic.Nack))  # type: ignore[attr-defined]
            tags = [tag for tag in (1, 2, 3) if tag not in outcome and
                    (tag == confirm.delivery_tag or (confirm.multiple and tag < confirm.delivery_tag))]
            for tag in tags:
                outcome[tag] = isinstance(confirm, commands.Basic.Ack)
        writer.close()
        assert outcome == {1: True, 2: False, 3: True}
        assert pair.a.vhost.queues["bytes-capped"].message_count == 2

    run(tmp_path, scenario)
