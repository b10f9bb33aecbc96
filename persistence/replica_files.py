"""Where a cluster node keeps its replicas, for readers of the files (the Spark data source).

A node's replicated queues and streams (docs/replication.md) live in
``<data_dir>/replicas/<group-dir>/``, ``<group-dir>`` being the lowercase hex SHA-1 of the
group's name in UTF-8: the JSON ``["<vhost>","<name>"]`` for a quorum queue,
``["<vhost>","<name>","stream"]`` for a stream (no spaces, ``\\uXXXX`` for characters outside
ASCII). Each holds ``term.json`` (the highest term this replica promised) and ``incarnation``
(the group's random identity, the same text on every member: a queue or stream deleted and
declared again under its name is a new group with another one). A stream's group also holds
``stream/``, the stream's own directory (docs/stream-files.md), whose records, offsets and
segment names are those of every other copy; a queue's holds ``replica.log``.

The writers are cluster/replication (``ReplicaManager``, ``StreamReplicaLog``, ``FileReplicaLog``).
This module is where a queue replica's files are defined: their names, the log's segment and
snapshot formats and the commit mark (docs/replication.md "On disk", "The commit mark"), which
``FileReplicaLog`` and ``QueueReplicaLog`` import to write them, and the readers of all of them.
It imports nothing of the cluster, so the Spark data source, which may import only
``persistence``, can find and read the replicas (tests/test_spark_replicas.py checks that it
names and reads what the writers write).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from persistence.stream_commit_mark import StaysUnreadable, read_rewritten

REPLICAS_DIR = "replicas"
STREAM_DIR = "stream"
INCARNATION_FILE = "incarnation"
TERM_FILE = "term.json"
QUEUE_LOG_FILE = "replica.log"
QUEUE_MARK_FILE = "committed"
QUEUE_SNAPSHOT_FILE = "snapshot"
STREAM_KIND = "stream"


def group_name(vhost: str, name: str, stream: bool) -> str:
    """The name of the replication group of queue or stream ``name`` of ``vhost``."""
    parts = [vhost, name, STREAM_KIND] if stream else [vhost, name]
    return json.dumps(parts, separators=(",", ":"))


def group_directory(data_dir: str | Path, vhost: str, name: str, stream: bool) -> Path:
    """The directory a node keeps its replica of that group in (it may not exist)."""
    digest = hashlib.sha1(group_name(vhost, name, stream).encode("utf-8")).hexdigest()
    return Path(data_dir) / REPLICAS_DIR / digest


class StreamCopy(NamedTuple):
    """One node's copy of a replicated stream: its stream directory and its group's incarnation."""

    directory: Path  # <group-dir>/stream
    incarnation: str


def stream_copies(data_dir: str | Path) -> list[StreamCopy]:
    """The replicated streams' directories under ``data_dir``, in directory order; a group
    directory without a stream directory is a queue's, and one without its ``incarnation`` yet
    (a replica being made) is left out: it cannot be told from another group of the same name."""
    root = Path(data_dir) / REPLICAS_DIR
    try:
        groups = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for group in groups:
        stream = root / group / STREAM_DIR
        incarnation = read_incarnation(root / group)
        if incarnation and stream.is_dir():
            found.append(StreamCopy(stream, incarnation))
    return found


def read_incarnation(group_dir: Path) -> str | None:
    try:
        return (Path(group_dir) / INCARNATION_FILE).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def promised_term(group_dir: Path) -> int | None:
    """The highest term this replica promised; None when it has no term file (or no replica)."""
    try:
        return int(json.loads((Path(group_dir) / TERM_FILE).read_text())["promised_term"])
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
        return None


def incarnation_number(incarnation: str) -> int:
    """The incarnation as a number below 2**63 (a JSON integer any reader takes): its first 15
    hex digits (60 random bits), or, for text that is not hex, a hash of it."""
    try:
        return int(incarnation[:15], 16)
    except ValueError:
        return int(hashlib.sha1(incarnation.encode()).hexdigest()[:15], 16)


# ---- a quorum queue replica's commit mark (docs/replication.md, "The commit mark") ------------------

# magic "AMQPRCMT", version u16, reserved u16, reserved u32, index u64 (every entry up to it is
# committed and fsynced on this copy), term u64 (of entry ``index``; 0 for index 0), crc u32
# (CRC-32 of the 32 bytes before it): 36 bytes, rewritten in place with one pwrite.
QUEUE_MARK_MAGIC = b"AMQPRCMT"
QUEUE_MARK_VERSION = 1
_QUEUE_MARK = struct.Struct(">8sHHIQQ")
_U32 = struct.Struct(">I")
QUEUE_MARK_SIZE = _QUEUE_MARK.size + _U32.size


class QueueCommitMark(NamedTuple):
    """Entries up to ``index`` (of ``term``) of this copy's log are committed and durable here."""

    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)
    term: int


