"""The vectorised reader (spark.segment_index, spark.columnar) gives exactly what the one-record-at-a-time
reference gives: the same records of damaged segments, the same state records, and the same column
values for every kind of message, from what clients send to what no broker should have stored."""

from __future__ import annotations

import datetime
import decimal
import struct
import zlib
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

from pamqp import commands  # noqa: E402

from persistence.record_format import (  # noqa: E402
    MessageState,
    Reason,
    RecordType,
    encode_message,
    encode_state,
    min_state_payload,
    state_fields,
)
from persistence.segment_file import HEADER_SIZE, encode_header, trusted_record_offsets  # noqa: E402
from persistence.segment_reader import SnapshotScan  # noqa: E402
from spark import columnar  # noqa: E402
from spark.message_states import EventCollector  # noqa: E402
from spark.schema import MESSAGE_COLUMNS  # noqa: E402
from spark.segment_index import index_segment, record_spans  # noqa: E402
from spark.synthetic_queue import raw_properties  # noqa: E402

DECODED = tuple(c for c in MESSAGE_COLUMNS if c in columnar.DECODED)


def message(seq: int, props: bytes = b"", body: bytes = b"body", exchange: str = "ex", key: str = "rk") -> bytes:
    prefix, body = encode_message(seq, 1_700_000_000_000 + seq, exchange, key, props, body)
    return prefix + body


def raw_record(rtype: int, payload: bytes) -> bytes:
    """A CRC-valid record with any payload at all (including ones the broker never writes)."""
    body = bytes([rtype]) + payload
    return struct.pack(">II", 4 + len(body), zlib.crc32(body)) + body


def raw_message(seq: int, fields: bytes) -> bytes:
    return raw_record(RecordType.MESSAGE, struct.pack(">QQ", seq, 1_700_000_000_000 + seq) + fields)


def props(flags: int, *parts: bytes) -> bytes:
    return struct.pack(">H", flags) + b"".join(parts)


