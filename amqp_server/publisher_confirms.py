"""Publisher confirms of one channel: which sequence numbers to ack or nack, batched.

Each publish in confirm mode takes the next sequence number. A message is confirmed when
every queue it went to has taken responsibility for it (for a persistent message on a durable
queue: once it is on disk). Confirms are collected and sent once per batch of input, as one
`multiple` ack covering everything that can be covered, so a fast publisher gets few frames.

Messages that wait for their queues to store them are waited for in groups, not one by one:
the publishes of one batch of input that went to the same queues share one `StoreWait`, which
asks each of those queues once (`Queue.when_stored`) when the connection has handled the batch
(`ask_stores`), after its last publish, so the one answer covers them all.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any


class StoreWait:
    """Publishes that went to the same queues, confirmed together once those queues stored them."""

    __slots__ = ("confirms", "queues", "seqs", "refused", "left", "error")

    def __init__(self, confirms: "PublisherConfirms", queues: Sequence[Any]) -> None:
        self.confirms = confirms
        self.queues = queues
        self.seqs: list[int] = []
        self.refused: set[int] | None = None  # sequence numbers a queue refused (nacked even if stored)
        self.left = len(queues)
        self.error: OSError | None = None

    def ask(self) -> None:
        """Ask each queue to call back once what was published to it so far is stored."""
        for queue in self.queues:
            queue.when_stored(self.one_stored)

    def one_stored(self, error: OSError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if not self.left:
            self.confirms.stored(self)


class PublisherConfirms:
    """`on_released` is called when messages that waited for their queues can be confirmed."""

    __slots__ = ("next_seq", "acked_total", "_outstanding", "_held", "_acks", "_nacks", "_waits", "on_released")

    def __init__(self, on_released: Callable[[], None] = lambda: None) -> None:
        self.next_seq = 1
        self.acked_total = 0  # messages confirmed with basic.ack so far
        # Sequence numbers held until their messages are stored, and the same in the order they
        # were held (the oldest first, which bounds a multiple ack; stored ones are skipped).
        self._outstanding: set[int] = set()
        self._held: deque[int] = deque()
        self._acks: list[int] = []
        self._nacks: list[int] = []
        self._waits: list[StoreWait] = []  # made since the last take_frames, not asked yet
        self.on_released = on_released

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def hold_until_stored(self, seq: int, queues: Sequence[Any], accepted: bool = True) -> None:
        """`seq` is confirmed (acked if `accepted`, else nacked) once every one of `queues` has
        stored it; a queue's storage error nacks it. on_released() tells when."""
        self._outstanding.add(seq)
        self._held.append(seq)
        waits = self._waits
        wait = waits[-1] if waits else None
        if wait is None or wait.queues != queues:
            wait = StoreWait(self, queues)
            waits.append(wait)
        wait.seqs.append(seq)
        if not accepted:
            if wait.refused is None:
                wait.refused = set()
            wait.refused.add(seq)

    def ask_stores(self) -> None:
        """Hand the publishes held since the last call to their queues' storage (StoreWait.ask).
        Call it after the last publish of a batch of input, in the same event-loop iteration:
        one answer per queue then covers them all, and the fsync round that gives it starts as
        soon as it would have for the first of them."""
        waits = self._waits
        self._waits = []
        for wait in waits:
            wait.ask()

    def stored(self, wait: StoreWait) -> None:
        """Every queue of `wait` stored its messages (or failed to): they can be confirmed."""
        ok = wait.error is None
        refused = wait.refused
        outstanding = self._outstanding
        for seq in wait.seqs:
            outstanding.discard(seq)
            if ok and (refused is None or seq not in refused):
                self._acks.append(seq)
            else:
                self._nacks.append(seq)
        self.on_released()

    def resolve(self, seq: int, ok: bool = True) -> None:
        (self._acks if ok else self._nacks).append(seq)

    @property
    def unconfirmed(self) -> int:
        """Published in confirm mode, and neither ack nor nack sent yet."""
        return len(self._outstanding) + len(self._acks) + len(self._nacks)

    @property
    def has_pending(self) -> bool:
        return bool(self._acks or self._nacks)

    def _oldest_outstanding(self) -> int | None:
        held = self._held
        outstanding = self._outstanding
        while held and held[0] not in outstanding:
            held.popleft()
        return held[0] if held else None

    def take_frames(self) -> list[tuple[bool, int, bool]]:
        """(is_ack, delivery_tag, multiple) to send now, in order.

        Publishes held since the last ask_stores() are asked for first.
        """
        if self._waits:
            self.ask_stores()
        if not self._acks and not self._nacks:
            return []
        self.acked_total += len(self._acks)
        acks = self._acks
        nacks = self._nacks
        self._acks = []
        self._nacks = []
        acks.sort()
        nacks.sort()
        # A multiple ack for tag T also confirms every earlier tag, so it may only cover tags
        # that are all acked now or earlier: none still outstanding and none being nacked.
        limit = self._oldest_outstanding()
        if nacks and (limit is None or nacks[0] < limit):
            limit = nacks[0]
        covered = len(acks) if limit is None else bisect_left(acks, limit)
        frames: list[tuple[bool, int, bool]] = []
        if covered:
            frames.append((True, acks[covered - 1], covered > 1))
        if covered == len(acks) and not nacks:
            return frames
        for seq in acks[covered:]:
            frames.append((True, seq, False))
        for seq in nacks:
            frames.append((False, seq, False))
        frames.sort(key=_tag)
        return frames


def _tag(frame: tuple[bool, int, bool]) -> int:
    return frame[1]
