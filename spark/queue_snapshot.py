"""Which segment files make up a data directory at one moment: the plan of a scan.

``plan(data_dir, ...)`` lists every durable queue under ``<data_dir>/queues``
and ``<data_dir>/archive`` (docs/queue-files.md section 1) and measures each
segment file: its size, and its identity (device, inode) so that a reader
later opens the same file even if it was renamed into the archive meanwhile.
Readers read only the measured prefix of each file, so every task, and every
retry of a task, sees the same records: a consistent snapshot of a live
directory, taken without writing anything.

Live directories are listed before archive directories; a segment found in
both is one segment (the broker renamed it in between), read once.

The broker's internal stores (the pending messages of durable delayed exchanges,
``spark.internal_stores``) are left out unless ``include_internal`` is set or
the ``queue`` argument names one exactly.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import NamedTuple

from persistence.segment_layout import list_queue_directories
from persistence.segment_reader import FileIdentity, file_identity, list_archived_segments
from spark.internal_stores import is_internal


class SegmentRef(NamedTuple):
    """One segment file as measured at planning time."""

    segment_id: int
    copy: int  # >0 only for <id>.<n>.seg copies in a hand-edited archive
    path: str  # where it was found
    archive_path: str | None  # where to look if it has moved out of a live directory since
    size: int
    identity: FileIdentity
    mtime_ns: int
    archived: bool

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def cache_key(self) -> tuple:
        """Identifies the exact bytes this ref stands for (a file only ever grows by appending)."""
        return (*self.identity, self.size, self.mtime_ns)


class QueueSnapshot(NamedTuple):
    vhost: str
    queue: str
    segments: tuple[SegmentRef, ...]  # in replay order


def plan(
    data_dir: str | Path, vhost: str | None = None, queue: str | None = None, include_internal: bool = False
) -> list[QueueSnapshot]:
    """Every durable queue under ``data_dir`` with its segments measured now.

    ``vhost`` narrows to one vhost name; ``queue`` to a queue name or a glob (``orders-*``).
    Internal stores are in the plan only with ``include_internal``, or when ``queue`` is exactly
    their name (asking for one by name is asking for it)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"amqp-queue: no data directory {data_dir}")
    found: dict[tuple[str, str], tuple[Path | None, Path | None]] = {}
    for archive in (False, True):
        for entry in list_queue_directories(data_dir, archive=archive):
            live, archived = found.get((entry.vhost, entry.queue), (None, None))
            found[(entry.vhost, entry.queue)] = (live, entry.path) if archive else (entry.path, archived)
    snapshots = []
    for (vhost_name, queue_name), (live_dir, archive_dir) in sorted(found.items()):
        if vhost is not None and vhost_name != vhost:
            continue
        if queue is not None and not matches(queue_name, queue):
            continue
        if not include_internal and is_internal(queue_name) and queue != queue_name:
            continue
        if archive_dir is None and live_dir is not None:
            archive_dir = data_dir / "archive" / live_dir.parent.name / live_dir.name
        snapshots.append(QueueSnapshot(vhost_name, queue_name, tuple(_measure(live_dir, archive_dir))))
    return snapshots


def matches(name: str, pattern: str) -> bool:
    """A queue name against the ``queue`` option: an exact name, or a glob when it has ``*?[``."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern


def _measure(live_dir: Path | None, archive_dir: Path | None) -> list[SegmentRef]:
    refs: dict[tuple[int, int], SegmentRef] = {}
    if live_dir is not None:
        for segment in list_archived_segments(live_dir):
            moved_to = str(archive_dir / segment.path.name) if archive_dir is not None else None
            ref = _ref(segment.segment_id, segment.copy, segment.path, moved_to, archived=False)
            if ref is not None:
                refs[(segment.segment_id, segment.copy)] = ref
    if archive_dir is not None:
        for segment in list_archived_segments(archive_dir):
            if (segment.segment_id, segment.copy) not in refs:
                ref = _ref(segment.segment_id, segment.copy, segment.path, None, archived=True)
                if ref is not None:
                    refs[(segment.segment_id, segment.copy)] = ref
    return [refs[key] for key in sorted(refs)]


def _ref(segment_id: int, copy: int, path: Path, archive_path: str | None, archived: bool) -> SegmentRef | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None  # moved to the archive (listed next) or deleted: every message in it was settled
    return SegmentRef(segment_id, copy, str(path), archive_path, stat.st_size, file_identity(stat),
                      stat.st_mtime_ns, archived)
