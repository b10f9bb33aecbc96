"""A channel's deliveries that await an ack, by delivery tag."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from itertools import count, islice
from collections.abc import ItemsView, Iterable, ValuesView
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from queues.consumer import Consumer
    from queues.queue import Queue
    from queues.message import QueueEntry


class Unacked(NamedTuple):
    """One delivery awaiting its ack. Channel.deliver builds it with `tuple.__new__(Unacked,
    (entry, queue, consumer))` (no Python-level __new__ per delivery): a field added here must
    be added there too."""

    entry: "QueueEntry"
    queue: "Queue"
    consumer: "Consumer | None"  # None for basic.get


class UnackedStore:
    """Delivery tag -> unacked delivery, oldest first.

    Tags only grow, so an OrderedDict keeps them sorted and `multiple` acks pop from the front
    in O(1) per message.
    """

    __slots__ = ("_by_tag",)

    def __init__(self) -> None:
        self._by_tag: OrderedDict[int, Unacked] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_tag)

    def __contains__(self, tag: int) -> bool:
        return tag in self._by_tag

    def add(self, tag: int, unacked: Unacked) -> None:
        self._by_tag[tag] = unacked

    def add_run(self, first_tag: int, deliveries: Iterable[Unacked]) -> None:
        """Add `deliveries` with the tags from `first_tag` on (above every tag held)."""
        self._by_tag.update(zip(count(first_tag), deliveries))

    def pop(self, tag: int) -> Unacked | None:
        return self._by_tag.pop(tag, None)

    def pop_up_to(self, tag: int) -> list[Unacked]:
        """Remove and return every delivery with a tag <= `tag` (tag 0: all of them)."""
        by_tag = self._by_tag
        if tag == 0:
            return self.pop_all()
        if not by_tag:
            return []
        # The tags to take are the first ones, distinct and growing: at most `tag - first + 1`
        # of them, all of those when no tag between was settled alone. Taken and popped by C
        # loops (islice, map), not one Python step per message.
        first = next(iter(by_tag))
        if tag < first:
            return []
        tags = list(islice(by_tag, min(len(by_tag), tag - first + 1)))
        if tags[-1] > tag:
            del tags[bisect_right(tags, tag):]
        return list(map(by_tag.pop, tags))

    def get(self, tag: int) -> Unacked | None:
        return self._by_tag.get(tag)

    def items(self) -> ItemsView[int, Unacked]:
        """(tag, delivery) pairs, oldest first (do not settle while iterating)."""
        return self._by_tag.items()

    def values(self) -> ValuesView[Unacked]:
        """The unacked deliveries, oldest first (do not settle while iterating)."""
        return self._by_tag.values()

    def has_tag_above(self, tag: int) -> bool:
        return bool(self._by_tag) and next(reversed(self._by_tag)) > tag

    def pop_all(self) -> list[Unacked]:
        taken = list(self._by_tag.values())
        self._by_tag.clear()
        return taken

