"""A replicated stream's log: the stream's own segment files are its replication log.

A stream (`x-queue-type: stream`) on a cluster is replicated with the protocol of the quorum
queues (leader, followers, majority-fsynced commit index, elections in the coordination
service: docs/replication.md), but its log is not a second file beside the stream: entry *i* of
its replication log is either

* the **message at a stream offset**: the record the leader encoded, kept in the stream's
  segment files byte for byte (``StreamLog.append_record``), so every copy holds the same
  records at the same offsets, in the same chunks and segments; or
* a **control entry**, rare, kept in this replica's control file: the empty no-op a new leader
  appends first (committing it commits what it inherited), a CONFIG (the segment size the
  stream rolls over at from there on, so every copy rolls its segments at the same records),
  or a RETAIN (retention, decided by the leader: the segments before an offset go, on every
  copy, once the entry is committed).

The control file says where each control entry sits among the messages: (index, term, offset,
payload), *offset* being the number of messages before it. Its first record is the **base**:
the entry the log goes on after, (0, 0, 0) for a new log, or what a RESET named (the leader no
longer stored what this copy lacked). Every message takes the term of the control entry before
it, which is its leader's no-op (a leader appends its messages after its no-op), so terms need
no storage per message. The index of message *o*, and the offset of entry *i*, come from one
bisection over the control entries.

Durability: control entries are written and fsynced when appended (they are few: one per
election, per segment-size change, per retention step), and one whose write fails (a full
disk) is cut off the file again, so no torn record hides the entries written after it;
messages are fsynced by the group committer's rounds (`prepare_sync` is the stream's).
`durable_index` covers a control entry
only once every message before it is durable. A crash leaves a prefix of the log: at opening,
control entries placed after messages that did not survive are dropped, and a reset that was
cut short is done again. A truncation (`truncate_after`: a suffix the leader does not have)
cuts the stream first, durably, then rewrites the control file; a crash between the two leaves
entries the leader will find not matching and truncate again.

Readers (the broker's consumers on the leader) see committed records only: the stream is
opened committed by its owner (`StreamLog` with ``external_commit``), and the replica tells
this log its commit index (`committed`), which sets how far the stream's records are readable
and how far its publishers' confirms may go (`StreamLog.commit_to`).

Besides the log, the stream's tracked consumer offsets (server-side offset tracking) travel in
STATE frames: the leader sends its whole table to each follower when it changes and when the
follower connects, and the follower keeps it in its own consumer-offsets file. They are not
waited for, as an ack is not: after a failover a consumer resumes at the offset its new leader
last heard, never later than the one it acked (nothing is skipped; a few messages may come
again). docs/replication.md ("Streams") and docs/stream-files.md describe the files.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from cluster.replication.entries import HEAD_SIZE as ENTRY_HEAD_SIZE
from cluster.replication.entries import EntryHead, encode_entry
from persistence.atomic_file import write_atomically
from persistence.group_commit import GroupCommitter, SyncJob
from persistence.stream_log import DEFAULT_MAX_SEGMENT_BYTES, StreamLog

log = logging.getLogger(__name__)

CONTROL_FILE = "stream-control.log"
TERM_FILE = "term.json"
STREAM_DIR = "stream"
MAGIC = b"AMQPRCTL"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sHHI")  # magic, version, reserved, crc of the 12 bytes before it
_RECORD = struct.Struct(">IIQQQ")  # length (of what follows it), crc (of what follows the crc), index, term, offset
_U64 = struct.Struct(">Q")

# A control payload starts with four zero bytes, which no stream record does (its length field
# is never 0), then its kind. The no-op is the empty payload, as LeaderReplication.start_term makes it.
_MARK = b"\0\0\0\0"
KIND_CONFIG = b"C"  # u64: the segment size the stream rolls over at from here on
KIND_RETAIN = b"R"  # u64: the first offset kept; the segments wholly before it go once committed
KIND_BASE = b"B"  # the control file's first record only: the entry the log goes on after


def config_payload(max_segment_bytes: int) -> bytes:
    return _MARK + KIND_CONFIG + _U64.pack(max_segment_bytes)


def retain_payload(first_kept: int) -> bytes:
    return _MARK + KIND_RETAIN + _U64.pack(first_kept)


_BASE_PAYLOAD = _MARK + KIND_BASE


def is_control(payload: bytes | memoryview) -> bool:
    return not payload or bytes(payload[:4]) == _MARK


def _value(payload: bytes, kind: bytes) -> int | None:
    if len(payload) == 13 and payload[:5] == _MARK + kind:
        value: int = _U64.unpack_from(payload, 5)[0]
        return value
    return None


class Control(NamedTuple):
    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)
    term: int
    offset: int  # messages before it: the stream's next offset when it was appended
    payload: bytes


def _encode_control(control: Control) -> bytes:
    body = struct.pack(">QQQ", control.index, control.term, control.offset) + control.payload
    return struct.pack(">II", 4 + len(body), zlib.crc32(body)) + body


def _header() -> bytes:
    head = struct.pack(">8sHH", MAGIC, FORMAT_VERSION, 0)
    return head + struct.pack(">I", zlib.crc32(head))


def _decode_controls(path: Path, data: bytes) -> tuple[list[Control], int]:
    """The controls of a control file and where the trusted ones end (a torn tail is dropped)."""
    if len(data) < _HEADER.size:
        return [], 0
    magic, version, _, crc = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or zlib.crc32(data[:12]) != crc:
        raise ValueError(f"{path} is not a stream control file")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} is in format {version}; this build reads {FORMAT_VERSION}")
    controls: list[Control] = []
    pos = _HEADER.size
    while len(data) - pos >= _RECORD.size:
        length, crc, index, term, offset = _RECORD.unpack_from(data, pos)
        end = pos + 4 + length
        if length < _RECORD.size - 4 or end > len(data) or zlib.crc32(data[pos + 8:end]) != crc:
            break
        controls.append(Control(index, term, offset, data[pos + _RECORD.size:end]))
        pos = end
    return controls, pos


class StreamReplicaLog:
    """The `ReplicaStore` of a replicated stream, over ``directory/stream`` (the stream's files)
    and ``directory``'s control and term files; see the module docstring."""

    def __init__(self, directory: Path, stream: StreamLog) -> None:
        """Use ``open()``."""
        self.directory = Path(directory)
        self.stream = stream
        self._path = self.directory / CONTROL_FILE
        self._controls: list[Control] = []
        self._c_index: list[int] = []
        self._c_offset: list[int] = []
        self._c_term: list[int] = []
        self._fd = -1
        self._promised = 0
        self.created_empty = False
        self._news: Callable[[], None] | None = None
        self._retain_asked = 0  # the highest RETAIN appended here
        self._retain_applied = 0  # controls before this position were looked at for RETAINs committed
        self._retain_to = 0  # the highest RETAIN committed: segments before it go
        self._torn = False  # a failed write may have left bytes after the last control record

    @classmethod
    def open(cls, directory: Path, vhost: str, name: str, committer: GroupCommitter | None) -> "StreamReplicaLog":
        """The replica of stream ``name`` of ``vhost`` kept in ``directory`` (made if missing);
        ``committer`` makes its consumer offsets durable (None: tools and tests sync by hand)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        holder: list[StreamReplicaLog] = []
        stream = StreamLog.open(
            directory / STREAM_DIR, vhost, name, committer=committer, external_commit=True,
            on_retention=lambda first_kept: holder[0]._retention_wanted(first_kept))
        replica_log = cls(directory, stream)
        holder.append(replica_log)
        replica_log._load()
        return replica_log

    # ---- opening ---------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            self._promised = int(json.loads((self.directory / TERM_FILE).read_text())["promised_term"])
        except FileNotFoundError:
            pass
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            data = b""
        controls, good_end = _decode_controls(self._path, data)
        if not controls:
            self.created_empty = True
            if self.stream.appended_offset or self.stream.segments():
                # Records without a control file (it was lost): they are nobody's entries.
                self.stream.reset(0)
            self._rewrite([Control(0, 0, 0, _BASE_PAYLOAD)])
        else:
            base = controls[0]
            stream = self.stream
            end = stream.appended_offset
            segments = stream.segments()
            if end < base.offset or (segments and segments[0].segment_id < base.offset):
                log.warning("%s: a reset to offset %d was cut short; doing it again", self.directory, base.offset)
                stream.reset(base.offset)
                end = base.offset
            kept = [c for c in controls if c.offset <= end]
            if len(kept) != len(controls) or good_end != len(data):
                # Control entries after messages lost in a crash (or a torn last write): not ours.
                self._rewrite(kept)
                controls = kept
            else:
                self._set_controls(controls)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._promised = max(self._promised, self.last_term)
        for control in self._controls:
            self._took(control)
        self.stream.offsets.notify_changes(self._told)

    def _set_controls(self, controls: list[Control]) -> None:
        self._controls = list(controls)
        self._c_index = [c.index for c in controls]
        self._c_offset = [c.offset for c in controls]
        self._c_term = [c.term for c in controls]
        self._retain_applied = min(self._retain_applied, len(controls))

    def _rewrite(self, controls: list[Control]) -> None:
        """Replace the control file by ``controls`` (atomically, durably)."""
        write_atomically(self._path, _header() + b"".join(_encode_control(c) for c in controls))
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._set_controls(controls)

    # ---- the index space -----------------------------------------------------------------------

    @property
    def base(self) -> Control:
        return self._controls[0]

    def _index_of(self, offset: int) -> int:
        """The index message ``offset`` has (or will have)."""
        k = bisect_right(self._c_offset, offset) - 1
        c = self._controls[max(k, 0)]
        return c.index + 1 + (offset - c.offset)

    def position_after(self, index: int) -> int:
        """The next stream offset after entry ``index``: the messages at or before it."""
        k = bisect_right(self._c_index, index) - 1
        c = self._controls[max(k, 0)]
        return c.offset + (index - c.index)

    @property
    def last_index(self) -> int:
        return self._index_of(self.stream.appended_offset) - 1

    @property
    def last_term(self) -> int:
        return self.term_at(self.last_index)

    @property
    def durable_index(self) -> int:
        return self._index_of(self.stream.durable_offset) - 1

    @property
    def promised_term(self) -> int:
        return self._promised

    follows_commits = True  # followers make records readable, and apply retention, at the commit index

    @property
    def first_index(self) -> int:
        first_offset = self.stream.first_offset
        candidate = self._index_of(first_offset)
        k = bisect_left(self._c_offset, first_offset)
        if k < len(self._controls):
            candidate = min(candidate, self._controls[k].index)
        return max(candidate, self.base.index + 1)

    def term_at(self, index: int) -> int:
        if index == 0:
            return 0
        k = bisect_right(self._c_index, index) - 1
        return self._controls[max(k, 0)].term

    def first_index_of_term(self, term: int) -> int:
        k = bisect_left(self._c_term, term)
        if k == len(self._controls):
            return self.last_index + 1
        c = self._controls[k]
        return max(c.index + (1 if k == 0 else 0), self.base.index + 1)

    # ---- writing ---------------------------------------------------------------------------------

    def append(self, term: int, payload: bytes) -> int:
        """An entry written here as leader: a control entry (the no-op, CONFIG, RETAIN), or a
        message record (the broker appends those to the stream itself)."""
        if payload and not is_control(payload):
            self.stream.append_record(payload)
        else:
            self._add_controls([(term, bytes(payload))])
            self._tell()
        return self.last_index

    def _add_controls(self, items: list[tuple[int, bytes]]) -> None:
        """Append control entries after everything appended (written and fsynced now)."""
        offset = self.stream.appended_offset
        index = self.last_index
        added = []
        for term, payload in items:
            index += 1
            added.append(Control(index, term, offset, payload))
        data = b"".join(_encode_control(c) for c in added)
        if self._torn:
            self._rewrite(self._controls)  # (the torn bytes of a failed write go first)
            self._torn = False
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fsync(self._fd)  # rare (elections, segment-size changes, retention steps), and needed before anything after it
        except OSError:
            # A write a full disk cut short must leave no torn record behind: the next control
            # entry would follow it, and opening the file drops everything after a torn record
            # (the index space of every message after it would shift).
            try:
                os.ftruncate(self._fd, end)
            except OSError:
                self._torn = True
            raise
        for control in added:
            self._controls.append(control)
            self._c_index.append(control.index)
            self._c_offset.append(control.offset)
            self._c_term.append(control.term)
            self._took(control)

    def _took(self, control: Control) -> None:
        """A control entry is in the log: a CONFIG applies from here on (every copy rolls its
        segments at the same records); a RETAIN waits to be committed."""
        size = _value(control.payload, KIND_CONFIG)
        if size is None:
            size = _value(control.payload, KIND_BASE)  # (a reset's base names the size in force there)
        if size is not None:
            self.stream.set_max_segment_bytes(size)
        retain = _value(control.payload, KIND_RETAIN)
        if retain is not None:
            self._retain_asked = max(self._retain_asked, retain)

    def append_entries(self, data: bytes, heads: list[EntryHead]) -> None:
        """Entries from the leader: messages to the stream as they are, control entries to the
        control file (consecutive ones in one write)."""
        view = memoryview(data)
        controls: list[tuple[int, bytes]] = []
        expected = self.last_index + 1
        for head in heads:
            if head.index != expected:
                raise ValueError(f"entries start at {head.index}, the log ends at {expected - 1}")
            expected += 1
            payload = view[head.start + ENTRY_HEAD_SIZE:head.end]
            if is_control(payload):
                controls.append((head.term, bytes(payload)))
                continue
            if controls:
                self._add_controls(controls)
                controls = []
            if head.term != self._c_term[-1]:
                raise ValueError(f"entry {head.index}: a message of term {head.term} after a control entry of "
                                 f"term {self._c_term[-1]}")
            self.stream.append_record(payload)
        if controls:
            self._add_controls(controls)

    def truncate_after(self, index: int) -> None:
        if index >= self.last_index:
            return
        cut = self.position_after(index)
        self.stream.truncate(cut)  # first, and durably: see the module docstring
        kept = [c for c in self._controls if c.index <= index]
        if len(kept) != len(self._controls):
            self._rewrite(kept)
            size = self._segment_size_at(len(kept) - 1)
            self.stream.set_max_segment_bytes(DEFAULT_MAX_SEGMENT_BYTES if size is None else size)
            self._retain_asked = max([_value(c.payload, KIND_RETAIN) or 0 for c in kept], default=0)

    def reset_point(self, index: int) -> tuple[int, bytes]:
        """After entry ``index``: the stream's next offset, and the segment size in force there
        (the last CONFIG before it), which a copy reset there rolls at until the next CONFIG."""
        k = bisect_right(self._c_index, index) - 1
        size = self._segment_size_at(max(k, 0))
        return self.position_after(index), b"" if size is None else _U64.pack(size)

    def _segment_size_at(self, k: int) -> int | None:
        """The segment size the control entries up to position ``k`` set (None: the default)."""
        for control in reversed(self._controls[:k + 1]):
            size = _value(control.payload, KIND_CONFIG)
            if size is None:
                size = _value(control.payload, KIND_BASE)
            if size is not None:
                return size
        return None

    def reset(self, base_index: int, base_term: int, base_position: int, document: bytes) -> None:
        """RESET: the log goes on after the leader's entry ``base_index``; the stream, emptied,
        at offset ``base_position``, rolling its segments at the size ``document`` names (8
        bytes; empty: the default). Consumer offsets stay (STATE keeps them current)."""
        if document and len(document) != 8:
            raise ValueError(f"a stream's RESET document is a segment size (8 bytes), got {len(document)}")
        base = Control(base_index, base_term, base_position, _BASE_PAYLOAD + document)
        self._rewrite([base])  # first: an open that finds the stream not reset does it (_load)
        self.stream.reset(base_position)
        self.stream.set_max_segment_bytes(DEFAULT_MAX_SEGMENT_BYTES)
        self._took(base)
        self._retain_asked = self._retain_to = 0
        self._retain_applied = 1
        log.info("%s: reset to go on after entry %d (term %d) at offset %d", self.directory, base_index, base_term,
                 base_position)

    def promise(self, term: int) -> None:
        if term <= self._promised:
            return
        write_atomically(self.directory / TERM_FILE, json.dumps({"promised_term": term}).encode())
        self._promised = term

    # ---- reading ---------------------------------------------------------------------------------

    def read_entries(self, first_index: int, max_bytes: int) -> tuple[bytes, int]:
        last_index = self.last_index
        if not self.first_index <= first_index <= last_index:
            return b"", first_index - 1
        out: list[bytes] = []
        size = 0
        index = first_index
        while index <= last_index and (not out or size < max_bytes):
            k = bisect_right(self._c_index, index) - 1
            control = self._controls[k]
            if control.index == index:
                entry = encode_entry(index, control.term, control.payload)
                out.append(entry)
                size += len(entry)
                index += 1
                continue
            offset = control.offset + (index - control.index - 1)
            until = self._c_offset[k + 1] if k + 1 < len(self._controls) else self.stream.appended_offset
            records = self.stream.read_records(offset, until, max(max_bytes - size, 1))
            if not records:
                break
            for record in records:
                entry = encode_entry(index, control.term, record)
                out.append(entry)
                size += len(entry)
                index += 1
        return b"".join(out), index - 1

    # ---- the commit index, retention ---------------------------------------------------------------

    def committed(self, index: int) -> None:
        """Records up to entry ``index`` are committed: readable, confirmed; RETAINs up to it apply."""
        index = min(index, self.last_index)
        if index <= self.base.index:
            return
        self.stream.commit_to(self.position_after(index))
        k = self._retain_applied
        controls = self._controls
        while k < len(controls) and controls[k].index <= index:
            retain = _value(controls[k].payload, KIND_RETAIN)
            if retain is not None:
                self._retain_to = max(self._retain_to, retain)
            k += 1
        self._retain_applied = k
        if self._retain_to:
            self.stream.drop_segments_before(self._retain_to)

    def _retention_wanted(self, first_kept: int) -> None:
        """The leader's stream would drop the segments before ``first_kept``: it goes in the log,
        and every copy drops them once committed."""
        if first_kept > self._retain_asked and self.stream.writable:
            try:
                self._add_controls([(self._c_term[-1], retain_payload(first_kept))])
            except OSError as error:
                # (Called from the stream's append and commit: a full disk must fail neither.
                # The segments stay until a later step, the next roll-over, logs it.)
                log.warning("%s: retention to offset %d waits: %s", self.directory, first_kept, error)
                return
            self._tell()

    def set_segment_size(self, max_segment_bytes: int) -> bool:
        """As leader: roll segments at ``max_segment_bytes`` from here on, on every copy (a
        CONFIG entry); False when it already does."""
        if self.stream.max_segment_bytes == max_segment_bytes:
            return False
        self._add_controls([(self._c_term[-1], config_payload(max_segment_bytes))])
        self._tell()
        return True

    # ---- state beside the log: the tracked consumer offsets -------------------------------------------

    @property
    def state_generation(self) -> int:
        return self.stream.offsets.generation + 1  # never 0: a new follower always gets the table

    def state_document(self) -> bytes:
        return json.dumps({"offsets": self.stream.offsets.items()}, separators=(",", ":")).encode()

    def apply_state(self, document: bytes) -> None:
        try:
            offsets = json.loads(document)["offsets"]
            table = {str(name): int(value) for name, value in offsets.items() if int(value) >= 0}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("%s: ignoring an unreadable STATE frame: %s", self.directory, error)
            return
        self.stream.offsets.replace(table)

    def on_news(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when there is something new to send: entries the broker appended to
        the stream itself (called for each: the replica's hook is a flag check), a control
        entry, or the consumer offsets."""
        self._news = callback
        self.stream.notify_appended(callback)

    def _told(self) -> None:
        self._tell()

    def _tell(self) -> None:
        if self._news is not None:
            self._news()

    # ---- group commit (Syncable) -------------------------------------------------------------------

    def flush(self) -> None:
        self.stream.flush()

    def prepare_sync(self) -> SyncJob:
        return self.stream.prepare_sync()

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        self.stream.sync_done(job, error)

    def close(self) -> None:
        self.stream.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