class UnsupportedReplicaFormat(ValueError):
    """A replica file in a format (version) this build does not read."""


class DamagedQueueCommitMark(ValueError):
    """A queue replica's ``committed`` file that stays unreadable (not a read racing a write)."""


def encode_queue_commit_mark(mark: QueueCommitMark) -> bytes:
    body = _QUEUE_MARK.pack(QUEUE_MARK_MAGIC, QUEUE_MARK_VERSION, 0, 0, mark.index, mark.term)
    return body + _U32.pack(zlib.crc32(body))


def decode_queue_commit_mark(path: str, data: bytes) -> QueueCommitMark | None:
    """The mark in ``data``; None when it is torn or damaged. ``UnsupportedReplicaFormat`` for a
    version this build does not read."""
    if len(data) < QUEUE_MARK_SIZE or data[:8] != QUEUE_MARK_MAGIC:
        return None
    _, version, _, _, index, term = _QUEUE_MARK.unpack_from(data)
    if _U32.unpack_from(data, _QUEUE_MARK.size)[0] != zlib.crc32(data[:_QUEUE_MARK.size]):
        return None
    if version != QUEUE_MARK_VERSION:
        raise UnsupportedReplicaFormat(f"{path}: a commit mark in format {version}; this build reads "
                                       f"{QUEUE_MARK_VERSION}")
    return QueueCommitMark(index, term)


def read_queue_commit_mark(group_dir: Path) -> QueueCommitMark | None:
    """The commit mark of a queue replica; None when there is no such file (a broker that writes
    no marks); index 0 when it is empty (nothing known committed here yet: a replica that has
    seen no commit since it was made or emptied). ``DamagedQueueCommitMark`` when it stays
    unreadable over a few attempts."""
    path = Path(group_dir) / QUEUE_MARK_FILE
    try:
        return read_rewritten(path, lambda data: decode_queue_commit_mark(str(path), data) if data
                              else QueueCommitMark(0, 0))
    except StaysUnreadable as error:
        raise DamagedQueueCommitMark(f"{path}: damaged commit mark ({error.size} bytes); the broker rewrites it "
                                     f"at the queue's next commit") from None


# ---- a quorum queue replica's log (docs/replication.md, "On disk") ----------------------------------
# The one definition of the log's files: the writer, cluster/replication/log.py (FileReplicaLog),
# imports these; queue_log.py writes the snapshot's document. tests/test_spark_replicas.py checks
# that the readers below read what they write.

_ENTRY_HEAD = struct.Struct(">IIQQ")  # length (after this field), crc (of index, term, payload), index, term
ENTRY_HEAD_SIZE = _ENTRY_HEAD.size
SEGMENT_PREFIX, SEGMENT_SUFFIX = "segment-", ".log"
SEGMENT_MAGIC = b"AMQPRSEG"
SEGMENT_VERSION = 1
SEGMENT_HEAD = struct.Struct(">8sHHQ")  # magic, version, reserved, first index; then a crc u32 of them
SEGMENT_HEADER_SIZE = SEGMENT_HEAD.size + 4
SNAPSHOT_MAGIC = b"AMQPSNAP"
SNAPSHOT_VERSION = 1
# magic, version, reserved, index, term, document length; then a crc u32 of them and the document
SNAPSHOT_HEAD = struct.Struct(">8sHHQQQ")
_DOC_HEAD = struct.Struct(">8sHHQQQI")  # magic "AMQPQSNP", version, reserved, state index, next seq, horizon, count
_DOC_MESSAGE = struct.Struct(">QQBBII")  # seq, index, held, carried, delivery count, length
_READ_BLOCK = 4 * 1024 * 1024


