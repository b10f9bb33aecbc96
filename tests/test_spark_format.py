"""The amqp-queue reader without Spark: rows, states, snapshots of live files, archives, damage,
column pruning, row filters and Parquet side files, on files written by the broker's QueueStore."""

from __future__ import annotations

import datetime
import os
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")
pq = pytest.importorskip("pyarrow.parquet")

from pamqp import commands  # noqa: E402

from persistence.format_version import UnsupportedFormatVersion  # noqa: E402
from persistence.store_recovery import replay_segments  # noqa: E402
from persistence.queue_store import QueueStore  # noqa: E402
from persistence.segment_file import HEADER_SIZE, list_segments  # noqa: E402
from persistence.segment_layout import queue_path  # noqa: E402
from spark import basic_properties, columnar, side_files  # noqa: E402
from spark.local_scan import plan_parts, read_batches, read_table  # noqa: E402
from spark.partition_reader import ScanRequest, part_overlaps  # noqa: E402
from spark.schema import COLUMN_NAMES, arrow_schema  # noqa: E402
from spark.synthetic_queue import raw_properties, write_synthetic_queue  # noqa: E402

PROPS = raw_properties(commands.Basic.Properties(content_type="text/plain", delivery_mode=2))
SMALL = HEADER_SIZE + 10 * 66  # about ten small messages a segment


def open_store(root: Path, queue: str = "q", **options) -> QueueStore:
    store = QueueStore.for_queue(root, "vh", queue, **options)
    store.recover()
    return store


def publish(store: QueueStore, seqs, props: bytes = PROPS) -> None:
    for seq in seqs:
        store.append_message(seq, 1_000_000 + seq, "ex", f"rk.{seq % 3}", props, f"body {seq}".encode())


def rows(data_dir: Path, columns=("seq", "state", "state_event", "delivery_count", "redelivered"), **kw) -> dict:
    table = read_table(data_dir, columns, **kw)
    return {row["seq"]: row for row in table.to_pylist()}


def test_every_message_is_a_row_with_its_fields_and_the_batches_match_sparks_arrow_schema(tmp_path):
    store = open_store(tmp_path)
    props = raw_properties(commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip", headers={"tenant": "acme", "n": 7},
        delivery_mode=2, priority=5, correlation_id="c-1", reply_to="replies", expiration="60000",
        message_id="m-1", timestamp=datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc),
        message_type="order", user_id="guest", app_id="shop"))
    store.append_message(1, 1_714_564_800_123, "amq.topic", "order.created", props, b"\x00\xffbinary")
    store.close()

    batches = list(read_batches(plan_parts(tmp_path), ScanRequest(COLUMN_NAMES)))
    assert batches[0].schema == arrow_schema()
    [row] = pa.Table.from_batches(batches).to_pylist()
    utc = datetime.timezone.utc
    assert row["vhost"] == "vh" and row["queue"] == "q" and row["seq"] == 1
    assert row["segment"] == "00000000000000000001.seg"
    assert row["published_at"] == datetime.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=utc)
    assert (row["exchange"], row["routing_key"]) == ("amq.topic", "order.created")
    assert (row["content_type"], row["content_encoding"]) == ("application/json", "gzip")
    assert dict(row["headers"]) == {"tenant": "acme", "n": "7"}
    assert (row["delivery_mode"], row["priority"]) == (2, 5)
    assert (row["correlation_id"], row["reply_to"], row["expiration"]) == ("c-1", "replies", "60000")
    assert row["message_id"] == "m-1" and row["timestamp"] == datetime.datetime(2024, 5, 1, 12, 0, tzinfo=utc)
    assert (row["type"], row["user_id"], row["app_id"], row["cluster_id"]) == ("order", "guest", "shop", None)
    assert row["body"] == b"\x00\xffbinary" and row["body_size"] == 8
    assert (row["state"], row["state_event"], row["delivery_count"], row["redelivered"]) == ("ready", "published", 0, False)
    assert row["state_at"] == row["published_at"] and row["archived"] is False


