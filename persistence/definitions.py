"""The definitions store: vhosts, users, permissions, exchanges, queues, bindings.

``DefinitionStore`` is the one interface the broker uses to load and change its
definitions, so a ZooKeeper- or etcd-backed store can replace the file one. The
document's JSON shape and encoding are in persistence/definitions_codec.py.

Every change is one entry (``put``/``remove``), costing the size of that entry,
never of all definitions. ``when_durable`` says when every change so far is on
disk; the broker answers a declare (or an API call) only then.

``FileDefinitionStore`` keeps, in the data directory (format 2, docs/durability.md):

    definitions.json          a snapshot: the export-shaped document, with
                              "amqp_server_log": G, the first log written after it
    definitions-<G>.log       the changes made since, one CRC-checked record a line

Changes are written and fsynced by the broker's GroupCommitter (with the
message stores, in its worker thread), never on the event loop. When a log
holds more records than the snapshot has entries, a new log is started and the
snapshot is rewritten in a worker thread (compaction), so each change costs
O(1) amortised. Opening replays the snapshot and its logs (cutting a torn last
record), writes them as one new snapshot and starts a fresh log, so a
definitions.json of format 1 (rewritten whole on every change) is read and
upgraded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from persistence.atomic_file import fsync_directory, write_atomically
from persistence.definition_table import KINDS, LOG_KEY, DefinitionTable, TableSnapshot
from persistence.definitions_codec import (
    FORMAT_KEY,
    FORMAT_VERSION,
    HASHING_ALGORITHM,
    Definitions,
    DefinitionsError,
    decode_definitions,
    empty_definitions,
)
from persistence.definitions_log import LOG_HEADER, encode_record, read_log
from persistence.group_commit import SyncJob

if TYPE_CHECKING:
    from persistence.group_commit import GroupCommitter

__all__ = [
    "FORMAT_KEY", "FORMAT_VERSION", "HASHING_ALGORITHM", "KINDS", "Definitions", "DefinitionsError",
    "DefinitionStore", "FileDefinitionStore", "MemoryDefinitionStore", "empty_definitions",
]

log = logging.getLogger(__name__)

FILE_NAME = "definitions.json"
_LOG_NAME = re.compile(r"definitions-(\d{8,})\.log")
# A log is compacted into the snapshot once it holds this many records, or as many as the
# last snapshot had entries if that is more: a snapshot costs at most twice the records
# since the last one, so O(1) per change.
COMPACT_AFTER = 1000

DurableCallback = Callable[[OSError | None], None]


class DefinitionStore(Protocol):
    def load(self) -> Definitions:
        """The stored definitions, or empty ones when nothing was saved."""
        ...

    def save(self, definitions: Definitions, kinds: tuple[str, ...] = KINDS) -> None:
        """Make the stored entries of ``kinds`` (all by default) those of ``definitions``,
        recording only what differs."""
        ...

    def put(self, kind: str, entry: dict[str, Any]) -> None:
        """Add or replace one entry of ``kind`` ("queues", "bindings" ...)."""
        ...

    def remove(self, kind: str, entry: dict[str, Any]) -> None:
        """Remove the entry with ``entry``'s key fields, and what depends on it."""
        ...

    @property
    def changes(self) -> int:
        """How many changes were recorded so far (a change makes it grow)."""
        ...

    def when_durable(self, callback: DurableCallback) -> None:
        """Call ``callback(error)`` once every change recorded so far is durable
        (at once when it already is)."""
        ...

    def sync_with(self, committer: "GroupCommitter") -> None:
        """From now on, make changes durable in ``committer``'s rounds instead of at once."""
        ...

    def close(self) -> None:
        """Make every change durable and release files and threads."""
        ...


class MemoryDefinitionStore:
    """Definitions kept in memory, encoded exactly like the file store's, so tests catch
    values the file store could not hold. Every change is "durable" at once."""

    def __init__(self) -> None:
        self._table = DefinitionTable()
        self._changes = 0

    def load(self) -> Definitions:
        return _decoded_snapshot(self._table, "memory definition store")

    def save(self, definitions: Definitions, kinds: tuple[str, ...] = KINDS) -> None:
        self._changes += len(self._table.replace(definitions, kinds))

    def put(self, kind: str, entry: dict[str, Any]) -> None:
        if self._table.put(kind, entry) is not None:
            self._changes += 1

    def remove(self, kind: str, entry: dict[str, Any]) -> None:
        if self._table.remove(kind, entry) is not None:
            self._changes += 1

    @property
    def changes(self) -> int:
        return self._changes

    def when_durable(self, callback: DurableCallback) -> None:
        callback(None)

    def sync_with(self, committer: "GroupCommitter") -> None:
        pass

    def close(self) -> None:
        pass


