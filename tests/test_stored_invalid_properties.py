"""Messages stored before content headers were checked (written here straight into segment
files) stay readable: the Spark reader and the management API's get show the bad field as
invalid, the rest as usual, and never fail or hit RecursionError."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from amqp_server.management.queue_browse import browse
from persistence.properties_format import MAX_NESTING_DEPTH
from persistence.queue_store import QueueStore
from queues.journal import QueueJournal
from queues.queue import Queue
from queues.timers import Timers

FLAG_CONTENT_TYPE, FLAG_HEADERS, FLAG_DELIVERY_MODE = 1 << 15, 1 << 13, 1 << 12


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def field(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + value


def string(text: bytes) -> bytes:
    return b"S" + table(text)


# content_type, then headers: a good field, a nested table holding a 'Z' (its length is known, so
# the next field is still found), a good field, a top-level 'Z' (nothing after it can be found).
POISON = (
    struct.pack(">H", FLAG_CONTENT_TYPE | FLAG_HEADERS | FLAG_DELIVERY_MODE)
    + b"\x0atext/plain"
    + table(
        field(b"before", string(b"yes"))
        + field(b"nested", b"F" + table(field(b"bad", b"Z\x00\x00")))
        + field(b"after", string(b"still"))
        + field(b"poison", b"Z\x00\x00\x00\x01")
        + field(b"lost", string(b"x"))
    )
    + b"\x07"  # delivery_mode 7, which the broker now refuses
)


def deep(levels: int) -> bytes:
    inner = table(b"")
    for _ in range(levels - 1):
        inner = table(field(b"a", b"F" + inner))
    return struct.pack(">H", FLAG_HEADERS) + table(field(b"ok", string(b"fine")) + field(b"deep", b"F" + inner))


def write_queue(root: Path, records: list[bytes]) -> None:
    store = QueueStore.for_queue(root, "/", "q")
    store.recover()
    for seq, props in enumerate(records, start=1):
        store.append_message(seq, 1_700_000_000_000 + seq, "", "q", props, b"body %d" % seq)
    store.close()


def open_queue(root: Path) -> Queue:
    store = QueueStore.for_queue(root, "/", "q")
    queue = Queue("q", "/", durable=True, arguments={}, timers=Timers(), journal=QueueJournal(store, None))
    queue.recover()
    return queue


EXPECTED_POISON_HEADERS = {
    "before": "yes",
    "nested": "<invalid field: unknown field type 'Z'>",
    "after": "still",
    "poison": "<invalid field: unknown field type 'Z'>",
}
EXPECTED_DEEP_HEADERS = {"ok": "fine", "deep": f"<invalid field: nested deeper than {MAX_NESTING_DEPTH}>"}


@pytest.mark.parametrize("mode", ["peek", "ack_requeue_true"])
def test_the_management_get_shows_bad_fields_as_invalid_and_the_rest_as_usual(tmp_path, mode):
    write_queue(tmp_path, [POISON, deep(1000)])
    queue = open_queue(tmp_path)
    shown = browse(queue, 10, mode)
    assert [message["payload"] for message in shown] == ["body 1", "body 2"]
    poison, nested = (message["properties"] for message in shown)
    assert poison["content_type"] == "text/plain" and poison["delivery_mode"] == 7
    assert {name: _text(value) for name, value in poison["headers"].items()} == EXPECTED_POISON_HEADERS
    assert {name: _text(value) for name, value in nested["headers"].items()} == EXPECTED_DEEP_HEADERS
    assert queue.message_count == 2


def test_the_spark_reader_shows_bad_fields_as_invalid_and_reads_every_row(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("numpy")
    from spark.local_scan import read_table

    write_queue(tmp_path, [POISON, deep(1000), deep(MAX_NESTING_DEPTH - 1)])
    rows = read_table(tmp_path, ("seq", "content_type", "headers", "delivery_mode")).to_pylist()
    by_seq = {row["seq"]: row for row in rows}
    assert (by_seq[1]["content_type"], by_seq[1]["delivery_mode"]) == ("text/plain", 7)
    assert dict(by_seq[1]["headers"]) == EXPECTED_POISON_HEADERS
    assert dict(by_seq[2]["headers"]) == EXPECTED_DEEP_HEADERS
    within_limit = dict(by_seq[3]["headers"])
    assert within_limit["ok"] == "fine" and within_limit["deep"].startswith('{"a": {"a": ')


def _text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value
