"""The amqp-queue data source on streams, without a JVM: rows and columns, offsets, the committed
snapshot (the stream log's commit mark), partitions, offset and timestamp pushdown proven by what
is read, and damage. Streams are written by persistence/stream_log.py directly."""

from __future__ import annotations

import datetime
import os
import struct
import zlib
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from pamqp import commands  # noqa: E402

from persistence.queue_store import QueueStore  # noqa: E402
from persistence.stream_commit_mark import MARK_FILE, CommitMark, DamagedCommitMark, read_commit_mark  # noqa: E402
from persistence.stream_cursor import CorruptStreamRecord  # noqa: E402
from persistence.stream_log import StreamLog  # noqa: E402
from persistence.stream_segment import HEADER_SIZE, UnsupportedStreamFormatVersion, stream_path  # noqa: E402
from spark.local_scan import read_table  # noqa: E402
from spark.partition_reader import ScanRequest  # noqa: E402
from spark.schema import COLUMN_NAMES, arrow_schema  # noqa: E402
from spark.stream_reader import STATS, read_stream_partition  # noqa: E402
from spark.stream_snapshot import plan_stream_parts, plan_streams  # noqa: E402
from spark.synthetic_queue import raw_properties  # noqa: E402

UTC = datetime.timezone.utc
T0 = 1_700_000_000_000  # ms
PROPS = raw_properties(commands.Basic.Properties(
    content_type="application/json", headers={"tenant": "acme", "n": 7}, delivery_mode=2, message_id="m"))
SEGMENT = 64 * 1024
INTERVAL = 4096  # side index entry spacing: small, so seeks are visible in small files


def open_log(root: Path, name: str = "orders", vhost: str = "/", **options) -> StreamLog:
    options.setdefault("max_segment_bytes", SEGMENT)
    options.setdefault("index_interval_bytes", INTERVAL)
    return StreamLog.open_in(root, vhost, name, **options)


def fill(log: StreamLog, n: int, *, body_size: int = 100, filter_of=None) -> None:
    for _ in range(n):
        k = log.appended_offset
        log.append("amq.direct", f"rk.{k % 3}", PROPS, body_of(k, body_size), timestamp_ms=T0 + 10 * k,
                   filter_value=None if filter_of is None else filter_of(k))


def body_of(k: int, size: int) -> bytes:
    stamp = f"<{k}>".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


def seqs(root: Path, **kw) -> list[int]:
    return read_table(root, ("seq",), **kw).column("seq").to_pylist()


def stream_files(log: StreamLog) -> list[Path]:
    return sorted(log.directory.glob("*.seg"))


@pytest.fixture
def stream(tmp_path):
    """2,000 committed records of about 150 bytes over several 64 KiB segments, closed."""
    log = open_log(tmp_path)
    for _ in range(4):
        fill(log, 500)
        log.sync_now()
    log.close()
    return tmp_path


# ---- rows and columns ------------------------------------------------------------------------


def test_every_record_is_a_row_with_the_batch_sources_columns(tmp_path):
    log = open_log(tmp_path)
    fill(log, 30, filter_of=lambda k: None if k % 3 == 0 else "f" * (k % 5))  # filter values move the fields
    log.close()
    batches = list(read_batches_of(tmp_path, COLUMN_NAMES))
    assert batches and all(b.schema == arrow_schema() for b in batches)
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["seq"] for r in rows] == list(range(30))
    row = rows[7]
    assert (row["vhost"], row["queue"], row["queue_type"], row["delayed_exchange"]) == ("/", "orders", "stream", None)
    assert row["segment"] == "00000000000000000000.seg"
    assert row["published_at"] == datetime.datetime.fromtimestamp((T0 + 70) / 1000, UTC)
    assert (row["exchange"], row["routing_key"], row["body"], row["body_size"]) == (
        "amq.direct", "rk.1", body_of(7, 100), 100)
    assert (row["content_type"], dict(row["headers"]), row["delivery_mode"], row["message_id"]) == (
        "application/json", {"tenant": "acme", "n": "7"}, 2, "m")
    # State-like columns say "in the stream": nothing a consumer does changes a stream's records.
    assert (row["state"], row["state_event"], row["delivery_count"], row["redelivered"]) == (
        "in_stream", "published", 0, False)
    assert row["state_at"] == row["published_at"]
    assert (row["reason"], row["due_at"], row["archived"]) == (None, None, False)


def read_batches_of(root: Path, columns, **kw):
    request = ScanRequest(tuple(columns), **kw)
    for part in plan_stream_parts(root, request):
        yield from read_stream_partition(part, request)


