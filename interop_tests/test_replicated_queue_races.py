"""Replicated (quorum) queues at the edges of a leader change, on three broker nodes and etcd
started by the tests, with pika; the nodes run interop_tests/replication_hooks_broker.py, whose
hooks (files next to a node's data directory) force the interleavings:

- a consumer on a node whose re-attach to the new leader is refused for good (another client
  took the queue for its exclusive consumer while it waited) gets basic.cancel, keeps its
  channel and connection, and the messages it held reach the other consumer.
"""

from __future__ import annotations

import pika

from interop_tests.cluster_nodes import three_nodes
from interop_tests.replication_hooks_broker import HOLD_REATTACH
from interop_tests.test_replicated_queues import (
    _ctl, _declare, _HeldConsumer, _parameters, _publish_confirmed, _queue_node, _wait_until_each_holds_its_prefetch,
)
from interop_tests.waiting import wait_until

HOOKS = "interop_tests.replication_hooks_broker"


def test_a_consumer_whose_reattach_is_refused_is_cancelled_and_keeps_its_channel(tmp_path):
    """A consumer on b of a queue led by a, holding 5 deliveries; leadership moves to c while
    b's consumer waits (the hook holds its re-attach); a client on c consumes exclusively; then
    b's consumer tries again and c refuses it (403 in exclusive use). It gets basic.cancel
    within seconds (its parked retry runs every second; before the change it waited and
    retried for ever, so any bound catches that), its channel stays open, the old delivery
    tags can be acked, and the exclusive consumer gets every message."""
    with three_nodes(tmp_path, module=HOOKS) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "locked")
        waiting = _HeldConsumer(b, "locked")
        _publish_confirmed(a, "locked", 10)
        _wait_until_each_holds_its_prefetch([waiting])

        hold = tmp_path / "b" / HOLD_REATTACH
        hold.touch()
        code, text = _ctl(c, "transfer_leadership", "locked", "c")
        assert code == 0, text

        def moved() -> bool:
            waiting.pump()
            return _queue_node(a, "locked") == "c" and _queue_node(b, "locked") == "c"

        wait_until(moved, "c leads and holds the queue")
        exclusive = pika.BlockingConnection(_parameters(c))
        exclusive_channel = exclusive.channel()
        taken: list[bytes] = []
        exclusive_channel.basic_consume("locked", lambda ch, method, _p, body: (
            taken.append(body), ch.basic_ack(method.delivery_tag)), exclusive=True)
        assert not waiting.cancelled

        hold.unlink()  # b's waiting consumer tries again: c refuses it for good
        wait_until(lambda: waiting.pump() or waiting.cancelled, "basic.cancel reaches b's consumer",
                   within=20)  # generous: a loaded 2-core machine; the broken build never sends it
        assert waiting.channel.is_open and waiting.connection.is_open
        waiting.ack_all()  # the tags a delivered stay valid on the client's channel
        waiting.channel.queue_declare("after", exclusive=True)
        waiting.channel.basic_publish("", "after", b"still usable")
        method, _properties, body = waiting.channel.basic_get("after", auto_ack=True)
        assert method is not None and body == b"still usable"

        def all_taken() -> bool:
            exclusive.process_data_events(time_limit=0.05)
            return sorted(taken) == sorted(f"m{n}".encode() for n in range(10))

        wait_until(all_taken, "the exclusive consumer gets every message")
        waiting.connection.close()
        exclusive.close()
