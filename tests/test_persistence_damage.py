"""A crash mid-write or a flipped bit never loses what came before it, is always reported, and
never crashes recovery."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from persistence.queue_store import QueueStore
from persistence.segment_file import HEADER_SIZE, SegmentScan, list_segments

PROPS = b"\x10\x00\x02"  # delivery-mode 2


def body(seq: int) -> bytes:
    return f"body of message {seq}".encode()


def write_queue(root: Path, count: int, **options) -> QueueStore:
    store = QueueStore.for_queue(root, "/", "q", **options)
    store.recover()
    for seq in range(1, count + 1):
        store.append_message(seq, 1000 + seq, "ex", "rk", PROPS, body(seq))
    store.close()
    return store


def record_spans(path: Path) -> list[tuple[int, int]]:
    scan = SegmentScan(path)
    spans = [(r.offset, r.end) for r in scan.records()]
    scan.close()
    return spans


def recover(root: Path) -> tuple[QueueStore, object]:
    store = QueueStore.for_queue(root, "/", "q")
    return store, store.recover()


def intact(store: QueueStore, seqs) -> bool:
    return all(store.read_message(seq).body == body(seq) for seq in seqs)


def test_torn_last_record_is_cut_at_every_byte_offset_and_earlier_records_survive(tmp_path, caplog):
    original = tmp_path / "original"
    store = write_queue(original, 5)
    [(_, segment)] = list_segments(store.directory)
    start, end = record_spans(segment)[-1]
    data = segment.read_bytes()
    for cut in range(start + 1, end):
        root = tmp_path / f"cut{cut}"
        shutil.copytree(original, root)
        torn = root / segment.relative_to(original)
        torn.write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            reopened, recovery = recover(root)
        assert list(recovery.seqs) == [1, 2, 3, 4], cut
        assert torn.stat().st_size == start, cut
        assert "torn record" in caplog.text or "zero-filled" in caplog.text, cut
        assert intact(reopened, range(1, 5))
        reopened.append_message(5, 1, "ex", "rk", PROPS, body(5))  # the queue carries on after the cut
        reopened.close()
        assert list(recover(root)[1].seqs) == [1, 2, 3, 4, 5]
        shutil.rmtree(root)


def test_torn_state_record_at_the_tail_loses_only_that_state(tmp_path):
    store = QueueStore.for_queue(tmp_path, "/", "q")
    store.recover()
    for seq in (1, 2):
        store.append_message(seq, 1, "ex", "rk", PROPS, body(seq))
    store.append_state(1, "acked", 5)
    store.append_state(2, "acked", 5)
    store.close()
    [(_, segment)] = list_segments(store.directory)
    start, _ = record_spans(segment)[-1]
    with open(segment, "r+b") as f:
        f.truncate(start + 10)
    assert list(recover(tmp_path)[1].seqs) == [2]


@pytest.mark.parametrize("zeros", [1, 4, 9, 100, 8192])
def test_zero_filled_tail_is_cut_off_and_reported(tmp_path, caplog, zeros):
    store = write_queue(tmp_path, 3)
    [(_, segment)] = list_segments(store.directory)
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\0" * zeros)
    with caplog.at_level(logging.WARNING):
        reopened, recovery = recover(tmp_path)
    assert list(recovery.seqs) == [1, 2, 3]
    assert segment.stat().st_size == size
    assert "zero-filled tail" in caplog.text
    assert not list(segment.parent.glob("*.dropped-at-*")), "zeros are not worth keeping"


def test_record_whose_payload_pages_never_reached_the_disk_is_cut(tmp_path, caplog):
    store = write_queue(tmp_path, 3)
    [(_, segment)] = list_segments(store.directory)
    start, end = record_spans(segment)[-1]
    data = bytearray(segment.read_bytes())
    data[start + 8 : end] = bytes(end - start - 8)  # length survived, the rest is zeros
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        _, recovery = recover(tmp_path)
    assert list(recovery.seqs) == [1, 2]
    assert "CRC mismatch" in caplog.text


def flip_cases(tmp_path: Path):
    """A queue of three segments; yields (case root, flipped segment, record start, byte, bit)."""
    original = tmp_path / "original"
    store = write_queue(original, 30, segment_size=HEADER_SIZE + 10 * 60)
    segments = [path for _, path in list_segments(store.directory)]
    assert len(segments) == 3
    middle = segments[1]
    spans = record_spans(middle)
    start, end = spans[len(spans) // 2]
    return original, store.directory, middle, spans, start, end


def test_every_single_bit_flip_in_a_record_is_reported_and_never_accepted(tmp_path, caplog):
    original, directory, middle, spans, start, end = flip_cases(tmp_path)
    first_seq_in_middle = int(middle.name[:20])
    flipped_seq = first_seq_in_middle + len(spans) // 2
    data = middle.read_bytes()
    for byte in range(start, end):
        for bit in range(8):
            root = tmp_path / "case"
            shutil.copytree(original, root)
            damaged = bytearray(data)
            damaged[byte] ^= 1 << bit
            (root / middle.relative_to(original)).write_bytes(bytes(damaged))
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                store, recovery = recover(root)
            seqs = list(recovery.seqs)
            where = f"byte {byte - start} bit {bit}"
            assert flipped_seq not in seqs, where
            assert recovery.problems and caplog.records, where
            assert intact(store, seqs), where
            # Everything before the flipped record and every other segment is still there.
            assert all(seq in seqs for seq in range(1, flipped_seq)), where
            assert all(seq in seqs for seq in range(first_seq_in_middle + len(spans), 31)), where
            if byte - start >= 4:  # not the length field: only the flipped record is lost
                assert seqs == [seq for seq in range(1, 31) if seq != flipped_seq], where
            store.close()
            shutil.rmtree(root)


def test_flip_in_a_length_field_drops_the_rest_of_that_segment_and_keeps_a_copy(tmp_path, caplog):
    original, directory, middle, spans, start, end = flip_cases(tmp_path)
    damaged = bytearray(middle.read_bytes())
    damaged[start + 1] ^= 0x40  # the length now points far past the end of the file
    middle.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING):
        _, recovery = recover(original)
    first_seq_in_middle = int(middle.name[:20])
    lost = range(first_seq_in_middle + len(spans) // 2, first_seq_in_middle + len(spans))
    assert list(recovery.seqs) == [seq for seq in range(1, 31) if seq not in lost]
    assert middle.stat().st_size == start
    [copy] = middle.parent.glob(f"{middle.name}.dropped-at-{start}")
    assert copy.read_bytes() == bytes(damaged[start:])


def test_a_new_segment_torn_while_being_created_is_removed(tmp_path, caplog):
    store = write_queue(tmp_path, 3)
    half_made = store.directory / f"{10:020d}.seg"
    half_made.write_bytes(b"AMQPQ")
    with caplog.at_level(logging.WARNING):
        reopened, recovery = recover(tmp_path)
    assert list(recovery.seqs) == [1, 2, 3] and not half_made.exists()
    assert recovery.next_seq == 10, "sequence numbers never go back"
    reopened.append_message(10, 1, "ex", "rk", PROPS, body(10))


def test_a_sealed_segment_with_a_ruined_header_is_set_aside_and_the_rest_recovered(tmp_path, caplog):
    store = write_queue(tmp_path, 30, segment_size=HEADER_SIZE + 10 * 60)
    first, second, third = [path for _, path in list_segments(store.directory)]
    data = bytearray(second.read_bytes())
    data[20] ^= 0xFF
    second.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        reopened, recovery = recover(tmp_path)
    lost = set(range(int(second.name[:20]), int(third.name[:20])))
    assert list(recovery.seqs) == [seq for seq in range(1, 31) if seq not in lost]
    assert second.with_name(second.name + ".corrupt").exists()
    assert "header CRC mismatch" in caplog.text