def test_offsets_run_across_segments_once_each(stream):
    table = read_table(stream, ("seq", "segment", "body"))
    assert table.column("seq").to_pylist() == list(range(2000))
    segments = table.column("segment").to_pylist()
    assert len(set(segments)) >= 4
    for seq, segment, body in zip(table.column("seq").to_pylist(), segments, table.column("body").to_pylist()):
        assert int(segment[:20]) <= seq and body == body_of(seq, 100)


def test_queues_and_streams_are_read_together_and_told_apart(tmp_path):
    store = QueueStore.for_queue(tmp_path, "/", "orders-eu")
    store.recover()
    store.append_message(1, T0, "", "orders-eu", PROPS, b"queued")
    store.close()
    log = open_log(tmp_path, "orders-us")
    fill(log, 3)
    log.close()
    other = open_log(tmp_path, "audit", vhost="other")
    fill(other, 2)
    other.close()
    table = read_table(tmp_path, ("vhost", "queue", "queue_type", "state", "seq"), queue="orders-*")
    assert sorted(map(tuple, (r.values() for r in table.to_pylist()))) == [
        ("/", "orders-eu", "queue", "ready", 1),
        ("/", "orders-us", "stream", "in_stream", 0),
        ("/", "orders-us", "stream", "in_stream", 1),
        ("/", "orders-us", "stream", "in_stream", 2),
    ]
    assert seqs(tmp_path, vhost="other") == [0, 1]
    assert seqs(tmp_path, queue="orders-us", states=frozenset({"ready"})) == []
    assert seqs(tmp_path, queue="orders-us", states=frozenset({"in_stream"})) == [0, 1, 2]


# ---- the committed snapshot ---------------------------------------------------------------------


def test_only_committed_records_are_read_while_the_log_appends(tmp_path):
    log = open_log(tmp_path)
    fill(log, 100)
    log.sync_now()
    fill(log, 50)
    log.flush()  # written to the file, not fsynced: not committed
    assert stream_files(log)[-1].stat().st_size > read_commit_mark(log.directory).position
    assert seqs(tmp_path) == list(range(100))
    log.sync_now()
    assert seqs(tmp_path) == list(range(150))
    fill(log, 2000)  # rolls over into new segments, flushed as it goes, none committed
    log.flush()
    assert len(stream_files(log)) > 2
    assert seqs(tmp_path) == list(range(150))
    log.sync_now()
    assert seqs(tmp_path) == list(range(2150))
    log.close()


def test_the_commit_mark_follows_the_rounds_and_recovery(tmp_path):
    log = open_log(tmp_path)
    assert read_commit_mark(log.directory) == CommitMark(None, 0, 0)
    fill(log, 10)
    assert read_commit_mark(log.directory).next_offset == 0
    log.sync_now()
    mark = read_commit_mark(log.directory)
    assert mark == CommitMark(0, stream_files(log)[0].stat().st_size, 10)
    fill(log, 5)
    log.flush()
    # A crash now: the records written since the last round are not committed, and the next open,
    # which keeps (and fsyncs) them, commits them.
    os.close(log._tail_fd)
    log._tail_fd = None
    assert seqs(tmp_path) == list(range(10))
    again = open_log(tmp_path)
    assert read_commit_mark(again.directory).next_offset == 15 and seqs(tmp_path) == list(range(15))
    again.close()


def test_without_a_commit_mark_only_what_side_files_cover_is_read(stream):
    directory = plan_streams(stream)[0].directory
    os.unlink(Path(directory) / MARK_FILE)
    snapshot = plan_streams(stream)[0]
    assert snapshot.mark is None
    assert seqs(stream) == list(range(2000))  # closed cleanly: every segment has a side file
    tail = max(Path(directory).glob("*.sidx"))
    os.unlink(tail)
    got = seqs(stream)
    assert got == list(range(int(tail.name[:20])))


def test_a_damaged_commit_mark_fails_the_planning_with_its_path(stream):
    path = Path(plan_streams(stream)[0].directory) / MARK_FILE
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedCommitMark, match=str(path)):
        seqs(stream)


# ---- partitions --------------------------------------------------------------------------------


def test_a_large_segment_is_split_into_partitions_at_index_entries(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=10 * 1024 * 1024)
    fill(log, 3000)
    log.close()
    request = ScanRequest(("seq",))
    parts = plan_stream_parts(tmp_path, request, partition_bytes=64 * 1024)
    assert len({p.segment_id for p in parts}) == 1 and len(parts) >= 6
    for before, after in zip(parts, parts[1:]):
        assert (before.end, before.end_offset) == (after.start, after.start_offset)  # no gap, no overlap
    got = []
    for part in parts:
        got.extend(seqs_of(part, request))
    assert got == list(range(3000))


