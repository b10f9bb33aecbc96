"""Any queue from any node, with real clients against three broker nodes on etcd and on
ZooKeeper (the same suite on both backends): declare on
node a, publish on node b, consume on node c. Confirms, returns, prefetch, ack/nack/reject and
requeue work across nodes (docs/cluster.md, "Any queue from any node")."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import kombu
import pika
import pytest

from interop_tests.cluster_nodes import (
    binding_known_everywhere,
    exchange_known_everywhere,
    queue_known_everywhere,
    three_nodes,
)
from interop_tests.node_runner import run_scenario
from interop_tests.waiting import wait_until


@pytest.fixture(params=["etcd", "zookeeper"])
def nodes(request, tmp_path):
    with three_nodes(tmp_path, request.param) as started:
        yield started


def test_pika_declare_on_a_publish_on_b_consume_on_c(nodes):
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    on_a = pika.BlockingConnection(pika.URLParameters(a.url()))
    declaring = on_a.channel()
    declaring.exchange_declare("pika-orders", "direct", durable=True)
    declaring.queue_declare("pika-any-node", durable=True)
    declaring.queue_bind("pika-any-node", "pika-orders", "new")
    queue_known_everywhere(nodes, "pika-any-node")
    binding_known_everywhere(nodes, "pika-orders", "pika-any-node")  # b routes the publishes

    on_b = pika.BlockingConnection(pika.URLParameters(b.url()))
    publishing = on_b.channel()
    publishing.confirm_delivery()
    for number in range(30):
        # Raises if nacked or returned: confirmed means the owner, a, has it.
        publishing.basic_publish("pika-orders", "new", str(number).encode(),
                                 pika.BasicProperties(delivery_mode=2), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        publishing.basic_publish("pika-orders", "no-such-key", b"lost", mandatory=True)

    on_c = pika.BlockingConnection(pika.URLParameters(c.url()))
    consuming = on_c.channel()
    consuming.basic_qos(prefetch_count=4)
    got = []
    for method, properties, body in consuming.consume("pika-any-node", inactivity_timeout=10):
        assert method is not None, f"only {len(got)} messages came"
        got.append((body, method.redelivered, method.delivery_tag))
        if body == b"3" and not method.redelivered:
            consuming.basic_nack(method.delivery_tag, requeue=True)
        elif body == b"7" and not method.redelivered:
            consuming.basic_reject(method.delivery_tag, requeue=True)
        else:
            consuming.basic_ack(method.delivery_tag)
        if len(got) == 32:
            break
    consuming.cancel()
    bodies = [body for body, _redelivered, _tag in got]
    assert sorted(set(bodies), key=int) == [str(n).encode() for n in range(30)]
    for requeued in (b"3", b"7"):  # nacked and rejected with requeue: back, flagged redelivered
        assert [redelivered for body, redelivered, _tag in got if body == requeued] == [False, True]
    assert [tag for _body, _redelivered, tag in got] == list(range(1, 33))  # c's own tags
    assert declaring.queue_declare("pika-any-node", passive=True).method.message_count == 0
    for connection in (on_a, on_b, on_c):
        connection.close()


def test_pika_reject_on_b_dead_letters_from_a_to_a_queue_of_c_and_alternate_exchanges_route_on_b(nodes):
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    on_c = pika.BlockingConnection(pika.URLParameters(c.url()))
    on_c.channel().queue_declare("dead-on-c", durable=True)  # owned by c
    on_a = pika.BlockingConnection(pika.URLParameters(a.url()))
    declaring = on_a.channel()
    declaring.queue_declare("work-on-a", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead-on-c"})
    declaring.exchange_declare("unrouted-on-a", "fanout", durable=True)
    declaring.queue_declare("caught-on-a", durable=True)
    declaring.queue_bind("caught-on-a", "unrouted-on-a")
    declaring.exchange_declare("with-alternate", "direct", durable=True,
                               arguments={"alternate-exchange": "unrouted-on-a"})
    for name in ("dead-on-c", "work-on-a", "caught-on-a"):
        queue_known_everywhere(nodes, name)
    binding_known_everywhere(nodes, "unrouted-on-a", "caught-on-a")  # b routes through them
    exchange_known_everywhere(nodes, "with-alternate")

    on_b = pika.BlockingConnection(pika.URLParameters(b.url()))
    channel = on_b.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "work-on-a", b"doomed", pika.BasicProperties(delivery_mode=2))
    # No binding matches: the alternate exchange, routed on b, takes it to a's queue.
    channel.basic_publish("with-alternate", "nowhere", b"caught", pika.BasicProperties(delivery_mode=2),
                          mandatory=True)
    method, _properties, body = channel.basic_get("work-on-a")
    assert body == b"doomed"
    channel.basic_reject(method.delivery_tag, requeue=False)  # a dead-letters it to c's queue

    def dead_lettered_on_c() -> bool:
        got = on_c.channel().basic_get("dead-on-c", auto_ack=True)
        if got[0] is None:
            return False
        assert got[2] == b"doomed" and got[1].headers["x-death"][0]["queue"] == "work-on-a"
        return True

    wait_until(dead_lettered_on_c, "the rejected message reaches dead-on-c")
    assert declaring.basic_get("caught-on-a", auto_ack=True)[2] == b"caught"
    for connection in (on_a, on_b, on_c):
        connection.close()


def test_kombu_declare_on_a_publish_on_b_consume_on_c(nodes):
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    exchange = kombu.Exchange("kombu-tasks", "direct", durable=True)
    queue = kombu.Queue("kombu-any-node", exchange, routing_key="task", durable=True)
    with kombu.Connection(a.url()) as on_a:
        queue(on_a.default_channel).declare()
    queue_known_everywhere(nodes, "kombu-any-node")
    binding_known_everywhere(nodes, "kombu-tasks", "kombu-any-node")  # b routes the publishes
    with kombu.Connection(b.url(), transport_options={"confirm_publish": True}) as on_b:
        producer = on_b.Producer()
        for number in range(20):
            producer.publish({"n": number}, exchange=exchange, routing_key="task", serializer="json",
                             delivery_mode=2)
    received = []
    with kombu.Connection(c.url()) as on_c:
        def take(body, message):
            received.append(body["n"])
            if body["n"] == 0 and not message.delivery_info["redelivered"]:
                message.requeue()
            else:
                message.ack()

        with on_c.Consumer(queue, callbacks=[take], prefetch_count=5):
            deadline = time.monotonic() + 15
            while len(received) < 21 and time.monotonic() < deadline:
                on_c.drain_events(timeout=5)
    assert sorted(received) == [0] + list(range(20))


def test_aio_pika_declare_on_a_publish_on_b_consume_on_c(nodes):
    a, b, c = nodes["a"], nodes["b"], nodes["c"]

    async def scenario() -> None:
        on_a = await aio_pika.connect(a.url())
        await (await on_a.channel()).declare_queue("aio-any-node", durable=True)
        await asyncio.get_running_loop().run_in_executor(None, queue_known_everywhere, nodes, "aio-any-node")
        on_b = await aio_pika.connect(b.url())
        publishing = await on_b.channel(publisher_confirms=True)
        for number in range(10):
            await publishing.default_exchange.publish(
                aio_pika.Message(str(number).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "aio-any-node")
        on_c = await aio_pika.connect(c.url())
        consuming = await on_c.channel()
        await consuming.set_qos(prefetch_count=2)
        queue = await consuming.get_queue("aio-any-node", ensure=False)
        bodies = []
        async with queue.iterator() as messages:
            async for message in messages:
                if message.body == b"0" and not message.redelivered:
                    await message.reject(requeue=True)
                    continue
                bodies.append((message.body, message.redelivered))
                await message.ack()
                if len(bodies) == 10:
                    break
        assert sorted(body for body, _ in bodies) == sorted(str(n).encode() for n in range(10))
        assert (b"0", True) in bodies
        for connection in (on_a, on_b, on_c):
            await connection.close()

    asyncio.run(scenario())


def test_amqplib_declare_on_a_publish_on_b_consume_on_c(nodes):
    urls = "|".join(nodes[name].url() for name in ("a", "b", "c"))
    report = run_scenario("cluster_three_nodes.js", urls, timeout=40)
    assert sorted(report["confirmed"]) == list(range(20))
    deliveries = report["deliveries"]
    assert sorted({d["body"] for d in deliveries}) == sorted(f"m{i}" for i in range(20))
    assert [d["redelivered"] for d in deliveries if d["body"] == "m5"] == [False, True]
    assert report["maxHeld"] <= 3  # prefetch 3 held across nodes
    assert report["remainingOnOwner"] == 0
