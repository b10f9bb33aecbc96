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

import asyncio
import enum
import heapq
import logging
import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from cluster.replication.entries import HEAD as ENTRY_HEAD
from cluster.replication.entries import HEAD_SIZE as ENTRY_HEAD_SIZE
from cluster.replication.log import SEGMENT_BYTES, FileReplicaLog
from persistence.group_commit import SyncJob
from persistence.replica_files import (
    QUEUE_MARK_FILE,
    QueueCommitMark,
    UnsupportedReplicaFormat,
    decode_queue_commit_mark,
    encode_queue_commit_mark,
)

from persistence.record_format import (
    RECORD_HEAD,
    MessageRecord,
    MessageState,
    STATE_OF_TYPE,
    RecordType,
    StateRecord,
    decode_payload,
    encode_message,
    encode_state,
)

log = logging.getLogger(__name__)


# A horizon payload: a zero length (a segment record's length is at least 5: it cannot be one),
# then the horizon's seq.
_HORIZON = struct.Struct(">IQ")
_SEQ = struct.Struct(">Q")  # a record's seq, right after its head
_U32 = struct.Struct(">I")
_COUNT_AT = RECORD_HEAD.size + 16  # a state record's delivery count, after seq and at_ms
_COUNTED = frozenset({RecordType.DELIVERED, RecordType.REQUEUED, RecordType.WAITING_RETRY})


def horizon_payload(seq: int) -> bytes:
    """The log payload saying: messages up to `seq` may be delivered from here on."""
    return _HORIZON.pack(0, seq)


class Held(enum.Enum):
    READY = "ready"
    DELIVERED = "delivered"


class QueueState:
    """Messages not yet settled, from the records applied so far. With ``keep_records`` (a
    takeover's rebuild) it holds each message's record; without (a replica's applied state,
    `QueueReplicaLog`) only where its record is: the log index and length (``where``)."""

    def __init__(self, *, keep_records: bool = True, next_seq: int = 1, delivery_horizon: int = 0) -> None:
        self.messages: dict[int, MessageRecord] = {}
        self.where: dict[int, tuple[int, int]] = {}  # seq -> (log index of its record, record length)
        self.held: dict[int, Held] = {}  # in publish order (seq order)
        self.delivery_count: dict[int, int] = {}
        self._keep_records = keep_records
        self._ready: list[int] | None = [] if keep_records else None  # heap of seqs, lazily cleaned
        self.next_seq = next_seq
        # The last delivery horizon: messages up to it may have been delivered (0: none yet).
        self.delivery_horizon = delivery_horizon

    @classmethod
    def rebuild(cls, payloads: Iterable[bytes | memoryview]) -> "QueueState":
        state = cls()
        for payload in payloads:
            state.apply(payload)
        return state

    def apply(self, payload: bytes | memoryview, index: int = 0) -> None:
        """Fold one log payload (a segment record; empty is a no-op), entry ``index`` of the log."""
        if not payload:
            return
        length, crc, rtype = RECORD_HEAD.unpack_from(payload)
        if length == 0:  # (a segment record's length is at least 5: this is a horizon)
            self.delivery_horizon = _HORIZON.unpack_from(payload)[1]
            return
        if not self._keep_records:
            # Only where a message's record is, and the few fields of a state record: the entry's
            # own CRC passed when it came, and the body stays in the log. (Every committed entry
            # of every replica comes through here.)
            (seq,) = _SEQ.unpack_from(payload, RECORD_HEAD.size)
            if rtype == RecordType.MESSAGE:
                self.where[seq] = (index, len(payload))
                self._add(seq)
                return
            state = STATE_OF_TYPE.get(rtype)
            if state is not None:
                counted = rtype in _COUNTED
                self._apply_state(seq, state, _U32.unpack_from(payload, _COUNT_AT)[0] if counted else 0)
            return
        if zlib.crc32(payload[8:4 + length]) != crc:
            raise ValueError("a replicated record failed its CRC")
        record = decode_payload(rtype, payload[9:4 + length])
        if isinstance(record, MessageRecord):
            self.messages[record.seq] = record
            self._add(record.seq)
        elif isinstance(record, StateRecord):
            self._apply_state(record.seq, record.state, record.delivery_count)

    def restore(self, seq: int, held: Held, delivery_count: int, *, where: tuple[int, int] = (0, 0),
                record: bytes | None = None) -> None:
        """Take message ``seq`` as a snapshot or an applied state holds it: ``record`` (its
        message record) with records kept, else ``where`` (its record's index and length)."""
        if record is not None:
            self.apply(record)
        else:
            self.where[seq] = where
            self._add(seq)
        self.held[seq] = held
        if delivery_count:
            self.delivery_count[seq] = delivery_count

    def _add(self, seq: int) -> None:
        self.held[seq] = Held.READY
        if self._ready is not None:
            heapq.heappush(self._ready, seq)
        self.next_seq = max(self.next_seq, seq + 1)

    def _apply_state(self, seq: int, state: MessageState, delivery_count: int) -> None:
        if state is MessageState.PURGED:
            for s in [s for s, h in self.held.items() if s <= seq and h is Held.READY]:
                self._settle(s)
            return
        if seq not in self.held:
            return  # settled already
        if state.settles:
            self._settle(seq)
        elif state is MessageState.DELIVERED:
            self.held[seq] = Held.DELIVERED
            self.delivery_count[seq] = delivery_count
        else:  # requeued, waiting_retry: back to the queue at its original position
            self.held[seq] = Held.READY
            self.delivery_count[seq] = delivery_count
            if self._ready is not None:
                heapq.heappush(self._ready, seq)

    def _settle(self, seq: int) -> None:
        self.held.pop(seq, None)
        self.messages.pop(seq, None)
        self.where.pop(seq, None)
        self.delivery_count.pop(seq, None)

    def next_ready(self) -> int | None:
        """The oldest ready message, without taking it."""
        ready = self._ready
        assert ready is not None, "a state without records keeps no ready order"
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