def test_header_values_of_every_field_type_become_text():
    table = {
        "s": "text", "i": 42, "neg": -7, "big": 2**40, "t": True, "f": False, "d": 1.5,
        "dec": __import__("decimal").Decimal("12.50"),
        "ts": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc),
        "nested": {"a": 1, "b": "x"}, "list": [1, "two", {"k": "v"}], "void": None,
    }
    raw = raw_properties(commands.Basic.Properties(headers=table))
    headers = basic_properties.decode(raw)[basic_properties.PROPERTY_NAMES.index("headers")]
    assert headers == {
        "s": "text", "i": "42", "neg": "-7", "big": "1099511627776", "t": "true", "f": "false", "d": "1.5",
        "dec": "12.50", "ts": "2024-05-01T12:00:00Z", "nested": '{"a": 1, "b": "x"}',
        "list": '[1, "two", {"k": "v"}]', "void": None,
    }


def test_states_follow_the_last_record_and_settled_messages_stay_settled(tmp_path):
    store = open_store(tmp_path)
    publish(store, range(1, 11))
    store.append_state(1, "delivered", 2_000_001, delivery_count=1)
    store.append_state(1, "acked", 2_000_002)
    store.append_state(2, "delivered", 2_000_003, delivery_count=1)
    store.append_state(3, "delivered", 2_000_004, delivery_count=1)
    store.append_state(3, "requeued", 2_000_005, delivery_count=1)
    store.append_state(4, "delivered", 2_000_006, delivery_count=1)
    store.append_state(4, "dead_lettered", 2_000_007, reason="rejected")
    store.append_state(5, "dropped", 2_000_008, reason="maxlen")
    store.append_state(6, "expired", 2_000_009)
    store.append_state(7, "waiting_retry", 2_000_010, delivery_count=2, due_at_ms=3_000_000)
    store.append_state(8, "dropped", 2_000_011, reason="expired")
    store.close()

    got = rows(tmp_path, ("seq", "state", "state_event", "reason", "delivery_count", "redelivered", "state_at",
                          "due_at"))
    summary = {seq: (r["state"], r["state_event"], r["reason"], r["delivery_count"], r["redelivered"])
               for seq, r in got.items()}
    assert summary == {
        1: ("acked", "acked", None, 1, True),
        2: ("unacked", "delivered", None, 1, True),
        3: ("ready", "requeued", None, 1, True),
        4: ("dead_lettered", "dead_lettered", "rejected", 1, True),
        5: ("dead_lettered", "dropped", "maxlen", 0, False),
        6: ("expired", "expired", None, 0, False),
        7: ("waiting_retry", "waiting_retry", None, 2, False),
        8: ("expired", "dropped", "expired", 0, False),
        9: ("ready", "published", None, 0, False),
        10: ("ready", "published", None, 0, False),
    }
    ms = datetime.timedelta(milliseconds=1)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    assert got[1]["state_at"] == epoch + 2_000_002 * ms
    assert got[9]["state_at"] == epoch + 1_000_009 * ms  # never touched: its publish time
    assert got[7]["due_at"] == epoch + 3_000_000 * ms and got[6]["due_at"] is None


def test_purge_settles_only_ready_and_waiting_messages_up_to_its_bound(tmp_path):
    store = open_store(tmp_path)
    publish(store, range(1, 6))
    store.append_state(1, "delivered", 2_000_000, delivery_count=1)
    store.append_state(2, "waiting_retry", 2_000_000, delivery_count=1, due_at_ms=9_000_000)
    store.purge(at_ms=2_500_000)
    publish(store, range(6, 8))  # after the purge: untouched
    store.append_state(1, "acked", 2_600_000)
    store.close()

    got = rows(tmp_path)
    assert {seq: r["state"] for seq, r in got.items()} == {
        1: "acked", 2: "purged", 3: "purged", 4: "purged", 5: "purged", 6: "ready", 7: "ready"}


def test_states_written_in_later_segments_and_unsettled_set_agree_with_broker_recovery(tmp_path):
    expected = write_synthetic_queue(tmp_path, "orders", 3000, segment_size=64 * 1024)
    segments = list_segments(queue_path(tmp_path, "/", "orders"))
    assert len(segments) > 5  # so many messages are settled by records in later segments
    got = rows(tmp_path)
    assert Counter(r["state"] for r in got.values()) == expected

    copy = tmp_path / "copy"
    shutil.copytree(segments[0][1].parent, copy)
    recovery = replay_segments(copy).recovery
    open_messages = {seq: r for seq, r in got.items() if r["state"] in ("ready", "unacked", "waiting_retry")}
    assert sorted(open_messages) == list(recovery.seqs)
    assert [open_messages[m.seq]["delivery_count"] for m in recovery] == [m.delivery_count for m in recovery]
    assert [open_messages[m.seq]["redelivered"] for m in recovery] == [m.redelivered for m in recovery]