def shortstr(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def entry(name: bytes, letter: bytes, value: bytes) -> bytes:
    return shortstr(name) + letter + value


def segment(*records: bytes) -> bytes:
    return encode_header(1, 1_700_000_000_000) + b"".join(records)


def both(data: bytes, columns=DECODED):
    index = index_segment(data, HEADER_SIZE)
    fast = columnar.decode_columns(data, index.starts, index.ends, columns)
    exact = columnar.decode_rows_python(data, index.starts, index.ends, list(columns))
    return {c: fast[c].to_pylist() for c in columns}, {c: exact[c].to_pylist() for c in columns}


HEADERS = 0x2000
NESTED = b"F" + table(entry(b"k", b"S", struct.pack(">I", 1) + b"v"))


def deep_table(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"F" + table(entry(b"d", value[:1], value[1:]))
    return value


ODD_MESSAGES = [
    # what clients send
    message(1, raw_properties(commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip", delivery_mode=2, priority=5,
        correlation_id="c-1", reply_to="replies", expiration="60000", message_id="m-1",
        timestamp=datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc), message_type="order",
        user_id="guest", app_id="shop",
        headers={"tenant": "acme", "n": 7, "neg": -7, "big": 2**40, "yes": True, "no": False, "none": None,
                 "utf": "grüße"}))),
    message(2, raw_properties(commands.Basic.Properties(headers={}))),  # an empty headers table
    message(3, b""),  # no properties at all
    message(4, props(0x0000)),
    message(5, props(0x0002)),  # only the reserved bit: no properties
    message(6, raw_properties(commands.Basic.Properties(content_type="text/plain")), body=b""),
    # every integer type, at its extremes
    message(7, props(HEADERS, table(
        entry(b"b", b"b", struct.pack(">b", -128)), entry(b"B", b"B", struct.pack(">B", 255)),
        entry(b"s", b"s", struct.pack(">h", -32768)), entry(b"u", b"u", struct.pack(">H", 65535)),
        entry(b"I", b"I", struct.pack(">i", -2**31)), entry(b"i", b"i", struct.pack(">I", 2**32 - 1)),
        entry(b"l", b"l", struct.pack(">q", -2**63)), entry(b"L", b"L", struct.pack(">Q", 2**64 - 1)),
        entry(b"x", b"x", struct.pack(">I", 3) + b"\x00\x01\x02"), entry(b"t", b"t", b"\x02"),
        entry(b"V", b"V", b"")))),
    # types only the reference decoder reads: floats, decimals, timestamps, tables, arrays
    message(8, props(HEADERS, table(
        entry(b"f", b"f", struct.pack(">f", 1.5)), entry(b"d", b"d", struct.pack(">d", 0.1)),
        entry(b"D", b"D", b"\x02" + struct.pack(">i", 1250)), entry(b"T", b"T", struct.pack(">Q", 1714564800)),
        entry(b"F", NESTED[:1], NESTED[1:]), entry(b"A", b"A", table(b"S" + struct.pack(">I", 1) + b"a", b"I\x00\x00\x00\x01"))))),
    message(9, raw_properties(commands.Basic.Properties(headers={"x-death": [
        {"count": 1, "reason": "rejected", "queue": "q", "time": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
         "exchange": "", "routing-keys": ["q"]}]}))),
    # what a broker that did not check content headers may have stored
    message(10, props(HEADERS, table(entry(b"ok", b"S", struct.pack(">I", 1) + b"v"), entry(b"bad", b"Z", b"xyz"),
                                     entry(b"lost", b"S", struct.pack(">I", 1) + b"w")))),
    message(11, props(HEADERS, table(entry(b"long", b"S", struct.pack(">I", 99) + b"short")))),
    message(12, props(HEADERS, table(entry(b"deep", deep_table(70)[:1], deep_table(70)[1:])))),
    message(13, props(HEADERS, table(entry(b"cut", b"I", b"\x00\x01")))),
    message(14, props(HEADERS, table(shortstr(b"no-type")))),
    message(15, props(HEADERS, table(entry(b"k\xff", b"S", struct.pack(">I", 1) + b"v")))),  # invalid UTF-8 name
    message(16, props(HEADERS, table(entry(b"k", b"S", struct.pack(">I", 2) + b"\xc3\x28")))),  # invalid UTF-8 value
    message(17, props(0x8000, shortstr(b"\xff\xfe"))),  # invalid UTF-8 content type
    message(18, props(HEADERS, table(entry(b"k", b"S", struct.pack(">I", 1) + b"1"),
                                     entry(b"k", b"S", struct.pack(">I", 1) + b"2")))),  # a repeated name
    message(19, props(0x8000 | 0x0001, b"\x00\x00", shortstr(b"text/plain"))),  # a continuation flag word
    message(20, props(0x8000, b"\x20abc")),  # content type cut short
    message(21, props(HEADERS, struct.pack(">I", 500) + b"ab")),  # headers longer than the properties
    message(22, props(0x1000)),  # delivery mode missing
    message(23, props(0x0040, b"\x00\x00")),  # timestamp cut short
    message(24, props(HEADERS, table(*(entry(b"h%d" % i, b"t", b"\x01") for i in range(columnar.MAX_HEADER_ENTRIES + 5))))),
    raw_message(25, b"\x05ex"),  # the exchange runs past the record
    raw_message(26, shortstr(b"\xffex") + shortstr(b"rk") + struct.pack(">I", 0) + struct.pack(">I", 0)),  # invalid exchange
    raw_message(27, shortstr(b"ex") + shortstr(b"rk") + struct.pack(">I", 0) + struct.pack(">I", 10) + b"abc"),
    raw_message(28, shortstr(b"ex") + shortstr(b"rk") + struct.pack(">I", 0) + struct.pack(">I", 1) + b"ab"),  # later fields
    raw_message(29, b""),
    message(30, raw_properties(commands.Basic.Properties(content_type="text/plain", headers={"a": "b"}))),
    message(31, props(0x0004, shortstr(b"cluster"))),  # cluster_id, deprecated
]


def test_fast_decoder_agrees_with_the_reference_on_every_kind_of_message():
    data = segment(*ODD_MESSAGES)
    fast, exact = both(data)
    assert len(fast["body"]) == len(ODD_MESSAGES)
    for name in DECODED:
        assert fast[name] == exact[name], name


def test_rows_keep_their_values_and_invalid_fields_read_as_before():
    data = segment(*ODD_MESSAGES)
    fast, _ = both(data)
    headers = [dict(h) if h is not None else None for h in fast["headers"]]
    assert headers[0] == {"tenant": "acme", "n": "7", "neg": "-7", "big": "1099511627776", "yes": "true",
                          "no": "false", "none": None, "utf": "grüße"}
    assert headers[1] == {} and headers[2] is None
    assert headers[6] == {"b": "-128", "B": "255", "s": "-32768", "u": "65535", "I": str(-2**31), "i": str(2**32 - 1),
                          "l": str(-2**63), "L": str(2**64 - 1), "x": "\x00\x01\x02", "t": "true", "V": None}
    assert headers[7]["D"] == str(decimal.Decimal("12.50")) and headers[7]["T"] == "2024-05-01T12:00:00Z"
    assert headers[9] == {"ok": "v", "bad": "<invalid field: unknown field type 'Z'>"}
    assert headers[11]["deep"] == "<invalid field: nested deeper than 64>"
    assert headers[17] == {"k": "2"}
    assert len(headers[23]) == columnar.MAX_HEADER_ENTRIES + 5
    assert fast["content_type"][16] == "\ufffd\ufffd"
    assert fast["content_type"][18] == "text/plain"
    assert fast["content_type"][19] is None and fast["delivery_mode"][21] is None  # properties cut short
    assert [fast["exchange"][i] for i in (24, 25, 26, 27, 28)] == [None, None, None, "ex", None]
    assert fast["body"][27] == b"a" and fast["body_size"][27] == 1