# ---- the replica's own state, and its snapshots (log compaction) --------------------------------

# A queue's snapshot document (the `snapshot` file's document, and a RESET's), format 1:
#   magic "AMQPQSNP", version u16, reserved u16, state_index u64 (the entry the state is at),
#   next_seq u64, delivery_horizon u64, count u32; then per unsettled message, in seq order:
#   seq u64, index u64 (of its message record), held u8 (0 ready, 1 delivered), carried u8,
#   delivery_count u32, length u32 (of its message record); then, when carried is 1, the record
#   itself (a message at or below the snapshot's base; 0: its record is in the log after it).
_DOC_HEAD = struct.Struct(">8sHHQQQI")
_DOC_MESSAGE = struct.Struct(">QQBBII")
DOC_MAGIC = b"AMQPQSNP"
DOC_VERSION = 1
_HELD_CODE = {Held.READY: 0, Held.DELIVERED: 1}
_HELD_OF = {0: Held.READY, 1: Held.DELIVERED}

# The records of unsettled messages a snapshot may carry: the base goes no further than the
# message whose record would pass it, so a snapshot (and a RESET) stays small.
SNAPSHOT_RECORD_BYTES = 8 * 1024 * 1024
# A new snapshot (without freeing a segment) once the state is this many entries past the last
# one's: how much a restarted replica folds before its state is at hand again.
SNAPSHOT_EVERY = 100_000
# Committed entries folded into the applied state per event-loop iteration.
APPLY_BATCH = 4096
# A snapshot document must fit a RESET frame (wire.MAX_FRAME); beyond this, no snapshot is taken.
MAX_SNAPSHOT_DOCUMENT = 200 * 1024 * 1024


class TakeoverWork(NamedTuple):
    """What the last `QueueReplicaLog.takeover_state` did."""

    entries_folded: int  # log entries past the applied state, folded
    records_read: int  # unsettled messages' records read back (from the snapshot or the log)
    bytes_read: int  # bytes of those records and entries


