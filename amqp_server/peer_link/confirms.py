"""The confirm window of a link that acks its source only once the destination confirmed.

A link (a shovel in on-confirm, a federation link in on-confirm) publishes each delivery from
its source to its destination in confirm mode, so the destination's publish sequence numbers
run 1, 2, 3 ... in the order of the source's delivery tags. `ConfirmWindow` keeps the source
tags of what is published and not confirmed yet, and turns the destination's confirms into
what the link may do on the source:

- `settle(seq, multiple, ack, refusals)` returns `(tag, count)`: the source may be acked with
  one `multiple` ack up to `tag` (0: nothing to ack now), covering `count` messages. An ack
  never covers a message the destination has not confirmed: a single confirm that comes
  ahead of an older outstanding one (a broker confirms a message for a transient queue before
  an earlier one waiting for its fsync, RabbitMQ and this one alike) is kept aside until
  everything before it is settled;
- a nack: `refusals.refused(tag)` at once, for the link to nack (requeue) that message on the
  source; the window then skips it.

Per message, nothing but the tag in a deque (and an entry in a dict for a confirm that came
ahead of its turn).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class Refusals(Protocol):
    def refused(self, tag: int) -> None:
        """The destination refused (nacked) the message with source tag `tag`."""


class ConfirmWindow:
    """Source tags by destination sequence number (see the module docstring)."""

    __slots__ = ("_tags", "_first_seq", "_ahead")

    def __init__(self) -> None:
        self._tags: deque[int] = deque()  # source tags; _tags[0] has sequence number _first_seq
        self._first_seq = 1
        # Sequence numbers settled (True: acked, False: nacked) before those ahead of them.
        self._ahead: dict[int, bool] = {}

    def __len__(self) -> int:
        """Published and not settled yet."""
        return len(self._tags)

    def clear(self) -> None:
        """A new destination channel: its sequence numbers start at 1 again."""
        self._tags.clear()
        self._ahead.clear()
        self._first_seq = 1

    def published(self, tag: int) -> None:
        """The message with source tag `tag` was published (it gets the next sequence number)."""
        self._tags.append(tag)

    def settle(self, seq: int, multiple: bool, ack: bool, refusals: Refusals) -> tuple[int, int]:
        """A basic.ack (ack True) or basic.nack from the destination: (the source tag a
        `multiple` ack may go up to, 0 for none; how many messages it settles)."""
        tags = self._tags
        if not tags:
            return 0, 0
        ahead = self._ahead
        last_tag = 0
        settled = 0
        if multiple:
            while tags and self._first_seq <= seq:
                tag = tags.popleft()
                earlier = ahead.pop(self._first_seq, None) if ahead else None
                self._first_seq += 1
                if earlier is False:
                    continue  # refused already
                if ack or earlier:
                    last_tag = tag
                    settled += 1
                else:
                    refusals.refused(tag)
        elif seq == self._first_seq:
            tag = tags.popleft()
            self._first_seq += 1
            if ack:
                last_tag = tag
                settled += 1
            else:
                refusals.refused(tag)
        elif seq > self._first_seq:
            if seq - self._first_seq < len(tags) and seq not in ahead:
                if not ack:
                    refusals.refused(tags[seq - self._first_seq])
                ahead[seq] = ack
            return 0, 0
        while ahead and tags and self._first_seq in ahead:
            acked = ahead.pop(self._first_seq)
            tag = tags.popleft()
            self._first_seq += 1
            if acked:
                last_tag = tag
                settled += 1
        return last_tag, settled