def test_well_formed_messages_never_reach_the_reference_decoder(monkeypatch):
    calls = []
    reference = columnar.decode_rows_python
    monkeypatch.setattr(columnar, "decode_rows_python", lambda data, starts, *a: calls.append(len(starts)) or reference(data, starts, *a))
    data = segment(*ODD_MESSAGES[:7], *ODD_MESSAGES[-2:])
    fast, exact = both(data)
    assert fast == exact
    assert calls == [len(ODD_MESSAGES[:7]) + 2]  # the one call is both()'s own reference run


def test_the_fast_decoder_of_one_column_does_not_depend_on_the_others():
    data = segment(*ODD_MESSAGES)
    everything, _ = both(data)
    for name in DECODED:
        alone, exact = both(data, (name,))
        assert alone[name] == everything[name] == exact[name], name


def _reference_walk(data: bytes):
    """(records, damage met) by recovery's walk over these bytes."""
    scan = SnapshotScan(Path("/nonexistent"), data)
    records = list(scan.records())
    return records, [*scan.skipped, *([scan.damage] if scan.damage else [])]


def _states():
    return [encode_state(MessageState.DELIVERED, 1, 5, delivery_count=3), encode_state(MessageState.ACKED, 1, 6),
            encode_state(MessageState.DEAD_LETTERED, 2, 7, reason=Reason.MAXLEN),
            encode_state(MessageState.WAITING_RETRY, 2, 8, delivery_count=2, due_at_ms=99),
            encode_state(MessageState.REQUEUED, 3, 9, delivery_count=4), encode_state(MessageState.PURGED, 3, 10),
            encode_state(MessageState.EXPIRED, 2, 11), raw_record(RecordType.DROPPED, struct.pack(">QQB", 2, 12, 200)),
            raw_record(RecordType.ACKED, struct.pack(">Q", 2)),  # too short: ignored
            raw_record(0x7F, b"a record type added later")]


@pytest.mark.parametrize("damage", ["none", "bit flip", "length flip", "torn tail", "zero tail", "last crc",
                                    "out of order"])
def test_the_record_walk_finds_the_records_recovery_finds(damage):
    records = [message(1), *_states()[:3], message(2), message(3), *_states()[3:], message(4)]
    if damage == "out of order":
        records.insert(5, message(2))
    data = bytearray(segment(*records))
    third = HEADER_SIZE + sum(len(r) for r in records[:2])
    if damage == "bit flip":
        data[third + 12] ^= 0x40
    elif damage == "length flip":
        data[third + 3] ^= 0x01
    elif damage == "torn tail":
        data = data[:-3]
    elif damage == "zero tail":
        data += bytes(100)
    elif damage == "last crc":
        data[-1] ^= 0xFF
    data = bytes(data)
    reference, reference_damage = _reference_walk(data)
    starts, ends = record_spans(data, HEADER_SIZE)
    assert list(zip(starts.tolist(), ends.tolist())) == [(r.offset, r.end) for r in reference]
    found: list = []
    assert trusted_record_offsets(data, HEADER_SIZE, found) == starts.tolist()
    assert found == reference_damage  # what the streaming source reports (spark.segment_index.walk_range)
    assert bool(found) == (damage not in ("none", "out of order"))

    collector = EventCollector()
    message_starts, seen = [], 0
    for _, rtype, payload, end in reference:
        if rtype == RecordType.MESSAGE:
            seq = int.from_bytes(data[payload : payload + 8])
            if seq > seen:
                message_starts.append(payload)
                seen = seq
        elif rtype in (RecordType.DELIVERED, RecordType.ACKED, RecordType.DROPPED, RecordType.DEAD_LETTERED,
                       RecordType.EXPIRED, RecordType.REQUEUED, RecordType.WAITING_RETRY, RecordType.PURGED):
            if end - payload >= min_state_payload(rtype):
                collector.add(rtype, state_fields(rtype, data, payload))
    index = index_segment(data, HEADER_SIZE)
    assert index.starts.tolist() == message_starts
    expected = collector.events()
    for got, want in zip(index.events, expected):
        assert got.tolist() == want.tolist()
        assert got.dtype == want.dtype