def encode_snapshot_document(state: QueueState, state_index: int,
                             records: dict[int, bytes]) -> tuple[bytes, dict[int, tuple[int, int]]]:
    """``state`` (without records) at ``state_index``; ``records``: seq -> message record of the
    messages whose record goes in the document. Returns the document and, as
    `decode_snapshot_document` finds them, seq -> (offset, length) of the records it carries."""
    parts = [_DOC_HEAD.pack(DOC_MAGIC, DOC_VERSION, 0, state_index, state.next_seq, state.delivery_horizon,
                            len(state.held))]
    carried: dict[int, tuple[int, int]] = {}
    pos = _DOC_HEAD.size
    for seq, held in state.held.items():
        index, length = state.where[seq]
        record = records.get(seq)
        parts.append(_DOC_MESSAGE.pack(seq, index, _HELD_CODE[held], record is not None,
                                       state.delivery_count.get(seq, 0), length))
        pos += _DOC_MESSAGE.size
        if record is not None:
            parts.append(record)
            carried[seq] = (pos, len(record))
            pos += len(record)
    return b"".join(parts), carried


def decode_snapshot_document(document: bytes) -> tuple[QueueState, int, dict[int, tuple[int, int]]]:
    """(state without records, its index, seq -> (offset, length) in ``document`` of the records
    it carries). ValueError: not a document of this format."""
    if len(document) < _DOC_HEAD.size:
        raise ValueError("a queue snapshot shorter than its header")
    magic, version, _, state_index, next_seq, horizon, count = _DOC_HEAD.unpack_from(document)
    if magic != DOC_MAGIC or version != DOC_VERSION:
        raise ValueError(f"not a queue snapshot of format {DOC_VERSION}")
    state = QueueState(keep_records=False, next_seq=next_seq, delivery_horizon=horizon)
    carried: dict[int, tuple[int, int]] = {}
    pos = _DOC_HEAD.size
    for _ in range(count):
        seq, index, held, is_carried, delivery_count, length = _DOC_MESSAGE.unpack_from(document, pos)
        pos += _DOC_MESSAGE.size
        if is_carried:
            carried[seq] = (pos, length)
            pos += length
        state.restore(seq, _HELD_OF[held], delivery_count, where=(index, length))
    if pos != len(document):
        raise ValueError("a queue snapshot with bytes after its last message")
    return state, state_index, carried


