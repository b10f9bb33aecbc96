"""What became of each message: the state records of a queue replayed, vectorised with numpy.

docs/queue-files.md section 5 is the rule: replay the records of all segments
of a queue in order; a settled message stays settled; ``purged`` settles every
message up to its ``seq`` that is ready or waiting for a retry at that point.
State records about a segment's messages may sit in any *later* segment, so
the reader of one segment replays the state records of that segment and of
every later one (``StateEvents`` per segment, concatenated in stream order).

Column values (docs/spark.md explains the choice):

=================  ===============  ==============================================
last record        ``state``        ``state_event``
=================  ===============  ==============================================
the message        ready            published
requeued           ready            requeued
delivered          unacked          delivered
waiting_retry      waiting_retry    waiting_retry
acked              acked            acked
dead_lettered      dead_lettered    dead_lettered
dropped            dead_lettered    dropped   (expired if its reason is expired)
expired            expired          expired
purged             purged           purged
=================  ===============  ==============================================

``dropped`` (rejected without requeue, x-max-length or delivery limit with no
dead-letter exchange) is reported as ``dead_lettered``, because that is how
RabbitMQ counts it: ``rabbitmq_global_messages_dead_lettered_*_total`` with
``dead_letter_strategy="disabled"``. ``state_event`` keeps the difference.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np

from persistence.record_format import Reason, RecordType

# Codes of the outcome arrays, indexes into these tuples.
STATE_NAMES = ("ready", "unacked", "acked", "dead_lettered", "expired", "waiting_retry", "purged")
EVENT_NAMES = ("published", "delivered", "acked", "dropped", "dead_lettered", "expired", "requeued",
               "waiting_retry", "purged")
REASON_NAMES = tuple(reason.name.lower() for reason in Reason)  # unspecified, rejected, expired, maxlen, delivery_limit
# The state of every record of a stream: it stays in the log, whoever read it, until retention
# drops its segment (streams have no state records; spark.stream_reader, docs/spark.md).
STREAM_STATE = "in_stream"

_EVENT_CODE = {  # record type -> index in EVENT_NAMES
    RecordType.DELIVERED: 1, RecordType.ACKED: 2, RecordType.DROPPED: 3, RecordType.DEAD_LETTERED: 4,
    RecordType.EXPIRED: 5, RecordType.REQUEUED: 6, RecordType.WAITING_RETRY: 7, RecordType.PURGED: 8,
}
_READY, _UNACKED, _ACKED, _DEAD, _EXPIRED, _WAITING, _PURGED = range(7)
_STATE_OF_SETTLE = np.array([_READY, _UNACKED, _ACKED, _DEAD, _DEAD, _EXPIRED, _READY, _WAITING, _PURGED], np.int8)
_STATE_OF_OPEN = np.array([_READY, _UNACKED, _READY, _READY, _READY, _READY, _READY, _WAITING, _READY], np.int8)
_SETTLING = np.array([rt for rt in (RecordType.ACKED, RecordType.DROPPED, RecordType.DEAD_LETTERED,
                                    RecordType.EXPIRED)], np.uint8)


class StateEvents(NamedTuple):
    """The state records of one segment, in file order, as parallel arrays."""

    seq: np.ndarray  # int64; for purged: the upper bound
    at_ms: np.ndarray  # int64
    kind: np.ndarray  # uint8 record type
    delivery_count: np.ndarray  # int64 (0 where the record has none)
    due_at_ms: np.ndarray  # int64 (0 where the record has none)
    reason: np.ndarray  # uint8 Reason code (0 where the record has none)

    @property
    def nbytes(self) -> int:
        return sum(column.nbytes for column in self)

    def __len__(self) -> int:
        return len(self.seq)


class EventCollector:
    """Accumulates state records during a segment walk, then hands them over as ``StateEvents``."""

    __slots__ = ("seq", "at_ms", "kind", "delivery_count", "due_at_ms", "reason")

    def __init__(self) -> None:
        self.seq, self.at_ms = array("q"), array("q")
        self.kind = bytearray()
        self.delivery_count, self.due_at_ms = array("q"), array("q")
        self.reason = bytearray()

    def add(self, rtype: int, fields: tuple[int, ...]) -> None:
        """``fields`` as record_format.state_fields returns them: (seq, at_ms, *extra)."""
        self.seq.append(fields[0])
        self.at_ms.append(fields[1])
        self.kind.append(rtype)
        count = due = reason = 0
        if rtype in (RecordType.DELIVERED, RecordType.REQUEUED):
            count = fields[2]
        elif rtype == RecordType.WAITING_RETRY:
            count, due = fields[2], fields[3]
        elif rtype in (RecordType.DROPPED, RecordType.DEAD_LETTERED):
            reason = fields[2] if fields[2] < len(REASON_NAMES) else 0
        self.delivery_count.append(count)
        self.due_at_ms.append(due)
        self.reason.append(reason)

    def events(self) -> StateEvents:
        return StateEvents(
            np.frombuffer(self.seq, np.int64), np.frombuffer(self.at_ms, np.int64),
            np.frombuffer(bytes(self.kind), np.uint8), np.frombuffer(self.delivery_count, np.int64),
            np.frombuffer(self.due_at_ms, np.int64), np.frombuffer(bytes(self.reason), np.uint8),
        )


def concat(parts: list[StateEvents]) -> StateEvents:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return EventCollector().events()
    return StateEvents(*(np.concatenate(columns) for columns in zip(*parts)))


class Outcome(NamedTuple):
    """Per message (parallel to the message seqs given to ``replay``)."""

    state: np.ndarray  # int8 index into STATE_NAMES
    event: np.ndarray  # int8 index into EVENT_NAMES
    at_ms: np.ndarray  # int64, -1 when no state record (the caller uses published_at)
    delivery_count: np.ndarray  # int64
    redelivered: np.ndarray  # bool: some delivered record before it was settled
    reason: np.ndarray  # int8 index into REASON_NAMES, -1 when not dropped / dead-lettered
    due_at_ms: np.ndarray  # int64, -1 unless waiting_retry


def replay(seqs: np.ndarray, events: StateEvents) -> Outcome:
    """The outcome of each message in ``seqs`` (sorted int64) under ``events`` (in stream order)."""
    n = len(seqs)
    big = np.iinfo(np.int64).max
    positions = np.arange(len(events.seq), dtype=np.int64)
    is_purge = events.kind == RecordType.PURGED
    if n:
        idx = np.searchsorted(seqs, events.seq)
        hit = (idx < n) & ~is_purge
        hit[hit] = seqs[idx[hit]] == events.seq[hit]
    else:
        idx, hit = np.zeros(len(events.seq), np.int64), np.zeros(len(events.seq), bool)
    pos, idx = positions[hit], idx[hit]
    kind, at = events.kind[hit], events.at_ms[hit]
    settling = np.isin(kind, _SETTLING)

    settle_pos = np.full(n, big, np.int64)
    settle_code = np.zeros(n, np.int8)
    settle_at = np.full(n, -1, np.int64)
    settle_reason = np.full(n, -1, np.int8)
    s_idx, first = np.unique(idx[settling], return_index=True)  # events are in order: first = earliest
    s_rows = np.flatnonzero(settling)[first]
    settle_pos[s_idx] = pos[s_rows]
    settle_code[s_idx] = _event_codes(kind[s_rows])
    settle_at[s_idx] = at[s_rows]
    settle_reason[s_idx] = events.reason[hit][s_rows].astype(np.int8)

    for p in positions[is_purge]:  # rare: one per queue.purge
        before = ~settling & (pos < p)
        last_code = np.zeros(n, np.int8)
        l_idx, l_rows = _last_per_message(idx[before])
        last_code[l_idx] = _event_codes(kind[before][l_rows])
        covered = (seqs <= events.seq[p]) & (settle_pos > p) & (last_code != 1)  # 1: delivered, held
        settle_pos[covered] = p
        settle_code[covered] = 8
        settle_at[covered] = events.at_ms[p]
        settle_reason[covered] = -1

    open_rows = ~settling & (pos < settle_pos[idx])
    o_idx, o_last = _last_per_message(idx[open_rows])
    o_rows = np.flatnonzero(open_rows)[o_last]
    open_code = np.zeros(n, np.int8)
    open_code[o_idx] = _event_codes(kind[o_rows])
    open_at = np.full(n, -1, np.int64)
    open_at[o_idx] = at[o_rows]
    count = np.zeros(n, np.int64)
    count[o_idx] = events.delivery_count[hit][o_rows]
    due = np.full(n, -1, np.int64)
    due[o_idx] = events.due_at_ms[hit][o_rows]
    redelivered = np.zeros(n, bool)
    redelivered[idx[open_rows & (kind == RecordType.DELIVERED)]] = True

    settled = settle_pos != big
    state = np.where(settled, _STATE_OF_SETTLE[settle_code], _STATE_OF_OPEN[open_code]).astype(np.int8)
    dropped_expired = settled & (settle_code == 3) & (settle_reason == Reason.EXPIRED)
    state[dropped_expired] = _EXPIRED
    event = np.where(settled, settle_code, open_code).astype(np.int8)
    return Outcome(
        state=state,
        event=event,
        at_ms=np.where(settled, settle_at, open_at),
        delivery_count=count,
        redelivered=redelivered,
        reason=np.where(settled & np.isin(settle_code, (3, 4)), np.maximum(settle_reason, 0), -1).astype(np.int8),
        due_at_ms=np.where(state == _WAITING, due, -1),
    )


_CODE_OF_TYPE = np.zeros(256, np.int8)
for _rtype, _code in _EVENT_CODE.items():
    _CODE_OF_TYPE[_rtype] = _code


def _event_codes(kinds: np.ndarray) -> np.ndarray:
    return _CODE_OF_TYPE[kinds]


def _last_per_message(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(message indexes, row of the last event of each) for events in stream order."""
    if not len(idx):
        return idx, idx
    rev_unique, rev_first = np.unique(idx[::-1], return_index=True)
    return rev_unique, len(idx) - 1 - rev_first
