"""A queue replica's log on disk: `ReplicaLog`, the interface the state machines use, and
`FileReplicaLog`, an append-only file of entries (`entries`) plus the term this replica has
promised.

Promises of `FileReplicaLog`:
  * Entries are numbered 1, 2, 3, ... with no gaps; ``term_at(i)`` never decreases with ``i``.
  * ``durable_index`` is the highest index whose entry, and every one before it, is fsynced.
    It rises only in ``sync_done`` (the group committer's round) and falls only when
    ``truncate_after`` cuts entries. Records reach the OS at the latest at the next ``flush``.
  * ``promise(term)`` is fsynced before it returns: after a crash the replica still refuses
    every older term (``promised_term`` is also never below the last entry's term).
  * Opening drops a torn or damaged tail (logged); entries before it are kept.
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
from persistence.atomic_file import write_atomically
from persistence.group_commit import SyncJob

log = logging.getLogger(__name__)

LOG_FILE = "replica.log"
TERM_FILE = "term.json"
MAGIC = b"AMQPRLOG"
_HEADER = struct.Struct(">8sHHI")  # magic, version, reserved, crc of the 12 bytes before it
HEADER_SIZE = _HEADER.size
FORMAT_VERSION = 1
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
        stream's retention does); a follower that needs an earlier one is sent RESET."""
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


def _header() -> bytes:
    head = struct.pack(">8sHH", MAGIC, FORMAT_VERSION, 0)
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
    """`ReplicaLog` in ``directory/replica.log`` and ``directory/term.json``; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._path = self.directory / LOG_FILE
        self._starts = array("Q")  # byte offset of entry i at [i - 1]
        self._terms = array("Q")  # term of entry i at [i - 1]
        self._size = HEADER_SIZE  # bytes in the file
        self._buffer = bytearray()  # appended, not yet written to the file
        self._durable_index = 0
        self._cut_during_round: int | None = None  # lowest truncation since the last prepare_sync
        self._promised = self._read_promise()
        # True when this replica started with no log at all: new, or its disk was wiped.
        self.created_empty = False
        self._fd = self._open()
        self._promised = max(self._promised, self.last_term)

    # ---- opening -----------------------------------------------------------------------

    def _read_promise(self) -> int:
        try:
            return int(json.loads((self.directory / TERM_FILE).read_text())["promised_term"])
        except FileNotFoundError:
            return 0

    def _open(self) -> int:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        header = os.pread(fd, HEADER_SIZE, 0)
        if len(header) < HEADER_SIZE:  # new, or a crash while creating it
            self.created_empty = True
            os.ftruncate(fd, 0)
            os.write(fd, _header())
            os.fsync(fd)
            write_atomically(self.directory / TERM_FILE, json.dumps({"promised_term": self._promised}).encode())
            return fd
        magic, version, _, crc = _HEADER.unpack(header)
        if magic != MAGIC or zlib.crc32(header[:12]) != crc:
            os.close(fd)
            raise ValueError(f"{self._path} is not a replica log")
        if version != FORMAT_VERSION:
            os.close(fd)
            raise ValueError(f"{self._path} is in format {version}; this build reads {FORMAT_VERSION}")
        self._recover(fd)
        return fd

    def _recover(self, fd: int) -> None:
        file_size = os.fstat(fd).st_size
        base = HEADER_SIZE  # file offset of pending[0]
        pending = b""
        expected = 1
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
        if base < file_size:
            log.warning("%s: dropping %d bytes of torn or damaged tail at offset %d (entry %d on)",
                        self._path, file_size - base, base, expected)
            os.ftruncate(fd, base)
            os.fsync(fd)
        self._size = base
        if self._terms:
            os.fsync(fd)  # after a process crash the kernel may still hold some of it: make it durable
        self._durable_index = self.last_index

    # ---- facts ---------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return len(self._terms)

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else 0

    @property
    def durable_index(self) -> int:
        return self._durable_index

    @property
    def promised_term(self) -> int:
        return self._promised

    def term_at(self, index: int) -> int:
        if index == 0:
            return 0
        return self._terms[index - 1]

    def _end_of(self, index: int) -> int:
        """Byte offset just after entry ``index``."""
        return self._starts[index] if index < len(self._starts) else self._size + len(self._buffer)

    # ---- writing -------------------------------------------------------------------------

    def append(self, term: int, payload: bytes) -> int:
        index = self.last_index + 1
        self._starts.append(self._size + len(self._buffer))
        self._terms.append(term)
        self._buffer += encode_entry(index, term, payload)
        return index

    def append_entries(self, data: bytes, heads: list[EntryHead]) -> None:
        if heads and heads[0].index != self.last_index + 1:
            raise ValueError(f"entries start at {heads[0].index}, the log ends at {self.last_index}")
        offset = self._size + len(self._buffer) - (heads[0].start if heads else 0)
        for head in heads:
            self._starts.append(offset + head.start)
            self._terms.append(head.term)
        if heads:
            self._buffer += memoryview(data)[heads[0].start:heads[-1].end]

    def truncate_after(self, index: int) -> None:
        if index >= self.last_index:
            return
        cut = self._starts[index]
        if cut >= self._size:
            del self._buffer[cut - self._size:]
        else:
            self._buffer.clear()
            os.ftruncate(self._fd, cut)
            self._size = cut
        del self._starts[index:]
        del self._terms[index:]
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
        view = memoryview(self._buffer)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        finally:
            view.release()
            if written:
                self._size += written
                del self._buffer[:written]

    # ---- what a queue's log does not do (ReplicaStore) ---------------------------------------

    follows_commits = False  # a queue's followers only keep the log, which a new leader replays

    @property
    def first_index(self) -> int:
        return 1  # a queue's log keeps every entry

    def reset_point(self, index: int) -> tuple[int, bytes]:
        return index, b""

    def reset(self, base_index: int, base_term: int, base_position: int, document: bytes) -> None:
        raise NotImplementedError("a queue's replica log keeps every entry: it is never reset")

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
        return bisect.bisect_left(self._terms, term) + 1

    def read_entries(self, first_index: int, max_bytes: int) -> tuple[bytes, int]:
        if not 1 <= first_index <= self.last_index:
            return b"", first_index - 1
        start = self._starts[first_index - 1]
        # The last entry that ends within max_bytes of start; at least first_index, so a larger
        # entry travels alone. (Entry k ends where entry k + 1 starts, at _starts[k].)
        limit = start + max_bytes
        within = bisect.bisect_right(self._starts, limit)  # entries starting within the limit
        if within < self.last_index or self._size + len(self._buffer) > limit:
            within -= 1  # the last of them may run past it
        last = min(max(first_index, within), self.last_index)
        end = self._end_of(last)
        if end > self._size:
            self.flush()
        return os.pread(self._fd, end - start, start), last

    def entries(self, first_index: int = 1) -> Iterator[tuple[int, int, memoryview]]:
        """(index, term, payload) of every entry from ``first_index``, read in blocks."""
        self.flush()
        index = first_index
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
        return SyncJob(fds=[os.dup(self._fd)], token=self.last_index)

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        if error is not None:
            log.error("fsync of %s failed: %s", self._path, error)
            return
        synced = job.token
        assert isinstance(synced, int)
        if self._cut_during_round is not None:  # entries after the cut are new, not the fsynced ones
            synced = min(synced, self._cut_during_round)
        self._durable_index = max(self._durable_index, min(synced, self.last_index))

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
