"""Flow control across a link: a queue of node a congested by what node b forwards into it.

The link from b to a carries both b's forwarded publishes and the acks of b's consumers of a's
queues. A congested queue must therefore not make a stop reading the link (the acks that would
drain it wait there, forever): a asks b to stop forwarding (channel.flow on the forward stream),
and b stops reading its own publishers until a's queue drained.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika

from queues.queue import FLOW_HIGH
from tests.cluster_pair import Pair, linked_pair

MESSAGES = 3 * FLOW_HIGH
HELD = 50  # deliveries the consumer on b keeps unacked while the backlog builds


def test_a_queue_congested_by_forwarded_publishes_drains_through_its_consumers_on_the_same_link(
        tmp_path: Path) -> None:
    async def scenario(pair: Pair) -> None:
        owner = await aio_pika.connect(pair.a.url)
        consumer_connection = await aio_pika.connect(pair.b.url)
        publisher_connection = await aio_pika.connect(pair.b.url)
        try:
            await (await owner.channel()).declare_queue("hot")
            pair.stand_in("hot", durable=False)
            received: list[bytes] = []
            held: list[aio_pika.abc.AbstractIncomingMessage] = []
            backlog_built = asyncio.Event()
            all_in = asyncio.Event()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                received.append(message.body)
                if not backlog_built.is_set():
                    held.append(message)  # acked later, once a holds a backlog past FLOW_HIGH
                else:
                    await message.ack()
                if len(received) == MESSAGES:
                    all_in.set()

            consuming = await consumer_connection.channel()
            await consuming.set_qos(prefetch_count=HELD)
            await (await consuming.get_queue("hot", ensure=False)).consume(on_message)
            publishing = await publisher_connection.channel(publisher_confirms=False)
            for number in range(MESSAGES):
                await publishing.default_exchange.publish(aio_pika.Message(str(number).encode()), "hot")
            # a congested: more than FLOW_HIGH ready behind the consumer's unacked deliveries.
            queue = pair.a.vhost.queues["hot"]
            while len(queue.ready) <= FLOW_HIGH:
                await asyncio.sleep(0.01)
            backlog_built.set()
            for message in held:
                await message.ack()
            await asyncio.wait_for(all_in.wait(), 20)
            assert received == [str(number).encode() for number in range(MESSAGES)]
        finally:
            for connection in (publisher_connection, consumer_connection, owner):
                await connection.close()

    async def main() -> None:
        async with linked_pair(tmp_path) as pair:
            await asyncio.wait_for(scenario(pair), 40)

    asyncio.run(main())