def segment_name(first: int) -> str:
    """The name of the segment whose first entry is ``first``."""
    return f"{SEGMENT_PREFIX}{first:020d}{SEGMENT_SUFFIX}"


def encode_segment_header(first: int) -> bytes:
    head = SEGMENT_HEAD.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, first)
    return head + _U32.pack(zlib.crc32(head))


class Snapshot(NamedTuple):
    """The log's base: entries up to ``index`` (of ``term``) are no longer stored; ``document``
    (the owner's, opaque here) holds what a copy needs instead of them."""

    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)
    term: int
    document: bytes


def encode_snapshot(snapshot: Snapshot) -> bytes:
    head = SNAPSHOT_HEAD.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, snapshot.index, snapshot.term,
                              len(snapshot.document))
    return head + _U32.pack(zlib.crc32(snapshot.document, zlib.crc32(head))) + snapshot.document


def decode_snapshot(data: bytes) -> Snapshot:
    """ValueError: not a whole, undamaged snapshot file (``UnsupportedReplicaFormat``: of a
    version this build does not read)."""
    size = SNAPSHOT_HEAD.size
    if len(data) < size + 4:
        raise ValueError("a snapshot file shorter than its header")
    magic, version, _, index, term, length = SNAPSHOT_HEAD.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise ValueError("not a replica log snapshot")
    if version != SNAPSHOT_VERSION:
        raise UnsupportedReplicaFormat(f"a snapshot in format {version}; this build reads {SNAPSHOT_VERSION}")
    document = data[size + 4:]
    if len(document) != length or zlib.crc32(document, zlib.crc32(data[:size])) != _U32.unpack_from(data, size)[0]:
        raise ValueError("a snapshot file that is torn or damaged")
    return Snapshot(index, term, document)


class QueueSnapshot(NamedTuple):
    """A queue replica's snapshot: entries up to ``index`` are no longer in its segments; ``carried``
    maps the log index of each unsettled message whose record is at or below ``index`` to that
    record (the rest of those entries are gone)."""

    index: int  # type: ignore[assignment]  # a field, hiding tuple.index (never called on it)
    carried: dict[int, bytes]


def read_queue_snapshot(group_dir: Path) -> QueueSnapshot:
    """The replica's snapshot (index 0, nothing carried: none). It is replaced atomically, so a
    read never sees half of one; ValueError: a file this build cannot read."""
    path = Path(group_dir) / QUEUE_SNAPSHOT_FILE
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return QueueSnapshot(0, {})
    try:
        snapshot = decode_snapshot(data)
    except ValueError as error:  # (UnsupportedReplicaFormat stays one)
        raise type(error)(f"{path}: {error}") from None
    index, document = snapshot.index, snapshot.document
    carried: dict[int, bytes] = {}
    if document:
        magic, version, _, _, _, _, count = _DOC_HEAD.unpack_from(document)
        if magic != b"AMQPQSNP" or version != 1:
            raise UnsupportedReplicaFormat(f"{path}: not a queue snapshot document of format 1")
        pos = _DOC_HEAD.size
        for _ in range(count):
            _, entry_index, _, is_carried, _, record_length = _DOC_MESSAGE.unpack_from(document, pos)
            pos += _DOC_MESSAGE.size
            if is_carried:
                carried[entry_index] = document[pos:pos + record_length]
                pos += record_length
    return QueueSnapshot(index, carried)


def queue_snapshot_index(group_dir: Path) -> int:
    """The index of the replica's snapshot (0: none), from its header alone."""
    path = Path(group_dir) / QUEUE_SNAPSHOT_FILE
    try:
        with open(path, "rb") as file:
            head = file.read(SNAPSHOT_HEAD.size)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    if len(head) < SNAPSHOT_HEAD.size or head[:8] != SNAPSHOT_MAGIC:
        raise ValueError(f"{path}: not a replica snapshot")
    return int(SNAPSHOT_HEAD.unpack_from(head)[3])


def queue_log_segments(group_dir: Path) -> list[tuple[int, Path]]:
    """(first index, path) of the replica's segment files, in index order."""
    found = []
    try:
        names = os.listdir(group_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        digits = name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]
        if name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX) and digits.isdigit():
            found.append((int(digits), Path(group_dir) / name))
    return sorted(found)


