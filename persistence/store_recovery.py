"""Reading a queue directory back after a restart or crash: what ``QueueStore.recover()``
returns (the queue's side, putting the messages back in it, is queues/queue_recovery.py).

``replay_segments`` walks every segment in order, rebuilds the compact index
(sequence number -> segment, offset) and each message's final state by
replaying the state records, cuts off a damaged tail (logging a warning), and
returns the messages still in the queue as a compact ``Recovery``.

What comes back, in sequence order:
  * messages whose last record is the message itself or ``requeued``: ready;
  * messages whose last record is ``delivered``: they were with a consumer
    when the broker stopped (``unacked_at_crash``); they are ready again;
  * messages whose last record is ``waiting_retry``: with their due time.
``redelivered`` is true when any ``delivered`` record was seen for the
message, so it is the flag to put on its next delivery. ``delivery_count``
is the count carried by the last delivered / requeued / waiting_retry record.
Messages with a settling record (acked, dropped, dead_lettered, expired) or
covered by a ``purged`` record are not returned.
"""

from __future__ import annotations

import logging
import os
from array import array
from pathlib import Path
from typing import Iterator, NamedTuple

from persistence.store_index import DELIVERED, READY, SETTLED, WAITING_RETRY, SegmentEntry, locate
from persistence.record_format import STATE_OF_TYPE, RecordType, min_state_payload, state_fields
from persistence.segment_file import (
    HEADER_SIZE,
    CorruptSegmentHeader,
    SegmentScan,
    cut_damaged_tail,
    list_segments,
)

log = logging.getLogger(__name__)

_EVER_DELIVERED = 4  # flag bit next to the 2-bit state in Recovery.flags
_STATE_MASK = 3
_MESSAGE = RecordType.MESSAGE
_SETTLING_TYPES = frozenset({RecordType.ACKED, RecordType.DROPPED, RecordType.DEAD_LETTERED, RecordType.EXPIRED})


class RecoveredMessage(NamedTuple):
    seq: int
    delivery_count: int
    redelivered: bool  # a delivery was recorded: deliver it with redelivered=true
    unacked_at_crash: bool  # last record was "delivered": a consumer held it when the broker stopped
    due_at_ms: int | None  # set for a message waiting for a delayed retry
    published_at_ms: int


class Recovery:
    """The messages still in a queue after recovery, kept as arrays (about 21 bytes a message)."""

    def __init__(self) -> None:
        self.seqs = array("Q")
        self.delivery_counts = array("I")
        self.body_sizes = array("I")
        self.published_at_ms = array("Q")
        self.flags = bytearray()
        self.due_at_ms: dict[int, int] = {}
        # The raw basic properties of the messages that carry an `expiration` (few, usually):
        # their TTL counts from publication, so a queue must know it without reading each body.
        self.expiring_properties: dict[int, bytes] = {}
        self.next_seq = 1  # the smallest sequence number the next message may use
        self.problems: list[str] = []  # one line per damaged record or file, also logged

    def __len__(self) -> int:
        return len(self.seqs)

    def rows(self) -> Iterator[tuple[int, int, int, int | None, int]]:
        """(seq, delivery_count, body_size, due_at_ms, published_at_ms) of each message, as plain
        tuples (recovering a long queue walks this). `delivery_count` is at least 1 for a
        message that was ever delivered, so it goes out redelivered; `due_at_ms` as in
        RecoveredMessage."""
        due = self.due_at_ms
        for seq, count, flag, size, published_at_ms in zip(
            self.seqs, self.delivery_counts, self.flags, self.body_sizes, self.published_at_ms
        ):
            if flag & _EVER_DELIVERED and not count:
                count = 1
            yield seq, count, size, due.get(seq) if flag & _STATE_MASK == WAITING_RETRY else None, published_at_ms

    def __iter__(self) -> Iterator[RecoveredMessage]:
        due = self.due_at_ms
        for seq, count, flag, published_at_ms in zip(self.seqs, self.delivery_counts, self.flags, self.published_at_ms):
            yield RecoveredMessage(
                seq,
                count,
                bool(flag & _EVER_DELIVERED),
                flag & _STATE_MASK == DELIVERED,
                due.get(seq) if flag & _STATE_MASK == WAITING_RETRY else None,
                published_at_ms,
            )


# Bit 8 of the first property-flags word (docs/queue-files.md §3.4): the message has an expiration.
_EXPIRATION_FLAG_IN_FIRST_BYTE = 0x01


