"""Queue segment records round-trip exactly, and files from an unknown format version are refused."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from persistence.format_version import UnsupportedFormatVersion
from persistence.queue_store import QueueStore
from persistence.record_format import (
    MessageRecord,
    MessageState,
    Reason,
    StateRecord,
    UnknownRecord,
    decode_payload,
    encode_message,
    encode_state,
)
from persistence.segment_file import HEADER_SIZE, SegmentScan, decode_header, encode_header, list_segments
from persistence.segment_layout import QUEUE_META, list_queue_directories, queue_path, read_queue_meta

# basic properties as a client sends them: flags for content-type, delivery-mode, headers.
RAW_PROPERTIES = bytes.fromhex("9800") + b"\x10application/json" + struct.pack(">I", 0) + b"\x02"


def decode_whole(record: bytes):
    length, crc, rtype = struct.unpack_from(">IIB", record)
    assert length == len(record) - 4
    assert crc == zlib.crc32(record[8:])
    return decode_payload(rtype, record[9:])


def test_message_record_round_trips_every_field_exactly():
    body = bytes(range(256)) * 3
    head, tail = encode_message(7, 1_700_000_000_123, "amq.tópic", "a.b.ü", RAW_PROPERTIES, body)
    assert decode_whole(head + tail) == MessageRecord(7, 1_700_000_000_123, "amq.tópic", "a.b.ü", RAW_PROPERTIES, body)


def test_message_record_with_empty_names_properties_and_body():
    head, tail = encode_message(1, 0, "", "", b"\x00\x00", b"")
    assert decode_whole(head + tail) == MessageRecord(1, 0, "", "", b"\x00\x00", b"")


def test_names_longer_than_an_amqp_short_string_are_refused():
    with pytest.raises(ValueError):
        encode_message(1, 0, "x" * 256, "", b"\x00\x00", b"")


@pytest.mark.parametrize(
    "state, extra, expected",
    [
        (MessageState.DELIVERED, {"delivery_count": 3}, {"delivery_count": 3}),
        (MessageState.ACKED, {}, {}),
        (MessageState.DROPPED, {"reason": Reason.MAXLEN}, {"reason": Reason.MAXLEN}),
        (MessageState.DEAD_LETTERED, {"reason": Reason.EXPIRED}, {"reason": Reason.EXPIRED}),
        (MessageState.EXPIRED, {}, {}),
        (MessageState.REQUEUED, {"delivery_count": 9}, {"delivery_count": 9}),
        (
            MessageState.WAITING_RETRY,
            {"delivery_count": 2, "due_at_ms": 1_800_000_000_000},
            {"delivery_count": 2, "due_at_ms": 1_800_000_000_000},
        ),
        (MessageState.PURGED, {}, {}),
    ],
)
def test_state_records_round_trip(state, extra, expected):
    record = encode_state(state, 42, 1_700_000_000_999, **extra)
    assert decode_whole(record) == StateRecord(42, state, 1_700_000_000_999, **expected)


def test_state_record_with_fields_added_later_still_decodes():
    record = bytearray(encode_state(MessageState.REQUEUED, 5, 6, delivery_count=1))
    record += b"future field"
    struct.pack_into(">I", record, 0, len(record) - 4)
    struct.pack_into(">I", record, 4, zlib.crc32(record[8:]))
    assert decode_whole(bytes(record)) == StateRecord(5, MessageState.REQUEUED, 6, delivery_count=1)


def test_unknown_record_type_decodes_as_unknown():
    assert decode_payload(0x7F, b"abc") == UnknownRecord(0x7F, b"abc")


def test_segment_header_round_trips():
    header = decode_header("x", encode_header(123, 456))
    assert (header.version, header.header_length, header.segment_id, header.created_at_ms) == (1, HEADER_SIZE, 123, 456)


def _store(tmp_path: Path, **options) -> QueueStore:
    store = QueueStore.for_queue(tmp_path, "/", "orders", **options)
    store.recover()
    return store


def test_many_records_round_trip_through_files_and_a_restart(tmp_path):
    store = _store(tmp_path, segment_size=64 * 1024)
    originals = {}
    for seq in range(1, 3001):
        body = f"message {seq} ".encode() * (seq % 7)
        originals[seq] = MessageRecord(seq, 1_700_000_000_000 + seq, "ex", f"rk.{seq % 13}", RAW_PROPERTIES, body)
        store.append_message(*originals[seq])
    assert [store.read_message(seq) for seq in (1, 1500, 3000)] == [originals[1], originals[1500], originals[3000]]
    store.close()

    reopened = QueueStore.for_queue(tmp_path, "/", "orders")
    recovery = reopened.recover()
    assert list(recovery.seqs) == list(range(1, 3001))
    assert recovery.next_seq == 3001
    assert all(reopened.read_message(seq) == originals[seq] for seq in range(1, 3001))


def test_unknown_record_types_are_skipped_by_length(tmp_path):
    store = _store(tmp_path)
    store.append_message(1, 1, "", "q", b"\x00\x00", b"one")
    record = bytearray(struct.pack(">IIB", 0, 0, 0x7E) + b"a record type from the future")
    struct.pack_into(">I", record, 0, len(record) - 4)
    struct.pack_into(">I", record, 4, zlib.crc32(record[8:]))
    store._buffer += record  # as a newer writer would have put it
    store.append_message(2, 2, "", "q", b"\x00\x00", b"two")
    store.close()

    reopened = QueueStore.for_queue(tmp_path, "/", "orders")
    recovery = reopened.recover()
    assert list(recovery.seqs) == [1, 2] and recovery.problems == []
    assert reopened.read_message(2).body == b"two"


def _rewrite_header_version(path: Path, version: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(">H", data, 8, version)
    struct.pack_into(">I", data, 36, zlib.crc32(data[:36]))
    path.write_bytes(bytes(data))


def test_a_segment_of_an_unknown_format_version_is_refused_with_a_clear_error(tmp_path):
    store = _store(tmp_path)
    store.append_message(1, 1, "", "q", b"\x00\x00", b"body")
    store.close()
    [(_, segment)] = list_segments(store.directory)
    _rewrite_header_version(segment, 2)

    with pytest.raises(UnsupportedFormatVersion, match="version 2 is not supported"):
        QueueStore.for_queue(tmp_path, "/", "orders").recover()
    with pytest.raises(UnsupportedFormatVersion):
        SegmentScan(segment)
    assert segment.exists(), "a file from a newer broker is left alone"


def test_a_meta_file_of_an_unknown_format_version_is_refused(tmp_path):
    store = _store(tmp_path)
    store.append_message(1, 0, "", "orders", b"\x00\x00", b"x")  # the first record makes the directory
    store.close()
    meta = queue_path(tmp_path, "/", "orders") / QUEUE_META
    document = json.loads(meta.read_text())
    document["format_version"] = 99
    meta.write_text(json.dumps(document))
    with pytest.raises(UnsupportedFormatVersion):
        read_queue_meta(meta.parent)


def test_directory_names_are_safe_for_any_name_and_meta_files_give_the_names_back(tmp_path):
    names = [("/", "a/b"), ("vh/../x", "..\x00ü" + "z" * 250), ("", ".")]
    for vhost, queue in names:
        store = QueueStore.for_queue(tmp_path, vhost, queue)
        store.recover()
        store.append_message(1, 0, "", "rk", b"\x00\x00", b"x")  # the first record makes the directory
        store.close()
    found = {(d.vhost, d.queue) for d in list_queue_directories(tmp_path)}
    assert found == set(names)
    for directory in (tmp_path / "queues").iterdir():
        assert len(directory.name) == 40 and directory.name.isalnum()
