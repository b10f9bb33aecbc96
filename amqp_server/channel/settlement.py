"""Settling deliveries on a channel: basic.ack, basic.nack and basic.reject of delivery tags.

A tag (or, with `multiple`, every tag up to it; 0 means all) must be an unacked delivery of
the channel, else the channel is closed with 406 "unknown delivery tag"; a tag that already
timed out (consumer timeout) went back to its queue and is ignored. In a transaction the tags
are checked at once but settled at tx.commit; as in RabbitMQ, a tag settled earlier in the same
transaction is already unknown (tx.rollback makes it known again). The 406 names the method
that settled: basic.ack (60,80), basic.reject (60,90) or basic.nack (60,120). Acked messages
are done; nacked or rejected ones are requeued (queues/requeue.py decides where) or leave
their queue (to its dead-letter exchange). Room freed on consumers is offered messages again
at once.

The functions are handed what they change (the channel's UnackedStore and DeliveryTimeouts,
the broker's stats) and see the channel itself only as a ports.SettlingChannel: its consumers
and prefetch limit, read to offer messages again. The timeouts and an open transaction come as
ports.SettlingTimeouts and ports.OpenTransaction, so that this module, which both
delivery_timeouts.py and transaction.py use, imports neither.
"""

from __future__ import annotations

from collections import defaultdict
from operator import itemgetter
from typing import TYPE_CHECKING

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from amqp_server.channel.unacked_store import Unacked, UnackedStore
from queues.consumer import Consumer
from queues.delays.delayed_retry import FAILED, RETURNED
from queues.queue import Queue
from queues.message import QueueEntry

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats
    from amqp_server.channel.ports import OpenTransaction, SettlingChannel, SettlingTimeouts


_queue_of = itemgetter(1)  # of an Unacked

# The method a settlement came as, for the class and method ids of its 406.
_METHOD_IDS = {"ack": 80, "reject": 90, "nack": 120}


def settle(unacked: UnackedStore, timeouts: "SettlingTimeouts | None", transaction: "OpenTransaction | None",
           stats: "BrokerStats", channel: "SettlingChannel", kind: str, tag: int, multiple: bool,
           requeue: bool) -> None:
    """ack / nack / reject (`kind`) of one delivery tag of `unacked`, or of all up to it with
    `multiple`: at once, or at tx.commit when `transaction` is open."""
    if transaction is not None:
        # applied at tx.commit
        transaction.settle(unacked, timeouts, channel.next_delivery_tag, kind, tag, multiple, requeue)
        return
    taken = take_unacked(unacked, timeouts, kind, tag, multiple)
    apply_settlement(stats, channel, kind, taken, requeue)


def take_unacked(unacked: UnackedStore, timeouts: "SettlingTimeouts | None", kind: str, tag: int,
                 multiple: bool) -> list[Unacked]:
    """Take the deliveries a settlement names; 406 if it names none."""
    if multiple:
        # RabbitMQ needs `tag` itself to be unacked (or 0), even when higher tags are.
        if tag == 0 or tag in unacked or (timeouts is not None and timeouts.has_timed_out(tag)):
            if timeouts is not None:
                timeouts.forget_settled(tag, True)
            return unacked.pop_up_to(tag)
    else:
        taken = unacked.pop(tag)
        if taken is not None:
            if timeouts is not None:
                timeouts.forget(tag)
            return [taken]
        if timeouts is not None and timeouts.has_timed_out(tag):
            # It timed out and went back to its queue: settling it now changes nothing.
            timeouts.forget_timed_out(tag)
            return []
    raise unknown_delivery_tag(kind, tag)


def unknown_delivery_tag(kind: str, tag: int) -> AMQPError:
    return AMQPError(errors.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, _METHOD_IDS[kind])


def take_if_present(unacked: UnackedStore, timeouts: "SettlingTimeouts | None", tag: int,
                    multiple: bool) -> list[Unacked]:
    """At tx.commit: the deliveries a settlement named that are still unacked (tags were checked
    when the ack arrived; one settled twice in a transaction is settled once)."""
    if timeouts is not None:
        timeouts.forget_settled(tag, multiple)
    if multiple:
        return unacked.pop_up_to(tag)
    taken = unacked.pop(tag)
    return [taken] if taken is not None else []


def recover(unacked: UnackedStore, timeouts: "SettlingTimeouts | None", stats: "BrokerStats",
            channel: "SettlingChannel") -> None:
    """basic.recover: every delivery of `unacked` goes back to its queue, as a returned one."""
    if timeouts is not None:
        timeouts.forget_all()
    apply_settlement(stats, channel, "nack", unacked.pop_all(), True, RETURNED)


def apply_settlement(stats: "BrokerStats", channel: "SettlingChannel", kind: str, taken: list[Unacked],
                     requeue: bool, cause: str = FAILED) -> None:
    """Settle `taken`, deliveries of `channel`; a requeue is for `cause` (delayed_retry.FAILED or
    RETURNED)."""
    if not taken:
        return
    touched: set[Queue] = set()
    if kind == "ack":
        queues = set(map(_queue_of, taken))
        if len(queues) == 1:
            # (The usual `multiple` ack, of one queue's deliveries: settled in one call.)
            if len(taken) == 1:
                entry, queue, consumer = taken[0]
                queue.ack(entry, consumer)
            else:
                taken[0].queue.ack_many(taken)
        else:
            for entry, queue, consumer in taken:
                queue.ack(entry, consumer)
        touched = queues
        stats.acked += len(taken)
    elif requeue:
        by_queue: dict[Queue, list[tuple[QueueEntry, Consumer | None]]] = defaultdict(list)
        for entry, queue, consumer in taken:
            by_queue[queue].append((entry, consumer))
        for queue, entries in by_queue.items():
            queue.requeue(entries, cause)
        touched.update(by_queue)
    else:
        for entry, queue, consumer in taken:
            queue.reject(entry, consumer)
            touched.add(queue)
    # With a channel-wide limit, room freed by one queue's ack may be used by any queue.
    if channel.global_prefetch_count:
        touched = touched | {consumer.queue for consumer in channel.consumers.values()}
    for queue in touched:
        if queue.deleted:
            # Deliveries of a queue form that is gone: a replicated queue whose leader changed
            # moved its consumers to its new form (cluster_apply.py), where the room is used.
            channel.dispatch_all()
        else:
            queue.dispatch()
