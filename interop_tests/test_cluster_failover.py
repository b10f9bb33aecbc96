"""Client failover: pika with a list of connection parameters and kombu with `amqp://b;amqp://c`
URLs go on with a surviving node after `kill -9` of theirs, with the same queues; the killed
node's queues are unavailable (RabbitMQ's 404) until it returns with their persistent messages,
reachable from every node. Prints the confirmed messages lost (0 for queues of surviving nodes).
"""

from __future__ import annotations

import signal
import time

import kombu
import pika
import pytest
from pika.exceptions import AMQPConnectionError, AMQPError as PikaError

from interop_tests.cluster_nodes import (
    SESSION_TTL, drain, pika_parameters, queue_known_everywhere, three_nodes,
)
from interop_tests.waiting import wait_until

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
def test_pika_and_kombu_fail_over_and_the_killed_nodes_queues_come_back(tmp_path, backend):
    with three_nodes(tmp_path, backend) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        setup = pika.BlockingConnection(pika_parameters(a))
        setup.channel().queue_declare("survivor-pika", durable=True)
        setup.channel().queue_declare("survivor-kombu", durable=True)
        setup.close()
        on_b = pika.BlockingConnection(pika_parameters(b))
        victim = on_b.channel()
        victim.queue_declare("victim", durable=True)  # owned by b
        victim.confirm_delivery()
        for number in range(10):
            victim.basic_publish("", "victim", f"kept {number}".encode(), PERSISTENT)
        on_b.close()
        for name in ("survivor-pika", "survivor-kombu", "victim"):
            queue_known_everywhere(nodes, name)

        # pika: the host list starts with b, the node about to die.
        hosts = [pika_parameters(b), pika_parameters(c), pika_parameters(a)]
        connection = pika.BlockingConnection(hosts)
        channel = connection.channel()
        channel.confirm_delivery()
        # kombu: failover URLs, b first.
        kombu_connection = kombu.Connection(f"{b.url()};{c.url()}", failover_strategy="round-robin",
                                            transport_options={"confirm_publish": True})
        producer = kombu_connection.Producer()
        publish = kombu_connection.ensure(producer, producer.publish, max_retries=10, interval_start=0.2)
        # And a client of a publishing to b's queue (forwarded to b, confirmed once b has it on
        # disk) until b's death stops it: what b confirmed must be back when b returns.
        to_victim_connection = pika.BlockingConnection(pika_parameters(a))
        to_victim = to_victim_connection.channel()
        to_victim.confirm_delivery()

        confirmed_pika: list[bytes] = []
        confirmed_kombu: list[bytes] = []
        confirmed_victim: list[bytes] = []
        reconnected_to = None
        for number in range(200):
            if number == 100:
                b.broker.kill()  # kill -9
            if to_victim is not None:
                try:
                    to_victim.basic_publish("", "victim", f"v{number}".encode(), PERSISTENT)
                    confirmed_victim.append(f"v{number}".encode())
                except (pika.exceptions.NackError, pika.exceptions.ChannelClosedByBroker):
                    assert number >= 100, f"a's publish {number} to b's queue refused while b was alive"
                    to_victim = None  # b is gone: nacked, or refused with 404 once its session expired
            while True:
                try:
                    channel.basic_publish("", "survivor-pika", f"p{number}".encode(), PERSISTENT)
                    confirmed_pika.append(f"p{number}".encode())
                    break
                except (PikaError, OSError):
                    # The node died: connect again, through the same list.
                    connection = pika.BlockingConnection(hosts)
                    reconnected_to = connection._impl.params.port
                    channel = connection.channel()
                    channel.confirm_delivery()
            publish(f"k{number}", routing_key="survivor-kombu", delivery_mode=2)
            confirmed_kombu.append(f"k{number}".encode())
        assert reconnected_to in (c.port, a.port)
        assert kombu_connection.port == c.port  # the next URL of its list
        connection.close()
        kombu_connection.release()
        to_victim_connection.close()

        # A message published again after a failure may be there twice: count what is missing.
        pika_kept = set(drain(c, "survivor-pika"))
        kombu_kept = set(drain(a, "survivor-kombu"))
        lost_pika = len([body for body in confirmed_pika if body not in pika_kept])
        lost_kombu = len([body for body in confirmed_kombu if body not in kombu_kept])
        print(f"confirmed messages lost on queues of surviving nodes: pika {lost_pika} of {len(confirmed_pika)}, "
              f"kombu {lost_kombu} of {len(confirmed_kombu)}")
        assert (lost_pika, lost_kombu) == (0, 0)

        # b's queue is unavailable once b's session expired, with RabbitMQ's error ...
        def victim_refused_on_c() -> bool:
            probe = pika.BlockingConnection(pika_parameters(c))
            try:
                probe.channel().queue_declare("victim", passive=True)
                return False
            except pika.exceptions.ChannelClosedByBroker as refused:
                assert refused.reply_code == 404
                assert refused.reply_text == (
                    "NOT_FOUND - home node 'b' of durable queue 'victim' in vhost '/' is down or inaccessible")
                return True
            finally:
                if probe.is_open:
                    probe.close()

        failed_over = time.monotonic()
        wait_until(victim_refused_on_c, "c refuses b's queue", within=SESSION_TTL + 5)
        print(f"c refused b's queue {time.monotonic() - failed_over:.1f} s after the failover")

        # ... and back, with its persistent messages, reachable from every node, once b returns.
        b.broker.start()
        wait_until(lambda: a.live_nodes() == ["a", "b", "c"], "b is back in membership")

        def victim_reachable_from_c() -> bool:
            connection = pika.BlockingConnection(pika_parameters(c))
            try:
                return connection.channel().queue_declare("victim", passive=True) is not None
            except PikaError:
                return False
            finally:
                if connection.is_open:
                    connection.close()

        wait_until(victim_reachable_from_c, "victim is reachable from c again", within=20)
        expected = [f"kept {n}".encode() for n in range(10)] + confirmed_victim
        for node in (a, b, c):  # every node reaches it and counts b's messages
            with pika.BlockingConnection(pika_parameters(node)) as connection:
                declared = connection.channel().queue_declare("victim", passive=True)
            assert declared.method.message_count >= len(expected), (node.name, declared.method.message_count)
        peek = pika.BlockingConnection(pika_parameters(a))
        peeking = peek.channel()
        method, _properties, body = peeking.basic_get("victim")
        assert body == b"kept 0"
        peeking.basic_nack(method.delivery_tag, requeue=True)
        peek.close()
        kept = set(drain(c, "victim"))
        lost_victim = len([body for body in expected if body not in kept])
        print(f"confirmed messages lost on the killed node's queue after its return: {lost_victim} of {len(expected)} "
              f"({len(confirmed_victim)} of them published through a until b died)")
        assert lost_victim == 0


