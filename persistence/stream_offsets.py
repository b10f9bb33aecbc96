"""Server-side offset tracking: consumer name -> the offset of its last acknowledged message.

One small file per stream, ``consumer-offsets.json``, replaced atomically:
the new content goes to a temporary file, which is fsynced, then renamed over
the old one, then the directory is fsynced, so after a crash the file holds
either the old or the new offsets, never a mix (persistence/atomic_file.py's
protocol). With a ``GroupCommitter`` the steps ride on its rounds instead of
blocking the event loop: ``prepare_sync`` writes the temporary file and the
round fsyncs it, ``sync_done`` renames it, and the next round fsyncs the
directory. ``store()`` only changes a dict entry, so any number of acks
between two rounds cost one file write: the latest value per consumer.

Without a committer (tools, tests), ``sync_now()`` writes with
``atomic_file.write_atomically``.

What "last acknowledged" means when acks arrive out of order is the caller's
choice; this store keeps whatever offset it is given.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, NamedTuple

from persistence.atomic_file import write_all as _write_all  # the module's own name: tests count writes by it
from persistence.atomic_file import write_atomically
from persistence.group_commit import GroupCommitter, SyncJob
from persistence.stream_segment import OFFSETS_FILE, STREAM_FORMAT_VERSION, check_stream_format_version

log = logging.getLogger(__name__)


class _Write(NamedTuple):
    tmp: str | None  # the temporary file this round fsyncs (None: nothing new)
    generation: int  # the offsets it holds
    renamed: int  # the generation whose rename this round's directory fsync makes durable (-1: none)


class StreamOffsets:
    """The consumer offsets of one stream directory; a ``Syncable`` for the group committer."""

    def __init__(self, directory: Path, committer: GroupCommitter | None = None) -> None:
        self._directory = Path(directory)
        self._path = self._directory / OFFSETS_FILE
        self._committer = committer
        self._offsets: dict[str, int] = {}
        self._generation = 0  # bumped by every change
        self._written = 0  # the generation last handed to a round
        self._renamed = 0  # the generation under the file's name (rename not fsynced yet)
        self._durable = 0  # the generation known durable
        self._rename_unsynced = -1
        self._requested = False
        self._waiters: list[tuple[int, Callable[[OSError | None], None]]] = []
        self._discarded = False
        self._on_change: Callable[[], None] | None = None
        self.load_error: str | None = None
        self._load()

    def _load(self) -> None:
        for entry in os.listdir(self._directory) if self._directory.is_dir() else ():
            if entry.startswith(f".{OFFSETS_FILE}.") and entry.endswith(".tmp"):
                (self._directory / entry).unlink(missing_ok=True)  # a write never renamed: not the file
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return
        try:
            document = json.loads(raw)
            check_stream_format_version(str(self._path), document.get("format_version"))
            offsets = document["offsets"]
            loaded = {str(k): int(v) for k, v in offsets.items() if isinstance(v, int) and v >= 0}
        except (ValueError, KeyError, AttributeError, TypeError) as err:
            self.load_error = f"{self._path}: unreadable ({err}); consumer offsets start empty"
            log.error("%s", self.load_error)
            return
        self._offsets = loaded

    # ---- the offsets ---------------------------------------------------------------------

    def get(self, consumer: str) -> int | None:
        """The offset of ``consumer``'s last acknowledged message, or None if none is stored."""
        return self._offsets.get(consumer)

    def items(self) -> dict[str, int]:
        return dict(self._offsets)

    @property
    def generation(self) -> int:
        """Bumped by every change (a copy of the stream elsewhere is sent the offsets when it moves)."""
        return self._generation

    def notify_changes(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback()`` after every change from now on."""
        self._on_change = callback

    def replace(self, offsets: dict[str, int]) -> None:
        """Hold exactly ``offsets`` (another copy's, whole)."""
        for consumer in [name for name in self._offsets if name not in offsets]:
            self.remove(consumer)
        for consumer, offset in offsets.items():
            self.store(consumer, offset)

    def store(self, consumer: str, offset: int) -> None:
        """Remember ``offset`` for ``consumer`` (durable after the next two sync rounds)."""
        if offset < 0:
            raise ValueError(f"an offset is at least 0, got {offset}")
        if self._offsets.get(consumer) == offset:
            return
        self._offsets[consumer] = offset
        self._changed()

    def remove(self, consumer: str) -> None:
        if self._offsets.pop(consumer, None) is not None:
            self._changed()

    def when_durable(self, callback: Callable[[OSError | None], None]) -> None:
        """Call ``callback(None)`` once every offset stored so far is durable (or with the error)."""
        if self._durable >= self._generation:
            callback(None)
            return
        self._waiters.append((self._generation, callback))
        self._request()

    def _changed(self) -> None:
        self._generation += 1
        self._request()
        if self._on_change is not None:
            self._on_change()

    def _request(self) -> None:
        if self._committer is not None and not self._requested and not self._discarded:
            self._requested = True
            self._committer.request_sync(self, _log_failure)

    # ---- group commit (Syncable) ----------------------------------------------------------

    def flush(self) -> None:
        pass  # written in prepare_sync, once per round

    def prepare_sync(self) -> SyncJob:
        self._requested = False
        renamed = self._rename_unsynced
        directories = [str(self._directory)] if renamed >= 0 else []
        self._rename_unsynced = -1
        fds: list[int] = []
        tmp: str | None = None
        if self._generation > self._written and not self._discarded:
            tmp = str(self._directory / f".{OFFSETS_FILE}.{self._generation}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, self._encode())
            except OSError:
                os.close(fd)
                os.unlink(tmp)
                raise
            fds.append(fd)  # the round fsyncs and closes it
            self._written = self._generation
        return SyncJob(fds=fds, directories=directories, token=_Write(tmp, self._written, renamed))

    def sync_done(self, job: SyncJob, error: OSError | None) -> None:
        write = job.token
        assert isinstance(write, _Write)
        if error is not None:
            # The temporary file is not trusted: drop it and write the offsets again next time.
            if write.tmp is not None:
                _unlink_quietly(write.tmp)
                self._written = min(self._written, self._renamed)
            if write.renamed >= 0:
                self._rename_unsynced = max(self._rename_unsynced, write.renamed)
            log.error("fsync of consumer offsets in %s failed: %s", self._directory, error)
            self._wake(error)
            return
        if write.renamed >= 0:
            self._durable = max(self._durable, write.renamed)
        if write.tmp is not None:
            if self._discarded:
                _unlink_quietly(write.tmp)
            else:
                os.replace(write.tmp, self._path)
                self._renamed = write.generation
                self._rename_unsynced = write.generation
                self._request()  # the directory fsync that makes the rename durable
        self._wake(None)

    def _wake(self, error: OSError | None) -> None:
        if not self._waiters:
            return
        ready = [cb for gen, cb in self._waiters if error is not None or gen <= self._durable]
        self._waiters = [(gen, cb) for gen, cb in self._waiters if not (error is not None or gen <= self._durable)]
        for callback in ready:
            callback(error)
        if self._waiters:
            self._request()

    def sync_now(self) -> None:
        """Write the offsets durably now, blocking."""
        if self._discarded or self._durable >= self._generation:
            return
        write_atomically(self._path, self._encode())
        self._written = self._renamed = self._durable = self._generation
        self._rename_unsynced = -1
        self._wake(None)

    def close(self) -> None:
        self.sync_now()

    def discard(self) -> None:
        """The stream is being deleted: write nothing more."""
        self._discarded = True

    def _encode(self) -> bytes:
        document = {"format_version": STREAM_FORMAT_VERSION, "offsets": dict(sorted(self._offsets.items()))}
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _log_failure(error: OSError | None) -> None:
    if error is not None:
        log.error("fsync of stream consumer offsets failed: %s", error)