class LogGap(Exception):
    """The entries asked for are not (or no longer) in the replica's segments: ``first`` is the
    first index they hold from now on (compaction removed the ones before)."""

    def __init__(self, first: int) -> None:
        self.first = first
        super().__init__(f"the replica's segments start at entry {first}")


def queue_log_entries(group_dir: Path, low: int, high: int) -> Iterator[tuple[int, int, bytes]]:
    """(index, term, payload) of entries ``low`` .. ``high`` of the replica's segments, checked
    (CRC, index in turn). ``LogGap`` when entry ``low`` is not in them (compacted away, or a
    segment removed while this reads); ValueError for damage before ``high``."""
    segments = queue_log_segments(group_dir)
    firsts = [first for first, _ in segments]
    k = bisect.bisect_right(firsts, low) - 1
    if k < 0:
        raise LogGap(firsts[0] if firsts else high + 1)
    index = low
    for first, path in segments[k:]:
        if index > high:
            return
        if first > index:
            raise ValueError(f"{group_dir}: no segment holds entry {index}")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise LogGap(high + 1) from None  # compacted while this read: the caller looks again
        try:
            for entry in _segment_entries(fd, path, first, index, high):
                index = entry[0] + 1
                yield entry
        finally:
            os.close(fd)
    if index <= high:
        raise ValueError(f"{group_dir}: its segments end before entry {high}")


def _segment_entries(fd: int, path: Path, first: int, low: int, high: int) -> Iterator[tuple[int, int, bytes]]:
    header = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
    if len(header) < SEGMENT_HEADER_SIZE or header[:8] != SEGMENT_MAGIC \
            or zlib.crc32(header[:SEGMENT_HEAD.size]) != _U32.unpack_from(header, SEGMENT_HEAD.size)[0]:
        raise ValueError(f"{path}: not a replica log segment")
    if SEGMENT_HEAD.unpack_from(header)[3] != first:
        raise ValueError(f"{path}: its header names another first entry")
    offset, pending, expected = SEGMENT_HEADER_SIZE, b"", first
    while expected <= high:
        block = os.pread(fd, _READ_BLOCK, offset)
        offset += len(block)
        data = pending + block
        pos = 0
        while len(data) - pos >= ENTRY_HEAD_SIZE:
            length, crc, index, term = _ENTRY_HEAD.unpack_from(data, pos)
            end = pos + 4 + length
            if end > len(data):
                break
            if index != expected or length < 20 or zlib.crc32(memoryview(data)[pos + 8:end]) != crc:
                raise ValueError(f"{path}: damaged entry at index {expected}")
            if index > high:
                return
            if index >= low:
                yield index, term, data[pos + ENTRY_HEAD_SIZE:end]
            expected += 1
            pos = end
        pending = data[pos:]
        if not block:
            return  # the segment ends here (the caller checks that ``high`` was reached)


__all__ = ["REPLICAS_DIR", "STREAM_DIR", "INCARNATION_FILE", "TERM_FILE", "QUEUE_LOG_FILE", "StreamCopy",
           "group_name", "group_directory", "stream_copies", "read_incarnation", "promised_term",
           "incarnation_number", "QUEUE_MARK_FILE", "QUEUE_SNAPSHOT_FILE", "QueueCommitMark",
           "DamagedQueueCommitMark", "UnsupportedReplicaFormat", "encode_queue_commit_mark",
           "decode_queue_commit_mark", "read_queue_commit_mark", "QueueSnapshot", "read_queue_snapshot", "queue_snapshot_index",
           "queue_log_segments", "queue_log_entries", "LogGap", "ENTRY_HEAD_SIZE", "SEGMENT_PREFIX",
           "SEGMENT_SUFFIX", "SEGMENT_MAGIC", "SEGMENT_VERSION", "SEGMENT_HEAD", "SEGMENT_HEADER_SIZE",
           "SNAPSHOT_MAGIC", "SNAPSHOT_VERSION", "SNAPSHOT_HEAD", "segment_name", "encode_segment_header",
           "Snapshot", "encode_snapshot", "decode_snapshot"]