@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
def test_a_hung_node_is_given_up_on_once_its_session_expires(tmp_path, backend):
    """A node that stops answering without closing its sockets (SIGSTOP: a hung process, a
    machine cut off) is dropped from membership when its session expires; the other nodes then
    nack what they forwarded to it and cancel their consumers of its queues, instead of waiting
    for it forever."""
    with three_nodes(tmp_path, backend) as nodes:
        a, b = nodes["a"], nodes["b"]
        setup = pika.BlockingConnection(pika_parameters(b))
        setup.channel().queue_declare("on-hung-node", durable=True)  # owned by b
        setup.close()
        queue_known_everywhere(nodes, "on-hung-node")
        on_a = pika.BlockingConnection(pika_parameters(a))
        publishing = on_a.channel()
        publishing.confirm_delivery()
        publishing.basic_publish("", "on-hung-node", b"before", PERSISTENT)  # confirmed by b
        consuming = on_a.channel()
        cancelled = []
        consuming.add_on_cancel_callback(cancelled.append)
        consuming.basic_consume("on-hung-node", lambda *delivery: None)
        on_a.process_data_events(0.5)

        b.broker.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(pika.exceptions.NackError):
                publishing.basic_publish("", "on-hung-node", b"during", PERSISTENT)
            took = time.monotonic() - started
            print(f"the publish to the hung node's queue was nacked after {took:.1f} s")
            assert took < SESSION_TTL + 5
            wait_until(lambda: on_a.process_data_events(0.1) or bool(cancelled),
                       "the consumer of the hung node's queue is cancelled")
        finally:
            b.broker.process.send_signal(signal.SIGCONT)
        on_a.close()
