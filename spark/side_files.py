"""Parquet side files for sealed segments, so Spark reads them natively (or the data source, faster).

A sealed segment never changes again, so its messages can be written once as
Parquet (zstd), next to a second small file with the segment's own state
records:

    <data_dir>/side-files/<vhost-dir>/<queue-dir>/<segment id>.messages.parquet
    <data_dir>/side-files/<vhost-dir>/<queue-dir>/<segment id>.states.parquet

The messages file has the data source's message columns plus ``vhost``,
``queue`` and ``segment``, so ``spark.read.parquet(f"{data_dir}/side-files")``
gives every sealed message on any cluster without Python decoding (but no
``state``: states keep changing after the seal, in later segments). The data
source uses a side file only when it matches the segment exactly (same size,
same header CRC); otherwise it decodes the segment as usual. Side files are a
cache: deleting them loses nothing.

The broker calls ``SideFileWriter.segment_sealed(path, vhost, queue)`` on the
event loop when it seals a segment; the conversion runs in one worker thread.
It re-decodes the segment (spark.segment_index and spark.columnar) and writes
zstd Parquet: about 4.4 s of CPU per million messages measured
(bench/spark_scan.py, 2026-11-27), so about 1 s per full 64 MiB segment, part
of it holding the GIL, during which the broker's event loop gets a smaller share
of the interpreter. ``python -m spark.side_files DATA_DIR`` converts every sealed
segment of a data directory offline instead, and removes orphans.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from persistence.segment_file import HEADER_SIZE, CorruptSegmentHeader
from persistence.segment_layout import list_queue_directories
from persistence.segment_reader import file_identity, list_archived_segments, read_prefix, snapshot_scan
from spark.message_states import StateEvents
from spark.queue_snapshot import SegmentRef
from spark.schema import MESSAGE_COLUMNS, arrow_schema

log = logging.getLogger(__name__)

SIDE_DIR = "side-files"
MESSAGES_SUFFIX = ".messages.parquet"
STATES_SUFFIX = ".states.parquet"
_META_SIZE = b"amqp_queue.segment_size"
_META_HEADER_CRC = b"amqp_queue.header_crc"
_STATE_SCHEMA = pa.schema([("seq", pa.int64()), ("at_ms", pa.int64()), ("kind", pa.uint8()),
                           ("delivery_count", pa.int64()), ("due_at_ms", pa.int64()), ("reason", pa.uint8())])
_ROW_GROUP = 65536


def side_paths(segment_path: str | Path) -> tuple[Path, Path]:
    """(messages file, states file) of the segment at ``<data_dir>/{queues,archive}/<v>/<q>/<id>[.n].seg``."""
    path = Path(segment_path)
    queue_dir = path.parent
    base = path.parents[3] / SIDE_DIR / queue_dir.parent.name / queue_dir.name / path.name.removesuffix(".seg")
    return base.with_name(base.name + MESSAGES_SUFFIX), base.with_name(base.name + STATES_SUFFIX)


def write_side_files(segment_path: str | Path, vhost: str, queue: str) -> Path | None:
    """Convert a sealed segment; returns the messages file, or None if the segment is gone.
    Blocking and CPU-bound: never call it on the event loop."""
    from spark.columnar import decode_columns
    from spark.segment_index import index_segment

    path = Path(segment_path)
    try:
        stat = os.stat(path)
        scan = snapshot_scan(path, stat.st_size, file_identity(stat))
    except (FileNotFoundError, CorruptSegmentHeader):
        return None
    if scan is None:
        return None
    index = index_segment(scan.data, scan.header.header_length)
    events = index.events
    columns = list(MESSAGE_COLUMNS)
    decoded = decode_columns(scan.data, index.starts, index.ends, tuple(columns))
    decoded["seq"] = pa.array(index.seqs)
    decoded["published_at"] = pa.array(index.published_ms * 1000, pa.timestamp("us", tz="UTC"))
    n = len(index.seqs)
    names = ["vhost", "queue", "segment", *columns]
    arrays = [pa.array([vhost] * n, pa.string()), pa.array([queue] * n, pa.string()),
              pa.array([path.name] * n, pa.string()), *(decoded[c] for c in columns)]
    schema = arrow_schema(names).with_metadata(_metadata(scan.data, stat.st_size))
    table = pa.Table.from_arrays(arrays, schema=schema)
    states = pa.Table.from_arrays([pa.array(column) for column in events], schema=_STATE_SCHEMA)
    messages_path, states_path = side_paths(path)
    messages_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(states.replace_schema_metadata(schema.metadata), states_path)
    _write_atomically(table, messages_path)  # last: its presence says both are complete
    return messages_path


def load_messages(ref: SegmentRef, columns: tuple[str, ...],
                  events: StateEvents | None = None) -> tuple[pa.Table, StateEvents] | None:
    """The segment's message columns (always with seq and published_at) and its state records
    (read unless ``events`` already has them) from side files, or None when there are none that
    match the segment."""
    found = _matching(ref)
    if found is None:
        return None
    messages_path, states_path = found
    wanted = sorted({"seq", "published_at", *columns}, key=MESSAGE_COLUMNS.index)
    try:
        table = pq.read_table(messages_path, columns=wanted)
        if events is None:
            events = _events(pq.read_table(states_path))
        # Once per file rather than per batch: the exact Arrow types Spark expects (Parquet renames
        # the map's fields), in one chunk, so that batches are zero-copy slices.
        table = table.cast(arrow_schema(wanted, frozenset())).combine_chunks()
    except (OSError, pa.ArrowException):
        return None
    return table, events


def load_events(ref: SegmentRef) -> StateEvents | None:
    found = _matching(ref)
    if found is None:
        return None
    try:
        return _events(pq.read_table(found[1]))
    except (OSError, pa.ArrowException):
        return None


def _events(table: pa.Table) -> StateEvents:
    return StateEvents(*(table.column(name).to_numpy() for name in _STATE_SCHEMA.names))


def _matching(ref: SegmentRef) -> tuple[Path, Path] | None:
    messages_path, states_path = side_paths(ref.path)
    if not messages_path.is_file() and ref.archive_path is not None:
        messages_path, states_path = side_paths(ref.archive_path)
    try:
        meta = pq.read_schema(messages_path).metadata or {}
    except (OSError, pa.ArrowException):
        return None
    if meta.get(_META_SIZE) != str(ref.size).encode():
        return None
    header = read_prefix(Path(ref.path), HEADER_SIZE, ref.identity)
    if header is None and ref.archive_path is not None:
        header = read_prefix(Path(ref.archive_path), HEADER_SIZE, ref.identity)
    if header is None or meta.get(_META_HEADER_CRC) != header[36:40].hex().encode():
        return None
    return messages_path, states_path


def _metadata(data: bytes, size: int) -> dict[bytes, bytes]:
    return {_META_SIZE: str(size).encode(), _META_HEADER_CRC: data[36:40].hex().encode()}


def _write_atomically(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=_ROW_GROUP)
    os.replace(tmp, path)


class SideFileWriter:
    """Writes side files in one worker thread. ``segment_sealed`` is the broker's hook."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="side-files")

    def segment_sealed(self, segment_path: str | Path, vhost: str, queue: str) -> Future:
        """Queue the conversion of a segment that was just sealed; returns at once."""
        return self._pool.submit(self._convert, Path(segment_path), vhost, queue)

    @staticmethod
    def _convert(path: Path, vhost: str, queue: str) -> Path | None:
        try:
            result = write_side_files(path, vhost, queue)
            if result is None:  # removed or archived before we got to it
                moved = path.parents[3] / "archive" / path.parent.parent.name / path.parent.name / path.name
                result = write_side_files(moved, vhost, queue)
            return result
        except Exception:  # a cache: never let a failure here reach the broker
            log.exception("writing the Parquet side files of %s failed", path)
            return None

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


