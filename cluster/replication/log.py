"""A queue replica's log on disk: `ReplicaLog`, the interface the state machines use, and
`FileReplicaLog`: segment files of entries (`entries`), a snapshot standing for the entries
compacted away, and the term this replica has promised.

The directory (docs/replication.md, "On disk"):

    replica.log                     the format marker: magic, version 2 (a version 1 file held the
                                    whole log; opening one makes it the first segment)
    segment-<first index>.log       a header (magic AMQPRSEG, version, first index, CRC), then
                                    entries first, first + 1, ...; rolled at ``segment_bytes``
    snapshot                        the log's base: index and term of the last entry compacted
                                    away, and its owner's document (for a queue: the state of its
                                    unsettled messages, cluster/replication/queue_log.py)
    term.json                       the promised term

Promises of `FileReplicaLog`:
  * Entries are numbered with no gaps, from ``first_index`` (1, or after the snapshot) on;
    ``term_at(i)`` never decreases with ``i``.
  * ``durable_index`` is the highest index whose entry, and every one before it, is fsynced.
    It rises only in ``sync_done`` (the group committer's round), in ``compact`` and ``reset``,
    and falls only when ``truncate_after`` cuts entries. Records reach the OS at the latest at
    the next ``flush``.
  * ``compact(index, document)`` writes the snapshot by atomic replace (fsynced) before it
    removes a segment, and only removes segments holding nothing after ``index``; the caller
    passes only committed, durable entries (Raft's rule: an entry not committed is never
    dropped). A crash between the two leaves segments below the base, removed at the next open.
  * ``promise(term)`` is fsynced before it returns: after a crash the replica still refuses
    every older term (``promised_term`` is also never below the last entry's term).
  * Opening drops a torn or damaged tail (logged), and the segments after it; entries before
    it are kept. A damaged snapshot (only a damaged disk can make one: it is replaced
    atomically) discards the log: the replica starts empty (``created_empty``) and is copied
    again from its leader.
  * Not thread-safe: event loop only. It implements the group committer's Syncable protocol.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import struct
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from cluster.replication.entries import HEAD_SIZE as ENTRY_HEAD_SIZE
from cluster.replication.entries import MAX_PAYLOAD, EntryHead, encode_entry, scan_entries
from persistence.atomic_file import fsync_directory, write_all, write_atomically
from persistence.group_commit import SyncJob
from persistence.replica_files import QUEUE_LOG_FILE as LOG_FILE
from persistence.replica_files import QUEUE_SNAPSHOT_FILE as SNAPSHOT_FILE
from persistence.replica_files import SEGMENT_HEAD as _SEGMENT_HEAD
from persistence.replica_files import (
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    SEGMENT_VERSION,
    TERM_FILE,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    queue_log_segments,
)
from persistence.replica_files import encode_segment_header as _segment_header
from persistence.replica_files import segment_name as _segment_name

log = logging.getLogger(__name__)

# The files' names and the segments' and snapshot's formats are persistence.replica_files's
# (their one definition: the Spark data source reads them there); replica.log's marker is this writer's.
MAGIC = b"AMQPRLOG"
_HEADER = struct.Struct(">8sHHI")  # magic, version, reserved, crc of the 12 bytes before it
HEADER_SIZE = _HEADER.size
FORMAT_VERSION = 2  # 1: the entries in replica.log itself; 2: in segments, with a snapshot
SEGMENT_BYTES = 16 * 1024 * 1024
_READ_BLOCK = 8 * 1024 * 1024


class ReplicaLog(Protocol):
    """What the leader and follower state machines need of a replica's storage."""

    @property
    def last_index(self) -> int: ...
    @property
    def last_term(self) -> int: ...
    @property
    def durable_index(self) -> int: ...
    @property
    def promised_term(self) -> int: ...

    def term_at(self, index: int) -> int:
        """The term of entry ``index``; 0 for index 0 (before the first entry)."""
        ...

    def append(self, term: int, payload: bytes) -> int:
        """Append one entry written by this replica as leader; returns its index."""
        ...

    def append_entries(self, data: bytes, heads: list[EntryHead]) -> None:
        """Append entries received from the leader, verbatim; ``heads`` (from scan_entries)
        continue at ``last_index + 1``."""
        ...

    def truncate_after(self, index: int) -> None:
        """Remove every entry after ``index``."""
        ...

    def read_entries(self, first_index: int, max_bytes: int) -> tuple[bytes, int]:
        """Entries from ``first_index`` on, as stored (at least one, about ``max_bytes``), and
        the index of the last one; (b"", first_index - 1) past the end."""
        ...

    def first_index_of_term(self, term: int) -> int:
        """The lowest index whose term is ``term`` or more (last_index + 1 if none)."""
        ...

    def promise(self, term: int) -> None:
        """Never accept a term below ``term`` again (durably)."""
        ...

    @property
    def follows_commits(self) -> bool:
        """Followers of this log act on the commit index (a stream makes its records readable
        and applies retention there): the leader tells them each time it moves, in an empty
        APPEND if there is nothing to send."""
        ...

    @property
    def first_index(self) -> int:
        """The first entry this log still stores (1 unless the log drops its oldest entries, as a
        stream's retention and a queue's compaction do); a follower that needs an earlier one is
        sent RESET."""
        ...

    def reset_point(self, index: int) -> tuple[int, bytes]:
        """For RESET after entry ``index``: where the log's own storage goes on after it (a
        stream: the next offset) and a document of what else a copy needs to go on from there."""
        ...

    def reset(self, base_index: int, base_term: int, base_position: int, document: bytes) -> None:
        """Drop every entry: the log goes on after entry ``base_index`` of ``base_term``, which it
        does not store, as ``reset_point`` described it (RESET); durable when it returns.
        NotImplementedError: this log cannot."""
        ...


