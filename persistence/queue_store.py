"""The append-only segment files of one durable queue.

``QueueStore`` appends message records and state records (delivered, acked,
dropped, ...) to the queue's newest segment (the *tail*), batching them in
memory and writing each batch with one ``os.write``. It keeps a compact index
from sequence number to (segment, offset) for random reads (``SegmentEntry``,
persistence/store_index.py), rolls over to a
new segment past ``segment_size``, and removes segments (or moves them to the
archive) once nothing in them is needed any more. Durability is the job of a
``GroupCommitter``: the store implements its ``Syncable`` protocol.

Promises:
  * ``recover()`` must be called once before anything else; it returns what
    is still in the queue (see store_recovery) and repairs damaged tails.
  * A message's sequence number must be above every earlier one.
  * A record reaches the OS at the latest on the next ``flush()``,
    ``prepare_sync()`` or ``read_message()`` of it, or once the buffer holds
    ``write_buffer_size`` bytes; ``on_dirty(store)`` is called when the buffer
    stops being empty so the owner can schedule a flush.
  * A segment is removed only when every message in it is settled and every
    older segment its state records talk about is already removed, so
    recovery never forgets that a message it still has was settled.
  * Not thread-safe: use it from the event loop thread only.

docs/queue-files.md describes the files.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Never

from persistence.atomic_file import fsync_directory, fsync_if_present
from persistence.buffered_tail import BUFFER_LIMIT_FACTOR, BufferedTail
from persistence.group_commit import SyncJob
from persistence.record_format import (
    MessageRecord,
    MessageState,
    Reason,
    RecordType,
    decode_payload,
    encode_message,
    encode_state,
    encode_state_of,
    state_kind,
)
from persistence.segment_file import (
    HEADER_SIZE,
    SUFFIX,
    CorruptRecord,
    create_segment,
    encode_header,
    read_record,
    segment_file_name,
)
from persistence.segment_layout import ensure_queue_directory, queue_path
from persistence.store_index import DELIVERED, READY, SETTLED, WAITING_RETRY, SegmentEntry, locate
from persistence.store_recovery import Recovery, highest_message_seq, replay_segments

log = logging.getLogger(__name__)


# ---- the store ---------------------------------------------------------------------------

DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024
DEFAULT_WRITE_BUFFER_SIZE = 1024 * 1024
DEFAULT_DRAIN_ROLLOVER_SIZE = 1024 * 1024
_MAX_SEGMENT_SIZE = 0xFFFF_FFFF  # offsets are kept as u32
_RUNTIME_STATE: dict[int, int] = {  # by record type: an int key, not an enum (hashed in Python) per record
    RecordType.DELIVERED: DELIVERED,
    RecordType.REQUEUED: READY,
    RecordType.WAITING_RETRY: WAITING_RETRY,
}


# What a store that has no segments holds instead of lists of its own, and the empty value of its
# sets of pending syncs (frozensets, replaced on change: they are small and rarely change): shared
# and immutable, so the many idle durable queues of a broker carry no such objects of their own
# (each would be one more for every full garbage collection to scan).
_NO_SEGMENTS: tuple[()] = ()
_NOTHING: frozenset[Never] = frozenset()


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueStore(BufferedTail):
    """Segment files of one queue directory; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        vhost: str,
        queue: str,
        *,
        archive_directory: Path | None = None,
        archive: bool = False,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        write_buffer_size: int = DEFAULT_WRITE_BUFFER_SIZE,
        drain_rollover_size: int = DEFAULT_DRAIN_ROLLOVER_SIZE,
        on_dirty: Callable[["QueueStore"], None] | None = None,
        on_segment_sealed: Callable[[Path], None] | None = None,
        sync_directory: Callable[[Path], None] = fsync_directory,
        on_deleted: Callable[[Path], None] | None = None,
    ) -> None:
        """``on_deleted(parent)``, when given, makes a deleted queue's removal from ``parent``
        durable later (the group committer's round) instead of fsyncing it in ``delete``."""
        if not HEADER_SIZE < segment_size <= _MAX_SEGMENT_SIZE:
            raise ValueError(f"segment_size must be in {HEADER_SIZE + 1}..{_MAX_SEGMENT_SIZE}")
        if archive and archive_directory is None:
            raise ValueError("archive=True needs an archive_directory")
        # Kept as text (see directory): a Path is two objects for the garbage collector to scan.
        self._directory = str(directory)
        self.vhost = vhost
        self.queue = queue
        self._archive_directory = None if archive_directory is None else str(archive_directory)
        self.archive = archive
        self.segment_size = segment_size
        self.write_buffer_size = write_buffer_size
        self.drain_rollover_size = drain_rollover_size
        self.on_dirty = on_dirty
        # Called with a segment's path when it stops being the tail (no more appends to it).
        self.on_segment_sealed = on_segment_sealed
        self._sync_directory = sync_directory
        self._on_deleted = on_deleted
        self._segments: list[SegmentEntry] | tuple[()] = _NO_SEGMENTS
        self._segment_ids: list[int] | tuple[()] = _NO_SEGMENTS
        self._tail: SegmentEntry | None = None
        self._tail_fd: int | None = None
        self._buffer = bytearray()
        self._last_seq = 0
        self._next_segment_floor = 1  # a new segment's id is at least this
        self._read_fd: tuple[int, int] | None = None  # (segment id, fd) of the last sealed segment read
        self._unsynced_paths: frozenset[str] = _NOTHING  # sealed segments written since the last sync round
        self._dir_dirty = False
        self._unsynced_directories: frozenset[str] = _NOTHING  # created (or changed) and not fsynced yet
        self._directory_made = False  # the queue directory exists (made at the first segment)
        self._deleted_not_durable: frozenset[int] = _NOTHING  # removed segments whose removal is not fsynced yet
        self._recovered = False
        self._closed = False
        self._failed: OSError | None = None

    @property
    def directory(self) -> Path:
        """The queue's directory (made when its first segment is)."""
        return Path(self._directory)

    @property
    def archive_directory(self) -> Path | None:
        """Where settled segments go when the queue archives (None: nowhere)."""
        return None if self._archive_directory is None else Path(self._archive_directory)

    def set_archive(self, archive: bool) -> None:
        """Keep fully acked segments from now on (or stop keeping them); segments already
        deleted stay deleted."""
        if archive and self.archive_directory is None:
            raise ValueError("archive=True needs an archive_directory")
        self.archive = archive

    @classmethod
    def for_queue(cls, data_dir: Path, vhost: str, queue: str, *, archive: bool = False, **options: Any) -> "QueueStore":
        """The store of queue ``queue`` in ``vhost`` under ``data_dir`` (layout in segment_layout)."""
        return cls(
            queue_path(data_dir, vhost, queue),
            vhost,
            queue,
            archive_directory=queue_path(data_dir, vhost, queue, archive=True),
            archive=archive,
            **options,
        )

    # ---- recovery -------------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Open the queue directory and return the messages still in the queue.

        A new queue's directory is made when its first segment is (``_roll_over``): declaring
        a durable queue touches no file, so a storm of declarations costs the event loop no
        disk work (the queue itself is kept by the definition store)."""
        if self._recovered:
            raise RuntimeError("recover() was already called")
        if self.directory.is_dir():
            self._make_directory()  # meta files lost or damaged since are written again
        segments, recovery, last_seq, highest_id = replay_segments(self.directory)
        if segments:
            self._segments = segments
            self._segment_ids = [s.segment_id for s in segments]
        self._last_seq = last_seq
        floor = max(last_seq + 1, highest_id, 1)
        if not segments and self.archive_directory is not None and self.archive_directory.is_dir():
            # Keep sequence numbers unique across the queue's history, archive included.
            floor = max(floor, highest_message_seq(self.archive_directory) + 1)
        self._next_segment_floor = floor
        recovery.next_seq = floor
        if segments:
            self._tail = segments[-1]
            self._tail_fd = os.open(self._tail.path, os.O_RDWR | os.O_APPEND)
        self._recovered = True
        self._collect_garbage()
        return recovery

    # ---- appending ------------------------------------------------------------------------

    def append_message(
        self, seq: int, published_at_ms: int, exchange: str, routing_key: str, raw_properties: bytes, body: bytes
    ) -> None:
        """Append a message record; ``raw_properties`` are the content header's property flags + list.
        If it raises, nothing was added."""
        self._before_append()
        if seq <= self._last_seq or seq < self._next_segment_floor:  # seq < self.next_seq
            raise ValueError(f"sequence number {seq} is below next_seq ({self.next_seq})")
        head, body = encode_message(seq, published_at_ms, exchange, routing_key, raw_properties, body)
        size = len(head) + len(body)
        tail = self._tail
        if tail is None or (
            tail.size + len(self._buffer) + size > self.segment_size
            and tail.size + len(self._buffer) > tail.header_length
            and tail.segment_id != seq
        ):
            tail = self._roll_over(seq)
        was_empty = not self._buffer
        offset = tail.size + len(self._buffer)
        self._buffer += head
        self._buffer += body
        tail.add(seq, offset)
        self._last_seq = seq
        self._after_append(was_empty)

    def append_state(
        self,
        seq: int,
        state: MessageState | str,
        at_ms: int,
        *,
        delivery_count: int = 0,
        due_at_ms: int = 0,
        reason: Reason | str = Reason.UNSPECIFIED,
    ) -> bool:
        """Record what happened to message ``seq``. Returns False (and writes nothing) when the
        message was already settled. Raises KeyError for a sequence number the store does not hold.

        ``delivery_count`` goes with delivered, requeued and waiting_retry; ``due_at_ms`` with
        waiting_retry; ``reason`` ("rejected", "expired", "maxlen", "delivery_limit") with
        dropped and dead_lettered. Use ``purge()`` rather than the "purged" state.
        If it raises, nothing was recorded."""
        self._before_append()
        kind = state_kind(state)
        if kind.state is MessageState.PURGED:
            raise ValueError("use purge() to purge a queue")
        if reason.__class__ is str:
            reason = Reason[reason.upper()]
        found = self._locate(seq)
        if found is None:
            raise KeyError(f"message {seq} is not in this queue store")
        entry, i = found
        if entry.states[i] == SETTLED:
            return False
        tail = self._tail
        assert tail is not None
        was_empty = not self._buffer
        # A Reason by now (`reason.__class__ is str` above, cheaper per record than isinstance,
        # does not narrow for mypy).
        self._buffer += encode_state_of(kind, seq, at_ms, delivery_count, due_at_ms, reason)  # type: ignore[arg-type]
        if entry is not tail:
            tail.refs.add(entry.segment_id)
        if kind.settles:
            entry.settle(i)
            if entry.live == 0:
                self._collect_garbage_safely()
        else:
            entry.states[i] = _RUNTIME_STATE[kind.rtype]
        self._after_append(was_empty)
        return True

    def purge(self, at_ms: int | None = None) -> int:
        """Settle every message that is ready or waiting for a retry (not those with consumers),
        free the segments that leaves unneeded, and return how many were purged."""
        self._before_append()
        purged = 0
        for entry in self._segments:
            states = entry.states
            for i in range(len(states)):
                if states[i] in (READY, WAITING_RETRY):
                    entry.settle(i)
                    purged += 1
        if purged == 0:
            return 0
        tail = self._tail
        assert tail is not None
        was_empty = not self._buffer
        self._buffer += encode_state(MessageState.PURGED, self._last_seq, _now_ms() if at_ms is None else at_ms)
        tail.refs.update(s.segment_id for s in self._segments if s is not tail)
        self._after_append(was_empty)
        self._collect_garbage(force_tail_reset=True)
        return purged

    def _before_append(self) -> None:
        self._check_writable()
        if len(self._buffer) >= BUFFER_LIMIT_FACTOR * self.write_buffer_size:
            self.flush()  # writes keep failing: refuse new records (raises) rather than grow without bound

    def _after_append(self, was_empty: bool) -> None:
        if len(self._buffer) >= self.write_buffer_size:
            try:
                self.flush()
            except OSError as err:
                # The record is kept in the buffer and the write retried; whoever waits for a
                # sync of this store gets the error from prepare_sync.
                log.warning("writing to %s failed: %s; will retry", self.directory, err)
        elif was_empty and self.on_dirty is not None:
            self.on_dirty(self)

    def _collect_garbage_safely(self) -> None:
        try:
            self._collect_garbage()
        except OSError:
            log.exception("removing settled segments of %s failed; will retry later", self.directory)

    # ---- reading --------------------------------------------------------------------------

    def read_message(self, seq: int) -> MessageRecord:
        """The stored message ``seq`` (settled or not, while its segment exists); KeyError if unknown."""
        found = self._locate(seq)
        if found is None:
            raise KeyError(f"message {seq} is not in this queue store")
        entry, i = found
        offset = entry.offsets[i]
        if entry is self._tail:
            if offset >= entry.size:
                self.flush()
            fd = self._tail_fd
        else:
            fd = self._sealed_read_fd(entry)
        assert fd is not None
        rtype, payload = read_record(fd, offset, str(entry.path))
        record = decode_payload(rtype, payload)
        if rtype != RecordType.MESSAGE or not isinstance(record, MessageRecord) or record.seq != seq:
            raise CorruptRecord(f"{entry.path}: offset {offset} does not hold message {seq}")
        return record

    def _sealed_read_fd(self, entry: SegmentEntry) -> int:
        if self._read_fd is not None and self._read_fd[0] == entry.segment_id:
            return self._read_fd[1]
        self._close_read_fd()
        fd = os.open(entry.path, os.O_RDONLY)
        self._read_fd = (entry.segment_id, fd)
        return fd

    def _close_read_fd(self) -> None:
        if self._read_fd is not None:
            os.close(self._read_fd[1])
            self._read_fd = None

    def _locate(self, seq: int) -> tuple[SegmentEntry, int] | None:
        return locate(self._segments, self._segment_ids, seq)

    # ---- facts ----------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        """Messages not yet settled (ready, with a consumer, or waiting for a retry)."""
        return sum(s.live for s in self._segments)

    @property
    def next_seq(self) -> int:
        return max(self._last_seq + 1, self._next_segment_floor)

    @property
    def segment_ids(self) -> list[int]:
        return list(self._segment_ids)

    def disk_bytes(self) -> int:
        return sum(s.size for s in self._segments) + len(self._buffer)

    # ---- group commit (Syncable) ----------------------------------------------------------

    def prepare_sync(self) -> SyncJob:
        """Flush, and hand over what must be fsynced for everything written so far to be durable."""
        if self._failed is not None:
            raise self._failed
        self.flush()
        job = SyncJob(token=frozenset(self._deleted_not_durable))
        if self._tail_fd is not None:
            job.fds.append(os.dup(self._tail_fd))
        if self._unsynced_paths:
            job.paths = sorted(self._unsynced_paths)
            self._unsynced_paths = _NOTHING
        directories = self._unsynced_directories
        if self._dir_dirty:
            directories = directories | {self._directory}
            self._dir_dirty = False
        if directories:
            job.directories = sorted(directories)
            self._unsynced_directories = _NOTHING
        return job

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        if error is not None:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing written
            # since can be trusted to reach the disk, so stop accepting writes (fail-stop).
            self._failed = error
            log.error("fsync failed in %s: %s; the queue store stops accepting writes", self.directory, error)
            return
        assert isinstance(job.token, frozenset)
        if self._deleted_not_durable:
            self._deleted_not_durable = (self._deleted_not_durable - job.token) or _NOTHING

    # ---- rolling over and removing segments -----------------------------------------------

    def _make_directory(self) -> None:
        """Create the queue directory and its meta files if missing, without waiting for the
        disk: the next sync round fsyncs the new names before any record in them is acknowledged."""
        for path in ensure_queue_directory(self.directory, self.vhost, self.queue, durably=False):
            if path.is_dir():
                self._unsynced_directories = self._unsynced_directories | {str(path)}
            else:
                self._unsynced_paths = self._unsynced_paths | {str(path)}
        self._directory_made = True

    def _roll_over(self, first_seq: int) -> SegmentEntry:
        """Seal the tail (if any) and start a new segment named ``first_seq``."""
        self.flush()
        if not self._directory_made:
            self._make_directory()
        path = self.directory / segment_file_name(first_seq)
        header = encode_header(first_seq, _now_ms())
        fd = create_segment(path, header)
        sealed = None
        if self._tail is not None and self._tail_fd is not None:
            os.close(self._tail_fd)
            self._unsynced_paths = self._unsynced_paths | {str(self._tail.path)}
            sealed = self._tail.path
        entry = SegmentEntry(first_seq, path, HEADER_SIZE, len(header))
        if self._segments is _NO_SEGMENTS:
            self._segments, self._segment_ids = [], []
        # Lists now (mypy does not narrow by `is _NO_SEGMENTS`).
        self._segments.append(entry)  # type: ignore[union-attr]
        self._segment_ids.append(first_seq)  # type: ignore[union-attr]
        self._tail, self._tail_fd = entry, fd
        if sealed is not None and self.on_segment_sealed is not None:
            self.on_segment_sealed(sealed)
        self._dir_dirty = True
        self._next_segment_floor = max(self._next_segment_floor, first_seq)
        return entry

    def _collect_garbage(self, force_tail_reset: bool = False) -> None:
        while True:
            present = set(self._segment_ids)
            removable = [
                s for s in self._segments if s is not self._tail and s.live == 0 and not (s.refs & present)
            ]
            if not removable:
                if self._reset_drained_tail(force_tail_reset):
                    continue  # the old tail is now sealed and removable
                return
            self._make_removals_durable_before(removable)
            for entry in removable:
                self._remove_segment(entry)

    def _make_removals_durable_before(self, entries: list[SegmentEntry]) -> None:
        """Removing a segment drops the state records in it; if the segments those records are
        about were removed but the removals are not yet durable, a crash could bring those
        messages back without their states. So fsync the directory first (rare: the group
        commit's rounds usually made the removals durable already)."""
        if any(entry.refs & self._deleted_not_durable for entry in entries):
            self._sync_directory(self.directory)
            self._deleted_not_durable = _NOTHING

    def _reset_drained_tail(self, force: bool) -> bool:
        """When every message in the tail is settled and it holds at least ``drain_rollover_size``
        bytes (or ``force``), free its space: start a new tail (the old one becomes removable), or,
        for a tail without messages and no archive, cut it back to its header. True if it rolled."""
        tail = self._tail
        if tail is None or tail.live != 0 or tail.refs & set(self._segment_ids):
            return False
        used = tail.size + len(self._buffer)
        if used <= tail.header_length or (not force and used < self.drain_rollover_size):
            return False
        self._make_removals_durable_before([tail])
        if tail.message_count:
            self._roll_over(self._last_seq + 1)
            return True
        if not self.archive and self._tail_fd is not None:
            self._buffer.clear()  # nothing in it is needed: everything it refers to is gone
            os.ftruncate(self._tail_fd, tail.header_length)
            tail.size = tail.header_length
            tail.refs.clear()
        return False

    def _remove_segment(self, entry: SegmentEntry) -> None:
        if self._read_fd is not None and self._read_fd[0] == entry.segment_id:
            self._close_read_fd()
        if self.archive:
            self._move_to_archive(entry.path)
        else:
            entry.path.unlink(missing_ok=True)
        k = self._segments.index(entry)
        # Lists: the entry is one of the segments (mypy cannot tell them from _NO_SEGMENTS).
        del self._segments[k]  # type: ignore[union-attr]
        del self._segment_ids[k]  # type: ignore[union-attr]
        self._unsynced_paths = self._unsynced_paths - {str(entry.path)} or _NOTHING
        self._deleted_not_durable = self._deleted_not_durable | {entry.segment_id}
        self._dir_dirty = True

    def _move_to_archive(self, path: Path) -> None:
        assert self.archive_directory is not None
        ensure_queue_directory(self.archive_directory, self.vhost, self.queue)
        target = self.archive_directory / path.name
        n = 1
        while target.exists():  # only if the archive was edited by hand: keep both
            target = self.archive_directory / f"{path.name.removesuffix(SUFFIX)}.{n}{SUFFIX}"
            n += 1
        try:
            os.rename(path, target)
        except OSError:
            shutil.move(str(path), str(target))

    # ---- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, fsync and close the files (blocking; for shutdown)."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.flush()
                if self._tail_fd is not None:
                    os.fsync(self._tail_fd)
                for path in self._unsynced_paths:
                    fsync_if_present(path)
                for directory in sorted(self._unsynced_directories):
                    self._sync_directory(Path(directory))
                if self._dir_dirty:
                    self._sync_directory(self.directory)
        finally:
            self._release_fds()

    def delete(self) -> None:
        """Remove the queue's files (the queue was deleted). With archive on, its segments move to
        the archive first, so their history stays readable."""
        if self.archive and self._failed is None:
            self.flush()  # the archive keeps the whole history
        self._release_fds()
        self._buffer.clear()
        if self.archive and self.directory.is_dir():
            for entry in self._segments:
                if entry.path.exists():
                    self._move_to_archive(entry.path)
        if not self._directory_made:  # never written: nothing on disk to remove
            self._segments, self._segment_ids = _NO_SEGMENTS, _NO_SEGMENTS
            return
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._on_deleted is not None:
            self._on_deleted(self.directory.parent)
        elif self.directory.parent.is_dir():
            self._sync_directory(self.directory.parent)
        self._segments, self._segment_ids = _NO_SEGMENTS, _NO_SEGMENTS

    def _release_fds(self) -> None:
        self._closed = True
        self._close_read_fd()
        if self._tail_fd is not None:
            os.close(self._tail_fd)
            self._tail_fd = None

    def _check_writable(self) -> None:
        if not self._recovered:
            raise RuntimeError("call recover() before writing")
        if self._closed:
            raise RuntimeError("the queue store is closed")
        if self._failed is not None:
            raise OSError(self._failed.errno, f"queue store failed earlier: {self._failed}")