def test_a_live_directory_is_read_as_planned_even_while_the_broker_appends(tmp_path):
    store = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 25))
    store.append_state(3, "acked", 2_000_000)
    store.flush()
    parts = plan_parts(tmp_path)
    request = ScanRequest(("seq", "state"))
    before = pa.Table.from_batches(list(read_batches(parts, request))).to_pylist()

    store.append_state(4, "acked", 2_000_001)  # after planning: not part of this snapshot
    publish(store, range(25, 40))
    store.flush()
    tail = list_segments(store.directory)[-1][1]
    with open(tail, "ab") as f:
        f.write(struct.pack(">I", 500) + b"\x01" * 20)  # a record still being written
    again = pa.Table.from_batches(list(read_batches(parts, request))).to_pylist()  # e.g. a task retry

    assert again == before
    assert [r["seq"] for r in before] == list(range(1, 25))
    assert {r["seq"] for r in before if r["state"] == "acked"} == {3}
    now = rows(tmp_path)
    assert max(now) == 39 and now[4]["state"] == "acked"  # a new plan sees the new records, not the torn one


def test_archived_segments_are_read_with_the_live_ones_once_each(tmp_path):
    store = open_store(tmp_path, segment_size=SMALL, archive=True)
    publish(store, range(1, 31))
    for seq in range(1, 15):
        store.append_state(seq, "acked", 2_000_000 + seq)
    store.flush()
    archive_dir = store.archive_directory
    assert list_segments(archive_dir)  # settled segments went to the archive
    parts = plan_parts(tmp_path)
    # The broker archives another segment between planning and reading: still read, once.
    live = list_segments(store.directory)
    os.rename(live[0][1], archive_dir / live[0][1].name)
    table = pa.Table.from_batches(list(read_batches(parts, ScanRequest(("seq", "state", "archived")))))
    got = table.to_pylist()
    assert [r["seq"] for r in got] == list(range(1, 31))
    assert {r["seq"] for r in got if r["state"] == "acked"} == set(range(1, 15))
    assert any(r["archived"] for r in got) and not all(r["archived"] for r in got)
    store.close()

    store = open_store(tmp_path, segment_size=SMALL, archive=True)
    store.delete()  # a deleted queue's remaining segments move to the archive too
    assert sorted(rows(tmp_path)) == list(range(1, 31))


def test_a_damaged_record_costs_that_record_only(tmp_path):
    store = open_store(tmp_path)
    publish(store, range(1, 6))
    store.close()
    path = list_segments(store.directory)[0][1]
    data = bytearray(path.read_bytes())
    record = 4 + struct.unpack_from(">I", data, HEADER_SIZE)[0]
    data[HEADER_SIZE + 2 * record + 30] ^= 0x01  # a bit flip inside the third message
    path.write_bytes(bytes(data))
    assert sorted(rows(tmp_path)) == [1, 2, 4, 5]


def test_a_segment_of_an_unknown_format_version_is_refused(tmp_path):
    store = open_store(tmp_path)
    publish(store, [1])
    store.close()
    path = list_segments(store.directory)[0][1]
    data = bytearray(path.read_bytes())
    data[8:10] = (2).to_bytes(2, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedFormatVersion):
        read_table(tmp_path, ("seq",))


def test_only_requested_columns_are_built_and_properties_not_decoded_without_a_property_column(tmp_path, monkeypatch):
    store = open_store(tmp_path)
    publish(store, range(1, 4))
    store.close()

    def refuse(*args):
        raise AssertionError("properties decoded although no property column was asked for")

    monkeypatch.setattr(basic_properties, "decode", refuse)  # the reference (per-message) decoder
    monkeypatch.setattr(columnar._Batch, "_properties", refuse)  # the vectorised one
    table = read_table(tmp_path, ("queue", "routing_key", "body_size", "state"))
    assert table.column_names == ["queue", "routing_key", "body_size", "state"]
    assert table.column("body_size").to_pylist() == [6, 6, 6]
    with pytest.raises(AssertionError, match="properties decoded"):  # the patches are where decoding happens
        read_table(tmp_path, ("queue", "content_type"))


