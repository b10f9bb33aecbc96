"""A replicated queue's state, rebuilt from its log.

Each log payload is one segment record of docs/queue-files.md §3 (a message, or a state record
about one: delivered, acked, requeued, dead_lettered, ...), so a follower's log holds exactly what
the leader's queue store held, in the same order; the empty payload is a new leader's no-op.
One payload is the log's own: the **delivery horizon** (`horizon_payload`), the highest message
seq the leader may deliver; the leader delivers a message only once a horizon covering it is
committed, so a new leader knows which messages its predecessor may have delivered without
their `delivered` record reaching it (cluster/replication/replicated_journal.py).

`QueueState` folds those records into the queue's messages: which are ready (in publish
order), which are held by a consumer and their delivery counts. A new leader folds its whole
log (``QueueState.rebuild``) and then hands back what the old leader had delivered and not seen
settled (``held_at_failover``): each gets a ``requeued`` record with its delivery count plus
one, so it is delivered again with ``redelivered=true`` and a higher ``x-delivery-count``.
"""

from __future__ import annotations

import enum
import heapq
import struct
import zlib
from collections.abc import Iterable

from persistence.record_format import (
    RECORD_HEAD,
    MessageRecord,
    MessageState,
    StateRecord,
    decode_payload,
    encode_message,
    encode_state,
)


# A horizon payload: a zero length (a segment record's length is at least 5: it cannot be one),
# then the horizon's seq.
_HORIZON = struct.Struct(">IQ")
_HORIZON_MARK = b"\0\0\0\0"


def horizon_payload(seq: int) -> bytes:
    """The log payload saying: messages up to `seq` may be delivered from here on."""
    return _HORIZON.pack(0, seq)


class Held(enum.Enum):
    READY = "ready"
    DELIVERED = "delivered"


class QueueState:
    """Messages not yet settled, from the records applied so far."""

    def __init__(self) -> None:
        self.messages: dict[int, MessageRecord] = {}
        self.held: dict[int, Held] = {}
        self.delivery_count: dict[int, int] = {}
        self._ready: list[int] = []  # heap of seqs, lazily cleaned
        self.next_seq = 1
        # The last delivery horizon: messages up to it may have been delivered (0: none yet).
        self.delivery_horizon = 0

    @classmethod
    def rebuild(cls, payloads: Iterable[bytes | memoryview]) -> "QueueState":
        state = cls()
        for payload in payloads:
            state.apply(payload)
        return state

    def apply(self, payload: bytes | memoryview) -> None:
        """Fold one log payload (a segment record; empty is a no-op)."""
        if not payload:
            return
        if len(payload) == _HORIZON.size and payload[:4] == _HORIZON_MARK:
            self.delivery_horizon = _HORIZON.unpack_from(payload)[1]
            return
        length, crc, rtype = RECORD_HEAD.unpack_from(payload)
        if zlib.crc32(payload[8:4 + length]) != crc:
            raise ValueError("a replicated record failed its CRC")
        record = decode_payload(rtype, payload[9:4 + length])
        if isinstance(record, MessageRecord):
            self.messages[record.seq] = record
            self.held[record.seq] = Held.READY
            heapq.heappush(self._ready, record.seq)
            self.next_seq = max(self.next_seq, record.seq + 1)
        elif isinstance(record, StateRecord):
            self._apply_state(record)

    def _apply_state(self, record: StateRecord) -> None:
        seq = record.seq
        if record.state is MessageState.PURGED:
            for s in [s for s, h in self.held.items() if s <= seq and h is Held.READY]:
                self._settle(s)
            return
        if seq not in self.held:
            return  # settled already
        if record.state.settles:
            self._settle(seq)
        elif record.state is MessageState.DELIVERED:
            self.held[seq] = Held.DELIVERED
            self.delivery_count[seq] = record.delivery_count
        else:  # requeued, waiting_retry: back to the queue at its original position
            self.held[seq] = Held.READY
            self.delivery_count[seq] = record.delivery_count
            heapq.heappush(self._ready, seq)

    def _settle(self, seq: int) -> None:
        self.held.pop(seq, None)
        self.messages.pop(seq, None)
        self.delivery_count.pop(seq, None)

    def next_ready(self) -> int | None:
        """The oldest ready message, without taking it."""
        ready = self._ready
        while ready and self.held.get(ready[0]) is not Held.READY:
            heapq.heappop(ready)
        return ready[0] if ready else None

    def maybe_delivered(self) -> list[int]:
        """The ready messages the last leader may have delivered without its `delivered`
        record reaching this log: those at or below the delivery horizon."""
        horizon = self.delivery_horizon
        return sorted(seq for seq, held in self.held.items() if held is Held.READY and seq <= horizon)

    def held_at_failover(self) -> list[tuple[int, int]]:
        """(seq, delivery count after returning) of each message a consumer held."""
        return sorted((seq, self.delivery_count.get(seq, 0) + 1)
                      for seq, held in self.held.items() if held is Held.DELIVERED)


def message_payload(seq: int, published_at_ms: int, exchange: str, routing_key: str,
                    raw_properties: bytes, body: bytes) -> bytes:
    head, body = encode_message(seq, published_at_ms, exchange, routing_key, raw_properties, body)
    return head + body


def state_payload(seq: int, state: MessageState, at_ms: int, *, delivery_count: int = 0) -> bytes:
    return encode_state(state, seq, at_ms, delivery_count=delivery_count)
