"""Publisher confirms of one channel: which sequence numbers to ack or nack, batched.

Each publish in confirm mode takes the next sequence number. A message is confirmed when
every queue it went to has taken responsibility for it (for a persistent message on a durable
queue: once it is on disk). Confirms are collected and sent once per batch of input, as one
`multiple` ack covering everything that can be covered, so a fast publisher gets few frames.
"""

from __future__ import annotations



class PublisherConfirms:
    __slots__ = ("next_seq", "acked_total", "_outstanding", "_acks", "_nacks")

    def __init__(self) -> None:
        self.next_seq = 1
        self.acked_total = 0  # messages confirmed with basic.ack so far
        # Sequence numbers held until their messages are on disk.
        self._outstanding: set[int] = set()
        self._acks: list[int] = []
        self._nacks: list[int] = []

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def hold(self, seq: int) -> None:
        """`seq` cannot be confirmed yet (it waits for disk); release() it later."""
        self._outstanding.add(seq)

    def resolve(self, seq: int, ok: bool = True) -> None:
        (self._acks if ok else self._nacks).append(seq)

    def release(self, seq: int, ok: bool = True) -> None:
        """A held sequence number is now resolved."""
        self._outstanding.discard(seq)
        self.resolve(seq, ok)

    @property
    def unconfirmed(self) -> int:
        """Published in confirm mode, and neither ack nor nack sent yet."""
        return len(self._outstanding) + len(self._acks) + len(self._nacks)

    @property
    def has_pending(self) -> bool:
        return bool(self._acks or self._nacks)

    def take_frames(self) -> list[tuple[bool, int, bool]]:
        """(is_ack, delivery_tag, multiple) to send now, in order."""
        if not self._acks and not self._nacks:
            return []
        self.acked_total += len(self._acks)
        acks = sorted(self._acks)
        nacks = sorted(self._nacks)
        self._acks.clear()
        self._nacks.clear()
        # A multiple ack for tag T also confirms every earlier tag, so it may only cover tags
        # that are all acked now or earlier: none still outstanding and none being nacked.
        limits = [min(self._outstanding)] if self._outstanding else []
        if nacks:
            limits.append(nacks[0])
        covered = [seq for seq in acks if seq < min(limits)] if limits else acks
        frames: list[tuple[bool, int, bool]] = []
        if covered:
            frames.append((True, covered[-1], len(covered) > 1))
        for seq in acks[len(covered):]:
            frames.append((True, seq, False))
        for seq in nacks:
            frames.append((False, seq, False))
        frames.sort(key=lambda frame: frame[1])
        return frames
