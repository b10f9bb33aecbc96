"""Reading a stream by blocks (persistence/stream_blocks.py, StreamCursor.read_run): the records
are those a careful read returns, cursors reading the same history share each block (read and
checked once, held once), the shared blocks are bounded and let go once every reader is past
them, and damage is reported as a careful read reports it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from persistence.stream_blocks import BLOCK_CACHE_BYTES, RecordRun
from persistence.stream_cursor import CorruptStreamRecord, StreamCursor
from persistence.stream_log import StreamLog
from persistence.stream_segment import split_envelope
from tests.test_stream_log import PROPS, body_of, crash, fill, flip_byte_in_record, open_log, read_all, segment_paths


def runs_of(cursor: StreamCursor, max_records: int = 100, max_bytes: int = 1 << 20) -> list[RecordRun]:
    runs = []
    while True:
        run = cursor.read_run(max_records, max_bytes)
        if run.start == run.stop:
            return runs
        runs.append(run)


def triples(runs: list[RecordRun]) -> list[tuple[int, bytes, bytes]]:
    return [record for run in runs for record in run.records[run.start:run.stop]]


def as_fields(triple: tuple[int, bytes, bytes]) -> tuple[int, str, str, bytes, bytes]:
    offset, envelope, body = triple
    exchange, routing_key, properties = split_envelope(envelope)
    return offset, exchange.decode(), routing_key.decode(), properties, body


@pytest.mark.parametrize("start", [0, 1, 57, 400, 999])
def test_a_run_holds_the_records_a_careful_read_returns(tmp_path: Path, start: int) -> None:
    log = open_log(tmp_path, max_segment_bytes=32 * 1024, index_interval_bytes=4096)
    fill(log, 1000, body_size=90)
    log.sync_now()
    expected = [(r.offset, r.exchange, r.routing_key, r.raw_properties, r.body) for r in read_all(log.reader(start))]
    runs = runs_of(log.reader(start), max_records=37, max_bytes=5000)
    assert [as_fields(t) for t in triples(runs)] == expected
    if start < 900:
        assert any(run.block is not None for run in runs), "history is read by blocks"
    else:
        assert all(run.block is None for run in runs), "the newest records, one by one"
    assert all(run.stop - run.start <= 37 for run in runs)
    assert all(sum(len(t[2]) for t in run.records[run.start:run.stop]) <= 5000 or run.stop - run.start == 1
               for run in runs), "a run stops at max_bytes (but holds at least one record)"


def test_records_with_one_envelope_share_one_envelope_object(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    for k in range(300):
        log.append("ex", "same", PROPS, body_of(k, 50))
    log.append("ex", "other", PROPS, b"x")
    log.sync_now()
    records = triples(runs_of(log.reader(0)))
    assert len({id(envelope) for _, envelope, _ in records[:300]}) == 1
    assert records[300][1] != records[0][1]
    messages = log.reader(0).read_messages(1000)
    assert len({id(envelope) for _, envelope, _ in messages[:300]}) == 1


def test_cursors_reading_the_same_history_share_its_blocks(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=4096)
    fill(log, 500)
    log.sync_now()
    alone = log.reader(0)
    runs_of(alone)
    assert len(log.blocks) == 0, "a single reader keeps no block for others"
    alone.close()
    first, second = log.reader(0), log.reader(0)
    run = first.read_run(10)
    assert run.block is not None and len(log.blocks) == 1, "kept for the reader behind"
    again = second.read_run(10)
    assert again.block is run.block and again.records is run.records, "the second reads no file"
    assert triples([again]) == triples([run])


def test_blocks_every_reader_is_past_are_let_go(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=4096)
    fill(log, 2000)
    log.sync_now()
    leader, follower = log.reader(0), log.reader(0)
    for _ in range(10):
        leader.read_run(100)  # (a run ends with its block)
    assert len(log.blocks) == 10, "kept for the follower"
    for _ in range(10):
        follower.read_run(100)
    assert follower.place == leader.place
    leader.read_run(100)  # a block read from the file lets go of those both readers are past
    assert len(log.blocks) == 1, "only the block the follower has yet to read"


def test_the_shared_blocks_are_bounded_whatever_the_readers_do(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=64 << 20)
    body = b"b" * 1000
    for _ in range(20_000):  # 20 MB, far more than the cache
        log.append("ex", "rk", PROPS, body)
    log.sync_now()
    stuck = log.reader(0)
    stuck.read_run(1)
    reader = log.reader(0)
    count = sum(run.stop - run.start for run in runs_of(reader, 256))
    assert count == 20_000
    assert 0 < log.blocks.bytes <= BLOCK_CACHE_BYTES


@pytest.mark.slow  # 12 s: 200 MB written, then read ten times
def test_ten_readers_of_200_mb_do_not_load_the_stream_into_memory(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=64 << 20)
    body = b"m" * 1000
    for _ in range(200_000):  # about 200 MiB
        log.append("ex", "rk", PROPS, body)
        if len(log._buffer) > (4 << 20):
            log.sync_now()
    log.sync_now()
    tracemalloc.start()
    try:
        readers = [log.reader(0) for _ in range(10)]
        counts = [0] * 10
        while min(counts) < 200_000:
            for i, reader in enumerate(readers):
                run = reader.read_run(256)
                counts[i] += run.stop - run.start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counts == [200_000] * 10
    assert peak < 12 << 20, f"peak {peak} bytes while ten readers read 200 MiB"


def test_damage_in_a_block_is_reported_as_a_careful_read_reports_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=4096)
    fill(log, 200)
    log.sync_now()
    path = segment_paths(log)[-1]
    crash(log)
    position = flip_byte_in_record(path, 107, 60)
    again = open_log(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=4096)
    cursor = again.reader(0)
    offsets: list[int] = []
    with pytest.raises(CorruptStreamRecord) as raised:
        while True:
            run = cursor.read_run(50)
            assert run.start < run.stop
            offsets.extend(t[0] for t in run.records[run.start:run.stop])
    assert offsets == list(range(107)), "the records before it come first"
    assert raised.value.offset == 107 and raised.value.position == position
    assert [t[0] for t in triples(runs_of(cursor))] == list(range(108, 200)), "then it goes on after it"


def test_retention_lets_go_of_the_blocks_of_the_segments_it_drops(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=16 * 1024, index_interval_bytes=4096)
    fill(log, 1000)
    log.sync_now()
    readers = [log.reader(0), log.reader(0)]
    readers[0].read_run(50)
    assert len(log.blocks) == 1
    first_segment = log.segments()[0].segment_id
    log.enforce_retention(log.disk_bytes() // 2, None)
    assert log.first_offset > 0
    assert all(key[0] != first_segment for key in log.blocks._blocks)
    # Both go on from the first record kept, the gap counted.
    for reader in readers:
        records = triples(runs_of(reader))
        assert records[0][0] == log.first_offset and records[-1][0] == 999
        assert reader.lost > 0


def test_a_reader_at_the_end_gets_what_is_committed_later(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=4096)
    fill(log, 100)
    log.sync_now()
    cursor = log.reader(0)
    assert len(triples(runs_of(cursor))) == 100
    fill(log, 100)
    assert cursor.read_run().start == cursor.read_run().stop == 0, "nothing before it is committed"
    log.sync_now()
    assert [t[0] for t in triples(runs_of(cursor))] == list(range(100, 200))


def test_stream_log_options_reach_the_cursor(tmp_path: Path) -> None:
    # (read_run is the stream queue's read; the log's reader makes the cursor it uses)
    log = StreamLog.open(tmp_path / "x", "/", "x")
    log.append("", "k", b"\x00\x00", b"")
    log.sync_now()
    run = log.reader(0).read_run()
    assert triples([run]) == [(0, b"\x00\x01k\x00\x00\x00\x02\x00\x00", b"")]


def test_appends_that_repeat_or_change_their_envelope_read_back_as_appended(tmp_path: Path) -> None:
    # (The writer makes an envelope once per change of exchange, routing key or properties.)
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    routings = [("ex", "a", PROPS), ("ex", "a", PROPS), ("ex", "b", PROPS), ("ex", "a", b"\x00\x00"),
                ("", "a", b"\x00\x00"), ("", "a", b"\x00\x00"), ("ex", "a", PROPS)]
    for k, (exchange, key, properties) in enumerate(routings * 50):
        log.append(exchange, key, properties, body_of(k, 20))
    log.sync_now()
    got = [(r.exchange, r.routing_key, r.raw_properties, r.body) for r in read_all(log.reader(0))]
    assert got == [(*routing, body_of(k, 20)) for k, routing in enumerate(routings * 50)]


def test_a_filtered_read_goes_past_more_than_max_bytes_of_skipped_records(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_segment_bytes=64 << 20)
    for k in range(3000):  # 3 MB the filter skips, then one it wants
        log.append("ex", "rk", PROPS, b"s" * 1000, filter_value="other")
    log.append("ex", "rk", PROPS, b"wanted", filter_value="mine")
    log.sync_now()
    cursor = log.reader(0, filter_values=["mine"])
    run = cursor.read_run(10, max_bytes=64 * 1024)
    assert [(t[0], t[2]) for t in run.records[run.start:run.stop]] == [(3000, b"wanted")]
    assert cursor.read_messages(10, max_bytes=64 * 1024) == []
