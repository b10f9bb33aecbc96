"""The append-only log of one stream: segment files many cursors replay from any offset.

``StreamLog.open(directory, vhost, name)`` opens (or creates) a stream
directory, recovers it (stream_recovery: a torn tail is cut off, damage in
the middle is reported in ``damage``, the index is loaded from side files or
rebuilt by a scan) and returns the log. Then:

* ``append(exchange, routing_key, raw_properties, body, filter_value=...)``
  returns the record's offset (0, 1, 2, ...). Records are buffered and written
  with one ``os.write`` per flush; the records of one flush are a *chunk*.
  A segment rolls over once the next record would take it past
  ``max_segment_bytes``.
* Durability is a ``GroupCommitter``'s: the log is a ``Syncable``
  (``flush``, ``prepare_sync``, ``sync_done``), and
  ``committer.request_sync(log, callback)`` calls back once everything
  appended before it is fsynced.
* **Readers see committed records only**: a record becomes readable (and
  counts for ``last_offset``, ``next_offset``, ...) when a sync round that
  covers it completes, so an offset a consumer has seen is never given to
  another message after a crash. Given a committer, the log asks it for a
  round itself whenever it holds records not yet committed, and calls
  ``on_committed(next_offset)`` after each round that made records readable:
  the owner's cue to push them to consumers waiting at the tail. After each such round it
  also rewrites the stream's commit mark (``committed``, stream_commit_mark), which tells
  readers of the files, such as the Spark data source, where the committed records end.
* ``reader(offset, ...)`` returns a ``StreamCursor`` (stream_cursor).
* ``enforce_retention(max_bytes, max_age_ms, now_ms)`` drops whole segments
  from the front; with ``set_retention`` the log applies its limits itself
  whenever a segment rolls over, which keeps the disk within ``max_bytes``
  plus one segment.
* ``offsets`` is the stream's consumer offset store (stream_offsets).

**Committed by its owner** (``external_commit``, a replicated stream: its
replica, cluster/replication/stream_replica_log.py, is the owner). A record
becomes readable, and ``request_commit`` callbacks (a confirm) are called,
only when the owner says it is committed (``commit_to(next_offset)``); a sync
round only makes records durable (``durable_offset``), and the commit mark
names what the owner committed. Appends are refused until the owner says so
(``set_writable``); ``append_record`` appends a record another copy encoded,
byte for byte; ``read_records`` gives records as stored, committed or not;
``truncate`` cuts records not committed, ``reset`` starts over at an offset
(both fsynced before they return); retention is decided here but applied by
the owner on every copy (``on_retention(first_kept)``, then
``drop_segments_before``). The owner hears of every append
(``on_append`` / ``notify_appended``) and asks for the sync rounds itself.

Not thread-safe: use it from the event loop thread only. docs/stream-files.md
describes the files.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import time
import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple, TypedDict

from persistence.atomic_file import fsync_directory, write_atomically, write_replacing
from persistence.buffered_tail import BUFFER_LIMIT_FACTOR, BufferedTail
from persistence.group_commit import GroupCommitter, SyncJob, sync_job
from persistence.segment_file import create_segment
from persistence.record_format import LENGTH
from persistence.stream_blocks import BlockCache, RecordBlock
from persistence.stream_commit_mark import CommitMark, CommitMarkWriter, DamagedCommitMark, read_commit_mark
from persistence.stream_index import (
    DEFAULT_INDEX_INTERVAL,
    NO_CHUNK,
    IndexCheckpoint,
    SegmentIndex,
    StreamDamage,
    checkpoint_of,
    encode_side_index,
)
from persistence.stream_offsets import StreamOffsets
from persistence.stream_recovery import StreamRecovery, make_stream_directory, recover_segments
from persistence.stream_segment import (
    ENVELOPED_RECORD_OVERHEAD,
    FLAG_CHUNK_START,
    FLAG_FILTER,
    HEAD,
    HEADER_SIZE,
    RECORD_OVERHEAD,
    STREAM_RECORD,
    check_short,
    encode_envelope,
    encode_header,
    encode_record_with,
    index_file_name,
    segment_file_name,
    stream_path,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from persistence.stream_cursor import GapCallback, StreamCursor

log = logging.getLogger(__name__)

DEFAULT_MAX_SEGMENT_BYTES = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
DEFAULT_WRITE_BUFFER_SIZE = 1024 * 1024
DEFAULT_CHECKPOINT_BYTES = 64 * 1024 * 1024  # the newest segment's side file is rewritten this often


class StreamOptions(TypedDict, total=False):
    """The keywords of ``StreamLog.open`` (the constructor's)."""

    max_segment_bytes: int
    max_bytes: int | None
    max_age_ms: int | None
    committer: GroupCommitter | None
    on_committed: Callable[[int], None] | None
    write_buffer_size: int
    index_interval_bytes: int
    checkpoint_bytes: int
    clock_ms: Callable[[], int]
    external_commit: bool
    on_append: Callable[[], None] | None
    on_retention: Callable[[int], None] | None


class _Commit(NamedTuple):
    """What a sync round makes durable: everything flushed when it started."""

    next_offset: int
    segment_id: int  # the tail then (-1: none)
    position: int  # its size then
    tail: IndexCheckpoint | None


class RetentionResult(NamedTuple):
    dropped_segments: list[int]  # their ids (first offsets)
    freed_bytes: int
    first_offset: int  # the first offset still stored


class SegmentInfo(NamedTuple):
    """One segment, for management and metrics."""

    segment_id: int
    first_offset: int
    next_offset: int
    size: int
    first_timestamp_ms: int
    last_timestamp_ms: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamLog(BufferedTail):
    """The segment files of one stream directory; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        vhost: str,
        name: str,
        *,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        max_bytes: int | None = None,
        max_age_ms: int | None = None,
        committer: GroupCommitter | None = None,
        on_committed: Callable[[int], None] | None = None,
        write_buffer_size: int = DEFAULT_WRITE_BUFFER_SIZE,
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
        clock_ms: Callable[[], int] = _now_ms,
        external_commit: bool = False,
        on_append: Callable[[], None] | None = None,
        on_retention: Callable[[int], None] | None = None,
    ) -> None:
        """Use ``open()``, which also recovers the directory. ``external_commit`` and its two
        hooks: see "Committed by its owner" in the module docstring."""
        if max_segment_bytes <= HEADER_SIZE:
            raise ValueError(f"max_segment_bytes must be above {HEADER_SIZE}")
        self._directory = Path(directory)
        self.vhost = vhost
        self.name = name
        self.max_segment_bytes = max_segment_bytes
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self._committer = committer
        self.on_committed = on_committed
        self.write_buffer_size = write_buffer_size
        self._interval = index_interval_bytes
        self.checkpoint_bytes = checkpoint_bytes
        self._clock_ms = clock_ms
        self._segments: list[SegmentIndex] = []
        self._segment_ids: list[int] = []
        self._tail: SegmentIndex | None = None
        self._tail_fd: int | None = None
        self._buffer = bytearray()
        self._envelope = b""  # of the last append, and what it was made of
        self._envelope_of: tuple[str, str, bytes] | None = None
        self._next = 0  # the offset the next append gets
        self._last_ts = 0
        # Committed (readable): everything before _visible_next, which ends in segment
        # _visible_segment at file position _visible_position.
        self._visible_next = 0
        self._visible_segment = -1
        self._visible_position = 0
        self._last_chunk = NO_CHUNK  # the first offset of the last committed chunk
        self._pending_chunks: deque[int] = deque()  # first offsets of chunks not committed yet
        self._unsynced_paths: set[str] = set()
        self._dir_dirty = False
        self._unindexed: list[SegmentIndex] = []  # sealed, waiting for their final side file
        self._retention_due = False
        self._sync_requested = False
        self._cursors: weakref.WeakSet[StreamCursor] = weakref.WeakSet()
        self.blocks = BlockCache()  # blocks of records read once for all cursors (stream_blocks)
        self._mark: CommitMarkWriter | None = None  # the committed end, for readers of the files
        self.damage: list[StreamDamage] = []
        self.recovery = StreamRecovery(0, 0, 0, 0.0)
        self.offsets: StreamOffsets
        self._failed: OSError | None = None
        self._closed = False
        # Committed by its owner (module docstring): appends are refused until it says so, and
        # records become readable when it says they are committed (commit_to), not when a sync
        # round ends; what a round made durable is _durable_next.
        self._external = external_commit
        self._on_append = on_append
        self._on_retention = on_retention
        self._writable = not external_commit
        self._durable_next = 0
        # Where each record appended but not readable yet ends: the record at offset
        # _pend_base + k ends at file position _pend_end[k] of the segment that
        # _pend_seg_ids[j] names, j the last with _pend_seg_offsets[j] <= its offset.
        self._pend_base = 0
        self._pend_end = array("Q")
        self._pend_ts = array("Q")
        self._pend_seg_offsets: list[int] = []
        self._pend_seg_ids: list[int] = []
        self._commit_waiters: deque[tuple[int, Callable[[OSError | None], None]]] = deque()
        self._read_points: dict[int, tuple[int, int]] = {}  # offset -> (segment id, position) of a record start
        self._cut_during_round: int | None = None  # the lowest cut (truncate, reset) since prepare_sync
        self._visible_last_ts = 0  # the timestamp of the last committed record (committed by its owner)

    @classmethod
    def open(cls, directory: Path, vhost: str, name: str, **options: Unpack[StreamOptions]) -> "StreamLog":
        """Open the stream in ``directory`` (created if missing) and recover it; ``options`` are
        the constructor's keywords."""
        stream = cls(directory, vhost, name, **options)
        stream._recover()
        return stream

    @classmethod
    def open_in(cls, data_dir: Path, vhost: str, name: str, **options: Unpack[StreamOptions]) -> "StreamLog":
        """The stream ``name`` of ``vhost`` under ``data_dir`` (``stream_segment.stream_path``)."""
        return cls.open(stream_path(data_dir, vhost, name), vhost, name, **options)

    def notify_committed(self, callback: Callable[[int], None] | None) -> None:
        """Call `callback(next_offset)` after each sync round that made records readable (the
        owner's cue to push them to consumers waiting at the tail)."""
        self.on_committed = callback

    @property
    def directory(self) -> Path:
        return self._directory

    # ---- appending ------------------------------------------------------------------------

    def append(
        self,
        exchange: str,
        routing_key: str,
        raw_properties: bytes,
        body: bytes,
        *,
        filter_value: str | None = None,
        timestamp_ms: int | None = None,
    ) -> int:
        """Append a message and return its offset. ``raw_properties`` are the content header's
        property flags and list; ``timestamp_ms`` defaults to now and is raised to the previous
        record's if the clock went back. It becomes readable once committed. If it raises,
        nothing was appended."""
        self._check_writable()
        # Publishes to a stream mostly repeat their exchange, key and properties: their envelope
        # (stream_segment.encode_envelope) is made once per change.
        routing = (exchange, routing_key, raw_properties)
        if routing != self._envelope_of:
            exchange_b = exchange.encode("utf-8")
            routing_key_b = routing_key.encode("utf-8")
            if len(exchange_b) > 255 or len(routing_key_b) > 255:
                check_short("exchange", exchange_b)
                check_short("routing key", routing_key_b)
            self._envelope = encode_envelope(exchange_b, routing_key_b, raw_properties)
            self._envelope_of = routing
        envelope = self._envelope
        if filter_value is None:
            filter_b, flags = b"", 0
        else:
            filter_b, flags = filter_value.encode("utf-8"), FLAG_FILTER
            check_short("filter value", filter_b)
        size = ENVELOPED_RECORD_OVERHEAD + len(filter_b) + len(envelope) + len(body)
        tail = self._tail
        buffer = self._buffer
        if len(buffer) >= BUFFER_LIMIT_FACTOR * self.write_buffer_size:
            self.flush()  # writes keep failing: refuse (raises) rather than grow without bound
        if tail is None or (
            tail.size + len(buffer) + size > self.max_segment_bytes and tail.size + len(buffer) > tail.header_length
        ):
            tail = self._roll_over()
        was_empty = not buffer
        if was_empty:
            flags |= FLAG_CHUNK_START
        ts = self._clock_ms() if timestamp_ms is None else timestamp_ms
        if ts < self._last_ts:
            ts = self._last_ts
        offset = self._next
        position = tail.size + len(buffer)
        buffer += encode_record_with(offset, ts, flags, filter_b, envelope, body)
        buffer += body
        tail.note(offset, ts, position, was_empty)
        if was_empty:
            self._pending_chunks.append(offset)
        self._next = offset + 1
        self._last_ts = ts
        if len(buffer) >= self.write_buffer_size:
            self._write_full_buffer()
        if self._external:
            self._appended_pending(position + size, ts)
        elif not self._sync_requested and self._committer is not None:
            self._sync_requested = True
            self._committer.request_sync(self, _log_sync_failure)
        return offset

    def append_record(self, record: bytes | memoryview) -> int:
        """Append a record encoded by another copy of this stream (its leader), byte for byte:
        its offset must be the next one (``appended_offset``), and its chunk-start flag is kept,
        so this copy's files, chunks and segments are the writer's. Returns the offset; raises
        ValueError for bytes that are not the next record, OSError as ``append`` does."""
        self._check_writable(external=True)
        size = len(record)
        if size < RECORD_OVERHEAD:
            raise ValueError(f"a stream record is at least {RECORD_OVERHEAD} bytes, got {size}")
        length: int
        offset: int
        ts: int
        length, _crc, rtype, offset, ts, flags, _n = HEAD.unpack_from(record, 0)
        if length + 4 != size or rtype != STREAM_RECORD:
            raise ValueError(f"not one stream record ({size} bytes, length field {length}, type {rtype:#x})")
        if offset != self._next:
            raise ValueError(f"record of offset {offset} where offset {self._next} comes next")
        tail = self._tail
        buffer = self._buffer
        if len(buffer) >= BUFFER_LIMIT_FACTOR * self.write_buffer_size:
            self.flush()
        if tail is None or (
            tail.size + len(buffer) + size > self.max_segment_bytes and tail.size + len(buffer) > tail.header_length
        ):
            tail = self._roll_over()
        position = tail.size + len(buffer)
        buffer += record
        chunk_start = bool(flags & FLAG_CHUNK_START)
        ts = max(ts, self._last_ts)
        tail.note(offset, ts, position, chunk_start)
        if chunk_start:
            self._pending_chunks.append(offset)
        self._next = offset + 1
        self._last_ts = ts
        if len(buffer) >= self.write_buffer_size:
            self._write_full_buffer()
        self._appended_pending(position + size, ts)
        return offset

    def _write_full_buffer(self) -> None:
        """The buffer reached ``write_buffer_size`` after an append: write it. A failed write
        keeps the records buffered, and the next flush retries (``append`` and ``append_record``
        call this only when the buffer is full: nothing per record)."""
        try:
            self.flush()
        except OSError as err:
            log.warning("writing to stream %s failed: %s; will retry", self._directory, err)

    def _appended_pending(self, end: int, ts: int) -> None:
        """Committed by its owner: note where the record just appended ends, and tell the owner,
        which sends it to the stream's other copies and asks for its sync round (once per
        event-loop iteration: the owner's hook is a flag check after the first call)."""
        self._pend_end.append(end)
        self._pend_ts.append(ts)
        if self._on_append is not None:
            self._on_append()

    def notify_appended(self, callback: Callable[[], None] | None) -> None:
        """Committed by its owner: call ``callback()`` after every append (the owner's cue to
        send the record on and to make it durable)."""
        self._on_append = callback

    # ---- group commit (Syncable) ----------------------------------------------------------

    def prepare_sync(self) -> SyncJob:
        """Flush, and hand over what must be fsynced for everything appended so far to be durable."""
        if self._failed is not None:
            raise self._failed
        self.flush()
        self._sync_requested = False
        self._cut_during_round = None
        tail = self._tail
        if tail is None:
            commit = _Commit(self._next, -1, 0, None)
        else:
            commit = _Commit(self._next, tail.segment_id, tail.size, checkpoint_of(tail))
        paths = sorted(self._unsynced_paths)
        self._unsynced_paths = set()
        directories = [str(self._directory)] if self._dir_dirty else []
        self._dir_dirty = False
        fds = [] if self._tail_fd is None else [os.dup(self._tail_fd)]
        return SyncJob(fds=fds, paths=paths, directories=directories, token=commit)

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        if error is not None:
            # After a failed fsync the kernel may have dropped dirty pages: nothing written since
            # can be trusted to reach the disk, so stop accepting writes (fail-stop).
            self._failed = error
            log.error("fsync failed in stream %s: %s; it stops accepting writes", self._directory, error)
            return
        commit = job.token
        assert isinstance(commit, _Commit)
        if self._external:
            cut = self._cut_during_round
            if cut is not None:  # records after the cut are new: not the ones this round fsynced
                self._durable_next = max(self._durable_next, min(commit.next_offset, cut))
                return
            self._durable_next = max(self._durable_next, min(commit.next_offset, self._next))
            try:
                self._write_side_indexes(commit)
            except OSError as err:
                log.warning("writing a side index of stream %s failed: %s", self._directory, err)
            return
        advanced = commit.next_offset > self._visible_next
        if advanced:
            self._visible_next = commit.next_offset
            self._visible_segment = commit.segment_id
            self._visible_position = commit.position
            pending = self._pending_chunks
            while pending and pending[0] < commit.next_offset:
                self._last_chunk = pending.popleft()
        if advanced:
            self._write_mark()
        try:
            self._write_side_indexes(commit)
        except OSError as err:  # only an optimisation: the next open scans instead
            log.warning("writing a side index of stream %s failed: %s", self._directory, err)
        if self._retention_due:
            self._retention_due = False
            self.apply_retention()
        if advanced and self.on_committed is not None:
            self.on_committed(commit.next_offset)

    def sync_now(self) -> None:
        """Make everything appended durable and readable now, blocking (tools, tests, shutdown)."""
        job = self.prepare_sync()
        error: OSError | None = None
        try:
            sync_job(job)  # what a committer's round does, here and now
        except OSError as err:
            error = err
        self.sync_done(job, error)
        if error is not None:
            raise error

    # ---- committed by its owner (module docstring) -----------------------------------------

    @property
    def externally_committed(self) -> bool:
        return self._external

    @property
    def durable_offset(self) -> int:
        """One past the last record a sync round made durable here. Committed by its owner, these
        may not be committed yet; otherwise it is ``next_offset``."""
        return self._durable_next if self._external else self._visible_next

    @property
    def writable(self) -> bool:
        """``append`` is taken (committed by its owner: only while its owner says so)."""
        return self._writable

    def set_writable(self, writable: bool) -> None:
        """Committed by its owner: take ``append`` from now on, or refuse it (OSError)."""
        self._writable = writable

    def set_max_segment_bytes(self, max_segment_bytes: int) -> None:
        """The size a segment rolls over at, from the next append on."""
        if max_segment_bytes <= HEADER_SIZE:
            raise ValueError(f"max_segment_bytes must be above {HEADER_SIZE}")
        self.max_segment_bytes = max_segment_bytes

    def request_commit(self, callback: Callable[[OSError | None], None]) -> None:
        """Call ``callback(error)`` once every record appended so far is committed (readable): a
        sync round's fsync covers it, or, committed by its owner, its ``commit_to`` (then called
        back on a later loop iteration, never from within). A publisher confirm waits for this."""
        if not self._external:
            assert self._committer is not None, "a stream without a committer commits with sync_now()"
            self._committer.request_sync(self, callback)
        elif self._visible_next >= self._next:
            asyncio.get_running_loop().call_soon(callback, None)
        else:
            self._commit_waiters.append((self._next, callback))

    def fail_commits(self, error: OSError) -> None:
        """Committed by its owner: the owner can no longer commit what was appended (its copy
        stopped writing): every ``request_commit`` waiting is called back with ``error``."""
        waiters, self._commit_waiters = self._commit_waiters, deque()
        for _, callback in waiters:
            callback(error)

    def commit_to(self, next_offset: int) -> None:
        """Committed by its owner: the records before ``next_offset`` are committed. They become
        readable (``on_committed``), the commit mark names them, and the ``request_commit``
        callbacks they cover are called."""
        target = min(next_offset, self._next)
        if not self._external or target <= self._visible_next:
            return
        k = target - self._pend_base
        end = self._pend_end[k - 1]
        j = bisect_right(self._pend_seg_offsets, target - 1) - 1
        segment_id = self._pend_seg_ids[j]
        tail = self._tail
        if tail is not None and segment_id == tail.segment_id and end > tail.size:
            self.flush()  # (committed records were written before anyone could count them)
        self._visible_last_ts = self._pend_ts[k - 1]
        del self._pend_end[:k], self._pend_ts[:k]
        del self._pend_seg_offsets[:j], self._pend_seg_ids[:j]
        self._pend_base = target
        self._visible_next, self._visible_segment, self._visible_position = target, segment_id, end
        pending = self._pending_chunks
        while pending and pending[0] < target:
            self._last_chunk = pending.popleft()
        self._write_mark()
        waiters = self._commit_waiters
        while waiters and waiters[0][0] <= target:
            waiters.popleft()[1](None)
        if self._retention_due:
            self._retention_due = False
            self.apply_retention()
        if self.on_committed is not None:
            self.on_committed(target)

    def read_records(self, offset: int, end_offset: int, max_bytes: int) -> list[bytes]:
        """The records from ``offset`` on as they are stored, committed or not, all of one
        segment: up to ``end_offset`` (excluded) and about ``max_bytes`` (at least one record);
        [] when ``offset`` is not stored (dropped by retention, or not appended)."""
        end_offset = min(end_offset, self._next)
        if offset >= end_offset or not self._segments or offset < self._segments[0].segment_id:
            return []
        seg, position = self._record_start(offset)
        if seg is self._tail and self._buffer:
            self.flush()
        wanted = min(end_offset, seg.next_offset) - offset
        size = seg.size - position
        with self._segment_fd(seg) as fd:
            data = os.pread(fd, min(size, max(max_bytes, 4096)), position)
            records: list[bytes] = []
            pos = 0
            while len(records) < wanted and len(data) - pos >= 4:
                end = pos + 4 + LENGTH.unpack_from(data, pos)[0]
                if end > len(data):
                    if not records and end - pos <= size:  # one record larger than max_bytes travels alone
                        data = os.pread(fd, end - pos, position)
                        records.append(data)
                        pos = end
                    break
                records.append(data[pos:end])
                pos = end
        if not records or HEAD.unpack_from(records[0], 0)[3] != offset:
            raise ValueError(f"stream {self._directory}: offset {offset} is not where its index says")
        self._remember_read(offset + len(records), seg.segment_id, position + sum(len(r) for r in records))
        return records

    def truncate(self, next_offset: int) -> None:
        """Committed by its owner: remove the records from offset ``next_offset`` on, none of them
        committed (a copy's records that the stream's next writer does not have). The cut is
        fsynced before this returns."""
        if not self._external:
            raise RuntimeError("only a stream committed by its owner is cut back")
        if next_offset >= self._next:
            return
        if next_offset < self._visible_next:
            raise ValueError(f"stream {self._directory}: cutting at {next_offset} would remove committed records")
        self.flush()
        seg, position = self._record_start(next_offset)
        removed: list[SegmentIndex] = []
        while self._segments[-1] is not seg:
            removed.append(self._segments.pop())
            del self._segment_ids[-1]
        for gone in removed:
            gone.mark_dropped()
            for path in (gone.path, self._directory / index_file_name(gone.segment_id)):
                path.unlink(missing_ok=True)
                self._unsynced_paths.discard(str(path))
            for cursor in list(self._cursors):
                cursor.segment_dropped(gone)
        self._unindexed = [s for s in self._unindexed if not s.dropped and s is not seg]
        if seg is not self._tail:
            if self._tail_fd is not None:
                os.close(self._tail_fd)
            self._tail, self._tail_fd = seg, os.open(seg.path, os.O_RDWR | os.O_APPEND)
        last = next_offset - 1
        if last >= self._pend_base:
            last_ts = self._pend_ts[last - self._pend_base]
        else:
            last_ts = self._visible_last_ts
        pending = self._pending_chunks
        while pending and pending[-1] >= next_offset:
            pending.pop()
        chunk = pending[-1] if pending else self._last_chunk
        if seg.indexed_size > position:
            (self._directory / index_file_name(seg.segment_id)).unlink(missing_ok=True)
        seg.cut(position, next_offset, last_ts, chunk if chunk != NO_CHUNK and chunk >= seg.segment_id else NO_CHUNK)
        assert self._tail_fd is not None
        os.ftruncate(self._tail_fd, position)
        os.fsync(self._tail_fd)  # rare, and what follows must never land on top of the old bytes
        fsync_directory(self._directory)
        self._next = next_offset
        keep = next_offset - self._pend_base
        del self._pend_end[keep:], self._pend_ts[keep:]
        present = set(self._segment_ids)
        kept = [(o, s) for o, s in zip(self._pend_seg_offsets, self._pend_seg_ids) if s in present]
        self._pend_seg_offsets, self._pend_seg_ids = [o for o, _ in kept], [s for _, s in kept]
        self._read_points = {o: p for o, p in self._read_points.items() if o <= next_offset and p[0] in present}
        self._durable_next = min(self._durable_next, next_offset)
        self._cut_during_round = next_offset if self._cut_during_round is None else min(self._cut_during_round,
                                                                                       next_offset)
        log.info("stream %s: cut back to offset %d (records its next writer does not have)", self._directory,
                 next_offset)

    def reset(self, next_offset: int) -> None:
        """Committed by its owner: drop every record; the stream goes on at ``next_offset``, in a
        segment of that name (a copy so far behind its writer that the writer no longer stores
        what it lacks). Consumer offsets stay. Durable before this returns."""
        if not self._external:
            raise RuntimeError("only a stream committed by its owner is reset")
        self._buffer.clear()
        if self._tail_fd is not None:
            os.close(self._tail_fd)
            self._tail_fd = None
        for seg in self._segments:
            seg.mark_dropped()
            for path in (seg.path, self._directory / index_file_name(seg.segment_id)):
                path.unlink(missing_ok=True)
                self._unsynced_paths.discard(str(path))
            for cursor in list(self._cursors):
                cursor.segment_dropped(seg)
        self._segments, self._segment_ids, self._tail, self._unindexed = [], [], None, []
        self.damage = []
        self._next = self._visible_next = self._durable_next = self._pend_base = next_offset
        self._visible_segment, self._visible_position = -1, 0
        self._last_chunk = NO_CHUNK
        self._pending_chunks.clear()
        del self._pend_end[:], self._pend_ts[:]
        self._pend_seg_offsets, self._pend_seg_ids = [], []
        self._read_points = {}
        self._roll_over()
        assert self._tail_fd is not None
        os.fsync(self._tail_fd)
        fsync_directory(self._directory)
        self._cut_during_round = next_offset if self._cut_during_round is None else min(self._cut_during_round,
                                                                                       next_offset)
        self._write_mark()
        log.info("stream %s: reset to start at offset %d", self._directory, next_offset)

    def drop_segments_before(self, first_kept: int) -> RetentionResult:
        """Drop the segments wholly before offset ``first_kept`` (the next one starts at or before
        it), as retention does: never the tail, never one with records not committed."""
        dropped: list[int] = []
        freed = 0
        segments = self._segments
        while (len(segments) > 1 and segments[1].segment_id <= first_kept and segments[0] is not self._tail
               and segments[0].segment_id < self._visible_segment):
            seg = segments[0]
            self._drop_first_segment()
            dropped.append(seg.segment_id)
            freed += seg.size
        return RetentionResult(dropped, freed, self.first_offset)

    def _record_start(self, offset: int) -> tuple[SegmentIndex, int]:
        """The segment and file position of the stored record ``offset``."""
        k = bisect_right(self._segment_ids, offset) - 1
        seg = self._segments[k]
        if offset == seg.segment_id:
            return seg, seg.header_length
        point = self._read_points.get(offset)
        if point is not None and point[0] == seg.segment_id:
            return seg, point[1]
        if self._external and offset > self._pend_base:
            return seg, self._pend_end[offset - 1 - self._pend_base]  # where the record before it ends
        if offset == self._visible_next and seg.segment_id == self._visible_segment:
            return seg, self._visible_position
        position, at = seg.seek(offset)
        if seg is self._tail and self._buffer:
            self.flush()
        with self._segment_fd(seg) as fd:
            while at < offset:
                data = os.pread(fd, max(self._interval, 4096), position)
                pos = 0
                while at < offset and len(data) - pos >= 4:
                    end = pos + 4 + LENGTH.unpack_from(data, pos)[0]
                    if end > len(data):
                        break
                    pos, at = end, at + 1
                if not pos:  # one record larger than the read: step over it by its length
                    pos = 4 + LENGTH.unpack_from(data, 0)[0]
                    at += 1
                position += pos
        return seg, position

    def _remember_read(self, offset: int, segment_id: int, position: int) -> None:
        points = self._read_points
        points[offset] = (segment_id, position)
        if len(points) > 32:
            del points[next(iter(points))]

    @contextmanager
    def _segment_fd(self, seg: SegmentIndex) -> Iterator[int]:
        if seg is self._tail and self._tail_fd is not None:
            yield self._tail_fd
            return
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_externally_committed(self, mark: CommitMark | None) -> None:
        """After recovery, committed by its owner: only what the commit mark ``mark`` names is
        committed (what follows may be records its owner will not keep), and each record after it
        gets its place in the pending lists."""
        end = self._next
        self._durable_next = end  # recovery fsynced the tail
        segments = self._segments
        ids = {s.segment_id: s for s in segments}
        if not segments:
            visible = (end, -1, 0)
        elif mark is not None and mark.next_offset >= end:
            tail = segments[-1]
            visible = (end, tail.segment_id, tail.size)
        elif (mark is not None and mark.segment_id in ids
              and ids[mark.segment_id].segment_id <= mark.next_offset <= ids[mark.segment_id].next_offset
              and ids[mark.segment_id].header_length <= mark.position <= ids[mark.segment_id].size):
            visible = (mark.next_offset, mark.segment_id, mark.position)
        else:
            first = segments[0]
            visible = (first.segment_id, first.segment_id, first.header_length)
        self._visible_next, self._visible_segment, self._visible_position = visible
        self._pend_base = self._visible_next
        if self._last_chunk != NO_CHUNK and self._last_chunk >= self._visible_next:
            self._last_chunk = NO_CHUNK  # (unknown: `last` then falls back to the last record)
        self._visible_last_ts = self._last_ts
        if not segments:
            self._write_mark()  # (docs/stream-files.md 8.1: a reader finds a mark from the open on)
            return
        k = max(bisect_right(self._segment_ids, self._visible_next) - 1, 0)
        self._pend_seg_offsets, self._pend_seg_ids = [self._visible_next], [segments[k].segment_id]
        position = self._visible_position if segments[k].segment_id == self._visible_segment else \
            segments[k].header_length
        offset = self._visible_next
        for seg in segments[k:]:
            if seg.segment_id != segments[k].segment_id:
                if seg.segment_id != offset:
                    break  # (offsets missing: damage, reported by recovery; cut off below)
                self._pend_seg_offsets.append(seg.segment_id)
                self._pend_seg_ids.append(seg.segment_id)
                position = seg.header_length
            out_of_sequence = False
            with self._segment_fd(seg) as fd:
                while position < seg.size and not out_of_sequence:
                    data = os.pread(fd, min(seg.size - position, 1 << 20), position)
                    if len(data) >= 4 and 4 + LENGTH.unpack_from(data, 0)[0] > len(data):
                        data = os.pread(fd, 4 + LENGTH.unpack_from(data, 0)[0], position)  # one large record
                    pos = 0
                    while len(data) - pos >= HEAD.size:
                        length, _, rtype, at, ts, flags, _ = HEAD.unpack_from(data, pos)
                        stop = pos + 4 + length
                        if stop > len(data):
                            break  # (the rest of it is in the next read)
                        if rtype == STREAM_RECORD:
                            if at != offset:
                                out_of_sequence = True
                                break
                            self._pend_end.append(position + stop)
                            self._pend_ts.append(ts)
                            if flags & FLAG_CHUNK_START:
                                self._pending_chunks.append(at)
                            offset += 1
                        pos = stop
                    if not pos:
                        break  # (recovery cut every torn tail: nothing readable is left)
                    position += pos
            if out_of_sequence:
                break
        if offset < self._next:
            log.warning("stream %s: records after offset %d are out of sequence and not committed: cut off",
                        self._directory, offset)
            self.truncate(offset)
        self._write_mark()

    def _write_mark(self) -> None:
        """Tell readers of the files where the committed records end (stream_commit_mark)."""
        if self._mark is None:
            return
        segment = None if self._visible_segment < 0 else self._visible_segment
        try:
            self._mark.write(CommitMark(segment, self._visible_position, self._visible_next))
        except OSError as err:  # readers then see an older mark, which is still true
            log.warning("writing the commit mark of stream %s failed: %s", self._directory, err)

    def _write_side_indexes(self, commit: _Commit) -> None:
        """Side files for what is now durable: each sealed segment once, and the tail every
        ``checkpoint_bytes``. Written without fsync (the next round or close fsyncs them)."""
        while self._unindexed and self._unindexed[0].segment_id < commit.segment_id:
            seg = self._unindexed.pop(0)
            if not seg.dropped:
                self._write_side_index(seg, checkpoint_of(seg))
        tail = self._tail
        at = commit.tail
        if tail is not None and at is not None and commit.segment_id == tail.segment_id:
            if at.covered_size - tail.indexed_size >= self.checkpoint_bytes:
                self._write_side_index(tail, at)

    def _write_side_index(self, seg: SegmentIndex, at: IndexCheckpoint) -> None:
        path = self._directory / index_file_name(seg.segment_id)
        write_replacing(path, encode_side_index(seg, at))  # fsynced by the next round (lost: a scan rebuilds it)
        seg.mark_indexed(at.covered_size)
        self._unsynced_paths.add(str(path))
        self._dir_dirty = True

    # ---- facts (committed records only) -------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The first offset still stored (``next_offset`` when the stream is empty)."""
        if not self._segments:
            return self._visible_next
        return min(self._segments[0].segment_id, self._visible_next)

    @property
    def next_offset(self) -> int:
        """One past the last committed record: where a consumer starting at ``next`` begins."""
        return self._visible_next

    @property
    def last_offset(self) -> int | None:
        """The last committed record's offset; None when the stream holds none."""
        return self._visible_next - 1 if self._visible_next > self.first_offset else None

    @property
    def last_chunk_offset(self) -> int | None:
        """The first offset of the last committed chunk (RabbitMQ's ``last``); None when empty."""
        if self._last_chunk == NO_CHUNK or self._last_chunk < self.first_offset:
            return self.last_offset
        return self._last_chunk

    @property
    def appended_offset(self) -> int:
        """The offset the next append gets (records before it may not be committed yet)."""
        return self._next

    def offset_at(self, timestamp_ms: int) -> int:
        """The offset of the first committed record with a timestamp at or after ``timestamp_ms``;
        ``next_offset`` when there is none."""
        segments = self._segments
        k = bisect_left(segments, timestamp_ms, key=_last_timestamp)
        while k < len(segments):
            seg = segments[k]
            if seg.segment_id >= self._visible_next:
                break
            if seg.record_count and seg.last_timestamp >= timestamp_ms:
                found = self._scan_for_time(seg, timestamp_ms)
                if found is not None:
                    return found
            k += 1
        return self._visible_next

    def _scan_for_time(self, seg: SegmentIndex, timestamp_ms: int) -> int | None:
        from persistence.stream_cursor import StreamCursor

        position, offset = seg.seek_time(timestamp_ms)
        cursor = StreamCursor.at_position(self, seg, position, offset)
        try:
            return cursor.first_at_or_after(timestamp_ms)
        finally:
            cursor.close()

    def disk_bytes(self) -> int:
        """Bytes of the segment files (written or buffered); side files not included."""
        return sum(s.size for s in self._segments) + len(self._buffer)

    def segments(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(s.segment_id, s.segment_id, s.next_offset, s.size, s.first_timestamp, s.last_timestamp)
            for s in self._segments
        ]

    # ---- for cursors --------------------------------------------------------------------

    def reader(
        self,
        offset: int,
        *,
        filter_values: Iterable[str] | None = None,
        match_unfiltered: bool = False,
        on_gap: GapCallback | None = None,
        read_size: int = 256 * 1024,
    ) -> StreamCursor:
        """A cursor that reads committed records from ``offset`` on (see stream_cursor).

        An offset below ``first_offset`` starts at the first stored record and reports the gap;
        one past ``next_offset`` is taken as ``next_offset``. With ``filter_values``, only records
        whose filter value is one of them are returned, and records without a filter value only
        if ``match_unfiltered``; the others are skipped without reading their message."""
        from persistence.stream_cursor import StreamCursor

        if offset < 0:
            raise ValueError(f"a stream offset is at least 0, got {offset}")
        cursor = StreamCursor(self, offset, filter_values, match_unfiltered, on_gap, read_size)
        self._cursors.add(cursor)
        return cursor

    def readable_end(self, seg: SegmentIndex) -> int:
        """The file position up to which ``seg`` holds committed records."""
        committed = self._visible_segment
        if seg.segment_id < committed:
            return seg.size
        if seg.segment_id == committed:
            return self._visible_position
        return seg.header_length

    def is_sealed(self, seg: SegmentIndex) -> bool:
        """True when nothing more will be appended to ``seg``."""
        return seg is not self._tail

    def segment_after(self, seg: SegmentIndex) -> SegmentIndex | None:
        k = bisect_right(self._segment_ids, seg.segment_id)
        return self._segments[k] if k < len(self._segments) else None

    def locate(self, offset: int) -> tuple[SegmentIndex, int, int] | None:
        """(segment, file position, offset of the record there) to read forward from to reach
        ``offset``; None when the stream has no segment."""
        if not self._segments:
            return None
        k = max(bisect_right(self._segment_ids, offset) - 1, 0)
        seg = self._segments[k]
        position, at = seg.seek(offset)
        return seg, position, at

    def forget_cursor(self, cursor: StreamCursor) -> None:
        self._cursors.discard(cursor)

    def share_block(self, block: RecordBlock, reader: StreamCursor) -> None:
        """``reader`` read ``block``: keep it for the cursors without a filter still before its
        end, and let go of the kept blocks every such cursor is past (stream_blocks)."""
        behind = end = (block.segment_id, block.end)
        wanted = False
        for cursor in self._cursors:
            if not cursor.reads_blocks:
                continue
            place = cursor.place
            if place is None:
                place = (-1, 0)  # not placed yet (it starts at the first record kept, or after a gap)
            if place < behind:
                behind = place
            if cursor is not reader and place < end:
                wanted = True
        self.blocks.drop_before(*behind)
        if wanted:
            self.blocks.keep(block)

    # ---- retention -------------------------------------------------------------------------

    def set_retention(self, max_bytes: int | None, max_age_ms: int | None) -> None:
        """The limits applied at every segment roll-over (``apply_retention``); None: no limit."""
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms

    def apply_retention(self, now_ms: int | None = None) -> RetentionResult:
        """``enforce_retention`` with the limits of ``set_retention`` (the owner calls it on a timer
        for ``max_age_ms``, which time alone can exceed)."""
        return self.enforce_retention(self.max_bytes, self.max_age_ms, now_ms)

    def enforce_retention(
        self, max_bytes: int | None, max_age_ms: int | None, now_ms: int | None = None
    ) -> RetentionResult:
        """Drop whole segments from the front, never the tail nor one with records not yet
        committed, while the segments take more than ``max_bytes`` or while the oldest one's
        newest record is older than ``max_age_ms``. Cursors in a dropped segment go on from the
        first record kept, and report the gap."""
        now = self._clock_ms() if now_ms is None else now_ms
        cutoff = None if max_age_ms is None else now - max_age_ms
        total = self.disk_bytes()
        dropped: list[int] = []
        freed = 0
        segments = self._segments
        while len(segments) - len(dropped) > 1:
            seg = segments[len(dropped)]
            if seg is self._tail or seg.segment_id >= self._visible_segment:
                self._retention_due = True  # not committed yet: look again after the next round
                break
            too_big = max_bytes is not None and total > max_bytes
            too_old = cutoff is not None and seg.last_timestamp < cutoff
            if not (too_big or too_old):
                break
            total -= seg.size
            freed += seg.size
            dropped.append(seg.segment_id)
        if dropped and self._external:
            # Its owner decides with every copy of the stream, and drops them (drop_segments_before).
            if self._on_retention is not None:
                self._on_retention(segments[len(dropped)].segment_id)
            return RetentionResult([], 0, self.first_offset)
        for _ in dropped:
            self._drop_first_segment()
        return RetentionResult(dropped, freed, self.first_offset)

    def _drop_first_segment(self) -> None:
        seg = self._segments.pop(0)
        del self._segment_ids[0]
        seg.mark_dropped()
        for path in (seg.path, self._directory / index_file_name(seg.segment_id)):
            path.unlink(missing_ok=True)
            self._unsynced_paths.discard(str(path))
        self._dir_dirty = True
        self.damage = [d for d in self.damage if d.path != str(seg.path)]
        self.blocks.drop_segment(seg.segment_id)
        for cursor in list(self._cursors):
            cursor.segment_dropped(seg)

    # ---- rolling over --------------------------------------------------------------------

    def _roll_over(self) -> SegmentIndex:
        """Seal the tail (if any) and start a new segment named after the next offset."""
        self.flush()
        first = self._next
        path = self._directory / segment_file_name(first)
        created = self._clock_ms()
        header = encode_header(first, created)
        fd = create_segment(path, header)
        old = self._tail
        if old is not None and self._tail_fd is not None:
            os.close(self._tail_fd)
            self._unsynced_paths.add(str(old.path))
            self._unindexed.append(old)
        seg = SegmentIndex(first, path, HEADER_SIZE, created, self._interval)
        seg.set_size(len(header))
        self._segments.append(seg)
        self._segment_ids.append(first)
        self._tail, self._tail_fd = seg, fd
        self._dir_dirty = True
        if self._external:
            self._pend_seg_offsets.append(first)
            self._pend_seg_ids.append(first)
        if old is not None and (self.max_bytes is not None or self.max_age_ms is not None):
            self.apply_retention()
        return seg

    # ---- recovery ----------------------------------------------------------------------------

    def _recover(self) -> None:
        started = time.monotonic()
        make_stream_directory(self._directory, self.vhost, self.name, self._clock_ms())
        self.offsets = StreamOffsets(self._directory, self._committer)
        found = recover_segments(self._directory, self._interval)
        self.damage = found.damage
        self._segments = found.segments
        self._segment_ids = [s.segment_id for s in found.segments]
        if self._segments:
            tail = self._segments[-1]
            self._tail = tail
            self._tail_fd = os.open(tail.path, os.O_RDWR | os.O_APPEND)
            os.fsync(self._tail_fd)  # what a crashed broker left in the page cache is durable before it is read
            self._next = tail.next_offset
            self._last_ts = max(s.last_timestamp for s in self._segments)
            self._visible_next = self._next
            self._visible_segment = tail.segment_id
            self._visible_position = tail.size
            for seg in reversed(self._segments):
                if seg.last_chunk != NO_CHUNK:
                    self._last_chunk = seg.last_chunk
                    break
        mark = None
        if self._external:
            try:  # (before the writer opens the file: a new one is empty until written)
                mark = read_commit_mark(self._directory)
            except DamagedCommitMark:
                mark = None
        self._mark = CommitMarkWriter(self._directory)
        if self._external:
            self._open_externally_committed(mark)
        else:
            self._write_mark()  # everything recovered is committed now (the tail was fsynced above)
        seconds = time.monotonic() - started
        self.recovery = StreamRecovery(len(self._segments), found.scanned_bytes, found.truncated_bytes, seconds)

    # ---- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, fsync, write the side files (so the next open scans nothing) and close the files
        (blocking; for shutdown). Open cursors keep working on what was committed."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.sync_now()
                tail = self._tail
                for seg in [*self._unindexed, *([tail] if tail is not None else [])]:
                    if not seg.dropped and seg.indexed_size != seg.size:
                        path = self._directory / index_file_name(seg.segment_id)
                        write_atomically(path, encode_side_index(seg, checkpoint_of(seg)))
                        seg.mark_indexed(seg.size)
                self._unindexed = []
                self.offsets.close()
        finally:
            self._closed = True
            if self._tail_fd is not None:
                os.close(self._tail_fd)
                self._tail_fd = None
            if self._mark is not None:
                self._mark.close()

    def delete(self) -> None:
        """Remove the stream's files (the stream was deleted)."""
        self._closed = True
        if self._tail_fd is not None:
            os.close(self._tail_fd)
            self._tail_fd = None
        if self._mark is not None:
            self._mark.close()
        self._buffer.clear()
        for cursor in list(self._cursors):
            cursor.close()
        self.blocks.clear()
        for seg in self._segments:
            seg.mark_dropped()
        self._segments, self._segment_ids, self._tail = [], [], None
        self.offsets.discard()
        shutil.rmtree(self._directory, ignore_errors=True)
        if self._directory.parent.is_dir():
            fsync_directory(self._directory.parent)

    def _check_writable(self, external: bool = False) -> None:
        """``external``: a record another copy of the stream wrote (``append_record``), which a
        copy that does not write itself (``set_writable``) still takes."""
        if self._closed:
            raise RuntimeError("the stream is closed")
        if self._failed is not None:
            raise OSError(self._failed.errno, f"stream failed earlier: {self._failed}")
        if not (self._writable or external):
            raise OSError(errno.EROFS, f"stream {self.name!r} takes no appends here now (its owner says so)")


def _last_timestamp(seg: SegmentIndex) -> int:
    return seg.last_timestamp


def _log_sync_failure(error: OSError | None) -> None:
    if error is not None:
        log.error("fsync of a stream failed: %s", error)


__all__ = ["StreamLog", "StreamOptions", "RetentionResult", "SegmentInfo", "StreamRecovery"]