class QueueReplicaLog(FileReplicaLog):
    """A queue replica's log that keeps the queue's state at hand and compacts itself.

    * Each replica, leader or follower, folds its committed entries (what ``committed(index)``
      says, within its durable index) into ``applied``: the unsettled messages, without their
      bodies (their records stay in the log, or in the snapshot), a few entries per event-loop
      iteration (`APPLY_BATCH`), never one that is not committed.
    * Once a segment holds only entries at or below the applied index (or the state moved
      `SNAPSHOT_EVERY` entries since the last snapshot) it takes a snapshot: the applied state
      and the records of the unsettled messages at or below the new base (at most
      `SNAPSHOT_RECORD_BYTES` of them: the base stops before the record that would pass it), and
      drops the segments before the base (`FileReplicaLog.compact`). A queue whose messages are
      all settled so keeps about one segment.
    * A new leader's queue (``takeover_state``) is the applied state, its messages' records read
      back, and the few entries after it folded: O(unsettled messages), not O(history).
    * A follower too far behind gets the leader's snapshot (RESET) and takes its state.
    * It keeps ``committed``, the commit mark (docs/replication.md, "The commit mark"): the
      highest index known committed *and* fsynced here (the leader's commit index, or a
      follower's ``committed_index``: min(leader's commit, durable here, matched with the
      leader)), rewritten with one pwrite whenever that rises, after the fsync of what it names,
      so it never leads what a majority holds; readers of the files (the Spark source) read a
      copy's entries up to its mark and no further.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES,
                 snapshot_record_bytes: int = SNAPSHOT_RECORD_BYTES, snapshot_every: int = SNAPSHOT_EVERY,
                 apply_batch: int = APPLY_BATCH) -> None:
        super().__init__(directory, segment_bytes=segment_bytes)
        self._snapshot_record_bytes = snapshot_record_bytes
        self._snapshot_every = snapshot_every
        self._apply_batch = apply_batch
        self._commit = 0
        self._apply_scheduled = False
        self._next_attempt = 0  # no compaction is tried before the applied index reaches this
        self.applied = QueueState(keep_records=False)
        self.applied_index = 0
        self._snapshot_state_index = 0
        self._carried: dict[int, tuple[int, int]] = {}  # seq -> (offset, length) in the snapshot's document
        self.last_takeover: TakeoverWork | None = None
        self._unfoldable = False  # a committed entry was not a queue record: see _apply_some
        if self.snapshot_index:
            self._take_document(self.snapshot().document)
        self._mark_fd: int | None = os.open(self.directory / QUEUE_MARK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        self.marked_index = self._open_mark()

    def _open_mark(self) -> int:
        """The mark left by the last run, if this log still holds what it names; else the file is
        emptied (nothing known committed here until the next commit): a replica that started
        empty (its log discarded) or lost a tail of fsynced entries (a damaged disk)."""
        assert self._mark_fd is not None
        data = os.pread(self._mark_fd, 64, 0)
        try:
            mark = decode_queue_commit_mark(str(self.directory / QUEUE_MARK_FILE), data)
        except UnsupportedReplicaFormat:
            mark = None  # (an older or newer build's: rewritten at the next commit)
        if mark is not None and not self.created_empty and mark.index <= self.last_index \
                and (mark.index <= self.snapshot_index or self.term_at(mark.index) == mark.term):
            return mark.index
        if data:
            os.ftruncate(self._mark_fd, 0)
        return 0

    def _write_mark(self) -> None:
        """Rewrite the mark if what is committed and durable here rose: one pwrite, never fsynced
        (whatever version a reader finds, even after a crash, names entries that were durable
        and committed when it was written)."""
        target = self._apply_target()
        if target <= self.marked_index or self._mark_fd is None:
            return
        os.pwrite(self._mark_fd, encode_queue_commit_mark(QueueCommitMark(target, self.term_at(target))), 0)
        self.marked_index = target

    def _take_document(self, document: bytes) -> None:
        self.applied, self.applied_index, self._carried = decode_snapshot_document(document)
        self._snapshot_state_index = self.applied_index

    # ---- following the commit index -----------------------------------------------------------

    def committed(self, index: int) -> None:
        if index > self._commit:
            self._commit = index
            self._apply_some()

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        super().sync_done(job, error)
        if self._commit > self.applied_index:  # the commit ran ahead of this replica's own fsync
            self._apply_some()

    def _apply_target(self) -> int:
        """How far the applied state may go: committed, and durable here."""
        return min(self._commit, self.durable_index, self.last_index)

    def _apply_some(self) -> None:
        self._apply_scheduled = False
        self._write_mark()
        if self._unfoldable:
            return
        target = self._apply_target()
        limit = min(target, self.applied_index + self._apply_batch)
        try:
            folded = self._fold(self.applied, self.applied_index, limit)
        except (ValueError, struct.error) as error:
            # Not a queue's records (the entries' own CRCs passed): nothing is compacted from
            # here on (a takeover meets the same entry and fails as a rebuild would).
            log.error("%s: a committed entry is not a queue record (%s); the log is no longer compacted",
                      self.directory, error)
            self._unfoldable = True
            return
        self.applied_index = max(self.applied_index, limit)
        if folded and self.applied_index >= self._next_attempt:
            self._maybe_compact()
        if self.applied_index < target and not self._apply_scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # (a test driving the log by hand calls apply_committed)
            self._apply_scheduled = True
            loop.call_soon(self._apply_some)

    def apply_committed(self) -> None:
        """Fold everything committed now, in one go (tests; a takeover needs none of it)."""
        while self.applied_index < self._apply_target():
            self._apply_some()

    def _fold(self, state: QueueState, after: int, last: int) -> int:
        """Fold entries after ``after`` up to ``last`` into ``state``; returns how many. (Entries
        this log holds were checked when they came: only their heads are read here.) The reads
        stop at ``last``: on a leader the entries after the commit index are still coming (the
        group commit's buffer), and reading them would flush that buffer early and read bytes
        that are folded only at a later commit."""
        index = after + 1
        folded = 0
        while index <= last:
            chunk, read_last = self.read_entries(index, 1024 * 1024, through=last)
            if not chunk:
                break
            view = memoryview(chunk)
            pos, size = 0, len(chunk)
            while pos < size:
                length, _, entry_index, _ = ENTRY_HEAD.unpack_from(chunk, pos)
                end = pos + 4 + length
                state.apply(view[pos + ENTRY_HEAD_SIZE:end], entry_index)
                pos = end
            folded += read_last - index + 1
            index = read_last + 1
        return folded

    # ---- compaction -----------------------------------------------------------------------------

    def _cut(self) -> int:
        """The highest base a snapshot of the applied state can have: the applied index, or
        before the first unsettled message whose record would take the snapshot's records past
        `SNAPSHOT_RECORD_BYTES`."""
        total = 0
        for index, length in self.applied.where.values():  # in seq order, which is log order
            if index > self.applied_index:
                break
            total += length
            if total > self._snapshot_record_bytes:
                return index - 1
        return self.applied_index

    def _maybe_compact(self) -> None:
        since = self.applied_index - self._snapshot_state_index
        if since < len(self.applied.held):
            return  # a snapshot walks every unsettled message: at most once per as many entries
        frees = self.segment_count > 1 and self._firsts[1] - 1 <= self.applied_index
        due = since >= self._snapshot_every
        if not (frees or due):
            return
        # Finding the cut walks the unsettled messages: not again before as many entries came.
        self._next_attempt = self.applied_index + max(1024, len(self.applied.held))
        cut = max(self._cut(), self.snapshot_index)
        if not (self.segment_count > 1 and self._firsts[1] - 1 <= cut) and not due:
            return
        document, carried = self._snapshot_document(cut)
        if len(document) > MAX_SNAPSHOT_DOCUMENT:
            log.warning("%s: a snapshot of %d unsettled messages would take %d bytes, over %d: not taken",
                        self.directory, len(self.applied.held), len(document), MAX_SNAPSHOT_DOCUMENT)
            return
        self.compact(cut, document)
        self._carried = carried
        self._snapshot_state_index = self.applied_index

    def _snapshot_document(self, cut: int) -> tuple[bytes, dict[int, tuple[int, int]]]:
        """The applied state, with the records of its messages at or below ``cut`` (and where
        in the document they are: `encode_snapshot_document`)."""
        records = {seq: self._record(seq, index, length)
                   for seq, (index, length) in self.applied.where.items() if index <= cut}
        return encode_snapshot_document(self.applied, self.applied_index, records)

    def _record(self, seq: int, index: int, length: int) -> bytes:
        """Message ``seq``'s record, entry ``index`` of the log (or carried by the snapshot)."""
        if index <= self.snapshot_index:
            offset, size = self._carried[seq]
            return self.snapshot().document[offset:offset + size]
        chunk, _ = self.read_entries(index, 0)
        return chunk[ENTRY_HEAD_SIZE:]

    def reset(self, base_index: int, base_term: int, base_position: int, document: bytes) -> None:
        """The leader's snapshot (RESET): its state becomes this replica's."""
        decode_snapshot_document(document)  # (ValueError before anything is replaced)
        super().reset(base_index, base_term, base_position, document)
        self._take_document(document)
        self._commit = max(self._commit, self.applied_index)
        self._next_attempt = 0
        self._write_mark()  # the base is committed, and durable now

    def close(self) -> None:
        super().close()
        if self._mark_fd is not None:
            os.close(self._mark_fd)
            self._mark_fd = None

    # ---- a new leader's queue -------------------------------------------------------------------

    def takeover_state(self) -> QueueState:
        """The queue as this log holds it, every entry included (committed or not): the applied
        state with its messages' records read back, then the entries after it folded."""
        if self.applied_index > self.last_index:
            raise RuntimeError(f"{self.directory}: the applied state ({self.applied_index}) is past the log's "
                               f"end ({self.last_index}): this replica cannot lead")
        applied = self.applied
        state = QueueState(next_seq=applied.next_seq, delivery_horizon=applied.delivery_horizon)
        read = 0
        for seq, (index, length) in applied.where.items():
            record = self._record(seq, index, length)
            read += len(record)
            state.restore(seq, applied.held[seq], applied.delivery_count.get(seq, 0), record=record)
        folded = 0
        for index, _, payload in self.entries(self.applied_index + 1):
            state.apply(payload, index)
            folded += 1
            read += len(payload) + ENTRY_HEAD_SIZE
        self.last_takeover = TakeoverWork(folded, len(applied.where), read)
        return state
