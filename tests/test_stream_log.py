"""The stream log (persistence/stream_log.py): append and read across segments, offsets and time,
retention, recovery after a crash, and the side index. Durability and consumer offsets are in
tests/test_stream_durability.py."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from persistence import stream_index
from persistence.format_version import UnsupportedFormatVersion
from persistence.segment_file import trusted_record_offsets
from persistence.stream_cursor import CorruptStreamRecord
from persistence.stream_log import StreamLog
from persistence.stream_segment import (
    HEADER_SIZE,
    StreamRecord,
    UnsupportedStreamFormatVersion,
    encode_header,
    encode_record,
    index_file_name,
    segment_file_name,
    stream_path,
)

PROPS = b"\x10\x00\x02"  # delivery-mode 2


def open_log(root: Path, **options) -> StreamLog:
    options.setdefault("max_segment_bytes", 64 * 1024)
    return StreamLog.open(root / "s", "/", "s", **options)


def fill(log: StreamLog, n: int, body_size: int = 100, *, start_ts: int | None = None, filter_of=None) -> list[int]:
    offsets = []
    for k in range(n):
        ts = None if start_ts is None else start_ts + k
        flt = None if filter_of is None else filter_of(k)
        offsets.append(log.append("ex", f"rk{k}", PROPS, body_of(k, body_size), filter_value=flt, timestamp_ms=ts))
    return offsets


def body_of(k: int, size: int) -> bytes:
    stamp = f"<{k}>".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


def read_all(cursor, batch: int = 100) -> list[StreamRecord]:
    out: list[StreamRecord] = []
    while True:
        records = cursor.read(batch)
        if not records:
            return out
        out.extend(records)


def crash(log: StreamLog) -> None:
    """Lose the process: buffered records are gone, nothing is fsynced or indexed on the way out."""
    if log._tail_fd is not None:
        os.close(log._tail_fd)
        log._tail_fd = None
    log._closed = True


def segment_paths(log: StreamLog) -> list[Path]:
    return sorted(log.directory.glob("*.seg"))


# ---- append and read ---------------------------------------------------------------------------


def test_append_and_read_across_segment_rolls(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=8 * 1024)
    offsets = fill(log, 1000, filter_of=lambda k: "even" if k % 2 == 0 else None)
    assert offsets == list(range(1000)), "offsets start at 0 and are consecutive"
    log.sync_now()
    assert len(log.segments()) > 10
    records = read_all(log.reader(0))
    assert [r.offset for r in records] == list(range(1000))
    for k, r in enumerate(records):
        assert (r.exchange, r.routing_key, r.raw_properties, r.body) == ("ex", f"rk{k}", PROPS, body_of(k, 100))
        assert r.filter_value == ("even" if k % 2 == 0 else None)
    # Every segment is named after its first offset and none is over the limit.
    for info in log.segments():
        assert info.size <= 8 * 1024
        assert (log.directory / segment_file_name(info.first_offset)).is_file()
    log.close()
    again = open_log(tmp_path, max_segment_bytes=8 * 1024)
    assert [r.offset for r in read_all(again.reader(0))] == list(range(1000))
    assert again.append("ex", "rk", PROPS, b"next") == 1000


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 3)
    big = log.append("ex", "rk", PROPS, b"B" * 10_000)
    fill(log, 3)
    log.sync_now()
    assert [r.offset for r in read_all(log.reader(0))] == list(range(7))
    assert [s.first_offset for s in log.segments()] == [0, 3, 4]
    assert read_all(log.reader(big))[0].body == b"B" * 10_000


def test_many_cursors_at_different_offsets_read_independently(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=16 * 1024)
    fill(log, 2000)
    log.sync_now()
    starts = [0, 1, 499, 500, 1234, 1999, 2000]
    cursors = {start: log.reader(start) for start in starts}
    seen: dict[int, list[int]] = {start: [] for start in starts}
    # Interleaved, in small batches: no cursor disturbs another.
    while True:
        progress = False
        for start, cursor in cursors.items():
            batch = cursor.read(37)
            seen[start] += [r.offset for r in batch]
            progress |= bool(batch)
        if not progress:
            break
    for start in starts:
        assert seen[start] == list(range(start, 2000))
        assert cursors[start].next_offset == 2000


def test_a_cursor_at_the_tail_sees_records_committed_later(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    committed: list[int] = []
    log.on_committed = committed.append
    fill(log, 10)
    log.sync_now()
    tail = log.reader(log.next_offset)
    assert tail.read() == []
    fill(log, 100)  # rolls over a few segments
    assert tail.read() == [], "records not committed yet are not readable"
    assert log.next_offset == 10 and log.appended_offset == 110
    log.sync_now()
    assert committed == [10, 110]
    assert [r.offset for r in read_all(tail)] == list(range(10, 110))
    # Iterating stops at the end and goes on later.
    assert list(tail) == []
    fill(log, 2)
    log.sync_now()
    assert [r.offset for r in tail] == [110, 111]


def test_offsets_past_the_end_start_at_next_and_negative_ones_are_refused(tmp_path):
    log = open_log(tmp_path)
    fill(log, 5)
    log.sync_now()
    cursor = log.reader(1000)
    assert cursor.next_offset == 5
    fill(log, 1)
    log.sync_now()
    assert [r.offset for r in cursor.read()] == [5]
    with pytest.raises(ValueError):
        log.reader(-1)


def test_an_empty_stream(tmp_path):
    log = open_log(tmp_path)
    assert (log.first_offset, log.next_offset, log.last_offset, log.last_chunk_offset) == (0, 0, None, None)
    assert log.offset_at(0) == 0
    cursor = log.reader(0)
    assert cursor.read() == []
    fill(log, 2)
    log.sync_now()
    assert [r.offset for r in cursor.read()] == [0, 1]


# ---- first, last, next, chunks, time ---------------------------------------------------------


def test_first_last_next_and_the_last_chunk(tmp_path):
    log = open_log(tmp_path)
    fill(log, 3)
    log.sync_now()  # chunk 0..2
    fill(log, 4)
    log.flush()  # chunk 3..6, written but not committed
    fill(log, 2)  # chunk 7..8, buffered
    assert (log.first_offset, log.last_offset, log.next_offset, log.last_chunk_offset) == (0, 2, 3, 0)
    log.sync_now()
    assert (log.first_offset, log.last_offset, log.next_offset, log.last_chunk_offset) == (0, 8, 9, 7)
    # RabbitMQ's `last`: a reader from the last chunk gets its records.
    assert [r.offset for r in read_all(log.reader(log.last_chunk_offset))] == [7, 8]
    log.close()
    again = open_log(tmp_path)
    assert (again.first_offset, again.last_offset, again.next_offset, again.last_chunk_offset) == (0, 8, 9, 7)
    crash(again)
    third = open_log(tmp_path)
    assert third.last_chunk_offset == 7, "rebuilt by the scan of the tail too"


def test_offset_at_finds_the_first_record_at_or_after_a_time(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=8 * 1024, index_interval_bytes=1024)
    # Ten records per millisecond, from t=1000: offsets 0..9 at 1000, 10..19 at 1001, ...
    for k in range(3000):
        log.append("ex", "rk", PROPS, b"x" * 100, timestamp_ms=1000 + k // 10)
    log.sync_now()
    assert log.offset_at(0) == 0
    assert log.offset_at(1000) == 0
    for ts in (1001, 1057, 1150, 1299):
        assert log.offset_at(ts) == (ts - 1000) * 10
    assert log.offset_at(1300) == 3000 == log.next_offset
    # A clock that goes back does not make timestamps go back.
    log.append("ex", "rk", PROPS, b"late", timestamp_ms=5)
    log.sync_now()
    assert read_all(log.reader(3000))[0].timestamp_ms == 1299
    assert log.offset_at(1299) == 2990


# ---- retention ---------------------------------------------------------------------------------


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.seg"))


def test_retention_by_bytes_keeps_the_disk_within_max_bytes_plus_one_segment(tmp_path):
    segment, limit = 16 * 1024, 64 * 1024
    log = open_log(tmp_path, max_segment_bytes=segment, max_bytes=limit)
    worst = 0
    for _ in range(200):
        for _ in range(4):
            fill(log, 5, body_size=200)
            worst = max(worst, directory_bytes(log.directory))  # between rounds too
        log.sync_now()
        worst = max(worst, directory_bytes(log.directory))
    assert worst <= limit + segment
    assert log.first_offset > 0
    assert log.disk_bytes() <= limit + segment
    # What is left reads from the first offset kept to the end.
    records = read_all(log.reader(0))
    assert [r.offset for r in records] == list(range(log.first_offset, 4000))


def test_retention_by_age_drops_segments_whose_newest_record_is_too_old(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    for k in range(300):
        log.append("ex", "rk", PROPS, b"x" * 100, timestamp_ms=10_000 + k * 100)  # one record per 100 ms
    log.sync_now()
    segments = log.segments()
    assert len(segments) > 3
    now = 10_000 + 300 * 100
    result = log.enforce_retention(None, 10_000, now)  # keep the last 10 s
    assert result.dropped_segments
    kept = log.segments()
    assert kept[0].last_timestamp_ms >= now - 10_000
    assert all(s.last_timestamp_ms < now - 10_000 for s in segments if s.segment_id in result.dropped_segments)
    assert log.first_offset == kept[0].first_offset == result.first_offset
    # Never the tail, however old.
    log.enforce_retention(0, 0, now * 10)
    assert len(log.segments()) == 1
    assert log.next_offset == 300


def test_a_cursor_whose_segment_is_dropped_goes_on_from_the_first_record_kept(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 200)
    log.sync_now()
    gaps: list[tuple[int, int]] = []
    slow = log.reader(0, on_gap=lambda a, b: gaps.append((a, b)))
    assert [r.offset for r in slow.read(5)] == [0, 1, 2, 3, 4]
    first_path = segment_paths(log)[0]
    log.enforce_retention(log.disk_bytes() // 2, None)
    assert not first_path.exists()
    # Its file is let go at once (the disk space is freed), before the cursor reads again.
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _is_link(fd)]
    assert not any(str(first_path) in target for target in open_files)
    rest = read_all(slow)
    assert rest[0].offset == log.first_offset > 5
    assert [r.offset for r in rest] == list(range(log.first_offset, 200))
    assert gaps == [(5, log.first_offset)]
    assert slow.lost == log.first_offset - 5
    # A new cursor from an offset no longer kept reports the gap as it starts.
    late: list[tuple[int, int]] = []
    cursor = log.reader(0, on_gap=lambda a, b: late.append((a, b)))
    assert late == [(0, log.first_offset)] and cursor.next_offset == log.first_offset


def _is_link(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


# ---- recovery ------------------------------------------------------------------------------------


def test_a_torn_tail_is_cut_off_and_everything_before_it_kept(tmp_path):
    log = open_log(tmp_path)
    fill(log, 50)
    log.sync_now()
    tail_path = segment_paths(log)[-1]
    crash(log)
    whole = encode_record(50, 1, 0, b"", b"ex", b"rk", PROPS, b"y" * 100) + b"y" * 100
    with open(tail_path, "ab") as f:
        f.write(whole[: len(whole) // 2])  # the process died in the middle of a write
    size_before = tail_path.stat().st_size
    again = open_log(tmp_path)
    assert again.recovery.truncated_bytes == len(whole) // 2
    assert tail_path.stat().st_size == size_before - len(whole) // 2
    assert (again.first_offset, again.last_offset, again.next_offset) == (0, 49, 50)
    assert [r.offset for r in read_all(again.reader(0))] == list(range(50))
    assert again.damage == []
    assert list(again.directory.glob("*.dropped-at-*")), "the bytes cut off are kept for inspection"
    # The next record gets the offset the torn one would have had, and everything reads back.
    assert again.append("ex", "rk", PROPS, b"after") == 50
    again.sync_now()
    assert read_all(again.reader(50))[0].body == b"after"


def test_a_last_record_failing_its_crc_is_cut_off(tmp_path):
    log = open_log(tmp_path)
    fill(log, 10)
    log.sync_now()
    tail_path = segment_paths(log)[-1]
    crash(log)
    data = bytearray(tail_path.read_bytes())
    data[-3] ^= 0xFF  # in the body of record 9
    tail_path.write_bytes(bytes(data))
    again = open_log(tmp_path)
    assert again.next_offset == 9
    assert [r.offset for r in read_all(again.reader(0))] == list(range(9))


def test_a_zero_filled_tail_is_cut_off(tmp_path):
    log = open_log(tmp_path)
    fill(log, 10)
    log.sync_now()
    tail_path = segment_paths(log)[-1]
    crash(log)
    with open(tail_path, "ab") as f:
        f.write(b"\0" * 4096)  # the file grew but its data never reached the disk
    again = open_log(tmp_path)
    assert again.next_offset == 10 and again.recovery.truncated_bytes == 4096
    assert not list(again.directory.glob("*.dropped-at-*")), "nothing but zeros was cut"


def flip_byte_in_record(path: Path, record_index: int, delta: int) -> int:
    """Flip a byte ``delta`` bytes into the ``record_index``-th record of a segment; its position."""
    data = bytearray(path.read_bytes())
    positions = trusted_record_offsets(bytes(data), HEADER_SIZE)
    at = positions[record_index] + delta
    data[at] ^= 0x55
    path.write_bytes(bytes(data))
    return positions[record_index]


def test_a_corrupt_record_in_the_middle_is_reported_not_skipped(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    fill(log, 20)
    log.sync_now()
    path = segment_paths(log)[-1]
    crash(log)
    position = flip_byte_in_record(path, 7, 60)  # in record 7's message
    again = open_log(tmp_path, max_segment_bytes=1 << 20)
    assert [(d.position, d.first_missing) for d in again.damage] == [(position, 7)], "reported when opened"
    assert again.next_offset == 20, "nothing after it was lost"
    cursor = again.reader(0)
    assert [r.offset for r in cursor.read(100)] == list(range(7)), "the records before it come first"
    with pytest.raises(CorruptStreamRecord) as raised:
        cursor.read(100)
    assert raised.value.offset == 7 and raised.value.position == position
    assert [r.offset for r in read_all(cursor)] == list(range(8, 20)), "then it goes on after it"
    # A cursor starting after it never meets it.
    assert [r.offset for r in read_all(again.reader(8))] == list(range(8, 20))


def test_damage_in_a_sealed_segment_known_from_its_side_file_is_found_by_the_reader(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 100)
    log.close()
    first = segment_paths(log)[0]
    assert (log.directory / index_file_name(0)).is_file()
    flip_byte_in_record(first, 3, 40)
    again = open_log(tmp_path, max_segment_bytes=4096)
    assert again.recovery.scanned_bytes == 0 and again.damage == [], "side files: nothing was scanned"
    cursor = again.reader(0)
    assert [r.offset for r in cursor.read(100)] == [0, 1, 2]
    with pytest.raises(CorruptStreamRecord):
        cursor.read(100)
    assert [r.offset for r in read_all(cursor)] == list(range(4, 100))


def test_a_torn_tail_of_an_older_segment_is_cut_and_the_missing_offsets_reported(tmp_path):
    # A power cut can leave a sealed segment's last writes unsynced while the next segment's
    # first records reached the disk (none of them were confirmed: their round had not ended).
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 100)
    log.sync_now()
    first, second = segment_paths(log)[:2]
    crash(log)
    for side in log.directory.glob("*.sidx"):
        side.unlink()
    (second_id,) = [s.first_offset for s in log.segments() if s.first_offset > 0][:1]
    with open(first, "r+b") as f:
        f.truncate(first.stat().st_size - 50)  # the last record of the first segment torn
    again = open_log(tmp_path, max_segment_bytes=4096)
    assert [d.first_missing for d in again.damage] == [second_id - 1]
    assert again.next_offset == 100, "the records after it are kept; offsets are not reused"
    cursor = again.reader(0)
    assert [r.offset for r in cursor.read(1000)] == list(range(second_id - 1))
    with pytest.raises(CorruptStreamRecord) as raised:
        cursor.read(1000)
    assert raised.value.offset == second_id - 1
    assert [r.offset for r in read_all(cursor)] == list(range(second_id, 100))


def test_a_segment_file_removed_behind_the_streams_back_is_reported_and_stepped_over(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 100, start_ts=1000)
    log.sync_now()
    second = segment_paths(log)[1]
    second_id, third_id = [s.first_offset for s in log.segments()][1:3]
    second.unlink()
    cursor = log.reader(0)
    assert [r.offset for r in cursor.read(1000)] == list(range(second_id))
    with pytest.raises(CorruptStreamRecord, match="segment file missing"):
        cursor.read(1000)
    assert [r.offset for r in read_all(cursor)] == list(range(third_id, 100))
    assert log.offset_at(1000 + second_id) == third_id


def test_an_older_segment_with_an_unreadable_header_is_set_aside_and_reported(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 100)
    log.close()
    second = segment_paths(log)[1]
    second_id, third_id = [s.first_offset for s in log.segments()][1:3]
    data = bytearray(second.read_bytes())
    data[30] ^= 1  # in created_at_ms: the header CRC fails
    second.write_bytes(bytes(data))
    again = open_log(tmp_path, max_segment_bytes=4096)
    assert (again.directory / (second.name + ".corrupt")).is_file()
    assert [d.first_missing for d in again.damage][:1] == [second_id]
    cursor = again.reader(0)
    assert [r.offset for r in cursor.read(1000)] == list(range(second_id))
    with pytest.raises(CorruptStreamRecord, match=f"offsets {second_id}..{third_id - 1} missing"):
        cursor.read(1000)
    assert [r.offset for r in read_all(cursor)] == list(range(third_id, 100))


def test_a_segment_cut_short_while_being_created_is_removed(tmp_path):
    log = open_log(tmp_path)
    fill(log, 5)
    log.sync_now()
    crash(log)
    (log.directory / segment_file_name(5)).write_bytes(encode_header(5, 1)[:20])
    again = open_log(tmp_path)
    assert not (again.directory / segment_file_name(5)).exists()
    assert again.append("ex", "rk", PROPS, b"x") == 5


def test_a_segment_of_an_unknown_version_is_refused(tmp_path):
    log = open_log(tmp_path)
    fill(log, 5)
    log.close()
    path = segment_paths(log)[0]
    data = bytearray(path.read_bytes())
    data[8:10] = (2).to_bytes(2, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedStreamFormatVersion) as raised:
        open_log(tmp_path)
    assert isinstance(raised.value, UnsupportedFormatVersion)
    assert "stream file format version 2" in str(raised.value)


# ---- the side index and opening large streams ------------------------------------------------------


def test_the_side_index_gives_the_same_index_as_a_scan(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=32 * 1024, index_interval_bytes=2048)
    fill(log, 3000, start_ts=5000)
    log.close()
    with_side = open_log(tmp_path, max_segment_bytes=32 * 1024, index_interval_bytes=2048)
    assert with_side.recovery.scanned_bytes == 0
    facts = _facts(with_side)
    with_side.close()
    for side in with_side.directory.glob("*.sidx"):
        side.unlink()
    scanned = open_log(tmp_path, max_segment_bytes=32 * 1024, index_interval_bytes=2048)
    assert scanned.recovery.scanned_bytes == scanned.disk_bytes() - HEADER_SIZE * len(scanned.segments())
    assert _facts(scanned) == facts
    assert sorted(p.name for p in scanned.directory.glob("*.sidx"))[:-1], "written again for the sealed segments"


def _facts(log: StreamLog):
    return (
        log.segments(),
        [(s.segment_id, list(s.offsets), list(s.timestamps), list(s.positions), s.last_chunk) for s in log._segments],
        log.first_offset,
        log.next_offset,
        log.last_chunk_offset,
        [log.offset_at(t) for t in (0, 5000, 6234, 7999, 9000)],
    )


def test_after_a_crash_only_the_tail_past_its_last_checkpoint_is_scanned(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=1 << 20, checkpoint_bytes=64 * 1024)
    fill(log, 3000, body_size=100)  # about 450 KB: sealed segments none, tail checkpointed as it grows
    log.sync_now()
    fill(log, 300, body_size=100)
    log.sync_now()
    tail = log._tail
    checkpoint = tail.indexed_size
    assert 0 < checkpoint < tail.size
    crash(log)
    again = open_log(tmp_path, max_segment_bytes=1 << 20)
    assert again.recovery.scanned_bytes == tail.size - checkpoint
    assert [r.offset for r in read_all(again.reader(0))] == list(range(3300))


def test_a_damaged_side_file_is_ignored_and_rebuilt(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=4096)
    fill(log, 100)
    log.close()
    side = log.directory / index_file_name(0)
    data = bytearray(side.read_bytes())
    data[-10] ^= 1
    side.write_bytes(bytes(data))
    again = open_log(tmp_path, max_segment_bytes=4096)
    assert again.recovery.scanned_bytes > 0
    assert [r.offset for r in read_all(again.reader(0))] == list(range(100))
    assert stream_index.read_side_index(side, 0, HEADER_SIZE, segment_paths(again)[0].stat().st_size) is not None


# ---- filtering and memory ------------------------------------------------------------------------------


def test_a_filtered_read_skips_records_without_reading_their_messages(tmp_path, monkeypatch):
    log = open_log(tmp_path, max_segment_bytes=16 << 20)
    body = 1 << 20  # four times the cursor's read buffer
    for k in range(20):
        log.append("ex", "rk", PROPS, bytes([k]) * body, filter_value="red" if k % 5 == 0 else "blue")
    log.append("ex", "rk", PROPS, b"plain")
    log.sync_now()
    read_bytes = 0
    real = os.pread

    def counting(fd, n, pos):
        nonlocal read_bytes
        data = real(fd, n, pos)
        read_bytes += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting)
    records = read_all(log.reader(0, filter_values=["red"]))
    assert [r.offset for r in records] == [0, 5, 10, 15]
    assert all(r.filter_value == "red" and r.body == bytes([r.offset]) * body for r in records)
    assert read_bytes < 6 * body, f"read {read_bytes} bytes for 4 messages of {body}"
    assert [r.offset for r in read_all(log.reader(0, filter_values=["red"], match_unfiltered=True))] == [0, 5, 10, 15, 20]
    assert [r.offset for r in read_all(log.reader(0, filter_values=[]))] == []


def test_a_filtered_read_checks_the_head_it_decides_on(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    fill(log, 10, filter_of=lambda k: "a" if k % 2 else "b")
    log.close()
    path = segment_paths(log)[0]
    positions = trusted_record_offsets(path.read_bytes(), HEADER_SIZE)
    data = bytearray(path.read_bytes())
    data[positions[2] + 120] ^= 0x55  # record 2 ("b")'s body: a filter for "a" does not care
    data[positions[4] + 27] ^= 0x55  # record 4's filter value: it must not pass unnoticed
    path.write_bytes(bytes(data))
    again = open_log(tmp_path, max_segment_bytes=1 << 20)
    cursor = again.reader(0, filter_values=["a"])
    assert [r.offset for r in cursor.read()] == [1, 3]
    with pytest.raises(CorruptStreamRecord) as raised:
        cursor.read()
    assert raised.value.offset == 4 and "head CRC" in raised.value.reason
    assert [r.offset for r in read_all(cursor)] == [5, 7, 9]


def test_reading_200_mb_does_not_load_the_stream_into_memory(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=64 << 20)
    body = b"m" * (64 * 1024)
    for _ in range(3200):  # 200 MiB
        log.append("ex", "rk", PROPS, body)
        if log._buffer and len(log._buffer) > (4 << 20):
            log.sync_now()
    log.sync_now()
    assert log.disk_bytes() >= 200 << 20
    tracemalloc.start()
    try:
        cursor = log.reader(0)
        total = count = 0
        while True:
            records = cursor.read(32)
            if not records:
                break
            total += sum(len(r.body) for r in records)
            count += len(records)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 3200 and total == 3200 * len(body)
    assert peak < 8 << 20, f"peak {peak} bytes while reading 200 MiB"


# ---- the format is the documented one -----------------------------------------------------------------


def test_the_record_in_the_format_document_is_what_the_writer_writes():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "stream-files.md").read_text()
    example = doc.split("<!-- record example -->")[1].split("```")[1]
    expected = bytes.fromhex(" ".join(line[6:53] for line in example.strip().splitlines()))
    record = encode_record(7, 1700000000000, 0x03, b"eu", b"amq.direct", b"orders", b"\x10\x00\x02", b"hello")
    assert record + b"hello" == expected
    header_example = doc.split("<!-- header example -->")[1].split("```")[1]
    header = bytes.fromhex(" ".join(line[6:53] for line in header_example.strip().splitlines()))
    assert encode_header(7, 1700000000000) == header


def test_the_queue_segments_record_walk_reads_stream_segments(tmp_path):
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    fill(log, 30)
    log.close()
    data = segment_paths(log)[0].read_bytes()
    assert len(trusted_record_offsets(data, HEADER_SIZE)) == 30


def test_the_spark_columnar_decoder_reads_the_message_fields_of_stream_records(tmp_path):
    np = pytest.importorskip("numpy")
    pytest.importorskip("pyarrow")
    from spark.columnar import decode_columns
    from spark.segment_index import be_uint

    table = b"\x03keyS\x00\x00\x00\x01v"
    props = b"\xb0\x00\x0atext/plain" + len(table).to_bytes(4, "big") + table + b"\x02"
    log = open_log(tmp_path, max_segment_bytes=1 << 20)
    for k in range(5):
        log.append("amq.direct", f"rk{k}", props, f"body{k}".encode(), filter_value="f" * k if k else None)
    log.close()
    data = segment_paths(log)[0].read_bytes()
    d = np.frombuffer(data, np.uint8)
    starts = np.array(trusted_record_offsets(data, HEADER_SIZE), np.int64)
    ends = starts + 4 + be_uint(d, starts, 4)
    # The queue decoder expects the message fields 16 bytes into a payload: a stream record's
    # start there is its position + 15 + its filter value's length (docs/stream-files.md 3.2).
    columns = decode_columns(data, starts + 15 + d[starts + 26], ends, ("routing_key", "body", "headers", "delivery_mode"))
    assert columns["routing_key"].to_pylist() == [f"rk{k}" for k in range(5)]
    assert columns["body"].to_pylist() == [f"body{k}".encode() for k in range(5)]
    assert columns["headers"].to_pylist() == [[("key", "v")]] * 5
    assert columns["delivery_mode"].to_pylist() == [2] * 5


def test_streams_live_beside_queues_under_the_data_directory(tmp_path):
    path = stream_path(tmp_path, "/", "events")
    assert path == tmp_path / "streams" / "42099b4af021e53fd8fd4e056c2568d7c2e3ffa8" / path.name
    log = StreamLog.open_in(tmp_path, "/", "events")
    assert log.directory == path and (path / "stream.json").is_file() and (path.parent / "vhost.json").is_file()
    log.append("ex", "rk", PROPS, b"x")
    log.close()
    log.delete()
    assert not path.exists()
