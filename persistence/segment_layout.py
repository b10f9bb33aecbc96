"""Where a queue's segment files live, and the meta files that name them.

    <data_dir>/queues/<vhost-dir>/vhost.json
    <data_dir>/queues/<vhost-dir>/<queue-dir>/queue.json
    <data_dir>/queues/<vhost-dir>/<queue-dir>/<20-digit segment id>.seg
    <data_dir>/archive/<vhost-dir>/<queue-dir>/...            (same layout)

``<vhost-dir>`` and ``<queue-dir>`` are the lowercase hex SHA-1 of the UTF-8
name: 40 characters that are safe on every file system whatever the name
holds (an AMQP name is up to 255 bytes, too long for a file name once
escaped). The meta files carry the real names, so tools never need to invert
the hash. See docs/queue-files.md.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from persistence.atomic_file import make_directories, write_atomically, write_replacing
from persistence.format_version import FORMAT_VERSION, check_format_version

QUEUES_DIR = "queues"
ARCHIVE_DIR = "archive"
VHOST_META = "vhost.json"
QUEUE_META = "queue.json"


class QueueDirectory(NamedTuple):
    vhost: str
    queue: str
    path: Path


def name_to_dir(name: str) -> str:
    """The directory name used for a vhost or queue name."""
    return hashlib.sha1(name.encode("utf-8")).hexdigest()


def queue_path(data_dir: Path, vhost: str, queue: str, *, archive: bool = False) -> Path:
    root = Path(data_dir) / (ARCHIVE_DIR if archive else QUEUES_DIR)
    return root / name_to_dir(vhost) / name_to_dir(queue)


def ensure_queue_directory(path: Path, vhost: str, queue: str, *, durably: bool = True) -> list[Path]:
    """Create ``path`` (a queue directory) and its meta files if missing (or unreadable).

    With ``durably`` everything created is fsynced before this returns, and the result is
    empty. Without, nothing is fsynced (no disk wait: a declare on the event loop) and the
    result lists what was created, files first then directories, for the caller to fsync
    before anything in the directory is relied on. A crash before that loses at most the
    empty directory, which the next start creates again.
    """
    vhost_dir = path.parent
    created = make_directories(path, durably=durably)
    for meta_path, fields in ((vhost_dir / VHOST_META, {"vhost": vhost}), (path / QUEUE_META, {"vhost": vhost, "queue": queue})):
        if _meta_readable(meta_path):
            continue
        if durably:
            write_atomically(meta_path, _meta_bytes(fields))
        else:
            write_replacing(meta_path, _meta_bytes(fields))
            created.insert(0, meta_path)
            created.append(meta_path.parent)
    return [] if durably else list(dict.fromkeys(created))


def _meta_readable(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_bytes()), dict)
    except (OSError, ValueError):
        return False


def read_queue_meta(path: Path) -> tuple[str, str]:
    """(vhost, queue) named by the ``queue.json`` in the queue directory ``path``."""
    meta_path = path / QUEUE_META
    document = json.loads(meta_path.read_bytes().decode("utf-8"))
    check_format_version(str(meta_path), document.get("format_version"))
    return document["vhost"], document["queue"]


def list_queue_directories(data_dir: Path, *, archive: bool = False) -> Iterator[QueueDirectory]:
    """Every queue directory under ``data_dir`` that has a readable ``queue.json``."""
    root = Path(data_dir) / (ARCHIVE_DIR if archive else QUEUES_DIR)
    if not root.is_dir():
        return
    for vhost_dir in sorted(root.iterdir()):
        if not vhost_dir.is_dir():
            continue
        for queue_dir in sorted(vhost_dir.iterdir()):
            if (queue_dir / QUEUE_META).is_file():
                vhost, queue = read_queue_meta(queue_dir)
                yield QueueDirectory(vhost, queue, queue_dir)


def _meta_bytes(fields: dict[str, Any]) -> bytes:
    document = {"format_version": FORMAT_VERSION, **fields, "created_at_ms": int(time.time() * 1000)}
    return json.dumps(document, ensure_ascii=False, indent=2).encode("utf-8") + b"\n"
