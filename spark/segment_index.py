"""One pass over a segment's records, with per-record work cut to the minimum: the record index.

``index_segment(data, header_length)`` walks the trusted records of a segment
(docs/queue-files.md section 4: damaged records skipped, the walk stopped where
recovery stops) and returns where every message record is and every state
record's fields, as numpy arrays. The only per-record Python work is reading
the length and checking the CRC (``segment_file.trusted_record_offsets``, which
gives exactly the records ``SegmentScan.records()`` gives, at about a third of
its cost; tests/test_spark_columnar.py checks this on damaged files); record
types and fields are then read for all records at once with numpy gathers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from persistence.record_format import LENGTH, RECORD_HEAD, STATE_FIELDS_AT, RecordType, min_state_payload
from persistence.segment_file import trusted_record_offsets
from spark.message_states import REASON_NAMES, StateEvents

_STATE_TYPES = np.array(sorted(int(t) for t in RecordType if t != RecordType.MESSAGE), np.uint8)
_MIN_PAYLOAD = np.zeros(256, np.int64)
for _t in _STATE_TYPES:
    _MIN_PAYLOAD[_t] = min_state_payload(int(_t))


class RecordIndex(NamedTuple):
    """The message records of a segment (payload start and end offsets, seq, publish time), in file
    order, out-of-order ones left out as recovery does, and the segment's state records."""

    starts: np.ndarray  # int64, offset of each message record's payload (after the type byte)
    ends: np.ndarray  # int64, offset just past each message record
    seqs: np.ndarray  # int64
    published_ms: np.ndarray  # int64
    events: StateEvents

    @property
    def nbytes(self) -> int:
        return self.starts.nbytes * 4 + self.events.nbytes


def record_spans(data: bytes, header_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) offsets of every trusted record, by the rules of docs/queue-files.md section 4
    (``segment_file.trusted_record_offsets``, the records ``SegmentScan.records`` gives)."""
    spans = np.array(trusted_record_offsets(data, header_length), np.int64)
    if not len(spans):
        return spans, spans
    d = np.frombuffer(data, np.uint8)
    return spans, spans + LENGTH.size + be_uint(d, spans, LENGTH.size)


def index_segment(data: bytes, header_length: int) -> RecordIndex:
    """The ``RecordIndex`` of the segment whose bytes are ``data``."""
    d = np.frombuffer(data, np.uint8)
    spans, ends = record_spans(data, header_length)
    types = d[spans + RECORD_HEAD.size - 1] if len(spans) else np.zeros(0, np.uint8)
    payloads = spans + RECORD_HEAD.size

    is_message = types == RecordType.MESSAGE
    m_start, m_end = payloads[is_message], ends[is_message]
    seqs = be_uint(d, m_start, 8)  # (a payload shorter than 16 bytes reads on, as recovery does)
    published = be_uint(d, m_start + 8, 8)
    if len(seqs):
        increasing = seqs > np.maximum.accumulate(np.concatenate(([-1], seqs[:-1])))
        if not increasing.all():  # out-of-order records are ignored, as by recovery
            m_start, m_end, seqs, published = m_start[increasing], m_end[increasing], seqs[increasing], published[increasing]

    is_state = np.isin(types, _STATE_TYPES)
    is_state &= ends - payloads >= _MIN_PAYLOAD[types]  # too short: ignored, as by recovery
    kind = types[is_state]
    p = payloads[is_state]
    n = len(p)
    count = np.zeros(n, np.int64)
    due = np.zeros(n, np.int64)
    reason = np.zeros(n, np.uint8)
    counted = (kind == RecordType.DELIVERED) | (kind == RecordType.REQUEUED) | (kind == RecordType.WAITING_RETRY)
    count[counted] = be_uint(d, p[counted] + STATE_FIELDS_AT, 4)  # delivery_count u32
    waiting = kind == RecordType.WAITING_RETRY
    due[waiting] = be_uint(d, p[waiting] + STATE_FIELDS_AT + 4, 8)  # then due_at_ms u64
    with_reason = (kind == RecordType.DROPPED) | (kind == RecordType.DEAD_LETTERED)
    codes = d[p[with_reason] + STATE_FIELDS_AT]
    reason[with_reason] = np.where(codes < len(REASON_NAMES), codes, 0)
    events = StateEvents(be_uint(d, p, 8), be_uint(d, p + 8, 8), kind.astype(np.uint8), count, due, reason)
    return RecordIndex(m_start, m_end, seqs, published, events)


def be_uint(d: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """The big-endian unsigned integers of ``width`` bytes at ``offsets`` of the byte array ``d``,
    as int64 (u64 values are below 2^63 by the format; others keep their bits). Bytes past the end
    of ``d`` read as 0."""
    if width == 1:
        if not len(d):
            return np.zeros(len(offsets), np.int64)
        return d[np.minimum(offsets, len(d) - 1)].astype(np.int64)
    last = len(d) - width  # the last offset a whole value can start at
    if last >= 0 and (not len(offsets) or offsets.max() <= last):
        # One gather of unaligned big-endian words: a view of every byte offset as a word.
        words = np.ndarray((last + 1,), f">u{width}", d, 0, (1,))
        return words[offsets].astype(np.int64)
    padded = np.concatenate((d, np.zeros(width, np.uint8)))
    return be_uint(padded, np.minimum(offsets, len(d)), width)