class ReplicaStore(ReplicaLog, Protocol):
    """What a replica's shell (`QueueReplica`) needs of its log: the state machines' `ReplicaLog`,
    the group committer's Syncable, and the hooks a log that is also a state machine (a stream,
    cluster/replication/stream_replica_log.py) uses to follow the commit index and to carry
    state beside the log (STATE frames)."""

    @property
    def created_empty(self) -> bool:
        """This replica started with no log at all (new, or its disk was wiped)."""
        ...

    @property
    def state_generation(self) -> int:
        """Bumped whenever the state carried beside the log changes (0: it has none)."""
        ...

    def state_document(self) -> bytes:
        """That state, whole, for a STATE frame."""
        ...

    def apply_state(self, document: bytes) -> None:
        """The leader's state (a STATE frame): take it."""
        ...

    def on_news(self, callback: "Callable[[], None]") -> None:
        """Call ``callback()`` whenever there is something new to send that did not come through
        ``append``: entries its owner added (a stream's publishes), or a new state."""
        ...

    def committed(self, index: int) -> None:
        """The commit index known here reached ``index`` (a leader's own, or a follower's: what
        its leader said, within what it has fsynced)."""
        ...

    def flush(self) -> None: ...

    def prepare_sync(self) -> SyncJob: ...

    def sync_done(self, job: SyncJob, error: OSError | None) -> None: ...

    def close(self) -> None: ...


class _Segment:
    """One file of the log: entries ``first``, ``first + 1``, ... after a header."""

    __slots__ = ("first", "path", "fd", "size")

    def __init__(self, first: int, path: Path, fd: int, size: int) -> None:
        self.first = first
        self.path = path
        self.fd = fd
        self.size = size  # bytes in the file

    def wrote(self, count: int) -> None:
        """``count`` more bytes reached the file."""
        self.size += count

    def cut(self, size: int) -> None:
        """Truncate the file to ``size`` bytes."""
        os.ftruncate(self.fd, size)
        self.size = size


def _marker(version: int = FORMAT_VERSION) -> bytes:
    head = struct.pack(">8sHH", MAGIC, version, 0)
    return head + struct.pack(">I", zlib.crc32(head))


def _damaged_at_start(data: bytes) -> bool:
    """True when ``data`` starts with an entry that is whole (or impossibly long) yet failed the
    scan: reading further cannot repair it."""
    if len(data) < 4:
        return False
    length: int  # (struct's fields are Any to mypy)
    (length,) = struct.unpack_from(">I", data)
    return 4 + length <= len(data) or length > MAX_PAYLOAD + ENTRY_HEAD_SIZE