def message_properties_span(data: bytes | memoryview, payload: int) -> tuple[int, int]:
    """Where the raw basic properties of the message record whose payload (after the type byte)
    starts at `payload` begin and end; the body length field follows them.

    Walks the record's length fields only (seq, time, exchange, routing key), so recovery
    learns what it needs of every message without copying any body.
    """
    pos = payload + 16  # sequence number and publish time
    pos += 1 + data[pos]  # exchange
    pos += 1 + data[pos]  # routing key
    start = pos + 4
    return start, start + int.from_bytes(data[pos:start])


def message_body_size(data: bytes | memoryview, payload: int) -> int:
    """The body length of the message record whose payload (after the type byte) starts at `payload`."""
    end = message_properties_span(data, payload)[1]
    return int.from_bytes(data[end : end + 4])


class ReplayResult(NamedTuple):
    segments: list[SegmentEntry]
    recovery: Recovery
    last_seq: int  # highest message sequence number seen (0 when none)
    highest_segment_id: int  # 0 when there was no segment file


def replay_segments(directory: Path) -> ReplayResult:
    """Rebuild the index and message states of the queue directory, repairing damaged tails."""
    return _Replay(directory).run()


def highest_message_seq(directory: Path) -> int:
    """The highest message sequence number in ``directory``'s last readable segment (0 if none); read-only."""
    for _, path in reversed(list_segments(directory)):
        try:
            scan = SegmentScan(path)
        except (CorruptSegmentHeader, OSError):
            continue
        highest = 0
        for record in scan.records():
            if record.record_type == _MESSAGE:
                highest = max(highest, int.from_bytes(scan.data[record.payload_start : record.payload_start + 8]))
        scan.close()
        return max(highest, parse_id(path) - 1)
    return 0


def parse_id(path: Path) -> int:
    return int(path.name[:20])


