"""Consumer timeouts of one channel (x-consumer-timeout): when each unacked delivery times out,
and what the channel does when one does.

Only deliveries from a queue (or consumer) with `x-consumer-timeout` are tracked. Delivery tags
grow with time, so the deliveries that share a timeout value time out in tag order: each
timeout value is one ordered map tag -> deadline, settling removes a tag in O(1) (a `multiple`
ack pops from the front), and one `Deadline` on the broker's timer heap fires for the earliest.
Memory is bounded by the channel's unacked deliveries, whatever the message rate.

When a deadline passes, the answer is RabbitMQ's. A client that understands basic.cancel
(consumer_cancel_notify) keeps its channel: each late delivery goes back to its queue (subject
to delayed retry, as a "returned" one), only the consumers that held them are cancelled, and
its tag is remembered as timed out, so that a late ack of it is ignored instead of being an
unknown tag (settlement.py, transaction.py). Other clients get what RabbitMQ does: the channel
is closed with 406, which returns everything it had not acked.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.channel.settlement import apply_settlement
from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from queues.delays.delayed_retry import RETURNED
from queues.timers import Deadline, Timers

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats
    from amqp_server.channel.ports import TimingOutChannel
    from amqp_server.channel.unacked_store import UnackedStore


class DeliveryTimeouts:
    """Deadlines of a channel's tracked deliveries, and the tags that timed out; when deadlines
    pass, the channel's answer (the module docstring) on `unacked`, `channel` and `stats`."""

    __slots__ = ("_lanes", "_timed_out", "deadline", "_channel", "_unacked", "_stats")

    def __init__(self, timers: Timers, channel: "TimingOutChannel", unacked: "UnackedStore",
                 stats: "BrokerStats") -> None:
        self._lanes: dict[int, OrderedDict[int, float]] = {}  # timeout ms -> {tag: deadline}
        self._timed_out: set[int] = set()  # tags that timed out and went back to their queue
        self.deadline = Deadline(timers, self._fire)
        self._channel = channel
        self._unacked = unacked
        self._stats = stats

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def track(self, tag: int, timeout_ms: int) -> None:
        due = self.deadline.timers.now() + timeout_ms / 1000.0
        lane = self._lanes.get(timeout_ms)
        if lane is None:
            lane = self._lanes[timeout_ms] = OrderedDict()
        lane[tag] = due
        if len(lane) == 1:
            self.deadline.arm(due)

    def forget(self, tag: int) -> None:
        """The delivery was settled (ack, nack, reject)."""
        for lane in self._lanes.values():
            if lane.pop(tag, None) is not None:
                return

    def forget_up_to(self, tag: int) -> None:
        """Every delivery with a tag <= `tag` was settled (a `multiple` settlement)."""
        for lane in self._lanes.values():
            while lane:
                first = next(iter(lane))
                if first > tag:
                    break
                del lane[first]

    def forget_all(self) -> None:
        """Every delivery was settled (tag 0 with `multiple`, basic.recover)."""
        self._lanes.clear()
        self.deadline.disarm()

    def forget_settled(self, tag: int, multiple: bool) -> None:
        """A settlement named `tag` (with `multiple`: every tag up to it, 0 for all)."""
        if not multiple:
            self.forget(tag)
        elif tag == 0:
            self.forget_all()
        else:
            self.forget_up_to(tag)

    def has_timed_out(self, tag: int) -> bool:
        """Delivery `tag` timed out and went back to its queue (a late settlement of it is ignored)."""
        return tag in self._timed_out

    def forget_timed_out(self, tag: int) -> None:
        """A late settlement of the timed-out delivery `tag` came: it is not remembered further."""
        self._timed_out.discard(tag)

    def close(self) -> None:
        """The channel is gone: no deadline stays armed, no tag is remembered."""
        self.forget_all()
        self._timed_out.clear()

    def _fire(self) -> None:
        now = self.deadline.timers.now()
        expired: list[int] = []
        for lane in self._lanes.values():
            while lane:
                tag, due = next(iter(lane.items()))
                if due > now:
                    break
                del lane[tag]
                expired.append(tag)
        heads = [next(iter(lane.values())) for lane in self._lanes.values() if lane]
        if heads:
            self.deadline.arm(min(heads))
        if expired:
            expired.sort()
            self._timed_out_answer(expired)

    def _timed_out_answer(self, tags: list[int]) -> None:
        """Deliveries `tags` stayed unacked longer than their consumer timeout."""
        channel = self._channel
        if not channel.is_open:
            return
        unacked = self._unacked
        late = []
        for tag in tags:
            delivery = unacked.pop(tag)
            if delivery is not None:
                late.append((tag, delivery))
        if not late:
            return
        connection = channel.connection
        if not connection.client_capabilities.get("consumer_cancel_notify"):
            for tag, delivery in late:
                unacked.add(tag, delivery)  # the channel's release requeues them all
            timeout = next((u.consumer.timeout_ms for _t, u in late if u.consumer is not None), None)
            timeout = timeout or late[0][1].queue.settings.consumer_timeout_ms
            connection.fail_channel(
                channel,
                AMQPError(
                    errors.PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {channel.id} timed out. Timeout value used: {timeout} ms. "
                    "This timeout value can be configured, see consumers doc guide to learn more",
                ),
            )
            return
        self._timed_out.update(tag for tag, _delivery in late)
        for consumer in {delivery.consumer for _tag, delivery in late if delivery.consumer is not None}:
            # Cancel first, so the requeued message is not handed straight back to it.
            if channel.remove_consumer(consumer.tag) is not None:
                consumer.queue.remove_consumer(consumer)
                connection.send_method(channel.id, commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
        apply_settlement(self._stats, channel, "nack", [delivery for _tag, delivery in late], True, RETURNED)