def seqs_of(part, request) -> list[int]:
    return [s for b in read_stream_partition(part, request) for s in b.column("seq").to_pylist()]


def test_the_spark_reader_plans_stream_partitions_and_reads_them(stream):
    pytest.importorskip("pyspark")
    from spark.data_source import QueueReader, StreamPartition

    reader = QueueReader({"path": str(stream), "queue": "ord*", "partition_bytes": "32768"}, ("queue", "seq"),
                         frozenset())
    partitions = reader.partitions()
    assert len(partitions) > 4 and all(isinstance(p, StreamPartition) for p in partitions)
    got = [s for p in partitions for b in reader.read(p) for s in b.column("seq").to_pylist()]
    assert got == list(range(2000))
    with pytest.raises(ValueError, match="partition_bytes"):
        QueueReader({"path": str(stream), "partition_bytes": "lots"}, ("seq",), frozenset())


# ---- pushdown ------------------------------------------------------------------------------------


def test_an_offset_range_reads_only_the_segments_and_bytes_holding_it(stream):
    total = sum(p.stat().st_size for p in Path(plan_streams(stream)[0].directory).glob("*.seg"))
    STATS.reset()
    assert seqs(stream) == list(range(2000))
    full_opened, full_bytes = STATS.segments_opened, STATS.bytes_read
    assert full_bytes >= total - 1000

    STATS.reset()
    assert seqs(stream, seq_min=1000, seq_max=1019) == list(range(1000, 1020))  # seq >= 1000 AND seq < 1020
    assert STATS.segments_opened == 1 < full_opened
    assert STATS.bytes_read <= 2 * INTERVAL + HEADER_SIZE + 3000  # sought by the side index

    STATS.reset()
    assert seqs(stream, seq_min=1500) == list(range(1500, 2000))
    assert STATS.bytes_read < total * 0.3

    STATS.reset()
    assert seqs(stream, seq_min=777, seq_max=777) == [777]  # seq = 777
    assert STATS.segments_opened == 1 and STATS.bytes_read <= INTERVAL + HEADER_SIZE + 1000

    STATS.reset()
    assert seqs(stream, seq_values=(3, 1200, 1999, 5000)) == [3, 1200, 1999]  # IN
    assert STATS.segments_opened == 3 and STATS.bytes_read <= 3 * (INTERVAL + HEADER_SIZE + 1000)

    STATS.reset()
    assert seqs(stream, seq_min=2000) == [] and seqs(stream, seq_values=()) == []
    assert STATS.segments_opened == 0


def test_a_timestamp_range_reads_only_the_segments_and_bytes_holding_it(stream):
    us = lambda k: (T0 + 10 * k) * 1000  # noqa: E731 - the publish time of record k
    STATS.reset()
    got = seqs(stream, published_min_us=us(1200), published_max_us=us(1210) - 1)
    assert got == list(range(1200, 1210))
    assert STATS.segments_opened == 1 and STATS.bytes_read <= 2 * INTERVAL + HEADER_SIZE + 2000

    STATS.reset()
    assert seqs(stream, published_min_us=us(1990) + 1) == list(range(1991, 2000))
    assert STATS.segments_opened == 1

    STATS.reset()
    assert seqs(stream, published_max_us=us(10)) == list(range(11))
    assert STATS.segments_opened == 1

    STATS.reset()
    both = seqs(stream, seq_min=500, published_max_us=us(520))
    assert both == list(range(500, 521)) and STATS.segments_opened == 1


def test_the_live_tail_without_a_side_file_is_read_from_its_last_indexed_point(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=50 * 1024 * 1024, checkpoint_bytes=128 * 1024)
    fill(log, 3000)
    log.sync_now()  # a side file for the first ~128 KiB written in the round
    fill(log, 10)
    log.sync_now()
    assert list(log.directory.glob("*.sidx")), "the tail has a side file for a prefix"
    STATS.reset()
    assert seqs(tmp_path, seq_min=3005) == list(range(3005, 3010))
    size = stream_files(log)[0].stat().st_size
    assert STATS.bytes_read < size / 2
    log.close()


