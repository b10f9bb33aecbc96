"""Consumer timeout bookkeeping for one channel: when each unacked delivery times out.

Only deliveries from a queue (or consumer) with `x-consumer-timeout` are tracked. Delivery tags
grow with time, so the deliveries that share a timeout value time out in tag order: each
timeout value is one ordered map tag -> deadline, settling removes a tag in O(1) (a `multiple`
ack pops from the front), and one `Deadline` on the broker's timer heap fires for the earliest.
Memory is bounded by the channel's unacked deliveries, whatever the message rate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from queues.timers import Deadline, Timers


class DeliveryTimeouts:
    """Deadlines of a channel's tracked deliveries; `on_timeout(tags)` gets those that passed."""

    __slots__ = ("_lanes", "deadline", "on_timeout")

    def __init__(self, timers: Timers, on_timeout: Callable[[list[int]], None]) -> None:
        self._lanes: dict[int, OrderedDict[int, float]] = {}  # timeout ms -> {tag: deadline}
        self.deadline = Deadline(timers, self._fire)
        self.on_timeout = on_timeout

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

    def clear(self) -> None:
        self._lanes.clear()
        self.deadline.disarm()

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
            self.on_timeout(expired)