class FileDefinitionStore:
    """Definitions in a data directory: a snapshot and change logs (see the module docstring).

    Until ``sync_with`` gives it a GroupCommitter, each change is written and fsynced
    before the call returns (startup, tools and tests); after, the committer's rounds do
    it and ``when_durable`` tells when.
    """

    def __init__(self, data_dir: Path, *, compact_after: int = COMPACT_AFTER) -> None:
        self.directory = Path(data_dir)
        self.path = self.directory / FILE_NAME
        self._compact_after = compact_after
        self._table: DefinitionTable | None = None
        self._generation = 0  # of the log being appended to
        self._log_fd = -1
        self._log_size = 0
        self._log_records = 0  # records appended since the last snapshot was started
        self._snapshot_entries = 0  # entries in that snapshot
        self._log_is_new = False  # its directory entry is not fsynced yet
        self._buffer: list[bytes] = []  # records not yet written to the OS
        self._changes = 0
        self._written = 0
        self._durable = 0
        self._committer: GroupCommitter | None = None
        self._sync_requested = False
        self._compactor: ThreadPoolExecutor | None = None
        self._compaction: asyncio.Future[None] | Future[None] | None = None
        self.compactions = 0  # snapshots written since opening, for tests and metrics

    # -- the DefinitionStore interface ---------------------------------------------------

    def load(self) -> Definitions:
        return _decoded_snapshot(self._opened(), str(self.path))

    def save(self, definitions: Definitions, kinds: tuple[str, ...] = KINDS) -> None:
        for record in self._opened().replace(definitions, kinds):
            self._append(record)

    def put(self, kind: str, entry: dict[str, Any]) -> None:
        record = self._opened().put(kind, entry)
        if record is not None:
            self._append(record)

    def remove(self, kind: str, entry: dict[str, Any]) -> None:
        record = self._opened().remove(kind, entry)
        if record is not None:
            self._append(record)

    @property
    def changes(self) -> int:
        return self._changes

    def when_durable(self, callback: DurableCallback) -> None:
        if self._durable >= self._changes or self._committer is None:
            callback(None)
            return
        self._sync_requested = True
        self._committer.request_sync(self, callback)

    def sync_with(self, committer: "GroupCommitter") -> None:
        self._committer = committer

    def close(self) -> None:
        if self._compactor is not None:
            self._compactor.shutdown(wait=True)
            self._compactor = None
        if self._log_fd < 0:
            return
        try:
            self._write_buffer()
            os.fsync(self._log_fd)
            self._durable = self._written
        finally:
            os.close(self._log_fd)
            self._log_fd = -1

    # -- Syncable: the GroupCommitter's side (event loop) -------------------------------

    def prepare_sync(self) -> SyncJob:
        self._sync_requested = False
        self._write_buffer()
        directories = [str(self.directory)] if self._log_is_new else []
        job = SyncJob(fds=[os.dup(self._log_fd)], directories=directories, token=(self._written, self._log_is_new))
        self._log_is_new = False
        self._maybe_compact()
        return job

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        assert isinstance(job.token, tuple)  # prepare_sync's (bytes written, log was new)
        written, log_was_new = job.token
        if error is None:
            self._durable = max(self._durable, written)
            return
        log.error("definitions could not be made durable (%s); waiting replies fail and it is retried", error)
        if log_was_new:
            self._log_is_new = True

    def flush(self) -> None:
        self._write_buffer()

    # -- opening ------------------------------------------------------------------------

    def _opened(self) -> DefinitionTable:
        if self._table is None:
            self._table = self._open()
        return self._table

    def _open(self) -> DefinitionTable:
        """Read the snapshot and its logs, write them as one snapshot, start a new log."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = None
        except OSError as err:
            raise DefinitionsError(f"{self.path}: cannot be read: {err.strerror}") from err
        document = empty_definitions() if data is None else decode_definitions(data, str(self.path))
        first_log = document.pop(LOG_KEY, 0)
        if not isinstance(first_log, int) or isinstance(first_log, bool) or first_log < 0:
            raise DefinitionsError(f"{self.path}: {LOG_KEY} must be a non-negative integer, got {first_log!r}")
        table = DefinitionTable.from_document(document)
        generations = self._log_generations()
        for generation in generations:
            if generation >= first_log:
                for record in read_log(self._log_path(generation)):
                    table.apply(record)
        self._generation = max([first_log, *generations]) + 1
        self.directory.mkdir(parents=True, exist_ok=True)
        self._create_log()
        self._snapshot_entries = len(table)
        _write_snapshot(self.path, table.snapshot(), self._generation, self.directory)
        return table

    def _log_generations(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_LOG_NAME.fullmatch, names) if m)

    def _log_path(self, generation: int) -> Path:
        return _log_path(self.directory, generation)

    def _create_log(self) -> None:
        """Start appending to log ``self._generation`` (its header fsynced, its name not yet)."""
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        fd = os.open(self._log_path(self._generation), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, LOG_HEADER)
        except BaseException:
            os.close(fd)
            raise
        self._log_fd = fd
        self._log_size = len(LOG_HEADER)
        self._log_records = 0
        self._log_is_new = True
        if self._committer is None:
            os.fsync(fd)
            fsync_directory(self.directory)
            self._log_is_new = False

    # -- appending ----------------------------------------------------------------------

    def _append(self, record: str) -> None:
        self._buffer.append(encode_record(record))
        self._changes += 1
        self._log_records += 1
        if self._committer is None:
            self._write_buffer()
            os.fsync(self._log_fd)
            self._durable = self._written
            self._maybe_compact()
        elif not self._sync_requested:
            # Every change joins the next round, so a later confirm or commit-ok (whose round
            # cannot come earlier) never goes out before the definition it relies on is durable.
            self._sync_requested = True
            self._committer.request_sync(self, _unobserved)

    def _write_buffer(self) -> None:
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        try:
            _write_all(self._log_fd, data)
        except OSError:
            # Cut a partly written record, so the next write does not continue a torn one.
            os.ftruncate(self._log_fd, self._log_size)
            raise
        self._log_size += len(data)
        self._written += len(self._buffer)
        self._buffer.clear()

    # -- compaction ---------------------------------------------------------------------

    def _maybe_compact(self) -> None:
        """Start a new log and rewrite the snapshot once the log is as big as the snapshot."""
        table = self._table
        if table is None or self._compaction is not None:
            return
        if self._log_records < max(self._compact_after, self._snapshot_entries):
            return
        self._write_buffer()
        snapshot = table.snapshot()
        self._snapshot_entries = len(table)
        self._generation += 1
        self._create_log()
        if self._committer is None:
            _write_snapshot(self.path, snapshot, self._generation, self.directory)
            self.compactions += 1
            return
        if self._compactor is None:
            self._compactor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="definitions-compaction")
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._compactor, _write_snapshot, self.path, snapshot, self._generation, self.directory
        )
        self._compaction = future
        future.add_done_callback(self._compacted)

    def _compacted(self, future: "asyncio.Future[None]") -> None:
        self._compaction = None
        error = future.exception() if not future.cancelled() else None
        if error is not None:
            # Nothing is lost: the old snapshot and every log since are still there; the next
            # compaction (after as many records again) retries.
            log.error("rewriting %s failed (%s); the change logs are kept", self.path, error)
        else:
            self.compactions += 1


def _write_snapshot(path: Path, snapshot: TableSnapshot, first_log: int, directory: Path) -> None:
    """Worker thread (or startup): make ``snapshot`` the durable snapshot, then delete the logs it covers.

    Crash-safe at any point: until the rename in write_atomically the old snapshot and all
    logs are there; after it, the new snapshot names ``first_log`` and older logs are ignored.
    """
    write_atomically(path, snapshot.document_bytes(FORMAT_VERSION, first_log))
    for name in os.listdir(directory):
        match = _LOG_NAME.fullmatch(name)
        if match and int(match.group(1)) < first_log:
            try:
                os.unlink(directory / name)
            except FileNotFoundError:
                pass


def _log_path(directory: Path, generation: int) -> Path:
    return directory / f"definitions-{generation:08d}.log"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _decoded_snapshot(table: DefinitionTable, source: str) -> Definitions:
    document = decode_definitions(table.snapshot().document_bytes(FORMAT_VERSION, 0), source)
    document.pop(LOG_KEY, None)
    return document


def _unobserved(error: OSError | None) -> None:
    """A change nobody waits for (a nowait declare): sync_done logs a failure."""