def test_pushdown_takes_seq_in_queue_type_and_the_stream_state():
    datasource = pytest.importorskip("pyspark.sql.datasource")
    from spark.pushdown import translate

    pushed, rest = translate([
        datasource.In(("seq",), (5, 1, 9)),
        datasource.In(("seq",), (9, 5, 7)),
        datasource.EqualTo(("queue_type",), "stream"),
        datasource.EqualTo(("state",), "in_stream"),
        datasource.In(("seq",), (1, None)),  # not all integers: Spark keeps it
    ])
    assert pushed.seq_values == {5, 9} and pushed.queue_types == {"stream"} and pushed.states == {"in_stream"}
    assert len(rest) == 1
    assert pushed.accepts_type("stream") and not pushed.accepts_type("queue")


# ---- damage and a live directory -------------------------------------------------------------------


def test_a_corrupt_record_fails_the_read_naming_the_file_and_position(stream):
    first = min(Path(plan_streams(stream)[0].directory).glob("*.seg"))
    with open(first, "r+b") as f:
        f.seek(HEADER_SIZE + 5000)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 5000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptStreamRecord) as raised:
        seqs(stream)
    error = raised.value
    assert error.path == str(first) and HEADER_SIZE < error.position <= HEADER_SIZE + 5000
    assert "CRC mismatch" in str(error) and str(first) in str(error) and f"byte {error.position}" in str(error)
    # A range that does not reach the damage reads fine.
    assert seqs(stream, seq_min=1500) == list(range(1500, 2000))


def test_a_committed_record_cut_off_fails_the_read(stream):
    last = max(Path(plan_streams(stream)[0].directory).glob("*.seg"))
    size = last.stat().st_size
    os.truncate(last, size - 30)
    with pytest.raises(CorruptStreamRecord, match="ends before the committed end"):
        seqs(stream)


def test_offsets_that_do_not_run_on_fail_the_read(tmp_path):
    log = open_log(tmp_path)
    fill(log, 20)
    log.close()
    path = stream_files(log)[0]
    data = bytearray(path.read_bytes())
    # Rewrite record 3's offset (and its CRCs) to 30: offsets 3..29 missing.
    pos = HEADER_SIZE
    for _ in range(3):
        pos += 4 + struct.unpack_from(">I", data, pos)[0]
    length = struct.unpack_from(">I", data, pos)[0]
    struct.pack_into(">Q", data, pos + 9, 30)
    n_filter = data[pos + 26]
    head_end = pos + 27 + n_filter
    struct.pack_into(">I", data, head_end, zlib.crc32(bytes(data[pos + 8 : head_end]), zlib.crc32(bytes(data[pos : pos + 4]))))
    struct.pack_into(">I", data, pos + 4, zlib.crc32(bytes(data[pos + 8 : pos + 4 + length])))
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStreamRecord, match=r"offsets 3\.\.29 missing") as raised:
        seqs(tmp_path)
    assert raised.value.position == pos


def test_a_segment_of_an_unknown_format_version_is_refused(stream):
    first = min(Path(plan_streams(stream)[0].directory).glob("*.seg"))
    with open(first, "r+b") as f:
        f.seek(8)
        f.write(b"\x00\x09")
    with pytest.raises(UnsupportedStreamFormatVersion):
        seqs(stream)


def test_a_segment_dropped_by_retention_after_planning_gives_no_rows(stream):
    request = ScanRequest(("seq",))
    parts = plan_stream_parts(stream, request)
    first = parts[0].path
    second_id = next(p.segment_id for p in parts if p.path != first)
    os.unlink(first)
    assert [s for part in parts for s in seqs_of(part, request)] == list(range(second_id, 2000))


def test_a_stream_deleted_and_declared_again_is_not_read_from_the_old_plan(stream):
    request = ScanRequest(("seq",))
    parts = plan_stream_parts(stream, request)
    log = StreamLog.open_in(stream, "/", "orders")
    log.delete()
    again = open_log(stream)
    fill(again, 5)
    again.close()
    assert [s for part in parts for s in seqs_of(part, request)] == []  # other files now: nothing from them
    assert seqs(stream) == list(range(5))


def test_the_stream_directory_layout_is_the_one_the_broker_uses(tmp_path):
    log = open_log(tmp_path)
    assert log.directory == stream_path(tmp_path, "/", "orders")
    log.close()
    assert plan_streams(tmp_path, queue="orders")[0].directory == str(log.directory)


def test_the_commit_mark_in_the_format_document_is_what_the_writer_writes():
    from persistence.stream_commit_mark import encode_commit_mark

    doc = (Path(__file__).resolve().parent.parent / "docs" / "stream-files.md").read_text()
    example = doc.split("<!-- commit mark example -->")[1].split("```")[1]
    expected = bytes.fromhex(" ".join(line[6:53] for line in example.strip().splitlines()))
    assert encode_commit_mark(CommitMark(4718592, 1048616, 31337)) == expected
