"""The amqp-queue streaming source without a JVM: its offsets and their JSON, admission control,
exactly-once batches over live streams and queues, batches planned again after a restart, and the
defined outcome of retention, deletion, a queue or stream appearing or declared again, damage and
malformed options. The reader object is driven as Spark's micro-batch engine drives it
(initialOffset, latestOffset(start, limit), partitions(start, end), read(partition)); the files are
written by the broker's own StreamLog and QueueStore. interop_tests/test_spark_streaming.py runs
the same source in Spark against a broker."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pamqp import commands  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from persistence.queue_store import QueueStore  # noqa: E402
from persistence.stream_cursor import CorruptStreamRecord  # noqa: E402
from persistence.stream_log import StreamLog  # noqa: E402
from spark.data_loss import CorruptQueueRecord, DataLoss  # noqa: E402
from spark.streaming_offsets import Position, SourceKey, decode, dumps, encode, parse_starting  # noqa: E402
from spark.streaming_source import AmqpQueueStreamReader  # noqa: E402
from spark.synthetic_queue import raw_properties  # noqa: E402

T0 = 1_700_000_000_000
PROPS = raw_properties(commands.Basic.Properties(delivery_mode=2, message_id="m", headers={"k": "v"}))
COLUMNS = ("queue", "queue_type", "seq", "body", "state", "state_event", "message_id", "published_at")


def open_stream(root: Path, name: str = "events", **options) -> StreamLog:
    options.setdefault("max_segment_bytes", 16 * 1024)
    options.setdefault("index_interval_bytes", 1024)
    return StreamLog.open_in(root, "/", name, **options)


def append(log: StreamLog, n: int, *, sync: bool = True) -> None:
    for _ in range(n):
        k = log.appended_offset
        log.append("amq.direct", "rk", PROPS, b"s%d" % k, timestamp_ms=T0 + k)
    if sync:
        log.sync_now()


def open_queue(root: Path, name: str = "orders", **options) -> QueueStore:
    options.setdefault("segment_size", 8 * 1024)
    store = QueueStore.for_queue(root, "/", name, **options)
    store.recover()
    return store


def publish(store: QueueStore, n: int) -> None:
    for _ in range(n):
        seq = store.next_seq
        store.append_message(seq, T0 + seq, "", "orders", PROPS, b"q%d" % seq)
    store.flush()


def reader(root: Path, **options) -> AmqpQueueStreamReader:
    given = {"path": str(root), "startingOffsets": "earliest", "partition_bytes": "4096"}
    given.update({k: str(v) for k, v in options.items()})
    return AmqpQueueStreamReader(given, COLUMNS, frozenset())


def batch(r: AmqpQueueStreamReader, start: dict, max_rows: int | None = None):
    """(end, rows as (queue, seq), partitions) of the next batch from ``start``."""
    end = r.latestOffset(start, ReadAllAvailable() if max_rows is None else ReadMaxRows(max_rows))
    return end, read_all(r, start, end), r.partitions(start, end)


def read_all(r: AmqpQueueStreamReader, start: dict, end: dict) -> list[tuple[str, int]]:
    rows = []
    for partition in r.partitions(start, end):
        for b in r.read(partition):
            rows.extend(zip(b.column("queue").to_pylist(), b.column("seq").to_pylist()))
    return rows


def drain(r: AmqpQueueStreamReader, start: dict, max_rows: int | None = None, *, limit: int = 500):
    rows: list[tuple[str, int]] = []
    sizes = []
    for _ in range(limit):
        end, got, _ = batch(r, start, max_rows)
        if end == start:
            return start, rows, sizes
        rows.extend(got)
        sizes.append(len(got))
        start = end
    raise AssertionError("the source never caught up")


def positions(offsets: dict) -> dict[tuple[str, str], Position]:
    return {(k.kind, k.name): v for k, v in decode(offsets).items()}


# ---- offsets ---------------------------------------------------------------------------------


def test_offsets_json_has_one_text_for_one_position_whatever_the_order_they_were_made_in():
    a = {SourceKey("/d", "stream", "/", "zeta"): Position(5, 0, 9, 0, 200, 0, ((0, 100, 4),)),
         SourceKey("/d", "queue", "eu", "alpha"): Position(7, 1, 3, 1, 77)}
    b = dict(reversed(list(a.items())))
    assert dumps(a) == dumps(b)
    document = json.loads(dumps(a))
    assert list(document) == ["format", "nodes"]
    entry = document["nodes"]["/d"]["streams"]["/"]["zeta"]
    assert list(entry) == sorted(entry) == ["created", "cuts", "first", "lost", "next", "position", "segment"]
    assert list(document["nodes"]["/d"]) == ["queues", "streams"]
    assert decode(json.loads(json.dumps(encode(a)))) == a  # as read back from a checkpoint


def test_starting_offsets_forms_and_malformed_values_name_the_option():
    assert parse_starting("earliest").mode == "earliest" and parse_starting(" LATEST ").mode == "latest"
    assert parse_starting("1700000000000").timestamp_ms == 1_700_000_000_000
    assert parse_starting("2023-11-14T22:13:20Z").timestamp_ms == 1_700_000_000_000
    assert parse_starting("2023-11-14T22:13:20").timestamp_ms == 1_700_000_000_000  # no zone: UTC
    specific = parse_starting('{"orders": 12, "eu": {"events": -2}}')
    assert specific.for_source("/", "orders") == ("seq", 12)
    assert specific.for_source("eu", "events") == ("earliest", 0)
    assert specific.for_source("/", "other") == ("latest", 0)
    for bad in ("yesterday", '{"orders": "x"}', '{"orders": -3}', "{not json", "[1]"):
        with pytest.raises(ValueError, match="startingOffsets"):
            parse_starting(bad)


@pytest.mark.parametrize(("option", "value"), [("maxRecordsPerTrigger", "0"), ("maxRecordsPerTrigger", "many"),
                                                ("failOnDataLoss", "maybe"), ("partition_bytes", "-1"),
                                                ("startingOffsets", "soon"), ("startingOffset", "earliest"),
                                                ("minPartitions", "none")])
def test_a_malformed_or_unknown_option_is_an_error_that_names_it(tmp_path, option, value):
    with pytest.raises(ValueError, match=option):
        reader(tmp_path, **{option: value})


def test_a_missing_data_directory_is_named(tmp_path):
    r = reader(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        r.initialOffset()


# ---- exactly once ----------------------------------------------------------------------------


def test_every_record_of_live_streams_and_queues_once_in_batches_within_the_limit(tmp_path):
    log, store = open_stream(tmp_path), open_queue(tmp_path)
    append(log, 700)
    publish(store, 400)
    r = reader(tmp_path, maxRecordsPerTrigger=250)
    start = r.initialOffset()
    assert r.getDefaultReadLimit() == ReadMaxRows(250)
    seen: list[tuple[str, int]] = []
    for round_ in range(4):  # the broker appends between batches
        start, rows, sizes = drain(r, start, 250)
        seen.extend(rows)
        assert sizes and max(sizes) <= 250
        append(log, 300)
        publish(store, 200)
    start, rows, _ = drain(r, start, 250)
    seen.extend(rows)
    counts = Counter(seen)
    assert set(counts.values()) == {1}, "no record twice"
    assert sorted(s for q, s in seen if q == "events") == list(range(700 + 4 * 300))
    assert sorted(s for q, s in seen if q == "orders") == list(range(1, 1 + 400 + 4 * 200))


def test_the_limit_is_shared_by_the_queues_and_streams_with_records_waiting(tmp_path):
    log, store = open_stream(tmp_path), open_queue(tmp_path)
    append(log, 1000)
    publish(store, 30)
    r = reader(tmp_path)
    end, rows, _ = batch(r, r.initialOffset(), 200)
    by_queue = Counter(q for q, _ in rows)
    assert by_queue == {"orders": 30, "events": 170}  # the queue's unused share goes to the stream


def test_a_batch_planned_again_by_a_new_reader_has_the_same_partitions_and_rows(tmp_path):
    log, store = open_stream(tmp_path), open_queue(tmp_path)
    append(log, 900)
    publish(store, 600)
    r = reader(tmp_path, maxRecordsPerTrigger=700)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(700))
    planned = [p.value for p in r.partitions(start, end)]
    rows = read_all(r, start, end)
    assert len(planned) >= 4, "segments and byte ranges: both cores read"
    append(log, 2000)  # the broker goes on: new segments, side indexes rewritten
    publish(store, 500)
    again = reader(tmp_path, maxRecordsPerTrigger=700)  # a restarted driver: nothing remembered
    assert [p.value for p in again.partitions(start, end)] == planned
    assert read_all(again, start, end) == rows


def test_a_batch_of_a_few_mebibytes_is_cut_so_both_cores_read_it(tmp_path):
    log = open_stream(tmp_path, max_segment_bytes=64 << 20, index_interval_bytes=64 * 1024)
    store = open_queue(tmp_path, segment_size=64 << 20)
    for _ in range(30_000):  # about 4 MiB each, in one segment; the stream's not yet in a side index
        k = log.appended_offset
        log.append("amq.direct", "rk", PROPS, b"s%d" % k + b"." * 100, timestamp_ms=T0 + k)
        store.append_message(k + 1, T0 + k, "", "orders", PROPS, b"q" * 100)
    log.sync_now()
    store.flush()
    r = AmqpQueueStreamReader({"path": str(tmp_path), "startingOffsets": "earliest"}, COLUMNS, frozenset())
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    kinds = Counter(type(p.value[0]).__name__ for p in r.partitions(start, end))
    assert kinds == {"StreamPart": 2, "QueueRangePart": 2}
    rows = read_all(r, start, end)
    assert len(rows) == len(set(rows)) == 60_000


def test_queue_rows_are_the_publishes_whatever_happened_to_the_messages_since(tmp_path):
    store = open_queue(tmp_path)
    publish(store, 3)
    store.append_state(1, "acked", T0 + 50)
    store.flush()
    r = reader(tmp_path)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    rows = [row for p in r.partitions(start, end) for b in r.read(p) for row in b.to_pylist()]
    assert [(row["seq"], row["state"], row["state_event"], row["queue_type"]) for row in rows] == [
        (1, "ready", "published", "queue"), (2, "ready", "published", "queue"), (3, "ready", "published", "queue")]
    assert rows[0]["body"] == b"q1" and rows[0]["message_id"] == "m"


def test_several_nodes_are_read_with_offsets_per_node(tmp_path):
    append(open_stream(tmp_path / "n1"), 30)
    publish(open_queue(tmp_path / "n2"), 20)
    r = reader(tmp_path, path=f"n1={tmp_path / 'n1'},n2={tmp_path / 'n2'}")
    end, rows, _ = drain(r, r.initialOffset())
    assert sorted(set(rows)) == sorted(rows) and len(rows) == 50
    assert sorted(json.loads(json.dumps(end))["nodes"]) == ["n1", "n2"]
    assert sorted(positions(end)) == [("queue", "orders"), ("stream", "events")]
    with pytest.raises(ValueError, match="names a node twice"):
        reader(tmp_path, path=f"a={tmp_path},a={tmp_path}")


# ---- where a query starts ----------------------------------------------------------------------


def test_starting_offsets_latest_a_json_offset_and_a_timestamp(tmp_path):
    log, store = open_stream(tmp_path), open_queue(tmp_path)
    append(log, 500)
    publish(store, 100)
    latest = reader(tmp_path, startingOffsets="latest")
    start = latest.initialOffset()
    assert drain(latest, start)[1] == []
    append(log, 5)
    publish(store, 2)
    assert sorted(drain(latest, start)[1]) == [("events", k) for k in range(500, 505)] + [("orders", 101), ("orders", 102)]

    specific = reader(tmp_path, startingOffsets='{"events": 321, "orders": 90}')
    rows = drain(specific, specific.initialOffset())[1]
    assert min(s for q, s in rows if q == "events") == 321 and min(s for q, s in rows if q == "orders") == 90
    assert len(rows) == (505 - 321) + (102 - 89)

    by_time = reader(tmp_path, startingOffsets=str(T0 + 444))  # stream record k is at T0 + k, queue message s at T0 + s
    rows = drain(by_time, by_time.initialOffset())[1]
    assert sorted(rows) == [("events", k) for k in range(444, 505)]  # the queue's are all older: it starts at its end
    by_time = reader(tmp_path, startingOffsets=str(T0 + 95))
    rows = drain(by_time, by_time.initialOffset())[1]
    assert sorted(s for q, s in rows if q == "orders") == list(range(95, 103))


def test_available_now_stops_at_what_was_stored_when_the_run_began(tmp_path):
    log = open_stream(tmp_path)
    append(log, 300)
    r = reader(tmp_path, maxRecordsPerTrigger=100)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    append(log, 50)  # after the run began: the next run's
    start, rows, sizes = drain(r, start, 100)
    assert sorted(s for _, s in rows) == list(range(300)) and sizes == [100, 100, 100]
    next_run = reader(tmp_path, maxRecordsPerTrigger=100)
    next_run.prepareForTriggerAvailableNow()
    assert sorted(s for _, s in drain(next_run, start, 100)[1]) == list(range(300, 350))


# ---- retention, deletion, appearing, declared again -----------------------------------------


def test_retention_before_the_query_read_fails_or_is_skipped_and_counted(tmp_path, caplog):
    log = open_stream(tmp_path)
    append(log, 200)
    strict, lenient = reader(tmp_path), reader(tmp_path, failOnDataLoss="false")
    start = strict.initialOffset()
    start, rows, _ = drain(strict, start)
    append(log, 2000)
    log.enforce_retention(40 * 1024, None)
    first = log.first_offset
    assert first > 200
    with pytest.raises(DataLoss, match=r"retention removed offsets 200\.\.%d" % (first - 1)):
        strict.latestOffset(start, ReadAllAvailable())
    with caplog.at_level(logging.WARNING, "spark.amqp_queue"):
        end, rows, _ = batch(lenient, start)
    assert sorted(s for _, s in rows) == list(range(first, 2200))
    assert positions(end)[("stream", "events")].lost == first - 200
    assert f"({first - 200} records)" in caplog.text


def test_a_stream_deleted_during_the_query_fails_it_or_is_dropped(tmp_path):
    log = open_stream(tmp_path)
    append(log, 50)
    r, lenient = reader(tmp_path), reader(tmp_path, failOnDataLoss="false")
    start = drain(r, r.initialOffset())[0]
    log.delete()
    with pytest.raises(DataLoss, match="stream 'events'.*was deleted"):
        r.latestOffset(start, ReadAllAvailable())
    assert positions(lenient.latestOffset(start, ReadAllAvailable())) == {}


def test_a_stream_declared_again_is_read_from_its_start_and_the_old_one_counts_as_deleted(tmp_path):
    log = open_stream(tmp_path)
    append(log, 50)
    lenient = reader(tmp_path, failOnDataLoss="false")
    start = drain(lenient, lenient.initialOffset())[0]
    log.delete()
    os.utime(tmp_path, None)
    again = open_stream(tmp_path)
    append(again, 10)
    with pytest.raises(DataLoss, match="deleted and declared again"):
        reader(tmp_path).latestOffset(start, ReadAllAvailable())
    assert sorted(s for _, s in drain(lenient, start)[1]) == list(range(10))


def test_a_queue_that_appears_during_the_query_is_read_from_its_first_message(tmp_path):
    publish(open_queue(tmp_path, "orders-a"), 5)
    r = reader(tmp_path, queue="orders-*")
    start = drain(r, r.initialOffset())[0]
    publish(open_queue(tmp_path, "orders-b"), 7)
    rows = drain(r, start)[1]
    assert sorted(rows) == [("orders-b", s) for s in range(1, 8)]


def test_a_queue_segment_removed_before_the_query_read_it_to_the_end(tmp_path):
    store = open_queue(tmp_path, segment_size=2048)
    publish(store, 20)
    r, lenient = reader(tmp_path), reader(tmp_path, failOnDataLoss="false")
    start = drain(r, r.initialOffset())[0]
    resume = positions(start)[("queue", "orders")]
    publish(store, 200)
    store.close()
    segment = next(tmp_path.rglob(f"{resume.segment:020d}.seg"))
    later = sorted(int(p.name[:20]) for p in segment.parent.glob("*.seg") if int(p.name[:20]) > resume.segment)
    segment.unlink()  # the broker removes a segment once every message in it is settled
    with pytest.raises(DataLoss, match=f"segment it was reading \\({resume.segment}\\) was removed"):
        r.latestOffset(start, ReadAllAvailable())
    end, rows, _ = batch(lenient, start)
    assert sorted(s for _, s in rows) == list(range(later[0], 221))
    assert positions(end)[("queue", "orders")].lost == later[0] - resume.next


# ---- damage ----------------------------------------------------------------------------------


def corrupt(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_stream_record_fails_the_query_or_is_skipped_and_counted(tmp_path, caplog):
    log = open_stream(tmp_path, max_segment_bytes=1 << 20)
    append(log, 100)
    log.close()
    segment = next(tmp_path.rglob("*.seg"))
    corrupt(segment, 40 + 30 * 20 + 12)  # inside a record's payload: its CRC fails
    r, lenient = reader(tmp_path), reader(tmp_path, failOnDataLoss="false")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    with pytest.raises(CorruptStreamRecord, match="CRC mismatch"):
        read_all(r, start, end)
    with caplog.at_level(logging.WARNING, "spark.amqp_queue"):
        rows = read_all(lenient, start, end)
    assert len(rows) == 99 and len(set(rows)) == 99
    assert "CRC mismatch" in caplog.text and "(1 records)" in caplog.text


def test_damage_where_a_limited_batch_would_end_moves_the_end_to_a_known_record(tmp_path):
    log = open_stream(tmp_path, max_segment_bytes=1 << 20, index_interval_bytes=1 << 20)  # no index entries
    append(log, 400)
    log.close()
    segment = next(tmp_path.rglob("*.seg"))
    data = bytearray(segment.read_bytes())
    at = 40
    for _ in range(150):  # to record 150
        at += 4 + int.from_bytes(data[at : at + 4], "big")
    data[at : at + 4] = b"\xff\xff\xff\xff"  # its length: unreadable, and so where the next record starts
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptStreamRecord):
        r = reader(tmp_path)
        r.latestOffset(r.initialOffset(), ReadMaxRows(200))
    lenient = reader(tmp_path, failOnDataLoss="false")
    start, rows, sizes = drain(lenient, lenient.initialOffset(), 200)
    assert positions(start)[("stream", "events")].next == 400, "never stuck at the damage"
    assert len(rows) < 400 and len(set(rows)) == len(rows)


def test_a_torn_or_corrupt_queue_record_fails_the_query_or_is_skipped(tmp_path, caplog):
    store = open_queue(tmp_path, segment_size=1 << 20)
    publish(store, 50)
    store.close()
    segment = next(tmp_path.rglob("*.seg"))
    corrupt(segment, 40 + 10)  # the first record's payload
    with pytest.raises(CorruptQueueRecord, match="CRC mismatch"):
        r = reader(tmp_path)
        r.latestOffset(r.initialOffset(), ReadAllAvailable())
    lenient = reader(tmp_path, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, "spark.amqp_queue"):
        rows = drain(lenient, lenient.initialOffset())[1]
    assert sorted(s for _, s in rows) == list(range(2, 51))
    assert "CRC mismatch" in caplog.text


def test_a_queue_record_damaged_after_the_batch_was_planned_fails_the_task_or_is_skipped(tmp_path, caplog):
    store = open_queue(tmp_path, segment_size=1 << 20)
    publish(store, 50)
    store.close()
    r, lenient = reader(tmp_path), reader(tmp_path, failOnDataLoss="false")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())  # planned over sound records: the tasks check again
    segment = next(tmp_path.rglob("*.seg"))
    data = segment.read_bytes()
    at = 40
    for _ in range(20):  # to record 20 (seq 21)
        at += 4 + int.from_bytes(data[at : at + 4], "big")
    corrupt(segment, at + 4 + int.from_bytes(data[at : at + 4], "big") - 1)  # its body's last byte
    with pytest.raises(CorruptQueueRecord, match=f"byte {at}: CRC mismatch"):
        read_all(r, start, end)
    with caplog.at_level(logging.WARNING, "spark.amqp_queue"):
        rows = read_all(lenient, start, end)
    assert sorted(s for _, s in rows) == [s for s in range(1, 51) if s != 21]
    assert "CRC mismatch" in caplog.text


# ---- the sink's pieces -----------------------------------------------------------------------


def test_the_sinks_properties_decode_to_what_was_given():
    import datetime

    from pamqp import frame

    from spark.basic_properties import PROPERTY_NAMES, decode
    from spark.confirmed_publisher import encode_properties

    given = {"content_type": "application/json", "content_encoding": "gzip", "delivery_mode": 2, "priority": 7,
             "correlation_id": "c-1", "reply_to": "replies", "expiration": "60000", "message_id": "q:3:1:9",
             "timestamp": 1_700_000_000, "type": "alert", "user_id": "guest", "app_id": "spark", "cluster_id": "c",
             "headers": {"s": "text", "n": -5, "yes": True, "f": 1.5, "raw": b"\x00\x01", "none": None,
                         "nested": {"k": "v"}, "list": [1, "two"]}}
    raw = encode_properties(given)
    _, _, content = frame.unmarshal(b"\x02\x00\x01" + (12 + len(raw)).to_bytes(4, "big") + b"\x00\x3c\x00\x00"
                                    + (10).to_bytes(8, "big") + raw + b"\xce")  # as a client library reads it
    decoded = content.properties
    for name, value in given.items():
        if name == "timestamp":
            assert int(decoded.timestamp.replace(tzinfo=datetime.timezone.utc).timestamp()) == value
        elif name != "headers":
            assert getattr(decoded, "message_type" if name == "type" else name) == value, name
    assert decoded.headers == given["headers"]
    by_source = dict(zip(PROPERTY_NAMES, decode(raw)))  # as the amqp-queue source reads it back
    assert by_source["message_id"] == "q:3:1:9" and by_source["headers"]["list"] == '[1, "two"]'
    assert encode_properties({"delivery_mode": 2, "message_id": "x"}) == b"\x10\x80\x02\x01x"


def test_the_sink_refuses_a_bad_option_or_column_and_names_it():
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

    from spark.amqp_sink import sink_settings

    good = StructType([StructField("body", BinaryType()), StructField("routing_key", StringType()),
                       StructField("seq", LongType())])  # seq: a column of the source, ignored
    settings = sink_settings({"url": "amqp://guest:guest@localhost:5672/%2F", "exchange": "alerts"}, good)
    assert settings.columns == ("body", "routing_key") and settings.window == 5000 and settings.mandatory
    cases = [({}, good, "needs option url"), ({"url": "http://x"}, good, "url must be an amqp"),
             ({"url": "amqp://h", "confirmWindow": "0"}, good, "confirmWindow"),
             ({"url": "amqp://h", "mandatory": "perhaps"}, good, "mandatory"),
             ({"url": "amqp://h", "routing_key": "x"}, good, "no option routing_key"),
             ({"url": "amqp://h"}, StructType([StructField("payload", BinaryType())]), "needs a column body"),
             ({"url": "amqp://h"}, StructType([StructField("body", IntegerType())]), "column body must be"),
             ({"url": "amqp://h"}, StructType([*good.fields, StructField("weight", IntegerType())]), "no column weight"),
             ({"url": "amqp://h"}, StructType([*good.fields, StructField("priority", StringType())]),
              "column priority must be an integer")]
    for options, schema, message in cases:
        with pytest.raises(ValueError, match=message):
            sink_settings(options, schema)