def test_row_filters_on_seq_publish_time_state_and_queue(tmp_path):
    store = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 31))
    for seq in range(1, 31, 2):
        store.append_state(seq, "acked", 2_000_000)
    store.close()
    other = open_store(tmp_path, queue="other-q")
    publish(other, [1])
    other.close()

    assert sorted(rows(tmp_path, queue="q", seq_min=12, seq_max=15)) == [12, 13, 14, 15]
    assert sorted(rows(tmp_path, queue="q", published_min_us=1_000_028_000)) == [28, 29, 30]
    assert sorted(rows(tmp_path, queue="q", states=frozenset({"ready"}), seq_max=6)) == [2, 4, 6]
    assert list(read_table(tmp_path, ("queue",), queue="oth*").column("queue").to_pylist()) == ["other-q"]
    # seq bounds prune whole segments at planning
    parts = plan_parts(tmp_path, queue="q")
    assert sum(part_overlaps(p, ScanRequest(("seq",), seq_min=12, seq_max=13)) for p in parts) == 1


def test_parquet_side_files_give_the_same_rows_and_are_ignored_when_stale(tmp_path):
    write_synthetic_queue(tmp_path, "orders", 2000, segment_size=64 * 1024)
    without = read_table(tmp_path, side_files=False)
    written, removed = side_files.convert_data_dir(tmp_path)
    assert written >= 3 and removed == 0
    assert read_table(tmp_path).equals(without)

    # A side file that no longer matches its segment (e.g. it grew) is not used.
    parts = plan_parts(tmp_path)
    messages_path, _ = side_files.side_paths(parts[0].segment.path)
    table = pq.read_table(messages_path)
    meta = dict(table.schema.metadata)
    meta[b"amqp_queue.segment_size"] = b"1"
    pq.write_table(table.replace_schema_metadata(meta), messages_path)
    assert read_table(tmp_path).equals(without)

    # Orphans (their segment deleted) are removed.
    os.unlink(parts[0].segment.path)
    _, removed = side_files.convert_data_dir(tmp_path)
    assert removed == 2


def test_side_file_writer_hook_converts_a_sealed_segment_in_its_thread(tmp_path):
    store = open_store(tmp_path, segment_size=SMALL)
    publish(store, range(1, 25))
    store.flush()
    sealed = list_segments(store.directory)[0][1]
    writer = side_files.SideFileWriter()
    try:
        written = writer.segment_sealed(sealed, "vh", "q").result(timeout=30)
    finally:
        writer.close()
    assert written is not None and written.is_file()
    assert pq.read_table(written, columns=["seq"]).column("seq").to_pylist() == list(range(1, 11))
    store.close()


def test_pushdown_filters_are_taken_only_when_applied_exactly():
    datasource = pytest.importorskip("pyspark.sql.datasource")
    from spark.pushdown import translate

    utc = datetime.timezone.utc
    filters = [
        datasource.EqualTo(("queue",), "orders"),
        datasource.GreaterThan(("seq",), 10),
        datasource.LessThanOrEqual(("seq",), 20),
        datasource.In(("state",), ("ready", "acked")),
        datasource.GreaterThanOrEqual(("published_at",), datetime.datetime(2024, 1, 1, tzinfo=utc)),
        datasource.EqualTo(("routing_key",), "x"),  # not ours: Spark keeps it
        datasource.StringContains(("queue",), "ord"),
    ]
    pushed, rest = translate(filters)
    assert rest == [filters[5], filters[6]]
    assert pushed.queues == {"orders"} and (pushed.seq_min, pushed.seq_max) == (11, 20)
    assert pushed.states == {"ready", "acked"} and pushed.published_min_us == 1_704_067_200_000_000


def test_arrow_schema_is_what_pyspark_expects():
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark.schema import spark_schema

    assert to_arrow_schema(spark_schema(), timezone="UTC") == arrow_schema()