class _Replay:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.segments: list[SegmentEntry] = []
        self.ids: list[int] = []
        self.recovery = Recovery()
        self.last_seq = 0
        # Per segment during replay only: delivery counts, body sizes, publish times and flags,
        # parallel to entry.seqs.
        self.counts: dict[int, array[int]] = {}
        self.sizes: dict[int, array[int]] = {}
        self.published: dict[int, array[int]] = {}
        self.flags: dict[int, bytearray] = {}

    def run(self) -> ReplayResult:
        files = list_segments(self.directory)
        highest_id = files[-1][0] if files else 0
        for n, (segment_id, path) in enumerate(files):
            self._replay_file(segment_id, path, is_last=n == len(files) - 1)
        self._collect_survivors()
        return ReplayResult(self.segments, self.recovery, self.last_seq, highest_id)

    def _problem(self, text: str) -> None:
        log.warning("queue recovery: %s", text)
        self.recovery.problems.append(text)

    def _replay_file(self, segment_id: int, path: Path, is_last: bool) -> None:
        try:
            scan = SegmentScan(path)
        except CorruptSegmentHeader as err:
            self._set_aside(path, is_last, err)
            return
        if scan.header.segment_id != segment_id:
            self._problem(f"{path}: header says segment {scan.header.segment_id}; using the file name")
        entry = SegmentEntry(segment_id, path, scan.header.header_length, scan.size)
        self.segments.append(entry)
        self.ids.append(segment_id)
        counts = self.counts[segment_id] = array("I")
        sizes = self.sizes[segment_id] = array("I")
        published = self.published[segment_id] = array("Q")
        flags = self.flags[segment_id] = bytearray()
        expiring = self.recovery.expiring_properties
        data = scan.data
        for offset, rtype, payload, end in scan.records():
            if rtype == _MESSAGE:
                seq = int.from_bytes(data[payload : payload + 8])
                if seq <= self.last_seq:
                    self._problem(f"{path}: message {seq} at offset {offset} is out of order; ignored")
                    continue
                entry.add(seq, offset)
                counts.append(0)
                start, end = message_properties_span(data, payload)
                sizes.append(int.from_bytes(data[end : end + 4]))
                published.append(int.from_bytes(data[payload + 8 : payload + 16]))
                if end - start >= 2 and data[start] & _EXPIRATION_FLAG_IN_FIRST_BYTE:
                    expiring[seq] = bytes(data[start:end])
                flags.append(READY)
                self.last_seq = seq
            elif rtype in STATE_OF_TYPE:
                if end - payload < min_state_payload(rtype):
                    self._problem(f"{path}: state record at offset {offset} is too short; ignored")
                    continue
                self._apply_state(entry, rtype, state_fields(rtype, data, payload))
            # any other type: a record added later that this reader may skip
        for damage in scan.skipped:
            self._problem(f"{path}: damaged record at offset {damage.offset} ({damage.length} bytes): {damage.reason}")
        if scan.damage is not None:
            saved = cut_damaged_tail(path, scan.good_end)
            kept = f"; dropped bytes saved to {saved.name}" if saved else ""
            self._problem(
                f"{path}: {scan.damage.reason} at offset {scan.damage.offset}; truncated to {scan.good_end} bytes "
                f"({scan.damage.length} bytes dropped, {scan.record_count} good records kept){kept}"
            )
            entry.size = scan.good_end
        scan.close()

    def _set_aside(self, path: Path, is_last: bool, err: Exception) -> None:
        size = path.stat().st_size
        if is_last and size <= HEADER_SIZE:
            # A crash while creating the segment: it never held a record.
            self._problem(f"{err}; an unfinished new segment, removed")
            path.unlink()
            return
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        self._problem(f"{err}; the file was renamed to {aside.name} and its messages are not recovered")

    def _locate(self, seq: int) -> tuple[SegmentEntry, int] | None:
        return locate(self.segments, self.ids, seq)

    def _apply_state(self, current: SegmentEntry, rtype: int, fields: tuple[int, ...]) -> None:
        seq = fields[0]
        if rtype == RecordType.PURGED:
            self._apply_purge(current, seq)
            return
        found = self._locate(seq)
        if found is None:
            return  # its segment was deleted: the message was settled before
        entry, i = found
        if entry is not current:
            current.refs.add(entry.segment_id)
        if entry.states[i] == SETTLED:
            return
        if rtype in _SETTLING_TYPES:
            entry.settle(i)
            self.recovery.due_at_ms.pop(seq, None)
            self.recovery.expiring_properties.pop(seq, None)
            return
        flags = self.flags[entry.segment_id]
        self.counts[entry.segment_id][i] = fields[2]
        if rtype == RecordType.DELIVERED:
            entry.states[i] = DELIVERED
            flags[i] = DELIVERED | _EVER_DELIVERED
        elif rtype == RecordType.REQUEUED:
            entry.states[i] = READY
            flags[i] = READY | (flags[i] & _EVER_DELIVERED)
        elif rtype == RecordType.WAITING_RETRY:
            entry.states[i] = WAITING_RETRY
            flags[i] = WAITING_RETRY | (flags[i] & _EVER_DELIVERED)
            self.recovery.due_at_ms[seq] = fields[3]

    def _apply_purge(self, current: SegmentEntry, up_to_seq: int) -> None:
        for entry in self.segments:
            if entry is not current:
                current.refs.add(entry.segment_id)
            states = entry.states
            for i, seq in enumerate(entry.seqs):
                if seq > up_to_seq:
                    break
                if states[i] in (READY, WAITING_RETRY):
                    entry.settle(i)
                    self.recovery.due_at_ms.pop(seq, None)
                    self.recovery.expiring_properties.pop(seq, None)

    def _collect_survivors(self) -> None:
        recovery = self.recovery
        for entry in self.segments:
            counts, flags = self.counts.pop(entry.segment_id), self.flags.pop(entry.segment_id)
            sizes = self.sizes.pop(entry.segment_id)
            published = self.published.pop(entry.segment_id)
            # Nobody holds a message after a restart: what was delivered is ready again.
            entry.states = entry.states.replace(bytes([DELIVERED]), bytes([READY]))
            if entry.live == len(entry.seqs):
                recovery.seqs.extend(entry.seqs)
                recovery.delivery_counts.extend(counts)
                recovery.body_sizes.extend(sizes)
                recovery.published_at_ms.extend(published)
                recovery.flags.extend(flags)
                continue
            for i, state in enumerate(entry.states):
                if state != SETTLED:
                    recovery.seqs.append(entry.seqs[i])
                    recovery.delivery_counts.append(counts[i])
                    recovery.body_sizes.append(sizes[i])
                    recovery.published_at_ms.append(published[i])
                    recovery.flags.append(flags[i])
        recovery.next_seq = self.last_seq + 1
