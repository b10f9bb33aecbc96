"""Priorities, single active consumer, consumer timeout, delayed exchange and deduplication with aio-pika."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest
from pamqp.commands import Basic

from interop_tests.aio_pika_helpers import connect
from interop_tests.waiting import wait_until_async

WAIT_S = 8.0


@pytest.fixture
def own(broker):
    if broker.is_external:
        pytest.skip("uses this broker's lifecycle extensions")
    return broker


async def drain(queue: aio_pika.abc.AbstractQueue, count: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            if time.monotonic() > deadline:
                pytest.fail(f"only {len(got)} of {count} messages arrived")
            await asyncio.sleep(0.02)
            continue
        got.append(message)
    return got


def test_a_priority_queue_delivers_higher_priority_first(broker, unique):
    async def scenario() -> list[bytes]:
        connection = await connect(broker)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(unique("prio"), auto_delete=True, arguments={"x-max-priority": 10})
            for body, priority in ((b"low", 1), (b"none", None), (b"urgent", 9), (b"mid", 5), (b"urgent-2", 9)):
                await channel.default_exchange.publish(aio_pika.Message(body, priority=priority), routing_key=queue.name)
            return [m.body for m in await drain(queue, 5)]

    assert asyncio.run(scenario()) == [b"urgent", b"urgent-2", b"mid", b"low", b"none"]


def test_single_active_consumer_hands_over_when_the_active_one_leaves(own, unique):
    async def scenario() -> tuple[list[str], list[str]]:
        connection = await connect(own)
        async with connection:
            first_channel, second_channel = await connection.channel(), await connection.channel()
            name = unique("sac")
            first_q = await first_channel.declare_queue(name, auto_delete=True, arguments={"x-single-active-consumer": True})
            second_q = await second_channel.get_queue(name)
            got: list[str] = []
            done = asyncio.Event()

            def record(tag: str):
                async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    got.append(tag)
                    if tag == "first":
                        return  # keeps it unacked
                    await message.ack()
                    if len(got) >= 4:
                        done.set()
                return on_message

            await first_q.consume(record("first"))
            await second_q.consume(record("second"))
            for n in range(2):
                await first_channel.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key=name)
            await wait_until_async(lambda: len(got) >= 2, "two deliveries", WAIT_S, every=0.02)
            before = list(got)
            await first_channel.close()  # the active consumer goes: its unacked go to the next
            await asyncio.wait_for(done.wait(), WAIT_S)
            return before, got[2:]

    before, after = asyncio.run(scenario())
    assert before == ["first", "first"]
    assert after == ["second", "second"]


def test_a_consumer_timeout_cancels_that_consumer_only_and_requeues(own, unique):
    async def scenario():
        connection = await connect(own)
        async with connection:
            channel = await connection.channel()
            name = unique("timeout")
            queue = await channel.declare_queue(name, auto_delete=False, arguments={"x-consumer-timeout": 600})
            held: list[aio_pika.abc.AbstractIncomingMessage] = []

            async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                held.append(message)  # a task that takes too long: never acked in time

            await queue.consume(hold)
            await channel.default_exchange.publish(aio_pika.Message(b"long task"), routing_key=name)
            deadline = time.monotonic() + WAIT_S
            await wait_until_async(lambda: bool(held), "a delivery", WAIT_S, every=0.02)
            started = time.monotonic()
            # The server cancels the consumer; the message is ready again.
            while (await channel.declare_queue(name, passive=True)).declaration_result.message_count != 1:
                assert time.monotonic() < deadline, "the delivery never timed out"
                await asyncio.sleep(0.05)
            waited = time.monotonic() - started
            assert not channel.is_closed
            again = await queue.get(no_ack=False)
            await again.ack()
            await held[0].ack()  # the late ack of the timed-out delivery is harmless
            await channel.default_exchange.publish(aio_pika.Message(b"still usable"), routing_key=name)
            await queue.delete(if_unused=False, if_empty=False)
            return again.body, again.redelivered, waited, channel.is_closed

    body, redelivered, waited, closed = asyncio.run(scenario())
    assert (body, redelivered, closed) == (b"long task", True, False)
    assert 0.4 <= waited < 3.0


def test_a_delayed_exchange_routes_after_x_delay(own, unique):
    async def scenario():
        connection = await connect(own)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(
                unique("delayed"), "x-delayed-message", auto_delete=True, arguments={"x-delayed-type": "topic"}
            )
            queue = await channel.declare_queue(unique("delayed-q"), auto_delete=True)
            await queue.bind(exchange, "orders.#")
            await exchange.publish(aio_pika.Message(b"later", headers={"x-delay": 700}), routing_key="orders.new")
            await exchange.publish(aio_pika.Message(b"now"), routing_key="orders.new")
            sent = time.monotonic()
            first = await drain(queue, 1)
            second = await drain(queue, 1)
            return [m.body for m in first + second], time.monotonic() - sent, second[0].headers

    bodies, elapsed, headers = asyncio.run(scenario())
    assert bodies == [b"now", b"later"]
    assert 0.65 <= elapsed < 3.0
    assert headers == {"x-delay": -700}


def test_deduplication_confirms_a_repeat_but_enqueues_it_once(own, unique):
    async def scenario() -> int:
        connection = await connect(own)
        async with connection:
            channel = await connection.channel()  # aio-pika publishes with confirms
            queue = await channel.declare_queue(
                unique("dedup"), auto_delete=True,
                arguments={"x-message-deduplication": True, "x-cache-size": 100, "x-cache-ttl": 60_000},
            )
            for _ in range(3):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(b"charge card", message_id="payment-42"), routing_key=queue.name
                )
                assert isinstance(confirmation, Basic.Ack)
            declared = await channel.declare_queue(queue.name, passive=True)
            return declared.declaration_result.message_count

    assert asyncio.run(scenario()) == 1