class FileReplicaLog:
    """`ReplicaLog` in segment files, a snapshot and ``term.json`` under ``directory``; see the
    module docstring. ``segment_bytes``: a segment is rolled once it holds this much."""

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []  # oldest first; the last is the one appended to
        self._firsts: list[int] = []  # each segment's first index (bisect)
        self._offset = 0  # entries before the first one held in the arrays (first held: _offset + 1)
        self._starts = array("Q")  # byte offset, in its segment, of entry _offset + 1 + k at [k]
        self._terms = array("Q")  # term of entry _offset + 1 + k at [k]
        self._buffer = bytearray()  # appended to the last segment, not yet written to its file
        self._unsynced: set[int] = set()  # fds of earlier segments whose bytes are not all fsynced yet
        self._names_changed = False  # a segment was made or removed since the last prepare_sync
        self._durable_index = 0
        self._cut_during_round: int | None = None  # lowest truncation since the last prepare_sync
        self._base = Snapshot(0, 0, b"")
        self._promised = self._read_promise()
        # True when this replica started with no log at all: new, or its disk was wiped.
        self.created_empty = False
        self._open()
        self._promised = max(self._promised, self.last_term)

    # ---- opening -----------------------------------------------------------------------

    def _read_promise(self) -> int:
        try:
            return int(json.loads((self.directory / TERM_FILE).read_text())["promised_term"])
        except FileNotFoundError:
            return 0

    def _open(self) -> None:
        for leftover in self.directory.glob(".*.tmp"):  # a crash during an atomic replace
            leftover.unlink(missing_ok=True)
        marker = self.directory / LOG_FILE
        try:
            header = marker.read_bytes()[:HEADER_SIZE]
        except FileNotFoundError:
            header = b""
        if len(header) < HEADER_SIZE and not self._segment_files():  # new, or a crash while creating it
            self.created_empty = True
            write_atomically(self.directory / TERM_FILE, json.dumps({"promised_term": self._promised}).encode())
            self._new_segment(1, durably=True)
            write_atomically(marker, _marker())
            return
        if len(header) == HEADER_SIZE:
            magic, version, _, crc = _HEADER.unpack(header)
            if magic != MAGIC or zlib.crc32(header[:12]) != crc:
                raise ValueError(f"{marker} is not a replica log")
            if version == 1:  # format 1: the whole log in this one file; it becomes the first segment
                os.replace(marker, self.directory / _segment_name(1))
                fsync_directory(self.directory)
            elif version != FORMAT_VERSION:
                raise ValueError(f"{marker} is in format {version}; this build reads {FORMAT_VERSION}")
        self._read_snapshot()
        self._recover()
        if not marker.exists() or len(header) < HEADER_SIZE or header != _marker():
            write_atomically(marker, _marker())

    def _segment_files(self) -> list[tuple[int, Path]]:
        return queue_log_segments(self.directory)

    def _read_snapshot(self) -> None:
        path = self.directory / SNAPSHOT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        try:
            self._base = decode_snapshot(data)
        except ValueError as error:
            # Written by atomic replace, so only a damaged disk (or a foreign file) gets here: the
            # entries it stood for are gone. The replica starts empty and votes again only once it
            # has caught up with a leader (QueueReplica._may_vote); the leader sends it a snapshot.
            log.error("%s: %s; the replica's log is discarded and copied again from its leader", path, error)
            for _, segment_path in self._segment_files():
                segment_path.unlink()
            path.unlink()
            fsync_directory(self.directory)
            self.created_empty = True

    def _recover(self) -> None:
        base = self._base.index
        files = self._segment_files()
        # Segments wholly at or below the base are what a compaction (or a reset) left behind.
        while len(files) > 1 and files[1][0] <= base + 1:
            files.pop(0)[1].unlink()
        expected = None
        for k, (first, path) in enumerate(files):
            if expected is not None and first != expected:
                log.warning("%s: segment starts at entry %d, entry %d expected; dropping it and those after it",
                            path, first, expected)
                for _, later in files[k:]:
                    later.unlink()
                break
            whole = self._recover_segment(first, path)
            expected = self.last_index + 1
            if not whole:
                for _, later in files[k + 1:]:
                    later.unlink()
                break
        if (not self._segments or self._offset > base or self.last_index < base
                or (base > self._offset and self._terms[base - 1 - self._offset] != self._base.term)):
            # Nothing held goes on after the base (a reset replaced the log, and the old files
            # were not all removed yet): the log starts afresh after it.
            self._drop_segments()
            self._offset = base
            self._new_segment(base + 1, durably=True)
        self._durable_index = self.last_index

    def _recover_segment(self, first: int, path: Path) -> bool:
        """Scan one segment, dropping a torn or damaged tail; False if it had one."""
        fd = os.open(path, os.O_RDWR | os.O_APPEND, 0o600)
        header = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
        header_size = SEGMENT_HEADER_SIZE
        if header[:HEADER_SIZE] == _marker(1) and first == 1:
            header_size = HEADER_SIZE  # a format 1 log file, become the first segment
        elif (len(header) < SEGMENT_HEADER_SIZE or zlib.crc32(header[:-4]) != struct.unpack(">I", header[-4:])[0]
              or _SEGMENT_HEAD.unpack_from(header)[0] != SEGMENT_MAGIC):
            if self._segments or len(header) < SEGMENT_HEADER_SIZE:
                # A crash as it was made (no entry in it was acknowledged): made again.
                os.ftruncate(fd, 0)
                os.write(fd, _segment_header(first))
                os.fsync(fd)
            else:
                os.close(fd)
                raise ValueError(f"{path} is not a replica log segment")
        elif _SEGMENT_HEAD.unpack_from(header)[1] != SEGMENT_VERSION:
            os.close(fd)
            raise ValueError(f"{path} is in format {_SEGMENT_HEAD.unpack_from(header)[1]}; "
                             f"this build reads {SEGMENT_VERSION}")
        if not self._segments:
            self._offset = first - 1
        file_size = os.fstat(fd).st_size
        base = header_size  # file offset of pending[0]
        pending = b""
        expected = first
        while True:
            block = os.pread(fd, _READ_BLOCK, base + len(pending))
            data = pending + block
            heads, used = scan_entries(data, expected, stop_at_damage=True)
            for head in heads:
                self._starts.append(base + head.start)
                self._terms.append(head.term)
            if heads:
                expected = heads[-1].index + 1
            base += used
            pending = data[used:]
            if not block or _damaged_at_start(pending):
                break
        whole = base >= file_size
        if not whole:
            log.warning("%s: dropping %d bytes of torn or damaged tail at offset %d (entry %d on)",
                        path, file_size - base, base, expected)
            os.ftruncate(fd, base)
        if expected > first or not whole:
            os.fsync(fd)  # after a process crash the kernel may still hold some of it: make it durable
        self._segments.append(_Segment(first, path, fd, base))
        self._firsts.append(first)
        return whole

    def _new_segment(self, first: int, *, durably: bool) -> None:
        """Start the segment that entries ``first`` on go to (``durably``: fsynced with its
        name before this returns; else the next group-commit round makes it durable)."""
        path = self.directory / _segment_name(first)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        header = _segment_header(first)
        write_all(fd, header)
        if durably:
            os.fsync(fd)
            fsync_directory(self.directory)
        else:
            self._names_changed = True
        self._segments.append(_Segment(first, path, fd, len(header)))
        self._firsts.append(first)

    def _drop_segments(self, keep_from: int = 0) -> None:
        """Close and remove the segments before position ``keep_from`` (all of them by default:
        then the buffer and the arrays are emptied too)."""
        drop = self._segments[:keep_from] if keep_from else self._segments
        for segment in drop:
            self._unsynced.discard(segment.fd)
            os.close(segment.fd)
            segment.path.unlink(missing_ok=True)
        self._names_changed = True
        if keep_from:
            del self._segments[:keep_from]
            del self._firsts[:keep_from]
            held_from = self._segments[0].first
            del self._starts[:held_from - 1 - self._offset]
            del self._terms[:held_from - 1 - self._offset]
            self._offset = held_from - 1
        else:
            self._segments.clear()
            self._firsts.clear()
            self._buffer.clear()
            del self._starts[:]
            del self._terms[:]

    # ---- facts ---------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self._offset + len(self._terms)

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else self._base.term

    @property
    def durable_index(self) -> int:
        return self._durable_index

    @property
    def promised_term(self) -> int:
        return self._promised

    @property
    def first_index(self) -> int:
        """The first entry this log still stores: after its snapshot's (1 without one)."""
        return self._base.index + 1

    @property
    def snapshot_index(self) -> int:
        return self._base.index

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def term_at(self, index: int) -> int:
        if index == self._base.index:
            return self._base.term
        if index <= self._offset:
            # Compacted away. Every such entry was committed, and a term of 0 matches nothing a
            # leader asks about (the callers compare it with terms of entries still held).
            return 0
        return self._terms[index - 1 - self._offset]

    def _segment_of(self, index: int) -> int:
        return bisect.bisect_right(self._firsts, index) - 1

    def _end_of(self, index: int) -> int:
        """Byte offset, in its segment, just after entry ``index``."""
        k = self._segment_of(index)
        if index == self.last_index:
            return self._segments[k].size + (len(self._buffer) if k == len(self._segments) - 1 else 0)
        if k + 1 < len(self._segments) and index == self._firsts[k + 1] - 1:
            return self._segments[k].size  # the last entry of a full segment
        return self._starts[index - self._offset]

    # ---- writing -------------------------------------------------------------------------

    def _room(self) -> None:
        """Roll to a new segment once the last one is full (between appends, never within one)."""
        active = self._segments[-1]
        if active.size + len(self._buffer) < self._segment_bytes or self.last_index < active.first:
            return
        self.flush()
        self._unsynced.add(active.fd)
        self._new_segment(self.last_index + 1, durably=False)

    def append(self, term: int, payload: bytes) -> int:
        self._room()
        index = self.last_index + 1
        self._starts.append(self._segments[-1].size + len(self._buffer))
        self._terms.append(term)
        self._buffer += encode_entry(index, term, payload)
        return index

    def append_entries(self, data: bytes, heads: list[EntryHead]) -> None:
        if heads and heads[0].index != self.last_index + 1:
            raise ValueError(f"entries start at {heads[0].index}, the log ends at {self.last_index}")
        if not heads:
            return
        self._room()
        offset = self._segments[-1].size + len(self._buffer) - heads[0].start
        for head in heads:
            self._starts.append(offset + head.start)
            self._terms.append(head.term)
        self._buffer += memoryview(data)[heads[0].start:heads[-1].end]

    def truncate_after(self, index: int) -> None:
        if index >= self.last_index:
            return
        if index < self._base.index:
            raise ValueError(f"entry {index + 1} is in the snapshot (committed): it cannot be cut")
        k = self._segment_of(index + 1)
        cut = self._starts[index - self._offset]
        for segment in self._segments[k + 1:]:  # wholly after the cut
            self._unsynced.discard(segment.fd)
            os.close(segment.fd)
            segment.path.unlink(missing_ok=True)
            self._names_changed = True
        if k + 1 < len(self._segments):
            del self._segments[k + 1:]
            del self._firsts[k + 1:]
            self._buffer.clear()
        active = self._segments[k]
        if cut >= active.size:
            del self._buffer[cut - active.size:]
        else:
            self._buffer.clear()
            active.cut(cut)
        del self._starts[index - self._offset:]
        del self._terms[index - self._offset:]
        self._durable_index = min(self._durable_index, index)
        self._cut_during_round = index if self._cut_during_round is None else min(self._cut_during_round, index)

    def promise(self, term: int) -> None:
        if term <= self._promised:
            return
        # Rare (once per election) and must be durable before anyone hears of it: a blocking write.
        write_atomically(self.directory / TERM_FILE, json.dumps({"promised_term": term}).encode())
        self._promised = term

    def flush(self) -> None:
        if not self._buffer:
            return
        active = self._segments[-1]
        view = memoryview(self._buffer)
        written = 0
        try:
            while written < len(view):
                written += os.write(active.fd, view[written:])
        finally:
            view.release()
            if written:
                active.wrote(written)
                del self._buffer[:written]

    # ---- compaction -------------------------------------------------------------------------

    def compact(self, index: int, document: bytes) -> None:
        """Make ``document`` the snapshot standing for every entry up to ``index`` (durably), then
        remove the segments that hold nothing after it. The caller vouches that entry ``index``
        is committed and that ``document`` is what a copy needs in place of entries 1..index."""
        if not (1 <= index and self._base.index <= index <= min(self.last_index, self._durable_index)):
            raise ValueError(f"a snapshot at {index}: the log's base is {self._base.index}, its durable "
                             f"index {self._durable_index}")
        snapshot = Snapshot(index, self.term_at(index), document)
        # Snapshot first: a crash before the segments go leaves them, ignored and removed at open.
        write_atomically(self.directory / SNAPSHOT_FILE, encode_snapshot(snapshot))
        self._base = snapshot
        keep_from = self._segment_of(index + 1)
        if keep_from > 0:
            self._drop_segments(keep_from)

    def snapshot(self) -> Snapshot:
        """The log's base (index 0, empty: no snapshot)."""
        return self._base

    def reset_point(self, index: int) -> tuple[int, bytes]:
        if index != self._base.index:
            raise ValueError(f"a RESET after entry {index}: the log's snapshot is at {self._base.index}")
        return 0, self._base.document

    def reset(self, base_index: int, base_term: int, base_position: int, document: bytes) -> None:
        """Replace the whole log by the leader's snapshot (RESET): it goes on after ``base_index``."""
        if base_index < self._base.index:
            raise ValueError(f"a RESET to {base_index}, below this log's snapshot at {self._base.index}")
        snapshot = Snapshot(base_index, base_term, document)
        write_atomically(self.directory / SNAPSHOT_FILE, encode_snapshot(snapshot))
        self._base = snapshot
        self._drop_segments()
        self._offset = base_index
        self._new_segment(base_index + 1, durably=True)
        self._durable_index = base_index
        self._cut_during_round = base_index
        log.info("%s: reset to go on after entry %d (term %d)", self.directory, base_index, base_term)

    # ---- what a queue's log does not do (ReplicaStore) ---------------------------------------

    follows_commits = False  # followers learn the commit index from the entries' own APPENDs

    state_generation = 0

    def state_document(self) -> bytes:
        return b""

    def apply_state(self, document: bytes) -> None:
        pass

    def on_news(self, callback: Callable[[], None]) -> None:
        pass  # entries come through append() alone, and there is no state

    def committed(self, index: int) -> None:
        pass

    # ---- reading -------------------------------------------------------------------------

    def first_index_of_term(self, term: int) -> int:
        return bisect.bisect_left(self._terms, term) + 1 + self._offset

    def read_entries(self, first_index: int, max_bytes: int, *, through: int | None = None) -> tuple[bytes, int]:
        """`ReplicaLog.read_entries`; ``through``: none after this index either (a reader that
        wants only the committed ones reads no further, and does not flush the buffered tail)."""
        last_wanted = self.last_index if through is None else min(through, self.last_index)
        if not self.first_index <= first_index <= last_wanted:
            return b"", first_index - 1
        k = self._segment_of(first_index)
        segment = self._segments[k]
        # Within the segment of first_index: the last entry that ends within max_bytes of start;
        # at least first_index, so a larger entry travels alone.
        seg_last = self._firsts[k + 1] - 1 if k + 1 < len(self._segments) else self.last_index
        seg_last = min(seg_last, last_wanted)
        start = self._starts[first_index - 1 - self._offset]
        limit = start + max_bytes
        lo, hi = first_index - self._offset, seg_last - self._offset  # positions in _starts of the next ones
        # (Entry j ends where entry j + 1 starts, at _starts[j - _offset] within the segment.)
        within = bisect.bisect_right(self._starts, limit, lo, hi)  # next entries starting within the limit
        last = first_index + (within - lo)
        if last > seg_last or self._end_of(last) > limit:
            last -= 1
        last = min(max(first_index, last), seg_last)
        end = self._end_of(last)
        if segment is self._segments[-1] and end > segment.size:
            self.flush()
        return os.pread(segment.fd, end - start, start), last

    def entries(self, first_index: int = 0) -> Iterator[tuple[int, int, memoryview]]:
        """(index, term, payload) of every entry from ``first_index`` (the first stored one by
        default), read in blocks."""
        self.flush()
        index = max(first_index, self.first_index)
        while index <= self.last_index:
            chunk, _ = self.read_entries(index, _READ_BLOCK)
            heads, _ = scan_entries(chunk, index)
            for head in heads:
                yield head.index, head.term, memoryview(chunk)[head.start + ENTRY_HEAD_SIZE:head.end]
            index = heads[-1].index + 1

    # ---- group commit (Syncable) ----------------------------------------------------------

    def prepare_sync(self) -> SyncJob:
        self.flush()
        self._cut_during_round = None
        rolled = sorted(self._unsynced)
        fds = [os.dup(fd) for fd in rolled] + [os.dup(self._segments[-1].fd)]
        self._unsynced.clear()
        directories = [str(self.directory)] if self._names_changed else []
        self._names_changed = False
        return SyncJob(fds=fds, directories=directories, token=(self.last_index, rolled))

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        token = job.token
        assert isinstance(token, tuple)
        if error is not None:
            log.error("fsync of %s failed: %s", self.directory, error)
            # What that round should have made durable is still to do.
            self._names_changed = self._names_changed or bool(job.directories)
            self._unsynced.update(fd for fd in token[1] if any(s.fd == fd for s in self._segments))
            return
        synced = token[0]
        if self._cut_during_round is not None:  # entries after the cut are new, not the fsynced ones
            synced = min(synced, self._cut_during_round)
        self._durable_index = max(self._durable_index, min(synced, self.last_index))

    def close(self) -> None:
        if self._segments:
            self.flush()
            os.fsync(self._segments[-1].fd)
            for fd in self._unsynced:
                os.fsync(fd)
            self._unsynced.clear()
            if self._names_changed:
                fsync_directory(self.directory)
            for segment in self._segments:
                os.close(segment.fd)
            self._segments.clear()
            self._firsts.clear()