def convert_data_dir(data_dir: str | Path) -> tuple[int, int]:
    """Write missing side files for every sealed segment and delete orphaned ones.
    Returns (side files written, orphans removed). The newest live segment of a queue is not sealed."""
    data_dir = Path(data_dir)
    written = removed = 0
    wanted: set[Path] = set()
    for archive in (False, True):
        for entry in list_queue_directories(data_dir, archive=archive):
            segments = list_archived_segments(entry.path)
            sealed = segments if archive else segments[:-1]
            for segment in segments:
                wanted.update(side_paths(segment.path))
            for segment in sealed:
                stat = segment.path.stat()
                ref = SegmentRef(segment.segment_id, segment.copy, str(segment.path), None, stat.st_size,
                                 file_identity(stat), stat.st_mtime_ns, archive)
                if _matching(ref) is None and write_side_files(segment.path, entry.vhost, entry.queue):
                    written += 1
    side_root = data_dir / SIDE_DIR
    if side_root.is_dir():
        for path in side_root.glob("*/*/*.parquet"):
            if path not in wanted:
                path.unlink(missing_ok=True)
                removed += 1
    return written, removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.side_files", description=convert_data_dir.__doc__)
    parser.add_argument("data_dir")
    args = parser.parse_args(argv)
    written, removed = convert_data_dir(args.data_dir)
    print(f"{written} segments converted, {removed} orphaned side files removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
